// kiln.DynQMatMul, opset 1: a linear layer with its activation quantized at run time, the chain that
// ONNX Runtime's quantize_dynamic writes for every MatMul with a constant weight (folded by
// src/passes/fold_qdq_matmul.cc):
//
//   DynQMatMul(X, B, BZeroPoint?, BScale, Bias?, Residual?) =
//       act(Cast<float>(MatMulInteger(q, B, zq, BZeroPoint)) * (sq * BScale) + Bias + Residual)
//   with (q, sq, zq) = DynamicQuantizeLinear(X)
//
// X float32 [..., K]; B int8 or uint8 [K, N]; BZeroPoint B's dtype, a scalar or [N]; BScale float32,
// a scalar or [N] (B's dequantization scale); Bias float32 [N]; Residual the output's shape. The
// epilogue activation is the kiln.Fused* one (attribute "activation"; Relu and Gelu here, the ones
// the pass folds). The reference runs the ONNX ops' own reference kernels in the order the unfused
// graph runs them, so the reference interpreter and `kiln compare` see the graph's exact semantics.
//
// kiln.QMatMul, opset 1: the same layer with a statically quantized activation (a calibrated or Q/DQ
// model's linear layer whose output stays float: folded by fold_qdq_linear, src/passes/fold_qdq_matmul.cc):
//
//   QMatMul(X, B, BZeroPoint?, BScale, Bias?, Residual?) =
//       act(Cast<float>(MatMulInteger(q, B, x_zero_point, BZeroPoint)) * (x_scale * BScale) + Bias + Residual)
//   with q = QuantizeLinear(X, x_scale, x_zero_point) when X is float32, q = X when X is uint8
//
// (attributes x_scale, a float, and x_zero_point, a uint8 value). The Q/DQ graph it replaces,
// MatMul(DequantizeLinear(q), DequantizeLinear(B)) + Bias, sums the products in float where this sums
// them as integers: the results differ by float rounding only.
#include <cmath>

#include "ops/kiln_fused_util.h"
#include "ops/kiln_quantized.h"
#include "ops/quantized_layers.h"

namespace kiln::ops {
namespace {

const ir::TypeInfo* opt(const InferContext& ctx, size_t i) { return ctx.has_input(i) ? &ctx.input(i) : nullptr; }

Status check_attrs(const ir::Node& n) {
  std::string act = n.attr_string("activation", "");
  if (act != "" && act != "Relu" && act != "Gelu")
    return InvalidModel(n.where(), "kiln.", n.op_type, ": unknown activation '", act, "' (Relu, Gelu or none)");
  return Status::Ok();
}

bool is_static(const ir::Node& n) { return n.op_type == "QMatMul"; }

Status infer_dyn_q_matmul(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_attrs(ctx.node));
  if (is_static(ctx.node)) {
    if (ctx.input_dtype(0) != DataType::kFloat32 && ctx.input_dtype(0) != DataType::kUInt8)
      return ctx.error("kiln.QMatMul: X must be float32 or uint8");
    const float s = ctx.node.attr_float("x_scale", 0);
    const int64_t z = ctx.node.attr_int("x_zero_point", 0);
    if (!(s > 0) || !std::isfinite(s) || z < 0 || z > 255)
      return ctx.error("kiln.QMatMul: x_scale must be positive and finite, x_zero_point in [0, 255]");
  } else if (ctx.input_dtype(0) != DataType::kFloat32) {
    return ctx.error("kiln.DynQMatMul: X must be float32");
  }
  // MatMulInteger's output shape, then the float steps (their broadcasting checks the scales and bias).
  ir::TypeInfo q = ir::TypeInfo::tensor(DataType::kUInt8, ctx.input_shape(0));
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo y, fused::infer_onnx(ctx, "MatMulInteger", 10, {&q, &ctx.input(1)}, {}));
  y.elem = DataType::kFloat32;
  KILN_ASSIGN_OR_RETURN(y, fused::infer_onnx(ctx, "Mul", 14, {&y, &ctx.input(3)}, {}));
  if (ctx.has_input(4)) {
    KILN_ASSIGN_OR_RETURN(y, fused::infer_onnx(ctx, "Add", 14, {&y, &ctx.input(4)}, {}));
  }
  if (ctx.has_input(5)) {
    KILN_ASSIGN_OR_RETURN(y, fused::infer_onnx(ctx, "Add", 14, {&y, &ctx.input(5)}, {}));
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// All outputs of ONNX op `op` (run_onnx keeps output 0 only; DynamicQuantizeLinear has three).
Result<std::vector<Value>> run_all(const KernelContext& ctx, const std::string& op, int opset,
                                   const std::vector<const Tensor*>& in, int outputs) {
  const OpSchema* s = OpRegistry::get().find("", op, opset);
  if (!s || !s->reference) return Internal(ctx.node.where(), "no reference kernel for ", op);
  std::vector<bool> present;
  std::vector<Value> vals;
  for (const Tensor* t : in) {
    present.push_back(t != nullptr);
    vals.push_back(t ? Value(*t) : Value());
  }
  std::vector<const Value*> ptrs;
  for (size_t i = 0; i < in.size(); ++i) ptrs.push_back(in[i] ? &vals[i] : nullptr);
  ir::Node n = fused::synth_node(ctx.node, op, opset, present, {});
  n.outputs.clear();
  for (int i = 0; i < outputs; ++i) n.outputs.push_back("out" + std::to_string(i));
  return run_node(n, *s, ptrs, ctx.subgraphs);
}

Status dyn_q_matmul_kernel(KernelContext& ctx) {
  KILN_RETURN_IF_ERROR(check_attrs(ctx.node));
  auto opt_in = [&](size_t i) { return ctx.has_input(i) ? &ctx.input(i) : nullptr; };
  std::vector<Value> q;
  if (is_static(ctx.node)) {
    // q, x_scale, x_zero_point as DynamicQuantizeLinear's three outputs.
    Tensor s = Tensor::scalar<float>(DataType::kFloat32, ctx.node.attr_float("x_scale", 1));
    Tensor z = Tensor::scalar<uint8_t>(DataType::kUInt8, static_cast<uint8_t>(ctx.node.attr_int("x_zero_point", 0)));
    if (ctx.input(0).dtype() == DataType::kUInt8) {
      q.emplace_back(ctx.input(0));
    } else {
      KILN_ASSIGN_OR_RETURN(Tensor x, fused::run_onnx(ctx, "QuantizeLinear", 13, {&ctx.input(0), &s, &z}));
      q.emplace_back(std::move(x));
    }
    q.emplace_back(std::move(s));
    q.emplace_back(std::move(z));
  } else {
    KILN_ASSIGN_OR_RETURN(q, run_all(ctx, "DynamicQuantizeLinear", 11, {&ctx.input(0)}, 3));
  }
  if (q.size() != 3) return Internal(ctx.node.where(), "DynamicQuantizeLinear made ", q.size(), " outputs");
  KILN_ASSIGN_OR_RETURN(
      Tensor acc, fused::run_onnx(ctx, "MatMulInteger", 10, {&q[0].tensor, &ctx.input(1), &q[2].tensor, opt_in(2)}));
  KILN_ASSIGN_OR_RETURN(Tensor accf, fused::run_onnx(ctx, "Cast", 13, {&acc}, {{"to", fused::int_attr(1)}}));
  KILN_ASSIGN_OR_RETURN(Tensor scale, fused::run_onnx(ctx, "Mul", 14, {&q[1].tensor, &ctx.input(3)}));
  KILN_ASSIGN_OR_RETURN(Tensor y, fused::run_onnx(ctx, "Mul", 14, {&accf, &scale}));
  if (ctx.has_input(4)) {
    KILN_ASSIGN_OR_RETURN(y, fused::run_onnx(ctx, "Add", 14, {&y, &ctx.input(4)}));
  }
  if (ctx.has_input(5)) {
    KILN_ASSIGN_OR_RETURN(y, fused::run_onnx(ctx, "Add", 14, {&y, &ctx.input(5)}));
  }
  std::string act = ctx.node.attr_string("activation", "");
  if (act == "Relu") {
    KILN_ASSIGN_OR_RETURN(y, fused::run_onnx(ctx, "Relu", 14, {&y}));
  } else if (act == "Gelu") {
    KILN_ASSIGN_OR_RETURN(
        y,
        fused::run_onnx(ctx, "Gelu", 20, {&y},
                        {{"approximate", fused::string_attr(ctx.node.attr_string("activation_approximate", "none"))}}));
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("kiln", DynQMatMul, 1, infer_dyn_q_matmul, dyn_q_matmul_kernel, 4, 6);
KILN_REGISTER_OP_ARITY("kiln", QMatMul, 1, infer_dyn_q_matmul, dyn_q_matmul_kernel, 4, 6);

bool computes_in_int8(const ir::Node& n) {
  if (n.domain.empty()) return n.op_type == "MatMulInteger" || n.op_type == "QLinearMatMul";
  return n.domain == "kiln" && (n.op_type == "DynQMatMul" || n.op_type == "QMatMul" || is_kiln_quantized_layer(n));
}

}  // namespace kiln::ops
