// INT8 post-training calibration: the statistics kept per activation tensor over the calibration
// batches, the calibrators that turn them into a range, and the quantization parameters of a range.
//
// Every calibrator but minmax works on a histogram of |x| over [0, amax] (amax: the largest |x| of
// the first pass over the data), 2048 bins as TensorRT's calibrators use, and returns a threshold
// t <= amax; the tensor's range is then [max(min, -t), min(max, t)]:
//   minmax      the observed [min, max] (ONNX Runtime's default).
//   entropy     TensorRT's KL-divergence calibrator (Migacz, "8-bit Inference with TensorRT", GTC
//               2017): the t whose quantized distribution (the bins up to t merged into `levels`
//               buckets, the mass beyond t folded into the last bin) loses the least information,
//               KL(P || Q), over t from `levels` bins to all of them, except that the search starts no
//               lower than the t clipping kEntropyMaxClippedShare of the values (as NVIDIA's
//               pytorch-quantization lets its start_bin be raised). KL charges a clipped value only its
//               probability, never its distance from t: on mobilenet_v2_fmnist it clipped a ReLU6 output
//               (max 6.0) at 1.10, saturating 4.2% of its values, and 4.1% of the test images changed
//               class; resnet18_fmnist lost 0.2 points of agreement the same way. ONNX Runtime's
//               EntropyCalibrater has the opposite answer: its defaults (128 histogram bins, 128
//               quantized bins) leave one candidate, the whole range, so its entropy is its minmax
//               (calibrate.py: quantize_static's one collect_data call makes one 128-bin histogram
//               over [-max|x|, max|x|]; get_entropy_threshold loops over range(64, 65) and clips the
//               one threshold, the histogram's edges, to [min, max]).
//   percentile  the t below which `percentile` % of the |x| values lie (--calib-percentile).
//   mse         the t minimizing the expected squared error of quantizing the histogram's values
//               (rounding inside the range plus clipping beyond it) on `levels` - 1 steps.
// `levels` is 256 for a tensor with no negative values (uint8 over [0, t]), else 128 (the positive
// half of the 256 levels of an asymmetric uint8 over [-t, t], as TensorRT's int8).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace kiln::quant {

enum class Calibrator { kMinMax, kEntropy, kPercentile, kMse };
Result<Calibrator> calibrator_from_name(const std::string& name);  // minmax, entropy, percentile, mse
const char* calibrator_name(Calibrator c);
bool uses_histogram(Calibrator c);

constexpr int kHistogramBins = 2048;

// Counts of |x| in kHistogramBins equal bins over [0, amax]; values beyond amax land in the last bin.
// Exact zeros are counted apart: every range represents 0 exactly, so they cost no information and no
// error whatever the threshold, yet in bin 0 they would dominate (half of a ReLU's outputs), and the
// entropy calibrator, spreading each bucket's mass over its bins, would shrink the threshold until bin 0
// is a bucket of its own (a quarter of the range on resnet18's ReLUs, 12 points of top-1 lost).
// The percentile calibrator counts them (they lie below any threshold).
struct Histogram {
  double amax = 0;
  double zeros = 0;
  std::vector<double> counts;
  explicit Histogram(double amax = 0, int bins = kHistogramBins) : amax(amax), counts(static_cast<size_t>(bins), 0) {}
  double bin_width() const { return counts.empty() ? 0 : amax / static_cast<double>(counts.size()); }
  void add(const float* x, int64_t n);
};

// The |x| thresholds of the histogram calibrators (see the top of the file).
// The entropy calibrator clips at most this share of a tensor's values (zeros included): ONNX Runtime's
// default percentile calibrator (99.999) clips up to 1e-5, and on both Fashion-MNIST models kept their
// FP32 agreement (README table).
constexpr double kEntropyMaxClippedShare = 1e-5;
// max_clipped_share 0: TensorRT's search from `levels` bins.
double entropy_threshold(const Histogram& h, int levels, double max_clipped_share = 0);
double percentile_threshold(const Histogram& h, double percentile);
double mse_threshold(const Histogram& h, int levels);

// A tensor's statistics: min/max from the first pass, the histogram (histogram calibrators) from a second.
struct TensorStats {
  double min = 0, max = 0;
  bool seen = false;
  int64_t count = 0;
  Histogram hist;
  void add_range(const float* x, int64_t n);
};

struct Range {
  double min = 0, max = 0;
};
// The calibrated range of a tensor from its statistics.
Range calibrated_range(const TensorStats& s, Calibrator c, double percentile);

// Asymmetric uint8 quantization of an activation range (as ONNX Runtime's quantize_static, bit for bit):
// the range is widened to hold 0, scale = (max - min) / 255, zero point = round(-min / scale) in [0, 255]
// (half to even); an empty range (all zeros) gets scale 1, zero point 0.
struct QuantParams {
  float scale = 1;
  int32_t zero_point = 0;
};
QuantParams uint8_params(Range r);

}  // namespace kiln::quant
