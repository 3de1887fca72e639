#include "ops/nms_grid.h"

#include <algorithm>
#include <cmath>
#include <span>

namespace kiln::ops::nms {

bool all_finite(const Box* all, size_t n) {
  bool finite = n > 0;
  for (const Box& b : std::span(all, n))
    finite &= std::isfinite(b.x_min) && std::isfinite(b.x_max) && std::isfinite(b.y_min) && std::isfinite(b.y_max);
  return finite;
}

Axis Axis::of(const Box* all, size_t n, bool finite, double Box::*lo_of, double Box::*hi_of) {
  Axis a;
  if (!finite) return a;
  double lo = INFINITY, hi = -INFINITY, w = 0;
  for (const Box& b : std::span(all, n))
    lo = std::min(lo, b.*lo_of), hi = std::max(hi, b.*hi_of), w = std::max(w, b.*hi_of - b.*lo_of);
  constexpr double kMaxCells = 128;  // per axis
  a.lo = lo;
  a.margin = 1e-6 * (std::fabs(lo) + std::fabs(hi) + w) + 1e-30;
  a.reach = w + a.margin;
  a.step = std::max(w, (hi - lo) / kMaxCells);
  if (!(a.step > 0) || !std::isfinite(a.step)) return Axis{};
  a.n = static_cast<size_t>(std::min(kMaxCells + 2, std::floor((hi - lo) / a.step) + 1));
  return a;
}

}  // namespace kiln::ops::nms
