// kiln-domain fused ops, continued (see kiln_fused.cc), opset 1:
//
//   Attention(Q, K, V, Mask?)  = Softmax(MatMul(Q, K') * scale + Mask, axis=-1) @ V, where K' is K
//                                with its last two axes swapped, or K itself when the attribute
//                                k_transposed is 1. Attributes: scale (float, default 1),
//                                k_transposed (int, default 0).
//   FusedElementwise(inputs...) = the subgraph attribute "body" (ONNX elementwise nodes; its
//                                inputs are this node's inputs, its one output this node's output).
#include "ops/kiln_fused_util.h"

namespace kiln::ops {
namespace {

using fused::Attrs;

std::vector<int64_t> swap_last_two(size_t rank) {
  std::vector<int64_t> perm(rank);
  for (size_t i = 0; i < rank; ++i) perm[i] = static_cast<int64_t>(i);
  if (rank >= 2) std::swap(perm[rank - 1], perm[rank - 2]);
  return perm;
}

// ---- Attention ----

Status infer_attention(InferContext& ctx) {
  const ir::Node& n = ctx.node;
  ir::TypeInfo kt = ctx.input(1);
  if (n.attr_int("k_transposed", 0) == 0) {
    const SymShape& ks = ctx.input_shape(1);
    if (ks.rank_known && ks.rank() < 2) return ctx.error(str_cat("K must have rank >= 2, got ", ks.str()));
    if (ks.rank_known) {
      KILN_ASSIGN_OR_RETURN(kt, fused::infer_onnx(ctx, "Transpose", 13, {&ctx.input(1)}, {},
                                                  {{"perm", fused::ints_attr(swap_last_two(ks.rank()))}}));
    } else {
      kt = ir::TypeInfo::tensor(ctx.input_dtype(1));
    }
  }
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo s, fused::infer_onnx(ctx, "MatMul", 13, {&ctx.input(0), &kt}, {}));
  if (ctx.has_input(3)) {
    KILN_ASSIGN_OR_RETURN(s, fused::infer_onnx(ctx, "Add", 14, {&s, &ctx.input(3)}, {}));
  }
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo y, fused::infer_onnx(ctx, "MatMul", 13, {&s, &ctx.input(2)}, {}));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

Status attention_kernel(KernelContext& ctx) {
  const ir::Node& n = ctx.node;
  const Tensor& k = ctx.input(1);
  Tensor kt = k;
  if (n.attr_int("k_transposed", 0) == 0) {
    if (k.rank() < 2) return ctx.error(str_cat("K must have rank >= 2, got ", k.describe()));
    KILN_ASSIGN_OR_RETURN(kt,
                          fused::run_onnx(ctx, "Transpose", 13, {&k},
                                          {{"perm", fused::ints_attr(swap_last_two(static_cast<size_t>(k.rank())))}}));
  }
  KILN_ASSIGN_OR_RETURN(Tensor s, fused::run_onnx(ctx, "MatMul", 13, {&ctx.input(0), &kt}));
  float scale = n.attr_float("scale", 1.0f);
  if (scale != 1.0f) {
    auto c = Tensor::scalar<double>(DataType::kFloat64, scale).cast(s.dtype());
    if (!c.ok()) return ctx.unsupported(c.status().message());
    KILN_ASSIGN_OR_RETURN(s, fused::run_onnx(ctx, "Mul", 14, {&s, &c.value()}));
  }
  if (ctx.has_input(3)) {
    KILN_ASSIGN_OR_RETURN(s, fused::run_onnx(ctx, "Add", 14, {&s, &ctx.input(3)}));
  }
  KILN_ASSIGN_OR_RETURN(Tensor p, fused::run_onnx(ctx, "Softmax", 13, {&s}, {{"axis", fused::int_attr(-1)}}));
  KILN_ASSIGN_OR_RETURN(Tensor y, fused::run_onnx(ctx, "MatMul", 13, {&p, &ctx.input(2)}));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---- FusedElementwise ----

const ir::Graph* body_of(const ir::Node& n) {
  const ir::Attribute* a = n.attr("body");
  return a && a->g ? a->g.get() : nullptr;
}

Status infer_fused_elementwise(InferContext& ctx) {
  const ir::Graph* body = body_of(ctx.node);
  if (!body) return ctx.error("needs a graph attribute 'body'");
  if (body->inputs.size() != ctx.num_inputs() || body->outputs.size() != ctx.outputs.size())
    return ctx.error(str_cat("body takes ", body->inputs.size(), " inputs and gives ", body->outputs.size(),
                             " outputs; the node has ", ctx.num_inputs(), " and ", ctx.outputs.size()));
  if (!ctx.infer_subgraph) return Status::Ok();
  std::vector<ir::TypeInfo> in;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) in.push_back(ctx.has_input(i) ? ctx.input(i) : ir::TypeInfo());
  KILN_ASSIGN_OR_RETURN(std::vector<ir::TypeInfo> out, ctx.infer_subgraph(*body, in));
  for (size_t i = 0; i < out.size(); ++i) ctx.set_output(i, out[i]);
  return Status::Ok();
}

Status fused_elementwise_kernel(KernelContext& ctx) {
  const ir::Graph* body = body_of(ctx.node);
  if (!body) return ctx.error("needs a graph attribute 'body'");
  // Constant folding runs single nodes without a subgraph runner; the engine and interpreter have one.
  if (!ctx.subgraphs) return ctx.unsupported("runs its body through a subgraph runner, and none is set");
  std::vector<Value> in;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) in.push_back(ctx.input_value(i));
  KILN_ASSIGN_OR_RETURN(std::vector<Value> out, ctx.subgraphs->run_subgraph(*body, in));
  if (out.size() != ctx.num_outputs())
    return ctx.error(str_cat("body gave ", out.size(), " outputs, the node has ", ctx.num_outputs()));
  for (size_t i = 0; i < out.size(); ++i) ctx.set_output_value(i, std::move(out[i]));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("kiln", Attention, 1, infer_attention, attention_kernel, 3, 4);
KILN_REGISTER_OP_ARITY("kiln", FusedElementwise, 1, infer_fused_elementwise, fused_elementwise_kernel, 1, -1);

}  // namespace kiln::ops
