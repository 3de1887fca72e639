// Small helpers shared by the fusion passes (fuse_*.cc): matching ONNX nodes, comparing static
// types, making kiln-domain nodes and replacing a matched group of nodes by one.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "ir/rewrite.h"
#include "passes/pass.h"

namespace kiln::passes::fusion {

inline bool is_binary_arith(const std::string& op) {
  return op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Pow";
}

// An ONNX-domain node of type `op`. Binary arithmetic needs opset >= 7 (numpy broadcasting; older
// versions had the legacy broadcast/axis attributes).
inline bool is_onnx(const ir::Node& n, const char* op) {
  if (!n.domain.empty() || n.op_type != op) return false;
  return !is_binary_arith(n.op_type) || n.opset >= 7;
}
inline bool is_kiln(const ir::Node& n, const char* op) { return n.domain == "kiln" && n.op_type == op; }

// Marks a node a layout pass made (a Transpose, a Reshape, a reorder) as standing for no ONNX node.
inline void no_sources(ir::Node& n) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kStrings;
  n.attrs["kiln.sources"] = std::move(a);
}

// The type of `v` in `g`, or of the outer value a body reads by that name (the innermost enclosing
// graph defining it).
inline const ir::TypeInfo* type_of(const ir::Graph& g, const std::string& v) {
  auto it = g.value_types.find(v);
  if (it != g.value_types.end()) return it->second.is_tensor() ? &it->second : nullptr;
  if (!g.parent || g.defines(v)) return nullptr;
  for (const ir::Graph* p = g.parent; p; p = p->parent) {
    if (!p->defines(v)) continue;
    auto pt = p->value_types.find(v);
    return pt == p->value_types.end() || !pt->second.is_tensor() ? nullptr : &pt->second;
  }
  return nullptr;
}

// Dims that are certainly equal: both known and equal, or the same named symbol.
inline bool same_dim(const Dim& a, const Dim& b) {
  if (a.known() || b.known()) return a.known() && b.known() && a.value == b.value;
  return !a.param.empty() && a.param == b.param;
}
inline bool same_shape(const SymShape& a, const SymShape& b) {
  if (!a.rank_known || !b.rank_known || a.rank() != b.rank()) return false;
  for (size_t i = 0; i < a.rank(); ++i)
    if (!same_dim(a.dims[i], b.dims[i])) return false;
  return true;
}
// Two values certainly have the same dtype and shape.
inline bool same_type(const ir::Graph& g, const std::string& a, const std::string& b) {
  const ir::TypeInfo* ta = type_of(g, a);
  const ir::TypeInfo* tb = type_of(g, b);
  return ta && tb && ta->elem == tb->elem && same_shape(ta->shape, tb->shape);
}
inline bool is_float_value(const ir::Graph& g, const std::string& v) {
  const ir::TypeInfo* t = type_of(g, v);
  return t && dtype_is_float(t->elem);
}

// The input of binary node `n` that is not `v` (the other operand), or "" when both are `v`.
inline std::string other_input(const ir::Node& n, const std::string& v) {
  if (n.inputs.size() != 2) return "";
  if (n.inputs[0] == v && n.inputs[1] != v) return n.inputs[1];
  if (n.inputs[1] == v && n.inputs[0] != v) return n.inputs[0];
  return "";
}

// The only node reading `v` (which is not a graph output), or -1.
inline int sole_consumer(const ir::UseIndex& uses, const std::string& v) {
  return uses.single_use(v) ? uses.consumers(v)[0] : -1;
}

// |a - b| within float32 rounding of b.
inline bool close_to(double a, double b, double rel = 1e-6) { return std::fabs(a - b) <= rel * std::fabs(b) + 1e-12; }

// A finite value within float32's range (a float attribute can hold it; the cast is defined).
inline bool in_float_range(double v) {
  return std::isfinite(v) && std::fabs(v) <= static_cast<double>(std::numeric_limits<float>::max());
}
// A value that survives a round trip through float32 (so a float attribute holds it exactly).
inline bool fits_float(double v) {
  return std::isinf(v) || (in_float_range(v) && static_cast<double>(static_cast<float>(v)) == v);
}

inline void set_int(ir::Node& n, const std::string& k, int64_t v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kInt;
  a.i = v;
  n.attrs[k] = a;
}
inline void set_float(ir::Node& n, const std::string& k, float v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kFloat;
  a.f = v;
  n.attrs[k] = a;
}
inline void set_string(ir::Node& n, const std::string& k, const std::string& v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kString;
  a.s = v;
  n.attrs[k] = a;
}

inline ir::Node kiln_node(const std::string& op, const std::string& name) {
  ir::Node n;
  n.name = name;
  n.op_type = op;
  n.domain = "kiln";
  n.opset = 1;
  return n;
}

inline std::string add_initializer(ir::Graph& g, const std::string& base, Tensor t) {
  std::string name = ir::unique_name(g, base);
  g.initializers[name] = std::move(t);
  return name;
}

// The model's default-domain opset (for nodes a pass adds in that domain).
inline int onnx_opset(const ir::Graph& g) {
  for (const ir::Graph* p = &g; p; p = p->parent) {
    auto it = p->opset_imports.find("");
    if (it != p->opset_imports.end()) return it->second;
  }
  int best = 0;
  for (const auto& n : g.nodes)
    if (n.domain.empty()) best = std::max(best, n.opset);
  return best > 0 ? best : 13;
}

// Replaces the nodes at `group` by `fused`, which takes the place of the last of them in the
// node order (every value the group reads from outside exists by then, and its readers come
// later), or of the member `at` where the caller knows that place is valid. The sources of all of
// them, in graph order, become the fused node's provenance.
inline void replace_group(ir::Graph& g, const std::set<int>& group, ir::Node fused, int at = -1) {
  int last = at >= 0 ? at : *group.rbegin();
  std::vector<std::string> src;
  for (int i : group)
    for (const auto& s : ir::sources_of(g.nodes[static_cast<size_t>(i)])) src.push_back(s);
  ir::Attribute a;
  a.type = ir::Attribute::Type::kStrings;
  a.strings = std::move(src);
  fused.attrs["kiln.sources"] = std::move(a);
  g.nodes[static_cast<size_t>(last)] = std::move(fused);
  std::set<int> rest = group;
  rest.erase(last);
  ir::remove_nodes(g, rest);
}

// Runs `try_at(g, uses, i)` on every node index until one rewrites (returns true), then starts
// over with a fresh use index; returns how many rewrites happened.
template <typename F>
int rewrite_until_fixpoint(ir::Graph& g, F try_at) {
  int changed = 0;
  for (bool again = true; again;) {
    again = false;
    ir::UseIndex uses(g);
    for (size_t i = 0; i < g.nodes.size() && !again; ++i) again = try_at(g, uses, static_cast<int>(i));
    changed += again;
  }
  return changed;
}

}  // namespace kiln::passes::fusion
