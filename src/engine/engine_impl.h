// What an engine is inside: the optimized graph, its layers and kernels, the build record, and the
// memory plan at the optimization shapes. Shared read-only by every ExecutionContext.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/executor.h"
#include "engine/memory_planner.h"
#include "engine/tactics.h"
#include "engine/target.h"
#include "ir/graph.h"
#include "kiln/kiln.h"
#include "ops/value.h"

namespace kiln::detail {

// 2: layers carry the auto-tuner's candidates and times, build.tuning says how tuning was done.
constexpr uint32_t kEngineFormatVersion = 3;

struct LayerInfo {
  std::string name, op_type, domain, kernel;
  std::string precision;             // what the kernel computes in: "fp32", "bf16", ... (engine/precision.h)
  std::vector<std::string> sources;  // the ONNX nodes this layer came from
  std::vector<std::string> inputs, outputs;
  std::vector<tune::CandidateResult> candidates;  // the auto-tuner's results (empty: no tactic applied)
  // kernel == "reference": why (engine::reference_reasons), whether it is shape work rather than a
  // finding (engine::is_shape_work), and its time in the build's estimate run (ms < 0: not measured).
  // Engines of older builds lack the record: `recorded` false.
  struct Reference {
    bool recorded = false;
    bool shape_work = false;
    std::vector<std::string> reasons;
    double ms = -1;
  } reference;
  bool finding() const { return kernel == "reference" && reference.recorded && !reference.shape_work; }
};

struct EngineImpl {
  ir::Model model;                     // optimized graph; large weights alias `storage`
  std::shared_ptr<uint8_t[]> storage;  // the engine file's bytes when loaded
  std::vector<LayerInfo> layers;
  Target built_for;                       // device, instruction set, layout block, precision (engine/target.h)
  engine::TargetInfo target;              // the machine it was built on
  std::vector<std::string> required_isa;  // CPU features its kernels need
  nlohmann::json build;                   // config, profiles, pass counts, source model facts
  engine::MemoryPlan plan;                // at the build's shapes (opt), for inspect
  std::vector<Profile> profiles;          // optimization profiles (also in build["config"]["profiles"])

  void describe_layers();  // fills `layers` from the graph
  // The input shapes of a typical run, those the engine was tuned for: profile 0's opt shapes, else
  // the declared static shapes; an error naming an input whose shape stays unknown.
  Result<std::map<std::string, Dims>> typical_shapes() const;
  // The shapes layers are prepared and memory planned for ahead of the first run(): typical_shapes(),
  // or, with no profile and inputs whose only unknown dim is the first (a batch), batch 1 there (what
  // kiln bench runs without --batch). A run at other shapes prepares them on first use.
  Result<std::map<std::string, Dims>> ahead_shapes() const;

  // The layers' prepared tactics, made on first use (the first context) and shared by every context of
  // the engine: every layer is prepared then for ahead_shapes(), so that the first run() costs what
  // later ones do.
  std::shared_ptr<engine::TacticRuntime> tactic_runtime() const;

 private:
  mutable std::once_flag runtime_once_;
  mutable std::shared_ptr<engine::TacticRuntime> runtime_;
};

// Converts a Status into the public exception.
[[noreturn]] void throw_error(const Status& s);
// The Status behind a public kiln::Error (the inverse of throw_error).
Status status_of(const Error& e);
// The Status for an exception (errors.cc): kiln::Error keeps its category, bad_alloc and
// length_error are kOutOfRange, filesystem and system errors kIOError, JSON errors kInvalidModel,
// anything else kInternal. `what` ("loading the engine") prefixes the message.
Status status_of_exception(std::exception_ptr p, const std::string& what);
// In a catch (...) of a public entry point (a function-try-block): rethrows a kiln::Error as it
// is, anything else as the kiln::Error of status_of_exception.
[[noreturn]] void rethrow_as_error(const std::string& what);
// Calls f (returning Status or Result<T>); an exception escaping it becomes its Status.
template <typename F>
auto guarded(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (...) {
    return status_of_exception(std::current_exception(), what);
  }
}

// A copy of `g` with shapes inferred for these concrete input shapes (others keep their declaration).
Result<std::shared_ptr<ir::Graph>> infer_at(const ir::Graph& g, const std::map<std::string, Dims>& input_shapes);

// Sizes of every value of `g` when its inputs have the given concrete shapes (nullopt when
// data-dependent). Works on a private copy: safe to call from several contexts at once.
Result<std::map<std::string, std::optional<size_t>>> value_sizes(const ir::Graph& g,
                                                                 const std::map<std::string, Dims>& input_shapes);

// The memory plan of `g` when its inputs have these concrete shapes (activations only).
Result<engine::MemoryPlan> plan_at(const ir::Graph& g, const std::map<std::string, Dims>& input_shapes);

// The plan an execution context runs with: activations and the layers' workspaces at these input
// shapes, with `tactics` (may be null: reference kernels only) prepared there. prepared[i] is node
// i's prepared tactic (nullptr: its reference kernel runs); the workspaces are sized for `threads`
// threads (kiln::max_threads() at planning).
struct LayerPlan {
  engine::MemoryPlan plan;
  std::shared_ptr<const ir::Graph> typed;  // the graph inferred at these shapes
  std::vector<std::shared_ptr<const backends::PreparedLayer>> prepared;
  int threads = 1;
};
Result<LayerPlan> plan_layers_at(const ir::Graph& g, const std::map<std::string, Dims>& input_shapes,
                                 engine::TacticRuntime* tactics);

// The engine file (format in engine_file.cc).
Result<std::string> serialize_engine(const EngineImpl& e);
Status write_engine(const EngineImpl& e, const std::string& path);  // the same bytes, into a file
Result<std::shared_ptr<EngineImpl>> deserialize_engine(std::string_view bytes);
// Opens PATH without blocking (a regular file only), checks size, magic, version and lengths from
// its first 32 bytes before anything else, then maps it (the weights alias the mapping, no copy).
Result<std::shared_ptr<EngineImpl>> load_engine_file(const std::string& path);

// inspect's JSON: layers (a control-flow layer lists its bodies' layers and kernels under "bodies"),
// kernels, memory, profiles, the build record; "body_layers" counts the layers of all bodies.
nlohmann::json inspect(const EngineImpl& e);
// The layers of every control-flow body (If branches, Loop/Scan bodies, nested ones) of `g`, and how
// many run a tactic (engine::kBodyKernelAttr).
struct BodyLayerCount {
  int layers = 0, with_tactic = 0;
};
BodyLayerCount count_body_layers(const ir::Graph& g);

// Runs an engine on values (tensors, sequences, optionals) in a fresh context: what the tools use.
// `profile` forces a profile (-1: the first that fits); `info` receives the profile used and the
// activation memory of the run.
struct RunInfo {
  int profile = -1;
  size_t activation_bytes = 0;
};
Result<std::vector<ops::Value>> run_engine(
    const EngineImpl& e, const std::map<std::string, ops::Value>& inputs, int profile = -1, RunInfo* info = nullptr,
    std::function<void(const ir::Node&, const std::vector<ops::Value>&)> on_layer = nullptr);
// The same, calling `on_layer` after every layer with its outputs (kiln compare --find-divergence).
// The tensors may live in the context's arena: clone what must outlive the call.
Result<std::vector<ops::Value>> run_engine_observed(
    const EngineImpl& e, const std::map<std::string, ops::Value>& inputs,
    std::function<void(const ir::Node&, const std::vector<ops::Value>&)> on_layer);
// The same, calling `on_layer` after every layer, body layers included (If branches, Loop/Scan
// iterations), with its graph, inputs and outputs (kiln compare's near ties inside control flow).
Result<std::vector<ops::Value>> run_engine_observed_layers(
    const EngineImpl& e, const std::map<std::string, ops::Value>& inputs,
    std::function<void(const ir::Graph&, const ir::Node&, const std::vector<const ops::Value*>&,
                       const std::vector<ops::Value>&)>
        on_layer);
// run_engine with the numerics guard on (engine/numerics_guard.h): `report` receives what it found.
Result<std::vector<ops::Value>> run_engine_checked(const EngineImpl& e, const std::map<std::string, ops::Value>& inputs,
                                                   const NumericsCheck& check, NumericsReport* report, int profile = -1,
                                                   RunInfo* info = nullptr);
// ExecutionContext::set_numerics_check: installs the guard on the context's runs (off: removes it).
void set_numerics_check(ContextImpl& ctx, const NumericsCheck& check);
// Per-layer timing (kiln bench --dump-profile): called after every layer of each run of the context
// with the layer's index, its node, and the steady-clock times it began (the previous layer's end, or
// the start of the graph run) and ended (outputs placed in the arena). nullptr turns it off.
using LayerTimer = std::function<void(size_t layer, const ir::Node&, std::chrono::steady_clock::time_point begin,
                                      std::chrono::steady_clock::time_point end)>;
void set_layer_timer(ContextImpl& ctx, LayerTimer timer);
// Per-layer timing inside subgraph bodies (engine::LayerExecutor::body_timer): called after every body
// layer with its path, kernel and own time. While it is set, a control-flow layer's time given to the
// LayerTimer leaves out its body layers' time (its `begin` moves on by that much), so a profile's rows
// add up to the run. nullptr turns it off.
using BodyLayerTimer = std::function<void(const engine::LayerExecutor::BodyLayerTime&)>;
void set_body_layer_timer(ContextImpl& ctx, BodyLayerTimer timer);
// Per layer of the context's runs so far: how many times its tactic declined the run-time shapes and
// the layer ran its reference kernel instead (engine::LayerExecutor::declined_runs).
std::vector<int64_t> declined_runs(const ContextImpl& ctx);
// Why the context's last run went through the interpreter loop rather than the allocation-free bound
// path (engine/executor.h): "layer 'Flatten_3' (Flatten) runs its reference kernel"; "" when it did not.
std::string steady_state_blocker(const ContextImpl& ctx);
// How the context's last bind split the main graph (engine/executor.h, split runs): layers [0, bound)
// run bound (on the device for a device engine), the rest through the interpreter loop (on the host
// for a device engine) because of `reason` (about layer `bound`); bound == layers: none left out,
// bound == 0: not bound.
struct BoundSplit {
  size_t bound = 0, layers = 0;
  std::string reason;
};
BoundSplit bound_split(const ContextImpl& ctx);

// A device engine's context (kiln bench/run --use-cuda-graph, --no-data-transfers):
//   cuda_graph      the steady-state run's layer launches are captured into a device graph once per
//                   input-shape signature (and input/arena addresses) and replayed; a new signature
//                   captures again. A layer list that cannot be captured (a layer on the host, a failed
//                   capture) runs layer by layer, with the reason in DeviceRunStats::graph_blocker. Not
//                   with the numerics guard or a per-layer timer (they observe each layer).
//   data_transfers  false: after the first run, inputs of unchanged shapes are not staged again and
//                   outputs stay on the device (output() then reads the last fetched ones): the compute
//                   alone, as trtexec --noDataTransfers.
//   time_phases     synchronize between staging, compute and fetching to time each (DeviceRunStats).
struct DeviceRunOptions {
  bool cuda_graph = false;
  bool data_transfers = true;
  bool time_phases = false;
};
struct DeviceRunStats {
  int graph_captures = 0;
  int64_t graph_replays = 0;
  std::string graph_blocker;  // why the last run did not replay a graph ("" when it did, or graphs are off)
  double h2d_ms = 0, compute_ms = 0, d2h_ms = 0;  // the last run's phases (time_phases)
};
void set_device_run_options(ContextImpl& ctx, const DeviceRunOptions& o);
DeviceRunStats device_run_stats(const ContextImpl& ctx);
bool runs_on_device(const ContextImpl& ctx);
// kiln run --use-cuda-graph: a device engine run twice on `inputs` with CUDA graphs (the first run
// captures, the second replays); the replayed run's outputs, and the graph state in *stats.
Result<std::vector<ops::Value>> run_engine_graphed(const EngineImpl& e, const std::map<std::string, ops::Value>& inputs,
                                                   int profile, RunInfo* info, DeviceRunStats* stats);
// Where the builder's warnings go: cfg.warn, else "kiln: warning: ..." on stderr.
std::function<void(const std::string&)> warner(const BuilderConfig& cfg);
// Records the body layers left on reference kernels (engine::BodyTuning::reference) in
// e.build["body_reference"] (path, op, domain, opset, reasons, shape_work; ms once measured), where
// report_reference_layers and kiln inspect find them.
void record_body_reference(EngineImpl& e, const engine::BodyTuning& bodies);
// After kernels are chosen (engine/reference_layers.cc): warns about every layer left on its reference
// kernel that is not shape work, measures their share of a run at e->typical_shapes(), records it in
// e->build["reference"] and logs the count; under cfg.strict_tactics fails naming them instead.
Status report_reference_layers(const std::shared_ptr<EngineImpl>& e, const BuilderConfig& cfg, bool reference_only,
                               const std::function<void(const std::string&)>& log);
// After kernels are chosen (engine/qdq_findings.cc): in an INT8 engine, warns about every
// QuantizeLinear/DequantizeLinear layer that no INT8 layer takes, records them in
// e->build["qdq_unfolded"] and logs the count; under cfg.strict_tactics fails naming them instead.
Status report_unfolded_qdq(const std::shared_ptr<EngineImpl>& e, const BuilderConfig& cfg,
                           const std::function<void(const std::string&)>& log);
// Builds an engine in memory from a loaded model.
Result<std::shared_ptr<EngineImpl>> build_engine(ir::Model model, const BuilderConfig& cfg);

}  // namespace kiln::detail
