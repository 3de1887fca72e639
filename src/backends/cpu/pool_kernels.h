// 2-D pooling on NCHW: MaxPool / AveragePool with any kernel, stride, pads, dilation, ceil_mode and
// count_include_pad (the window resolved by the reference kernel's code, ops/conv_util.h);
// GlobalAveragePool / GlobalMaxPool as vector reductions. Square 2x2, 3x3 and 5x5 windows with
// stride 1 or 2 read the plane in place (each input row reduced over its taps in registers once,
// merged into every output row whose window holds it; edges masked with the pad value: -inf for
// max, 0 for average, whose divisors are precomputed per output position); other windows go
// through a padded, phase-split copy of the plane (padded_plane.h). Planes are spread over the
// threads.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/padded_plane.h"

namespace kiln::backends::cpu {

struct Pool2d {
  int64_t planes = 0;  // N * C
  PlaneGeometry g;
  int64_t pad_bottom = 0, pad_right = 0;  // declared padding (count_include_pad counts taps inside it)
  bool max = false, global = false, count_include_pad = false;
};

// Average pooling: 1 / divisor per output position [oh, ow] (empty for the other kinds).
std::vector<float> pool_reciprocals(const Pool2d& p);
void pool2d(Isa isa, const Pool2d& p, const float* reciprocals, const float* x, float* y);

}  // namespace kiln::backends::cpu
