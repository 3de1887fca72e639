// kiln-domain fused ops made by the graph passes (src/passes/fuse_*.cc), opset 1:
//
//   FusedConv(X, W, B?, Residual?)    = act(Conv(X, W, B) + Residual)   Conv's attributes
//   FusedGemm(A, B, C?, Residual?)    = act(Gemm(A, B, C) + Residual)   Gemm's attributes
//   FusedMatMul(A, B, Bias?, Residual?) = act(MatMul(A, B) + Bias + Residual)
//   Gelu(X)                           = ONNX Gelu (attribute approximate: "none" | "tanh")
//   LayerNormalization(X, Scale?, B?) = ONNX LayerNormalization (attributes axis, epsilon), Scale
//                                       defaulting to ones
//
// The epilogue activation is named by the string attribute "activation" (absent: none): Relu,
// LeakyRelu (activation_alpha), Sigmoid, Tanh, HardSwish, HardSigmoid (activation_alpha,
// activation_beta), Clip (activation_min / activation_max,
// each optional), SiLU (x * Sigmoid(x)), Gelu (activation_approximate). Every step runs the ONNX
// op's own reference kernel, in the order the unfused graph ran them.
#include "ops/kiln_fused_util.h"
#include "ops/op_traits.h"

namespace kiln::ops {
namespace {

using fused::Attrs;

// The attributes of the wrapped ONNX op: everything but the epilogue and provenance.
Attrs base_attrs(const ir::Node& n) {
  Attrs a;
  for (const auto& [k, v] : n.attrs)
    if (k.rfind("activation", 0) != 0 && k != "kiln.sources") a[k] = v;
  return a;
}

Status check_activation(const ir::Node& n) {
  std::string act = n.attr_string("activation", "");
  static const char* kKnown[] = {"",          "Relu",        "LeakyRelu", "Sigmoid", "Tanh",
                                 "HardSwish", "HardSigmoid", "Clip",      "SiLU",    "Gelu"};
  for (const char* k : kKnown)
    if (act == k) return Status::Ok();
  return InvalidModel(n.where(), "unknown activation '", act, "'");
}

Result<Tensor> apply_activation(const KernelContext& ctx, const Tensor& y) {
  const ir::Node& n = ctx.node;
  std::string act = n.attr_string("activation", "");
  if (act.empty()) return y;
  if (act == "Relu") return fused::run_onnx(ctx, "Relu", 14, {&y});
  if (act == "Sigmoid") return fused::run_onnx(ctx, "Sigmoid", 13, {&y});
  if (act == "Tanh") return fused::run_onnx(ctx, "Tanh", 13, {&y});
  if (act == "HardSwish") return fused::run_onnx(ctx, "HardSwish", 14, {&y});
  if (act == "HardSigmoid")
    return fused::run_onnx(ctx, "HardSigmoid", 6, {&y},
                           {{"alpha", fused::float_attr(n.attr_float("activation_alpha", 0.2f))},
                            {"beta", fused::float_attr(n.attr_float("activation_beta", 0.5f))}});
  if (act == "LeakyRelu")
    return fused::run_onnx(ctx, "LeakyRelu", 16, {&y},
                           {{"alpha", fused::float_attr(n.attr_float("activation_alpha", 0.01f))}});
  if (act == "Gelu")
    return fused::run_onnx(ctx, "Gelu", 20, {&y},
                           {{"approximate", fused::string_attr(n.attr_string("activation_approximate", "none"))}});
  if (act == "SiLU") {
    KILN_ASSIGN_OR_RETURN(Tensor s, fused::run_onnx(ctx, "Sigmoid", 13, {&y}));
    return fused::run_onnx(ctx, "Mul", 14, {&y, &s});
  }
  if (act == "Clip") {
    Tensor lo, hi;
    for (int k = 0; k < 2; ++k) {
      const char* name = k == 0 ? "activation_min" : "activation_max";
      if (!n.attr(name)) continue;
      auto b = Tensor::scalar<double>(DataType::kFloat64, n.attr_float(name, 0)).cast(y.dtype());
      if (!b.ok()) return b.status();
      (k == 0 ? lo : hi) = std::move(b).value();
    }
    return fused::run_onnx(ctx, "Clip", 13, {&y, lo.defined() ? &lo : nullptr, hi.defined() ? &hi : nullptr});
  }
  return ctx.error(str_cat("unknown activation '", act, "'"));
}

// + Residual (input 3), then the activation.
Status finish(KernelContext& ctx, Tensor y) {
  if (ctx.has_input(3)) {
    KILN_ASSIGN_OR_RETURN(y, fused::run_onnx(ctx, "Add", 14, {&y, &ctx.input(3)}));
  }
  KILN_ASSIGN_OR_RETURN(Tensor out, apply_activation(ctx, y));
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

Status infer_finish(InferContext& ctx, ir::TypeInfo y) {
  KILN_RETURN_IF_ERROR(check_activation(ctx.node));
  if (ctx.has_input(3)) {
    KILN_ASSIGN_OR_RETURN(y, fused::infer_onnx(ctx, "Add", 14, {&y, &ctx.input(3)}, {}));
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

const ir::TypeInfo* opt(const InferContext& ctx, size_t i) { return ctx.has_input(i) ? &ctx.input(i) : nullptr; }
const Tensor* opt(const KernelContext& ctx, size_t i) { return ctx.has_input(i) ? &ctx.input(i) : nullptr; }

// ---- FusedConv / FusedGemm: the wrapped op takes inputs 0..2 as they are ----

template <const char* kOp, int kOpset>
Status infer_wrapped(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo y,
                        fused::infer_onnx(ctx, kOp, kOpset, {&ctx.input(0), &ctx.input(1), opt(ctx, 2)},
                                          {ctx.constant(0), ctx.constant(1), ctx.constant(2)}, base_attrs(ctx.node)));
  return infer_finish(ctx, std::move(y));
}

template <const char* kOp, int kOpset>
Status wrapped_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(
      Tensor y, fused::run_onnx(ctx, kOp, kOpset, {&ctx.input(0), &ctx.input(1), opt(ctx, 2)}, base_attrs(ctx.node)));
  return finish(ctx, std::move(y));
}

constexpr char kConv[] = "Conv";
constexpr char kGemm[] = "Gemm";

// ---- FusedMatMul: MatMul, then + Bias ----

Status infer_fused_matmul(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo y, fused::infer_onnx(ctx, "MatMul", 13, {&ctx.input(0), &ctx.input(1)}, {}));
  if (ctx.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(y, fused::infer_onnx(ctx, "Add", 14, {&y, &ctx.input(2)}, {}));
  }
  return infer_finish(ctx, std::move(y));
}

Status fused_matmul_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Tensor y, fused::run_onnx(ctx, "MatMul", 13, {&ctx.input(0), &ctx.input(1)}));
  if (ctx.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(y, fused::run_onnx(ctx, "Add", 14, {&y, &ctx.input(2)}));
  }
  return finish(ctx, std::move(y));
}

// ---- Gelu ----

Status gelu_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Tensor y, fused::run_onnx(ctx, "Gelu", 20, {&ctx.input(0)}, base_attrs(ctx.node)));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---- LayerNormalization (Y only) ----

Status infer_layer_norm(InferContext& ctx) {
  ir::TypeInfo one = ir::TypeInfo::tensor(ctx.input_dtype(0), SymShape(std::vector<Dim>{Dim(1)}));
  const ir::TypeInfo* scale = ctx.has_input(1) ? &ctx.input(1) : &one;
  KILN_ASSIGN_OR_RETURN(
      ir::TypeInfo y,
      fused::infer_onnx(ctx, "LayerNormalization", 17, {&ctx.input(0), scale, opt(ctx, 2)}, {}, base_attrs(ctx.node)));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

Status layer_norm_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor one;
  if (!ctx.has_input(1)) {
    auto t = Tensor::scalar<double>(DataType::kFloat64, 1.0).reshaped({1}).cast(x.dtype());
    if (!t.ok()) return ctx.unsupported(t.status().message());
    one = std::move(t).value();
  }
  KILN_ASSIGN_OR_RETURN(
      Tensor y, fused::run_onnx(ctx, "LayerNormalization", 17,
                                {&x, ctx.has_input(1) ? &ctx.input(1) : &one, opt(ctx, 2)}, base_attrs(ctx.node)));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("kiln", FusedConv, 1, (infer_wrapped<kConv, 11>), (wrapped_kernel<kConv, 11>), 2, 4);
KILN_REGISTER_OP_ARITY("kiln", FusedGemm, 1, (infer_wrapped<kGemm, 13>), (wrapped_kernel<kGemm, 13>), 2, 4);
KILN_REGISTER_OP_ARITY("kiln", FusedMatMul, 1, infer_fused_matmul, fused_matmul_kernel, 2, 4);
KILN_REGISTER_OP_ARITY("kiln", Gelu, 1, infer_same_as_input0, gelu_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("kiln", LayerNormalization, 1, infer_layer_norm, layer_norm_kernel, 1, 3);

// Not kInPlace (the memory planner has never reused its input; ONNX's Gelu is).
KILN_OP_TRAITS_ONEDNN("kiln", Gelu, trait::kElementwiseUnary | trait::kKeepsZero | trait::kEpilogue,
                      "eltwise_gelu_erf");

}  // namespace kiln::ops
