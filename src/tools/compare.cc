// kiln compare: runs the same inputs through two runners (the reference interpreter on the
// unoptimized model, an engine built with kiln build's options or loaded from a .kiln file, or
// saved framework outputs) and compares every output; finds the first engine layer that leaves
// tolerance with fusions still on; writes and replays repro bundles.
//
// Tolerances follow Polygraphy: an element (elemwise) or a statistic (max/mean/median) fails only
// when both its absolute error exceeds atol and its relative error exceeds rtol, with the relative
// error |test - ref| / max(|ref|, rel_floor).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/npy.h"
#include "engine/engine_impl.h"
#include "ir/rewrite.h"
#include "onnx/importer.h"
#include "ops/deadline.h"
#include "ops/interpreter.h"
#include "ops/kiln_layout.h"
#include "tools/commands.h"
#include "tools/inputs.h"

namespace kiln::tools {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct CompareOptions {
  std::string model;
  std::string ref = "onnx";     // onnx | FILE.npz (framework outputs)
  std::string test = "engine";  // engine | onnx
  std::string engine_file;      // test this .kiln instead of building in memory
  // Build options (as kiln build).
  std::string min_shapes, opt_shapes, max_shapes, build_shapes;
  std::vector<std::string> disabled_passes;
  double workspace_mb = 1024;
  // Inputs.
  std::string inputs;                    // .npz or a directory of .npy / .pb
  std::vector<std::string> input_files;  // NAME=FILE
  std::string shapes;                    // shapes of generated inputs
  uint64_t seed = 0;
  std::vector<std::string> input_ranges;  // NAME:lo,hi
  bool random_inputs = false;             // --random-inputs: fill inputs the files lack
  std::string save_inputs;
  double deadline_s = 0;  // --deadline: per run (reference, engine, divergence search)
  // Checks.
  std::vector<std::string> atol, rtol;  // VALUE or NAME:VALUE
  double rel_floor = 1e-6;
  std::string check_error_stat = "elemwise";
  int top_k = 5;
  std::vector<std::string> classifiers;
  std::vector<std::string> thresholds;  // NAME:VALUE
  int worst = 10;
  bool find_divergence = false;
  // Reports.
  std::string json_path, html_path, save_failure, replay;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(CompareOptions, model, ref, test, engine_file, min_shapes, opt_shapes,
                                                max_shapes, build_shapes, disabled_passes, workspace_mb, inputs,
                                                input_files, shapes, seed, input_ranges, random_inputs, save_inputs,
                                                atol, rtol, rel_floor, check_error_stat, top_k, classifiers, thresholds,
                                                worst, find_divergence)

constexpr double kDefaultAtol = 1e-4, kDefaultRtol = 1e-3;
constexpr const char* kPercentiles[] = {"p50", "p90", "p99", "p99.9", "max"};

// "VALUE" applies to every output, "NAME:VALUE" to one (the last colon splits).
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

// ---- statistics of one output

struct Stats {
  bool comparable = false;  // same dtype class and shape
  int64_t n = 0, ref_nan = 0, ref_inf = 0, test_nan = 0, test_inf = 0, nonfinite_mismatch = 0, outside = 0;
  double max_abs = 0, mean_abs = 0, median_abs = 0, max_rel = 0, mean_rel = 0, median_rel = 0;
  std::vector<std::pair<std::string, double>> percentiles;
  int64_t zero_err = 0;              // elements with exactly no error
  std::vector<double> hist_edges;    // log10(|err|) bin edges
  std::vector<int64_t> hist_counts;  // one per bin (edges.size() - 1)
  json worst = json::array();
  double atol = 0, rtol = 0;
  bool pass = false;
  std::string why;
};

std::string fmt(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

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

// Classifier checks over the last axis: top-1 agreement, ref's top-1 within test's top-k, flips.
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

// ---- runners and inputs

struct Runners {
  ir::Model model;                             // unoptimized, for the reference
  std::shared_ptr<detail::EngineImpl> engine;  // built or loaded, when the test side is an engine
  std::shared_ptr<Engine> engine_holder;
  json build;  // build record
};

// Inputs through the shared loader (tools/inputs.h); `info` records where they came from.
Status compare_inputs(const CompareOptions& o, const ir::Graph& g, std::map<std::string, ops::Value>& inputs,
                      json& info) {
  InputOptions in;
  in.inputs = o.inputs;
  in.files = o.input_files;
  in.shapes = o.shapes;
  in.ranges = o.input_ranges;
  in.seed = o.seed;
  in.random = o.random_inputs;
  KILN_ASSIGN_OR_RETURN(LoadedInputs loaded, load_inputs(in, g));
  inputs = std::move(loaded.values);
  if (!o.inputs.empty()) info["source"] = o.inputs;
  info["generated"] = loaded.generated;
  info["seed"] = o.seed;
  json list = json::array();
  for (const auto& [name, v] : inputs) list.push_back({{"name", name}, {"summary", summarize(name, v)}});
  info["values"] = list;
  return Status::Ok();
}

Result<Runners> make_runners(const CompareOptions& o, json& build) {
  Runners r;
  KILN_ASSIGN_OR_RETURN(r.model, onnx_import::load_model(o.model));
  KILN_RETURN_IF_ERROR(ops::check_supported(*r.model.graph));
  if (o.test != "engine" && !o.find_divergence) return r;
  if (!o.engine_file.empty()) {
    try {
      r.engine_holder = Engine::load(o.engine_file);
    } catch (const Error& e) {
      return detail_status(e);
    }
    r.engine = std::const_pointer_cast<detail::EngineImpl>(
        std::shared_ptr<const detail::EngineImpl>(r.engine_holder, &r.engine_holder->impl()));
    build = r.engine->build;
    build["engine_file"] = o.engine_file;
    return r;
  }
  BuilderConfig cfg;
  KILN_ASSIGN_OR_RETURN(cfg.profiles, profiles_from_flags(o.min_shapes, o.opt_shapes, o.max_shapes, o.build_shapes));
  cfg.workspace_bytes = static_cast<size_t>(o.workspace_mb * 1024 * 1024);
  cfg.disabled_passes = o.disabled_passes;
  ir::Model copy = r.model;
  copy.graph = ir::deep_copy(*r.model.graph);
  KILN_ASSIGN_OR_RETURN(r.engine, detail::build_engine(std::move(copy), cfg));
  build = r.engine->build;
  build["engine_file"] = nullptr;
  return r;
}

// ---- first divergence

struct LayerRecord {
  json j;
  double max_abs = -1;  // of its outputs, -1 when none is observable
  bool fail = false;
};

json find_divergence(const CompareOptions& o, const Runners& r, const std::map<std::string, ops::Value>& inputs,
                     Status* st) {
  // Every reference tensor by name (the unoptimized graph keeps the ONNX names).
  std::map<std::string, Tensor> ref;
  ops::Interpreter interp(r.model.graph);
  interp.on_node = [&](const ir::Node& n, const std::vector<ops::Value>& outs) {
    for (size_t i = 0; i < outs.size() && i < n.outputs.size(); ++i)
      if (outs[i].is_tensor() && !n.outputs[i].empty()) ref[n.outputs[i]] = outs[i].tensor;
  };
  auto ro = interp.run(inputs);
  if (!ro.ok()) {
    *st = ro.status();
    return {};
  }
  const detail::EngineImpl& e = *r.engine;
  std::map<std::string, const detail::LayerInfo*> info;
  for (const auto& l : e.layers) info[l.name] = &l;
  std::map<std::string, json> value_err;  // engine value -> {observable, max_abs, pass}
  for (const auto& [name, v] : inputs) value_err[name] = {{"kind", "graph input"}, {"max_abs", 0.0}, {"pass", true}};
  std::vector<LayerRecord> layers;
  std::string precision = e.build.contains("config") ? e.build["config"].value("precision", "fp32") : "fp32";
  auto eo = detail::run_engine_observed(e, inputs, [&](const ir::Node& n, const std::vector<ops::Value>& outs) {
    LayerRecord rec;
    auto it = info.find(n.name);
    json sources = ir::sources_of(n);
    rec.j = {{"index", layers.size()},
             {"name", n.name},
             {"op_type", (n.domain.empty() ? "" : n.domain + ".") + n.op_type},
             {"kernel", it != info.end() ? it->second->kernel : "reference"},
             {"precision", precision},
             {"sources", sources},
             {"fused", sources.size() > 1}};
    json ins = json::array();
    for (const auto& in : n.inputs) {
      if (in.empty()) continue;
      if (ir::is_constant(*e.model.graph, in)) continue;
      auto ve = value_err.find(in);
      json x = ve != value_err.end() ? ve->second : json{{"kind", "not observable"}};
      x["name"] = in;
      ins.push_back(x);
    }
    json os = json::array();
    for (size_t i = 0; i < outs.size() && i < n.outputs.size(); ++i) {
      const std::string& name = n.outputs[i];
      if (name.empty()) continue;
      json x = {{"name", name}};
      auto rt = ref.find(name);
      const Tensor* got = outs[i].is_tensor() ? &outs[i].tensor : nullptr;
      // A channel-blocked layer (layout pass) is checked as the plain value it stands for.
      Tensor unblocked;
      std::string ref_name = name;
      if (rt == ref.end() && got && n.attr("kiln.plain_value") && got->rank() == 5) {
        auto u = ops::from_channel_blocked(*got, n.attr_int("kiln.plain_channels", -1));
        if (u.ok()) {
          unblocked = std::move(u).value();
          got = &unblocked;
          ref_name = n.attr_string("kiln.plain_value", "");
          rt = ref.find(ref_name);
          x["as"] = ref_name;
        }
      }
      if (!got || rt == ref.end()) {
        x["kind"] = "not observable";
        x["why"] = rt == ref.end() ? "no ONNX tensor has this name (internal to a rewrite)" : "not a tensor";
      } else {
        auto atol = tolerance_for(o.atol, ref_name, kDefaultAtol), rtol = tolerance_for(o.rtol, ref_name, kDefaultRtol);
        Stats s = compute_stats(rt->second, *got, atol.ok() ? atol.value() : kDefaultAtol,
                                rtol.ok() ? rtol.value() : kDefaultRtol, o.rel_floor, o.check_error_stat, 3);
        x["kind"] = "observed";
        x["max_abs"] = s.max_abs;
        x["mean_abs"] = s.mean_abs;
        x["pass"] = s.pass;
        x["why"] = s.why;
        x["worst"] = s.worst;
        rec.max_abs = std::max(rec.max_abs, s.max_abs);
        rec.fail |= !s.pass;
      }
      value_err[name] = x;
      os.push_back(x);
    }
    rec.j["inputs"] = ins;
    rec.j["outputs"] = os;
    rec.j["max_abs"] = rec.max_abs;
    rec.j["pass"] = !rec.fail;
    layers.push_back(std::move(rec));
  });
  if (!eo.ok()) {
    *st = eo.status();
    return {};
  }
  json out = {{"layers", json::array()}, {"first", nullptr}};
  int first = -1;
  for (size_t i = 0; i < layers.size(); ++i) {
    out["layers"].push_back(layers[i].j);
    if (first < 0 && layers[i].fail) first = static_cast<int>(i);
  }
  int observed = 0;
  for (const auto& l : layers) observed += l.max_abs >= 0;
  out["observed_layers"] = observed;
  out["total_layers"] = layers.size();
  if (first >= 0) {
    json f = layers[static_cast<size_t>(first)].j;
    bool inputs_ok = true, inputs_observable = true;
    for (const auto& in : f["inputs"]) {
      if (in.value("kind", "") == "not observable")
        inputs_observable = false;
      else if (!in.value("pass", true))
        inputs_ok = false;
    }
    // Layers since the last observed passing layer whose outputs could not be checked.
    json hidden = json::array();
    for (int i = first - 1; i >= 0 && layers[static_cast<size_t>(i)].max_abs < 0; --i)
      hidden.push_back(layers[static_cast<size_t>(i)].j["name"]);
    f["verdict"] = inputs_ok && inputs_observable
                       ? "introduced by this layer: its inputs are within tolerance, its output is not"
                   : inputs_observable ? "its inputs already differ"
                                       : "some inputs are not observable: the divergence may start in the "
                                         "unobservable layers before it";
    f["unobservable_before"] = hidden;
    out["first"] = f;
  }
  return out;
}

// ---- reports

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string svg_histogram(const json& out, int id) {
  const json& h = out["stats"]["histogram"];
  std::vector<int64_t> counts = h["counts"].get<std::vector<int64_t>>();
  std::vector<double> edges = h["log10_edges"].get<std::vector<double>>();
  int64_t exact = h["exact"].get<int64_t>();
  size_t nb = counts.size() + 1;  // first bar: exact matches
  int64_t mx = exact;
  for (auto c : counts) mx = std::max(mx, c);
  const int W = 720, H = 260, L = 60, B = 50, T = 20;
  double bw = static_cast<double>(W - L - 10) / static_cast<double>(std::max<size_t>(nb, 1));
  std::ostringstream s;
  s << "<svg id=\"histogram-" << id << "\" class=\"histogram\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W
    << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H << "\">";
  s << "<rect x=\"0\" y=\"0\" width=\"" << W << "\" height=\"" << H << "\" fill=\"#fff\"/>";
  s << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - 10 << "\" y2=\"" << H - B
    << "\" stroke=\"#333\"/><line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << H - B
    << "\" stroke=\"#333\"/>";
  double atol = out["stats"].value("atol", 0.0);
  for (size_t i = 0; i < nb; ++i) {
    int64_t c = i == 0 ? exact : counts[i - 1];
    double bh = mx ? (H - B - T) * std::log1p(static_cast<double>(c)) / std::log1p(static_cast<double>(mx)) : 0;
    double x = L + static_cast<double>(i) * bw;
    bool over = i > 0 && atol > 0 && edges[i - 1] >= std::log10(atol);
    std::string label = i == 0 ? "0" : "1e" + fmt(edges[i - 1]);
    s << "<rect x=\"" << x + 1 << "\" y=\"" << (H - B) - bh << "\" width=\"" << std::max(bw - 2, 1.0) << "\" height=\""
      << bh << "\" fill=\"" << (over ? "#d9534f" : "#4a90d9") << "\"><title>|err| "
      << (i == 0 ? "= 0" : "in [" + label + ", 1e" + fmt(edges[i]) + ")") << ": " << c << "</title></rect>";
    if (i % 2 == 0)
      s << "<text x=\"" << x + bw / 2 << "\" y=\"" << H - B + 14 << "\" font-size=\"9\" text-anchor=\"middle\">"
        << label << "</text>";
  }
  s << "<text x=\"" << (W + L) / 2 << "\" y=\"" << H - 10
    << "\" font-size=\"12\" text-anchor=\"middle\">|test - ref| (log10 bins; red: above atol)</text>";
  s << "<text x=\"14\" y=\"" << (H - B + T) / 2
    << "\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 14 " << (H - B + T) / 2
    << ")\">elements (log scale), max " << mx << "</text></svg>";
  return s.str();
}

std::string svg_layers(const json& div) {
  const json& layers = div["layers"];
  const int W = 900, H = 300, L = 60, B = 40, T = 20;
  size_t n = layers.size();
  double lo = -10, hi = 1;
  for (const auto& l : layers) {
    double m = l["max_abs"].get<double>();
    if (m > 0) hi = std::max(hi, std::ceil(std::log10(m)));
  }
  auto ypos = [&](double m) {
    double l = m > 0 ? std::max(std::log10(m), lo) : lo;
    return (H - B) - (l - lo) / (hi - lo) * (H - B - T);
  };
  double bw = static_cast<double>(W - L - 10) / static_cast<double>(std::max<size_t>(n, 1));
  std::ostringstream s;
  s << "<svg id=\"layer-plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\"><rect width=\"" << W << "\" height=\"" << H << "\" fill=\"#fff\"/>";
  for (int e = static_cast<int>(lo); e <= static_cast<int>(hi); e += 2)
    s << "<line x1=\"" << L << "\" x2=\"" << W - 10 << "\" y1=\"" << ypos(std::pow(10, e)) << "\" y2=\""
      << ypos(std::pow(10, e)) << "\" stroke=\"#eee\"/><text x=\"" << L - 4 << "\" y=\"" << ypos(std::pow(10, e)) + 4
      << "\" font-size=\"10\" text-anchor=\"end\">1e" << e << "</text>";
  int first = div["first"].is_null() ? -1 : div["first"]["index"].get<int>();
  for (size_t i = 0; i < n; ++i) {
    double m = layers[i]["max_abs"].get<double>();
    double x = L + (static_cast<double>(i) + 0.5) * bw;
    std::string name = html_escape(layers[i]["name"].get<std::string>());
    if (m < 0) {
      s << "<circle cx=\"" << x << "\" cy=\"" << H - B << "\" r=\"3\" fill=\"none\" stroke=\"#999\"><title>" << name
        << ": not observable</title></circle>";
      continue;
    }
    std::string color = static_cast<int>(i) == first    ? "#d9534f"
                        : layers[i]["pass"].get<bool>() ? "#4a90d9"
                                                        : "#f0ad4e";
    s << "<circle cx=\"" << x << "\" cy=\"" << ypos(m) << "\" r=\"" << (static_cast<int>(i) == first ? 6 : 3)
      << "\" fill=\"" << color << "\"><title>" << i << " " << name << ": max abs err " << fmt(m) << "</title></circle>";
  }
  s << "<text x=\"" << (W + L) / 2 << "\" y=\"" << H - 10
    << "\" font-size=\"12\" text-anchor=\"middle\">engine layers in topological order (red: first divergence; "
       "hollow: not observable)</text></svg>";
  return s.str();
}

std::string html_report(const json& rep) {
  std::ostringstream h;
  bool pass = rep["pass"].get<bool>();
  h << "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>kiln compare report</title><style>"
       "body{font-family:sans-serif;margin:20px;color:#222}table{border-collapse:collapse;margin:8px 0}"
       "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}"
       ".pass{color:#2e7d32;font-weight:bold}.fail{color:#c62828;font-weight:bold}code{background:#f4f4f4}"
       "</style></head><body>";
  h << "<h1>kiln compare: <span class=\"" << (pass ? "pass\">PASS" : "fail\">FAIL") << "</span></h1>";
  h << "<p>model <code>" << html_escape(rep["model"].get<std::string>()) << "</code><br>reference: <b>"
    << html_escape(rep["ref"].get<std::string>()) << "</b>, test: <b>" << html_escape(rep["test"].get<std::string>())
    << "</b> (boundary " << html_escape(rep["boundary"].get<std::string>()) << ")</p>";
  int id = 0;
  for (const auto& out : rep["outputs"]) {
    const json& s = out["stats"];
    h << "<h2 id=\"output-" << id << "\">output <code>" << html_escape(out["name"].get<std::string>())
      << "</code> <span class=\"" << (out["pass"].get<bool>() ? "pass\">PASS" : "fail\">FAIL") << "</span></h2>";
    h << "<table><tr><th>ref</th><td>" << html_escape(out["ref_desc"].get<std::string>()) << "</td><th>test</th><td>"
      << html_escape(out["test_desc"].get<std::string>()) << "</td></tr>";
    h << "<tr><th>NaN ref/test</th><td>" << s["nan"]["ref"] << " / " << s["nan"]["test"]
      << "</td><th>Inf ref/test</th><td>" << s["inf"]["ref"] << " / " << s["inf"]["test"] << "</td></tr>";
    h << "<tr><th>abs err max/mean/median</th><td>" << fmt(s["abs_err"]["max"]) << " / " << fmt(s["abs_err"]["mean"])
      << " / " << fmt(s["abs_err"]["median"]) << "</td><th>rel err max/mean/median</th><td>" << fmt(s["rel_err"]["max"])
      << " / " << fmt(s["rel_err"]["mean"]) << " / " << fmt(s["rel_err"]["median"]) << "</td></tr>";
    h << "<tr><th>tolerance</th><td>" << html_escape(rep["check_error_stat"].get<std::string>()) << " atol "
      << fmt(s["atol"]) << " rtol " << fmt(s["rtol"]) << "</td><th>outside</th><td>" << s["outside_tolerance"] << " of "
      << s["elements"] << " " << html_escape(s["why"].get<std::string>()) << "</td></tr></table>";
    h << "<p>percentiles of |err|: ";
    for (const char* k : kPercentiles)
      if (s["abs_err_percentiles"].contains(k)) h << k << " " << fmt(s["abs_err_percentiles"][k]) << " &nbsp; ";
    h << "</p>" << svg_histogram(out, id);
    if (out.contains("classifier")) {
      const json& c = out["classifier"];
      h << "<p>classifier: top-1 agreement " << c["top1_agree"] << "/" << c["rows"] << ", ref top-1 in test top-"
        << c["k"] << ": " << c["ref_top1_in_test_topk"] << "/" << c["rows"] << ", flipped decisions " << c["flipped"]
        << "</p>";
    }
    for (const auto& t : out.value("thresholds", json::array()))
      h << "<p>threshold " << fmt(t["value"]) << ": " << t["crossings"] << " element(s) on different sides</p>";
    h << "<table><tr><th>index</th><th>ref</th><th>test</th><th>abs err</th></tr>";
    for (const auto& w : s["worst"])
      h << "<tr><td>" << w["index"].get<std::string>() << "</td><td>" << w["ref"].dump() << "</td><td>"
        << w["test"].dump() << "</td><td>" << w["abs_err"].dump() << "</td></tr>";
    h << "</table>";
    ++id;
  }
  if (rep.contains("divergence")) {
    const json& d = rep["divergence"];
    h << "<h2>per-layer error (engine vs ONNX reference, fusions on)</h2>" << svg_layers(d);
    if (d["first"].is_null()) {
      h << "<p class=\"pass\">no layer leaves tolerance (" << d["observed_layers"] << " of " << d["total_layers"]
        << " layers observable)</p>";
    } else {
      const json& f = d["first"];
      h << "<h3 id=\"first-divergence\">first divergence: layer " << f["index"] << " <code>"
        << html_escape(f["name"].get<std::string>()) << "</code> (" << html_escape(f["op_type"].get<std::string>())
        << ", kernel " << html_escape(f["kernel"].get<std::string>()) << ", "
        << html_escape(f["precision"].get<std::string>()) << ")</h3><p>ONNX nodes: ";
      for (const auto& src : f["sources"]) h << "<code>" << html_escape(src.get<std::string>()) << "</code> ";
      h << "<br>" << html_escape(f["verdict"].get<std::string>())
        << "</p><table><tr><th></th><th>tensor</th><th>max abs err</th></tr>";
      for (const auto& in : f["inputs"])
        h << "<tr><td>before (input)</td><td>" << html_escape(in["name"].get<std::string>()) << "</td><td>"
          << (in.contains("max_abs") ? fmt(in["max_abs"]) : html_escape(in.value("kind", ""))) << "</td></tr>";
      for (const auto& x : f["outputs"])
        h << "<tr><td>after (output)</td><td>" << html_escape(x["name"].get<std::string>()) << "</td><td>"
          << (x.contains("max_abs") ? fmt(x["max_abs"]) : html_escape(x.value("kind", ""))) << "</td></tr>";
      h << "</table>";
    }
  }
  h << "<h2>environment</h2><pre>" << html_escape(rep["versions"].dump(1)) << "</pre></body></html>\n";
  return h.str();
}

void print_text(const json& rep) {
  std::printf("kiln compare: %s\n  reference: %s\n  test:      %s\n  boundary:  %s\n",
              rep["model"].get<std::string>().c_str(), rep["ref"].get<std::string>().c_str(),
              rep["test"].get<std::string>().c_str(), rep["boundary"].get<std::string>().c_str());
  for (const auto& in : rep["inputs"]["values"]) std::printf("input  %s\n", in["summary"].get<std::string>().c_str());
  for (const auto& out : rep["outputs"]) {
    const json& s = out["stats"];
    std::printf("output %s: %s  (ref %s, test %s)\n", out["name"].get<std::string>().c_str(),
                out["pass"].get<bool>() ? "PASS" : "FAIL", out["ref_desc"].get<std::string>().c_str(),
                out["test_desc"].get<std::string>().c_str());
    if (!out["dtype_match"].get<bool>()) std::printf("  dtype differs\n");
    if (!s["comparable"].get<bool>()) {
      std::printf("  %s\n", s["why"].get<std::string>().c_str());
      continue;
    }
    std::printf("  NaN ref %lld test %lld, Inf ref %lld test %lld\n", s["nan"]["ref"].get<long long>(),
                s["nan"]["test"].get<long long>(), s["inf"]["ref"].get<long long>(), s["inf"]["test"].get<long long>());
    std::printf("  abs err: max %s mean %s median %s\n", fmt(s["abs_err"]["max"]).c_str(),
                fmt(s["abs_err"]["mean"]).c_str(), fmt(s["abs_err"]["median"]).c_str());
    std::printf("  rel err (floor %s): max %s mean %s median %s\n", fmt(rep["rel_floor"]).c_str(),
                fmt(s["rel_err"]["max"]).c_str(), fmt(s["rel_err"]["mean"]).c_str(),
                fmt(s["rel_err"]["median"]).c_str());
    std::printf("  |err| percentiles:");
    for (const char* k : kPercentiles)
      if (s["abs_err_percentiles"].contains(k)) std::printf(" %s %s", k, fmt(s["abs_err_percentiles"][k]).c_str());
    std::printf("\n  histogram of |err|: exact %lld", s["histogram"]["exact"].get<long long>());
    const auto& edges = s["histogram"]["log10_edges"];
    const auto& counts = s["histogram"]["counts"];
    for (size_t i = 0; i < counts.size(); ++i)
      if (counts[i].get<int64_t>())
        std::printf(", [1e%s,1e%s) %lld", fmt(edges[i]).c_str(), fmt(edges[i + 1]).c_str(), counts[i].get<long long>());
    std::printf("\n  tolerance (%s, atol %s, rtol %s): %lld of %lld elements outside%s%s\n",
                rep["check_error_stat"].get<std::string>().c_str(), fmt(s["atol"]).c_str(), fmt(s["rtol"]).c_str(),
                s["outside_tolerance"].get<long long>(), s["elements"].get<long long>(),
                s["why"].get<std::string>().empty() ? "" : ": ", s["why"].get<std::string>().c_str());
    for (const auto& w : s["worst"])
      if (w["abs_err"] != json(0.0))
        std::printf("  worst %s: ref %s test %s abs err %s\n", w["index"].get<std::string>().c_str(),
                    w["ref"].dump().c_str(), w["test"].dump().c_str(), w["abs_err"].dump().c_str());
    if (out.contains("classifier")) {
      const json& c = out["classifier"];
      std::printf("  classifier: top-1 agree %lld/%lld, ref top-1 in test top-%d %lld/%lld, flipped decisions %lld\n",
                  c["top1_agree"].get<long long>(), c["rows"].get<long long>(), c["k"].get<int>(),
                  c["ref_top1_in_test_topk"].get<long long>(), c["rows"].get<long long>(),
                  c["flipped"].get<long long>());
    }
    for (const auto& t : out.value("thresholds", json::array()))
      std::printf("  threshold %s: %lld element(s) on different sides\n", fmt(t["value"]).c_str(),
                  t["crossings"].get<long long>());
  }
  if (rep.contains("divergence")) {
    const json& d = rep["divergence"];
    if (d["first"].is_null()) {
      std::printf("first divergence: none (%d of %d layers observable, all within tolerance)\n",
                  d["observed_layers"].get<int>(), d["total_layers"].get<int>());
    } else {
      const json& f = d["first"];
      std::string srcs;
      for (const auto& x : f["sources"]) srcs += (srcs.empty() ? "" : ", ") + x.get<std::string>();
      std::printf("first divergence: layer %d '%s' (%s, kernel %s, %s%s) from ONNX nodes [%s]\n", f["index"].get<int>(),
                  f["name"].get<std::string>().c_str(), f["op_type"].get<std::string>().c_str(),
                  f["kernel"].get<std::string>().c_str(), f["precision"].get<std::string>().c_str(),
                  f["fused"].get<bool>() ? ", fused" : "", srcs.c_str());
      // A channel-blocked value is shown with the plain value it stands for.
      auto label = [](const json& v) {
        return v["name"].get<std::string>() + (v.contains("as") ? " (as " + v["as"].get<std::string>() + ")" : "");
      };
      for (const auto& in : f["inputs"])
        std::printf(
            "  before: input %s %s\n", label(in).c_str(),
            in.contains("max_abs") ? ("max abs err " + fmt(in["max_abs"])).c_str() : in.value("kind", "").c_str());
      for (const auto& x : f["outputs"])
        std::printf("  after:  output %s %s\n", label(x).c_str(),
                    x.contains("max_abs") ? ("max abs err " + fmt(x["max_abs"])).c_str() : x.value("kind", "").c_str());
      std::printf("  %s\n", f["verdict"].get<std::string>().c_str());
      if (!f["unobservable_before"].empty())
        std::printf("  unobservable layers just before it: %s\n", f["unobservable_before"].dump().c_str());
    }
  }
  std::printf("RESULT: %s (%d of %d outputs within tolerance)\n", rep["pass"].get<bool>() ? "PASS" : "FAIL",
              rep["outputs_passed"].get<int>(), static_cast<int>(rep["outputs"].size()));
}

// ---- the command

std::string command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()), out, arg;
  for (char c : raw) {
    if (c) {
      arg += c;
      continue;
    }
    bool plain = !arg.empty() &&
                 arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=/.,:@%") ==
                     std::string::npos;
    std::string q = arg;
    if (!plain) {
      q = "'";
      for (char x : arg) q += x == '\'' ? std::string("'\\''") : std::string(1, x);
      q += "'";
    }
    out += (out.empty() ? "" : " ") + q;
    arg.clear();
  }
  return out;
}

json versions_json(const ir::Model& m) {
  engine::TargetInfo host = engine::detect_host();
  json opsets = json::object();
  for (const auto& [d, v] : m.opset_imports) opsets[d.empty() ? "ai.onnx" : d] = v;
  const char* plant = std::getenv("KILN_TEST_PLANT_BUG");
  return {{"kiln", KILN_VERSION},
          {"compiler", std::string(
#if defined(__clang__)
                           "clang "
#elif defined(__GNUC__)
                           "gcc "
#endif
                           ) +
                           __VERSION__},
          {"cpu_model", host.cpu_model},
          {"cpu_cores", host.cores},
          {"isa", host.isa},
          {"model_producer", m.producer_name + " " + m.producer_version},
          {"model_ir_version", m.ir_version},
          {"model_opsets", opsets},
          {"KILN_TEST_PLANT_BUG", plant ? json(plant) : json(nullptr)}};
}

Status write_bundle(const CompareOptions& o, const std::string& dir, const std::map<std::string, ops::Value>& inputs,
                    const std::vector<std::pair<std::string, Tensor>>& ref_out,
                    const std::vector<std::pair<std::string, Tensor>>& test_out, const json& rep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IOError("cannot create '", dir, "': ", ec.message());
  std::vector<std::pair<std::string, Tensor>> ins;
  for (const auto& [k, v] : inputs)
    if (v.is_tensor()) ins.emplace_back(k, v.tensor);
  KILN_RETURN_IF_ERROR(write_npz(dir + "/inputs.npz", ins));
  KILN_RETURN_IF_ERROR(write_npz(dir + "/ref_outputs.npz", ref_out));
  KILN_RETURN_IF_ERROR(write_npz(dir + "/test_outputs.npz", test_out));
  // The model travels with the bundle when small enough to attach (64 MiB).
  json files = {{"inputs", "inputs.npz"}, {"ref_outputs", "ref_outputs.npz"}, {"test_outputs", "test_outputs.npz"}};
  if (fs::file_size(o.model, ec) < (size_t{64} << 20) && !ec) {
    fs::copy_file(o.model, dir + "/model.onnx", fs::copy_options::overwrite_existing, ec);
    if (!ec) files["model"] = "model.onnx";
  }
  if (!o.engine_file.empty()) {
    fs::copy_file(o.engine_file, dir + "/engine.kiln", fs::copy_options::overwrite_existing, ec);
    if (!ec) files["engine"] = "engine.kiln";
  }
  std::string cmd = command_line();
  json bundle = {{"kind", "kiln compare repro bundle"},
                 {"command", cmd},
                 {"cwd", fs::current_path().string()},
                 {"options", o},
                 {"files", files},
                 {"report", rep}};
  std::ofstream(dir + "/bundle.json") << bundle.dump(1) << "\n";
  std::ofstream(dir + "/command.txt") << cmd << "\n";
  std::ofstream(dir + "/README.txt")
      << "kiln compare repro bundle\n\nreplay:   kiln compare --replay " << dir << "\noriginal: " << cmd
      << "\n\nbundle.json: options, build config and profiles, versions (kiln, compiler, CPU, "
      << "model opset/producer), the full report with the first-divergence search\ninputs.npz: the failing inputs\n"
      << "ref_outputs.npz / test_outputs.npz: both sides' outputs\n";
  return Status::Ok();
}

Result<int> run_compare(CompareOptions o, const std::string& json_path, const std::string& html_path,
                        const json* replay_of) {
  if (o.model.empty()) return InvalidArgument("give the model (model.onnx), or --replay DIR");
  if (o.test != "engine" && o.test != "onnx") return InvalidArgument("--test must be engine or onnx");
  if (o.ref == o.test) return InvalidArgument("--ref and --test are both '", o.ref, "': nothing to compare");
  if (o.check_error_stat != "elemwise" && o.check_error_stat != "max" && o.check_error_stat != "mean" &&
      o.check_error_stat != "median")
    return InvalidArgument("--check-error-stat must be max, mean, median or elemwise");
  bool ref_is_file = o.ref != "onnx";
  json build = nullptr;
  KILN_ASSIGN_OR_RETURN(Runners r, make_runners(o, build));
  const ir::Graph& g = *r.model.graph;
  std::map<std::string, ops::Value> inputs;
  json in_info = json::object();
  KILN_RETURN_IF_ERROR(compare_inputs(o, g, inputs, in_info));
  if (!o.save_inputs.empty()) {
    std::vector<std::pair<std::string, Tensor>> ins;
    for (const auto& [k, v] : inputs)
      if (v.is_tensor()) ins.emplace_back(k, v.tensor);
    KILN_RETURN_IF_ERROR(write_npz(o.save_inputs, ins));
  }
  // Reference outputs.
  std::vector<std::pair<std::string, Tensor>> ref_out, test_out;
  std::vector<ops::Value> onnx_outs;
  bool have_onnx = false;
  auto run_onnx = [&]() -> Status {
    if (have_onnx) return Status::Ok();
    ops::Interpreter interp(r.model.graph);
    ops::DeadlineScope deadline(deadline_after(o.deadline_s));
    KILN_ASSIGN_OR_RETURN(onnx_outs, interp.run(inputs));
    have_onnx = true;
    return Status::Ok();
  };
  if (ref_is_file) {
    KILN_ASSIGN_OR_RETURN(ref_out, read_npz(o.ref));
    for (const auto& [name, t] : ref_out) {
      bool found = false;
      for (const auto& out : g.outputs) found |= out.name == name || sanitize_name(out.name) == name;
      if (!found) return InvalidArgument("'", o.ref, "' has '", name, "', which is not an output of the model");
    }
  } else {
    KILN_RETURN_IF_ERROR(run_onnx());
    for (size_t i = 0; i < onnx_outs.size(); ++i)
      if (onnx_outs[i].is_tensor()) ref_out.emplace_back(g.outputs[i].name, onnx_outs[i].tensor);
  }
  // Test outputs.
  std::vector<ops::Value> touts;
  if (o.test == "onnx") {
    KILN_RETURN_IF_ERROR(run_onnx());
    touts = onnx_outs;
  } else {
    ops::DeadlineScope deadline(deadline_after(o.deadline_s));
    KILN_ASSIGN_OR_RETURN(touts, detail::run_engine(*r.engine, inputs));
  }
  for (size_t i = 0; i < touts.size() && i < g.outputs.size(); ++i)
    if (touts[i].is_tensor()) test_out.emplace_back(g.outputs[i].name, touts[i].tensor);

  std::string ref_label =
      ref_is_file ? "framework outputs " + o.ref : "onnx (reference interpreter, unoptimized model)";
  std::string test_label =
      o.test == "onnx"        ? "onnx (reference interpreter, unoptimized model)"
      : o.engine_file.empty() ? "engine (built in memory, " + std::to_string(r.engine->layers.size()) + " layers)"
                              : "engine " + o.engine_file + " (" + std::to_string(r.engine->layers.size()) + " layers)";
  json rep = {{"model", o.model},
              {"ref", ref_label},
              {"test", test_label},
              {"boundary", std::string(ref_is_file ? "framework" : "onnx-reference") + " -> " +
                               (o.test == "onnx" ? "onnx-reference" : "engine")},
              {"inputs", in_info},
              {"check_error_stat", o.check_error_stat},
              {"rel_floor", o.rel_floor},
              {"build", build},
              {"versions", versions_json(r.model)}};
  json outs = json::array();
  int passed = 0;
  bool all = true;
  for (const auto& [rname, rt] : ref_out) {
    auto it = std::find_if(test_out.begin(), test_out.end(),
                           [&](const auto& p) { return p.first == rname || sanitize_name(p.first) == rname; });
    if (it == test_out.end()) return InvalidArgument("output '", rname, "' was not produced by the test runner");
    const Tensor& tt = it->second;
    KILN_ASSIGN_OR_RETURN(double atol, tolerance_for(o.atol, it->first, kDefaultAtol));
    KILN_ASSIGN_OR_RETURN(double rtol, tolerance_for(o.rtol, it->first, kDefaultRtol));
    Stats s = compute_stats(rt, tt, atol, rtol, o.rel_floor, o.check_error_stat, o.worst);
    bool dtype_ok = rt.dtype() == tt.dtype();
    json jo = {{"name", it->first},
               {"ref_desc", rt.describe()},
               {"test_desc", tt.describe()},
               {"dtype_match", dtype_ok},
               {"shape_match", rt.shape() == tt.shape()},
               {"stats", stats_json(s)}};
    bool ok = s.pass && dtype_ok;
    if (!dtype_ok && s.why.empty()) jo["stats"]["why"] = "dtype differs";
    bool classifier = std::find(o.classifiers.begin(), o.classifiers.end(), it->first) != o.classifiers.end();
    if (!classifier && o.classifiers.empty())
      classifier = rt.rank() == 2 && dtype_is_float(rt.dtype()) && rt.dim(1) > 1;
    if (classifier && s.comparable && rt.rank() >= 1 && rt.dtype() != DataType::kString && rt.numel())
      jo["classifier"] = classifier_json(rt, tt, o.top_k);
    for (const auto& spec : o.thresholds) {
      size_t c = spec.rfind(':');
      if (c == std::string::npos) return InvalidArgument("--threshold '", spec, "' must look like NAME:VALUE");
      if (spec.substr(0, c) != it->first) continue;
      double v = std::strtod(spec.c_str() + c + 1, nullptr);
      int64_t cross = 0;
      if (s.comparable && rt.dtype() != DataType::kString)
        for (int64_t i = 0; i < rt.numel(); ++i) cross += (rt.get_f64(i) > v) != (tt.get_f64(i) > v);
      jo["thresholds"].push_back({{"value", v}, {"crossings", cross}});
    }
    jo["pass"] = ok;
    passed += ok;
    all &= ok;
    outs.push_back(jo);
  }
  for (const auto& spec : o.thresholds) {
    std::string name = spec.substr(0, spec.rfind(':'));
    if (std::none_of(ref_out.begin(), ref_out.end(), [&](const auto& p) { return p.first == name; }))
      return InvalidArgument("--threshold names '", name, "', which is not a compared output");
  }
  rep["outputs"] = outs;
  rep["outputs_passed"] = passed;
  if (o.find_divergence) {
    Status st = Status::Ok();
    ops::DeadlineScope deadline(deadline_after(o.deadline_s));
    json d = find_divergence(o, r, inputs, &st);
    KILN_RETURN_IF_ERROR(st);
    rep["divergence"] = d;
    all &= d["first"].is_null();
  }
  rep["pass"] = all;
  if (replay_of) {
    // Same numbers as the bundle: per output max/mean abs error and outside counts, and the same
    // first divergent layer.
    bool same = true;
    const json& old = (*replay_of)["report"];
    for (size_t i = 0; i < outs.size(); ++i) {
      const json* prev = nullptr;
      for (const auto& x : old["outputs"])
        if (x["name"] == outs[i]["name"]) prev = &x;
      same &= prev && (*prev)["stats"]["abs_err"] == outs[i]["stats"]["abs_err"] &&
              (*prev)["stats"]["outside_tolerance"] == outs[i]["stats"]["outside_tolerance"];
    }
    auto first_name = [](const json& x) {
      return x.contains("divergence") && !x["divergence"]["first"].is_null() ? x["divergence"]["first"]["name"]
                                                                             : json(nullptr);
    };
    same &= first_name(old) == first_name(rep);
    rep["replay"] = {{"bundle_command", (*replay_of)["command"]}, {"reproduced", same}};
  }
  print_text(rep);
  if (replay_of)
    std::printf("replay: %s\n", rep["replay"]["reproduced"].get<bool>()
                                    ? "reproduces the bundle's numbers exactly"
                                    : "numbers DIFFER from the bundle (see --json)");
  if (!json_path.empty()) std::ofstream(json_path) << rep.dump(1) << "\n";
  if (!html_path.empty()) std::ofstream(html_path) << html_report(rep);
  if (!all && !o.save_failure.empty()) {
    KILN_RETURN_IF_ERROR(write_bundle(o, o.save_failure, inputs, ref_out, test_out, rep));
    std::printf("repro bundle written to %s (replay: kiln compare --replay %s)\n", o.save_failure.c_str(),
                o.save_failure.c_str());
  }
  if (replay_of && !rep["replay"]["reproduced"].get<bool>()) return kExitMismatch;
  return all ? kExitOk : kExitMismatch;
}

Result<int> replay(const std::string& dir, const std::string& json_path, const std::string& html_path) {
  std::ifstream f(dir + "/bundle.json");
  if (!f) return NotFound("'", dir, "/bundle.json' not found: is this a kiln compare --save-failure bundle?");
  json bundle;
  try {
    bundle = json::parse(f);
  } catch (const std::exception& e) {
    return InvalidArgument("'", dir, "/bundle.json': ", e.what());
  }
  CompareOptions o = bundle.at("options").get<CompareOptions>();
  const json& files = bundle["files"];
  if (files.contains("model")) o.model = dir + "/" + files["model"].get<std::string>();
  if (files.contains("engine")) o.engine_file = dir + "/" + files["engine"].get<std::string>();
  if (o.ref != "onnx") o.ref = dir + "/ref_outputs.npz";
  o.inputs = dir + "/inputs.npz";
  o.input_files.clear();
  o.input_ranges.clear();
  o.save_inputs.clear();
  o.save_failure.clear();
  const json& v = bundle["report"]["versions"];
  const char* plant = std::getenv("KILN_TEST_PLANT_BUG");
  if (v.contains("KILN_TEST_PLANT_BUG") && v["KILN_TEST_PLANT_BUG"] != (plant ? json(plant) : json(nullptr)))
    std::printf("replay: note: KILN_TEST_PLANT_BUG was %s when the bundle was written\n",
                v["KILN_TEST_PLANT_BUG"].dump().c_str());
  std::printf("replay of: %s\n", bundle.value("command", "").c_str());
  return run_compare(o, json_path, html_path, &bundle);
}

}  // namespace

void add_compare_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<CompareOptions>();
  CLI::App* cmd = app.add_subcommand(
      "compare", "Compare runners on the same inputs (ONNX reference, engine, saved framework outputs)");
  cmd->add_option("model", o->model, "model.onnx");
  cmd->add_option("--ref", o->ref, "reference: onnx (reference interpreter) or FILE.npz (framework outputs by name)");
  cmd->add_option("--test", o->test, "runner under test: engine (default) or onnx")
      ->check(CLI::IsMember({"engine", "onnx"}));
  cmd->add_option("--engine", o->engine_file, "test this engine file instead of building one in memory");
  cmd->add_option("--min-shapes", o->min_shapes, "build option (as kiln build)");
  cmd->add_option("--opt-shapes", o->opt_shapes, "build option (as kiln build)");
  cmd->add_option("--max-shapes", o->max_shapes, "build option (as kiln build)");
  cmd->add_option("--build-shapes", o->build_shapes, "build option: fixed shapes (kiln build --shapes)");
  cmd->add_option("--disable-pass", o->disabled_passes, "build option: skip a graph pass (repeatable)");
  cmd->add_option("--workspace", o->workspace_mb,
                  "build option: the most workspace one layer may use, MiB (kiln build --workspace)")
      ->check(bounded(0, 1 << 30));
  cmd->add_option("--inputs", o->inputs, "inputs: FILE.npz or a directory of NAME.npy / NAME.pb / input_<i>.pb");
  cmd->add_option("--input", o->input_files, "NAME=FILE (.npy or .pb), repeatable");
  cmd->add_flag("--random-inputs", o->random_inputs,
                "random values for the inputs that --inputs/--input do not give (without it a missing input is an "
                "error)");
  cmd->add_option("--shapes", o->shapes, "shapes of generated inputs: NAME:1x3x224x224,...");
  cmd->add_option("--seed", o->seed, "seed of generated inputs");
  cmd->add_option("--input-range", o->input_ranges, "NAME:lo,hi range of a generated input (repeatable)");
  add_deadline_option(cmd, o->deadline_s);
  cmd->add_option("--save-inputs", o->save_inputs, "write the inputs used to FILE.npz");
  cmd->add_option("--atol", o->atol, "absolute tolerance: VALUE or NAME:VALUE (repeatable; default 1e-4)");
  cmd->add_option("--rtol", o->rtol, "relative tolerance: VALUE or NAME:VALUE (repeatable; default 1e-3)");
  cmd->add_option("--rel-floor", o->rel_floor, "relative error is |err| / max(|ref|, floor)");
  cmd->add_option("--check-error-stat", o->check_error_stat, "elemwise (default), max, mean or median")
      ->check(CLI::IsMember({"elemwise", "max", "mean", "median"}));
  cmd->add_option("--top-k", o->top_k, "k of the classifier top-k check (default 5)");
  cmd->add_option("--classifier", o->classifiers,
                  "outputs holding class scores on the last axis (default: every float output of rank 2)");
  cmd->add_option("--threshold", o->thresholds, "NAME:VALUE: count elements on different sides of VALUE");
  cmd->add_option("--worst", o->worst, "how many worst elements to list (default 10)");
  cmd->add_flag("--find-divergence", o->find_divergence,
                "find the first engine layer (fusions on) whose output leaves tolerance vs the ONNX reference");
  cmd->add_option("--json", o->json_path, "write the full report as JSON");
  cmd->add_option("--html", o->html_path, "write a self-contained HTML report (histograms, per-layer plot)");
  cmd->add_option("--save-failure", o->save_failure, "on failure, write a repro bundle to DIR");
  cmd->add_option("--replay", o->replay, "rerun a repro bundle written by --save-failure");
  cmd->callback([o, &exit_code]() {
    Result<int> r = !o->replay.empty() ? replay(o->replay, o->json_path, o->html_path)
                                       : run_compare(*o, o->json_path, o->html_path, nullptr);
    exit_code = r.ok() ? r.value() : report_error(r.status());
  });
}

}  // namespace kiln::tools
