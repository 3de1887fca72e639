// fuse_attention: scaled dot-product attention written out with ONNX ops
//
//   s = MatMul(Q', Kt)                       Q' = Q, or Mul(Q, c) / Div(Q, c) (scale on Q first)
//   s = Mul(s, c) | Div(s, c)                optional scale (scalar constant)
//   s = Add(s, mask)                         optional mask (either operand order)
//   p = Softmax(s) over the last axis
//   y = MatMul(p, V)
//
// becomes kiln.Attention(Q, K, V, mask?) with scale = the product of the scale factors and
// k_transposed = 0 when Kt is a Transpose swapping K's last two axes (the Transpose goes too),
// else 1 (Kt is passed as it is: e.g. torch's head split and k.transpose(-2, -1) merged into one
// Transpose by remove_noop_ops).
//
// Preconditions: every intermediate has exactly one reader; scores, probabilities and output are
// float; the mask does not broadcast the scores up (the Add's output has the scores' shape); the
// Softmax axis is the last (rank known; opset < 13 coerces to 2-D, which equals the last axis only
// then). Scale factors move from Q or from Div to one multiplication of the scores: equal up to
// float rounding (exactly equal for powers of two such as 1/sqrt(64)). Leaves alone: Softmax over
// another axis, probabilities read elsewhere (returned attention weights), non-constant scales,
// dropout between Softmax and MatMul that remove_noop_ops could not drop.
#include "passes/fusion_util.h"

namespace kiln::passes {

namespace {

using fusion::is_onnx;

// A Mul/Div by a scalar constant: the operand it scales and the factor.
bool scalar_scale(const ir::Graph& g, const ir::Node& n, std::string* in, double* factor) {
  double c;
  if (n.inputs.size() != 2 || n.outputs.size() != 1) return false;
  if (is_onnx(n, "Mul")) {
    for (size_t k = 0; k < 2; ++k)
      if (ir::constant_scalar(g, n.inputs[k], &c) && !ir::is_constant(g, n.inputs[1 - k])) {
        *in = n.inputs[1 - k];
        *factor = c;
        return fusion::same_type(g, n.outputs[0], *in);  // the constant does not broadcast it up
      }
    return false;
  }
  if (is_onnx(n, "Div") && ir::constant_scalar(g, n.inputs[1], &c) && c != 0 && !ir::is_constant(g, n.inputs[0])) {
    *in = n.inputs[0];
    *factor = 1.0 / c;
    return fusion::same_type(g, n.outputs[0], *in);
  }
  return false;
}

struct Scores {
  int matmul = -1;
  double scale = 1;
  std::set<int> nodes;
};

// Walks up from `s` through an optional scalar scale to the Q Kt MatMul.
bool walk_scores(const ir::Graph& g, const ir::UseIndex& uses, std::string s, Scores* out) {
  for (int step = 0; step < 2; ++step) {
    int p = uses.producer(s);
    if (p < 0 || !uses.single_use(s)) return false;
    const ir::Node& n = g.nodes[static_cast<size_t>(p)];
    if (fusion::is_onnx(n, "MatMul") && n.inputs.size() == 2 && n.inputs[0] != n.inputs[1]) {
      out->matmul = p;
      out->nodes.insert(p);
      return true;
    }
    double f;
    if (step > 0 || !scalar_scale(g, n, &s, &f)) return false;
    out->scale *= f;
    out->nodes.insert(p);
  }
  return false;
}

bool softmax_over_last_axis(const ir::Graph& g, const ir::Node& sm) {
  if (!is_onnx(sm, "Softmax") || sm.inputs.size() != 1 || sm.outputs.size() != 1) return false;
  const ir::TypeInfo* t = fusion::type_of(g, sm.inputs[0]);
  if (!t || !t->shape.rank_known || t->shape.rank() < 2) return false;
  int64_t rank = static_cast<int64_t>(t->shape.rank());
  int64_t axis = sm.attr_int("axis", sm.opset >= 13 ? -1 : 1);
  if (axis < 0) axis += rank;
  return axis == rank - 1;
}

bool is_last_two_swap(const ir::Graph& g, const ir::Node& t) {
  if (!is_onnx(t, "Transpose") || t.inputs.size() != 1) return false;
  const ir::TypeInfo* ti = fusion::type_of(g, t.inputs[0]);
  if (!ti || !ti->shape.rank_known || ti->shape.rank() < 2) return false;
  size_t r = ti->shape.rank();
  std::vector<int64_t> perm = t.attr_ints("perm");
  if (perm.empty()) return r == 2;  // default: reversed axes
  if (perm.size() != r) return false;
  for (size_t i = 0; i + 2 < r; ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return perm[r - 2] == static_cast<int64_t>(r - 1) && perm[r - 1] == static_cast<int64_t>(r - 2);
}

bool try_attention(ir::Graph& g, const ir::UseIndex& uses, int smi) {
  auto node = [&](int i) -> const ir::Node& { return g.nodes[static_cast<size_t>(i)]; };
  const ir::Node& sm = node(smi);
  if (!softmax_over_last_axis(g, sm)) return false;
  int mm2 = fusion::sole_consumer(uses, sm.outputs[0]);
  if (mm2 < 0 || !is_onnx(node(mm2), "MatMul") || node(mm2).inputs.size() != 2 ||
      node(mm2).inputs[0] != sm.outputs[0] || node(mm2).inputs[1] == sm.outputs[0])
    return false;
  std::set<int> group = {smi, mm2};
  const std::string v = node(mm2).inputs[1];
  // Up from the Softmax input: [Add(mask)] <- [Mul/Div(scale)] <- MatMul.
  const std::string scores_out = sm.inputs[0];
  std::string mask;
  Scores sc;
  if (!walk_scores(g, uses, scores_out, &sc)) {
    int p = uses.producer(scores_out);
    if (p < 0 || !uses.single_use(scores_out)) return false;
    const ir::Node& add = node(p);
    if (!is_onnx(add, "Add") || add.inputs.size() != 2 || add.inputs[0] == add.inputs[1]) return false;
    for (size_t k = 0; k < 2 && mask.empty(); ++k) {
      sc = Scores{};
      // The mask must not broadcast the scores up.
      if (walk_scores(g, uses, add.inputs[k], &sc) && fusion::same_type(g, add.outputs[0], add.inputs[k]))
        mask = add.inputs[1 - k];
    }
    if (mask.empty()) return false;
    group.insert(p);
  }
  group.insert(sc.nodes.begin(), sc.nodes.end());
  double scale = sc.scale;
  std::string q = node(sc.matmul).inputs[0], kt = node(sc.matmul).inputs[1];
  // Scale applied to Q before the product.
  int qp = uses.producer(q);
  std::string q_in;
  double f;
  if (qp >= 0 && uses.single_use(q) && scalar_scale(g, node(qp), &q_in, &f)) {
    scale *= f;
    group.insert(qp);
    q = q_in;
  }
  // K given transposed by a last-two-axes Transpose: take K itself.
  int k_transposed = 1;
  std::string k = kt;
  int tp = uses.producer(kt);
  if (tp >= 0 && uses.single_use(kt) && is_last_two_swap(g, node(tp))) {
    k = node(tp).inputs[0];
    k_transposed = 0;
    group.insert(tp);
  }
  if (!fusion::is_float_value(g, scores_out) || !fusion::is_float_value(g, node(mm2).outputs[0]) ||
      !fusion::in_float_range(scale))
    return false;
  ir::Node att = fusion::kiln_node("Attention", node(mm2).name);
  att.inputs = {q, k, v};
  if (!mask.empty()) att.inputs.push_back(mask);
  att.outputs = {node(mm2).outputs[0]};
  fusion::set_float(att, "scale", static_cast<float>(scale));
  fusion::set_int(att, "k_transposed", k_transposed);
  fusion::replace_group(g, group, std::move(att));
  return true;
}

}  // namespace

Result<int> fuse_attention(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_attention); }

}  // namespace kiln::passes
