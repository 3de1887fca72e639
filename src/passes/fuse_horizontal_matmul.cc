// fuse_horizontal_matmul: sibling linear layers reading the same input, like the Q/K/V projections
// of attention, become one wider one:
//
//   MatMul(A, B_i) or kiln.FusedMatMul(A, B_i, bias_i?),  B_i constant [K, N_i], i = 1..n
//   -> kiln.FusedMatMul(A, concat_i B_i [K, sum N_i], concat_i bias_i) -> Split(axis = last, N_i)
//
// Exact: each output element is the same dot product over K (the reference MatMul sums over K in
// order for every column), then the same bias addition and activation.
//
// Preconditions: at least two siblings with the same dtype, the same activation attributes, all
// with or all without a constant 1-D bias, and no residual; A's rank is known. The merged layer
// takes the place of the first sibling. Leaves alone: non-constant or non-2-D weights, siblings
// that differ in activation or bias presence, and a single layer.
#include <cstring>
#include <map>

#include "passes/fusion_util.h"

namespace kiln::passes {

namespace {

using fusion::is_kiln;
using fusion::is_onnx;

// A sibling's weight and bias, or false when it cannot be merged.
bool linear_parts(const ir::Graph& g, const ir::Node& n, const Tensor** w, const Tensor** b) {
  if (n.outputs.size() != 1 || n.inputs.size() < 2) return false;
  if (is_onnx(n, "MatMul")) {
    if (n.inputs.size() != 2) return false;
    *b = nullptr;
  } else if (is_kiln(n, "FusedMatMul")) {
    if (n.has_input(3)) return false;  // residual
    *b = n.has_input(2) ? ir::constant_value(g, n.inputs[2]) : nullptr;
    if (n.has_input(2) && (!*b || (*b)->rank() != 1)) return false;
  } else {
    return false;
  }
  *w = ir::constant_value(g, n.inputs[1]);
  return *w && (*w)->rank() == 2 && (!*b || ((*b)->dtype() == (*w)->dtype() && (*b)->dim(0) == (*w)->dim(1)));
}

// What siblings must share to merge: dtype, K, bias presence and every activation attribute.
std::string merge_key(const ir::Node& n, const Tensor& w, const Tensor* b) {
  std::string key = std::to_string(static_cast<int>(w.dtype())) + "/" + std::to_string(w.dim(0)) + (b ? "/b" : "/-");
  for (const auto& [k, a] : n.attrs) {
    if (k.rfind("activation", 0) != 0) continue;
    key += "/" + k + "=" + a.s + std::to_string(a.f);
  }
  return key;
}

Tensor concat_columns(const std::vector<const Tensor*>& ws) {
  int64_t k = ws[0]->dim(0), total = 0;
  for (const Tensor* w : ws) total += w->dim(1);
  Tensor out(ws[0]->dtype(), {k, total});
  size_t es = dtype_size(out.dtype());
  auto* dst = static_cast<uint8_t*>(out.raw());
  int64_t col = 0;
  for (const Tensor* w : ws) {
    const auto* src = static_cast<const uint8_t*>(w->raw());
    int64_t n = w->dim(1);
    for (int64_t r = 0; r < k; ++r)
      std::memcpy(dst + static_cast<size_t>(r * total + col) * es, src + static_cast<size_t>(r * n) * es,
                  static_cast<size_t>(n) * es);
    col += n;
  }
  return out;
}

Tensor concat_1d(const std::vector<const Tensor*>& bs) {
  int64_t total = 0;
  for (const Tensor* b : bs) total += b->numel();
  Tensor out(bs[0]->dtype(), {total});
  size_t at = 0;
  for (const Tensor* b : bs) {
    std::memcpy(static_cast<uint8_t*>(out.raw()) + at, b->raw(), b->nbytes());
    at += b->nbytes();
  }
  return out;
}

bool try_horizontal(ir::Graph& g, const ir::UseIndex& uses, int fi) {
  const ir::Node& first = g.nodes[static_cast<size_t>(fi)];
  const Tensor *w0, *b0;
  if (!linear_parts(g, first, &w0, &b0) || dtype_size(w0->dtype()) == 0) return false;
  const std::string a = first.inputs[0];
  const ir::TypeInfo* at = fusion::type_of(g, a);
  if (!at || !at->shape.rank_known || at->shape.rank() < 1 || at->elem != w0->dtype()) return false;
  std::string key = merge_key(first, *w0, b0);
  // Siblings after `first` (so `first` is the earliest of its group) with the same key.
  std::vector<int> members;
  std::vector<const Tensor*> ws, bs;
  std::set<int> seen;
  for (int c : uses.consumers(a)) {
    if (c < fi || seen.count(c)) continue;
    seen.insert(c);
    const ir::Node& n = g.nodes[static_cast<size_t>(c)];
    const Tensor *w, *b;
    if (n.inputs[0] != a || n.inputs.size() < 2 || n.inputs[1] == a || !linear_parts(g, n, &w, &b) ||
        merge_key(n, *w, b) != key)
      continue;
    members.push_back(c);
    ws.push_back(w);
    bs.push_back(b);
  }
  if (members.size() < 2 || members[0] != fi) return false;
  int opset = fusion::onnx_opset(g);
  int64_t out_rank = static_cast<int64_t>(at->shape.rank());  // MatMul(A [.., K], B [K, N]) keeps A's rank
  std::vector<int64_t> sizes;
  for (const Tensor* w : ws) sizes.push_back(w->dim(1));
  // The merged layer replaces the first member, the Split follows it, the others go.
  ir::Node merged = fusion::kiln_node("FusedMatMul", ir::unique_name(g, first.name + "_merged"));
  for (const auto& [k, v] : first.attrs)
    if (k.rfind("activation", 0) == 0) merged.attrs[k] = v;
  std::string wname = fusion::add_initializer(g, first.name + "_merged_weight", concat_columns(ws));
  merged.inputs = {a, wname};
  if (b0) merged.inputs.push_back(fusion::add_initializer(g, first.name + "_merged_bias", concat_1d(bs)));
  std::string wide = ir::unique_name(g, first.name + "_merged_out");
  merged.outputs = {wide};
  ir::Node split;
  split.name = ir::unique_name(g, first.name + "_split");
  split.op_type = "Split";
  split.opset = opset;
  split.inputs = {wide};
  fusion::set_int(split, "axis", out_rank - 1);
  if (opset >= 13) {
    split.inputs.push_back(fusion::add_initializer(
        g, first.name + "_split_sizes",
        Tensor::from_vector<int64_t>(DataType::kInt64, {static_cast<int64_t>(sizes.size())}, sizes)));
  } else {
    ir::Attribute s;
    s.type = ir::Attribute::Type::kInts;
    s.ints = sizes;
    split.attrs["split"] = s;
  }
  std::vector<std::string> sources;
  for (int m : members) {
    split.outputs.push_back(g.nodes[static_cast<size_t>(m)].outputs[0]);
    for (const auto& s : ir::sources_of(g.nodes[static_cast<size_t>(m)])) sources.push_back(s);
  }
  ir::Attribute src;
  src.type = ir::Attribute::Type::kStrings;
  src.strings = sources;
  merged.attrs["kiln.sources"] = src;
  split.attrs["kiln.sources"] = src;
  std::vector<ir::Node> nodes;
  nodes.reserve(g.nodes.size() + 1);
  std::set<int> drop(members.begin(), members.end());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (static_cast<int>(i) == fi) {
      nodes.push_back(std::move(merged));
      nodes.push_back(std::move(split));
    } else if (!drop.count(static_cast<int>(i))) {
      nodes.push_back(std::move(g.nodes[i]));
    }
  }
  g.nodes = std::move(nodes);
  return true;
}

}  // namespace

Result<int> fuse_horizontal_matmul(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_horizontal); }

}  // namespace kiln::passes
