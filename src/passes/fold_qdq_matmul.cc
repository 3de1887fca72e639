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
// fold_qdq_matmul_epilogue (after fuse_gelu and fuse_activation, before fuse_elementwise): a residual
// Add(y, r) of y's type and then a Relu or GELU (ONNX Gelu or kiln.Gelu, erf or tanh form) reading a
// DynQMatMul's y alone become its Residual input and activation, in that order (the reference's).
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

bool try_epilogue(ir::Graph& g, const ir::UseIndex& uses, int ai) {
  auto node = [&](int i) -> const ir::Node& { return g.nodes[static_cast<size_t>(i)]; };
  const ir::Node& a = node(ai);
  if (a.inputs.empty() || a.outputs.size() != 1) return false;
  auto layer_of = [&](const std::string& y) -> int {
    int p = uses.producer(y);
    if (p < 0 || !is_kiln(node(p), "DynQMatMul") || node(p).attr("activation") || !uses.single_use(y) ||
        uses.is_graph_output(y))
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

Result<int> fold_qdq_matmul_epilogue(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_epilogue); }

}  // namespace kiln::passes
