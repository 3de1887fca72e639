// fold_qdq_matmul: ONNX Runtime's dynamic quantization of a linear layer (quantize_dynamic) becomes
// one INT8 layer, kiln.DynQMatMul (src/ops/dyn_quant_matmul.cc):
//
//   (q, s, z) = DynamicQuantizeLinear(X)
//   y = Add(Mul(Cast<float>(MatMulInteger(q, B, z, b_zp?)), Mul(s, w_scale)), bias)   (the Add optional)
//   -> y = kiln.DynQMatMul(X, B, b_zp, w_scale, bias)
//
// The scale may also be s itself (w_scale 1: Mul(s, 1) is s exactly). Preconditions: the
// MatMulInteger reads the quantizer's q and z (its own zero point, not another's), B is a 2-D
// constant and b_zp (if any) a constant scalar or [N]; w_scale a float32 constant, a scalar or [N];
// the bias a float32 constant [N] (its only non-1 dim the last); the integer product, the Cast and the
// float Mul have no other readers. Exact: the fused node's reference runs the same ONNX kernels in the
// same order. The quantizer and the scale Mul stay for their other readers (dead code removal drops
// them otherwise: several layers reading one quantized X each quantize it again, which costs one pass
// over X). Leaves alone: MatMulInteger with other operands (activation x activation, run-time
// weights), which stays an ONNX MatMulInteger.
//
// The same pass folds quantize_static's explicit (Q/DQ) form of a MatMul with a constant weight:
//
//   QuantizeLinear(MatMul(DequantizeLinear(xq, xs, xz), DequantizeLinear(W, ws, wz)), ys, yz)
//   -> QLinearMatMul(xq, xs, xz, W, ws, wz, ys, yz)
//
// with xq uint8 and xs, xz, ys, yz scalars, W a 2-D int8 constant whose scale and zero point are
// constant scalars or per column (axis 1); the MatMul's output has no other reader. Not bit-exact but
// exact up to float rounding: QLinearMatMul sums the integer products exactly where the float MatMul
// rounds its sum, so an output next to a rounding boundary of the output quantizer may differ by one
// step. Left alone: Gemm (its int32 bias as DequantizeLinear), a float output without QuantizeLinear,
// and activation x activation products (the attention's scores), which stay float MatMuls.
//
// fold_qdq_linear (first in the pipeline, with fold_qdq_conv: fold_constants would turn the weights'
// DequantizeLinear into floats) folds the static Q/DQ form of a linear layer whose output stays float
// (a transformer's projections, a classifier's logits) into kiln.QMatMul (src/ops/dyn_quant_matmul.cc):
//
//   MatMul(DequantizeLinear(xq, xs, xz), DequantizeLinear(W, ws, wz)) [+ bias]
//   Gemm(DequantizeLinear(xq, xs, xz), DequantizeLinear(W, ws, wz), DequantizeLinear(b) | bias)
//   -> kiln.QMatMul(X | xq, W [K, N], wz, ws, bias; x_scale xs, x_zero_point xz)
//
// xq uint8 with scalar constant scale and zero point; W a 2-D int8 constant whose scale and zero point
// are constant scalars or per output column (a Gemm's transB weight is transposed to [K, N]); bias a
// float constant [N] (MatMul: the Add reading the product alone; Gemm: C, float or the int32
// DequantizeLinear ONNX Runtime and kiln's calibrator write, evaluated at build time); Gemm alpha =
// beta = 1, transA 0. When xq is a QuantizeLinear's (same parameters) read by this layer alone, the
// layer reads the float X and quantizes it itself (the Q and DQ go); otherwise it reads xq and the
// QuantizeLinear stays, once for all its readers (the Q/K/V projections). A product whose only reader
// is a QuantizeLinear becomes QLinearMatMul first (as fold_qdq_matmul's static form). Exact up to
// float rounding (integer sums where the graph sums floats).
//
// fold_qdq_matmul_epilogue (after fuse_gelu and fuse_activation, before fuse_elementwise): a residual
// Add(y, r) of y's type and then a Relu or GELU (ONNX Gelu or kiln.Gelu, erf or tanh form) reading a
// DynQMatMul's or QMatMul's y alone become its Residual input and activation, in that order (the
// reference's).
#include <optional>

#include "ir/rewrite.h"
#include "ops/interpreter.h"
#include "passes/fusion_util.h"

namespace kiln::passes {

namespace {

using fusion::is_kiln;
using fusion::is_onnx;

bool is_float_constant_vector(const Tensor* t, int64_t n) {
  if (!t || t->dtype() != DataType::kFloat32) return false;
  if (t->numel() == 1) return t->rank() <= 1;
  return t->rank() == 1 && t->numel() == n;
}

bool try_fold(ir::Graph& g, const ir::UseIndex& uses, int mi) {
  auto node = [&](int i) -> const ir::Node& { return g.nodes[static_cast<size_t>(i)]; };
  const ir::Node& mm = node(mi);
  if (!is_onnx(mm, "MatMulInteger") || mm.inputs.size() < 3 || mm.outputs.size() != 1) return false;
  int di = uses.producer(mm.inputs[0]);
  if (di < 0 || !is_onnx(node(di), "DynamicQuantizeLinear")) return false;
  const ir::Node& dq = node(di);
  if (dq.outputs.size() != 3 || dq.outputs[0] != mm.inputs[0] || dq.outputs[2] != mm.inputs[2]) return false;
  const Tensor* b = ir::constant_value(g, mm.inputs[1]);
  if (!b || b->rank() != 2 || (b->dtype() != DataType::kInt8 && b->dtype() != DataType::kUInt8)) return false;
  const int64_t n = b->dim(1);
  std::string bzp = mm.has_input(3) ? mm.inputs[3] : "";
  if (!bzp.empty()) {
    const Tensor* z = ir::constant_value(g, bzp);
    if (!z || z->dtype() != b->dtype() || !(z->numel() == 1 || (z->rank() == 1 && z->numel() == n))) return false;
  }
  // Cast<float> -> Mul(scale)
  int ci = fusion::sole_consumer(uses, mm.outputs[0]);
  if (ci < 0 || !is_onnx(node(ci), "Cast") || node(ci).attr_int("to", 0) != 1) return false;
  const std::string& accf = node(ci).outputs[0];
  int ui = fusion::sole_consumer(uses, accf);
  if (ui < 0 || !is_onnx(node(ui), "Mul")) return false;
  const std::string s = fusion::other_input(node(ui), accf);
  if (s.empty()) return false;
  std::string w_scale;
  if (s == dq.outputs[1]) {
    w_scale = fusion::add_initializer(g, mm.name + "_w_scale", Tensor::scalar<float>(DataType::kFloat32, 1.0f));
  } else {
    int si = uses.producer(s);
    if (si < 0 || !is_onnx(node(si), "Mul")) return false;
    const std::string c = fusion::other_input(node(si), dq.outputs[1]);
    if (c.empty() || !is_float_constant_vector(ir::constant_value(g, c), n)) return false;
    w_scale = c;
  }
  std::set<int> group = {mi, ci, ui};
  std::string out = node(ui).outputs[0];
  std::string bias;
  // + bias
  int ai = fusion::sole_consumer(uses, out);
  if (ai >= 0 && is_onnx(node(ai), "Add")) {
    const std::string c = fusion::other_input(node(ai), out);
    const Tensor* t = c.empty() ? nullptr : ir::constant_value(g, c);
    const ir::TypeInfo* yt = fusion::type_of(g, out);
    bool last_only = t && t->dtype() == DataType::kFloat32 && t->numel() == n && t->rank() >= 1 && yt &&
                     yt->shape.rank_known && static_cast<size_t>(t->rank()) <= yt->shape.rank();
    for (int64_t i = 0; last_only && i + 1 < t->rank(); ++i) last_only = t->dim(i) == 1;
    if (last_only && fusion::same_type(g, node(ai).outputs[0], out)) {
      bias = t->rank() == 1 ? c : fusion::add_initializer(g, c + "_1d", t->reshaped({n}));
      out = node(ai).outputs[0];
      group.insert(ai);
    }
  }
  ir::Node f = fusion::kiln_node("DynQMatMul", mm.name);
  f.inputs = {dq.inputs[0], mm.inputs[1], bzp, w_scale, bias};
  f.outputs = {out};
  fusion::replace_group(g, group, std::move(f));
  return true;
}

bool scalar_const_or_value(const ir::Graph& g, const std::string& v, DataType dt) {
  const ir::TypeInfo* t = fusion::type_of(g, v);
  if (!t || t->elem != dt || !t->shape.rank_known || t->shape.rank() > 1) return false;
  return t->shape.rank() == 0 || (t->shape.dims[0].known() && t->shape.dims[0].value == 1);
}

bool try_fold_static(ir::Graph& g, const ir::UseIndex& uses, int mi) {
  auto node = [&](int i) -> const ir::Node& { return g.nodes[static_cast<size_t>(i)]; };
  const ir::Node& mm = node(mi);
  if (!is_onnx(mm, "MatMul") || mm.inputs.size() != 2 || mm.outputs.size() != 1) return false;
  int ai = uses.producer(mm.inputs[0]), wi = uses.producer(mm.inputs[1]);
  int qi = fusion::sole_consumer(uses, mm.outputs[0]);
  if (ai < 0 || wi < 0 || qi < 0) return false;
  const ir::Node& da = node(ai);
  const ir::Node& dw = node(wi);
  const ir::Node& q = node(qi);
  if (!is_onnx(da, "DequantizeLinear") || !is_onnx(dw, "DequantizeLinear") || !is_onnx(q, "QuantizeLinear"))
    return false;
  if (da.inputs.size() < 2 || dw.inputs.size() < 2 || q.inputs.size() < 2 || q.outputs.size() != 1) return false;
  // x: uint8 with scalar scale and zero point
  const ir::TypeInfo* xt = fusion::type_of(g, da.inputs[0]);
  if (!xt || xt->elem != DataType::kUInt8 || !scalar_const_or_value(g, da.inputs[1], DataType::kFloat32)) return false;
  if (da.has_input(2) && !scalar_const_or_value(g, da.inputs[2], DataType::kUInt8)) return false;
  // W: constant int8 [K, N], scale / zero point per tensor or per column
  const Tensor* w = ir::constant_value(g, dw.inputs[0]);
  if (!w || w->dtype() != DataType::kInt8 || w->rank() != 2) return false;
  const int64_t n = w->dim(1);
  const Tensor* ws = ir::constant_value(g, dw.inputs[1]);
  if (!is_float_constant_vector(ws, n)) return false;
  if (ws->numel() > 1 && dw.attr_int("axis", 1) != 1 && dw.attr_int("axis", 1) != -1) return false;
  if (dw.has_input(2)) {
    const Tensor* z = ir::constant_value(g, dw.inputs[2]);
    if (!z || z->dtype() != DataType::kInt8 || !(z->numel() == 1 || (z->rank() == 1 && z->numel() == n))) return false;
  }
  // y: scalar float scale, uint8 / int8 scalar zero point (QuantizeLinear's output type)
  if (!scalar_const_or_value(g, q.inputs[1], DataType::kFloat32)) return false;
  if (q.has_input(2) && !scalar_const_or_value(g, q.inputs[2], DataType::kUInt8) &&
      !scalar_const_or_value(g, q.inputs[2], DataType::kInt8))
    return false;
  if (q.attr("saturate") || q.attr("output_dtype")) return false;  // opset 19+ float8 forms
  ir::Node f;
  f.name = mm.name;
  f.op_type = "QLinearMatMul";
  f.opset = std::max(10, fusion::onnx_opset(g));
  f.inputs = {da.inputs[0],
              da.inputs[1],
              da.has_input(2) ? da.inputs[2] : "",
              dw.inputs[0],
              dw.inputs[1],
              dw.has_input(2) ? dw.inputs[2] : "",
              q.inputs[1],
              q.has_input(2) ? q.inputs[2] : ""};
  f.outputs = q.outputs;
  fusion::replace_group(g, {mi, qi}, std::move(f));
  return true;
}

// A scalar float32 / 8-bit constant's value.
bool scalar_value(const ir::Graph& g, const std::string& v, double* out) {
  const Tensor* t = v.empty() ? nullptr : ir::constant_value(g, v);
  if (!t || t->numel() != 1 || t->rank() > 1) return false;
  *out = t->get_f64(0);
  return true;
}

// The value a node computes from constants alone (the reference kernel at build time), or empty.
std::optional<Tensor> evaluate(const ir::Graph& g, const ir::Node& n) {
  std::vector<ops::Value> values(n.inputs.size());
  std::vector<const ops::Value*> ins;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    if (n.inputs[k].empty()) {
      ins.push_back(nullptr);
      continue;
    }
    const Tensor* t = ir::constant_value(g, n.inputs[k]);
    if (!t) return std::nullopt;
    values[k] = ops::Value(*t);
    ins.push_back(&values[k]);
  }
  const ops::OpSchema* s = ops::OpRegistry::get().find(n.domain, n.op_type, n.opset);
  if (!s || !s->reference) return std::nullopt;
  auto r = ops::run_node(n, *s, ins, nullptr);
  if (!r.ok() || r.value().empty() || !r.value()[0].is_tensor()) return std::nullopt;
  return r.value()[0].tensor;
}

bool try_fold_linear(ir::Graph& g, const ir::UseIndex& uses, int mi) {
  auto node = [&](int i) -> const ir::Node& { return g.nodes[static_cast<size_t>(i)]; };
  const ir::Node& mm = node(mi);
  const bool gemm = is_onnx(mm, "Gemm");
  if (!(gemm || is_onnx(mm, "MatMul")) || mm.inputs.size() < 2 || mm.outputs.size() != 1) return false;
  if (!gemm && mm.inputs.size() != 2) return false;
  if (gemm && (mm.attr_float("alpha", 1) != 1 || mm.attr_float("beta", 1) != 1 || mm.attr_int("transA", 0) != 0))
    return false;
  const bool trans_b = gemm && mm.attr_int("transB", 0) != 0;
  // A product read only by a QuantizeLinear: QLinearMatMul (try_fold_static) keeps it in 8 bits.
  if (int r = fusion::sole_consumer(uses, mm.outputs[0]); r >= 0 && is_onnx(node(r), "QuantizeLinear")) return false;
  int ai = uses.producer(mm.inputs[0]), wi = uses.producer(mm.inputs[1]);
  if (ai < 0 || wi < 0) return false;
  const ir::Node& da = node(ai);
  const ir::Node& dw = node(wi);
  if (!is_onnx(da, "DequantizeLinear") || !is_onnx(dw, "DequantizeLinear") || da.inputs.size() < 2 ||
      dw.inputs.size() < 2 || da.attr_int("block_size", 0) || dw.attr_int("block_size", 0))
    return false;
  // x: uint8 activation, constant scalar scale and zero point
  const ir::TypeInfo* xt = fusion::type_of(g, da.inputs[0]);
  double xs = 0, xz = 0;
  if (!xt || xt->elem != DataType::kUInt8 || ir::is_constant(g, da.inputs[0]) || !scalar_value(g, da.inputs[1], &xs))
    return false;
  if (da.has_input(2) && !scalar_value(g, da.inputs[2], &xz)) return false;
  const ir::TypeInfo* at = fusion::type_of(g, mm.inputs[0]);
  if (!at || !at->shape.rank_known || at->shape.rank() < 2 || (gemm && at->shape.rank() != 2)) return false;
  if (!(xs > 0) || !std::isfinite(xs) || static_cast<float>(xs) <= 0) return false;
  // W: int8 constant [K, N] ([N, K] under transB), scale and zero point per tensor or per output column
  const Tensor* w = ir::constant_value(g, dw.inputs[0]);
  if (!w || w->dtype() != DataType::kInt8 || w->rank() != 2) return false;
  const int64_t n = trans_b ? w->dim(0) : w->dim(1), k = trans_b ? w->dim(1) : w->dim(0);
  const Tensor* ws = ir::constant_value(g, dw.inputs[1]);
  if (!is_float_constant_vector(ws, n)) return false;
  int64_t axis = dw.attr_int("axis", 1);
  if (axis < 0) axis += 2;
  if (ws->numel() > 1 && axis != (trans_b ? 0 : 1)) return false;
  const Tensor* wz = dw.has_input(2) ? ir::constant_value(g, dw.inputs[2]) : nullptr;
  if (dw.has_input(2) && (!wz || wz->dtype() != DataType::kInt8 || !(wz->numel() == 1 || wz->numel() == n) ||
                          (wz->numel() > 1 && ws->numel() == 1)))
    return false;
  std::set<int> group = {mi};
  std::string out = mm.outputs[0], bias;
  if (gemm && mm.has_input(2)) {
    // C: a float constant [N] ([1, N]) or a constant's DequantizeLinear (evaluated here)
    std::optional<Tensor> c;
    if (const Tensor* t = ir::constant_value(g, mm.inputs[2])) {
      c = *t;
    } else if (int bi = uses.producer(mm.inputs[2]); bi >= 0 && is_onnx(node(bi), "DequantizeLinear")) {
      c = evaluate(g, node(bi));
    }
    if (!c || c->dtype() != DataType::kFloat32 || c->numel() != n || (c->rank() == 2 && c->dim(0) != 1) ||
        c->rank() > 2)
      return false;
    bias = fusion::add_initializer(g, mm.name + "/bias", c->reshaped({n}));
  } else if (!gemm) {
    int bi = fusion::sole_consumer(uses, out);
    if (bi >= 0 && is_onnx(node(bi), "Add") && node(bi).inputs.size() == 2 && node(bi).outputs.size() == 1) {
      const std::string c = fusion::other_input(node(bi), out);
      const Tensor* t = c.empty() ? nullptr : ir::constant_value(g, c);
      bool last_only = t && t->dtype() == DataType::kFloat32 && t->numel() == n && t->rank() >= 1 &&
                       static_cast<size_t>(t->rank()) <= at->shape.rank();
      for (int64_t i = 0; last_only && i + 1 < t->rank(); ++i) last_only = t->dim(i) == 1;
      if (last_only && fusion::same_type(g, node(bi).outputs[0], out)) {
        bias = t->rank() == 1 ? c : fusion::add_initializer(g, c + "_1d", t->reshaped({n}));
        out = node(bi).outputs[0];
        group.insert(bi);
      }
    }
  }
  // W as [K, N] (and its zero point) for the layer
  std::string w_name = dw.inputs[0];
  if (trans_b) {
    Tensor wt(DataType::kInt8, {k, n});
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) wt.data<int8_t>()[c * n + r] = w->data<int8_t>()[r * k + c];
    w_name = fusion::add_initializer(g, mm.name + "/qweights", std::move(wt));
  }
  std::string wz_name = dw.has_input(2) ? dw.inputs[2] : "";
  if (wz && wz->rank() > 1) wz_name = fusion::add_initializer(g, wz_name + "_1d", wz->reshaped({wz->numel()}));
  std::string ws_name = dw.inputs[1];
  if (ws->rank() > 1 || (ws->numel() > 1 && ws->rank() != 1))
    ws_name = fusion::add_initializer(g, ws_name + "_1d", ws->reshaped({ws->numel()}));
  // X: the float value when this layer is the quantizer's only reader
  std::string x = da.inputs[0];
  int qi = uses.producer(x);
  if (qi >= 0 && is_onnx(node(qi), "QuantizeLinear") && node(qi).inputs.size() >= 2 && uses.single_use(x) &&
      fusion::sole_consumer(uses, da.outputs[0]) == mi && node(qi).attr_int("saturate", 1) == 1 &&
      !node(qi).attr("output_dtype") && fusion::is_float_value(g, node(qi).inputs[0])) {
    const ir::Node& q = node(qi);
    double qs = 0, qz = 0;
    if (scalar_value(g, q.inputs[1], &qs) && (!q.has_input(2) || scalar_value(g, q.inputs[2], &qz)) &&
        static_cast<float>(qs) == static_cast<float>(xs) && qz == xz && !q.attr_int("block_size", 0)) {
      x = q.inputs[0];
      group.insert(qi);
      group.insert(ai);
    }
  }
  ir::Node f = fusion::kiln_node("QMatMul", mm.name);
  f.inputs = {x, w_name, wz_name, ws_name, bias};
  f.outputs = {out};
  fusion::set_float(f, "x_scale", static_cast<float>(xs));
  fusion::set_int(f, "x_zero_point", static_cast<int64_t>(xz));
  ir::add_sources(f, dw);
  fusion::replace_group(g, group, std::move(f));
  return true;
}

bool try_epilogue(ir::Graph& g, const ir::UseIndex& uses, int ai) {
  auto node = [&](int i) -> const ir::Node& { return g.nodes[static_cast<size_t>(i)]; };
  const ir::Node& a = node(ai);
  if (a.inputs.empty() || a.outputs.size() != 1) return false;
  auto layer_of = [&](const std::string& y) -> int {
    int p = uses.producer(y);
    if (p < 0 || !(is_kiln(node(p), "DynQMatMul") || is_kiln(node(p), "QMatMul")) || node(p).attr("activation") ||
        !uses.single_use(y) || uses.is_graph_output(y))
      return -1;
    return p;
  };
  if (is_onnx(a, "Add") && a.inputs.size() == 2 && a.inputs[0] != a.inputs[1]) {
    for (size_t k = 0; k < 2; ++k) {
      const std::string& y = a.inputs[k];
      int p = layer_of(y);
      if (p < 0 || node(p).has_input(5) || !fusion::same_type(g, a.outputs[0], y) ||
          !fusion::same_type(g, a.inputs[1 - k], y))
        continue;
      ir::Node f = node(p);
      f.inputs.resize(6);
      f.inputs[5] = a.inputs[1 - k];
      f.outputs = a.outputs;
      fusion::replace_group(g, {p, ai}, std::move(f));
      return true;
    }
    return false;
  }
  if (a.inputs.size() != 1) return false;
  int p = layer_of(a.inputs[0]);
  if (p < 0) return false;
  ir::Node f = node(p);
  if (is_onnx(a, "Relu")) {
    fusion::set_string(f, "activation", "Relu");
  } else if (is_onnx(a, "Gelu") || is_kiln(a, "Gelu")) {
    std::string approx = a.attr_string("approximate", "none");
    if (approx != "none" && approx != "tanh") return false;
    fusion::set_string(f, "activation", "Gelu");
    fusion::set_string(f, "activation_approximate", approx);
  } else {
    return false;
  }
  f.outputs = a.outputs;
  fusion::replace_group(g, {p, ai}, std::move(f));
  return true;
}

}  // namespace

Result<int> fold_qdq_matmul(ir::Graph& g) {
  return fusion::rewrite_until_fixpoint(g, try_fold) + fusion::rewrite_until_fixpoint(g, try_fold_static);
}

Result<int> fold_qdq_linear(ir::Graph& g) {
  int changed = fusion::rewrite_until_fixpoint(g, try_fold_static) + fusion::rewrite_until_fixpoint(g, try_fold_linear);
  if (changed) KILN_RETURN_IF_ERROR(remove_dead_nodes(g).status());
  return changed;
}

Result<int> fold_qdq_matmul_epilogue(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_epilogue); }

}  // namespace kiln::passes
