// kiln bench: latency and throughput of an engine (trtexec conventions). Builds in memory when given an
// ONNX model; runs warm-up iterations (excluded from the statistics), then measured ones on one or more
// concurrent contexts ("streams"); optional per-layer profile, Chrome trace and per-iteration times.
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/wait_policy.h"
#include "engine/engine_impl.h"
#include "tools/build_flags.h"
#include "tools/commands.h"
#include "tools/inputs.h"

namespace kiln::tools {

namespace {
using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string model;
  InputOptions in;   // in.shapes: --shapes, also the build profile for .onnx
  BuildFlags build;  // .onnx: the build (build.build_shapes: --shapes)
  std::vector<std::string> build_flags_given;
  int64_t batch = 0;
  int warmup = 1;
  double warmup_ms = 200;
  int iterations = 10;
  double duration_s = 3;
  int streams = 1;
  int profile_index = -1;
  double deadline_s = 0;  // --deadline: per run
  std::string export_times, export_profile;
  bool dump_profile = false, json = false;
  bool cuda_graph = false, no_data_transfers = false;  // device engines (--use-cuda-graph, --no-data-transfers)
};

// One measured iteration.
struct Sample {
  int stream = 0;
  double start_ms = 0, latency_ms = 0;  // start relative to the common start of the measurement
};
// One layer execution of a measured iteration (for the Chrome trace).
struct LayerEvent {
  int stream = 0;
  size_t layer = 0;
  double start_us = 0, dur_us = 0;
  bool body = false;  // `layer` indexes a stream's body rows
};

// A layer of a subgraph body (If/Loop/Scan, nested too), profiled on its own: its time is not in its
// control-flow layer's row.
struct BodyRow {
  std::string path, op, kernel;
  bool shape_work = false;
  size_t parent = 0;  // the main-graph layer it runs in
  double sum_ms = 0;
};

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  // Nearest-rank percentile, as trtexec reports it.
  size_t rank = static_cast<size_t>(std::ceil(q / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  if (!(f << text)) return IOError("cannot write '", path, "'");
  return Status::Ok();
}

Result<nlohmann::json> bench(const BenchOptions& o) {
  // Flag ranges are checked by CLI11 (bounded()); these hold for API-style callers too.
  if (o.streams < 1 || o.streams > kMaxStreams)
    return InvalidArgument("--streams must be in 1..", kMaxStreams, ", got ", o.streams);
  if (o.iterations < 1) return InvalidArgument("--iterations must be at least 1, got ", o.iterations);
  if (o.warmup < 0 || !(o.warmup_ms >= 0) || !(o.duration_s >= 0))
    return InvalidArgument("--warmup, --warmup-ms and --duration must not be negative");
  bool is_engine = o.model.size() > 5 && o.model.compare(o.model.size() - 5, 5, ".kiln") == 0;
  std::map<std::string, Dims> shapes;
  if (!o.in.shapes.empty()) {
    KILN_ASSIGN_OR_RETURN(shapes, parse_shapes(o.in.shapes));
  }
  std::shared_ptr<Engine> engine;
  double build_ms = 0, load_ms = 0;
  try {
    if (is_engine) {
      warn_ignored_build_flags(o.build_flags_given, o.model);
      auto t0 = Clock::now();
      engine = Engine::load(o.model);
      load_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    } else {
      auto t0 = Clock::now();
      // The --shapes used at run time also form the build's profile, as in trtexec; --batch alone
      // builds for any shape the model allows.
      BuildFlags flags = o.build;
      flags.build_shapes = o.in.shapes;
      KILN_ASSIGN_OR_RETURN(BuilderConfig cfg, builder_config(flags));
      engine = Builder(cfg).build_from_file(o.model);
      build_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    }
  } catch (const Error& e) {
    return detail_status(e);
  }
  const ir::Graph& g = *engine->impl().model.graph;
  if (o.batch > 0) {
    for (const auto& in : g.inputs) {
      if (g.initializers.count(in.name) || shapes.count(in.name) || !in.type.is_tensor()) continue;
      if (!in.type.shape.rank_known || in.type.shape.dims.empty()) continue;
      const auto& d0 = in.type.shape.dims[0];
      if (d0.known() && d0.value != o.batch)
        return InvalidArgument("--batch ", o.batch, ": input '", in.name, "' has a fixed first dim ", d0.value,
                               "; the model must be exported with a dynamic batch dim");
      Dims d;
      for (const auto& dim : in.type.shape.dims) d.push_back(dim.known() ? dim.value : 1);
      d[0] = o.batch;
      shapes[in.name] = d;
    }
  }
  auto profiles = engine->profiles();
  if (!profiles.empty()) {  // inputs not given take the profile's opt shapes
    const Profile& p =
        profiles[o.profile_index >= 0 && o.profile_index < static_cast<int>(profiles.size()) ? o.profile_index : 0];
    for (const auto& [name, r] : p.inputs)
      if (!shapes.count(name)) shapes[name] = r.opt;
  }
  // Inputs from --inputs / --input (trtexec's --loadInputs), else random (--input-range bounds them).
  KILN_ASSIGN_OR_RETURN(LoadedInputs loaded, load_inputs(o.in, g, shapes));
  const std::map<std::string, ops::Value>& values = loaded.values;
  int64_t batch = o.batch;
  nlohmann::json in_json = nlohmann::json::object();
  for (const auto& [name, v] : values) {
    if (!v.is_tensor()) return Unsupported("input '", name, "' is not a tensor; kiln bench feeds tensors only");
    in_json[name] = v.tensor.shape();
    if (batch <= 0 && v.tensor.rank() > 0) batch = v.tensor.dim(0);
  }
  if (batch <= 0) batch = 1;

  // Per-stream results.
  const int S = o.streams;
  const bool profiling = o.dump_profile || !o.export_profile.empty();
  const size_t L = g.nodes.size();
  std::vector<std::vector<Sample>> samples(S);
  std::vector<std::vector<LayerEvent>> events(S);
  std::vector<std::vector<double>> layer_sum_ms(S, std::vector<double>(L, 0.0));
  std::vector<std::vector<BodyRow>> body_rows(S);
  std::vector<std::map<std::string, size_t>> body_index(S);
  std::vector<size_t> running_layer(S, 0);  // the main-graph layer being run (body rows' parent)
  std::vector<int> warmups(S, 0);
  // Stream 0's context creation (the first context prepares every layer's tactic) and first run().
  double context_ms = 0, first_run_ms = 0;
  // Per stream and layer: runs whose tactic declined the shapes, before and after measuring.
  std::vector<std::vector<int64_t>> declined_before(S), declined_after(S);
  std::vector<Status> errors(S, Status::Ok());
  // Device engines: each measured run's phases (staging, compute, fetching) and the last graph state.
  std::vector<std::vector<double>> h2d(S), compute(S), d2h(S);
  std::vector<detail::DeviceRunStats> device_stats(S);
  bool on_device = false;
  std::barrier sync(S);
  Clock::time_point start;
  std::mutex start_mu;
  bool start_set = false;
  double start_wait_s = 0;

  auto worker = [&](int s) {
    std::unique_ptr<ExecutionContext> ctx;
    bool measuring = false;
    // The first run() of stream 0 is timed apart: warm-up or measured, whichever it is.
    bool first = s == 0;
    auto run_once = [&]() {
      auto b = Clock::now();
      ctx->run();
      if (first) first_run_ms = std::chrono::duration<double, std::milli>(Clock::now() - b).count(), first = false;
    };
    try {
      auto c0 = Clock::now();
      ctx = engine->create_context();
      if (s == 0) context_ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
      if (o.profile_index >= 0) ctx->set_profile(o.profile_index);
      const bool dev = detail::runs_on_device(ctx->impl());
      if (s == 0) on_device = dev;
      if (dev) detail::set_device_run_options(ctx->impl(), {o.cuda_graph, !o.no_data_transfers, /*time_phases=*/true});
      for (const auto& [name, v] : values)
        ctx->set_input(name, HostTensor::borrow(static_cast<DataTypeCode>(v.tensor.dtype()), v.tensor.shape(),
                                                v.tensor.raw(), v.tensor.nbytes()));
      if (profiling)
        detail::set_layer_timer(
            ctx->impl(), [&, s](size_t layer, const ir::Node&, Clock::time_point b, Clock::time_point e) {
              running_layer[s] = layer + 1 < L ? layer + 1 : 0;
              if (!measuring || layer >= L) return;
              double dur = std::chrono::duration<double, std::micro>(e - b).count();
              layer_sum_ms[s][layer] += dur / 1000.0;
              if (!o.export_profile.empty())
                events[s].push_back({s, layer, std::chrono::duration<double, std::micro>(b - start).count(), dur});
            });
      if (profiling)
        detail::set_body_layer_timer(ctx->impl(), [&, s](const engine::LayerExecutor::BodyLayerTime& t) {
          if (!measuring) return;
          auto [it, fresh] = body_index[s].emplace(t.path, body_rows[s].size());
          if (fresh) body_rows[s].push_back({t.path, t.node->op_type, t.kernel, t.shape_work, running_layer[s], 0});
          BodyRow& row = body_rows[s][it->second];
          row.sum_ms += t.self_ms;
          if (t.kernel != "reference" || !t.shape_work) row.shape_work = false;
          if (t.kernel != row.kernel && t.kernel.rfind("reference", 0) == 0) row.kernel = t.kernel;  // a decline shows
          if (!o.export_profile.empty())
            events[s].push_back({s, it->second, std::chrono::duration<double, std::micro>(t.begin - start).count(),
                                 t.self_ms * 1000.0, true});
        });
      // Warm-up: at least --warmup runs and --warmup-ms of running.
      auto w0 = Clock::now();
      while (warmups[s] < o.warmup ||
             std::chrono::duration<double, std::milli>(Clock::now() - w0).count() < o.warmup_ms) {
        if (o.deadline_s > 0) ctx->set_deadline(*deadline_after(o.deadline_s));
        run_once();
        ++warmups[s];
      }
      declined_before[s] = detail::declined_runs(ctx->impl());
    } catch (const Error& e) {
      errors[s] = detail_status(e);
    }
    sync.arrive_and_wait();  // every stream starts measuring together
    {
      std::lock_guard<std::mutex> lock(start_mu);
      if (!start_set) start = Clock::now(), start_wait_s = runqueue_wait_s(), start_set = true;
    }
    sync.arrive_and_wait();
    bool any_error = false;
    for (const auto& e : errors) any_error |= !e.ok();
    if (any_error) return;
    measuring = true;
    try {
      for (int i = 0;; ++i) {
        double elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
        if (i >= o.iterations && elapsed_s >= o.duration_s) break;
        if (o.deadline_s > 0) ctx->set_deadline(*deadline_after(o.deadline_s));
        auto b = Clock::now();
        run_once();
        auto e = Clock::now();
        samples[s].push_back({s, std::chrono::duration<double, std::milli>(b - start).count(),
                              std::chrono::duration<double, std::milli>(e - b).count()});
        if (detail::runs_on_device(ctx->impl())) {
          device_stats[s] = detail::device_run_stats(ctx->impl());
          h2d[s].push_back(device_stats[s].h2d_ms), compute[s].push_back(device_stats[s].compute_ms);
          d2h[s].push_back(device_stats[s].d2h_ms);
        }
      }
      declined_after[s] = detail::declined_runs(ctx->impl());
    } catch (const Error& e) {
      errors[s] = detail_status(e);
    }
  };
  std::vector<std::thread> threads;
  for (int s = 1; s < S; ++s) threads.emplace_back(worker, s);
  worker(0);
  for (auto& t : threads) t.join();
  auto end = Clock::now();
  const double end_wait_s = runqueue_wait_s();
  for (const auto& e : errors)
    if (!e.ok()) return e;

  std::vector<double> lat;
  for (const auto& v : samples)
    for (const auto& x : v) lat.push_back(x.latency_ms);
  std::vector<double> sorted = lat;
  std::sort(sorted.begin(), sorted.end());
  double sum = 0;
  for (double x : lat) sum += x;
  double wall_s = std::chrono::duration<double>(end - start).count();
  double qps = wall_s > 0 ? static_cast<double>(lat.size()) / wall_s : 0;
  double mean = lat.empty() ? 0 : sum / static_cast<double>(lat.size());
  // Median: the middle value, or the mean of the two middle values.
  double median = 0;
  if (!sorted.empty()) {
    size_t n = sorted.size();
    median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  }

  nlohmann::json j;
  j["model"] = o.model;
  j["kiln_version"] = version();
  j["built_from_onnx"] = !is_engine;
  j["build_ms"] = build_ms;
  j["inputs"] = in_json;
  j["batch"] = batch;
  j["streams"] = S;
  j["threads"] = kiln::threads();
  j["wait_policy"] = wait_policy_description();
  // The cores were shared when the scheduler took them from kiln's threads often: the figures then
  // measure the machine's load as much as kiln (core/wait_policy.h).
  const double thread_s = wall_s * kiln::threads() * S;
  const double wait_share = runqueue_wait_share(end_wait_s - start_wait_s, wall_s, kiln::threads() * S);
  j["runqueue_wait_share"] = wait_share;
  j["runqueue_wait_ms"] = 1e3 * (end_wait_s - start_wait_s);
  j["thread_ms"] = 1e3 * thread_s;
  j["cores_shared"] = wait_share > kSharedCoresWaitShare;
  int total_warmup = 0;
  for (int w : warmups) total_warmup += w;
  j["warmup_runs"] = total_warmup;
  j["iterations"] = lat.size();
  j["wall_s"] = wall_s;
  j["latency_ms"] = {{"median", median},
                     {"mean", mean},
                     {"min", sorted.empty() ? 0 : sorted.front()},
                     {"max", sorted.empty() ? 0 : sorted.back()},
                     {"p90", percentile(sorted, 90)},
                     {"p95", percentile(sorted, 95)},
                     {"p99", percentile(sorted, 99)}};
  j["throughput_qps"] = qps;
  j["throughput_ips"] = qps * static_cast<double>(batch);
  // Each stream's share of the aggregate (its own context: on a GPU its own CUDA stream and device memory).
  j["stream_qps"] = nlohmann::json::array();
  for (const auto& v : samples) j["stream_qps"].push_back(wall_s > 0 ? static_cast<double>(v.size()) / wall_s : 0.0);
  j["first_run_ms"] = first_run_ms;
  j["first_run_vs_median"] = median > 0 ? first_run_ms / median : 0.0;
  j["context_ms"] = context_ms;
  j["load_ms"] = load_ms;
  if (on_device) {
    auto median_of = [](const std::vector<std::vector<double>>& per_stream) {
      std::vector<double> v;
      for (const auto& x : per_stream) v.insert(v.end(), x.begin(), x.end());
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
    };
    // Synchronized between phases: their medians add up to about the latency's.
    j["device_phases_ms"] = {{"h2d", median_of(h2d)}, {"compute", median_of(compute)}, {"d2h", median_of(d2h)}};
    j["data_transfers"] = !o.no_data_transfers;
    int captures = 0;
    int64_t replays = 0;
    for (const auto& d : device_stats) captures += d.graph_captures, replays += d.graph_replays;
    j["cuda_graph"] = {{"enabled", o.cuda_graph},
                       {"captures", captures},
                       {"replays", replays},
                       {"blocker", device_stats[0].graph_blocker}};
  } else if (o.cuda_graph || o.no_data_transfers) {
    return InvalidArgument(o.cuda_graph ? "--use-cuda-graph" : "--no-data-transfers",
                           ": this engine runs on the CPU (build it with --device cuda)");
  }

  const auto& layers = engine->impl().layers;
  // Layers whose tactic declined the run-time shapes in measured runs: they ran reference kernels.
  std::vector<int64_t> declined(L, 0);
  int declined_layers = 0;
  for (int s = 0; s < S; ++s)
    for (size_t l = 0; l < L && l < declined_after[s].size() && l < declined_before[s].size(); ++l)
      declined[l] += declined_after[s][l] - declined_before[s][l];
  for (int64_t d : declined) declined_layers += d > 0;
  j["declined_layers"] = declined_layers;
  if (profiling) {
    std::vector<double> total(L, 0.0);
    double all = 0;
    for (int s = 0; s < S; ++s)
      for (size_t l = 0; l < L; ++l) total[l] += layer_sum_ms[s][l], all += layer_sum_ms[s][l];
    // Body rows of every stream, merged by path, listed after the layer they run in.
    std::vector<BodyRow> bodies;
    std::map<std::string, size_t> body_at;
    for (int s = 0; s < S; ++s)
      for (const BodyRow& r : body_rows[s]) {
        auto [it, fresh] = body_at.emplace(r.path, bodies.size());
        if (fresh)
          bodies.push_back(r);
        else
          bodies[it->second].sum_ms += r.sum_ms;
        all += r.sum_ms;
      }
    std::vector<std::vector<size_t>> bodies_of(L);
    for (size_t b = 0; b < bodies.size(); ++b) bodies_of[std::min(bodies[b].parent, L - 1)].push_back(b);
    nlohmann::json prof = nlohmann::json::array();
    double runs = std::max<double>(1, static_cast<double>(lat.size()));
    double reference_ms = 0;
    int reference_layers = 0;
    for (size_t l = 0; l < L; ++l) {
      const ir::Node& n = g.nodes[l];
      std::string kernel = l < layers.size() ? layers[l].kernel : "";
      bool shape_work = l < layers.size() && layers[l].kernel == "reference" && layers[l].reference.shape_work;
      bool reference = (kernel == "reference" && !shape_work) || declined[l] > 0;
      if (declined[l] > 0) kernel = "reference (" + kernel + " declined)";
      reference_ms += reference ? total[l] : 0;
      reference_layers += reference;
      prof.push_back({{"layer", n.name},
                      {"op", n.op_type},
                      {"kernel", kernel},
                      {"reference", reference},
                      {"shape_work", shape_work},
                      {"declined_runs", declined[l]},
                      {"mean_ms", total[l] / runs},
                      {"percent", all > 0 ? 100.0 * total[l] / all : 0.0}});
      for (size_t b : bodies_of[l]) {
        const BodyRow& r = bodies[b];
        bool ref = r.kernel.rfind("reference", 0) == 0 && !(r.kernel == "reference" && r.shape_work);
        reference_ms += ref ? r.sum_ms : 0;
        reference_layers += ref;
        prof.push_back({{"layer", r.path},
                        {"op", r.op},
                        {"kernel", r.kernel},
                        {"reference", ref},
                        {"shape_work", r.kernel == "reference" && r.shape_work},
                        {"body", true},
                        {"mean_ms", r.sum_ms / runs},
                        {"percent", all > 0 ? 100.0 * r.sum_ms / all : 0.0}});
      }
    }
    j["profile"] = prof;
    j["reference_layers"] = reference_layers;
    j["reference_percent"] = all > 0 ? 100.0 * reference_ms / all : 0.0;
  }

  if (!o.export_times.empty()) {
    nlohmann::json t = nlohmann::json::array();
    for (const auto& v : samples)
      for (const auto& x : v)
        t.push_back({{"stream", x.stream}, {"start_ms", x.start_ms}, {"latency_ms", x.latency_ms}});
    KILN_RETURN_IF_ERROR(write_file(o.export_times, t.dump(1)));
  }
  if (!o.export_profile.empty()) {
    nlohmann::json ev = nlohmann::json::array();
    for (int s = 0; s < S; ++s) {
      ev.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", 1},
                    {"tid", s},
                    {"args", {{"name", "stream " + std::to_string(s)}}}});
      int i = 0;
      for (const auto& x : samples[s])
        ev.push_back({{"name", "iteration " + std::to_string(i++)},
                      {"cat", "iteration"},
                      {"ph", "X"},
                      {"pid", 1},
                      {"tid", s},
                      {"ts", x.start_ms * 1000.0},
                      {"dur", x.latency_ms * 1000.0}});
      for (const auto& e : events[s]) {
        if (e.body) {
          const BodyRow& r = body_rows[s][e.layer];
          ev.push_back({{"name", r.path},
                        {"cat", "layer"},
                        {"ph", "X"},
                        {"pid", 1},
                        {"tid", s},
                        {"ts", e.start_us},
                        {"dur", e.dur_us},
                        {"args",
                         {{"op", r.op},
                          {"kernel", r.kernel},
                          {"shape_work", r.kernel == "reference" && r.shape_work},
                          {"body", true}}}});
          continue;
        }
        const ir::Node& n = g.nodes[e.layer];
        ev.push_back({{"name", n.name.empty() ? n.op_type : n.name},
                      {"cat", "layer"},
                      {"ph", "X"},
                      {"pid", 1},
                      {"tid", s},
                      {"ts", e.start_us},
                      {"dur", e.dur_us},
                      {"args",
                       {{"op", n.op_type},
                        {"kernel", e.layer < layers.size() ? layers[e.layer].kernel : ""},
                        {"shape_work", e.layer < layers.size() && layers[e.layer].kernel == "reference" &&
                                           layers[e.layer].reference.shape_work}}}});
      }
    }
    nlohmann::json trace = {{"traceEvents", ev}, {"displayTimeUnit", "ms"}};
    KILN_RETURN_IF_ERROR(write_file(o.export_profile, trace.dump()));
  }
  return j;
}

void print_text(const BenchOptions& o, const nlohmann::json& j) {
  std::printf("[kiln bench] model %s%s\n", o.model.c_str(),
              j["built_from_onnx"].get<bool>()
                  ? (" (built in memory in " + std::to_string(j["build_ms"].get<double>()) + " ms)").c_str()
                  : "");
  for (const auto& [name, shape] : j["inputs"].items())
    std::printf("[kiln bench] input %s %s\n", name.c_str(), shape.dump().c_str());
  std::printf(
      "[kiln bench] streams %d, threads %d (idle workers: %s), warm-up runs %d (excluded), measured iterations %zu in "
      "%.3f s\n",
      j["streams"].get<int>(), j["threads"].get<int>(), j["wait_policy"].get<std::string>().c_str(),
      j["warmup_runs"].get<int>(), j["iterations"].get<size_t>(), j["wall_s"].get<double>());
  const auto& l = j["latency_ms"];
  std::printf(
      "[kiln bench] Latency: min = %.4f ms, max = %.4f ms, mean = %.4f ms, median = %.4f ms, percentile(90%%) = %.4f "
      "ms, percentile(95%%) = %.4f ms, percentile(99%%) = %.4f ms\n",
      l["min"].get<double>(), l["max"].get<double>(), l["mean"].get<double>(), l["median"].get<double>(),
      l["p90"].get<double>(), l["p95"].get<double>(), l["p99"].get<double>());
  std::printf("[kiln bench] Throughput: %.3f qps, %.3f inferences/s (batch %lld)\n", j["throughput_qps"].get<double>(),
              j["throughput_ips"].get<double>(), static_cast<long long>(j["batch"].get<int64_t>()));
  if (j["streams"].get<int>() > 1) {
    std::string per;
    for (const auto& q : j["stream_qps"]) per += (per.empty() ? "" : ", ") + std::to_string(q.get<double>());
    std::printf(
        "[kiln bench] Throughput above is the aggregate of %d concurrent contexts (each its own stream and "
        "memory); per stream qps: %s\n",
        j["streams"].get<int>(), per.c_str());
  }
  if (j["cores_shared"].get<bool>())
    std::printf(
        "[kiln bench] warning: the cores were shared during the measurement (kiln's threads waited for a core "
        "%.0f%% of the time; over %.0f%% counts as shared): other runnable threads took them, and with libgomp's "
        "spinning workers that costs up to 2.5x. Measure on a quiet machine, or set OMP_WAIT_POLICY=passive where "
        "kiln must share its cores (README, 'Threads')\n",
        100 * j["runqueue_wait_share"].get<double>(), 100 * kSharedCoresWaitShare);
  std::printf("[kiln bench] First run: %.4f ms (%.2fx the median); context creation %.4f ms%s\n",
              j["first_run_ms"].get<double>(), j["first_run_vs_median"].get<double>(), j["context_ms"].get<double>(),
              j["built_from_onnx"].get<bool>()
                  ? ""
                  : (", engine load " + std::to_string(j["load_ms"].get<double>()) + " ms").c_str());
  if (j.contains("device_phases_ms")) {
    const auto& p = j["device_phases_ms"];
    std::printf(
        "[kiln bench] Device phases (median): H2D %.4f ms, compute %.4f ms, D2H %.4f ms%s\n", p["h2d"].get<double>(),
        p["compute"].get<double>(), p["d2h"].get<double>(),
        j["data_transfers"].get<bool>() ? "" : " (--no-data-transfers: inputs staged and outputs fetched once)");
    const auto& g = j["cuda_graph"];
    if (g["enabled"].get<bool>())
      std::printf("[kiln bench] CUDA graph: %d capture(s), %lld replay(s)%s\n", g["captures"].get<int>(),
                  static_cast<long long>(g["replays"].get<int64_t>()),
                  g["blocker"].get<std::string>().empty()
                      ? ""
                      : ("; not replayed: " + g["blocker"].get<std::string>()).c_str());
  }
  if (j["declined_layers"].get<int>() > 0)
    std::printf(
        "[kiln bench] warning: %d layers' tactics declined the run-time shapes: those layers ran reference kernels "
        "(--dump-profile marks them)\n",
        j["declined_layers"].get<int>());
  if (o.dump_profile && j.contains("profile")) {
    std::printf("\n%-48s %-20s %-16s %12s %8s\n", "Layer", "Op", "Kernel", "Mean (ms)", "% total");
    double total = 0;
    for (const auto& p : j["profile"]) {
      std::string name = p["layer"].get<std::string>();
      if (name.size() > 48) name = name.substr(0, 45) + "...";
      std::string kernel = p["kernel"].get<std::string>() + (p["reference"].get<bool>() ? " *" : "");
      std::printf("%-48s %-20s %-16s %12.4f %7.2f%%\n", name.c_str(), p["op"].get<std::string>().c_str(),
                  kernel.c_str(), p["mean_ms"].get<double>(), p["percent"].get<double>());
      total += p["mean_ms"].get<double>();
    }
    std::printf("%-48s %-20s %-16s %12.4f %7.2f%%\n", "Total (all layers)", "", "", total, 100.0);
    std::printf("Reference kernels (marked *, shape work not counted): %d layers, %.2f%% of the time\n",
                j["reference_layers"].get<int>(), j["reference_percent"].get<double>());
  }
  if (!o.export_times.empty()) std::printf("[kiln bench] wrote per-iteration times to %s\n", o.export_times.c_str());
  if (!o.export_profile.empty())
    std::printf("[kiln bench] wrote Chrome trace to %s (open in https://ui.perfetto.dev)\n", o.export_profile.c_str());
}
}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure latency and throughput of a model or engine (trtexec-like)");
  cmd->add_option("model", o->model, "model.onnx (built in memory with the Engine build flags) or model.kiln")
      ->required();
  cmd->add_option("--shapes", o->in.shapes, "input shapes NAME:1x3x224x224,... (also the build profile for .onnx)");
  add_input_options(cmd, o->in, /*with_shapes=*/false);
  auto build_flags = add_build_flags(cmd, o->build, nullptr);
  cmd->add_option("--batch", o->batch, "first dim of every input whose first dim is dynamic (not given by --shapes)")
      ->check(bounded(1, 1 << 30));
  cmd->add_option("--warmup", o->warmup, "warm-up runs per stream, excluded from statistics (default 1)")
      ->check(bounded(0, kMaxIterations));
  cmd->add_option("--warmup-ms", o->warmup_ms, "keep warming up for at least this long, ms (default 200)")
      ->check(bounded(0, kMaxSeconds * 1000));
  cmd->add_option("--iterations", o->iterations, "measure at least this many runs per stream (default 10)")
      ->check(bounded(1, kMaxIterations));
  cmd->add_option("--duration", o->duration_s, "measure for at least this many seconds (default 3)")
      ->check(bounded(0, kMaxSeconds));
  cmd->add_option("--streams", o->streams, "contexts running concurrently on their own threads (default 1)")
      ->check(bounded(1, kMaxStreams));
  add_deadline_option(cmd, o->deadline_s);
  cmd->add_option("--profile-index", o->profile_index, "engines: run on this optimization profile");
  cmd->add_option("--export-times", o->export_times, "write every measured iteration's latency to FILE.json");
  cmd->add_flag("--dump-profile", o->dump_profile, "print a per-layer time table");
  cmd->add_option("--export-profile", o->export_profile,
                  "write a per-layer Chrome trace (FILE.json; one track per stream; opens in Perfetto)");
  cmd->add_flag("--json", o->json, "print the results as JSON on stdout");
  cmd->add_flag("--use-cuda-graph", o->cuda_graph,
                "device engines: capture the layer launches into a CUDA graph once per input shape and replay it "
                "(layers on the host prevent it: the reason is reported)");
  cmd->add_flag("--no-data-transfers", o->no_data_transfers,
                "device engines: stage the inputs and fetch the outputs once, then time the compute alone");
  cmd->callback([o, build_flags, &exit_code]() {
    o->build_flags_given = given_flags(build_flags);
    auto r = bench(*o);
    if (!r.ok()) {
      exit_code = report_error(r.status());
      return;
    }
    if (o->json)
      std::printf("%s\n", r.value().dump(1).c_str());
    else
      print_text(*o, r.value());
    exit_code = kExitOk;
  });
}

}  // namespace kiln::tools
