// Depthwise 2-D convolution on NCHW (one filter per channel), vectorized along the output width
// over a padded, phase-split copy of each input plane (padded_plane.h), so that every stride,
// padding and dilation runs the same contiguous loads. Planes are spread over the threads; four
// accumulators (four vectors of a row, or rows of a narrow plane) hide the FMA latency; bias,
// residual and activation are applied before the single store.
#pragma once

#include <cstdint>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernel_simd.h"
#include "backends/cpu/padded_plane.h"

namespace kiln::backends::cpu {

struct DepthwiseConv {
  int64_t batch = 0, channels = 0;
  PlaneGeometry g;
  const float* weights = nullptr;  // [channels, kh, kw]
  const float* bias = nullptr;     // [channels] or null
  Activation act;
};

// y[n, c] = act(conv(x[n, c], w[c]) + bias[c] + residual[n, c]); residual may be null.
void depthwise_conv(Isa isa, const DepthwiseConv& p, const float* x, const float* residual, float* y);

}  // namespace kiln::backends::cpu
