// DeformConv (opsets 19, 22), 2-D: a convolution whose kernel taps are displaced per output
// position by learned offsets and optionally scaled by a mask.
//
// Tap (i, j) of output (oh, ow) samples input position
//   (oh * sh - ph + i * dh + dy, ow * sw - pw + j * dw + dx)
// bilinearly (corners outside the input read zero), where (dy, dx) come from offset
// [N, offset_group * kH * kW * 2, oH, oW] laid out as (offset_group, kH, kW, {dy, dx}); input
// channels are split evenly into offset groups. mask [N, offset_group * kH * kW, oH, oW] scales
// each sample (default 1).
#include <cmath>

#include "ops/conv_core.h"

namespace kiln::ops {
namespace {

Status infer_deform_conv(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(infer_conv_shape(ctx, 0, 1, ctx.input_dtype(0)));
  // The offset tensor fixes the output's spatial dims when its shape is known.
  const SymShape& os = ctx.input_shape(2);
  if (os.rank_known && ctx.outputs[0].shape.rank_known && os.rank() == ctx.outputs[0].shape.rank()) {
    for (size_t d = 2; d < os.rank(); ++d) {
      Dim& o = ctx.outputs[0].shape.dims[d];
      if (o.known() && os.dims[d].known() && o.value != os.dims[d].value)
        return ctx.error(str_cat("offset ", os.str(), " disagrees with the output shape ", ctx.outputs[0].shape.str()));
      if (!o.known()) o = os.dims[d];
    }
  }
  return Status::Ok();
}

// Bilinear sample of one plane at (y, x); corners outside [0, H) x [0, W) read zero.
double bilinear(const double* plane, int64_t H, int64_t W, double y, double x) {
  if (!(y > -1.0 && y < static_cast<double>(H) && x > -1.0 && x < static_cast<double>(W))) return 0.0;
  const double y0f = std::floor(y), x0f = std::floor(x);
  const int64_t y0 = static_cast<int64_t>(y0f), x0 = static_cast<int64_t>(x0f);
  const double ly = y - y0f, lx = x - x0f;
  double v = 0;
  auto at = [&](int64_t yy, int64_t xx, double w) {
    if (yy >= 0 && yy < H && xx >= 0 && xx < W) v += w * plane[yy * W + xx];
  };
  at(y0, x0, (1 - ly) * (1 - lx));
  at(y0, x0 + 1, (1 - ly) * lx);
  at(y0 + 1, x0, ly * (1 - lx));
  at(y0 + 1, x0 + 1, ly * lx);
  return v;
}

Status deform_conv_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  const Tensor& w0 = ctx.input(1);
  const Tensor& off0 = ctx.input(2);
  if (!dtype_is_float(x0.dtype())) return ctx.unsupported(str_cat("DeformConv on ", x0.describe()));
  if (x0.rank() != 4) return ctx.unsupported(str_cat("DeformConv on ", x0.describe(), " (2-D only)"));
  for (const Tensor* t : {&w0, &off0})
    if (t->dtype() != x0.dtype() || t->rank() != 4)
      return ctx.error(
          str_cat("W ", w0.describe(), " and offset ", off0.describe(), " must be 4-D ", dtype_name(x0.dtype())));
  KILN_ASSIGN_OR_RETURN(WindowGeometry win, resolve_window(ctx.node, x0.shape(), &w0.shape()));
  if (win.window.auto_pad != "NOTSET") return ctx.error("DeformConv has no auto_pad");
  const int64_t group = ctx.node.attr_int("group", 1), og = ctx.node.attr_int("offset_group", 1);
  auto plan = make_conv_plan(win, x0.shape(), w0.shape(), group);
  if (!plan.ok()) return ctx.error(plan.status().message());
  const int64_t pad_top = win.pad_begin[0], pad_left = win.pad_begin[1];
  const int64_t N = x0.dim(0), C = x0.dim(1), H = x0.dim(2), W = x0.dim(3), M = w0.dim(0);
  const int64_t kH = w0.dim(2), kW = w0.dim(3), oH = plan->out_shape[2], oW = plan->out_shape[3];
  if (og < 1 || og > std::max<int64_t>(C, 1) || C % og != 0)
    return ctx.error(str_cat("offset_group ", og, " must divide the ", C, " input channels"));
  if (off0.shape() != Dims{N, og * kH * kW * 2, oH, oW})
    return ctx.error(
        str_cat("offset ", off0.describe(), " must be [", N, ", ", og * kH * kW * 2, ", ", oH, ", ", oW, "]"));
  Tensor mask;
  if (ctx.has_input(4)) {
    mask = ctx.input(4);
    if (mask.dtype() != x0.dtype() || mask.shape() != Dims{N, og * kH * kW, oH, oW})
      return ctx.error(str_cat("mask ", mask.describe(), " must be [", N, ", ", og * kH * kW, ", ", oH, ", ", oW, "]"));
  }
  if (ctx.has_input(3)) {
    const Tensor& b = ctx.input(3);
    if (b.dtype() != x0.dtype() || b.rank() != 1 || b.dim(0) != M)
      return ctx.error(str_cat("bias B ", b.describe(), " must be 1-D of ", M, " elements"));
  }
  auto to_f64 = [](const Tensor& t) {
    return t.dtype() == DataType::kFloat64 ? t : t.cast(DataType::kFloat64).value();
  };
  Tensor x = to_f64(x0), w = to_f64(w0), off = to_f64(off0);
  const double* px = x.data<double>();
  const double* pw = w.data<double>();
  const double* po = off.data<double>();
  const int64_t taps = kH * kW, cg = C / group, mg = M / group, c_per_og = C / og, plane = oH * oW;
  Tensor y(DataType::kFloat64, {N, M, oH, oW});
  double* py = y.data<double>();
  std::vector<double> col(static_cast<size_t>(C * taps));  // sampled inputs of one output position
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t oh = 0; oh < oH; ++oh) {
      for (int64_t ow = 0; ow < oW; ++ow) {
        const int64_t pos = oh * oW + ow;
        for (int64_t c = 0; c < C; ++c) {
          const int64_t g = c / c_per_og;
          const double* xp = px + (n * C + c) * H * W;
          for (int64_t i = 0; i < kH; ++i) {
            for (int64_t j = 0; j < kW; ++j) {
              const int64_t t = (g * kH + i) * kW + j;
              const double dy = po[((n * og * taps + t) * 2 + 0) * plane + pos];
              const double dx = po[((n * og * taps + t) * 2 + 1) * plane + pos];
              const double m = mask.defined() ? mask.get_f64((n * og * taps + t) * plane + pos) : 1.0;
              const double sy = static_cast<double>(oh * win.strides[0] - pad_top + i * win.dilations[0]) + dy;
              const double sx = static_cast<double>(ow * win.strides[1] - pad_left + j * win.dilations[1]) + dx;
              col[static_cast<size_t>(c * taps + i * kW + j)] = m * bilinear(xp, H, W, sy, sx);
            }
          }
        }
        for (int64_t m = 0; m < M; ++m) {
          const int64_t g = m / mg;
          double acc = ctx.has_input(3) ? ctx.input(3).get_f64(m) : 0.0;
          const double* wm = pw + m * cg * taps;
          const double* cm = col.data() + g * cg * taps;
          for (int64_t k = 0; k < cg * taps; ++k) acc += wm[k] * cm[k];
          py[(n * M + m) * plane + pos] = acc;
        }
      }
    }
  }
  ctx.set_output(0, x0.dtype() == DataType::kFloat64 ? y : y.cast(x0.dtype()).value());
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", DeformConv, 19, infer_deform_conv, deform_conv_kernel, 3, 5);

}  // namespace kiln::ops
