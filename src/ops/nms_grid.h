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

// A box from its four coordinates as NonMaxSuppression reads them: center_point_box 1 is [x_center,
// y_center, width, height], 0 is [y1, x1, y2, x2] with the corners in any order.
inline Box box_of(double a, double b, double c, double d, bool center) {
  if (center) return {a - c / 2, a + c / 2, b - d / 2, b + d / 2};
  return {std::min(b, d), std::max(b, d), std::min(a, c), std::max(a, c)};
}

// The IoU the greedy pass compares with iou_threshold (a kept box suppresses a candidate when it is
// above): intersection over union when the boxes intersect and both areas and the union are positive,
// else -inf (such a pair never suppresses). The reference kernel evaluates the same, vectorized.
inline double suppression_iou(const Box& p, const Box& q) {
  const double ix = std::min(p.x_max, q.x_max) - std::max(p.x_min, q.x_min);
  const double iy = std::min(p.y_max, q.y_max) - std::max(p.y_min, q.y_min);
  const double a1 = (p.x_max - p.x_min) * (p.y_max - p.y_min), a2 = (q.x_max - q.x_min) * (q.y_max - q.y_min);
  const double inter = ix * iy, uni = a1 + a2 - inter;
  if (!(ix > 0) || !(iy > 0) || !(a1 > 0) || !(a2 > 0) || !(uni > 0)) return -INFINITY;
  return inter / uni;
}

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
