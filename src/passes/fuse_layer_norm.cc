// fuse_layer_norm: the layer normalization torch exports at opset < 17 (and others write by hand)
//
//   mean = ReduceMean(x, axes)            d = Sub(x, mean)
//   var  = ReduceMean(Pow(d, 2) | Mul(d, d), axes)
//   n    = Div(d, Sqrt(Add(var, eps)))  |  Mul(d, Reciprocal(Sqrt(Add(var, eps))))
//   y    = [Mul(n, gamma)] [Add(., beta)]      (operands of Add/Mul in either order)
//
// becomes kiln.LayerNormalization(x, gamma?, beta?) with axis = -len(axes), epsilon = eps.
//
// Preconditions: both ReduceMeans reduce the same axes, which are the last dims of x (rank known),
// with keepdims = 1; eps is a scalar constant; gamma and beta are constants that vary only along
// the normalized dims (they are stored expanded to the normalized shape, whose dims must be
// known); x is a float tensor; every intermediate has exactly the readers the pattern shows.
// Leaves alone: normalization over leading or middle axes, keepdims = 0, a gamma/beta that is
// not constant or would broadcast x up, any intermediate read elsewhere (e.g. the mean also
// being an output), and ReduceMean without explicit axes.
#include "passes/fusion_util.h"

namespace kiln::passes {

namespace {

using fusion::is_onnx;

// Axes of a ReduceMean with keepdims = 1 as sorted non-negative indices; empty when unusable.
std::vector<int64_t> reduce_axes(const ir::Graph& g, const ir::Node& n, int64_t rank) {
  if (!is_onnx(n, "ReduceMean") || n.attr_int("keepdims", 1) != 1 || n.outputs.size() != 1) return {};
  std::vector<int64_t> axes;
  if (n.opset >= 18) {
    if (n.attr_int("noop_with_empty_axes", 0) != 0 || !n.has_input(1)) return {};
    const Tensor* t = ir::constant_value(g, n.inputs[1]);
    if (!t || t->rank() > 1) return {};
    for (int64_t i = 0; i < t->numel(); ++i) axes.push_back(t->get_i64(i));
  } else {
    axes = n.attr_ints("axes");
  }
  for (auto& a : axes) {
    if (a < -rank || a >= rank) return {};
    if (a < 0) a += rank;
  }
  std::sort(axes.begin(), axes.end());
  for (size_t i = 0; i < axes.size(); ++i)  // the last axes.size() dims, each once
    if (axes[i] != rank - static_cast<int64_t>(axes.size()) + static_cast<int64_t>(i)) return {};
  return axes;
}

// gamma/beta expanded to the normalized shape, when it varies only along the normalized dims.
bool param_for(const Tensor& p, const Dims& norm, int64_t rank, DataType dt, Tensor* out) {
  if (p.dtype() != dt || p.rank() > rank) return false;
  int64_t k = static_cast<int64_t>(norm.size());
  for (int64_t i = 0; i < p.rank(); ++i) {  // right-aligned
    int64_t from_end = p.rank() - 1 - i;
    int64_t d = p.dim(i);
    if (from_end >= k) {
      if (d != 1) return false;  // would vary along a non-normalized dim
    } else if (d != 1 && d != norm[static_cast<size_t>(k - 1 - from_end)]) {
      return false;
    }
  }
  Tensor e(dt, norm);
  Dims pshape = p.shape();
  while (static_cast<int64_t>(pshape.size()) > k) pshape.erase(pshape.begin());  // the leading 1s
  Dims padded(static_cast<size_t>(k) - pshape.size(), 1);
  padded.insert(padded.end(), pshape.begin(), pshape.end());
  // Index of each element of the normalized shape into p (broadcasting size-1 dims).
  for (int64_t i = 0; i < e.numel(); ++i) {
    int64_t rem = i, src = 0, stride = 1;
    for (int64_t a = k - 1; a >= 0; --a) {
      int64_t nd = norm[static_cast<size_t>(a)], pd = padded[static_cast<size_t>(a)];
      int64_t idx = rem % nd;
      rem /= nd;
      if (pd != 1) src += idx * stride;
      stride *= pd;
    }
    e.set_f64(i, p.get_f64(src));
  }
  *out = std::move(e);
  return true;
}

bool try_layer_norm(ir::Graph& g, const ir::UseIndex& uses, int ri) {
  const ir::Node& mean = g.nodes[static_cast<size_t>(ri)];
  if (!is_onnx(mean, "ReduceMean") || mean.inputs.empty()) return false;
  const std::string& x = mean.inputs[0];
  const ir::TypeInfo* xt = fusion::type_of(g, x);
  if (!xt || !dtype_is_float(xt->elem) || !xt->shape.rank_known || xt->shape.rank() == 0) return false;
  int64_t rank = static_cast<int64_t>(xt->shape.rank());
  std::vector<int64_t> axes = reduce_axes(g, mean, rank);
  if (axes.empty()) return false;
  std::set<int> group = {ri};
  auto node = [&](int i) -> const ir::Node& { return g.nodes[static_cast<size_t>(i)]; };
  // d = x - mean
  int si = fusion::sole_consumer(uses, mean.outputs[0]);
  if (si < 0 || !is_onnx(node(si), "Sub") || node(si).inputs.size() != 2 || node(si).inputs[0] != x ||
      node(si).inputs[1] != mean.outputs[0])
    return false;
  group.insert(si);
  const std::string d = node(si).outputs[0];
  if (uses.is_graph_output(d)) return false;
  // Readers of d: the square (once as Pow, twice as Mul(d, d)) and the normalization.
  int sq = -1, norm = -1;
  for (int c : uses.consumers(d)) {
    const ir::Node& n = node(c);
    bool square = (is_onnx(n, "Mul") && n.inputs.size() == 2 && n.inputs[0] == d && n.inputs[1] == d);
    if (is_onnx(n, "Pow") && n.inputs.size() == 2 && n.inputs[0] == d) {
      const Tensor* et = ir::constant_value(g, n.inputs[1]);  // rank <= 1: cannot broadcast d up
      square = et && et->numel() == 1 && et->rank() <= 1 && et->get_f64(0) == 2;
    }
    if (square) {
      if (sq >= 0 && sq != c) return false;
      sq = c;
    } else {
      if (norm >= 0) return false;
      norm = c;
    }
  }
  if (sq < 0 || norm < 0) return false;
  group.insert(sq);
  int vi = fusion::sole_consumer(uses, node(sq).outputs[0]);
  if (vi < 0 || reduce_axes(g, node(vi), rank) != axes || node(vi).inputs[0] != node(sq).outputs[0]) return false;
  group.insert(vi);
  int ai = fusion::sole_consumer(uses, node(vi).outputs[0]);
  double eps;
  if (ai < 0 || !is_onnx(node(ai), "Add") ||
      !ir::constant_scalar(g, fusion::other_input(node(ai), node(vi).outputs[0]), &eps) || !fusion::fits_float(eps) ||
      !(eps >= 0))
    return false;
  group.insert(ai);
  int qi = fusion::sole_consumer(uses, node(ai).outputs[0]);
  if (qi < 0 || !is_onnx(node(qi), "Sqrt")) return false;
  group.insert(qi);
  const std::string sd = node(qi).outputs[0];
  const ir::Node& nn = node(norm);
  if (is_onnx(nn, "Div")) {
    if (nn.inputs.size() != 2 || nn.inputs[0] != d || nn.inputs[1] != sd || fusion::sole_consumer(uses, sd) != norm)
      return false;
  } else if (is_onnx(nn, "Mul")) {
    int rc = fusion::sole_consumer(uses, sd);
    if (rc < 0 || !is_onnx(node(rc), "Reciprocal") || fusion::other_input(nn, d) != node(rc).outputs[0] ||
        fusion::sole_consumer(uses, node(rc).outputs[0]) != norm)
      return false;
    group.insert(rc);
  } else {
    return false;
  }
  group.insert(norm);
  std::string y = nn.outputs[0];
  // Shapes: the normalized part must be static (gamma/beta are expanded to it), and the result
  // so far has x's shape.
  if (!fusion::same_type(g, y, x)) return false;
  Dims norm_shape;
  for (int64_t a : axes) {
    const Dim& dd = xt->shape.dims[static_cast<size_t>(a)];
    if (!dd.known()) return false;
    norm_shape.push_back(dd.value);
  }
  std::string gamma, beta;
  for (int step = 0; step < 2; ++step) {  // Mul(gamma), then Add(beta); either may be absent
    int c = fusion::sole_consumer(uses, y);
    if (c < 0) break;
    const ir::Node& n = node(c);
    bool is_mul = is_onnx(n, "Mul") && step == 0, is_add = is_onnx(n, "Add");
    if (!is_mul && !is_add) break;
    std::string other = fusion::other_input(n, y);
    const Tensor* p = other.empty() ? nullptr : ir::constant_value(g, other);
    Tensor expanded;
    if (!p || !param_for(*p, norm_shape, rank, xt->elem, &expanded) || !fusion::same_type(g, n.outputs[0], x)) break;
    std::string name = fusion::add_initializer(g, other + (is_mul ? "_ln_scale" : "_ln_bias"), std::move(expanded));
    (is_mul ? gamma : beta) = name;
    group.insert(c);
    y = n.outputs[0];
    if (is_add) break;
  }
  ir::Node ln = fusion::kiln_node("LayerNormalization", node(*group.rbegin()).name);
  ln.inputs = {x, gamma, beta};
  while (!ln.inputs.empty() && ln.inputs.back().empty()) ln.inputs.pop_back();
  ln.outputs = {y};
  fusion::set_int(ln, "axis", -static_cast<int64_t>(axes.size()));
  fusion::set_float(ln, "epsilon", static_cast<float>(eps));
  fusion::replace_group(g, group, std::move(ln));
  return true;
}

}  // namespace

Result<int> fuse_layer_norm(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_layer_norm); }

}  // namespace kiln::passes
