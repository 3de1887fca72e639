// INT8 calibration inside kiln build (calibration.h).
//
// Deterministic: the same model, calibration data and options give bit-identical ranges (and
// calibration cache) on every build on one machine at one thread count, whatever the timings. The
// FP32 engine that calibrates takes, per layer, the first tactic in priority order that prepares
// (BuilderConfig::deterministic_tactics: no timing, no timing cache), and the batches run in file
// order; the statistics are accumulated in that order too.
#include "engine/calibration.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "core/checksum.h"
#include "core/npy.h"
#include "engine/engine_impl.h"
#include "onnx/exporter.h"
#include "ops/shape_inference.h"
#include "passes/pass.h"
#include "quant/calib_cache.h"
#include "quant/calibrator.h"
#include "quant/qdq_insert.h"

namespace kiln::detail {

namespace {

// Observed activation values the first calibration pass keeps for the second (calibrate()).
constexpr size_t kCalibrationKeepBytes = size_t{1} << 30;

std::vector<std::string> model_inputs(const ir::Graph& g) {
  std::vector<std::string> names;
  for (const auto& in : g.inputs)
    if (!g.initializers.count(in.name)) names.push_back(in.name);
  return names;
}

// An .npz's entries as the model's inputs: by name, or the one entry for a one-input model.
Result<std::map<std::string, Tensor>> match_inputs(const std::vector<std::string>& inputs,
                                                   std::vector<std::pair<std::string, Tensor>> entries,
                                                   const std::string& file) {
  std::map<std::string, Tensor> by_name;
  if (inputs.size() == 1 && entries.size() == 1) {
    by_name[inputs[0]] = std::move(entries[0].second);
    return by_name;
  }
  for (auto& [name, t] : entries) by_name[name] = std::move(t);
  std::map<std::string, Tensor> out;
  for (const auto& in : inputs) {
    auto it = by_name.find(in);
    if (it == by_name.end()) {
      std::string have;
      for (const auto& [n, t] : by_name) have += (have.empty() ? "" : ", ") + n;
      return InvalidArgument("calibration data '", file, "' has no entry for input '", in, "' (it has: ", have,
                             "); name the .npz entries after the model's inputs");
    }
    out[in] = std::move(it->second);
  }
  return out;
}

// Rows [begin, end) of a tensor along dim 0.
Tensor rows(const Tensor& t, int64_t begin, int64_t end) {
  Dims d = t.shape();
  d[0] = end - begin;
  Tensor out(t.dtype(), d);
  const size_t row_bytes = t.dim(0) ? t.nbytes() / static_cast<size_t>(t.dim(0)) : 0;
  std::memcpy(out.raw(), static_cast<const uint8_t*>(t.raw()) + row_bytes * static_cast<size_t>(begin),
              row_bytes * static_cast<size_t>(end - begin));
  return out;
}

bool excluded(const std::vector<std::string>& patterns, const std::string& name) {
  for (const auto& p : patterns)
    if (p == name || ::fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  return false;
}

Result<std::string> model_hash(const ir::Model& model) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, onnx_import::serialize_model(model));
  char buf[32];
  std::snprintf(buf, sizeof buf, "crc32c:%08x", crc32c(0, bytes.data(), bytes.size()));
  return std::string(buf);
}

// One profile holding every calibration batch's shapes, for the inputs whose declared shape is not fixed.
std::vector<Profile> batch_profiles(const ir::Graph& g, const std::vector<std::map<std::string, ops::Value>>& batches) {
  Profile p;
  p.name = "calibration";
  for (const auto& in : g.inputs) {
    if (g.initializers.count(in.name) || (in.type.is_tensor() && in.type.shape.fully_known())) continue;
    ShapeRange r;
    for (const auto& b : batches) {
      auto it = b.find(in.name);
      if (it == b.end()) continue;
      const Dims& d = it->second.tensor.shape();
      if (r.opt.empty()) {
        r.min = r.opt = r.max = d;
        continue;
      }
      for (size_t k = 0; k < d.size() && k < r.min.size(); ++k)
        r.min[k] = std::min(r.min[k], d[k]), r.max[k] = std::max(r.max[k], d[k]);
    }
    if (!r.opt.empty()) p.inputs[in.name] = r;
  }
  if (p.inputs.empty()) return {};
  return {p};
}

// Runs the batches through an FP32 engine of the model, whose graph outputs include the observed
// activations (so that fusions keep them: a Conv's output before a fused residual Add is internal to
// the fused layer otherwise), and collects their statistics as kiln compare --find-divergence
// collects layer outputs (run_engine_observed).
Result<std::map<std::string, quant::Range>> calibrate(const ir::Model& model, const quant::QdqPlan& plan,
                                                      const std::vector<std::map<std::string, ops::Value>>& batches,
                                                      const BuilderConfig& cfg, quant::Calibrator calibrator,
                                                      const std::function<void(const std::string&)>& log,
                                                      const std::function<void(const std::string&)>& warn) {
  ir::Model m = model;
  m.graph = ir::deep_copy(*model.graph);
  std::set<std::string> outs, inputs;
  for (const auto& o : m.graph->outputs) outs.insert(o.name);
  for (const auto& in : m.graph->inputs) inputs.insert(in.name);
  for (const auto& v : plan.observe) {
    if (outs.count(v) || inputs.count(v)) continue;
    auto it = m.graph->value_types.find(v);
    m.graph->outputs.push_back({v, it != m.graph->value_types.end() ? it->second : ir::TypeInfo{}});
  }
  BuilderConfig c = cfg;
  // FP32 everywhere: no other precision a --bf16/--best/--layer-precisions build allows (a BF16 layer
  // would calibrate the ranges of its rounding, not of the model).
  c.precision = Precision::kFP32;
  c.extra_precisions.clear(), c.layer_precisions.clear(), c.auto_precision = false, c.tolerances.clear();
  c.calib_data.clear(), c.calib_cache.clear(), c.int8_exclude.clear();
  // Reproducible ranges: kernels chosen by timing differ from build to build under load (Winograd or
  // direct, one blocking or another) and round differently; two calibrations of mobilenet_v2_fmnist
  // differed in 39 of 64 ranges that way. The first tactic that prepares, in priority order, is the
  // same on every build on one machine; it costs no timing.
  c.deterministic_tactics = true;
  // On the CPU whatever the build's device: the calibration engine runs observed (every layer's values
  // read back), which a device engine's bound layer list does not take (session 10's H200 run: "an
  // observer or test hook is installed"). The ranges are the FP32 model's either way.
  c.device = Device{};
  c.tf32 = false, c.channels_last = -1;
  // Every observed value is an output of this engine, none shares memory: resnet50 at batches of 32
  // plans 2.1 GB (the H200 run, session 10), over the default cap meant for engines that reuse it. The
  // batch size the user gives is what sizes it.
  c.activation_bytes = std::numeric_limits<size_t>::max();
  c.profiles = batch_profiles(*m.graph, batches);
  c.verbose = false, c.strict_tactics = false;
  c.log = [](const std::string&) {};
  c.warn = [warn](const std::string& w) { warn("calibration engine (FP32): " + w); };
  auto t0 = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<EngineImpl> engine, build_engine(std::move(m), c));
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const double build_s = since(t0);
  double pass_s[2] = {0, 0};
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < plan.observe.size(); ++i) index[plan.observe[i]] = i;
  std::vector<quant::TensorStats> stats(plan.observe.size());
  const bool histogram = quant::uses_histogram(calibrator);
  // The histogram calibrators need each tensor's range before its histogram: the first pass keeps the
  // observed values (up to kCalibrationKeepBytes in all) so that the second reads them instead of running
  // the batches again; past that budget they are dropped and the second pass reruns the engine.
  std::vector<std::vector<float>> kept(histogram ? stats.size() : 0);
  bool keeping = histogram, rerun = false;
  size_t kept_bytes = 0;
  auto drop_kept = [&] {
    keeping = false;
    for (auto& k : kept) std::vector<float>().swap(k);
  };
  for (int pass = 0; pass < (histogram ? 2 : 1); ++pass) {
    auto t_pass = std::chrono::steady_clock::now();
    if (pass == 1) {
      for (auto& s : stats) s.hist = quant::Histogram(std::max(std::fabs(s.min), std::fabs(s.max)));
      if (keeping) {
        for (size_t i = 0; i < stats.size(); ++i)
          stats[i].hist.add(kept[i].data(), static_cast<int64_t>(kept[i].size()));
        drop_kept();
        pass_s[pass] = since(t_pass);
        break;
      }
      rerun = true;
    }
    auto take = [&](const std::string& name, const Tensor& t) {
      auto it = index.find(name);
      if (it == index.end() || t.dtype() != DataType::kFloat32) return;
      const float* x = t.data<float>();
      const int64_t n = t.numel();
      if (pass == 1) {
        stats[it->second].hist.add(x, n);
        return;
      }
      stats[it->second].add_range(x, n);
      if (!keeping) return;
      kept_bytes += static_cast<size_t>(n) * sizeof(float);
      if (kept_bytes > kCalibrationKeepBytes) return drop_kept();
      kept[it->second].insert(kept[it->second].end(), x, x + n);
    };
    for (size_t b = 0; b < batches.size(); ++b) {
      for (const auto& [name, v] : batches[b])
        if (v.is_tensor()) take(name, v.tensor);
      auto r = run_engine_observed(*engine, batches[b], [&](const ir::Node& n, const std::vector<ops::Value>& vals) {
        for (size_t i = 0; i < vals.size() && i < n.outputs.size(); ++i)
          if (vals[i].is_tensor()) take(n.outputs[i], vals[i].tensor);
      });
      if (!r.ok()) return r.status().with_context("calibration batch " + std::to_string(b) + ": ");
    }
    pass_s[pass] = since(t_pass);
  }
  auto t_ranges = std::chrono::steady_clock::now();
  std::map<std::string, quant::Range> ranges;
  for (size_t i = 0; i < stats.size(); ++i) {
    if (!stats[i].seen)
      return Internal("calibration did not observe activation '", plan.observe[i],
                      "' (no layer of the FP32 engine produced it, or it held no finite value)");
    // A graph input keeps its whole range whatever the calibrator: preprocessing fixes it, and inputs are
    // spiky (resnet18_fmnist's background pixels, a third of its values, are all -0.81: the entropy
    // calibrator clipped the foreground at 0.81 and lost 11 points of top-1).
    const bool input = batches[0].count(plan.observe[i]) > 0;
    ranges[plan.observe[i]] =
        quant::calibrated_range(stats[i], input ? quant::Calibrator::kMinMax : calibrator, cfg.calib_percentile);
  }
  const double ranges_s = since(t_ranges), seconds = since(t0);
  char line[300];
  std::snprintf(line, sizeof line,
                "[kiln build] calibrated %zu activations on %zu batches (%s, %d pass%s): %.2f s (FP32 engine built "
                "in %.2f s, range pass %.2f s, histogram pass %.2f s%s, thresholds %.2f s)",
                ranges.size(), batches.size(), quant::calibrator_name(calibrator), histogram ? 2 : 1,
                histogram ? "es" : "", seconds, build_s, pass_s[0], pass_s[1],
                histogram && !rerun ? " (from the kept values)"
                : histogram         ? " (batches run again)"
                                    : "",
                ranges_s);
  log(line);
  return ranges;
}

}  // namespace

Result<std::vector<std::map<std::string, ops::Value>>> read_calibration_batches(const ir::Graph& g,
                                                                                const std::string& path,
                                                                                int max_batches, int batch_size) {
  namespace fs = std::filesystem;
  const std::vector<std::string> inputs = model_inputs(g);
  std::vector<std::map<std::string, ops::Value>> batches;
  auto full = [&] { return max_batches > 0 && static_cast<int>(batches.size()) >= max_batches; };
  auto ends_with = [](const std::string& s, const char* suf) {
    size_t n = std::strlen(suf);
    return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
  };
  auto read_entries = [&](const std::string& file) -> Result<std::vector<std::pair<std::string, Tensor>>> {
    if (ends_with(file, ".npz")) return read_npz(file);
    KILN_ASSIGN_OR_RETURN(Tensor t, read_npy(file));
    if (inputs.size() != 1)
      return InvalidArgument("calibration data '", file, "' is one .npy but the model has ", inputs.size(),
                             " inputs: give .npz files with an entry per input");
    return std::vector<std::pair<std::string, Tensor>>{{inputs[0], std::move(t)}};
  };
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(path, ec)) {
      std::string f = e.path().string();
      if (e.is_regular_file() && (ends_with(f, ".npy") || ends_with(f, ".npz"))) files.push_back(f);
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) return InvalidArgument("calibration data directory '", path, "' has no .npy or .npz files");
    for (const auto& f : files) {
      if (full()) break;
      KILN_ASSIGN_OR_RETURN(auto entries, read_entries(f));
      KILN_ASSIGN_OR_RETURN(auto by_input, match_inputs(inputs, std::move(entries), f));
      std::map<std::string, ops::Value> b;
      for (auto& [n, t] : by_input) b[n] = std::move(t);
      batches.push_back(std::move(b));
    }
    return batches;
  }
  if (!fs::is_regular_file(path, ec))
    return NotFound("calibration data '", path, "' is neither a file nor a directory");
  if (!ends_with(path, ".npz") && !ends_with(path, ".npy"))
    return InvalidArgument("calibration data '", path, "': give a .npz of stacked inputs or a directory of batches");
  KILN_ASSIGN_OR_RETURN(auto entries, read_entries(path));
  KILN_ASSIGN_OR_RETURN(auto stacked, match_inputs(inputs, std::move(entries), path));
  int64_t n = -1;
  for (const auto& [name, t] : stacked) {
    if (t.rank() == 0) return InvalidArgument("calibration data '", path, "': input '", name, "' is a scalar");
    if (n >= 0 && t.dim(0) != n)
      return InvalidArgument("calibration data '", path, "': the entries differ in their first dim (", n, " vs ",
                             t.dim(0), ") — stack every input along dim 0 with the same count");
    n = t.dim(0);
  }
  const int64_t step = std::max(1, batch_size);
  for (int64_t begin = 0; begin < n && !full(); begin += step) {
    std::map<std::string, ops::Value> b;
    for (const auto& [name, t] : stacked) b[name] = rows(t, begin, std::min(n, begin + step));
    batches.push_back(std::move(b));
  }
  if (batches.empty()) return InvalidArgument("calibration data '", path, "' holds no samples");
  return batches;
}

Result<nlohmann::json> quantize_for_int8(ir::Model& model, const BuilderConfig& cfg,
                                         const std::function<void(const std::string&)>& log,
                                         const std::function<void(const std::string&)>& warn) {
  ir::Graph& g = *model.graph;
  bool has_qdq = false;
  for (const auto& n : g.nodes)
    has_qdq |= n.domain.empty() && (n.op_type == "QuantizeLinear" || n.op_type == "DequantizeLinear");
  if (has_qdq) {
    if (!cfg.calib_data.empty() || !cfg.calib_cache.empty())
      warn(
          "the model has QuantizeLinear/DequantizeLinear nodes already: built as it is (explicit INT8); the "
          "calibration data and cache are not used");
    log("[kiln build] INT8: explicit quantization (the model's own Q/DQ nodes)");
    return nlohmann::json{{"mode", "explicit"}};
  }
  if (cfg.calib_data.empty() && cfg.calib_cache.empty())
    return InvalidArgument(
        "--int8 needs calibration: give --calib-data DIR|FILE.npz (a few hundred representative inputs: a "
        "directory of .npy/.npz batches or one .npz of stacked inputs), or --calib-cache FILE written by an "
        "earlier calibration of this model, or build a model that has QuantizeLinear/DequantizeLinear nodes");
  KILN_ASSIGN_OR_RETURN(quant::Calibrator calibrator, quant::calibrator_from_name(cfg.calibrator));
  if (calibrator == quant::Calibrator::kPercentile && !(cfg.calib_percentile > 0 && cfg.calib_percentile <= 100))
    return InvalidArgument("--calib-percentile ", cfg.calib_percentile, " must be in (0, 100]");
  // Values known at build time (a position embedding gathered at constant indices) are constants, not
  // activations to observe: the FP32 engine folds them, so calibration would never see them.
  KILN_RETURN_IF_ERROR(passes::fold_constants(g).status());
  KILN_RETURN_IF_ERROR(ops::infer_shapes(g));
  KILN_ASSIGN_OR_RETURN(quant::QdqPlan plan,
                        quant::plan_qdq(g, [&](const ir::Node& n) { return excluded(cfg.int8_exclude, n.name); }));
  KILN_ASSIGN_OR_RETURN(std::string hash, model_hash(model));
  quant::CalibrationKey key{hash, quant::calibrator_name(calibrator),
                            calibrator == quant::Calibrator::kPercentile ? cfg.calib_percentile : 0.0, KILN_VERSION};
  std::map<std::string, quant::Range> ranges;
  bool from_cache = false;
  std::string cache_problem;
  if (!cfg.calib_cache.empty()) {
    auto c = quant::load_calibration_cache(cfg.calib_cache, key);
    if (c.ok()) {
      for (const auto& v : plan.observe)
        if (!c.value().ranges.count(v)) {
          cache_problem = "stale: it has no range for activation '" + v + "'";
          break;
        }
      if (cache_problem.empty()) ranges = std::move(c.value().ranges), from_cache = true;
    } else if (c.status().code() != ErrorCode::kNotFound || cfg.calib_data.empty()) {
      cache_problem = c.status().message();
    }
    // Without data the error below says why; with data the build goes on: a warning.
    if (!cache_problem.empty() && !cfg.calib_data.empty())
      warn("calibration cache '" + cfg.calib_cache + "' refused (" + cache_problem +
           "): calibrating again and rewriting it");
  }
  size_t batch_count = 0;
  if (!from_cache) {
    if (cfg.calib_data.empty())
      return InvalidArgument("--int8: the calibration cache '", cfg.calib_cache, "' cannot be used (", cache_problem,
                             ") and no --calib-data was given to calibrate again");
    KILN_ASSIGN_OR_RETURN(auto batches,
                          read_calibration_batches(g, cfg.calib_data, cfg.calib_batches, cfg.calib_batch_size));
    batch_count = batches.size();
    KILN_ASSIGN_OR_RETURN(ranges, calibrate(model, plan, batches, cfg, calibrator, log, warn));
    if (!cfg.calib_cache.empty()) {
      quant::CalibrationCache cache{key, ranges};
      if (Status s = quant::save_calibration_cache(cfg.calib_cache, cache); !s.ok()) warn(s.message());
    }
  } else {
    log("[kiln build] INT8: ranges of " + std::to_string(plan.observe.size()) +
        " activations from the calibration "
        "cache " +
        cfg.calib_cache);
  }
  KILN_ASSIGN_OR_RETURN(quant::QdqResult q, quant::insert_qdq(g, plan, ranges));
  g.value_types.clear();
  KILN_RETURN_IF_ERROR(ops::infer_shapes(g).with_context("the model after Q/DQ insertion (a kiln bug): "));
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : q.activations)
    tensors.push_back({{"name", t.name},
                       {"min", t.range.min},
                       {"max", t.range.max},
                       {"scale", t.params.scale},
                       {"zero_point", t.params.zero_point},
                       {"type", "uint8"}});
  nlohmann::json rec = {{"mode", "calibrated"},
                        {"calibrator", key.calibrator},
                        {"batches", batch_count},
                        {"from_cache", from_cache},
                        {"calib_cache", cfg.calib_cache},
                        {"model_hash", hash},
                        {"quantized_nodes", q.nodes},
                        {"weights", q.weights},
                        {"biases", q.biases},
                        {"removed_activations", q.removed_activations},
                        {"excluded", plan.excluded},
                        {"tensors", tensors}};
  if (calibrator == quant::Calibrator::kPercentile) rec["percentile"] = cfg.calib_percentile;
  log("[kiln build] INT8: Q/DQ on " + std::to_string(q.nodes) + " nodes (" + std::to_string(q.weights) +
      " int8 weights, " + std::to_string(q.biases) + " int32 biases, " + std::to_string(tensors.size()) +
      " uint8 activations, " + std::to_string(q.removed_activations) + " Relu/Clip folded into their Q)" +
      (plan.excluded.empty() ? "" : ", " + std::to_string(plan.excluded.size()) + " excluded (FP32)"));
  return rec;
}

}  // namespace kiln::detail
