// fuse_gelu: recognizes GELU written out with elementwise ops and replaces it by kiln.Gelu.
//
// Matches, anchored at an Erf or Tanh node E:
//   erf form   P(x) * (1 + Erf(Q(x)))   with P(x) = 0.5 x and Q(x) = x / sqrt(2)
//   tanh form  P(x) * (1 + Tanh(Q(x)))  with P(x) = 0.5 x and Q(x) = sqrt(2/pi) (x + 0.044715 x^3)
// where P is a product (a tree of Mul nodes, in any order and grouping: torch's
// Mul(Mul(x, 1 + erf), 0.5), 0.5 * x * (...), ...) and Q any polynomial built from Add, Sub,
// Mul, Div by a constant, Neg and Pow(., 2 or 3) of x and scalar constants (x / 1.4142, x * 0.7071,
// x * x * x, Pow(x, 3), ...; Sum of two counts as Add). The coefficients are compared within float32 rounding (1e-6
// relative), so only true GELUs match. `1 + E` may be Add(E, 1) or Add(1, E).
//
// Preconditions: every intermediate node has exactly one reader (x itself may have many), the
// constants are scalars, and the result has x's dtype and shape (a constant of higher rank could
// broadcast x up; then nothing is fused). Leaves alone: partial patterns, 0.5 * (x + x * erf(...))
// (the factor must stay a product), float tensors of other rank than x. Torch's exports at
// opset < 20 and ONNX's Gelu function body (test_gelu_*_expanded) take these forms.
#include <map>

#include "passes/fusion_util.h"

namespace kiln::passes {

namespace {

using fusion::close_to;
using fusion::is_onnx;

// c[d] is the coefficient of x^d.
struct Poly {
  double c[4] = {0, 0, 0, 0};
  bool has_marker = false;  // a factor (1 + E) multiplies the whole polynomial
};

// Add, or a Sum of two (ONNX function bodies write 1 + erf as Sum).
bool is_add(const ir::Node& n) {
  return is_onnx(n, "Add") || (is_onnx(n, "Sum") && n.opset >= 8 && n.inputs.size() == 2);
}

class GeluMatcher {
 public:
  GeluMatcher(const ir::Graph& g, const ir::UseIndex& uses) : g_(g), uses_(uses) {}

  std::string x;        // the GELU's input, fixed by the first non-constant leaf
  std::string marker;   // value treated as the factor (1 + E), appearing once in a product
  std::set<int> nodes;  // matched nodes
  int markers_seen = 0;

  // `v` as a polynomial in x (degree <= 3). `top` allows `v` itself to have several readers (the
  // root's output stays); every node below must have exactly one.
  bool poly(const std::string& v, Poly* out, int depth = 0) {
    if (depth > 24) return false;
    double c;
    if (!marker.empty() && v == marker) {
      ++markers_seen;
      *out = Poly{};
      out->c[0] = 1;
      out->has_marker = true;
      return true;
    }
    if (ir::constant_scalar(g_, v, &c)) {
      *out = Poly{};
      out->c[0] = c;
      return true;
    }
    if (!x.empty() && v == x) return leaf(out);
    int p = uses_.producer(v);
    bool arithmetic = false;
    if (p >= 0 && (depth == 0 || uses_.single_use(v))) {
      const ir::Node& n = g_.nodes[static_cast<size_t>(p)];
      arithmetic = is_add(n) || is_onnx(n, "Sub") || is_onnx(n, "Mul") || is_onnx(n, "Div") || is_onnx(n, "Pow") ||
                   (is_onnx(n, "Neg") && n.opset >= 6);
      arithmetic = arithmetic && n.outputs.size() == 1 && !nodes.count(p);
    }
    if (!arithmetic) {
      if (!x.empty() || depth == 0) return false;  // another non-constant leaf: not a polynomial in x
      x = v;
      return leaf(out);
    }
    const ir::Node& n = g_.nodes[static_cast<size_t>(p)];
    nodes.insert(p);
    if (n.op_type == "Neg") {
      if (!poly(n.inputs[0], out, depth + 1)) return false;
      for (double& k : out->c) k = -k;
      return true;
    }
    if (n.inputs.size() != 2) return false;
    if (n.op_type == "Pow") {
      const Tensor* et = ir::constant_value(g_, n.inputs[1]);
      double e = et && et->numel() == 1 ? et->get_f64(0) : 0;
      if (e != 2 && e != 3) return false;
      Poly b;
      if (!poly(n.inputs[0], &b, depth + 1) || b.has_marker) return false;
      *out = b;
      for (int k = 1; k < static_cast<int>(e); ++k)
        if (!mul(*out, b, out)) return false;
      return true;
    }
    if (n.op_type == "Div") {
      double d;
      if (!ir::constant_scalar(g_, n.inputs[1], &d) || d == 0) return false;
      if (!poly(n.inputs[0], out, depth + 1)) return false;
      for (double& k : out->c) k /= d;
      return true;
    }
    Poly a, b;
    if (!poly(n.inputs[0], &a, depth + 1) || !poly(n.inputs[1], &b, depth + 1)) return false;
    if (n.op_type == "Mul") return mul(a, b, out);
    if (a.has_marker || b.has_marker) return false;  // (1 + E) must multiply everything
    for (int k = 0; k < 4; ++k) out->c[k] = n.op_type == "Sub" ? a.c[k] - b.c[k] : a.c[k] + b.c[k];
    out->has_marker = false;
    return true;
  }

 private:
  static bool leaf(Poly* out) {
    *out = Poly{};
    out->c[1] = 1;
    return true;
  }
  static bool mul(const Poly& a, const Poly& b, Poly* out) {
    if (a.has_marker && b.has_marker) return false;
    Poly r;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        if (a.c[i] == 0 || b.c[j] == 0) continue;
        if (i + j > 3) return false;
        r.c[i + j] += a.c[i] * b.c[j];
      }
    r.has_marker = a.has_marker || b.has_marker;
    *out = r;
    return true;
  }
  const ir::Graph& g_;
  const ir::UseIndex& uses_;
};

bool poly_is(const Poly& p, double c0, double c1, double c2, double c3) {
  const double want[4] = {c0, c1, c2, c3};
  for (int k = 0; k < 4; ++k)
    if (want[k] == 0 ? p.c[k] != 0 : !close_to(p.c[k], want[k])) return false;
  return true;
}

bool try_gelu(ir::Graph& g, const ir::UseIndex& uses, int ei) {
  const ir::Node& e = g.nodes[static_cast<size_t>(ei)];
  bool erf = is_onnx(e, "Erf"), tanh = is_onnx(e, "Tanh");
  if ((!erf && !tanh) || e.inputs.size() != 1 || e.outputs.size() != 1 || e.opset < 6) return false;
  // 1 + E
  int ai = fusion::sole_consumer(uses, e.outputs[0]);
  if (ai < 0) return false;
  const ir::Node& add = g.nodes[static_cast<size_t>(ai)];
  double one;
  if (!is_add(add) || !ir::constant_scalar(g, fusion::other_input(add, e.outputs[0]), &one) || one != 1) return false;
  // Q(x), the argument of E.
  GeluMatcher m(g, uses);
  Poly q;
  if (!m.poly(e.inputs[0], &q, 1) || m.x.empty() || q.has_marker) return false;
  const double k = std::sqrt(2.0 / M_PI);
  if (erf ? !poly_is(q, 0, 1 / std::sqrt(2.0), 0, 0) : !poly_is(q, 0, k, 0, k * 0.044715)) return false;
  if (!fusion::is_float_value(g, m.x)) return false;
  std::set<int> arg_nodes = m.nodes;
  // Climb the product containing (1 + E); the lowest Mul whose product is 0.5 x * (1 + E) is the root.
  std::string cur = add.outputs[0];
  for (int level = 0; level < 6; ++level) {
    int ri = fusion::sole_consumer(uses, cur);
    if (ri < 0 || !is_onnx(g.nodes[static_cast<size_t>(ri)], "Mul")) return false;
    const ir::Node& root = g.nodes[static_cast<size_t>(ri)];
    m.nodes = arg_nodes;
    m.marker = add.outputs[0];
    m.markers_seen = 0;
    Poly p;
    if (m.poly(root.outputs[0], &p, 0) && m.markers_seen == 1 && p.has_marker && poly_is(p, 0, 0.5, 0, 0)) {
      if (!fusion::same_type(g, root.outputs[0], m.x)) return false;
      std::set<int> group = m.nodes;
      group.insert(ei);
      group.insert(ai);
      ir::Node gelu = fusion::kiln_node("Gelu", root.name);
      gelu.inputs = {m.x};
      gelu.outputs = {root.outputs[0]};
      fusion::set_string(gelu, "approximate", erf ? "none" : "tanh");
      fusion::replace_group(g, group, std::move(gelu));
      return true;
    }
    cur = root.outputs[0];
  }
  return false;
}

}  // namespace

Result<int> fuse_gelu(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_gelu); }

}  // namespace kiln::passes
