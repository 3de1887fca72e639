// fold_batch_norm: an inference-mode BatchNormalization y = (x - mean) / sqrt(var + eps) * gamma + beta
// is y = x * s + t with per-channel s = gamma / sqrt(var + eps), t = beta - mean * s. When x comes
// from a Conv (or a Gemm, or a 2-D MatMul) with constant weights and nothing else reads x, s is
// folded into the weights and t into the bias, and the BatchNormalization disappears. Otherwise a
// standalone one becomes Mul(x, s) -> Add(t) with s, t shaped [C, 1, ...] (elementwise fusion then
// merges them). Needs all four statistics constant and the training outputs unused.
#include <cmath>

#include "ir/rewrite.h"
#include "ops/common.h"
#include "passes/pass.h"

namespace kiln::passes {

namespace {

struct Affine {
  std::vector<double> s, t;
};

bool bn_affine(const ir::Graph& g, const ir::Node& bn, Affine* out) {
  if (bn.inputs.size() < 5) return false;
  for (size_t k = 1; k < bn.outputs.size(); ++k)
    if (!bn.outputs[k].empty()) return false;  // training outputs requested
  if (bn.attr_int("training_mode", 0) != 0 || (bn.opset < 7 && bn.attr_int("is_test", 0) == 0 && bn.attr("is_test")))
    return false;
  if (bn.opset < 9 && bn.attr_int("spatial", 1) != 1) return false;
  const Tensor* p[4];
  for (int k = 0; k < 4; ++k) {
    p[k] = ir::constant_value(g, bn.inputs[static_cast<size_t>(k + 1)]);
    if (!p[k] || !dtype_is_float(p[k]->dtype()) || p[k]->rank() != 1) return false;
  }
  int64_t c = p[0]->numel();
  for (int k = 1; k < 4; ++k)
    if (p[k]->numel() != c) return false;
  double eps = bn.attr_float("epsilon", 1e-5f);
  out->s.resize(static_cast<size_t>(c));
  out->t.resize(static_cast<size_t>(c));
  for (int64_t i = 0; i < c; ++i) {
    double s = p[0]->get_f64(i) / std::sqrt(p[3]->get_f64(i) + eps);
    out->s[static_cast<size_t>(i)] = s;
    out->t[static_cast<size_t>(i)] = p[1]->get_f64(i) - p[2]->get_f64(i) * s;
  }
  return true;
}

std::string add_initializer(ir::Graph& g, const std::string& base, Tensor t) {
  std::string name = ir::unique_name(g, base);
  g.initializers[name] = std::move(t);
  return name;
}

// Conv: W [M, C/g, k...] scaled per output channel m; bias B' = B * s + t.
bool fold_into_conv(ir::Graph& g, ir::Node& conv, const Affine& a) {
  const Tensor* w = ir::constant_value(g, conv.inputs[1]);
  if (!w || !dtype_is_float(w->dtype()) || w->rank() < 3 || w->dim(0) != static_cast<int64_t>(a.s.size())) return false;
  const Tensor* b = conv.has_input(2) ? ir::constant_value(g, conv.inputs[2]) : nullptr;
  if (conv.has_input(2) && (!b || b->numel() != w->dim(0))) return false;
  Tensor nw = w->clone();
  int64_t per = nw.numel() / nw.dim(0);
  for (int64_t m = 0; m < nw.dim(0); ++m)
    for (int64_t k = 0; k < per; ++k) nw.set_f64(m * per + k, nw.get_f64(m * per + k) * a.s[static_cast<size_t>(m)]);
  Tensor nb(w->dtype(), {w->dim(0)});
  for (int64_t m = 0; m < w->dim(0); ++m)
    nb.set_f64(m, (b ? b->get_f64(m) : 0.0) * a.s[static_cast<size_t>(m)] + a.t[static_cast<size_t>(m)]);
  conv.inputs[1] = add_initializer(g, conv.inputs[1] + "_bnfold", std::move(nw));
  if (conv.inputs.size() < 3) conv.inputs.resize(3);
  conv.inputs[2] = add_initializer(g, conv.name + "_bias_bnfold", std::move(nb));
  return true;
}

// Gemm Y = alpha * A' B' + beta * C with Y [N, M]: scale B' columns; C' = C * s + t / beta.
bool fold_into_gemm(ir::Graph& g, ir::Node& gemm, const Affine& a) {
  const Tensor* w = ir::constant_value(g, gemm.inputs[1]);
  int64_t m_count = static_cast<int64_t>(a.s.size());
  if (!w || !dtype_is_float(w->dtype()) || w->rank() != 2) return false;
  bool trans_b = gemm.attr_int("transB", 0) != 0;
  if ((trans_b ? w->dim(0) : w->dim(1)) != m_count) return false;
  double beta = gemm.attr_float("beta", 1.0f);
  const Tensor* c = gemm.has_input(2) ? ir::constant_value(g, gemm.inputs[2]) : nullptr;
  if (gemm.has_input(2) && (!c || (c->numel() != 1 && c->numel() != m_count) || beta == 0)) return false;
  Tensor nw = w->clone();
  for (int64_t r = 0; r < nw.dim(0); ++r)
    for (int64_t col = 0; col < nw.dim(1); ++col) {
      int64_t m = trans_b ? r : col;
      nw.set_f64(r * nw.dim(1) + col, nw.get_f64(r * nw.dim(1) + col) * a.s[static_cast<size_t>(m)]);
    }
  Tensor nc(w->dtype(), {m_count});
  for (int64_t m = 0; m < m_count; ++m) {
    double cv = c ? c->get_f64(c->numel() == 1 ? 0 : m) : 0.0;
    nc.set_f64(m,
               c ? cv * a.s[static_cast<size_t>(m)] + a.t[static_cast<size_t>(m)] / beta : a.t[static_cast<size_t>(m)]);
  }
  gemm.inputs[1] = add_initializer(g, gemm.inputs[1] + "_bnfold", std::move(nw));
  if (gemm.inputs.size() < 3) gemm.inputs.resize(3);
  gemm.inputs[2] = add_initializer(g, gemm.name + "_bias_bnfold", std::move(nc));
  if (!c) {
    ir::Attribute one;
    one.type = ir::Attribute::Type::kFloat;
    one.f = 1.0f;
    gemm.attrs["beta"] = one;
  }
  return true;
}

}  // namespace

Result<int> fold_batch_norm(ir::Graph& g) {
  int changed = 0;
  std::set<int> removed;
  ir::UseIndex uses(g);
  std::vector<ir::Node> added;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::Node& bn = g.nodes[i];
    if (bn.op_type != "BatchNormalization" || !bn.domain.empty()) continue;
    Affine a;
    if (!bn_affine(g, bn, &a)) continue;
    const std::string& x = bn.inputs[0];
    int p = uses.producer(x);
    bool folded = false;
    if (p >= 0 && uses.single_use(x) && !removed.count(p)) {
      ir::Node& prod = g.nodes[static_cast<size_t>(p)];
      if (prod.domain.empty() && prod.op_type == "Conv" && prod.inputs.size() >= 2)
        folded = fold_into_conv(g, prod, a);
      else if (prod.domain.empty() && prod.op_type == "Gemm" && prod.inputs.size() >= 2)
        folded = fold_into_gemm(g, prod, a);
      if (folded) {
        prod.outputs[0] = bn.outputs[0];
        ir::add_sources(prod, bn);
      }
    }
    if (!folded) {                 // standalone: x * s + t with s, t shaped [C, 1, ...]
      if (bn.opset < 7) continue;  // legacy Mul/Add would not broadcast [C, 1, 1]
      auto xt = g.value_types.find(x);
      if (xt == g.value_types.end() || !xt->second.is_tensor() || !xt->second.shape.rank_known ||
          xt->second.shape.rank() < 2 || !dtype_is_float(xt->second.elem))
        continue;
      Dims shape(xt->second.shape.rank() - 1, 1);
      shape[0] = static_cast<int64_t>(a.s.size());
      Tensor s(xt->second.elem, shape), t(xt->second.elem, shape);
      for (size_t c = 0; c < a.s.size(); ++c) {
        s.set_f64(static_cast<int64_t>(c), a.s[c]);
        t.set_f64(static_cast<int64_t>(c), a.t[c]);
      }
      std::string sn = add_initializer(g, bn.name + "_scale", std::move(s));
      std::string tn = add_initializer(g, bn.name + "_shift", std::move(t));
      std::string mid = ir::unique_name(g, bn.name + "_scaled");
      ir::Node mul, add;
      mul.name = ir::unique_name(g, bn.name + "_mul");
      mul.op_type = "Mul";
      mul.opset = bn.opset;
      mul.inputs = {x, sn};
      mul.outputs = {mid};
      add.name = ir::unique_name(g, bn.name + "_add");
      add.op_type = "Add";
      add.opset = bn.opset;
      add.inputs = {mid, tn};
      add.outputs = {bn.outputs[0]};
      added.push_back(std::move(mul));
      added.push_back(std::move(add));
    }
    removed.insert(static_cast<int>(i));
    ++changed;
  }
  ir::remove_nodes(g, removed);
  for (auto& n : added) g.nodes.push_back(std::move(n));
  return changed;
}

}  // namespace kiln::passes
