// Automatic mixed precision: the sensitivity ranking and the search (engine/auto_precision.h).
#include "engine/auto_precision.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "engine/calibration.h"
#include "engine/engine_impl.h"
#include "engine/precision.h"
#include "engine/target.h"

namespace kiln::detail {

namespace {

bool parse_number(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(*out);
}

}  // namespace

Result<Tolerance> parse_tolerance(const std::string& spec) {
  const std::string form = "' must look like OUTPUT:atol=1e-3,rtol=1e-2 or OUTPUT:top1=0.995";
  Tolerance t;
  t.spec = spec;
  const size_t c = spec.rfind(':');
  if (c == std::string::npos || c == 0 || c + 1 == spec.size()) return InvalidArgument("--tolerance '", spec, form);
  t.output = spec.substr(0, c);
  const std::string body = spec.substr(c + 1);
  bool close = false, top = false;
  for (size_t pos = 0; pos <= body.size();) {
    size_t comma = body.find(',', pos);
    std::string item = body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? body.size() + 1 : comma + 1;
    const size_t eq = item.find('=');
    double v = 0;
    if (eq == std::string::npos || !parse_number(item.substr(eq + 1), &v))
      return InvalidArgument("--tolerance '", spec, "': '", item,
                             "' is not KEY=NUMBER (keys: atol, rtol, top1, top5, ...)");
    const std::string key = item.substr(0, eq);
    if (key == "atol" || key == "rtol") {
      if (v < 0) return InvalidArgument("--tolerance '", spec, "': ", key, " must be >= 0");
      (key == "atol" ? t.atol : t.rtol) = v;
      close = true;
    } else if (key.size() > 3 && key.compare(0, 3, "top") == 0 &&
               key.find_first_not_of("0123456789", 3) == std::string::npos) {
      if (top) return InvalidArgument("--tolerance '", spec, "': give one topK agreement");
      t.k = std::atoi(key.c_str() + 3);
      if (t.k < 1) return InvalidArgument("--tolerance '", spec, "': ", key, ": K must be >= 1");
      if (!(v > 0 && v <= 1))
        return InvalidArgument("--tolerance '", spec, "': ", key, "=", item.substr(eq + 1),
                               " is the share of rows that must agree, in (0, 1] (e.g. top1=0.995)");
      t.agreement = v;
      top = true;
    } else {
      return InvalidArgument("--tolerance '", spec, "': unknown key '", key, "' (atol, rtol, or topK such as top1)");
    }
  }
  if (close && top)
    return InvalidArgument("--tolerance '", spec,
                           "': atol/rtol and topK are different tolerances: give them as two --tolerance flags");
  t.kind = top ? Tolerance::Kind::kTopK : Tolerance::Kind::kClose;
  if (close && t.atol == 0 && t.rtol == 0)
    return InvalidArgument("--tolerance '", spec,
                           "': atol=0 and rtol=0 ask for outputs identical to FP32's, which only the FP32 engine "
                           "meets — build with --fp32, or give a tolerance above zero");
  return t;
}

Status accumulate_error(const Tolerance& t, const Tensor& ref, const Tensor& got, OutputError* e) {
  if (ref.dtype() != DataType::kFloat32 || got.dtype() != DataType::kFloat32)
    return InvalidArgument("--tolerance '", t.spec, "': output '", t.output, "' is ", ref.describe(),
                           ": a tolerance applies to a float32 output");
  if (ref.shape() != got.shape())
    return Internal("output '", t.output, "': the engine gave ", got.describe(), ", the FP32 engine ", ref.describe());
  const float* r = ref.data<float>();
  const float* g = got.data<float>();
  const int64_t n = ref.numel();
  for (int64_t i = 0; i < n; ++i) {
    double d = std::fabs(static_cast<double>(g[i]) - r[i]);
    if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
    e->max_abs = std::max(e->max_abs, d);
    e->sq_err += std::isfinite(d) ? d * d : std::numeric_limits<double>::max();
    e->sq_ref += static_cast<double>(r[i]) * r[i];
    if (t.kind == Tolerance::Kind::kClose) {
      const double bound = t.atol + t.rtol * std::fabs(r[i]);
      if (!(d <= bound)) ++e->violations;
      const double ratio = bound > 0 ? d / bound : (d > 0 ? std::numeric_limits<double>::infinity() : 0);
      e->worst_ratio = std::max(e->worst_ratio, ratio);
    }
  }
  e->elements += n;
  if (t.kind == Tolerance::Kind::kTopK) {
    if (ref.rank() == 0)
      return InvalidArgument("--tolerance '", t.spec, "': output '", t.output,
                             "' is a scalar: topK needs classes along its last dim");
    const int64_t classes = ref.shape().back();
    if (classes == 0) return Status::Ok();
    for (int64_t row = 0; row < n / classes; ++row) {
      const float* rr = r + row * classes;
      const float* gr = g + row * classes;
      const int64_t want = std::max_element(rr, rr + classes) - rr;
      int64_t above = 0;  // candidate scores strictly above the reference class's
      bool finite = std::isfinite(gr[want]);
      for (int64_t j = 0; j < classes && finite; ++j) above += gr[j] > gr[want];
      ++e->rows;
      e->agree += finite && above < t.k;
    }
  }
  return Status::Ok();
}

bool tolerance_met(const Tolerance& t, const OutputError& e) {
  if (t.kind == Tolerance::Kind::kClose) return e.violations == 0;
  return e.rows > 0 && static_cast<double>(e.agree) >= t.agreement * static_cast<double>(e.rows) - 1e-9;
}

double sensitivity_of(const Tolerance& t, const OutputError& e) {
  if (t.kind == Tolerance::Kind::kClose) return e.worst_ratio;
  return e.sq_ref > 0 ? e.sq_err / e.sq_ref : e.sq_err;
}

std::string describe_error(const Tolerance& t, const OutputError& e) {
  char buf[200];
  if (t.kind == Tolerance::Kind::kTopK)
    std::snprintf(buf, sizeof buf, "top%d agreement %.2f%% (%lld/%lld, need %.2f%%), normalized sq. error %.3g", t.k,
                  e.rows ? 100.0 * static_cast<double>(e.agree) / static_cast<double>(e.rows) : 0.0,
                  static_cast<long long>(e.agree), static_cast<long long>(e.rows), 100 * t.agreement,
                  sensitivity_of(t, e));
  else
    std::snprintf(buf, sizeof buf, "max |d| %.3g, %.3g of the tolerance at worst, %lld of %lld elements outside",
                  e.max_abs, e.worst_ratio, static_cast<long long>(e.violations), static_cast<long long>(e.elements));
  return buf;
}

namespace {

namespace fs = std::filesystem;
using Batches = std::vector<std::map<std::string, ops::Value>>;
using Assignment = std::vector<DataType>;  // per unit

Precision to_precision(DataType t) {
  switch (t) {
    case DataType::kBFloat16: return Precision::kBF16;
    case DataType::kFloat16: return Precision::kFP16;
    case DataType::kInt8: return Precision::kINT8;
    default: return Precision::kFP32;
  }
}

// What a layer of a built engine computes in, as a candidate precision (kUndefined: FP32 or other).
DataType reduced_precision_of(const LayerInfo& l) {
  if (l.precision == "int8" || l.precision == "uint8") return DataType::kInt8;
  if (l.precision == "bf16") return DataType::kBFloat16;
  if (l.precision == "fp16") return DataType::kFloat16;
  return DataType::kUndefined;
}

// Per-layer times of the engine on `batch` (ms): each layer's fastest of `runs` runs after a warm-up
// one (the fastest, not the median: the machine may be shared, and interference only adds time). The
// tuner's own timings do not serve: a layer with one candidate (an INT8 layer, a layer forced to a
// precision) is prepared but not timed.
Result<std::vector<double>> profile_layers(const std::shared_ptr<EngineImpl>& impl,
                                           const std::map<std::string, ops::Value>& batch, int runs) {
  try {
    auto engine = std::make_shared<Engine>(impl);
    auto ctx = engine->create_context();
    for (const auto& [name, v] : batch)
      if (v.is_tensor())
        ctx->set_input(name, HostTensor::borrow(static_cast<DataTypeCode>(v.tensor.dtype()), v.tensor.shape(),
                                                v.tensor.raw(), v.tensor.nbytes()));
    const size_t n = impl->layers.size();
    std::vector<double> best(n, std::numeric_limits<double>::infinity()), cur(n, 0);
    set_layer_timer(ctx->impl(), [&](size_t layer, const ir::Node&, std::chrono::steady_clock::time_point b,
                                     std::chrono::steady_clock::time_point e) {
      if (layer < n) cur[layer] += std::chrono::duration<double, std::milli>(e - b).count();
    });
    ctx->run();
    for (int r = 0; r < runs; ++r) {
      std::fill(cur.begin(), cur.end(), 0.0);
      ctx->run();
      for (size_t l = 0; l < n; ++l) best[l] = std::min(best[l], cur[l]);
    }
    return best;
  } catch (const Error& e) {
    return status_of(e).with_context("timing a candidate engine: ");
  }
}

double sum_ms(const std::vector<double>& ms) {
  double t = 0;
  for (double x : ms) t += x;
  return t;
}

// A glob (engine::glob_match) matching exactly `name`, give or take the wildcard characters in it.
std::string literal_pattern(std::string name) {
  for (char& ch : name)
    if (ch == '*' || ch == '?' || ch == '[' || ch == ']' || ch == '\\') ch = '?';
  return name;
}

struct Option {
  DataType precision = DataType::kUndefined;
  double error = 0;     // sensitivity on the calibration inputs (max over the tolerances)
  double saved_ms = 0;  // the unit's layers' time in the FP32 engine minus theirs with every layer reduced
};

struct Unit {
  std::string layer, op;           // the FP32 engine's layer
  std::vector<std::string> names;  // the ONNX nodes it owns
  std::vector<DataType> candidates;
  std::vector<Option> options;  // measured, saving time, fastest first
};

struct Amp {
  const ir::Model& model;
  const BuilderConfig& cfg;
  std::function<void(const std::string&)> log;
  BuilderConfig base;
  std::vector<Tolerance> tolerances;
  Batches sens, held;
  std::vector<std::vector<Tensor>> ref_sens, ref_held;  // [batch][tolerance]
  std::vector<Unit> units;
  int builds = 0, suppressed_warnings = 0;

  Result<std::shared_ptr<EngineImpl>> build(const Assignment& a, bool pass_warnings = false) {
    BuilderConfig c = base;
    const bool any_int8 = std::find(a.begin(), a.end(), DataType::kInt8) != a.end();
    c.precision = any_int8 ? Precision::kINT8 : Precision::kFP32;
    for (size_t u = 0; u < a.size(); ++u) {
      if (a[u] == DataType::kInt8 || (a[u] == DataType::kFloat32 && !any_int8)) continue;
      for (const auto& n : units[u].names) c.layer_precisions.push_back({literal_pattern(n), to_precision(a[u])});
    }
    if (pass_warnings) c.warn = warner(cfg);
    return build_with(c);
  }
  Result<std::shared_ptr<EngineImpl>> build_with(const BuilderConfig& c) {
    ir::Model m = model;
    m.graph = ir::deep_copy(*model.graph);
    ++builds;
    return build_engine(std::move(m), c);
  }

  Result<std::vector<Tensor>> outputs(const EngineImpl& e, const std::map<std::string, ops::Value>& batch) {
    KILN_ASSIGN_OR_RETURN(std::vector<ops::Value> out, run_engine(e, batch));
    std::vector<Tensor> picked;
    for (const Tolerance& t : tolerances) {
      const auto& gout = e.model.graph->outputs;
      size_t i = 0;
      while (i < gout.size() && gout[i].name != t.output) ++i;
      if (i >= gout.size() || i >= out.size() || !out[i].is_tensor())
        return Internal("the engine has no tensor output '", t.output, "'");
      picked.push_back(out[i].tensor.clone());
    }
    return picked;
  }
  Result<std::vector<std::vector<Tensor>>> reference(const EngineImpl& e, const Batches& batches) {
    std::vector<std::vector<Tensor>> refs;
    for (size_t b = 0; b < batches.size(); ++b) {
      KILN_ASSIGN_OR_RETURN(auto o, outputs(e, batches[b]));
      for (size_t k = 0; k < o.size(); ++k) {
        const Tensor& t = o[k];
        if (t.dtype() != DataType::kFloat32)
          return InvalidArgument("--tolerance '", tolerances[k].spec, "': output '", tolerances[k].output, "' is ",
                                 t.describe(), ": a tolerance applies to a float32 output");
        for (int64_t i = 0; i < t.numel(); ++i)
          if (!std::isfinite(t.data<float>()[i]))
            return InvalidArgument("the FP32 engine's output '", tolerances[k].output,
                                   "' holds Inf/NaN on input batch ", b,
                                   ": no tolerance can be checked against it (kiln run --check-numerics names the "
                                   "layer)");
      }
      refs.push_back(std::move(o));
    }
    return refs;
  }
  Result<std::vector<OutputError>> evaluate(const EngineImpl& e, const Batches& batches,
                                            const std::vector<std::vector<Tensor>>& refs) {
    std::vector<OutputError> err(tolerances.size());
    for (size_t b = 0; b < batches.size(); ++b) {
      KILN_ASSIGN_OR_RETURN(auto o, outputs(e, batches[b]));
      for (size_t k = 0; k < tolerances.size(); ++k)
        KILN_RETURN_IF_ERROR(accumulate_error(tolerances[k], refs[b][k], o[k], &err[k]));
    }
    return err;
  }
  bool met(const std::vector<OutputError>& err) const {
    for (size_t k = 0; k < tolerances.size(); ++k)
      if (!tolerance_met(tolerances[k], err[k])) return false;
    return true;
  }
  double sensitivity(const std::vector<OutputError>& err) const {
    double s = 0;
    for (size_t k = 0; k < tolerances.size(); ++k) s = std::max(s, sensitivity_of(tolerances[k], err[k]));
    return s;
  }
  std::string describe(const std::vector<OutputError>& err) const {
    std::string s;
    for (size_t k = 0; k < tolerances.size(); ++k)
      s += (k ? "; " : "") + tolerances[k].output + ": " + describe_error(tolerances[k], err[k]);
    return s;
  }
  // Whether the unit's nodes compute in `p` in engine `e`.
  static bool realized(const EngineImpl& e, const Unit& u, DataType p) {
    std::set<std::string> names(u.names.begin(), u.names.end());
    for (const LayerInfo& l : e.layers) {
      if (reduced_precision_of(l) != p) continue;
      for (const auto& s : l.sources)
        if (names.count(s)) return true;
    }
    return false;
  }
};

std::string ms_str(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", ms);
  return buf;
}

std::string join_assignment(const std::vector<Unit>& units, const Assignment& a) {
  std::map<std::string, int> counts;
  for (size_t u = 0; u < a.size(); ++u) ++counts[engine::precision_name(a[u])];
  std::string s;
  for (const auto& [p, n] : counts) s += (s.empty() ? "" : ", ") + p + " x" + std::to_string(n);
  (void)units;
  return s;
}

}  // namespace

Result<std::shared_ptr<EngineImpl>> build_auto_precision(const ir::Model& model, const BuilderConfig& cfg) {
  auto t0 = std::chrono::steady_clock::now();
  auto log = [&](const std::string& line) {
    if (cfg.log)
      cfg.log(line);
    else if (cfg.verbose)
      std::fprintf(stderr, "%s\n", line.c_str());
  };
  Amp amp{model, cfg, log, cfg, {}, {}, {}, {}, {}, {}};
  // KILN_AUTO_PRECISION_IGNORE_TIME=1 keeps reduced candidates even where the measured times say they
  // save nothing (tests on a busy machine, where timings are noise; the search is about error then).
  const char* ignore_env = std::getenv("KILN_AUTO_PRECISION_IGNORE_TIME");
  const bool ignore_time = ignore_env && std::string(ignore_env) == "1";
  // Tolerances, checked against the model's outputs.
  if (cfg.tolerances.empty())
    return InvalidArgument(
        "--precision auto needs a --tolerance: OUTPUT:atol=A,rtol=R (elementwise, against the FP32 engine) or "
        "OUTPUT:top1=0.995 (share of rows whose top class matches FP32's)");
  for (const auto& spec : cfg.tolerances) {
    KILN_ASSIGN_OR_RETURN(Tolerance t, parse_tolerance(spec));
    bool found = false;
    std::string names;
    for (const auto& o : model.graph->outputs) {
      found |= o.name == t.output;
      names += (names.empty() ? "'" : ", '") + o.name + "'";
    }
    if (!found)
      return InvalidArgument("--tolerance '", spec, "': the model has no output '", t.output, "' (its outputs: ", names,
                             ")");
    amp.tolerances.push_back(t);
  }
  if (cfg.strongly_typed)
    return InvalidArgument(
        "--precision auto chooses each layer's precision; --strongly-typed takes them from the "
        "graph's types — give one or the other");
  if (cfg.calib_data.empty())
    return InvalidArgument(
        "--precision auto needs --calib-data: representative inputs, the first --calib-batches of them to calibrate "
        "and measure each layer's sensitivity on, the rest held back to check the tolerance on");
  // Calibration and held-back batches.
  KILN_ASSIGN_OR_RETURN(Batches all, read_calibration_batches(*model.graph, cfg.calib_data, 0, cfg.calib_batch_size));
  const int total = static_cast<int>(all.size());
  const int n_cal = cfg.calib_batches > 0 ? cfg.calib_batches : std::max(1, total * 3 / 4);
  if (n_cal >= total)
    return InvalidArgument(
        "--precision auto checks the tolerance on held-back inputs, the batches of --calib-data "
        "after the first --calib-batches (",
        n_cal, " of ", total,
        " here): none is left — give more data or a smaller --calib-batches (a stacked .npz is "
        "cut into --calib-batch-size rows)");
  for (int b = 0; b < n_cal && b < 2; ++b) amp.sens.push_back(all[static_cast<size_t>(b)]);
  for (int b = n_cal; b < total; ++b) amp.held.push_back(std::move(all[static_cast<size_t>(b)]));
  all.clear();
  // The sub-builds: FP32 plus what the search assigns; one timing cache and one calibration shared.
  fs::path tmp = fs::temp_directory_path() / ("kiln-auto-precision-" + std::to_string(::getpid()) + "-" +
                                              std::to_string(t0.time_since_epoch().count()));
  std::error_code ec;
  fs::create_directories(tmp, ec);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(p, e);
    }
  } cleanup{tmp};
  BuilderConfig& base = amp.base;
  base.auto_precision = false;
  base.tolerances.clear();
  base.log = [](const std::string&) {};
  base.verbose = false;
  base.warn = [&amp](const std::string&) { ++amp.suppressed_warnings; };
  base.precision = Precision::kFP32;
  base.extra_precisions.clear();
  base.calib_batches = n_cal;
  // --layer-precisions stay the user's (their layers are left out of the search); the search's own
  // entries are preferences (a layer without a kernel of the precision falls back to FP32, quietly).
  if (base.precision_constraints == PrecisionConstraints::kNone) base.layer_precisions.clear();
  base.precision_constraints = PrecisionConstraints::kPrefer;
  if (base.timing_cache.empty()) base.timing_cache = (tmp / "timing.cache").string();
  if (base.calib_cache.empty()) base.calib_cache = (tmp / "calibration.cache").string();

  // Candidate precisions: those --bf16/--int8 name, else every one with usable kernels here.
  std::vector<Precision> asked{cfg.precision};
  asked.insert(asked.end(), cfg.extra_precisions.begin(), cfg.extra_precisions.end());
  std::vector<DataType> wanted;
  for (Precision p : asked)
    if (p != Precision::kFP32 && p != Precision::kMixed) wanted.push_back(engine::precision_dtype(p));
  const bool named = !wanted.empty();
  if (!named) wanted = {DataType::kInt8, DataType::kBFloat16};
  KILN_ASSIGN_OR_RETURN(Target target, engine::target_for(cfg));
  std::vector<DataType> precisions;
  for (DataType p : wanted) {
    BuilderConfig probe;
    probe.device = cfg.device;
    probe.isa = cfg.isa;
    probe.precision = to_precision(p);
    std::vector<std::string> why;
    auto policy = engine::precision_policy(probe, target, [&](const std::string& w) { why.push_back(w); });
    if (!policy.ok()) {
      if (named) return policy.status();
      continue;
    }
    const auto& allowed = policy.value().allowed;
    if (std::find(allowed.begin(), allowed.end(), p) != allowed.end())
      precisions.push_back(p);
    else if (named)
      for (const auto& w : why) warner(cfg)(w);
  }
  std::string cand_names;
  for (DataType p : precisions) cand_names += (cand_names.empty() ? "" : ", ") + engine::precision_name(p);
  log("[kiln build] auto precision: tolerance " +
      [&] {
        std::string s;
        for (const auto& t : amp.tolerances) s += (s.empty() ? "" : " and ") + t.spec;
        return s;
      }() +
      "; candidates " + (cand_names.empty() ? std::string("none") : cand_names) + "; " + std::to_string(n_cal) +
      " calibration batches, " + std::to_string(amp.held.size()) + " held back");

  // 1. The FP32 reference, and which layers compute in what when everything may be reduced.
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<EngineImpl> fp32, amp.build({}, true));
  const int kRuns = 5;
  KILN_ASSIGN_OR_RETURN(std::vector<double> fp32_layers, profile_layers(fp32, amp.sens[0], kRuns));
  const double fp32_ms = sum_ms(fp32_layers);
  // A unit's time in an engine: its layers' (those computing one of its nodes).
  auto unit_ms = [](const EngineImpl& e, const std::vector<double>& layer_ms, const std::vector<std::string>& names) {
    std::set<std::string> own(names.begin(), names.end());
    double ms = 0;
    for (size_t l = 0; l < e.layers.size(); ++l)
      for (const auto& s : e.layers[l].sources)
        if (own.count(s)) {
          ms += layer_ms[l];
          break;
        }
    return ms;
  };
  std::map<DataType, std::pair<std::shared_ptr<EngineImpl>, std::vector<double>>> full_engines;
  std::map<DataType, double> full_ms;
  KILN_ASSIGN_OR_RETURN(amp.ref_sens, amp.reference(*fp32, amp.sens));
  KILN_ASSIGN_OR_RETURN(amp.ref_held, amp.reference(*fp32, amp.held));
  std::map<std::string, size_t> owner;  // ONNX node -> the FP32 layer that first lists it
  for (size_t i = 0; i < fp32->layers.size(); ++i)
    for (const auto& s : fp32->layers[i].sources) owner.emplace(s, i);
  auto user_pinned = [&](const LayerInfo& l) {
    for (const LayerPrecision& r : cfg.layer_precisions) {
      if (engine::glob_match(r.pattern, l.name)) return true;
      for (const auto& s : l.sources)
        if (engine::glob_match(r.pattern, s)) return true;
    }
    return false;
  };
  std::map<size_t, std::set<DataType>> candidates;
  nlohmann::json full = nlohmann::json::object();
  for (DataType p : precisions) {
    BuilderConfig c = base;
    c.precision = to_precision(p);
    if (p != DataType::kInt8) c.layer_precisions.push_back({"*", to_precision(p)});
    auto e = amp.build_with(c);
    if (!e.ok()) return e.status().with_context("the build with every layer in " + engine::precision_name(p) + ": ");
    int reduced = 0;
    for (const LayerInfo& l : e.value()->layers) {
      if (reduced_precision_of(l) != p) continue;
      ++reduced;
      for (const auto& s : l.sources)
        if (auto it = owner.find(s); it != owner.end()) candidates[it->second].insert(p);
    }
    KILN_ASSIGN_OR_RETURN(auto err, amp.evaluate(*e.value(), amp.held, amp.ref_held));
    KILN_ASSIGN_OR_RETURN(std::vector<double> prof, profile_layers(e.value(), amp.sens[0], kRuns));
    const double ms = sum_ms(prof);
    full_engines[p] = {e.value(), std::move(prof)};
    full_ms[p] = ms;
    full[engine::precision_name(p)] = {
        {"measured_ms", ms}, {"layers", reduced}, {"held_back_met", amp.met(err)}, {"held_back", amp.describe(err)}};
    log("[kiln build] auto precision: every layer in " + engine::precision_name(p) + ": " + std::to_string(reduced) +
        " layers " + engine::precision_name(p) + ", " + ms_str(ms) + " (FP32 " + ms_str(fp32_ms) +
        "); held back: " + amp.describe(err));
  }
  for (const auto& [i, ps] : candidates) {
    const LayerInfo& l = fp32->layers[i];
    if (user_pinned(l)) continue;  // --layer-precisions decides it
    Unit u;
    u.layer = l.name;
    u.op = l.domain.empty() ? l.op_type : l.domain + "." + l.op_type;
    for (const auto& s : l.sources)
      if (owner[s] == i) u.names.push_back(s);
    u.candidates.assign(ps.begin(), ps.end());
    if (!u.names.empty()) amp.units.push_back(std::move(u));
  }

  // 2. Sensitivity: one unit reduced at a time.
  const size_t n = amp.units.size();
  for (size_t ui = 0; ui < n; ++ui) {
    Unit& u = amp.units[ui];
    for (DataType p : u.candidates) {
      // What it saves is measured where it does compute in `p`: in the engine with every layer in it.
      // A candidate saving nothing is not worth a build.
      const auto& [fe, fprof] = full_engines[p];
      const double saved = unit_ms(*fp32, fp32_layers, u.names) - unit_ms(*fe, fprof, u.names);
      if (!(saved > 0) && !ignore_time) continue;
      // Alone, a layer may not fold into the precision's kernel (an INT8 conv between FP32 layers keeps
      // its Q/DQ around an FP32 kernel): its error is still what quantizing it costs.
      Assignment a(n, DataType::kFloat32);
      a[ui] = p;
      KILN_ASSIGN_OR_RETURN(auto e, amp.build(a));
      KILN_ASSIGN_OR_RETURN(auto err, amp.evaluate(*e, amp.sens, amp.ref_sens));
      u.options.push_back({p, amp.sensitivity(err), saved});
    }
    // The precision whose every-layer engine is fastest first: INT8 pays in chains (a layer reading
    // and writing int8 needs no conversion), which one unit's time alone does not show.
    std::sort(u.options.begin(), u.options.end(),
              [&](const Option& x, const Option& y) { return full_ms[x.precision] < full_ms[y.precision]; });
  }
  // The ranking: every (unit, precision) measured, least sensitive first.
  struct Ranked {
    size_t unit;
    Option option;
  };
  std::vector<Ranked> ranking;
  for (size_t ui = 0; ui < n; ++ui)
    for (const Option& o : amp.units[ui].options) ranking.push_back({ui, o});
  std::stable_sort(ranking.begin(), ranking.end(),
                   [](const Ranked& x, const Ranked& y) { return x.option.error < y.option.error; });
  const bool close_only = std::all_of(amp.tolerances.begin(), amp.tolerances.end(),
                                      [](const Tolerance& t) { return t.kind == Tolerance::Kind::kClose; });
  log("[kiln build] auto precision: sensitivity ranking (one layer reduced at a time, on " +
      std::to_string(amp.sens.size()) + " calibration batch(es); error = " +
      (close_only ? "worst share of the tolerance" : "normalized squared error of the output") +
      "; saved = the layers' measured time, FP32 minus reduced), least sensitive first:");
  for (size_t r = 0; r < ranking.size(); ++r) {
    const Unit& u = amp.units[ranking[r].unit];
    char line[400];
    std::snprintf(line, sizeof line, "  %3zu  %-44s %-20s %-5s error %-10.3g saved %.3f ms", r + 1, u.layer.c_str(),
                  u.op.c_str(), engine::precision_name(ranking[r].option.precision).c_str(), ranking[r].option.error,
                  ranking[r].option.saved_ms);
    log(line);
  }

  // 3. Search on the held-back inputs.
  Assignment accepted(n, DataType::kFloat32);
  std::shared_ptr<EngineImpl> best = fp32;
  std::vector<OutputError> best_err;
  double best_ms = fp32_ms;
  { KILN_ASSIGN_OR_RETURN(best_err, amp.evaluate(*fp32, amp.held, amp.ref_held)); }
  std::vector<size_t> level(n, 0);  // the option each unit is tried at
  auto order_by_error = [&](std::vector<size_t>& v) {
    std::stable_sort(v.begin(), v.end(), [&](size_t x, size_t y) {
      return amp.units[x].options[level[x]].error < amp.units[y].options[level[y]].error;
    });
  };
  std::vector<size_t> pending;
  for (size_t ui = 0; ui < n; ++ui)
    if (!amp.units[ui].options.empty()) pending.push_back(ui);
  order_by_error(pending);
  int budget = 12;
  for (size_t m = pending.size(); m > 1; m >>= 1) budget += 3;
  int checks = 0;
  std::vector<std::string> dropped;
  nlohmann::json trail = nlohmann::json::array();
  while (!pending.empty() && budget > 0) {
    auto with = [&](size_t k) {
      Assignment a = accepted;
      for (size_t i = 0; i < k; ++i) a[pending[i]] = amp.units[pending[i]].options[level[pending[i]]].precision;
      return a;
    };
    struct Checked {
      bool met;
      std::shared_ptr<EngineImpl> e;
      std::vector<OutputError> err;
      double ms;
    };
    auto check = [&](size_t k) -> Result<Checked> {
      Assignment a = with(k);
      KILN_ASSIGN_OR_RETURN(auto e, amp.build(a));
      KILN_ASSIGN_OR_RETURN(auto err, amp.evaluate(*e, amp.held, amp.ref_held));
      --budget, ++checks;
      const bool ok = amp.met(err);
      KILN_ASSIGN_OR_RETURN(std::vector<double> prof, profile_layers(e, amp.sens[0], kRuns));
      const double ms = sum_ms(prof);
      trail.push_back({{"assignment", join_assignment(amp.units, a)},
                       {"measured_ms", ms},
                       {"met", ok},
                       {"held_back", amp.describe(err)}});
      log("[kiln build] auto precision: try " + join_assignment(amp.units, a) + ": " + ms_str(ms) + ", held back " +
          (ok ? "met" : "NOT met") + " (" + amp.describe(err) + ")");
      return Checked{ok, e, err, ms};
    };
    size_t lo = 0, hi = pending.size();
    KILN_ASSIGN_OR_RETURN(Checked top, check(hi));
    if (top.met) {
      accepted = with(hi), best = top.e, best_err = top.err, best_ms = top.ms;
      pending.clear();
      break;
    }
    std::shared_ptr<EngineImpl> lo_engine;
    std::vector<OutputError> lo_err;
    double lo_ms = 0;
    while (hi - lo > 1 && budget > 0) {
      const size_t mid = (lo + hi) / 2;
      KILN_ASSIGN_OR_RETURN(Checked c, check(mid));
      if (c.met)
        lo = mid, lo_engine = c.e, lo_err = c.err, lo_ms = c.ms;
      else
        hi = mid;
    }
    if (hi - lo > 1) break;  // out of budget: keep what is proven
    if (lo_engine) accepted = with(lo), best = lo_engine, best_err = lo_err, best_ms = lo_ms;
    // pending[lo] breaks the tolerance on top of the accepted ones: its next option, or FP32.
    const size_t culprit = pending[lo];
    std::vector<size_t> rest(pending.begin() + static_cast<std::ptrdiff_t>(lo) + 1, pending.end());
    if (++level[culprit] < amp.units[culprit].options.size())
      rest.push_back(culprit);
    else
      dropped.push_back(amp.units[culprit].layer);
    pending = std::move(rest);
    order_by_error(pending);
  }
  if (!pending.empty())
    log("[kiln build] auto precision: the build budget ran out with " + std::to_string(pending.size()) +
        " layer(s) untried: they stay FP32");

  // Reduced layers whose conversions cost more than they save: FP32 is the fastest then.
  if (best != fp32 && best_ms >= fp32_ms && !ignore_time) {
    warner(cfg)("--precision auto: the assignment meeting the tolerance runs in " + ms_str(best_ms) +
                ", no faster than FP32's " + ms_str(fp32_ms) + ": the engine is FP32");
    accepted.assign(n, DataType::kFloat32);
    best = fp32, best_ms = fp32_ms;
    KILN_ASSIGN_OR_RETURN(best_err, amp.evaluate(*fp32, amp.held, amp.ref_held));
  }
  // The result: its assignment, per layer as built.
  nlohmann::json assignment = nlohmann::json::array(), jranking = nlohmann::json::array();
  log("[kiln build] auto precision: chosen assignment (" + join_assignment(amp.units, accepted) + "):");
  for (size_t ui = 0; ui < n; ++ui) {
    const Unit& u = amp.units[ui];
    std::string p = engine::precision_name(accepted[ui]);
    // What the engine's layers compute the unit's nodes in (an INT8 unit between FP32 ones may keep
    // an FP32 kernel with its Q/DQ around: the rounding is INT8's, the speed FP32's).
    const bool built = accepted[ui] == DataType::kFloat32 || Amp::realized(*best, u, accepted[ui]);
    assignment.push_back({{"layer", u.layer},
                          {"op", u.op},
                          {"precision", p},
                          {"kernel_precision", built ? p : "fp32"},
                          {"nodes", u.names}});
    char line[300];
    std::snprintf(line, sizeof line, "  %-44s %-20s %s%s", u.layer.c_str(), u.op.c_str(), p.c_str(),
                  built ? "" : " (Q/DQ around an FP32 kernel)");
    log(line);
  }
  for (size_t r = 0; r < ranking.size(); ++r)
    jranking.push_back({{"rank", r + 1},
                        {"layer", amp.units[ranking[r].unit].layer},
                        {"precision", engine::precision_name(ranking[r].option.precision)},
                        {"error", ranking[r].option.error},
                        {"saved_ms", ranking[r].option.saved_ms}});
  nlohmann::json tols = nlohmann::json::array();
  for (const auto& t : amp.tolerances) tols.push_back(t.spec);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool reduced_any =
      std::any_of(accepted.begin(), accepted.end(), [](DataType p) { return p != DataType::kFloat32; });
  if (!reduced_any)
    warner(cfg)("--precision auto: no layer can be reduced within " + tols.dump() +
                " on the held-back inputs (or none saves time): the engine is FP32. The least sensitive candidate: " +
                (ranking.empty() ? std::string("none (no layer has a faster reduced-precision kernel)")
                                 : amp.units[ranking[0].unit].layer + " in " +
                                       engine::precision_name(ranking[0].option.precision)));
  char line[400];
  std::snprintf(line, sizeof line,
                "[kiln build] auto precision: %.3f ms vs FP32 %.3f ms (%.2fx, layer times on one batch); held back: "
                "%s; %d builds "
                "(%d checks), %.1f s",
                best_ms, fp32_ms, fp32_ms > 0 ? best_ms / fp32_ms : 0.0, amp.describe(best_err).c_str(), amp.builds,
                checks, seconds);
  log(line);
  best->build["config"]["precision"] = "auto";
  best->build["auto_precision"] = {{"tolerances", tols},
                                   {"candidates", cand_names},
                                   {"calibration_batches", n_cal},
                                   {"held_back_batches", amp.held.size()},
                                   {"held_back", amp.describe(best_err)},
                                   {"measured_ms", best_ms},
                                   {"fp32_measured_ms", fp32_ms},
                                   {"every_layer_reduced", full},
                                   {"ranking", jranking},
                                   {"assignment", assignment},
                                   {"search", trail},
                                   {"kept_fp32_by_search", dropped},
                                   {"builds", amp.builds},
                                   {"search_build_warnings", amp.suppressed_warnings},
                                   {"seconds", seconds}};
  best->build["build_seconds"] = seconds;
  return best;
}

}  // namespace kiln::detail
