// Depthwise 2-D convolution on NCHW (one filter per channel), vectorized along the output width.
// 3x3 and 5x5 with stride 1 or 2 (mobilenet's) read the input plane in place: each input row of a
// block of output rows is loaded once (masked at the edges), its taps built in registers by
// shifting (stride 2: split into even and odd columns) and fed to every output row using it. Other
// shapes (any kernel, stride, padding, dilation) go through a padded, phase-split copy of the
// plane (padded_plane.h). Planes are spread over the threads; blocks of output rows x vectors keep
// eight accumulators in flight; bias, residual and activation are applied before the single store.
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
