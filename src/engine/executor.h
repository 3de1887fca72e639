// The engine's runtime loop: runs the optimized graph layer by layer, each layer through its
// prepared tactic when it has one (writing straight into the memory-planned arena), else through
// its reference kernel.
//
// It is the reference interpreter's loop (ops::Interpreter: frames, liveness, the run deadline)
// with one step replaced: run_layer tries the layer's tactic first. Control flow (If/Loop/Scan)
// therefore runs inside the engine: the rest of the graph keeps its tactics and memory plan, and a
// body runs through the same loop (as the interpreter's SubgraphRunner) with a frame whose parent
// is the enclosing graph's values, so it reads outer-scope values by name. Body layers run their
// own tactics (chosen at build time, recorded in the node attribute engine::kBodyKernelAttr,
// prepared lazily per input shape); their outputs are fresh tensors (bodies are not memory
// planned). Values a body reads from outer scopes stay alive until the control-flow node is done:
// the interpreter's release lists and the memory planner both count Graph::outer_references()
// (transitively through nested bodies) as reads by that node.
//
// The steady-state path (bind / run_bound): when every value is planned at the context's shapes
// (none data-dependent) and no layer has a body, the executor binds once per shape: per layer its
// step, its input tensors (graph inputs, weights, earlier layers' arena slots), its output slots and,
// for a tactic, its RunContext (workspace in the arena). A step runs the prepared tactic; or, for a
// reference layer that only reshapes (Reshape, Flatten, Squeeze, Unsqueeze, Identity), nothing when the
// planner gave the output its input's bytes (in place), else a copy into its slot; or, for any other
// reference layer, its reference kernel, whose fresh outputs are copied into their slots (that step
// allocates: the bound path is allocation-free when every layer is a tactic or a view). A run walks
// the list (tests/noalloc). Control flow, data-dependent shapes and observers run the interpreter's
// loop, which allocates its frames and the reference kernels' outputs.
#pragma once

#include <functional>
#include <map>
#include <memory>

#include "engine/memory_planner.h"
#include "engine/tactics.h"
#include "ops/interpreter.h"

namespace kiln::engine {

class LayerExecutor : public ops::Interpreter {
 public:
  LayerExecutor(std::shared_ptr<const ir::Graph> graph, std::shared_ptr<TacticRuntime> tactics);

  // Inherited: run(inputs), and the hooks on_node / place_outputs (the context's memory planning and
  // observers), called for the main graph's layers only.
  // Where a tactic writes output i of a main-graph layer (an arena slot); an undefined tensor: a
  // fresh one. Body layers always write fresh tensors.
  std::function<Tensor(const ir::Node&, size_t, DataType, const Dims&)> allocate_output;

  // Layers that ran a prepared tactic (main graph and bodies) since construction: tests check that
  // control flow did not send the graph to reference kernels.
  size_t tactic_runs() const { return tactic_runs_; }
  std::shared_ptr<TacticRuntime> tactics() const { return tactics_; }

  // Per main-graph layer: how many runs its tactic declined the run-time shapes, so that the layer ran
  // its reference kernel (TacticRuntime warns the first time; kiln bench --dump-profile shows the counts).
  const std::vector<int64_t>& declined_runs() const { return declined_runs_; }

  // Where main-graph layers find their workspace on the interpreter path: the plan's slot in `arena`
  // when it has one big enough; else (bodies, unplanned layers) a buffer of the executor's own.
  void set_workspaces(const MemoryPlan* plan, uint8_t* arena) { ws_plan_ = plan, ws_arena_ = arena; }

  // Binds the steady-state path for `plan` (its arena `arena`) with prepared[i] the prepared layer of
  // main-graph node i at these shapes and the given input values (their dtypes and shapes are what a
  // bound run accepts). Empty when bound; else why not (see the top of the file), and unbound.
  // `typed` is the graph inferred at these shapes (the reference steps' output types).
  std::string bind(const MemoryPlan& plan, const std::vector<std::shared_ptr<const backends::PreparedLayer>>& prepared,
                   const ir::Graph& typed, int threads, const std::shared_ptr<uint8_t[]>& arena,
                   const std::map<std::string, ops::Value>& inputs);
  void unbind() { bound_ = false, bound_mismatch_ = false; }
  // Whether the last run_bound failed because a reference step's output was not the shape inference
  // gave it (the caller reruns through the interpreter loop, which takes any shape).
  bool bound_mismatch() const { return bound_mismatch_; }
  bool bound() const { return bound_; }
  // Whether a bound run can take these inputs: same names, dtypes and shapes as at bind, and the
  // thread count the workspaces were sized for. Allocates nothing.
  bool bound_accepts(const std::map<std::string, ops::Value>& inputs) const;
  // Runs the bound layers; `outputs` receives the graph outputs (reused: no allocation once sized).
  // `after_layer` (may be empty) is called after each layer, as place_outputs would be.
  Status run_bound(const std::map<std::string, ops::Value>& inputs, std::vector<ops::Value>& outputs,
                   const std::function<void(size_t, const ir::Node&)>& after_layer);

 protected:
  Result<std::vector<ops::Value>> run_layer(const ir::Graph& g, size_t i, const ops::OpSchema& schema,
                                            const std::vector<const ops::Value*>& inputs, bool top_level) override;

 private:
  struct Step;
  static bool is_view(const ir::Node& n);
  Status run_reference_step(Step& s);
  // The workspace of node i for a prepared layer needing `bytes` (top level: the plan's slot).
  std::pair<void*, size_t> workspace_for(size_t i, bool top_level, size_t bytes);

  std::shared_ptr<TacticRuntime> tactics_;
  std::vector<const Tensor*> in_tensors_;
  const MemoryPlan* ws_plan_ = nullptr;
  uint8_t* ws_arena_ = nullptr;
  std::unique_ptr<uint8_t, void (*)(uint8_t*)> own_ws_{nullptr, nullptr};
  size_t own_ws_bytes_ = 0;

  struct Step {
    enum class Kind { kTactic, kView, kReference } kind = Kind::kTactic;
    const ir::Node* node = nullptr;
    std::shared_ptr<const backends::PreparedLayer> layer;
    const ops::OpSchema* schema = nullptr;  // kReference
    bool declined = false;                  // not a tactic: the layer's tactic declined these shapes
    std::vector<ops::Value> in_values;      // kReference: the inputs as values (refreshed per run)
    std::vector<const ops::Value*> in_value_ptrs;
    std::vector<const Tensor*> ins;
    std::vector<Tensor> outs;
    std::vector<Tensor*> out_ptrs;
    backends::RunContext ctx;
  };
  struct BoundInput {  // a graph input the bound steps read: refreshed from the inputs at every run
    std::string name;
    DataType dtype;
    Dims shape;
    std::vector<std::pair<size_t, size_t>> uses;  // (step, input slot)
  };
  struct BoundOutput {  // graph output o: an arena slot (step, output) or a value as it is
    size_t step = SIZE_MAX, index = 0;
    std::string input;  // a graph input passed through
    const Tensor* constant = nullptr;
  };
  bool bound_ = false, bound_mismatch_ = false;
  int bound_threads_ = 0;
  size_t bound_input_count_ = 0;
  std::vector<Step> steps_;
  std::vector<BoundInput> bound_inputs_;
  std::vector<BoundOutput> bound_outputs_;
  size_t tactic_runs_ = 0;
  std::vector<int64_t> declined_runs_;
};

}  // namespace kiln::engine
