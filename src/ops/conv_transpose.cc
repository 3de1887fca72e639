// ConvTranspose (opsets 1, 11, 22): the gradient of Conv with respect to its input. Every input
// element scatters x * w[k] into y at o = i * stride + k * dilation - pad_begin.
//
// Output extent per spatial dim: output_shape if given (pads then derived from it), else
// in * stride for auto_pad SAME_*, else stride * (in - 1) + output_padding + (k - 1) * d + 1 - pads.
#include <algorithm>

#include "ops/conv_util.h"

namespace kiln::ops {
namespace {

struct TransposePlan {
  int64_t batch = 0, in_channels = 0, out_channels = 0, group = 1;
  Dims in, out, kernel, strides, dilations, pad_begin;  // spatial
  Dims out_shape;
};

Result<Window> read_transpose_window(const ir::Node& node, size_t n, const Dims* wk) {
  return read_window(node, n, wk, {});
}

Status infer_conv_transpose(InferContext& ctx) {
  const SymShape& xs = ctx.input_shape(0);
  const SymShape& ws = ctx.input_shape(1);
  size_t rank = xs.rank_known ? xs.rank() : ws.rank_known ? ws.rank() : 0;
  DataType dt = ctx.input_dtype(0);
  if (rank == 0) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  if (rank < 3) return ctx.error(str_cat("input X must have rank >= 3 (N, C, spatial...), got ", xs.str()));
  if (xs.rank_known && ws.rank_known && xs.rank() != ws.rank())
    return ctx.error(str_cat("X ", xs.str(), " and W ", ws.str(), " must have the same rank"));
  const size_t n = rank - 2;
  int64_t group = ctx.node.attr_int("group", 1);
  if (group < 1 || group > kMaxWindowAttr) return ctx.error(str_cat("group must be in [1, 2^31], got ", group));
  Dims wk;
  bool wk_known = ws.rank_known;
  for (size_t d = 2; wk_known && d < rank; ++d) {
    wk_known = ws.dims[d].known();
    if (wk_known) wk.push_back(ws.dims[d].value);
  }
  KILN_ASSIGN_OR_RETURN(Window win, read_transpose_window(ctx.node, n, wk_known ? &wk : nullptr));
  KILN_ASSIGN_OR_RETURN(Dims os, transpose_output_shape(ctx.node, n));
  KILN_ASSIGN_OR_RETURN(Dims op, transpose_output_padding(ctx.node, n));
  std::vector<Dim> out(rank);
  out[0] = xs.rank_known ? xs.dims[0] : Dim();
  if (ws.rank_known && ws.dims[1].known() && ws.dims[1].value <= (int64_t{1} << 31))
    out[1] = dim_times(ws.dims[1], group);
  for (size_t d = 0; d < n; ++d) {
    if (!os.empty()) {
      out[d + 2] = Dim(os[d]);
    } else if (xs.rank_known && xs.dims[d + 2].known() && !win.kernel.empty()) {
      int64_t o, pb;
      Status st = transpose_dim(win, d, xs.dims[d + 2].value, os, op, &o, &pb);
      if (!st.ok()) return ctx.error(st.message());
      out[d + 2] = Dim(o);
    }
  }
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

template <typename T>
struct GroupTranspose {
  const TransposePlan& p;
  Dims in_stride, out_stride, k_stride;
  int64_t in_plane, out_plane, k_plane, cg, mg;
  const T* x;  // cg input planes of this group
  const T* w;  // cg * mg kernels of this group
  T* y;        // mg output planes of this group

  // Recurses over spatial dims; at the last one, scatters one input row into one output row.
  void run(size_t d, int64_t xo, int64_t wo, int64_t yo, int64_t c, int64_t m) const {
    const size_t n = p.in.size();
    for (int64_t k = 0; k < p.kernel[d]; ++k) {
      int64_t off = k * p.dilations[d] - p.pad_begin[d], lo, hi;
      // input positions i with 0 <= i * stride + off < out
      valid_output_range(off, p.strides[d], p.out[d], p.in[d], &lo, &hi);
      if (d + 1 < n) {
        for (int64_t i = lo; i < hi; ++i)
          run(d + 1, xo + i * in_stride[d], wo + k * k_stride[d], yo + (i * p.strides[d] + off) * out_stride[d], c, m);
      } else {
        const T wv = w[(c * mg + m) * k_plane + wo + k];
        const T* xr = x + c * in_plane + xo;
        T* yr = y + m * out_plane + yo;
        for (int64_t i = lo; i < hi; ++i) yr[i * p.strides[d] + off] += wv * xr[i];
      }
    }
  }
};

template <typename T>
void conv_transpose_forward(const TransposePlan& p, const T* x, const T* w, const T* bias, T* y) {
  const int64_t cg = p.in_channels / p.group, mg = p.out_channels / p.group;
  GroupTranspose<T> gt{p,
                       strides_of(p.in),
                       strides_of(p.out),
                       strides_of(p.kernel),
                       dims_numel(p.in),
                       dims_numel(p.out),
                       dims_numel(p.kernel),
                       cg,
                       mg,
                       nullptr,
                       nullptr,
                       nullptr};
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t m = 0; m < p.out_channels; ++m) {
      T* yp = y + (b * p.out_channels + m) * gt.out_plane;
      std::fill(yp, yp + gt.out_plane, bias ? bias[m] : T(0));
    }
    if (gt.out_plane == 0 || gt.in_plane == 0) continue;
    for (int64_t g = 0; g < p.group; ++g) {
      gt.x = x + (b * p.in_channels + g * cg) * gt.in_plane;
      gt.w = w + g * cg * mg * gt.k_plane;
      gt.y = y + (b * p.out_channels + g * mg) * gt.out_plane;
      for (int64_t c = 0; c < cg; ++c)
        for (int64_t m = 0; m < mg; ++m) gt.run(0, 0, 0, 0, c, m);
    }
  }
}

Status conv_transpose_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  const Tensor& w0 = ctx.input(1);
  if (!dtype_is_float(x0.dtype()))
    return ctx.unsupported(str_cat("ConvTranspose on ", x0.describe(), " (float types only)"));
  if (w0.dtype() != x0.dtype())
    return ctx.error(str_cat("X ", x0.describe(), " and W ", w0.describe(), " must have the same dtype"));
  KILN_RETURN_IF_ERROR(check_nchw(x0, "ConvTranspose", "X"));
  if (w0.rank() != x0.rank())
    return ctx.error(str_cat("W ", w0.describe(), " must have the rank of X ", x0.describe()));
  KILN_ASSIGN_OR_RETURN(WindowGeometry win, resolve_window(ctx.node, x0.shape(), &w0.shape()));
  TransposePlan p;
  p.group = ctx.node.attr_int("group", 1);
  if (p.group < 1 || p.group > kMaxWindowAttr) return ctx.error(str_cat("group must be in [1, 2^31], got ", p.group));
  p.batch = x0.dim(0);
  p.in_channels = x0.dim(1);
  if (w0.dim(0) != p.in_channels || p.in_channels % p.group != 0)
    return ctx.error(str_cat("W ", w0.describe(), " must have X's ", p.in_channels,
                             " channels in dim 0, divisible by group ", p.group));
  p.out_channels = w0.dim(1) * p.group;
  p.out_shape = {p.batch, p.out_channels};
  p.in = win.in;
  p.out = win.out;
  p.kernel = win.kernel;
  p.strides = win.strides;
  p.dilations = win.dilations;
  p.pad_begin = win.pad_begin;
  p.out_shape.insert(p.out_shape.end(), win.out.begin(), win.out.end());
  auto numel = checked_numel(p.out_shape);
  if (!numel.ok()) return ctx.error(numel.status().message());
  Tensor bias;
  if (ctx.has_input(2)) {
    const Tensor& b0 = ctx.input(2);
    if (b0.dtype() != x0.dtype() || b0.rank() != 1 || b0.dim(0) != p.out_channels)
      return ctx.error(str_cat("bias B ", b0.describe(), " must be 1-D of ", p.out_channels, " elements of ",
                               dtype_name(x0.dtype())));
    bias = upcast_float(b0);
  }
  Tensor x = upcast_float(x0), w = upcast_float(w0);
  Tensor y(x.dtype(), p.out_shape);
  if (x.dtype() == DataType::kFloat64) {
    conv_transpose_forward<double>(p, x.data<double>(), w.data<double>(),
                                   bias.defined() ? bias.data<double>() : nullptr, y.data<double>());
  } else {
    conv_transpose_forward<float>(p, x.data<float>(), w.data<float>(), bias.defined() ? bias.data<float>() : nullptr,
                                  y.data<float>());
  }
  ctx.set_output(0, downcast_float(y, x0.dtype()));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", ConvTranspose, 1, infer_conv_transpose, conv_transpose_kernel, 2, 3);

}  // namespace kiln::ops
