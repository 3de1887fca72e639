// kiln-domain layout ops, opset 1, made by the layout pass (src/passes/layout_blocked.cc). The
// blocked layout is described in kiln_layout.h: [N, C, H, W] stored as [N, ceil(C/B), H, W, B].
//
//   ReorderToBlocked(X)                attribute block                     [N,C,H,W] -> blocked
//   ReorderFromBlocked(Y)              attributes block, channels          blocked -> [N,channels,H,W]
//   BlockedConv(X, W, B?, Residual?)   kiln.FusedConv's attributes + block: X blocked, or plain 4-D
//                                      NCHW (a network's first conv: 3 channels are not padded to
//                                      16); W, B as FusedConv's; Residual and the output blocked
//   BlockedPool(X)                     attributes pool (MaxPool, AveragePool, GlobalAveragePool,
//                                      GlobalMaxPool), pool_opset, block and the pool's own
//                                      attributes; X and the output blocked
//   BlockedConvDw(X, W, B?, Wdw, Bdw?) a BlockedConv (X, W, B; its attributes) whose output goes
//                                      straight into a depthwise BlockedConv (Wdw, Bdw; its attributes
//                                      prefixed "dw.", e.g. dw.strides, dw.activation); output blocked.
//                                      The intermediate never exists as a tensor (kernels fuse it).
//   BlockedConcatElementwise(X1..Xk, C1..Cm)  attributes block, pieces (= k) and body (as
//                                      kiln.FusedElementwise's, over 1 + m inputs): that
//                                      FusedElementwise of (Concat of the blocked X1..Xk along the
//                                      channel blocks, C1..Cm). DenseNet's Concat -> BN -> ReLU: the
//                                      concatenation never exists as a tensor.
//   NhwcConv(X, W, B?, Residual?)      kiln.FusedConv's attributes: X, Residual and the output
//                                      channels-last [N, H, W, C] (kiln_layout.h); W, B as FusedConv's
//                                      ([M, C/group, kH, kW]: the CUDA tactic reorders it at prepare)
//   NhwcPool(X)                        attributes pool, pool_opset and the pool's own (as BlockedPool);
//                                      X and the output channels-last
//
// Each reference kernel unblocks, runs the plain op's own reference kernel and blocks again, so
// the blocked graph computes what the plain one did by construction. The padding lanes of every
// blocked output are zero: a pool over them (zeros in, zeros out) may run on all Cb * B channels.
#include "ops/kiln_layout.h"

#include <cstring>

#include "ops/kiln_fused_util.h"

namespace kiln::ops {

namespace {

Status check_layout_dtype(const Tensor& t) {
  if (t.dtype() == DataType::kString || dtype_size(t.dtype()) == 0)
    return Unsupported("a ", dtype_name(t.dtype()), " tensor has no blocked layout");
  return Status::Ok();
}

}  // namespace

Result<Tensor> to_channel_blocked(const Tensor& x, int64_t block) {
  if (block <= 0) return InvalidArgument("the block size must be positive, got ", block);
  if (x.rank() != 4) return InvalidArgument("expected a 4-D [N,C,H,W] tensor, got ", x.describe());
  KILN_RETURN_IF_ERROR(check_layout_dtype(x));
  const int64_t n = x.dim(0), c = x.dim(1), hw = x.dim(2) * x.dim(3), cb = (c + block - 1) / block;
  Tensor y(x.dtype(), {n, cb, x.dim(2), x.dim(3), block});  // zero-filled: the padding lanes
  const size_t es = dtype_size(x.dtype());
  const auto* src = static_cast<const uint8_t*>(x.raw());
  auto* dst = static_cast<uint8_t*>(y.raw());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p)
        std::memcpy(dst + static_cast<size_t>(((i * cb + ch / block) * hw + p) * block + ch % block) * es,
                    src + static_cast<size_t>((i * c + ch) * hw + p) * es, es);
  return y;
}

Result<Tensor> from_channel_blocked(const Tensor& y, int64_t channels) {
  if (y.rank() != 5) return InvalidArgument("expected a 5-D blocked [N,Cb,H,W,B] tensor, got ", y.describe());
  KILN_RETURN_IF_ERROR(check_layout_dtype(y));
  const int64_t n = y.dim(0), cb = y.dim(1), block = y.dim(4), hw = y.dim(2) * y.dim(3);
  if (channels < 0 || channels > cb * block)
    return InvalidArgument("channels ", channels, " do not fit the blocked tensor ", y.describe());
  Tensor x(y.dtype(), {n, channels, y.dim(2), y.dim(3)});
  const size_t es = dtype_size(y.dtype());
  const auto* src = static_cast<const uint8_t*>(y.raw());
  auto* dst = static_cast<uint8_t*>(x.raw());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < channels; ++ch)
      for (int64_t p = 0; p < hw; ++p)
        std::memcpy(dst + static_cast<size_t>((i * channels + ch) * hw + p) * es,
                    src + static_cast<size_t>(((i * cb + ch / block) * hw + p) * block + ch % block) * es, es);
  return x;
}

// [N, A, B, C] -> [N, C, A, B] (to_last false) or [N, B, C, A] (to_last true) as byte copies.
static Result<Tensor> rotate_channels(const Tensor& x, bool to_last) {
  if (x.rank() != 4) return InvalidArgument("expected a 4-D tensor, got ", x.describe());
  KILN_RETURN_IF_ERROR(check_layout_dtype(x));
  // to_last: x is [N, C, H, W]; else x is [N, H, W, C].
  const int64_t n = x.dim(0), c = to_last ? x.dim(1) : x.dim(3), h = to_last ? x.dim(2) : x.dim(1),
                w = to_last ? x.dim(3) : x.dim(2), hw = h * w;
  Tensor y(x.dtype(), to_last ? Dims{n, h, w, c} : Dims{n, c, h, w});
  const size_t es = dtype_size(x.dtype());
  const auto* src = static_cast<const uint8_t*>(x.raw());
  auto* dst = static_cast<uint8_t*>(y.raw());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p) {
        const size_t planar = static_cast<size_t>((i * c + ch) * hw + p),
                     last = static_cast<size_t>((i * hw + p) * c + ch);
        std::memcpy(dst + (to_last ? last : planar) * es, src + (to_last ? planar : last) * es, es);
      }
  return y;
}

Result<Tensor> nchw_to_nhwc(const Tensor& x) { return rotate_channels(x, true); }
Result<Tensor> nhwc_to_nchw(const Tensor& y) { return rotate_channels(y, false); }

namespace {

using fused::Attrs;

int64_t block_of(const ir::Node& n) { return n.attr_int("block", 0); }

Dim blocks_of(const Dim& c, int64_t block) {
  return c.known() && block > 0 ? Dim((c.value + block - 1) / block) : Dim();
}

// [N, C, H, W] -> [N, ceil(C/B), H, W, B] on a symbolic shape (C unknown: a fresh symbol).
SymShape blocked_shape(InferContext& ctx, const SymShape& s, int64_t block) {
  if (!s.rank_known || s.rank() != 4) return SymShape();
  Dim cb = blocks_of(s.dims[1], block);
  if (!cb.known()) cb = ctx.new_symbol();
  return SymShape(std::vector<Dim>{s.dims[0], cb, s.dims[2], s.dims[3], Dim(block)});
}

// The node's attributes less those named in `drop` and kiln's annotations ("kiln.*": provenance,
// the plain value a blocked node stands for).
Attrs attrs_without(const ir::Node& n, std::initializer_list<const char*> drop) {
  Attrs a;
  for (const auto& [k, v] : n.attrs) {
    bool skip = k.rfind("kiln.", 0) == 0;
    for (const char* d : drop) skip |= k == d;
    if (!skip) a[k] = v;
  }
  return a;
}

// The schema of op (domain, op) at `opset`, for running or inferring it in place of a blocked node.
Result<const OpSchema*> schema_of(const ir::Node& owner, const std::string& domain, const std::string& op, int opset) {
  const OpSchema* s = OpRegistry::get().find(domain, op, opset);
  if (!s || !s->reference) return Unsupported(owner.where(), "no reference kernel for ", op, " at opset ", opset);
  return s;
}

Result<Tensor> run_op(const KernelContext& ctx, const OpSchema& s, int opset, const std::vector<const Tensor*>& in,
                      Attrs attrs) {
  std::vector<bool> present;
  std::vector<Value> vals;
  vals.reserve(in.size());
  for (const Tensor* t : in) {
    present.push_back(t != nullptr);
    vals.push_back(t ? Value(*t) : Value());
  }
  std::vector<const Value*> ptrs;
  for (size_t i = 0; i < in.size(); ++i) ptrs.push_back(in[i] ? &vals[i] : nullptr);
  ir::Node n = fused::synth_node(ctx.node, s.op_type, opset, present, std::move(attrs));
  n.domain = s.domain;
  KILN_ASSIGN_OR_RETURN(std::vector<Value> out, run_node(n, s, ptrs, ctx.subgraphs));
  if (out.empty() || !out[0].is_tensor()) return Internal(ctx.node.where(), s.op_type, " produced no tensor");
  return std::move(out[0].tensor);
}

Result<ir::TypeInfo> infer_op(InferContext& ctx, const OpSchema& s, int opset,
                              const std::vector<const ir::TypeInfo*>& in, const std::vector<const Tensor*>& constants,
                              Attrs attrs) {
  std::vector<bool> present;
  for (const auto* t : in) present.push_back(t != nullptr);
  ir::Node n = fused::synth_node(ctx.node, s.op_type, opset, present, std::move(attrs));
  n.domain = s.domain;
  return fused::infer_as(ctx, s, n, in, constants);
}

Status check_block(const InferContext& ctx) {
  int64_t b = block_of(ctx.node);
  if (b <= 0) return ctx.error(str_cat("attribute 'block' must be a positive int, got ", b));
  return Status::Ok();
}

// A 5-D blocked type whose block and (when known) channel blocks match; `what` names the input.
Status check_blocked_input(const InferContext& ctx, size_t i, int64_t channels, const char* what) {
  const SymShape& s = ctx.input_shape(i);
  if (!s.rank_known) return Status::Ok();
  int64_t b = block_of(ctx.node);
  if (s.rank() != 5) return ctx.error(str_cat(what, " must be 5-D blocked [N,Cb,H,W,", b, "], got ", s.str()));
  if (s.dims[4].known() && s.dims[4].value != b)
    return ctx.error(str_cat(what, " has blocks of ", s.dims[4].value, " channels, the node's block is ", b));
  if (channels >= 0 && s.dims[1].known() && s.dims[1].value != (channels + b - 1) / b)
    return ctx.error(str_cat(what, " ", s.str(), " does not hold ", channels, " channels in blocks of ", b));
  return Status::Ok();
}

// ---- ReorderToBlocked / ReorderFromBlocked ----

Status infer_to_blocked(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_block(ctx));
  const SymShape& s = ctx.input_shape(0);
  if (s.rank_known && s.rank() != 4) return ctx.error(str_cat("X must be 4-D [N,C,H,W], got ", s.str()));
  ctx.set_output(0, ctx.input_dtype(0), blocked_shape(ctx, s, block_of(ctx.node)));
  return Status::Ok();
}

Status to_blocked_kernel(KernelContext& ctx) {
  auto y = to_channel_blocked(ctx.input(0), block_of(ctx.node));
  if (!y.ok()) return ctx.error(y.status().message());
  ctx.set_output(0, std::move(y).value());
  return Status::Ok();
}

Status infer_from_blocked(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_block(ctx));
  int64_t channels = ctx.node.attr_int("channels", -1);
  if (channels < 0) return ctx.error("attribute 'channels' must be a non-negative int");
  KILN_RETURN_IF_ERROR(check_blocked_input(ctx, 0, channels, "Y"));
  const SymShape& s = ctx.input_shape(0);
  SymShape out;
  if (s.rank_known) out = SymShape(std::vector<Dim>{s.dims[0], Dim(channels), s.dims[2], s.dims[3]});
  ctx.set_output(0, ctx.input_dtype(0), out);
  return Status::Ok();
}

Status from_blocked_kernel(KernelContext& ctx) {
  const Tensor& y = ctx.input(0);
  int64_t b = block_of(ctx.node), channels = ctx.node.attr_int("channels", -1);
  if (y.rank() != 5 || y.dim(4) != b || channels < 0 || y.dim(1) != (channels + b - 1) / b)
    return ctx.error(str_cat("Y ", y.describe(), " is not ", channels, " channels in blocks of ", b));
  auto x = from_channel_blocked(y, channels);
  if (!x.ok()) return ctx.error(x.status().message());
  ctx.set_output(0, std::move(x).value());
  return Status::Ok();
}

// ---- BlockedConv ----

// The input channels from W ([M, C/group, kH, kW]) and the group, or -1 when unknown.
int64_t conv_in_channels(const ir::Node& n, const SymShape& w) {
  if (!w.rank_known || w.rank() != 4 || !w.dims[1].known()) return -1;
  return w.dims[1].value * n.attr_int("group", 1);
}

Status infer_blocked_conv(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_block(ctx));
  const int64_t b = block_of(ctx.node);
  const int64_t c = conv_in_channels(ctx.node, ctx.input_shape(1));
  ir::TypeInfo x = ctx.input(0);
  const SymShape& xs = ctx.input_shape(0);
  if (xs.rank_known && xs.rank() == 5) {
    KILN_RETURN_IF_ERROR(check_blocked_input(ctx, 0, c, "X"));
    x.shape = SymShape(std::vector<Dim>{xs.dims[0], c >= 0 ? Dim(c) : Dim(), xs.dims[2], xs.dims[3]});
  } else if (xs.rank_known && xs.rank() != 4) {
    return ctx.error(str_cat("X must be blocked 5-D or plain 4-D NCHW, got ", xs.str()));
  }
  KILN_ASSIGN_OR_RETURN(const OpSchema* fc, schema_of(ctx.node, "kiln", "FusedConv", 1));
  const ir::TypeInfo* bias = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo y,
                        infer_op(ctx, *fc, 1, {&x, &ctx.input(1), bias}, {nullptr, ctx.constant(1), ctx.constant(2)},
                                 attrs_without(ctx.node, {"block"})));
  y.shape = blocked_shape(ctx, y.shape, b);
  if (ctx.has_input(3)) {
    const SymShape& r = ctx.input_shape(3);
    if (r.rank_known && y.shape.rank_known) {
      if (r.rank() != 5) return ctx.error(str_cat("Residual must be blocked like the output, got ", r.str()));
      for (size_t d = 0; d < 5; ++d)
        if (r.dims[d].known() && y.shape.dims[d].known() && r.dims[d].value != y.shape.dims[d].value)
          return ctx.error(str_cat("Residual ", r.str(), " is not the output's blocked shape ", y.shape.str()));
    }
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

Status blocked_conv_kernel(KernelContext& ctx) {
  const int64_t b = block_of(ctx.node);
  const Tensor& w = ctx.input(1);
  if (b <= 0 || w.rank() != 4) return ctx.error(str_cat("needs block > 0 and a 4-D W, got W ", w.describe()));
  const int64_t c = w.dim(1) * ctx.node.attr_int("group", 1), m = w.dim(0);
  Tensor x = ctx.input(0);
  if (x.rank() == 5) {
    if (x.dim(4) != b || x.dim(1) != (c + b - 1) / b)
      return ctx.error(str_cat("X ", x.describe(), " is not ", c, " channels in blocks of ", b));
    auto plain = from_channel_blocked(x, c);
    if (!plain.ok()) return ctx.error(plain.status().message());
    x = std::move(plain).value();
  }
  Tensor residual;
  if (ctx.has_input(3)) {
    const Tensor& r = ctx.input(3);
    if (r.rank() != 5 || r.dim(4) != b || r.dim(1) != (m + b - 1) / b)
      return ctx.error(str_cat("Residual ", r.describe(), " is not ", m, " channels in blocks of ", b));
    auto plain = from_channel_blocked(r, m);
    if (!plain.ok()) return ctx.error(plain.status().message());
    residual = std::move(plain).value();
  }
  KILN_ASSIGN_OR_RETURN(const OpSchema* fc, schema_of(ctx.node, "kiln", "FusedConv", 1));
  KILN_ASSIGN_OR_RETURN(
      Tensor y, run_op(ctx, *fc, 1,
                       {&x, &w, ctx.has_input(2) ? &ctx.input(2) : nullptr, residual.defined() ? &residual : nullptr},
                       attrs_without(ctx.node, {"block"})));
  auto yb = to_channel_blocked(y, b);
  if (!yb.ok()) return ctx.error(yb.status().message());
  ctx.set_output(0, std::move(yb).value());
  return Status::Ok();
}

// ---- BlockedPool ----

bool known_pool(const std::string& op) {
  return op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" || op == "GlobalMaxPool";
}

Attrs pool_attrs(const ir::Node& n) { return attrs_without(n, {"block", "pool", "pool_opset"}); }

Status infer_blocked_pool(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_block(ctx));
  std::string op = ctx.node.attr_string("pool", "");
  if (!known_pool(op)) return ctx.error(str_cat("unknown pool '", op, "'"));
  KILN_RETURN_IF_ERROR(check_blocked_input(ctx, 0, -1, "X"));
  const int64_t b = block_of(ctx.node);
  const SymShape& xs = ctx.input_shape(0);
  ir::TypeInfo x = ctx.input(0);
  if (xs.rank_known) x.shape = SymShape(std::vector<Dim>{xs.dims[0], dim_times(xs.dims[1], b), xs.dims[2], xs.dims[3]});
  KILN_ASSIGN_OR_RETURN(const OpSchema* s,
                        schema_of(ctx.node, "", op, static_cast<int>(ctx.node.attr_int("pool_opset", 12))));
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo y, infer_op(ctx, *s, static_cast<int>(ctx.node.attr_int("pool_opset", 12)), {&x},
                                                 {nullptr}, pool_attrs(ctx.node)));
  y.shape = blocked_shape(ctx, y.shape, b);
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

Status blocked_pool_kernel(KernelContext& ctx) {
  const int64_t b = block_of(ctx.node);
  std::string op = ctx.node.attr_string("pool", "");
  const Tensor& x = ctx.input(0);
  if (!known_pool(op)) return ctx.error(str_cat("unknown pool '", op, "'"));
  if (x.rank() != 5 || x.dim(4) != b) return ctx.error(str_cat("X ", x.describe(), " is not blocked by ", b));
  auto plain = from_channel_blocked(x, x.dim(1) * b);  // the zero padding lanes too
  if (!plain.ok()) return ctx.error(plain.status().message());
  int opset = static_cast<int>(ctx.node.attr_int("pool_opset", 12));
  KILN_ASSIGN_OR_RETURN(const OpSchema* s, schema_of(ctx.node, "", op, opset));
  KILN_ASSIGN_OR_RETURN(Tensor y, run_op(ctx, *s, opset, {&plain.value()}, pool_attrs(ctx.node)));
  auto yb = to_channel_blocked(y, b);
  if (!yb.ok()) return ctx.error(yb.status().message());
  ctx.set_output(0, std::move(yb).value());
  return Status::Ok();
}

// ---- BlockedConvDw ----

// The two BlockedConv nodes it chains: the first keeps the unprefixed attributes, the second takes
// the "dw." ones (and the block).
ir::Node first_conv_of(const ir::Node& n) {
  ir::Node a = n;
  a.op_type = "BlockedConv";
  a.inputs = {n.inputs[0], n.inputs[1], n.inputs.size() > 2 ? n.inputs[2] : ""};
  a.attrs.clear();
  for (const auto& [k, v] : n.attrs)
    if (k.rfind("dw.", 0) != 0 && k.rfind("kiln.", 0) != 0) a.attrs[k] = v;
  return a;
}
ir::Node dw_conv_of(const ir::Node& n) {
  ir::Node b = n;
  b.op_type = "BlockedConv";
  b.inputs = {"mid", n.inputs.size() > 3 ? n.inputs[3] : "", n.inputs.size() > 4 ? n.inputs[4] : ""};
  b.attrs.clear();
  for (const auto& [k, v] : n.attrs)
    if (k.rfind("dw.", 0) == 0) b.attrs[k.substr(3)] = v;
  if (const ir::Attribute* blk = n.attr("block")) b.attrs["block"] = *blk;
  return b;
}

Result<ir::TypeInfo> infer_node(InferContext& ctx, const ir::Node& node, const std::vector<const ir::TypeInfo*>& in,
                                const std::vector<const Tensor*>& constants) {
  KILN_ASSIGN_OR_RETURN(const OpSchema* s, schema_of(ctx.node, "kiln", "BlockedConv", 1));
  return fused::infer_as(ctx, *s, node, in, constants);
}

Status infer_blocked_conv_dw(InferContext& ctx) {
  if (!ctx.has_input(3)) return ctx.error("needs the depthwise weights (input 3)");
  const ir::TypeInfo* b = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo mid, infer_node(ctx, first_conv_of(ctx.node), {&ctx.input(0), &ctx.input(1), b},
                                                     {nullptr, ctx.constant(1), ctx.constant(2)}));
  const ir::TypeInfo* bdw = ctx.has_input(4) ? &ctx.input(4) : nullptr;
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo y, infer_node(ctx, dw_conv_of(ctx.node), {&mid, &ctx.input(3), bdw},
                                                   {nullptr, ctx.constant(3), ctx.constant(4)}));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

Status blocked_conv_dw_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const OpSchema* s, schema_of(ctx.node, "kiln", "BlockedConv", 1));
  auto run = [&](const ir::Node& node, const std::vector<const Tensor*>& in) -> Result<Tensor> {
    std::vector<Value> vals;
    vals.reserve(in.size());
    std::vector<const Value*> ptrs;
    for (const Tensor* t : in) vals.push_back(t ? Value(*t) : Value());
    for (size_t i = 0; i < in.size(); ++i) ptrs.push_back(in[i] ? &vals[i] : nullptr);
    KILN_ASSIGN_OR_RETURN(std::vector<Value> out, run_node(node, *s, ptrs, ctx.subgraphs));
    if (out.empty() || !out[0].is_tensor()) return Internal(ctx.node.where(), "BlockedConv produced no tensor");
    return std::move(out[0].tensor);
  };
  KILN_ASSIGN_OR_RETURN(Tensor mid, run(first_conv_of(ctx.node),
                                        {&ctx.input(0), &ctx.input(1), ctx.has_input(2) ? &ctx.input(2) : nullptr}));
  KILN_ASSIGN_OR_RETURN(Tensor y,
                        run(dw_conv_of(ctx.node), {&mid, &ctx.input(3), ctx.has_input(4) ? &ctx.input(4) : nullptr}));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---- BlockedConcatElementwise ----

Result<int64_t> pieces_of(const ir::Node& n, size_t inputs) {
  const int64_t k = n.attr_int("pieces", 0);
  if (k < 1 || static_cast<size_t>(k) > inputs)
    return InvalidArgument(n.where(), "attribute 'pieces' must be in [1, ", inputs, "] (the inputs), got ", k);
  return k;
}

Status infer_blocked_concat_elementwise(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_block(ctx));
  KILN_ASSIGN_OR_RETURN(int64_t k, pieces_of(ctx.node, ctx.num_inputs()));
  std::vector<const ir::TypeInfo*> pieces;
  for (int64_t i = 0; i < k; ++i) {
    KILN_RETURN_IF_ERROR(check_blocked_input(ctx, static_cast<size_t>(i), -1, "a concatenated input"));
    pieces.push_back(&ctx.input(static_cast<size_t>(i)));
  }
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo cat,
                        fused::infer_onnx(ctx, "Concat", 13, pieces, {}, {{"axis", fused::int_attr(1)}}));
  KILN_ASSIGN_OR_RETURN(const OpSchema* fe, schema_of(ctx.node, "kiln", "FusedElementwise", 1));
  std::vector<const ir::TypeInfo*> in = {&cat};
  std::vector<const Tensor*> constants = {nullptr};
  for (size_t i = static_cast<size_t>(k); i < ctx.num_inputs(); ++i) {
    in.push_back(ctx.has_input(i) ? &ctx.input(i) : nullptr);
    constants.push_back(ctx.constant(i));
  }
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo y,
                        infer_op(ctx, *fe, 1, in, constants, attrs_without(ctx.node, {"block", "pieces"})));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

Status blocked_concat_elementwise_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t k, pieces_of(ctx.node, ctx.num_inputs()));
  std::vector<const Tensor*> pieces;
  for (int64_t i = 0; i < k; ++i) pieces.push_back(&ctx.input(static_cast<size_t>(i)));
  KILN_ASSIGN_OR_RETURN(Tensor cat, fused::run_onnx(ctx, "Concat", 13, pieces, {{"axis", fused::int_attr(1)}}));
  KILN_ASSIGN_OR_RETURN(const OpSchema* fe, schema_of(ctx.node, "kiln", "FusedElementwise", 1));
  std::vector<const Tensor*> in = {&cat};
  for (size_t i = static_cast<size_t>(k); i < ctx.num_inputs(); ++i)
    in.push_back(ctx.has_input(i) ? &ctx.input(i) : nullptr);
  KILN_ASSIGN_OR_RETURN(Tensor y, run_op(ctx, *fe, 1, in, attrs_without(ctx.node, {"block", "pieces"})));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---- NhwcConv / NhwcPool ----

SymShape nhwc_of(const SymShape& s) {
  if (!s.rank_known || s.rank() != 4) return SymShape();
  return SymShape(std::vector<Dim>{s.dims[0], s.dims[2], s.dims[3], s.dims[1]});
}
SymShape nchw_of(const SymShape& s) {
  if (!s.rank_known || s.rank() != 4) return SymShape();
  return SymShape(std::vector<Dim>{s.dims[0], s.dims[3], s.dims[1], s.dims[2]});
}

Status check_nhwc_input(const InferContext& ctx, size_t i, const char* what) {
  const SymShape& s = ctx.input_shape(i);
  if (s.rank_known && s.rank() != 4)
    return ctx.error(str_cat(what, " must be 4-D channels-last [N,H,W,C], got ", s.str()));
  return Status::Ok();
}

Status infer_nhwc_conv(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_nhwc_input(ctx, 0, "X"));
  ir::TypeInfo x = ctx.input(0);
  x.shape = nchw_of(x.shape);
  KILN_ASSIGN_OR_RETURN(const OpSchema* fc, schema_of(ctx.node, "kiln", "FusedConv", 1));
  const ir::TypeInfo* bias = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo y,
                        infer_op(ctx, *fc, 1, {&x, &ctx.input(1), bias}, {nullptr, ctx.constant(1), ctx.constant(2)},
                                 attrs_without(ctx.node, {})));
  y.shape = nhwc_of(y.shape);
  if (ctx.has_input(3)) {
    KILN_RETURN_IF_ERROR(check_nhwc_input(ctx, 3, "Residual"));
    const SymShape& r = ctx.input_shape(3);
    if (r.rank_known && y.shape.rank_known)
      for (size_t d = 0; d < 4; ++d)
        if (r.dims[d].known() && y.shape.dims[d].known() && r.dims[d].value != y.shape.dims[d].value)
          return ctx.error(str_cat("Residual ", r.str(), " is not the output's channels-last shape ", y.shape.str()));
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

Status nhwc_conv_kernel(KernelContext& ctx) {
  auto x = nhwc_to_nchw(ctx.input(0));
  if (!x.ok()) return ctx.error(x.status().message());
  Tensor residual;
  if (ctx.has_input(3)) {
    auto r = nhwc_to_nchw(ctx.input(3));
    if (!r.ok()) return ctx.error(r.status().message());
    residual = std::move(r).value();
  }
  KILN_ASSIGN_OR_RETURN(const OpSchema* fc, schema_of(ctx.node, "kiln", "FusedConv", 1));
  KILN_ASSIGN_OR_RETURN(Tensor y, run_op(ctx, *fc, 1,
                                         {&x.value(), &ctx.input(1), ctx.has_input(2) ? &ctx.input(2) : nullptr,
                                          residual.defined() ? &residual : nullptr},
                                         attrs_without(ctx.node, {})));
  auto yl = nchw_to_nhwc(y);
  if (!yl.ok()) return ctx.error(yl.status().message());
  ctx.set_output(0, std::move(yl).value());
  return Status::Ok();
}

Status infer_nhwc_pool(InferContext& ctx) {
  std::string op = ctx.node.attr_string("pool", "");
  if (!known_pool(op)) return ctx.error(str_cat("unknown pool '", op, "'"));
  KILN_RETURN_IF_ERROR(check_nhwc_input(ctx, 0, "X"));
  ir::TypeInfo x = ctx.input(0);
  x.shape = nchw_of(x.shape);
  const int opset = static_cast<int>(ctx.node.attr_int("pool_opset", 12));
  KILN_ASSIGN_OR_RETURN(const OpSchema* s, schema_of(ctx.node, "", op, opset));
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo y, infer_op(ctx, *s, opset, {&x}, {nullptr}, pool_attrs(ctx.node)));
  y.shape = nhwc_of(y.shape);
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

Status nhwc_pool_kernel(KernelContext& ctx) {
  std::string op = ctx.node.attr_string("pool", "");
  if (!known_pool(op)) return ctx.error(str_cat("unknown pool '", op, "'"));
  auto x = nhwc_to_nchw(ctx.input(0));
  if (!x.ok()) return ctx.error(x.status().message());
  const int opset = static_cast<int>(ctx.node.attr_int("pool_opset", 12));
  KILN_ASSIGN_OR_RETURN(const OpSchema* s, schema_of(ctx.node, "", op, opset));
  KILN_ASSIGN_OR_RETURN(Tensor y, run_op(ctx, *s, opset, {&x.value()}, pool_attrs(ctx.node)));
  auto yl = nchw_to_nhwc(y);
  if (!yl.ok()) return ctx.error(yl.status().message());
  ctx.set_output(0, std::move(yl).value());
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("kiln", NhwcConv, 1, infer_nhwc_conv, nhwc_conv_kernel, 2, 4);
KILN_REGISTER_OP_ARITY("kiln", NhwcPool, 1, infer_nhwc_pool, nhwc_pool_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("kiln", BlockedConcatElementwise, 1, infer_blocked_concat_elementwise,
                       blocked_concat_elementwise_kernel, 1, -1);
KILN_REGISTER_OP_ARITY("kiln", ReorderToBlocked, 1, infer_to_blocked, to_blocked_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("kiln", ReorderFromBlocked, 1, infer_from_blocked, from_blocked_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("kiln", BlockedConv, 1, infer_blocked_conv, blocked_conv_kernel, 2, 4);
KILN_REGISTER_OP_ARITY("kiln", BlockedPool, 1, infer_blocked_pool, blocked_pool_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("kiln", BlockedConvDw, 1, infer_blocked_conv_dw, blocked_conv_dw_kernel, 4, 5);

}  // namespace kiln::ops
