// Conv (opsets 1, 11, 22): N-D convolution with groups, strides, dilations, pads and auto_pad.
#include <cmath>

#include "ops/conv_core.h"

namespace kiln::ops {

Result<ConvPlan> make_conv_plan(const WindowGeometry& win, const Dims& x_shape, const Dims& w_shape, int64_t group) {
  if (group < 1 || group > kMaxWindowAttr) return InvalidArgument("group must be in [1, 2^31], got ", group);
  const size_t n = win.rank();
  ConvPlan p;
  p.batch = x_shape[0];
  p.in_channels = x_shape[1];
  p.out_channels = w_shape[0];
  p.group = group;
  if (p.in_channels % group != 0 || p.in_channels / group != w_shape[1])
    return InvalidArgument("X has ", p.in_channels, " channels but W ", dims_str(w_shape), " with group ", group,
                           " expects ", w_shape[1], " channels per group");
  if (p.out_channels % group != 0)
    return InvalidArgument("W has ", p.out_channels, " output channels, not divisible by group ", group);
  p.out_shape = {p.batch, p.out_channels};
  p.in = win.in;
  p.out = win.out;
  p.kernel = win.kernel;
  p.strides = win.strides;
  p.dilations = win.dilations;
  p.pad_begin = win.pad_begin;
  p.out_shape.insert(p.out_shape.end(), win.out.begin(), win.out.end());
  KILN_RETURN_IF_ERROR(checked_numel(p.out_shape).status());
  // 1x1, stride-1, unpadded trailing dims: one long row instead of many short ones.
  if (n >= 2) {
    size_t h = n - 2, w = n - 1;
    bool flat = true;
    for (size_t d : {h, w})
      flat = flat && p.kernel[d] == 1 && p.strides[d] == 1 && p.pad_begin[d] == 0 && p.out[d] == p.in[d];
    if (flat) {
      int64_t hw = p.in[h] * p.in[w];
      for (Dims* v : {&p.in, &p.out}) {
        v->pop_back();
        v->back() = hw;
      }
      for (Dims* v : {&p.kernel, &p.strides, &p.dilations, &p.pad_begin}) v->pop_back();
    }
  }
  if (p.in.size() == 1) {
    for (Dims* v : {&p.in, &p.out, &p.kernel, &p.strides, &p.dilations}) v->insert(v->begin(), 1);
    p.pad_begin.insert(p.pad_begin.begin(), 0);
  }
  return p;
}

Status infer_conv_shape(InferContext& ctx, size_t x_idx, size_t w_idx, DataType out_dtype) {
  const SymShape& xs = ctx.input_shape(x_idx);
  const SymShape& ws = ctx.input_shape(w_idx);
  size_t rank = xs.rank_known ? xs.rank() : ws.rank_known ? ws.rank() : 0;
  if (rank == 0) {
    ctx.set_output(0, out_dtype, SymShape());
    return Status::Ok();
  }
  if (rank < 3) return ctx.error(str_cat("input X must have rank >= 3 (N, C, spatial...), got ", xs.str()));
  if (xs.rank_known && ws.rank_known && xs.rank() != ws.rank())
    return ctx.error(str_cat("X ", xs.str(), " and W ", ws.str(), " must have the same rank"));
  int64_t group = ctx.node.attr_int("group", 1);
  if (group < 1 || group > kMaxWindowAttr) return ctx.error(str_cat("group must be in [1, 2^31], got ", group));
  Dims wk;
  bool wk_known = ws.rank_known;
  for (size_t d = 2; wk_known && d < rank; ++d) {
    wk_known = ws.dims[d].known();
    if (wk_known) wk.push_back(ws.dims[d].value);
  }
  auto win = read_window(ctx.node, rank - 2, wk_known ? &wk : nullptr, {});
  if (!win.ok()) return win.status();
  if (xs.rank_known && ws.rank_known && xs.dims[1].known() && ws.dims[1].known() &&
      (xs.dims[1].value % group != 0 || xs.dims[1].value / group != ws.dims[1].value))
    return ctx.error(str_cat("X ", xs.str(), " has ", xs.dims[1].value, " channels but W ", ws.str(), " with group ",
                             group, " expects ", ws.dims[1].value, " channels per group"));
  std::vector<Dim> out(rank);
  out[0] = xs.rank_known ? xs.dims[0] : Dim();
  out[1] = ws.rank_known ? ws.dims[0] : Dim();
  for (size_t d = 2; d < rank; ++d) {
    if (!xs.rank_known) continue;
    auto o = window_output_sym(*win, d - 2, xs.dims[d]);
    if (!o.ok()) return ctx.error(o.status().message());
    out[d] = *o;
  }
  ctx.set_output(0, out_dtype, SymShape(out));
  return Status::Ok();
}

namespace {

Status infer_conv(InferContext& ctx) {
  // The kernel's bias check where W's output channels and B's shape are known, with its message.
  const SymShape& w = ctx.input_shape(1);
  const SymShape& b = ctx.input_shape(2);
  if (ctx.has_input(2) && w.rank_known && w.rank() >= 1 && w.dims[0].known() && b.fully_known() &&
      (b.rank() != 1 || b.dims[0].value != w.dims[0].value))
    return ctx.error(str_cat("bias B ", dtype_name(ctx.input_dtype(2)), dims_str(b.concrete()), " must be 1-D of ",
                             w.dims[0].value, " elements of ", dtype_name(ctx.input_dtype(0))));
  return infer_conv_shape(ctx, 0, 1, ctx.input_dtype(0));
}

Status conv_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  const Tensor& w0 = ctx.input(1);
  if (!dtype_is_float(x0.dtype())) return ctx.unsupported(str_cat("Conv on ", x0.describe(), " (float types only)"));
  if (w0.dtype() != x0.dtype())
    return ctx.error(str_cat("X ", x0.describe(), " and W ", w0.describe(), " must have the same dtype"));
  KILN_RETURN_IF_ERROR(check_nchw(x0, "Conv", "X"));
  if (w0.rank() != x0.rank())
    return ctx.error(str_cat("W ", w0.describe(), " must have the rank of X ", x0.describe()));
  KILN_ASSIGN_OR_RETURN(WindowGeometry win, resolve_window(ctx.node, x0.shape(), &w0.shape()));
  auto plan = make_conv_plan(win, x0.shape(), w0.shape(), ctx.node.attr_int("group", 1));
  if (!plan.ok()) return ctx.error(plan.status().message());
  Tensor bias;
  if (ctx.has_input(2)) {
    const Tensor& b0 = ctx.input(2);
    if (b0.dtype() != x0.dtype() || b0.rank() != 1 || b0.dim(0) != plan->out_channels)
      return ctx.error(str_cat("bias B ", b0.describe(), " must be 1-D of ", plan->out_channels, " elements of ",
                               dtype_name(x0.dtype())));
    bias = upcast_float(b0);
  }
  Tensor x = upcast_float(x0), w = upcast_float(w0);
  Tensor y(x.dtype(), plan->out_shape);
  if (x.dtype() == DataType::kFloat64) {
    conv_forward<double>(*plan, x.data<double>(), w.data<double>(), bias.defined() ? bias.data<double>() : nullptr,
                         y.data<double>());
  } else {
    conv_forward<float>(*plan, x.data<float>(), w.data<float>(), bias.defined() ? bias.data<float>() : nullptr,
                        y.data<float>());
  }
  ctx.set_output(0, downcast_float(y, x0.dtype()));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Conv, 1, infer_conv, conv_kernel, 2, 3);

}  // namespace kiln::ops
