// kiln compare: statistics of one output (errors, percentiles, histogram, worst elements,
// classifier checks).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "tools/compare_internal.h"

namespace kiln::tools::compare {

Result<double> tolerance_for(const std::vector<std::string>& specs, const std::string& name, double dflt) {
  double global = dflt, mine = NAN;
  for (const auto& s : specs) {
    size_t c = s.rfind(':');
    std::string num = c == std::string::npos ? s : s.substr(c + 1);
    char* end = nullptr;
    double v = std::strtod(num.c_str(), &end);
    if (num.empty() || *end != '\0' || !(v >= 0))
      return InvalidArgument("tolerance '", s, "' is not VALUE or NAME:VALUE");
    if (c == std::string::npos)
      global = v;
    else if (s.substr(0, c) == name)
      mine = v;
  }
  return std::isnan(mine) ? global : mine;
}

// An engine's outputs carry the rounding of the least precise format its layers compute in. One
// rounding is the unit roundoff u = 2^-(mantissa bits + 1): FP16 and TF32 keep 10 bits (u = 4.9e-4),
// BF16 7 (u = 3.9e-3), FP32 23. Rounding errors of a network's stored activations accumulate roughly
// as a random walk over its depth (sqrt(100 layers) = 10 u) and normalizations and residual sums
// amplify them again, so a whole network is given 20 u, atol and rtol alike: 1e-2 for FP16/TF32,
// 8e-2 for BF16. For scale: ONNX Runtime's op tests (onnxruntime/test/providers/checkers.cc,
// DefaultTolerance) allow one FP16 op atol 2.5e-3 / rtol 1e-3 (about 5 u and 2 u) and one BF16 op
// atol 2e-2 / rtol 1e-2; Polygraphy keeps its 1e-5 defaults whatever the precision and leaves
// FP16 to --atol/--rtol (1e-3 is the common choice in its examples, for single ops and small nets).
// INT8's error scales with each tensor's calibrated range, which the output's values do not tell:
// no default follows from the format, so INT8 layers only add a note.
DefaultTolerances default_tolerances(const std::vector<const detail::EngineImpl*>& engines) {
  int rank = 0;  // 0 fp32, 1 tf32, 2 fp16, 3 bf16
  bool int8 = false;
  for (const detail::EngineImpl* e : engines) {
    if (!e) continue;
    bool tf32 = e->built_for.tf32 && e->built_for.device.kind == DeviceKind::kCUDA;
    for (const auto& l : e->layers) {
      if (l.precision == "bf16") rank = std::max(rank, 3);
      if (l.precision == "fp16") rank = std::max(rank, 2);
      if (l.precision == "fp32" && tf32) rank = std::max(rank, 1);
      int8 |= l.precision == "int8";
    }
  }
  DefaultTolerances t;
  static const char* kFormats[] = {"fp32", "tf32", "fp16", "bf16"};
  static const double kTol[] = {0, 1e-2, 1e-2, 8e-2};
  t.format = kFormats[rank];
  if (rank > 0) t.atol = t.rtol = kTol[rank];
  if (int8)
    t.note =
        "INT8 layers: their error scales with each tensor's calibrated range, which these defaults do not "
        "model; give --atol/--rtol, or judge by the classifier and detection checks";
  return t;
}

std::string fmt(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

namespace {

std::string index_str(const Dims& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    int64_t d = std::max<int64_t>(shape[k], 1);
    idx[k] = flat % d;
    flat /= d;
  }
  std::string s = "[";
  for (size_t k = 0; k < idx.size(); ++k) s += (k ? "," : "") + std::to_string(idx[k]);
  return s + "]";
}

double quantile(std::vector<double>& v, double q) {  // v gets partially reordered
  if (v.empty()) return 0;
  size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

}  // namespace

Stats compute_stats(const Tensor& ref, const Tensor& test, double atol, double rtol, double rel_floor,
                    const std::string& stat, int worst_n) {
  Stats s;
  s.atol = atol;
  s.rtol = rtol;
  if (ref.shape() != test.shape()) {
    s.why = "shape " + dims_str(test.shape()) + " differs from the reference's " + dims_str(ref.shape());
    return s;
  }
  bool ref_str = ref.dtype() == DataType::kString, test_str = test.dtype() == DataType::kString;
  if (ref_str != test_str) {
    s.why = "dtype class differs";
    return s;
  }
  s.comparable = true;
  s.n = ref.numel();
  if (ref_str) {
    for (int64_t i = 0; i < s.n; ++i) s.outside += ref.strings()[i] != test.strings()[i];
    s.pass = s.outside == 0;
    if (!s.pass) s.why = std::to_string(s.outside) + " strings differ";
    return s;
  }
  std::vector<double> abs_err, rel_err;
  std::vector<std::pair<double, int64_t>> worst;
  abs_err.reserve(static_cast<size_t>(s.n));
  rel_err.reserve(static_cast<size_t>(s.n));
  double sum_abs = 0, sum_rel = 0;
  for (int64_t i = 0; i < s.n; ++i) {
    double r = ref.get_f64(i), t = test.get_f64(i);
    s.ref_nan += std::isnan(r);
    s.test_nan += std::isnan(t);
    s.ref_inf += std::isinf(r);
    s.test_inf += std::isinf(t);
    if (!std::isfinite(r) || !std::isfinite(t)) {
      bool same = (std::isnan(r) && std::isnan(t)) || r == t;
      if (!same) {
        ++s.nonfinite_mismatch;
        ++s.outside;
        worst.emplace_back(INFINITY, i);
      }
      continue;
    }
    double a = std::fabs(t - r), rel = a / std::max(std::fabs(r), rel_floor);
    abs_err.push_back(a);
    rel_err.push_back(rel);
    sum_abs += a;
    sum_rel += rel;
    s.max_abs = std::max(s.max_abs, a);
    s.max_rel = std::max(s.max_rel, rel);
    if (a > atol && rel > rtol) ++s.outside;
    if (a == 0) ++s.zero_err;
    worst.emplace_back(a, i);
  }
  size_t m = abs_err.size();
  if (m) {
    s.mean_abs = sum_abs / static_cast<double>(m);
    s.mean_rel = sum_rel / static_cast<double>(m);
    // Histogram of log10 |err| over the nonzero errors, half-decade bins from 1e-10 to the max.
    int hi = std::max(-9, static_cast<int>(std::ceil(2 * std::log10(std::max(s.max_abs, 1e-10)))));
    for (int e = -20; e <= hi; ++e) s.hist_edges.push_back(e / 2.0);
    if (s.hist_edges.size() < 2) s.hist_edges.push_back(s.hist_edges.back() + 0.5);
    s.hist_counts.assign(s.hist_edges.size() - 1, 0);
    for (double a : abs_err) {
      if (a == 0) continue;
      double l = std::log10(a);
      size_t b = l <= s.hist_edges.front()
                     ? 0
                     : std::min(s.hist_counts.size() - 1, static_cast<size_t>((l - s.hist_edges.front()) * 2));
      ++s.hist_counts[b];
    }
    for (auto [label, q] :
         std::vector<std::pair<const char*, double>>{{"p50", 0.5}, {"p90", 0.9}, {"p99", 0.99}, {"p99.9", 0.999}})
      s.percentiles.emplace_back(label, quantile(abs_err, q));
    s.percentiles.emplace_back("max", s.max_abs);
    s.median_abs = s.percentiles[0].second;
    s.median_rel = quantile(rel_err, 0.5);
  }
  size_t k = std::min(worst.size(), static_cast<size_t>(std::max(worst_n, 0)));
  std::partial_sort(
      worst.begin(), worst.begin() + static_cast<std::ptrdiff_t>(k), worst.end(),
      [](const auto& x, const auto& y) { return x.first > y.first || (x.first == y.first && x.second < y.second); });
  for (size_t j = 0; j < k; ++j) {
    int64_t i = worst[j].second;
    double r = ref.get_f64(i), t = test.get_f64(i);
    s.worst.push_back({{"flat", i},
                       {"index", index_str(ref.shape(), i)},
                       {"ref", std::isfinite(r) ? json(r) : json(fmt(r))},
                       {"test", std::isfinite(t) ? json(t) : json(fmt(t))},
                       {"abs_err", std::isfinite(worst[j].first) ? json(worst[j].first) : json("inf")}});
  }
  if (s.nonfinite_mismatch) {
    s.why = std::to_string(s.nonfinite_mismatch) + " NaN/Inf element(s) differ";
  } else if (stat == "elemwise") {
    s.pass = s.outside == 0;
    if (!s.pass) s.why = "elements exceed both atol and rtol";
  } else {
    double a = stat == "max" ? s.max_abs : stat == "mean" ? s.mean_abs : s.median_abs;
    double r = stat == "max" ? s.max_rel : stat == "mean" ? s.mean_rel : s.median_rel;
    s.pass = a <= atol || r <= rtol;
    if (!s.pass) s.why = stat + " abs err " + fmt(a) + " > atol and " + stat + " rel err " + fmt(r) + " > rtol";
  }
  return s;
}

json stats_json(const Stats& s) {
  json j = {{"comparable", s.comparable},
            {"pass", s.pass},
            {"why", s.why},
            {"elements", s.n},
            {"nan", {{"ref", s.ref_nan}, {"test", s.test_nan}}},
            {"inf", {{"ref", s.ref_inf}, {"test", s.test_inf}}},
            {"nonfinite_mismatch", s.nonfinite_mismatch},
            {"outside_tolerance", s.outside},
            {"abs_err", {{"max", s.max_abs}, {"mean", s.mean_abs}, {"median", s.median_abs}}},
            {"rel_err", {{"max", s.max_rel}, {"mean", s.mean_rel}, {"median", s.median_rel}}},
            {"atol", s.atol},
            {"rtol", s.rtol},
            {"zero_err", s.zero_err},
            {"worst", s.worst}};
  json p = json::object();
  for (const auto& [k, v] : s.percentiles) p[k] = v;
  j["abs_err_percentiles"] = p;
  j["histogram"] = {{"log10_edges", s.hist_edges}, {"counts", s.hist_counts}, {"exact", s.zero_err}};
  return j;
}

json classifier_json(const Tensor& ref, const Tensor& test, int k) {
  int64_t c = ref.dim(ref.rank() - 1), rows = c ? ref.numel() / c : 0;
  int64_t agree = 0, in_topk = 0;
  k = static_cast<int>(std::min<int64_t>(std::max(k, 1), c));
  json flipped = json::array();
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> order(static_cast<size_t>(c));
    std::iota(order.begin(), order.end(), 0);
    auto top = [&](const Tensor& t) {
      std::vector<int64_t> o = order;
      std::partial_sort(o.begin(), o.begin() + k, o.end(), [&](int64_t a, int64_t b) {
        double x = t.get_f64(r * c + a), y = t.get_f64(r * c + b);
        return x > y || (x == y && a < b);
      });
      o.resize(static_cast<size_t>(k));
      return o;
    };
    auto rt = top(ref), tt = top(test);
    agree += rt[0] == tt[0];
    in_topk += std::find(tt.begin(), tt.end(), rt[0]) != tt.end();
    if (rt[0] != tt[0] && flipped.size() < 20) flipped.push_back({{"row", r}, {"ref", rt[0]}, {"test", tt[0]}});
  }
  return {{"rows", rows},
          {"classes", c},
          {"k", k},
          {"top1_agree", agree},
          {"ref_top1_in_test_topk", in_topk},
          {"flipped", rows - agree},
          {"flipped_rows", flipped}};
}

}  // namespace kiln::tools::compare
