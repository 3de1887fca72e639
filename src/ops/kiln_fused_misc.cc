// kiln-domain fused ops, continued (see kiln_fused.cc), opset 1:
//
//   Attention(Q, K, V, Mask?)  = Softmax(MatMul(Q, K') * scale + Mask, axis=-1) @ V, where K' is K
//                                with its last two axes swapped, or K itself when the attribute
//                                k_transposed is 1. Attributes: scale (float, default 1),
//                                k_transposed (int, default 0).
//   MultiHeadAttention(Q, K?, V?, Mask?) = merge_heads(Attention(split_heads(Q), split_heads(K),
//                                split_heads(V), Mask)) with the attributes num_heads (int,
//                                required) and scale (float, default 1); split_heads reshapes
//                                [..., S, num_heads * D] to [..., S, num_heads, D] and moves the heads
//                                before S ([..., num_heads, S, D]), merge_heads undoes that. Without
//                                K and V, Q is a packed projection [..., S, 3 * E]: Q, K and V are its
//                                three equal parts along the last axis (in that order). The mask
//                                broadcasts to the scores [..., num_heads, Sq, Sk].
//   FusedElementwise(inputs...) = the subgraph attribute "body" (ONNX elementwise nodes; its
//                                inputs are this node's inputs, its one output this node's output).
#include <deque>
#include <utility>

#include "ops/interpreter.h"
#include "ops/kiln_fused_util.h"
#include "ops/op_traits.h"

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

// The type of Attention(q, k, v, mask) (mask: nullptr when absent).
Result<ir::TypeInfo> infer_attention_types(InferContext& ctx, const ir::TypeInfo& q, const ir::TypeInfo& k,
                                           const ir::TypeInfo& v, const ir::TypeInfo* mask, bool k_transposed) {
  ir::TypeInfo kt = k;
  if (!k_transposed) {
    const SymShape& ks = k.shape;
    if (ks.rank_known && ks.rank() < 2) return ctx.error(str_cat("K must have rank >= 2, got ", ks.str()));
    if (ks.rank_known) {
      KILN_ASSIGN_OR_RETURN(kt, fused::infer_onnx(ctx, "Transpose", 13, {&k}, {},
                                                  {{"perm", fused::ints_attr(swap_last_two(ks.rank()))}}));
    } else {
      kt = ir::TypeInfo::tensor(k.elem);
    }
  }
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo s, fused::infer_onnx(ctx, "MatMul", 13, {&q, &kt}, {}));
  if (mask) {
    KILN_ASSIGN_OR_RETURN(s, fused::infer_onnx(ctx, "Add", 14, {&s, mask}, {}));
  }
  return fused::infer_onnx(ctx, "MatMul", 13, {&s, &v}, {});
}

Status infer_attention(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo y, infer_attention_types(ctx, ctx.input(0), ctx.input(1), ctx.input(2),
                                                              ctx.has_input(3) ? &ctx.input(3) : nullptr,
                                                              ctx.node.attr_int("k_transposed", 0) != 0));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// Attention(q, k, v, mask) on tensors (mask: nullptr when absent).
Result<Tensor> attention_tensors(const KernelContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor* mask, float scale, bool k_transposed) {
  Tensor kt = k;
  if (!k_transposed) {
    if (k.rank() < 2) return ctx.error(str_cat("K must have rank >= 2, got ", k.describe()));
    KILN_ASSIGN_OR_RETURN(kt,
                          fused::run_onnx(ctx, "Transpose", 13, {&k},
                                          {{"perm", fused::ints_attr(swap_last_two(static_cast<size_t>(k.rank())))}}));
  }
  KILN_ASSIGN_OR_RETURN(Tensor s, fused::run_onnx(ctx, "MatMul", 13, {&q, &kt}));
  if (scale != 1.0f) {
    auto c = Tensor::scalar<double>(DataType::kFloat64, scale).cast(s.dtype());
    if (!c.ok()) return ctx.unsupported(c.status().message());
    KILN_ASSIGN_OR_RETURN(s, fused::run_onnx(ctx, "Mul", 14, {&s, &c.value()}));
  }
  if (mask) {
    KILN_ASSIGN_OR_RETURN(s, fused::run_onnx(ctx, "Add", 14, {&s, mask}));
  }
  KILN_ASSIGN_OR_RETURN(Tensor p, fused::run_onnx(ctx, "Softmax", 13, {&s}, {{"axis", fused::int_attr(-1)}}));
  return fused::run_onnx(ctx, "MatMul", 13, {&p, &v});
}

Status attention_kernel(KernelContext& ctx) {
  const ir::Node& n = ctx.node;
  KILN_ASSIGN_OR_RETURN(Tensor y, attention_tensors(ctx, ctx.input(0), ctx.input(1), ctx.input(2),
                                                    ctx.has_input(3) ? &ctx.input(3) : nullptr,
                                                    n.attr_float("scale", 1.0f), n.attr_int("k_transposed", 0) != 0));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---- MultiHeadAttention ----

// [..., S, H*D] -> [..., H, S, D] (Reshape, then Transpose), as types.
Result<ir::TypeInfo> split_heads_type(InferContext& ctx, const ir::TypeInfo& t, int64_t heads, const char* name) {
  const SymShape& s = t.shape;
  if (!s.rank_known) return ir::TypeInfo::tensor(t.elem);
  size_t r = s.rank();
  if (r < 2) return ctx.error(str_cat(name, " must have rank >= 2, got ", s.str()));
  const Dim& e = s.dims.back();
  if (e.known() && e.value % heads != 0)
    return ctx.error(str_cat(name, " ", s.str(), ": the last dim is not a multiple of num_heads ", heads));
  std::vector<Dim> d(s.dims.begin(), s.dims.end() - 2);
  d.push_back(Dim(heads));
  d.push_back(s.dims[r - 2]);
  d.push_back(e.known() ? Dim(e.value / heads) : Dim());
  return ir::TypeInfo::tensor(t.elem, SymShape(d));
}

// The three equal parts of a packed [..., S, 3*E] type.
Result<ir::TypeInfo> packed_part_type(InferContext& ctx, const ir::TypeInfo& t) {
  if (!t.shape.rank_known) return ir::TypeInfo::tensor(t.elem);
  if (t.shape.rank() < 2) return ctx.error(str_cat("packed QKV must have rank >= 2, got ", t.shape.str()));
  const Dim& e = t.shape.dims.back();
  if (e.known() && e.value % 3 != 0) return ctx.error(str_cat("packed QKV ", t.shape.str(), ": last dim not 3 parts"));
  ir::TypeInfo p = t;
  p.shape.dims.back() = e.known() ? Dim(e.value / 3) : Dim();
  return p;
}

Status infer_multi_head_attention(InferContext& ctx) {
  int64_t heads = ctx.node.attr_int("num_heads", 0);
  if (heads < 1) return ctx.error(str_cat("num_heads must be >= 1, got ", heads));
  bool packed = !ctx.has_input(1) && !ctx.has_input(2);
  if (!packed && (!ctx.has_input(1) || !ctx.has_input(2))) return ctx.error("K and V go together (or neither)");
  ir::TypeInfo q = ctx.input(0), k, v;
  if (packed) {
    KILN_ASSIGN_OR_RETURN(q, packed_part_type(ctx, ctx.input(0)));
    k = v = q;
  } else {
    k = ctx.input(1), v = ctx.input(2);
  }
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo qh, split_heads_type(ctx, q, heads, "Q"));
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo kh, split_heads_type(ctx, k, heads, "K"));
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo vh, split_heads_type(ctx, v, heads, "V"));
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo y,
                        infer_attention_types(ctx, qh, kh, vh, ctx.has_input(3) ? &ctx.input(3) : nullptr, false));
  if (y.shape.rank_known && y.shape.rank() >= 3) {  // [..., H, S, Dv] -> [..., S, H*Dv]
    std::vector<Dim> d(y.shape.dims.begin(), y.shape.dims.end() - 3);
    size_t r = y.shape.rank();
    d.push_back(y.shape.dims[r - 2]);
    d.push_back(dim_times(y.shape.dims[r - 1], heads));
    y.shape = SymShape(d);
  } else {
    y.shape = SymShape();
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

Status multi_head_attention_kernel(KernelContext& ctx) {
  const ir::Node& n = ctx.node;
  int64_t heads = n.attr_int("num_heads", 0);
  if (heads < 1) return ctx.error(str_cat("num_heads must be >= 1, got ", heads));
  bool packed = !ctx.has_input(1) && !ctx.has_input(2);
  if (!packed && (!ctx.has_input(1) || !ctx.has_input(2))) return ctx.error("K and V go together (or neither)");
  std::vector<Tensor> qkv;
  if (packed) {
    const Tensor& x = ctx.input(0);
    if (x.rank() < 2 || x.dim(x.rank() - 1) % 3 != 0)
      return ctx.error(str_cat("packed QKV must be [..., S, 3*E], got ", x.describe()));
    int64_t part = x.dim(x.rank() - 1) / 3;
    Tensor sizes = Tensor::from_vector<int64_t>(DataType::kInt64, {3}, {part, part, part});
    const OpSchema* split = OpRegistry::get().find("", "Split", 13);
    if (!split || !split->reference) return Internal(n.where(), "no Split reference kernel");
    Value xv(x), sv(sizes);
    ir::Node sn = fused::synth_node(n, "Split", 13, {true, true}, {{"axis", fused::int_attr(-1)}});
    sn.outputs = {"q", "k", "v"};
    KILN_ASSIGN_OR_RETURN(std::vector<Value> parts, run_node(sn, *split, {&xv, &sv}, ctx.subgraphs));
    for (auto& p : parts) qkv.push_back(std::move(p.tensor));
  } else {
    qkv = {ctx.input(0), ctx.input(1), ctx.input(2)};
  }
  // [..., S, H*D] -> Reshape [..., S, H, D] -> Transpose [..., H, S, D]
  for (Tensor& t : qkv) {
    if (t.rank() < 2 || t.dim(t.rank() - 1) % heads != 0)
      return ctx.error(
          str_cat("Q, K and V must be [..., S, num_heads * D] with num_heads ", heads, ", got ", t.describe()));
    std::vector<int64_t> shape(static_cast<size_t>(t.rank() - 1), 0);
    shape.push_back(heads);
    shape.push_back(-1);
    Tensor st = Tensor::from_vector<int64_t>(DataType::kInt64, {static_cast<int64_t>(shape.size())}, shape);
    KILN_ASSIGN_OR_RETURN(Tensor r, fused::run_onnx(ctx, "Reshape", 14, {&t, &st}));
    std::vector<int64_t> perm(static_cast<size_t>(r.rank()));
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
    std::swap(perm[perm.size() - 3], perm[perm.size() - 2]);
    KILN_ASSIGN_OR_RETURN(t, fused::run_onnx(ctx, "Transpose", 13, {&r}, {{"perm", fused::ints_attr(perm)}}));
  }
  KILN_ASSIGN_OR_RETURN(Tensor y,
                        attention_tensors(ctx, qkv[0], qkv[1], qkv[2], ctx.has_input(3) ? &ctx.input(3) : nullptr,
                                          n.attr_float("scale", 1.0f), false));
  // [..., H, S, Dv] -> Transpose [..., S, H, Dv] -> Reshape [..., S, H*Dv]
  std::vector<int64_t> perm(static_cast<size_t>(y.rank()));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  std::swap(perm[perm.size() - 3], perm[perm.size() - 2]);
  KILN_ASSIGN_OR_RETURN(Tensor t, fused::run_onnx(ctx, "Transpose", 13, {&y}, {{"perm", fused::ints_attr(perm)}}));
  std::vector<int64_t> shape(static_cast<size_t>(t.rank() - 2), 0);
  shape.push_back(-1);
  Tensor st = Tensor::from_vector<int64_t>(DataType::kInt64, {static_cast<int64_t>(shape.size())}, shape);
  KILN_ASSIGN_OR_RETURN(Tensor out, fused::run_onnx(ctx, "Reshape", 14, {&t, &st}));
  ctx.set_output(0, std::move(out));
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
  // The body's input and result lists, kept per nesting depth (a body may hold another fused layer;
  // a deque keeps the outer depths' lists in place) and emptied after each run, so that they hold no
  // buffer between runs: a steady-state run allocates none (tests/noalloc).
  thread_local std::deque<std::pair<std::vector<Value>, std::vector<Value>>> t_lists;
  thread_local size_t t_depth = 0;
  if (t_lists.size() <= t_depth) t_lists.emplace_back();
  std::vector<Value>& in = t_lists[t_depth].first;
  std::vector<Value>& out = t_lists[t_depth].second;
  struct Leave {
    size_t& depth;
    std::vector<Value>& in;
    std::vector<Value>& out;
    ~Leave() {
      for (Value& v : in) clear_value(v);
      for (Value& v : out) clear_value(v);
      --depth;
    }
  } leave{++t_depth, in, out};
  in.resize(ctx.num_inputs());
  for (size_t i = 0; i < ctx.num_inputs(); ++i) in[i] = ctx.input_value(i);  // assigned: shape vectors reused
  KILN_RETURN_IF_ERROR(ctx.subgraphs->run_subgraph_into(*body, in, out));
  if (out.size() != ctx.num_outputs())
    return ctx.error(str_cat("body gave ", out.size(), " outputs, the node has ", ctx.num_outputs()));
  for (size_t i = 0; i < out.size(); ++i) ctx.outputs[i] = out[i];
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("kiln", Attention, 1, infer_attention, attention_kernel, 3, 4);
KILN_REGISTER_OP_ARITY("kiln", MultiHeadAttention, 1, infer_multi_head_attention, multi_head_attention_kernel, 1, 4);
KILN_REGISTER_OP_ARITY("kiln", FusedElementwise, 1, infer_fused_elementwise, fused_elementwise_kernel, 1, -1);

// A tree of elementwise nodes (fuse_elementwise) is elementwise itself; it is never merged again.
KILN_OP_TRAITS("kiln", FusedElementwise, trait::kElementwiseBroadcast | trait::kInPlace);

}  // namespace kiln::ops
