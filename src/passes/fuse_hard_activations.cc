// fuse_hard_activations: recognizes HardSwish and HardSigmoid written with other ops and replaces
// them by the single ONNX op, which fuse_activation then folds into the producing conv / gemm.
//
// Matches, for a float value x:
//   Mul(x, HardSigmoid(x)) with alpha = 1/6, beta = 0.5           -> HardSwish(x)
//       (torch's export of hardswish below opset 14; either operand order)
//   Clip(x + 3, 0, 6) / 6, or * (1/6)                              -> HardSigmoid(x, 1/6, 0.5)
//   x * Clip(x + 3, 0, 6) / 6, or * (1/6), in any grouping          -> HardSwish(x)
//       ((x * c) / 6, x * (c / 6), (c * x) * (1/6), ...)
// where the Clip's bounds are constant scalars (inputs at opset >= 11, attributes below) and
// `x + 3` is Add(x, 3) or Add(3, x). Constants are compared within float32 rounding (1e-6
// relative). HardSwish is made at opset 14 (its first version), whatever the model's opset.
//
// Preconditions: every intermediate node has exactly one reader (x itself may have many) and is
// not a graph output, constants are scalars, and the result has x's dtype and shape. Leaves alone:
// other constants (Clip(x + 3, 0, 5), HardSigmoid's default alpha 0.2), Mul(x, HardSigmoid(y))
// with y != x, and intermediates that something else reads (they would have to stay).
#include "passes/fusion_util.h"

namespace kiln::passes {

namespace {

using fusion::close_to;
using fusion::is_onnx;

constexpr double kSixth = 1.0 / 6.0;

const ir::Node& node_at(const ir::Graph& g, int i) { return g.nodes[static_cast<size_t>(i)]; }

// The constant scalar `v`, within float32 rounding of `want`.
bool is_scalar_near(const ir::Graph& g, const std::string& v, double want) {
  double c;
  return ir::constant_scalar(g, v, &c) && (want == 0 ? c == 0 : close_to(c, want));
}

// The bounds of Clip node `n`: constant scalars 0 and 6.
bool is_relu6_clip(const ir::Graph& g, const ir::Node& n) {
  if (!is_onnx(n, "Clip") || n.outputs.size() != 1 || n.inputs.empty()) return false;
  if (n.opset < 11) {
    if (n.inputs.size() != 1 || !n.attr("min") || !n.attr("max")) return false;
    return n.attr_float("min", 1) == 0.f && close_to(n.attr_float("max", 0), 6.0);
  }
  return n.inputs.size() == 3 && is_scalar_near(g, n.inputs[1], 0) && is_scalar_near(g, n.inputs[2], 6.0);
}

// Node `i` scales `v` by 1/6: Div(v, 6) or Mul(v, 1/6) / Mul(1/6, v).
bool is_sixth_of(const ir::Graph& g, int i, const std::string& v) {
  if (i < 0) return false;
  const ir::Node& n = node_at(g, i);
  if (n.outputs.size() != 1 || n.inputs.size() != 2) return false;
  if (is_onnx(n, "Div")) return n.inputs[0] == v && n.inputs[1] != v && is_scalar_near(g, n.inputs[1], 6.0);
  if (is_onnx(n, "Mul")) {
    std::string c = fusion::other_input(n, v);
    return !c.empty() && is_scalar_near(g, c, kSixth);
  }
  return false;
}

// Node `i` is Mul(x, v) or Mul(v, x).
bool is_mul_by_x(const ir::Graph& g, int i, const std::string& v, const std::string& x) {
  if (i < 0) return false;
  const ir::Node& n = node_at(g, i);
  return is_onnx(n, "Mul") && n.outputs.size() == 1 && fusion::other_input(n, v) == x;
}

ir::Node hard_swish(const ir::Node& root, const std::string& x) {
  ir::Node hs;
  hs.name = root.name;
  hs.op_type = "HardSwish";
  hs.opset = 14;
  hs.inputs = {x};
  hs.outputs = root.outputs;
  return hs;
}

// Replaces `group` (whose last node `root` produces the result) by `fused`, when the result has
// x's type (no broadcast by a constant of higher rank).
bool replace_if_same_type(ir::Graph& g, const std::set<int>& group, const std::string& x, ir::Node fused) {
  if (!fusion::is_float_value(g, x) || !fusion::same_type(g, fused.outputs[0], x)) return false;
  fusion::replace_group(g, group, std::move(fused));
  return true;
}

// Anchored at HardSigmoid(x; 1/6, 0.5) read only by Mul(x, .).
bool try_hard_sigmoid_mul(ir::Graph& g, const ir::UseIndex& uses, int hi) {
  const ir::Node& h = node_at(g, hi);
  if (!is_onnx(h, "HardSigmoid") || h.inputs.size() != 1 || h.outputs.size() != 1) return false;
  if (!close_to(h.attr_float("alpha", 0.2f), kSixth) || !close_to(h.attr_float("beta", 0.5f), 0.5)) return false;
  const std::string& x = h.inputs[0];
  int mi = fusion::sole_consumer(uses, h.outputs[0]);
  if (!is_mul_by_x(g, mi, h.outputs[0], x)) return false;
  return replace_if_same_type(g, {hi, mi}, x, hard_swish(node_at(g, mi), x));
}

// Anchored at Clip(x + 3, 0, 6).
bool try_clip_form(ir::Graph& g, const ir::UseIndex& uses, int ci) {
  const ir::Node& c = node_at(g, ci);
  if (!is_relu6_clip(g, c)) return false;
  int ai = uses.producer(c.inputs[0]);
  if (ai < 0 || !uses.single_use(c.inputs[0])) return false;
  const ir::Node& add = node_at(g, ai);
  if (!is_onnx(add, "Add") || add.inputs.size() != 2 || add.outputs.size() != 1) return false;
  std::string x;
  for (size_t k = 0; k < 2 && x.empty(); ++k)
    if (is_scalar_near(g, add.inputs[k], 3.0) && !ir::is_constant(g, add.inputs[1 - k])) x = add.inputs[1 - k];
  if (x.empty()) return false;
  const std::string& cv = c.outputs[0];
  int ni = fusion::sole_consumer(uses, cv);
  if (ni < 0) return false;
  if (is_sixth_of(g, ni, cv)) {
    // Clip(x + 3, 0, 6) / 6 is HardSigmoid; times x, HardSwish.
    const std::string& s = node_at(g, ni).outputs[0];
    int mi = fusion::sole_consumer(uses, s);
    if (is_mul_by_x(g, mi, s, x)) return replace_if_same_type(g, {ai, ci, ni, mi}, x, hard_swish(node_at(g, mi), x));
    ir::Node hsig;
    hsig.name = node_at(g, ni).name;
    hsig.op_type = "HardSigmoid";
    hsig.opset = 6;
    hsig.inputs = {x};
    hsig.outputs = {s};
    fusion::set_float(hsig, "alpha", static_cast<float>(kSixth));
    fusion::set_float(hsig, "beta", 0.5f);
    return replace_if_same_type(g, {ai, ci, ni}, x, std::move(hsig));
  }
  if (is_mul_by_x(g, ni, cv, x)) {
    // (x * Clip(x + 3, 0, 6)) / 6
    const std::string& p = node_at(g, ni).outputs[0];
    int di = fusion::sole_consumer(uses, p);
    if (is_sixth_of(g, di, p)) return replace_if_same_type(g, {ai, ci, ni, di}, x, hard_swish(node_at(g, di), x));
  }
  return false;
}

bool try_at(ir::Graph& g, const ir::UseIndex& uses, int i) {
  return try_hard_sigmoid_mul(g, uses, i) || try_clip_form(g, uses, i);
}

}  // namespace

Result<int> fuse_hard_activations(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_at); }

}  // namespace kiln::passes
