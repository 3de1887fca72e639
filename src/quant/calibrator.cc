// Calibrators: activation statistics -> ranges -> uint8 parameters (calibrator.h).
#include "quant/calibrator.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln::quant {

Result<Calibrator> calibrator_from_name(const std::string& name) {
  if (name == "minmax") return Calibrator::kMinMax;
  if (name == "entropy") return Calibrator::kEntropy;
  if (name == "percentile") return Calibrator::kPercentile;
  if (name == "mse") return Calibrator::kMse;
  return InvalidArgument("unknown calibrator '", name, "': one of minmax, entropy, percentile, mse");
}

const char* calibrator_name(Calibrator c) {
  switch (c) {
    case Calibrator::kMinMax: return "minmax";
    case Calibrator::kEntropy: return "entropy";
    case Calibrator::kPercentile: return "percentile";
    case Calibrator::kMse: return "mse";
  }
  return "?";
}

bool uses_histogram(Calibrator c) { return c != Calibrator::kMinMax; }

void Histogram::add(const float* x, int64_t n) {
  if (counts.empty()) return;
  // In float, branch-light (the compiler vectorizes the first loop): the bin of each |x| first, then
  // the counts; NaN and Inf get bin -1 and are skipped, exact zeros bin -2.
  const int last = static_cast<int>(counts.size()) - 1;
  const float inv = amax > 0 ? static_cast<float>(static_cast<double>(counts.size()) / amax) : 0.f;
  constexpr int64_t kBlock = 1024;
  int32_t bins[kBlock];
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t m = std::min(kBlock, n - begin);
    const float* v = x + begin;
    for (int64_t i = 0; i < m; ++i) {
      const float a = std::fabs(v[i]);
      const float scaled = std::min(a * inv, static_cast<float>(last));
      bins[i] = !(a <= std::numeric_limits<float>::max()) ? -1 : a == 0.f ? -2 : static_cast<int32_t>(scaled);
    }
    for (int64_t i = 0; i < m; ++i) {
      if (bins[i] >= 0)
        counts[static_cast<size_t>(bins[i])] += 1;
      else if (bins[i] == -2)
        zeros += 1;
    }
  }
}

double entropy_threshold(const Histogram& h, int levels, double max_clipped_share) {
  const int bins = static_cast<int>(h.counts.size());
  if (bins == 0 || h.amax <= 0) return 0;
  if (levels >= bins) return h.amax;
  const std::vector<double>& c = h.counts;
  // Prefix sums: sum[k] of c[0..k), nonzero[k] the non-empty bins among them (each bucket in O(1)).
  std::vector<double> sum(static_cast<size_t>(bins) + 1, 0), nonzero(static_cast<size_t>(bins) + 1, 0);
  for (int k = 0; k < bins; ++k) {
    sum[static_cast<size_t>(k) + 1] = sum[static_cast<size_t>(k)] + c[static_cast<size_t>(k)];
    nonzero[static_cast<size_t>(k) + 1] = nonzero[static_cast<size_t>(k)] + (c[static_cast<size_t>(k)] > 0);
  }
  const double p_total = sum[static_cast<size_t>(bins)];
  if (p_total <= 0) return 0;
  // The search starts at `levels` bins (TensorRT's) or, later, at the first threshold that clips at most
  // max_clipped_share of the values (zeros included, as the percentile calibrator counts them).
  int first = levels;
  if (max_clipped_share > 0) {
    const double allowed = max_clipped_share * (p_total + h.zeros);
    while (first < bins && p_total - sum[static_cast<size_t>(first)] > allowed) ++first;
  }
  double best_kl = std::numeric_limits<double>::infinity();
  int best = bins;
  for (int i = first; i <= bins; ++i) {
    const double beyond = p_total - sum[static_cast<size_t>(i)], q_total = sum[static_cast<size_t>(i)];
    if (q_total <= 0) continue;
    // P: the first i bins, everything beyond the threshold clipped into the last one. Q: the same bins
    // merged into `levels` buckets, each bucket's mass spread evenly over its non-empty bins (an empty
    // bin stays empty: quantization cannot create values there).
    double kl = 0;
    for (int j = 0; j < levels; ++j) {
      const int start = static_cast<int>(static_cast<int64_t>(j) * i / levels);
      const int stop = static_cast<int>(static_cast<int64_t>(j + 1) * i / levels);
      const double nz = nonzero[static_cast<size_t>(stop)] - nonzero[static_cast<size_t>(start)];
      const double q_bin =
          nz > 0 ? (sum[static_cast<size_t>(stop)] - sum[static_cast<size_t>(start)]) / nz / q_total : 0;
      for (int k = start; k < stop; ++k) {
        double p = c[static_cast<size_t>(k)] + (k == i - 1 ? beyond : 0);
        if (p <= 0) continue;
        p /= p_total;
        const double q = c[static_cast<size_t>(k)] > 0 ? q_bin : 1e-12;  // clipped mass in an empty last bin
        kl += p * std::log(p / q);
      }
    }
    if (kl < best_kl) best_kl = kl, best = i;
  }
  return h.bin_width() * best;
}

double percentile_threshold(const Histogram& h, double percentile) {
  double total = h.zeros;
  for (double v : h.counts) total += v;
  if (total <= 0 || h.amax <= 0) return 0;
  if (percentile >= 100) return h.amax;
  const double target = total * std::max(percentile, 0.0) / 100;
  double cum = h.zeros;
  if (cum >= target) return h.bin_width();
  for (size_t b = 0; b < h.counts.size(); ++b) {
    cum += h.counts[b];
    if (cum >= target) return h.bin_width() * static_cast<double>(b + 1);
  }
  return h.amax;
}

double mse_threshold(const Histogram& h, int levels) {
  const size_t bins = h.counts.size();
  if (bins == 0 || h.amax <= 0) return 0;
  const double bw = h.bin_width();
  const double steps = std::max(levels - 1, 1);
  double best_err = std::numeric_limits<double>::infinity();
  size_t best = bins;
  for (size_t t = 1; t <= bins; ++t) {
    const double thr = bw * static_cast<double>(t), s = thr / steps;
    double err = 0;
    for (size_t b = 0; b < bins && err < best_err; ++b) {
      if (h.counts[b] <= 0) continue;
      double centre = bw * (static_cast<double>(b) + 0.5);
      double q = std::min(std::round(centre / s), steps) * s;
      err += h.counts[b] * (centre - q) * (centre - q);
    }
    if (err < best_err) best_err = err, best = t;
  }
  return bw * static_cast<double>(best);
}

void TensorStats::add_range(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    if (!std::isfinite(v)) continue;
    if (!seen) min = max = v, seen = true;
    min = std::min(min, v), max = std::max(max, v);
  }
  count += n;
}

Range calibrated_range(const TensorStats& s, Calibrator c, double percentile) {
  Range r{s.min, s.max};
  if (c == Calibrator::kMinMax || !s.seen) return r;
  const int levels = s.min >= 0 ? 256 : 128;
  double t = c == Calibrator::kEntropy      ? entropy_threshold(s.hist, levels, kEntropyMaxClippedShare)
             : c == Calibrator::kPercentile ? percentile_threshold(s.hist, percentile)
                                            : mse_threshold(s.hist, levels);
  r.min = std::max(s.min, -t);
  r.max = std::min(s.max, t);
  return r;
}

QuantParams uint8_params(Range r) {
  // ONNX Runtime's compute_scale_zp, operation for operation: float32 bounds, their difference in float32,
  // the scale in double (float32 only when stored), the zero point rounded half to even from that double.
  const float lo = std::min(static_cast<float>(r.min), 0.f), hi = std::max(static_cast<float>(r.max), 0.f);
  const float range = hi - lo;
  QuantParams p;
  if (!(range > 0) || !std::isfinite(range)) return p;
  const double scale = static_cast<double>(range) / 255.0;
  p.scale = static_cast<float>(scale);
  if (!(p.scale > 0)) {
    p.scale = 1;
    return p;
  }
  const double zp = std::nearbyint(-static_cast<double>(lo) / scale);
  p.zero_point = static_cast<int32_t>(std::min(255.0, std::max(0.0, zp)));
  return p;
}

}  // namespace kiln::quant
