// What an engine is inside: the optimized graph, its layers and kernels, the build record, and the
// memory plan at the optimization shapes. Shared read-only by every ExecutionContext.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

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
  std::vector<std::string> sources;  // the ONNX nodes this layer came from
  std::vector<std::string> inputs, outputs;
  std::vector<tune::CandidateResult> candidates;  // the auto-tuner's results (empty: no tactic applied)
};

struct EngineImpl {
  ir::Model model;                     // optimized graph; large weights alias `storage`
  std::shared_ptr<uint8_t[]> storage;  // the engine file's bytes when loaded
  std::vector<LayerInfo> layers;
  engine::TargetInfo target;              // the machine it was built on
  std::vector<std::string> required_isa;  // CPU features its kernels need
  nlohmann::json build;                   // config, profiles, pass counts, source model facts
  engine::MemoryPlan plan;                // at the build's shapes (opt), for inspect
  std::vector<Profile> profiles;          // optimization profiles (also in build["config"]["profiles"])

  void describe_layers();  // fills `layers` from the graph

  // The layers' prepared tactics, made on first use and shared by every context of the engine.
  std::shared_ptr<engine::TacticRuntime> tactic_runtime() const;

 private:
  mutable std::once_flag runtime_once_;
  mutable std::shared_ptr<engine::TacticRuntime> runtime_;
};

// Converts a Status into the public exception.
[[noreturn]] void throw_error(const Status& s);
// The Status behind a public kiln::Error (the inverse of throw_error).
Status status_of(const Error& e);

// A copy of `g` with shapes inferred for these concrete input shapes (others keep their declaration).
Result<std::shared_ptr<ir::Graph>> infer_at(const ir::Graph& g, const std::map<std::string, Dims>& input_shapes);

// Sizes of every value of `g` when its inputs have the given concrete shapes (nullopt when
// data-dependent). Works on a private copy: safe to call from several contexts at once.
Result<std::map<std::string, std::optional<size_t>>> value_sizes(const ir::Graph& g,
                                                                 const std::map<std::string, Dims>& input_shapes);

// The engine file (format in engine_file.cc).
Result<std::string> serialize_engine(const EngineImpl& e);
Status write_engine(const EngineImpl& e, const std::string& path);  // the same bytes, into a file
Result<std::shared_ptr<EngineImpl>> deserialize_engine(std::string_view bytes);
// Opens PATH without blocking (a regular file only), checks size, magic, version and lengths from
// its first 32 bytes before anything else, then maps it (the weights alias the mapping, no copy).
Result<std::shared_ptr<EngineImpl>> load_engine_file(const std::string& path);

nlohmann::json inspect(const EngineImpl& e);

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
// Per-layer timing (kiln bench --dump-profile): called after every layer of each run of the context
// with the layer's index, its node, and the steady-clock times it began (the previous layer's end, or
// the start of the graph run) and ended (outputs placed in the arena). nullptr turns it off.
using LayerTimer = std::function<void(size_t layer, const ir::Node&, std::chrono::steady_clock::time_point begin,
                                      std::chrono::steady_clock::time_point end)>;
void set_layer_timer(ContextImpl& ctx, LayerTimer timer);
// Builds an engine in memory from a loaded model.
Result<std::shared_ptr<EngineImpl>> build_engine(ir::Model model, const BuilderConfig& cfg);

}  // namespace kiln::detail
