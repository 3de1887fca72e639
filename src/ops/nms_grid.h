// NonMaxSuppression's grid of kept boxes, the part both implementations share: the boxes as
// doubles and the cells of each axis. The reference kernel (ops/detection.cc, where the argument
// for the grid is made) and nms_kiln (backends/cpu/detection_tactic.cc) must see the same cells for
// the same boxes; the arithmetic lives in nms_grid.cc, compiled once with the ops' flags.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace kiln::ops::nms {

struct Box {
  double x_min, x_max, y_min, y_max;
};

// Whether every coordinate of every box is finite (and there is a box): else one cell holds them all.
bool all_finite(const Box* all, size_t n);

// One axis of the grid: cells of `step` from `lo`, at most 130 of them; a candidate p meets the
// cells from cell(p.lo - reach) to cell(p.hi + margin) (reach: the widest box, widened by margin).
struct Axis {
  double lo = 0, step = 0, reach = 0, margin = 0;  // step 0: a single cell
  size_t n = 1;
  static Axis of(const Box* all, size_t n, bool finite, double Box::*lo_of, double Box::*hi_of);
  // Inline: the greedy pass calls it four times per candidate. No product in it, so contraction
  // cannot make the reference's and the tactic's cells differ.
  size_t cell(double v) const {
    if (step <= 0) return 0;
    double at = std::floor((v - lo) / step);
    if (!(at > 0)) return 0;  // NaN too
    return std::min(static_cast<size_t>(std::min(at, 1e18)), n - 1);
  }
};

}  // namespace kiln::ops::nms
