// Quantized convolutions: ConvInteger (opset 10) and QLinearConv (opset 10). Both subtract the
// zero points, convolve exactly in 64-bit integers, then ConvInteger returns int32 and
// QLinearConv requantizes to the output zero point's 8-bit type.
#include <cmath>

#include "ops/conv_core.h"

namespace kiln::ops {
namespace {

bool is_8bit(DataType t) { return t == DataType::kInt8 || t == DataType::kUInt8; }

// x - zero_point as int64 (zero_point: a scalar or one-element tensor, optional).
Result<std::vector<int64_t>> centered_input(const Tensor& x, const Tensor* zp, const char* what) {
  int64_t z = 0;
  if (zp) {
    if (zp->numel() != 1)
      return InvalidArgument(what, " zero point must be a scalar (per-tensor), got ", zp->describe());
    if (zp->dtype() != x.dtype())
      return InvalidArgument(what, " zero point ", zp->describe(), " must have the dtype of ", x.describe());
    z = zp->get_i64(0);
  }
  std::vector<int64_t> v(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) v[static_cast<size_t>(i)] = x.get_i64(i) - z;
  return v;
}

// w - zero_point, where zero_point is a scalar or one value per output channel (dim 0 of w).
Result<std::vector<int64_t>> centered_weights(const Tensor& w, const Tensor* zp) {
  std::vector<int64_t> v(static_cast<size_t>(w.numel()));
  int64_t m = w.rank() > 0 ? w.dim(0) : 1;
  int64_t per = m > 0 ? w.numel() / m : 0;
  if (zp) {
    if (zp->dtype() != w.dtype())
      return InvalidArgument("w zero point ", zp->describe(), " must have the dtype of ", w.describe());
    if (zp->numel() != 1 && !(zp->rank() == 1 && zp->numel() == m))
      return InvalidArgument("w zero point ", zp->describe(),
                             " must be a scalar or hold one value per output channel (", m, ")");
  }
  for (int64_t i = 0; i < w.numel(); ++i) {
    int64_t z = !zp ? 0 : zp->numel() == 1 ? zp->get_i64(0) : zp->get_i64(i / per);
    v[static_cast<size_t>(i)] = w.get_i64(i) - z;
  }
  return v;
}

// Shared part: validates X/W, builds the plan and runs the integer convolution.
Result<std::vector<int64_t>> integer_conv(KernelContext& ctx, const Tensor& x, const Tensor& w, const Tensor* x_zp,
                                          const Tensor* w_zp, ConvPlan* plan_out) {
  if (!is_8bit(x.dtype()) || !is_8bit(w.dtype()))
    return ctx.unsupported(str_cat("inputs must be int8 or uint8, got x ", x.describe(), " and w ", w.describe()));
  KILN_RETURN_IF_ERROR(check_nchw(x, ctx.node.op_type.c_str(), "x"));
  if (w.rank() != x.rank()) return ctx.error(str_cat("w ", w.describe(), " must have the rank of x ", x.describe()));
  KILN_ASSIGN_OR_RETURN(WindowGeometry win, resolve_window(ctx.node, x.shape(), &w.shape()));
  auto plan = make_conv_plan(win, x.shape(), w.shape(), ctx.node.attr_int("group", 1));
  if (!plan.ok()) return ctx.error(plan.status().message());
  auto xv = centered_input(x, x_zp, "x");
  if (!xv.ok()) return ctx.error(xv.status().message());
  auto wv = centered_weights(w, w_zp);
  if (!wv.ok()) return ctx.error(wv.status().message());
  std::vector<int64_t> acc(static_cast<size_t>(dims_numel(plan->out_shape)));
  conv_forward<int64_t>(*plan, xv->data(), wv->data(), nullptr, acc.data());
  *plan_out = std::move(plan).value();
  return acc;
}

Status infer_conv_integer(InferContext& ctx) { return infer_conv_shape(ctx, 0, 1, DataType::kInt32); }

Status conv_integer_kernel(KernelContext& ctx) {
  const Tensor* x_zp = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const Tensor* w_zp = ctx.has_input(3) ? &ctx.input(3) : nullptr;
  ConvPlan plan;
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> acc, integer_conv(ctx, ctx.input(0), ctx.input(1), x_zp, w_zp, &plan));
  Tensor y(DataType::kInt32, plan.out_shape);
  int32_t* py = y.data<int32_t>();
  for (size_t i = 0; i < acc.size(); ++i) py[i] = static_cast<int32_t>(static_cast<uint64_t>(acc[i]));  // wraps
  ctx.set_output(0, y);
  return Status::Ok();
}

Status infer_qlinear_conv(InferContext& ctx) {
  DataType out = ctx.has_input(7) ? ctx.input_dtype(7) : ctx.input_dtype(0);
  return infer_conv_shape(ctx, 0, 3, out);
}

Status qlinear_conv_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(3);
  const Tensor& x_scale = ctx.input(1);
  const Tensor& w_scale = ctx.input(4);
  const Tensor& y_scale = ctx.input(6);
  for (const Tensor* s : {&x_scale, &w_scale, &y_scale})
    if (!dtype_is_float(s->dtype()) || s->numel() < 1)
      return ctx.error(str_cat("scales must be non-empty float tensors, got ", s->describe()));
  if (x_scale.numel() != 1 || y_scale.numel() != 1)
    return ctx.error(str_cat("x_scale ", x_scale.describe(), " and y_scale ", y_scale.describe(), " must be scalars"));
  const Tensor* y_zp = ctx.has_input(7) ? &ctx.input(7) : nullptr;
  DataType out_dt = y_zp ? y_zp->dtype() : x.dtype();
  if (!is_8bit(out_dt)) return ctx.unsupported(str_cat("output zero point dtype ", dtype_name(out_dt)));
  if (y_zp && y_zp->numel() != 1) return ctx.error(str_cat("y_zero_point must be a scalar, got ", y_zp->describe()));
  ConvPlan plan;
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> acc,
                        integer_conv(ctx, x, w, &ctx.input(2), ctx.has_input(5) ? &ctx.input(5) : nullptr, &plan));
  const int64_t m_count = plan.out_channels;
  if (w_scale.numel() != 1 && !(w_scale.rank() == 1 && w_scale.numel() == m_count))
    return ctx.error(str_cat("w_scale ", w_scale.describe(), " must be a scalar or hold one value per output channel (",
                             m_count, ")"));
  std::vector<int64_t> bias;
  if (ctx.has_input(8)) {
    const Tensor& b = ctx.input(8);
    if (b.dtype() != DataType::kInt32 || b.rank() != 1 || b.numel() != m_count)
      return ctx.error(
          str_cat("bias B ", b.describe(), " must be int32 with one value per output channel (", m_count, ")"));
    bias = to_i64_vector(b);
  }
  const int64_t plane = dims_numel(plan.out_shape) / std::max<int64_t>(1, plan.batch * m_count);
  const float xs = static_cast<float>(x_scale.get_f64(0)), ys = static_cast<float>(y_scale.get_f64(0));
  const float zp = y_zp ? static_cast<float>(y_zp->get_i64(0)) : 0.0f;
  const float lo = out_dt == DataType::kInt8 ? -128.0f : 0.0f, hi = out_dt == DataType::kInt8 ? 127.0f : 255.0f;
  Tensor y(out_dt, plan.out_shape);
  for (size_t i = 0; i < acc.size(); ++i) {
    int64_t m = plane > 0 ? (static_cast<int64_t>(i) / plane) % m_count : 0;
    float ws = static_cast<float>(w_scale.get_f64(w_scale.numel() == 1 ? 0 : m));
    int64_t a = acc[i] + (bias.empty() ? 0 : bias[static_cast<size_t>(m)]);
    float r = static_cast<float>(a) * (xs * ws / ys) + zp;
    if (std::isnan(r)) r = zp;
    r = std::nearbyint(std::min(hi, std::max(lo, r)));  // round half to even
    y.set_i64(static_cast<int64_t>(i), static_cast<int64_t>(r));
  }
  ctx.set_output(0, y);
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", ConvInteger, 10, infer_conv_integer, conv_integer_kernel, 2, 4);
KILN_REGISTER_OP_ARITY("", QLinearConv, 10, infer_qlinear_conv, qlinear_conv_kernel, 8, 9);

}  // namespace kiln::ops
