// RoiAlign's sampling grid: one region's bins and their bilinear samples, computed once here for the
// reference kernel (ops/detection.cc) and kiln's tactic (backends/cpu/detection_tactic.cc), which must
// give the same numbers bit for bit. The arithmetic lives in roi_align_grid.cc, compiled once with the
// ops' flags, so both use the one copy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::ops::roi_align {

// A bilinear sample: the four corners' offsets in the H x W plane and their weights (all zero for a
// sample outside the feature map).
struct Sample {
  int64_t pos[4] = {0, 0, 0, 0};
  double w[4] = {0, 0, 0, 0};
};

// One region: its corner, bin size and samples per bin (gh x gw), and the divisor of an average.
struct Region {
  double x1 = 0, y1 = 0, bin_h = 0, bin_w = 0;
  int64_t gh = 0, gw = 0;
  double count = 1;
};

// The region of roi (x1, y1, x2, y2), already scaled by spatial_scale, for oh x ow bins; "" when valid,
// else why not (non-finite corners, too many samples per bin or per roi).
std::string resolve_region(double x1, double y1, double x2, double y2, bool half_pixel, int64_t oh, int64_t ow,
                           int64_t sampling_ratio, Region* out);

// The samples of every bin of `r` on an H x W plane, bin-major (bin ph * ow + pw, then iy, ix): `out`
// is cleared and holds oh * ow * gh * gw samples.
void sample_grid(const Region& r, int64_t oh, int64_t ow, int64_t H, int64_t W, std::vector<Sample>& out);

}  // namespace kiln::ops::roi_align
