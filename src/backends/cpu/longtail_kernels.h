// Vectorized kernels of the long-tail tactics (resize_tactic.cc, softmax on a strided axis in
// norm_softmax_tactic.cc, reduce_tactic.cc, group normalization): one body (longtail_kernels.inc) compiled for AVX-512,
// AVX2 and portable C++ (longtail_kernels.cc, through isa_paths.inc); lt::kernels(isa) hands out the
// table of one path. Float32; outputs never overlap inputs.
#pragma once

#include <cstdint>

#include "backends/cpu/cpu_features.h"

namespace kiln::backends::cpu::lt {

// What a reduction accumulates (the tactic applies the final mean / sqrt / log): the sum of x, x^2
// or |x|, the max or min (NaN propagates), the product, or log(sum(exp(x - max))) + max.
enum class Reduce : uint8_t { kSum, kSumSquare, kSumAbs, kMax, kMin, kProd, kLogSumExp };

struct Kernels {
  Isa isa;
  // dst[0, len) = sum over t < n of w[t] * rows[t][0, len) (the first product alone when n == 1).
  void (*blend_rows)(const float* const* rows, const float* w, int64_t n, float* dst, int64_t len);
  // Softmax / LogSoftmax of x viewed as [outer, axis, inner] along the middle axis, for the columns
  // [c0, c0 + nc) of the outer index o.
  void (*softmax_cols)(const float* x, float* y, int64_t o, int64_t axis, int64_t inner, int64_t c0, int64_t nc,
                       bool log);
  // y[r] = the reduction of the contiguous row x[r * len, (r + 1) * len), rows [r0, r1).
  void (*reduce_rows)(const float* x, float* y, int64_t r0, int64_t r1, int64_t len, Reduce op);
  // x viewed as [outer, axis, inner]: y[o * inner + c] = the reduction along the axis, for the
  // columns [c0, c0 + nc) of outer index o.
  void (*reduce_cols)(const float* x, float* y, int64_t o, int64_t axis, int64_t inner, int64_t c0, int64_t nc,
                      Reduce op);
  // Group / instance normalization of one group: x and y are `channels` rows of `spatial` floats,
  // normalized together (mean and variance summed in double), then row c is scaled by scale[c] and
  // shifted by bias[c].
  void (*group_norm)(const float* x, float* y, int64_t channels, int64_t spatial, const float* scale, const float* bias,
                     float epsilon);
};

const Kernels& kernels(Isa isa);

}  // namespace kiln::backends::cpu::lt
