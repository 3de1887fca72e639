// The calibrators on synthetic statistics with known answers (quant/calibrator.h).
#include "quant/calibrator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace kiln::quant {
namespace {

// A histogram over [0, kHistogramBins) (bin width 1): a decaying bulk of `bulk` per unit plus one value
// at the far end.
Histogram bulk_and_outlier(double bulk) {
  Histogram h(kHistogramBins);
  for (int k = 0; k < 512; ++k) h.counts[static_cast<size_t>(k)] = bulk * std::exp(-k / 32.0);
  h.counts.back() = 1;
  return h;
}

Histogram uniform() {
  Histogram h(kHistogramBins);
  for (auto& c : h.counts) c = 10;
  return h;
}

TEST(Calibrator, Names) {
  for (const char* n : {"minmax", "entropy", "percentile", "mse"})
    EXPECT_STREQ(calibrator_name(calibrator_from_name(n).value()), n);
  EXPECT_FALSE(calibrator_from_name("kl").ok());
  EXPECT_NE(calibrator_from_name("kl").status().message().find("minmax, entropy, percentile, mse"), std::string::npos);
}

TEST(Calibrator, HistogramBinsAbsoluteValuesAndClampsBeyondRange) {
  Histogram h(4.0, 4);  // bins [0,1) [1,2) [2,3) [3,4]
  const float x[] = {0.5f, -0.5f, 1.5f, -3.5f, 7.f, NAN};
  h.add(x, 6);
  EXPECT_EQ(h.counts[0], 2);
  EXPECT_EQ(h.counts[1], 1);
  EXPECT_EQ(h.counts[2], 0);
  EXPECT_EQ(h.counts[3], 2);  // -3.5 and 7 (beyond amax: the last bin); NaN skipped
}

TEST(Calibrator, MinMaxIsTheObservedRange) {
  TensorStats s;
  const float a[] = {-0.25f, 3.f, 1.f}, b[] = {-2.f, 0.5f};
  s.add_range(a, 3);
  s.add_range(b, 2);
  Range r = calibrated_range(s, Calibrator::kMinMax, 0);
  EXPECT_EQ(r.min, -2.0);
  EXPECT_EQ(r.max, 3.0);
  EXPECT_EQ(s.count, 5);
}

TEST(Calibrator, Uint8Params) {
  QuantParams p = uint8_params({-1, 3});
  EXPECT_FLOAT_EQ(p.scale, 4.f / 255);
  EXPECT_EQ(p.zero_point, 64);  // round(1 / (4 / 255)) = round(63.75)
  p = uint8_params({0, 2});
  EXPECT_FLOAT_EQ(p.scale, 2.f / 255);
  EXPECT_EQ(p.zero_point, 0);
  p = uint8_params({1, 2});  // widened to hold 0: [0, 2]
  EXPECT_FLOAT_EQ(p.scale, 2.f / 255);
  EXPECT_EQ(p.zero_point, 0);
  p = uint8_params({-3, -1});  // [-3, 0]: zero point at the top
  EXPECT_EQ(p.zero_point, 255);
  p = uint8_params({0, 0});  // all zeros
  EXPECT_EQ(p.scale, 1.f);
  EXPECT_EQ(p.zero_point, 0);
}

// ONNX Runtime's compute_scale_zp operation for operation: the zero point rounds half to even, from the
// scale in double; the range's width is taken in float32.
TEST(Calibrator, Uint8ParamsAsOnnxRuntime) {
  QuantParams p = uint8_params({-126.5, 128.5});  // scale 1, -min / scale = 126.5: a tie
  EXPECT_EQ(p.scale, 1.f);
  EXPECT_EQ(p.zero_point, 126);  // ties away from zero would give 127
  p = uint8_params({-127.5, 127.5});
  EXPECT_EQ(p.zero_point, 128);
  // The width in float32 (9.5046368 + 5.1182160 rounds there), then / 255 in double: 0x1.d5c42cp-5, as
  // numpy computes it in ONNX Runtime; the exact width / 255 rounds to the next float up, 0x1.d5c42ep-5.
  p = uint8_params({-0x1.4790dap+2, 0x1.3025fcp+3});
  EXPECT_EQ(p.scale, 0x1.d5c42cp-5f);
  EXPECT_EQ(p.zero_point, 89);
}

TEST(Calibrator, PercentileOfUniform) {
  Histogram h = uniform();
  EXPECT_DOUBLE_EQ(percentile_threshold(h, 50), 1024);
  EXPECT_DOUBLE_EQ(percentile_threshold(h, 25), 512);
  EXPECT_DOUBLE_EQ(percentile_threshold(h, 100), kHistogramBins);
  // 99.99% of 2048 equal bins ends inside the last one.
  EXPECT_DOUBLE_EQ(percentile_threshold(h, 99.99), kHistogramBins);
}

TEST(Calibrator, PercentileCutsAnOutlier) {
  Histogram h = bulk_and_outlier(1000);
  double t = percentile_threshold(h, 99.99);
  // The bulk's mass is 32.5e3 (sum of 1000 exp(-k/32)); the outlier is 3.1e-5 of all, so 6.9e-5 of the
  // mass must lie beyond t in the bulk: exp(-t/32) = 6.9e-5, t = 32 ln(1 / 6.9e-5) = 306.6 (bin 307).
  EXPECT_GE(t, 304);
  EXPECT_LE(t, 310);
  // Exact zeros count below any threshold: with as many zeros as values, the 50th percentile is 1 bin.
  Histogram z = uniform();
  z.zeros = 10 * kHistogramBins;
  EXPECT_DOUBLE_EQ(percentile_threshold(z, 50), 1);
  EXPECT_DOUBLE_EQ(percentile_threshold(z, 75), 1024);
}

TEST(Calibrator, EntropyKeepsAUniformRangeWhole) {
  // Uniform data: merging bins loses nothing, clipping folds mass into the last bin: the whole range.
  EXPECT_DOUBLE_EQ(entropy_threshold(uniform(), 128), kHistogramBins);
}

TEST(Calibrator, EntropyCutsAnOutlier) {
  Histogram h = bulk_and_outlier(1000);
  double t = entropy_threshold(h, 128);
  // Far below the outlier at 2048, and not inside the bulk (which is 1/e per 32 bins).
  EXPECT_LT(t, 1024);
  EXPECT_GT(t, 128);
  // Twice the levels (a non-negative tensor's uint8): no larger a threshold is needed for the same loss.
  EXPECT_LE(entropy_threshold(h, 256), kHistogramBins);
  EXPECT_EQ(entropy_threshold(Histogram(0.0), 128), 0);
}

TEST(Calibrator, EntropyOfAReluOutputIgnoresItsZeros) {
  // max(N(0, 1), 0): half exact zeros. Counted in bin 0 they pulled the threshold to ~0.37 of the max;
  // apart, it lands near 4 sigma (TensorRT's thresholds on such layers), well above 0.6 of the max.
  std::mt19937_64 rng(3);
  std::normal_distribution<float> n;
  std::vector<float> x(200000);
  for (auto& v : x) v = std::max(0.f, n(rng));
  float mx = *std::max_element(x.begin(), x.end());
  Histogram h(mx);
  h.add(x.data(), static_cast<int64_t>(x.size()));
  EXPECT_GT(h.zeros, 90000);
  double t = entropy_threshold(h, 256);
  EXPECT_GT(t, 0.6 * mx);
  EXPECT_LT(t, mx);
}

TEST(Calibrator, MseKeepsAUniformRangeWhole) {
  // Clipping uniform data costs far more than the finer rounding it buys.
  EXPECT_GE(mse_threshold(uniform(), 256), 0.99 * kHistogramBins);
}

TEST(Calibrator, MseCutsARareOutlierOfALargeBulk) {
  // Rounding the ~3e7 bulk values on 2048 / 255 steps costs more than clipping one value.
  Histogram h = bulk_and_outlier(1e6);
  double t = mse_threshold(h, 256);
  EXPECT_LT(t, 1024);
  EXPECT_GT(t, 64);
  // With few bulk values the outlier dominates: keep it.
  Histogram small = bulk_and_outlier(0.001);
  EXPECT_GE(mse_threshold(small, 256), 0.9 * kHistogramBins);
}

TEST(Calibrator, RangeFromAThresholdKeepsTheSign) {
  TensorStats s;
  const float x[] = {0.f, 1.f, 2.f, 100.f};
  s.add_range(x, 4);
  s.hist = Histogram(100.0);
  s.hist.add(x, 4);
  // 3 of 4 values lie up to 2, in bin 40 of 2048 over [0, 100]: t is that bin's upper edge.
  const double t = 41 * 100.0 / kHistogramBins;
  Range r = calibrated_range(s, Calibrator::kPercentile, 75);
  EXPECT_EQ(r.min, 0);
  EXPECT_NEAR(r.max, t, 1e-9);
  TensorStats n;
  const float y[] = {-100.f, -1.f, 1.f, 2.f};
  n.add_range(y, 4);
  n.hist = Histogram(100.0);
  n.hist.add(y, 4);
  r = calibrated_range(n, Calibrator::kPercentile, 75);
  EXPECT_NEAR(r.min, -t, 1e-9);  // clipped at -t
  EXPECT_EQ(r.max, 2.0);         // the observed max is inside t
}

// TensorRT's KL search written the obvious way (every bucket's sum and non-empty bins counted anew), to
// check the prefix-sum one against.
double naive_entropy_threshold(const Histogram& h, int levels, int first) {
  const int bins = static_cast<int>(h.counts.size());
  const std::vector<double>& c = h.counts;
  double total = 0;
  for (double v : c) total += v;
  double best_kl = INFINITY;
  int best = bins;
  for (int i = first; i <= bins; ++i) {
    double beyond = 0, kept = 0;
    for (int k = 0; k < bins; ++k) (k < i ? kept : beyond) += c[static_cast<size_t>(k)];
    if (kept <= 0) continue;
    std::vector<double> q(static_cast<size_t>(i), 0);
    for (int j = 0; j < levels; ++j) {
      int start = j * i / levels, stop = (j + 1) * i / levels, nz = 0;
      double sum = 0;
      for (int k = start; k < stop; ++k) sum += c[static_cast<size_t>(k)], nz += c[static_cast<size_t>(k)] > 0;
      for (int k = start; k < stop; ++k) q[static_cast<size_t>(k)] = c[static_cast<size_t>(k)] > 0 ? sum / nz : 0;
    }
    double kl = 0;
    for (int k = 0; k < i; ++k) {
      double p = (c[static_cast<size_t>(k)] + (k == i - 1 ? beyond : 0)) / total;
      if (p <= 0) continue;
      double qq = q[static_cast<size_t>(k)] > 0 ? q[static_cast<size_t>(k)] / kept : 1e-12;
      kl += p * std::log(p / qq);
    }
    if (kl < best_kl) best_kl = kl, best = i;
  }
  return h.bin_width() * best;
}

TEST(Calibrator, EntropyMatchesTheNaiveSearchOnRandomHistograms) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    const int bins = 100 + static_cast<int>(rng() % 211), levels = 8 + static_cast<int>(rng() % 41);  // odd sizes
    Histogram h(3.5, bins);
    std::exponential_distribution<double> e(1.0);
    for (int k = 0; k < bins; ++k)
      h.counts[static_cast<size_t>(k)] = rng() % 5 == 0 ? 0 : std::floor(1000 * std::exp(-k / 20.0) * e(rng));
    h.counts[static_cast<size_t>(bins - 1 - static_cast<int>(rng() % 7))] += 3;  // a far outlier
    SCOPED_TRACE("trial " + std::to_string(trial) + ": bins " + std::to_string(bins) + ", levels " +
                 std::to_string(levels));
    EXPECT_DOUBLE_EQ(entropy_threshold(h, levels), naive_entropy_threshold(h, levels, levels));
  }
}

// A mobilenet_v2_fmnist-like ReLU6 output (features.1's depthwise conv: 4.4M non-zero values, nearly
// exponential with mean 0.46, max 6, and spikes where the images' flat background makes one value many
// times): TensorRT's search clips it right after a spike (1.10 there, 4.2% of the values saturated;
// KL charges clipped values only their probability); with the clipped share bounded, at most that share
// lies beyond the threshold.
TEST(Calibrator, EntropyClipsAtMostTheAllowedShare) {
  Histogram h(6.0);
  const double bw = h.bin_width();
  for (int k = 0; k < kHistogramBins; ++k)
    h.counts[static_cast<size_t>(k)] = std::floor(4.4e6 * bw / 0.46 * std::exp(-(k + 0.5) * bw / 0.46));
  for (int k : {3, 9, 186, 374}) h.counts[static_cast<size_t>(k)] += 5e4;
  h.counts.back() += 1;  // the max
  h.zeros = 4e6;
  double total = h.zeros;
  for (double v : h.counts) total += v;
  auto clipped = [&](double t) {
    double beyond = 0;
    for (int k = static_cast<int>(std::lround(t / h.bin_width())); k < kHistogramBins; ++k)
      beyond += h.counts[static_cast<size_t>(k)];
    return beyond / total;
  };
  const double plain = entropy_threshold(h, 256), bounded = entropy_threshold(h, 256, 1e-5);
  EXPECT_LT(plain, 4.0);
  EXPECT_GT(clipped(plain), 1e-4);  // the failure the bound is for
  EXPECT_LE(clipped(bounded), 1e-5);
  EXPECT_GT(bounded, plain);
  EXPECT_LE(bounded, h.amax);
  // The bound only moves the search's start: where TensorRT's answer clips less, it stands.
  Histogram u = uniform();
  EXPECT_DOUBLE_EQ(entropy_threshold(u, 128, 1e-5), kHistogramBins);
  Histogram o = bulk_and_outlier(1000);  // the outlier is 3e-5 of the values: clipping it is allowed
  EXPECT_DOUBLE_EQ(entropy_threshold(o, 128, 1e-4), entropy_threshold(o, 128));
}

TEST(Calibrator, HistogramAddMatchesOneValueAtATime) {
  // Sizes around the 1024-value block, values of both signs, zeros, beyond amax, NaN and Inf.
  std::mt19937_64 rng(5);
  std::normal_distribution<float> n(0.f, 2.f);
  for (int64_t size : {1, 7, 1023, 1024, 1025, 3001}) {
    std::vector<float> x(static_cast<size_t>(size));
    for (auto& v : x) {
      uint64_t r = rng() % 50;
      v = r == 0 ? 0.f : r == 1 ? NAN : r == 2 ? -INFINITY : r == 3 ? 1e9f : n(rng);
    }
    Histogram h(5.0, 37);
    h.add(x.data(), size);
    std::vector<double> want(37, 0);
    double zeros = 0;
    for (float v : x) {
      double a = std::fabs(static_cast<double>(v));
      if (!std::isfinite(a)) continue;
      if (a == 0) {
        zeros += 1;
        continue;
      }
      want[static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(a * 37 / 5.0), 36))] += 1;
    }
    EXPECT_EQ(h.zeros, zeros) << size;
    EXPECT_EQ(h.counts, want) << size;
  }
}

}  // namespace
}  // namespace kiln::quant
