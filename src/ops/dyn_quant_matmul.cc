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
#include "ops/kiln_fused_util.h"
#include "ops/kiln_quantized.h"
#include "ops/quantized_layers.h"

namespace kiln::ops {
namespace {

const ir::TypeInfo* opt(const InferContext& ctx, size_t i) { return ctx.has_input(i) ? &ctx.input(i) : nullptr; }

Status check_attrs(const ir::Node& n) {
  std::string act = n.attr_string("activation", "");
  if (act != "" && act != "Relu" && act != "Gelu")
    return InvalidModel(n.where(), "kiln.DynQMatMul: unknown activation '", act, "' (Relu, Gelu or none)");
  return Status::Ok();
}

Status infer_dyn_q_matmul(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_attrs(ctx.node));
  if (ctx.input_dtype(0) != DataType::kFloat32) return ctx.error("kiln.DynQMatMul: X must be float32");
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
  KILN_ASSIGN_OR_RETURN(std::vector<Value> q, run_all(ctx, "DynamicQuantizeLinear", 11, {&ctx.input(0)}, 3));
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

bool computes_in_int8(const ir::Node& n) {
  if (n.domain.empty()) return n.op_type == "MatMulInteger" || n.op_type == "QLinearMatMul";
  return n.domain == "kiln" && (n.op_type == "DynQMatMul" || is_kiln_quantized_layer(n));
}

}  // namespace kiln::ops
