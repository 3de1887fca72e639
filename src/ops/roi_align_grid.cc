#include "ops/roi_align_grid.h"

#include <algorithm>
#include <cmath>

#include "core/status.h"

namespace kiln::ops::roi_align {

namespace {
constexpr double kMaxSamples = 1 << 16;
constexpr double kMaxRoiSamples = 1 << 28;  // over all bins of one roi
}  // namespace

std::string resolve_region(double x1, double y1, double x2, double y2, bool half_pixel, int64_t oh, int64_t ow,
                           int64_t sampling_ratio, Region* out) {
  const double off = half_pixel ? 0.5 : 0.0;
  x1 -= off, y1 -= off, x2 -= off, y2 -= off;
  double rw = x2 - x1, rh = y2 - y1;
  if (!half_pixel) {
    rw = std::max(rw, 1.0);
    rh = std::max(rh, 1.0);
  }
  const double gh_d =
      sampling_ratio > 0 ? static_cast<double>(sampling_ratio) : std::ceil(rh / static_cast<double>(oh));
  const double gw_d =
      sampling_ratio > 0 ? static_cast<double>(sampling_ratio) : std::ceil(rw / static_cast<double>(ow));
  if (!std::isfinite(x1 + y1 + x2 + y2) || !(gh_d * gw_d <= kMaxSamples) ||
      !(gh_d * gw_d * static_cast<double>(oh * ow) <= kMaxRoiSamples))
    return str_cat("(", x1, ", ", y1, ", ", x2, ", ", y2, ") needs too many samples per bin");
  out->x1 = x1, out->y1 = y1;
  out->bin_h = rh / static_cast<double>(oh), out->bin_w = rw / static_cast<double>(ow);
  out->gh = std::max<int64_t>(0, static_cast<int64_t>(gh_d));
  out->gw = std::max<int64_t>(0, static_cast<int64_t>(gw_d));
  out->count = static_cast<double>(std::max<int64_t>(out->gh * out->gw, 1));
  return "";
}

void sample_grid(const Region& r, int64_t oh, int64_t ow, int64_t H, int64_t W, std::vector<Sample>& out) {
  out.clear();
  for (int64_t ph = 0; ph < oh; ++ph)
    for (int64_t pw = 0; pw < ow; ++pw)
      for (int64_t iy = 0; iy < r.gh; ++iy) {
        double yy = r.y1 + static_cast<double>(ph) * r.bin_h +
                    (static_cast<double>(iy) + 0.5) * r.bin_h / static_cast<double>(r.gh);
        for (int64_t ix = 0; ix < r.gw; ++ix) {
          double xx = r.x1 + static_cast<double>(pw) * r.bin_w +
                      (static_cast<double>(ix) + 0.5) * r.bin_w / static_cast<double>(r.gw);
          Sample s;
          if (!(yy < -1.0 || yy > static_cast<double>(H) || xx < -1.0 || xx > static_cast<double>(W)) && H > 0 &&
              W > 0) {
            double yv = std::max(yy, 0.0), xv = std::max(xx, 0.0);
            int64_t y_lo = static_cast<int64_t>(yv), x_lo = static_cast<int64_t>(xv), y_hi, x_hi;
            if (y_lo >= H - 1) {
              y_hi = y_lo = H - 1;
              yv = static_cast<double>(y_lo);
            } else {
              y_hi = y_lo + 1;
            }
            if (x_lo >= W - 1) {
              x_hi = x_lo = W - 1;
              xv = static_cast<double>(x_lo);
            } else {
              x_hi = x_lo + 1;
            }
            double ly = yv - static_cast<double>(y_lo), lx = xv - static_cast<double>(x_lo);
            double hy = 1 - ly, hx = 1 - lx;
            s = Sample{{y_lo * W + x_lo, y_lo * W + x_hi, y_hi * W + x_lo, y_hi * W + x_hi},
                       {hy * hx, hy * lx, ly * hx, ly * lx}};
          }
          out.push_back(s);
        }
      }
}

}  // namespace kiln::ops::roi_align
