// remove_noop_ops: removes nodes that compute nothing at inference time: Identity; Dropout in
// inference mode or with a constant ratio of 0 (its mask unused); Pad with all-zero pads; Cast to the dtype the input
// already has; Reshape whose static output shape equals its input's; Transpose with the identity permutation. Collapses
// Reshape of a Reshape into one Reshape (when the outer target has no 0 entries, which would copy dims from the
// intermediate) and Transpose of a Transpose into one Transpose (or none).
#include <numeric>

#include "ir/rewrite.h"
#include "ops/op_traits.h"
#include "passes/pass.h"

namespace kiln::passes {

namespace {

const ir::TypeInfo* type_of(const ir::Graph& g, const std::string& v) {
  auto it = g.value_types.find(v);
  return it == g.value_types.end() ? nullptr : &it->second;
}

bool same_static_shape(const ir::Graph& g, const std::string& a, const std::string& b) {
  const ir::TypeInfo* ta = type_of(g, a);
  const ir::TypeInfo* tb = type_of(g, b);
  return ta && tb && ta->is_tensor() && tb->is_tensor() && ta->shape.fully_known() && tb->shape.fully_known() &&
         ta->shape.concrete() == tb->shape.concrete() && ta->elem == tb->elem;
}

// Makes readers of node `idx`'s output 0 read `in` instead, so the node can go. Returns false when
// that is impossible (the output is a graph output whose name cannot move to the producer of `in`).
bool bypass(ir::Graph& g, const ir::UseIndex& uses, int idx, const std::string& in) {
  const std::string out = g.nodes[static_cast<size_t>(idx)].outputs[0];
  if (!uses.is_graph_output(out)) {
    ir::replace_uses(g, out, in);
    return true;
  }
  int p = uses.producer(in);
  if (p < 0 || uses.is_graph_output(in) || uses.consumers(in).size() != 1) return false;
  for (auto& o : g.nodes[static_cast<size_t>(p)].outputs)
    if (o == in) o = out;
  return true;
}

bool dropout_is_identity(const ir::Graph& g, const ir::UseIndex& uses, const ir::Node& n) {
  if (n.outputs.size() > 1 && !n.outputs[1].empty() &&
      (!uses.consumers(n.outputs[1]).empty() || uses.is_graph_output(n.outputs[1])))
    return false;
  // A constant ratio of 0 drops nothing, even in training mode (torchvision's Swin calls
  // F.dropout(attn, p=0.0) with training=True; the export keeps both as constants).
  if (n.inputs.size() > 1 && !n.inputs[1].empty()) {
    const Tensor* r = ir::constant_value(g, n.inputs[1]);
    if (r && r->numel() == 1 && r->get_f64(0) == 0.0) return true;
  }
  if (n.inputs.size() > 2 && !n.inputs[2].empty()) {  // training_mode must be a constant false
    const Tensor* t = ir::constant_value(g, n.inputs[2]);
    if (!t || t->numel() != 1 || t->get_i64(0) != 0) return false;
  }
  return n.attr_int("is_test", 1) != 0 || n.opset >= 7;  // opset < 7 with is_test=0 is training
}

// Pad whose pads are all zero (an attribute before opset 11, a constant input since): any mode.
bool pad_is_identity(const ir::Graph& g, const ir::Node& n) {
  std::vector<int64_t> pads;
  if (n.opset < 11) {
    pads = n.attr_ints("pads");
  } else {
    if (n.inputs.size() < 2 || n.inputs[1].empty()) return false;
    const Tensor* t = ir::constant_value(g, n.inputs[1]);
    if (!t) return false;
    for (int64_t k = 0; k < t->numel(); ++k) pads.push_back(t->get_i64(k));
  }
  if (pads.empty()) return false;
  for (int64_t p : pads)
    if (p != 0) return false;
  return true;
}

std::vector<int64_t> transpose_perm(const ir::Graph& g, const ir::Node& n) {
  std::vector<int64_t> perm = n.attr_ints("perm");
  if (perm.empty()) {
    const ir::TypeInfo* t = type_of(g, n.inputs[0]);
    if (!t || !t->shape.rank_known) return {};
    perm.resize(t->shape.rank());
    std::iota(perm.rbegin(), perm.rend(), 0);  // default: reverse the axes
  }
  return perm;
}

}  // namespace

Result<int> remove_noop_ops(ir::Graph& g) {
  int changed = 0;
  bool again = true;
  while (again) {
    again = false;
    ir::UseIndex uses(g);
    for (size_t i = 0; i < g.nodes.size() && !again; ++i) {
      ir::Node& n = g.nodes[i];
      if (!n.domain.empty() || n.inputs.empty() || n.inputs[0].empty() || n.outputs.empty()) continue;
      bool noop = false;
      if (n.op_type == "Identity") {
        noop = true;
      } else if (n.op_type == "Dropout") {
        noop = dropout_is_identity(g, uses, n);
      } else if (n.op_type == "Pad") {
        noop = pad_is_identity(g, n);
      } else if (n.op_type == "Cast") {
        const ir::TypeInfo* t = type_of(g, n.inputs[0]);
        noop = t && t->is_tensor() && static_cast<int64_t>(t->elem) == n.attr_int("to", -1);
      } else if (ops::has_trait(n, ops::trait::kView)) {  // Reshape, Squeeze, Unsqueeze, Flatten
        noop = same_static_shape(g, n.inputs[0], n.outputs[0]);
      } else if (n.op_type == "Transpose") {
        std::vector<int64_t> perm = transpose_perm(g, n);
        bool identity = !perm.empty();
        for (size_t k = 0; k < perm.size(); ++k) identity &= perm[k] == static_cast<int64_t>(k);
        noop = identity;
      }
      if (noop && bypass(g, uses, static_cast<int>(i), n.inputs[0])) {
        ir::remove_nodes(g, {static_cast<int>(i)});
        ++changed;
        again = true;
        break;
      }
      // Reshape(Reshape(x, s1), s2) -> Reshape(x, s2), when s2 is constant without 0 entries.
      int p = uses.producer(n.inputs[0]);
      if (p < 0 || !uses.single_use(n.inputs[0])) continue;
      ir::Node& inner = g.nodes[static_cast<size_t>(p)];
      if (n.op_type == "Reshape" && inner.op_type == "Reshape" && inner.domain.empty() && n.opset >= 5 &&
          inner.opset >= 5 && n.inputs.size() > 1) {
        const Tensor* s2 = ir::constant_value(g, n.inputs[1]);
        if (!s2) continue;
        bool has_zero = false;
        for (int64_t k = 0; k < s2->numel(); ++k) has_zero |= s2->get_i64(k) == 0;
        if (has_zero) continue;
        n.inputs[0] = inner.inputs[0];
        ++changed;
        again = true;  // the inner Reshape is now dead; remove_dead_nodes drops it
      } else if (n.op_type == "Transpose" && inner.op_type == "Transpose" && inner.domain.empty()) {
        std::vector<int64_t> p1 = transpose_perm(g, inner), p2 = transpose_perm(g, n);
        if (p1.empty() || p1.size() != p2.size()) continue;
        std::vector<int64_t> q(p2.size());
        for (size_t k = 0; k < q.size(); ++k) {
          if (p2[k] < 0 || p2[k] >= static_cast<int64_t>(p1.size()))
            return Status(ErrorCode::kInvalidModel, n.where() + "perm out of range");
          q[k] = p1[static_cast<size_t>(p2[k])];
        }
        n.inputs[0] = inner.inputs[0];
        ir::Attribute a;
        a.type = ir::Attribute::Type::kInts;
        a.ints = q;
        n.attrs["perm"] = a;
        ++changed;
        again = true;
      }
    }
    if (again) {
      KILN_ASSIGN_OR_RETURN(int dead, remove_dead_nodes(g));
      (void)dead;
    }
  }
  return changed;
}

}  // namespace kiln::passes
