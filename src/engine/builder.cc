// Builder: ONNX model -> optimized, memory-planned engine.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "backends/device_runtime.h"
#include "core/parallel.h"
#include "core/process_threads.h"
#include "core/wait_policy.h"
#include "engine/auto_precision.h"
#include "engine/calibration.h"
#include "engine/engine_impl.h"
#include "engine/executor.h"
#include "engine/precision.h"
#include "engine/profiles.h"
#include "engine/storage_dtypes.h"
#include "ir/rewrite.h"
#include "onnx/importer.h"
#include "ops/interpreter.h"
#include "ops/shape_inference.h"
#include "passes/pass.h"
#include "plugin/custom_ops.h"

namespace kiln {

namespace detail {

namespace {
// One table for both directions between internal codes and public categories.
constexpr std::pair<ErrorCode, ErrorCategory> kErrorMap[] = {
    {ErrorCode::kInvalidArgument, ErrorCategory::kInvalidArgument},
    {ErrorCode::kInvalidModel, ErrorCategory::kInvalidModel},
    {ErrorCode::kUnsupported, ErrorCategory::kUnsupported},
    {ErrorCode::kNotFound, ErrorCategory::kNotFound},
    {ErrorCode::kIOError, ErrorCategory::kIOError},
    {ErrorCode::kOutOfRange, ErrorCategory::kOutOfRange},
    {ErrorCode::kDeadlineExceeded, ErrorCategory::kDeadlineExceeded},
};
}  // namespace

[[noreturn]] void throw_error(const Status& s) {
  ErrorCategory c = ErrorCategory::kInternal;
  for (const auto& [code, cat] : kErrorMap)
    if (code == s.code()) c = cat;
  throw Error(c, s.message());
}

Status status_of(const Error& e) {
  ErrorCode c = ErrorCode::kInternal;
  for (const auto& [code, cat] : kErrorMap)
    if (cat == e.category()) c = code;
  return Status(c, e.what());
}

void EngineImpl::describe_layers() {
  layers.clear();
  for (const auto& n : model.graph->nodes) {
    LayerInfo l;
    l.name = n.name;
    l.op_type = n.op_type;
    l.domain = n.domain;
    l.kernel = "reference";
    l.sources = ir::sources_of(n);
    l.inputs = n.inputs;
    l.outputs = n.outputs;
    layers.push_back(std::move(l));
  }
}

Result<std::map<std::string, Dims>> EngineImpl::typical_shapes() const {
  const ir::Graph& g = *model.graph;
  std::map<std::string, Dims> shapes;
  for (const auto& in : g.inputs) {
    if (g.initializers.count(in.name)) continue;
    if (!profiles.empty())
      if (auto it = profiles[0].inputs.find(in.name); it != profiles[0].inputs.end()) {
        shapes[in.name] = it->second.opt;
        continue;
      }
    if (!in.type.is_tensor() || !in.type.shape.fully_known())
      return InvalidArgument("input '", in.name, "' ", in.type.str(), " has no concrete shape (no profile gives it)");
    shapes[in.name] = in.type.shape.concrete();
  }
  return shapes;
}

Result<std::map<std::string, Dims>> EngineImpl::ahead_shapes() const {
  auto typical = typical_shapes();
  if (typical.ok() || !profiles.empty()) return typical;
  const ir::Graph& g = *model.graph;
  std::map<std::string, Dims> shapes;
  for (const auto& in : g.inputs) {
    if (g.initializers.count(in.name)) continue;
    const SymShape& s = in.type.shape;
    bool batch_only = in.type.is_tensor() && s.rank_known && s.rank() >= 1;
    for (size_t d = 1; batch_only && d < s.rank(); ++d) batch_only = s.dims[d].known();
    if (!batch_only) return typical.status();
    Dims dims = {1};
    for (size_t d = 1; d < s.rank(); ++d) dims.push_back(s.dims[d].value);
    shapes[in.name] = std::move(dims);
  }
  return shapes;
}

std::function<void(const std::string&)> warner(const BuilderConfig& cfg) {
  if (cfg.warn) return cfg.warn;
  return [](const std::string& m) { std::fprintf(stderr, "kiln: warning: %s\n", m.c_str()); };
}

std::shared_ptr<engine::TacticRuntime> EngineImpl::tactic_runtime() const {
  std::call_once(runtime_once_, [&] {
    std::vector<std::string> kernels;
    for (const auto& l : layers) kernels.push_back(l.kernel);
    runtime_ = std::make_shared<engine::TacticRuntime>(model.graph, kernels, built_for);
    if (!runtime_->any()) return;
    // Prepared ahead at the shapes the engine was tuned for: weights are reordered here, on all
    // threads, not in the first run().
    auto shapes = ahead_shapes();
    if (!shapes.ok()) return;
    if (auto typed = infer_at(*model.graph, shapes.value()); typed.ok()) runtime_->prepare_ahead(*typed.value());
  });
  return runtime_;
}

namespace {

// What timings are valid for: this kiln with its kernel libraries ("0.1.0 + oneDNN 2.6.3": a
// library upgrade makes the cache stale), this CPU (model and ISA flags). The thread count is part
// of every key (tune/tuner.h), the device of every layer key.
tune::CacheIdentity cache_identity(const engine::TargetInfo& t) {
  std::string machine = t.cpu_model.empty() ? std::string("unknown cpu") : t.cpu_model;
  machine += " |";
  for (const auto& f : t.isa) machine += " " + f;
  std::string version = KILN_VERSION, libs = backends::tactic_libraries();
  if (!libs.empty()) version += " + " + libs;
  return {version, machine, KILN_BUILD};
}

std::string fixed_ms(double ms) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", ms);
  return b;
}

}  // namespace

// Picks each layer's kernel by timing its candidate tactics at `tune_shapes` (the first profile's opt
// shapes; engine/tactics.h, tune/tuner.h), through the timing cache of `cfg`.
// Each layer's precisions come from `policy` (engine/precision.h); a layer precision that no kernel
// meets fails the build under obey and falls back, with a warning, under prefer.
Status choose_kernels(EngineImpl& e, const std::map<std::string, Dims>& tune_shapes, const std::string& tuned_at,
                      const BuilderConfig& cfg, const engine::PrecisionPolicy& policy,
                      const std::function<void(const std::string&)>& log) {
  const std::function<void(const std::string&)> warn = warner(cfg);
  engine::TacticFilter filter = engine::tactic_filter(cfg.tactics);
  for (const auto& name : filter.allowed)
    if (name != "reference" && !backends::find_tactic(name)) {
      std::string known;
      for (const backends::Tactic* t : backends::all_tactics()) known += " " + t->name();
      return InvalidArgument("unknown tactic '", name, "' (this kiln has: reference", known, ")");
    }
  auto t0 = std::chrono::steady_clock::now();
  const double wait0_s = runqueue_wait_s();
  auto inferred = infer_at(*e.model.graph, tune_shapes);
  if (!inferred.ok() && !filter.none) return inferred.status();
  // Reference kernels only need no shapes: then shape work is judged on the declared types.
  std::shared_ptr<ir::Graph> typed = inferred.ok() ? std::move(inferred).value() : e.model.graph;
  // Why a layer stays on its reference kernel, and whether it is shape work (engine/reference_layers.cc).
  auto record_reference = [&](size_t i, const engine::LayerChoice& c) {
    LayerInfo& l = e.layers[i];
    if (l.kernel != "reference") return;
    l.reference.recorded = true;
    l.reference.reasons = engine::reference_reasons(typed->nodes[i], c, filter);
    l.reference.shape_work = engine::is_shape_work(*typed, typed->nodes[i]);
  };
  if (filter.none) {
    for (size_t i = 0; i < e.layers.size() && i < typed->nodes.size(); ++i) record_reference(i, {});
    log("[kiln build] kernels: reference only");
    return Status::Ok();
  }
  tune::CacheIdentity id = cache_identity(e.target);
  // Deterministic tactics time nothing: a timing cache would neither answer nor learn anything.
  tune::TimingCache cache = cfg.timing_cache.empty() || cfg.deterministic_tactics
                                ? tune::TimingCache(id)
                                : tune::TimingCache::open(cfg.timing_cache, id, warn);
  tune::TuneOptions tune_options;
  tune_options.first_viable = cfg.deterministic_tactics;
  tune::Tuner tuner(cache, tune_options);
  std::map<std::string, int> counts;
  int tuned = 0, timed = 0, prepared = 0, hits = 0, unproven = 0, disturbed = 0;
  double worst = 1;  // the largest median / fastest run among the disturbed timings
  for (size_t i = 0; i < e.layers.size() && i < typed->nodes.size(); ++i) {
    LayerInfo& l = e.layers[i];
    const ir::Node& node = typed->nodes[i];
    std::vector<std::string> names = l.sources;
    names.insert(names.begin(), l.name);
    const engine::LayerPrecisions lp =
        engine::layer_precisions(policy, names, engine::kernel_precision("reference", *typed, node));
    engine::LayerChoice choice = engine::choose_tactic(*typed, node, e.built_for, filter, tuner, lp.allowed);
    const backends::Tactic* winner = backends::find_tactic(choice.tuning.kernel);
    const bool moves_data = winner && !winner->info().computes();
    if (lp.required != DataType::kUndefined && !moves_data &&
        engine::kernel_precision(choice.tuning.kernel, *typed, node) != lp.required) {
      std::string why = "layer '" + l.name + "' (" + (l.domain.empty() ? l.op_type : l.domain + "." + l.op_type) +
                        "): --layer-precisions '" + lp.rule + "' cannot be met: no " +
                        engine::precision_name(lp.required) + " kernel takes it";
      std::vector<std::string> reasons = engine::reference_reasons(node, choice, filter);
      for (size_t r = 0; r < reasons.size() && r < 4; ++r) why += (r ? "; " : " (") + reasons[r];
      if (!reasons.empty()) why += reasons.size() > 4 ? "; ...)" : ")";
      if (policy.constraints == PrecisionConstraints::kObey)
        return Unsupported(why,
                           " — drop the entry or give that layer another precision, or use "
                           "--precision-constraints prefer to fall back");
      warn(why + "; it computes in the build's precisions instead (--precision-constraints prefer)");
      choice = engine::choose_tactic(*typed, node, e.built_for, filter, tuner, lp.fallback);
    }
    const tune::LayerTuning& t = choice.tuning;
    l.precision = engine::precision_name(engine::kernel_precision(t.kernel, *typed, node));
    l.kernel = t.kernel;
    l.candidates = t.candidates;
    record_reference(i, choice);
    counts[l.kernel]++;
    tuned += !t.candidates.empty();
    timed += t.timed, prepared += t.prepared, hits += t.cache_hits;
    // Every candidate with --verbose; otherwise the ones that cannot run this layer, with the reason.
    std::string detail, failures;
    for (const auto& c : t.candidates) {
      unproven += c.state == tune::CandidateResult::State::kUnproven;
      if (!c.from_cache && tune::disturbed(c)) ++disturbed, worst = std::max(worst, c.ms / c.min_ms);
      detail += " " + c.tactic + (c.tactic == l.kernel ? "*" : "") + " " + tune::state_name(c.state) +
                (c.state == tune::CandidateResult::State::kTimed ? " " + fixed_ms(c.ms) + " ms" : "") +
                (c.from_cache ? " (cached)" : "") + (c.error.empty() ? "" : " (" + c.error + ")") + ";";
      if (!c.error.empty()) failures += " " + c.tactic + ": " + c.error + ";";
    }
    if (cfg.verbose && !detail.empty())
      log("[kiln build] layer '" + l.name + "':" + detail);
    else if (!failures.empty())
      log("[kiln build] layer '" + l.name + "' runs " + l.kernel + ";" + failures);
  }
  // If/Loop/Scan bodies: their layers get kernels the same way (recorded on the body nodes).
  engine::BodyTuning bodies = engine::choose_body_tactics(*e.model.graph, *typed, e.built_for, filter, tuner);
  record_body_reference(e, bodies);  // reported with the main graph's (engine/reference_layers.cc)
  if (bodies.layers) {
    std::string kinds;
    int with = 0;
    for (const auto& [k, c] : bodies.kernels) kinds += " " + k + " x" + std::to_string(c), with += c;
    log("[kiln build] control-flow bodies: " + std::to_string(bodies.layers) + " layers, " + std::to_string(with) +
        " with a tactic" + (kinds.empty() ? "" : ":" + kinds));
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t added = cache.added();
  if (Status s = cache.save(warn); !s.ok()) warn(s.message());
  std::string summary;
  for (const auto& [k, c] : counts) summary += " " + k + " x" + std::to_string(c);
  log("[kiln build] kernels:" + summary);
  int threads = tuner.threads();
  e.build["tuning"] = {{"threads", threads},           {"at", tuned_at},
                       {"shapes", tune_shapes},        {"layers", tuned},
                       {"body_layers", bodies.layers}, {"timed", timed},
                       {"prepared", prepared},         {"cache_hits", hits},
                       {"unproven", unproven},         {"disturbed", disturbed},
                       {"seconds", seconds},           {"timing_cache", cfg.timing_cache},
                       {"cache_entries_added", added}};
  e.build["tuning"]["deterministic"] = cfg.deterministic_tactics;
  // The share of the tuner's thread time spent runnable but waiting for a core: other processes on
  // the cores, which slow every run of a candidate alike (the median/fastest test above misses them).
  const double wait_share = runqueue_wait_share(runqueue_wait_s() - wait0_s, seconds, threads);
  e.build["tuning"]["runqueue_wait_share"] = wait_share;
  char line[256];
  std::snprintf(line, sizeof line,
                "[kiln build] tuned %d layers for %d thread%s at %s: %d candidates timed, %d cache hits, %d "
                "prepared, %.2f s",
                tuned, threads, threads == 1 ? "" : "s", tuned_at.c_str(), timed, hits, prepared, seconds);
  std::string msg = line;
  if (cfg.deterministic_tactics) msg += " (deterministic: the first tactic that prepares, no timing)";
  if (unproven) msg += "; " + std::to_string(unproven) + " candidates unproven (shapes unknown before run time)";
  if (!cfg.timing_cache.empty() && !cfg.deterministic_tactics)
    msg += " (timing cache " + cfg.timing_cache + ": " + std::to_string(added) + " new)";
  log(msg);
  if (timed > 0 && wait_share > kSharedCoresWaitShare) {
    char w[320];
    std::snprintf(w, sizeof w,
                  "timings were disturbed: the tuner's threads waited for a core %.0f%% of the time (shared "
                  "cores: other runnable processes); the kernels chosen may not be the fastest. Rebuild on an idle "
                  "machine",
                  100 * wait_share);
    warn(std::string(w) + (cfg.timing_cache.empty() ? ""
                                                    : " after deleting the timing cache '" + cfg.timing_cache +
                                                          "' (it keeps these timings)"));
  } else if (tune::timings_unreliable(disturbed, timed)) {
    char w[320];
    std::snprintf(w, sizeof w,
                  "timings were disturbed: %d of the %d candidates timed ran their median up to %.1fx slower than "
                  "their fastest run (the machine is busy: other processes, or fewer free cores than %d "
                  "thread%s); the kernels chosen may not be the fastest. Rebuild on an idle machine",
                  disturbed, timed, worst, threads, threads == 1 ? "" : "s");
    warn(std::string(w) + (cfg.timing_cache.empty() ? ""
                                                    : " after deleting the timing cache '" + cfg.timing_cache +
                                                          "' (it keeps these timings)"));
  }
  return Status::Ok();
}

Result<std::shared_ptr<ir::Graph>> infer_at(const ir::Graph& g, const std::map<std::string, Dims>& input_shapes) {
  std::shared_ptr<ir::Graph> copy = ir::deep_copy(g);
  for (auto& in : copy->inputs) {
    auto it = input_shapes.find(in.name);
    if (it != input_shapes.end() && in.type.is_tensor()) in.type.shape = SymShape::from_dims(it->second);
  }
  copy->value_types.clear();
  ops::InferOptions opts;
  opts.fold_constants = true;
  KILN_RETURN_IF_ERROR(ops::infer_shapes(*copy, opts));
  return copy;
}

namespace {
std::map<std::string, std::optional<size_t>> sizes_in(const std::shared_ptr<ir::Graph>& copy) {
  std::map<std::string, std::optional<size_t>> sizes;
  for (const auto& n : copy->nodes)
    for (const auto& o : n.outputs) {
      if (o.empty()) continue;
      auto it = copy->value_types.find(o);
      if (it != copy->value_types.end() && it->second.is_tensor() && it->second.shape.fully_known() &&
          it->second.elem != DataType::kString && dtype_size(it->second.elem) > 0)
        sizes[o] = static_cast<size_t>(dims_numel(it->second.shape.concrete())) * dtype_size(it->second.elem);
      else
        sizes[o] = std::nullopt;
    }
  return sizes;
}
}  // namespace

Result<std::map<std::string, std::optional<size_t>>> value_sizes(const ir::Graph& g,
                                                                 const std::map<std::string, Dims>& input_shapes) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<ir::Graph> copy, infer_at(g, input_shapes));
  return sizes_in(copy);
}

Result<LayerPlan> plan_layers_at(const ir::Graph& g, const std::map<std::string, Dims>& input_shapes,
                                 engine::TacticRuntime* tactics) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<ir::Graph> typed, infer_at(g, input_shapes));
  auto sizes = sizes_in(typed);
  LayerPlan out;
  out.typed = typed;
  out.threads = std::max(1, kiln::max_threads());
  if (tactics && tactics->any()) out.prepared = tactics->prepare_all(*typed);
  out.prepared.resize(g.nodes.size());
  engine::LayerNeeds needs;
  needs.workspace = [&](size_t i) { return out.prepared[i] ? out.prepared[i]->workspace_bytes(out.threads) : 0; };
  needs.in_place_ok = [&](size_t i) { return out.prepared[i] == nullptr; };
  out.plan = engine::plan_memory(
      g,
      [&](const std::string& v) -> std::optional<size_t> {
        auto it = sizes.find(v);
        return it == sizes.end() ? std::nullopt : it->second;
      },
      needs);
  return out;
}

Result<engine::MemoryPlan> plan_at(const ir::Graph& g, const std::map<std::string, Dims>& input_shapes) {
  KILN_ASSIGN_OR_RETURN(auto sizes, value_sizes(g, input_shapes));
  return engine::plan_memory(g, [&](const std::string& v) -> std::optional<size_t> {
    auto it = sizes.find(v);
    return it == sizes.end() ? std::nullopt : it->second;
  });
}

namespace {

int count_nodes(const ir::Graph& g) { return static_cast<int>(g.nodes.size()); }

std::string bytes_str(size_t b) {
  char buf[64];
  if (b >= (size_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%zu bytes (%.1f MiB)", b, static_cast<double>(b) / (1 << 20));
  else
    std::snprintf(buf, sizeof buf, "%zu bytes", b);
  return buf;
}

// The layers' workspaces (PreparedLayer::workspace_bytes: tactic scratch), at the opt shapes and at
// every profile's max shapes: recorded in build["workspace"] (kiln inspect), e.plan re-planned with
// them at the opt shapes, and capped by cfg.workspace_bytes (kiln build --workspace): a layer whose
// kernel needs more at some profile's max shapes fails the build, naming it. Shapes other than the
// opt ones are prepared by a runtime of their own, dropped after the check: the engine keeps only its
// opt-shape preparation.
Status record_workspaces(EngineImpl& e, const BuilderConfig& cfg, const std::function<void(const std::string&)>& log) {
  const ir::Graph& g = *e.model.graph;
  auto runtime = e.tactic_runtime();
  std::vector<std::string> kernels;
  for (const auto& l : e.layers) kernels.push_back(l.kernel);
  std::vector<std::pair<std::string, std::map<std::string, Dims>>> at;
  auto typical = e.typical_shapes();
  if (typical.ok()) at.emplace_back("the opt shapes", typical.value());
  for (size_t i = 0; i < e.profiles.size(); ++i) {
    std::map<std::string, Dims> mx;
    for (const auto& [name, r] : e.profiles[i].inputs) mx[name] = r.max;
    if (typical.ok() && i == 0 && mx == typical.value()) continue;
    at.emplace_back("profile " + std::to_string(i) + " '" + e.profiles[i].name + "' max shapes", mx);
  }
  std::vector<size_t> need(g.nodes.size(), 0);
  std::vector<std::string> where(g.nodes.size());
  for (size_t k = 0; k < at.size(); ++k) {
    std::shared_ptr<engine::TacticRuntime> rt =
        k == 0 && typical.ok() ? runtime : std::make_shared<engine::TacticRuntime>(e.model.graph, kernels, e.built_for);
    KILN_ASSIGN_OR_RETURN(LayerPlan lp, plan_layers_at(g, at[k].second, rt.get()));
    if (k == 0 && typical.ok()) e.plan = lp.plan;
    for (const auto& [i, bytes] : lp.plan.workspace_sizes)
      if (bytes > need[i]) need[i] = bytes, where[i] = at[k].first;
  }
  nlohmann::json layers = nlohmann::json::object();
  size_t largest = 0, sum = 0;
  std::vector<size_t> over;
  for (size_t i = 0; i < need.size(); ++i) {
    if (!need[i]) continue;
    layers[g.nodes[i].name] = need[i];
    largest = std::max(largest, need[i]), sum += need[i];
    if (need[i] > cfg.workspace_bytes) over.push_back(i);
  }
  e.build["workspace"] = {{"limit_bytes", cfg.workspace_bytes},
                          {"largest_bytes", largest},
                          {"sum_bytes", sum},
                          {"opt_arena_bytes", e.plan.arena_bytes},
                          {"layers", layers}};
  if (!over.empty()) {
    std::string msg = std::to_string(over.size()) + " layer(s) need more workspace than the limit of " +
                      bytes_str(cfg.workspace_bytes) + " (--workspace):";
    for (size_t i : over) {
      const ir::Node& n = g.nodes[i];
      msg += "\n  - layer '" + n.name + "' (" + (n.domain.empty() ? n.op_type : n.domain + "." + n.op_type) +
             ", kernel " + kernels[i] + ") needs " + bytes_str(need[i]) + " at " + where[i];
    }
    msg += "\nRaise --workspace to at least " + std::to_string((largest + (1 << 20) - 1) >> 20) +
           "M, or exclude the tactic (--tactics with the others, or KILN_TACTICS) so that the layer takes one "
           "that needs less";
    return OutOfRange(msg);
  }
  if (largest)
    log("[kiln build] layer workspaces: largest " + bytes_str(largest) + " (limit " + bytes_str(cfg.workspace_bytes) +
        "), planned in the activation arena: " + bytes_str(e.plan.arena_bytes) + " at the opt shapes");
  return Status::Ok();
}

// CUDA float16/bfloat16 matrix products compute a fused GELU (erf) as cuBLASLt's tanh-form epilogue
// unless the build keeps it exact (BuilderConfig::exact_gelu): not silent, counted and recorded.
void report_gelu_as_tanh(EngineImpl* e, const Target& target, const std::function<void(const std::string&)>& log) {
  if (target.device.kind != DeviceKind::kCUDA || target.exact_gelu) return;
  int n = 0;
  for (size_t i = 0; i < e->layers.size() && i < e->model.graph->nodes.size(); ++i) {
    const ir::Node& node = e->model.graph->nodes[i];
    const std::string& k = e->layers[i].kernel;
    if (node.domain == "kiln" && (node.op_type == "FusedMatMul" || node.op_type == "FusedGemm") &&
        node.attr_string("activation", "") == "Gelu" && node.attr_string("activation_approximate", "none") != "tanh" &&
        (k.rfind("matmul_cublaslt_f16_", 0) == 0 || k.rfind("matmul_cublaslt_bf16_", 0) == 0))
      ++n;
  }
  if (n == 0) return;
  e->build["gelu_as_tanh_layers"] = n;
  log("[kiln build] " + std::to_string(n) +
      " GELU (erf) layers fused into a reduced-precision cuBLASLt product compute GELU's tanh form (at most 4.7e-4 "
      "from erf; --exact-gelu keeps erf in a pass of its own)");
}

Result<std::shared_ptr<EngineImpl>> build_impl(ir::Model model, const BuilderConfig& cfg) {
  auto log = [&](const std::string& line) {
    if (cfg.log)
      cfg.log(line);
    else if (cfg.verbose)
      std::fprintf(stderr, "%s\n", line.c_str());
  };
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&]() { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  KILN_ASSIGN_OR_RETURN(Target target, engine::target_for(cfg));
  KILN_ASSIGN_OR_RETURN(engine::PrecisionPolicy precision, engine::precision_policy(cfg, target, warner(cfg)));
  // INT8: calibration (or the calibration cache) rewrites the model with Q/DQ nodes (engine/calibration.h);
  // the pass folding them into INT8 layers then decides per layer. Layers that --layer-precisions keeps
  // out of int8 get no Q/DQ.
  nlohmann::json int8;
  if (engine::int8_requested(cfg)) {
    BuilderConfig qcfg = cfg;
    for (const LayerPrecision& r : cfg.layer_precisions)
      if (cfg.precision_constraints != PrecisionConstraints::kNone && r.precision != Precision::kINT8)
        qcfg.int8_exclude.push_back(r.pattern);
    KILN_ASSIGN_OR_RETURN(int8, quantize_for_int8(model, qcfg, log, warner(cfg)));
  }
  KILN_RETURN_IF_ERROR(ops::check_supported(*model.graph));
  auto e = std::make_shared<EngineImpl>();
  e->built_for = target;
  e->build["source"] = {{"producer", model.producer_name + " " + model.producer_version},
                        {"ir_version", model.ir_version},
                        {"opsets", model.opset_imports},
                        {"path", model.path},
                        {"nodes", count_nodes(*model.graph)},
                        {"batch_norms", 0}};
  int bns = 0;
  for (const auto& n : model.graph->nodes) bns += n.op_type == "BatchNormalization";
  e->build["source"]["batch_norms"] = bns;
  if (!int8.is_null()) e->build["int8"] = int8;
  log("[kiln build] imported: " + std::to_string(count_nodes(*model.graph)) + " nodes");

  // Profiles: checked against the model's inputs (and completed), stored with the memory they plan.
  KILN_ASSIGN_OR_RETURN(std::vector<Profile> profiles, validate_profiles(*model.graph, cfg.profiles));
  // Build validates what run validates: the model as imported is inferred at every profile's min, opt
  // and max shapes before the passes rewrite it (fold_batch_norm would hide a BatchNormalization the
  // interpreter refuses), so an op check that a run at those shapes would fail fails the build, with
  // the message of the op's shape inference (which repeats its kernel's checks).
  for (size_t i = 0; i < profiles.size(); ++i)
    for (int which = 0; which < 3; ++which) {
      std::map<std::string, Dims> at;
      for (const auto& [name, r] : profiles[i].inputs) at[name] = which == 0 ? r.min : which == 1 ? r.opt : r.max;
      auto typed = infer_at(*model.graph, at);
      if (!typed.ok())
        return typed.status().with_context("profile " + std::to_string(i) + " '" + profiles[i].name + "' at its " +
                                           (which == 0   ? "min"
                                            : which == 1 ? "opt"
                                                         : "max") +
                                           " shapes: ");
    }
  // After the validation (which sees the model as the user declared it): dims every profile fixes
  // become constants, so the passes fold the shape arithmetic over them.
  if (int pinned = specialize_fixed_dims(*model.graph, profiles))
    log("[kiln build] " + std::to_string(pinned) + " input dim(s) fixed by every profile: specialized");
  // Kernels are tuned and memory planned at profile 0's opt shapes. The engine holds one kernel per
  // layer for every profile, so tuning at each profile's opt shapes would only choose between them by
  // some average; the first profile is the one the user names first (put the common case there).
  std::map<std::string, Dims> opt_shapes;
  std::string tuned_at = "the model's declared shapes (no profile)";
  if (!profiles.empty()) {
    for (const auto& [name, r] : profiles[0].inputs) opt_shapes[name] = r.opt;
    tuned_at = "profile 0 '" + profiles[0].name + "' opt shapes";
  }
  nlohmann::json precisions = nlohmann::json::array(), layer_precisions = nlohmann::json::array();
  for (DataType p : precision.allowed) precisions.push_back(engine::precision_name(p));
  for (const auto& r : precision.rules)
    layer_precisions.push_back(r.pattern + ":" + engine::precision_name(r.precision));
  static const char* constraint_names[] = {"none", "prefer", "obey"};
  e->build["config"] = {
      {"precision", !int8.is_null()          ? "int8"
                    : precisions.size() == 1 ? "fp32"
                                             : "mixed"},
      {"precisions", precision.strongly_typed ? nlohmann::json("strongly typed") : precisions},
      {"layer_precisions", layer_precisions},
      {"precision_constraints", constraint_names[static_cast<int>(precision.constraints)]},
      {"workspace_bytes", cfg.workspace_bytes},
      {"activation_bytes", cfg.activation_bytes},
      {"disabled_passes", cfg.disabled_passes},
      {"device", device_name(cfg.device)},
      {"isa", cfg.isa.empty() ? "native" : cfg.isa},
      {"layout_block", cfg.layout_block < 0 ? nlohmann::json("auto") : nlohmann::json(cfg.layout_block)}};
  log("[kiln build] target: " + target_description(target));

  std::set<std::string> disabled(cfg.disabled_passes.begin(), cfg.disabled_passes.end());
  KILN_ASSIGN_OR_RETURN(auto stats, passes::optimize(model, disabled, target));
  nlohmann::json jpasses = nlohmann::json::array();
  for (const auto& s : stats) {
    jpasses.push_back({{"name", s.name}, {"changed", s.changed}, {"ms", s.ms}});
    log("[kiln build] pass " + s.name + ": " + std::to_string(s.changed) + " change(s)");
  }
  e->build["passes"] = jpasses;
  model.opset_imports["kiln"] = 1;
  model.graph->opset_imports["kiln"] = 1;
  log("[kiln build] optimized: " + std::to_string(count_nodes(*model.graph)) + " layers");
  // Device engines with a reduced precision (and CPU bfloat16 builds on the channels-last AMX path):
  // activations stored in it between its layers, Casts where precisions meet (engine/storage_dtypes.h).
  if (target.device.kind != DeviceKind::kCPU || target.channels_last) {
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<ir::Graph> typed, infer_at(*model.graph, opt_shapes));
    KILN_ASSIGN_OR_RETURN(engine::StorageDtypeStats st,
                          engine::assign_storage_dtypes(*model.graph, *typed, target, precision));
    if (st.reduced != DataType::kUndefined) {
      e->build["storage_dtypes"] = {{"reduced", engine::precision_name(st.reduced)},
                                    {"reduced_layers", st.reduced_layers},
                                    {"casts", st.casts},
                                    {"constants_converted", st.constants}};
      log("[kiln build] storage dtypes: " + std::to_string(st.reduced_layers) + " layers in reduced precision (" +
          engine::precision_name(st.reduced) + "), " + std::to_string(st.casts) +
          " Cast layers where precisions meet, " + std::to_string(st.constants) + " constants converted");
      if (!st.float32_ops.empty()) {
        // Not silent: a reduced build whose computing layers stay float32 is slower than it looks.
        int n = 0;
        std::string ops;
        for (const auto& [op, count] : st.float32_ops) {
          n += count;
          ops += (ops.empty() ? "" : ", ") + op + " x" + std::to_string(count);
        }
        e->build["storage_dtypes"]["float32_layers"] = n;
        log("[kiln build] warning: " + std::to_string(n) + " computing layers stay float32: no " +
            engine::precision_name(st.reduced) + " kernel takes them (" + ops + "); e.g. " + st.float32_example);
      }
    }
  }

  KILN_ASSIGN_OR_RETURN(e->plan, plan_at(*model.graph, opt_shapes));
  if (e->plan.arena_bytes > cfg.activation_bytes)
    return OutOfRange("the activation memory plan needs ", e->plan.arena_bytes,
                      " bytes at the opt shapes, over the activation memory limit of ", cfg.activation_bytes,
                      " — raise --activation-memory or lower the opt/max shapes");
  for (size_t i = 0; i < profiles.size(); ++i) {
    Profile& p = profiles[i];
    std::map<std::string, Dims> mn, op, mx;
    for (const auto& [name, r] : p.inputs) mn[name] = r.min, op[name] = r.opt, mx[name] = r.max;
    KILN_ASSIGN_OR_RETURN(auto pmin, plan_at(*model.graph, mn));
    KILN_ASSIGN_OR_RETURN(auto popt, plan_at(*model.graph, op));
    KILN_ASSIGN_OR_RETURN(auto pmax, plan_at(*model.graph, mx));
    p.memory_min = pmin.arena_bytes, p.memory_opt = popt.arena_bytes, p.memory_max = pmax.arena_bytes;
    if (p.memory_max > cfg.activation_bytes)
      return OutOfRange("profile ", i, " '", p.name, "' needs ", p.memory_max,
                        " bytes of activation memory at its max shapes, over the activation memory limit of ",
                        cfg.activation_bytes, " — raise --activation-memory or lower the max shapes");
    std::string ranges;
    for (const auto& [name, r] : p.inputs)
      ranges += " " + name + " " + input_signature(*model.graph, name) + " " + dims_str(r.min) + ".." + dims_str(r.max);
    log("[kiln build] profile " + std::to_string(i) + " '" + p.name + "':" + ranges + "; activation memory min " +
        std::to_string(p.memory_min) + " / opt " + std::to_string(p.memory_opt) + " / max " +
        std::to_string(p.memory_max) + " bytes");
  }
  e->build["config"]["profiles"] = profiles_to_json(profiles);
  e->profiles = profiles;
  log("[kiln build] memory plan: peak " + std::to_string(e->plan.arena_bytes) + " bytes (naive " +
      std::to_string(e->plan.naive_bytes) + ")");
  e->target = engine::detect_host();
  if (const backends::DeviceRuntime* rt = backends::device_runtime(target.device.kind))
    e->target.gpu = rt->identity(target.device.index);
  e->model = std::move(model);
  e->describe_layers();
  KILN_RETURN_IF_ERROR(choose_kernels(*e, opt_shapes, tuned_at, cfg, precision, log));
  // Custom ops (src/plugin): which plugins the layers use (a loader without them refuses the engine),
  // and their states stored in the graph.
  KILN_ASSIGN_OR_RETURN(nlohmann::json plugins, plugin::record_plugins(*e->model.graph));
  if (!plugins.empty()) e->build["plugins"] = std::move(plugins);
  for (size_t i = 0; i < e->layers.size(); ++i)  // reference-only builds choose nothing
    if (e->layers[i].precision.empty())
      e->layers[i].precision = engine::precision_name(
          engine::kernel_precision(e->layers[i].kernel, *e->model.graph, e->model.graph->nodes[i]));
  // The CPU features the chosen kernels need (TacticInfo::isa): a machine without them refuses to load it.
  IsaSet needed = kIsaPortable;
  for (const LayerInfo& l : e->layers)
    if (const backends::Tactic* t = l.kernel == "reference" ? nullptr : backends::find_tactic(l.kernel))
      needed |= t->info().isa;
  e->required_isa.clear();
  if (needed != kIsaPortable) {
    std::stringstream names(isa_names(needed));
    for (std::string n; names >> n;) e->required_isa.push_back(n);
  }
  report_gelu_as_tanh(e.get(), target, log);
  KILN_RETURN_IF_ERROR(record_workspaces(*e, cfg, log));
  KILN_RETURN_IF_ERROR(report_reference_layers(e, cfg, engine::tactic_filter(cfg.tactics).none, log));
  KILN_RETURN_IF_ERROR(report_unfolded_qdq(e, cfg, log));
  e->build["build_seconds"] = elapsed();
  log("[kiln build] done in " + std::to_string(elapsed()) + " s");
  return e;
}

}  // namespace

Result<std::shared_ptr<EngineImpl>> build_engine(ir::Model model, const BuilderConfig& cfg) {
  try {
    if (cfg.auto_precision) return build_auto_precision(model, cfg);  // engine/auto_precision.h
    return build_impl(std::move(model), cfg);
  } catch (const std::bad_alloc&) {
    return OutOfRange("out of memory while building the engine");
  }
}

}  // namespace detail

Builder::Builder(BuilderConfig config) : config_(std::move(config)) {}

std::shared_ptr<Engine> Builder::build_from_file(const std::string& onnx_path) const try {
  if (Status p = plugin::load_env_plugins_once(); !p.ok()) detail::throw_error(p);
  sync_process_threads();
  auto m = onnx_import::load_model(onnx_path);
  if (!m.ok()) detail::throw_error(m.status());
  auto e = detail::build_engine(std::move(m).value(), config_);
  if (!e.ok()) detail::throw_error(e.status());
  return std::make_shared<Engine>(std::move(e).value());
} catch (...) {
  detail::rethrow_as_error("building an engine from '" + onnx_path + "'");
}

std::shared_ptr<Engine> Builder::build_from_memory(const std::string& onnx_bytes) const try {
  if (Status p = plugin::load_env_plugins_once(); !p.ok()) detail::throw_error(p);
  sync_process_threads();
  auto m = onnx_import::parse_model(onnx_bytes, "");
  if (!m.ok()) detail::throw_error(m.status());
  auto e = detail::build_engine(std::move(m).value(), config_);
  if (!e.ok()) detail::throw_error(e.status());
  return std::make_shared<Engine>(std::move(e).value());
} catch (...) {
  detail::rethrow_as_error("building an engine from memory");
}

const char* version() { return KILN_VERSION; }
void set_threads(int n) { kiln::set_num_threads(n); }
int threads() {
  sync_process_threads();
  return kiln::max_threads();
}

}  // namespace kiln
