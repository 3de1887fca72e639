// The direct convolution loop shared by Conv, ConvInteger and QLinearConv.
//
// For every (batch, group, output channel, input channel) the kernel taps are applied row by row:
// y[oh, ow] += w[kh, kw] * x[oh*sh + kh*dh - ph, ow*sw + kw*dw - pw], with the range of valid
// (oh, ow) for each tap computed once, so the innermost loop runs over a contiguous output row
// without bounds checks. Spatial ranks above 2 recurse over the leading spatial dims (a 3-D conv
// is a sum of 2-D convs over kernel depth); 1-D convs run as 2-D with a unit leading dim.
#pragma once

#include <algorithm>
#include <vector>

#include "ops/conv_util.h"

namespace kiln::ops {

struct ConvPlan {
  int64_t batch = 0, in_channels = 0, out_channels = 0, group = 1;
  // Spatial geometry, at least 2 dims (1-D convs get a leading unit dim; 1x1/stride-1/unpadded
  // 2-D trailing dims are merged into one row).
  Dims in, out, kernel, strides, dilations, pad_begin;
  Dims out_shape;  // the real output shape [N, M, spatial...]
};

// Validates X [N, C, spatial...] and W [M, C/group, kernel...] against the groups and builds the
// plan from the resolved window (resolve_window(node, X, &W)).
Result<ConvPlan> make_conv_plan(const WindowGeometry& win, const Dims& x_shape, const Dims& w_shape, int64_t group);

// Shape inference for conv-like ops: output [N, M, spatial...] from inputs x_idx (X) and w_idx (W).
Status infer_conv_shape(InferContext& ctx, size_t x_idx, size_t w_idx, DataType out_dtype);

namespace conv_detail {

struct Geometry {
  size_t n = 0;
  int64_t in_plane = 1, out_plane = 1, k_plane = 1;
  Dims in_stride, out_stride, k_stride;  // element strides of the spatial dims inside one plane
  // Per kernel tap of the last two dims: the valid output range.
  std::vector<int64_t> row_lo, row_hi, col_lo, col_hi;
};

inline Geometry geometry(const ConvPlan& p) {
  Geometry g;
  g.n = p.in.size();
  g.in_stride = strides_of(p.in);
  g.out_stride = strides_of(p.out);
  g.k_stride = strides_of(p.kernel);
  g.in_plane = dims_numel(p.in);
  g.out_plane = dims_numel(p.out);
  g.k_plane = dims_numel(p.kernel);
  size_t h = g.n - 2, w = g.n - 1;
  for (int64_t kh = 0; kh < p.kernel[h]; ++kh) {
    int64_t lo, hi;
    valid_output_range(kh * p.dilations[h] - p.pad_begin[h], p.strides[h], p.in[h], p.out[h], &lo, &hi);
    g.row_lo.push_back(lo);
    g.row_hi.push_back(hi);
  }
  for (int64_t kw = 0; kw < p.kernel[w]; ++kw) {
    int64_t lo, hi;
    valid_output_range(kw * p.dilations[w] - p.pad_begin[w], p.strides[w], p.in[w], p.out[w], &lo, &hi);
    g.col_lo.push_back(lo);
    g.col_hi.push_back(hi);
  }
  return g;
}

// y[i] += a * x[i]. Blocks of 8 with a fixed-count inner loop let the compiler use SIMD even at
// -O2 (whose cost model does not vectorize loops that need a scalar remainder).
template <typename T>
inline void axpy(T* __restrict y, const T* __restrict x, T a, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int u = 0; u < 8; ++u) y[i + u] += a * x[i + u];
  for (; i < n; ++i) y[i] += a * x[i];
}

// One group of one image: x has Cg planes, w has Mg*Cg kernels, y has Mg planes. `xo`, `wo`,
// `yo` are offsets inside a plane / kernel selected by the outer spatial dims.
template <typename T>
struct GroupConv {
  const ConvPlan& p;
  const Geometry& g;
  const T* x;
  const T* w;
  T* y;
  int64_t cg, mg;

  void run(size_t d, int64_t xo, int64_t wo, int64_t yo) const {
    if (d + 2 == g.n) return run2d(xo, wo, yo);
    for (int64_t k = 0; k < p.kernel[d]; ++k) {
      int64_t off = k * p.dilations[d] - p.pad_begin[d], lo, hi;
      valid_output_range(off, p.strides[d], p.in[d], p.out[d], &lo, &hi);
      for (int64_t o = lo; o < hi; ++o)
        run(d + 1, xo + (o * p.strides[d] + off) * g.in_stride[d], wo + k * g.k_stride[d], yo + o * g.out_stride[d]);
    }
  }

  void run2d(int64_t xo, int64_t wo, int64_t yo) const {
    const size_t h = g.n - 2, wd = g.n - 1;
    const int64_t in_w = p.in[wd], out_w = p.out[wd], kh_n = p.kernel[h], kw_n = p.kernel[wd];
    const int64_t sh = p.strides[h], sw = p.strides[wd], dh = p.dilations[h], dw = p.dilations[wd];
    const int64_t ph = p.pad_begin[h], pw = p.pad_begin[wd];
    for (int64_t m = 0; m < mg; ++m) {
      T* yp = y + m * g.out_plane + yo;
      for (int64_t c = 0; c < cg; ++c) {
        const T* xp = x + c * g.in_plane + xo;
        const T* wp = w + (m * cg + c) * g.k_plane + wo;
        for (int64_t kh = 0; kh < kh_n; ++kh) {
          const int64_t row_off = kh * dh - ph;
          for (int64_t oh = g.row_lo[kh]; oh < g.row_hi[kh]; ++oh) {
            const T* xr = xp + (oh * sh + row_off) * in_w;
            T* yr = yp + oh * out_w;
            for (int64_t kw = 0; kw < kw_n; ++kw) {
              const T wv = wp[kh * g.k_stride[h] + kw];
              const int64_t col_off = kw * dw - pw, lo = g.col_lo[kw], hi = g.col_hi[kw];
              if (hi <= lo) continue;
              if (sw == 1) {
                const T* xs = xr + (lo + col_off);
                T* ys = yr + lo;
                axpy(ys, xs, wv, hi - lo);
              } else {
                for (int64_t ow = lo; ow < hi; ++ow) yr[ow] += wv * xr[ow * sw + col_off];
              }
            }
          }
        }
      }
    }
  }
};

}  // namespace conv_detail

// y (N*M*out_plane elements) = conv(x, w) + bias (bias may be null). T is the accumulation type;
// x and w are already in T.
template <typename T>
void conv_forward(const ConvPlan& p, const T* x, const T* w, const T* bias, T* y) {
  conv_detail::Geometry g = conv_detail::geometry(p);
  const int64_t cg = p.in_channels / p.group, mg = p.out_channels / p.group;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t m = 0; m < p.out_channels; ++m) {
      T* yp = y + (b * p.out_channels + m) * g.out_plane;
      std::fill(yp, yp + g.out_plane, bias ? bias[m] : T(0));
    }
    for (int64_t gi = 0; gi < p.group; ++gi) {
      conv_detail::GroupConv<T> gc{p,
                                   g,
                                   x + (b * p.in_channels + gi * cg) * g.in_plane,
                                   w + gi * mg * cg * g.k_plane,
                                   y + (b * p.out_channels + gi * mg) * g.out_plane,
                                   cg,
                                   mg};
      if (g.out_plane > 0 && cg > 0) gc.run(0, 0, 0, 0);
    }
  }
}

}  // namespace kiln::ops
