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
  const int64_t last = static_cast<int64_t>(counts.size()) - 1;
  const double inv = amax > 0 ? static_cast<double>(counts.size()) / amax : 0;
  for (int64_t i = 0; i < n; ++i) {
    double a = std::fabs(static_cast<double>(x[i]));
    if (!std::isfinite(a)) continue;
    if (a == 0) {
      zeros += 1;
      continue;
    }
    int64_t b = static_cast<int64_t>(a * inv);
    counts[static_cast<size_t>(std::min(std::max<int64_t>(b, 0), last))] += 1;
  }
}

double entropy_threshold(const Histogram& h, int levels) {
  const int bins = static_cast<int>(h.counts.size());
  if (bins == 0 || h.amax <= 0) return 0;
  if (levels >= bins) return h.amax;
  const std::vector<double>& c = h.counts;
  std::vector<double> beyond(static_cast<size_t>(bins) + 1, 0);  // beyond[i] = sum of c[i..]
  for (int i = bins - 1; i >= 0; --i)
    beyond[static_cast<size_t>(i)] = beyond[static_cast<size_t>(i) + 1] + c[static_cast<size_t>(i)];
  if (beyond[0] <= 0) return 0;
  std::vector<double> q(static_cast<size_t>(bins));
  double best_kl = std::numeric_limits<double>::infinity();
  int best = bins;
  for (int i = levels; i <= bins; ++i) {
    // Q: the first i bins merged into `levels` buckets, each bucket's mass spread evenly over its
    // non-empty bins (an empty bin stays empty: quantization cannot create values there).
    for (int j = 0; j < levels; ++j) {
      int start = static_cast<int>(static_cast<int64_t>(j) * i / levels);
      int stop = static_cast<int>(static_cast<int64_t>(j + 1) * i / levels);
      double sum = 0;
      int nonzero = 0;
      for (int k = start; k < stop; ++k) sum += c[static_cast<size_t>(k)], nonzero += c[static_cast<size_t>(k)] > 0;
      for (int k = start; k < stop; ++k) q[static_cast<size_t>(k)] = c[static_cast<size_t>(k)] > 0 ? sum / nonzero : 0;
    }
    // P: the same bins with everything beyond the threshold clipped into the last one.
    const double p_total = beyond[0], q_total = p_total - beyond[static_cast<size_t>(i)];
    if (q_total <= 0) continue;
    double kl = 0;
    for (int k = 0; k < i; ++k) {
      double p = c[static_cast<size_t>(k)] + (k == i - 1 ? beyond[static_cast<size_t>(i)] : 0);
      if (p <= 0) continue;
      p /= p_total;
      double qq = q[static_cast<size_t>(k)] / q_total;
      if (qq <= 0) qq = 1e-12;  // the clipped mass in an empty last bin: Q cannot hold it
      kl += p * std::log(p / qq);
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
  double t = c == Calibrator::kEntropy      ? entropy_threshold(s.hist, levels)
             : c == Calibrator::kPercentile ? percentile_threshold(s.hist, percentile)
                                            : mse_threshold(s.hist, levels);
  r.min = std::max(s.min, -t);
  r.max = std::min(s.max, t);
  return r;
}

QuantParams uint8_params(Range r) {
  double lo = std::min(r.min, 0.0), hi = std::max(r.max, 0.0);
  QuantParams p;
  if (!(hi - lo > 0) || !std::isfinite(hi - lo)) return p;
  p.scale = static_cast<float>((hi - lo) / 255.0);
  if (!(p.scale > 0)) {
    p.scale = 1;
    return p;
  }
  double zp = std::round(-lo / static_cast<double>(p.scale));
  p.zero_point = static_cast<int32_t>(std::min(255.0, std::max(0.0, zp)));
  return p;
}

}  // namespace kiln::quant
