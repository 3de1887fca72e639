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
// planned). A tactic whose output shape depends on the data (NonZero, NonMaxSuppression, TopK with
// a K computed at run time) reports that output's shape with a dim of -1 in output_shapes(): run_layer
// then hands it an undefined tensor, which the tactic's run() replaces with one it allocates (of
// output_dtypes()' dtype) once it knows the shape; such a main-graph output is moved into its arena
// slot afterwards when it fits (the context's place_outputs), else stays a tensor of its own. Values a body reads from
// outer scopes stay alive until the control-flow node is done: the interpreter's release lists and the memory planner
// both count Graph::outer_references() (transitively through nested bodies) as reads by that node.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>

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

  // Per main-graph layer: how many runs its tactic declined the run-time shapes, so that the layer ran
  // its reference kernel (TacticRuntime warns the first time; kiln bench --dump-profile shows the counts).
  const std::vector<int64_t>& declined_runs() const { return declined_runs_; }

  // Per-layer timing of subgraph bodies (kiln bench --dump-profile, the builder's reference estimate).
  // When set, it is called after every body layer (nested bodies too) with its path (the enclosing
  // layers and body attributes, "If_3404/else_branch/NonMaxSuppression_3422"), its node, the kernel
  // that ran it ("reference", or the tactic's name), whether it is shape work (engine::is_shape_work's
  // rule on the run-time tensors), when it began and its own time in ms: the time of body layers nested
  // in it is reported apart, so that no time is counted twice. last_body_ms() is the time the body
  // layers of the last main-graph layer took: the context leaves it out of that layer's time.
  struct BodyLayerTime {
    std::string path, kernel;
    const ir::Node* node = nullptr;
    bool shape_work = false;
    std::chrono::steady_clock::time_point begin;
    double self_ms = 0;
  };
  std::function<void(const BodyLayerTime&)> body_timer;
  double last_body_ms() const { return last_body_ms_; }

  Result<std::vector<ops::Value>> run_subgraph(const ir::Graph& g, const std::vector<ops::Value>& inputs) override;

 protected:
  Result<std::vector<ops::Value>> run_layer(const ir::Graph& g, size_t i, const ops::OpSchema& schema,
                                            const std::vector<const ops::Value*>& inputs, bool top_level) override;

 private:
  Result<std::vector<ops::Value>> run_prepared(const ir::Graph& g, size_t i, const ops::OpSchema& schema,
                                               const std::vector<const ops::Value*>& inputs, bool top_level,
                                               std::string* kernel);
  // body_timer's bookkeeping: the control-flow layers being run (innermost last), the path of the body
  // being run, and per layer being timed the time of the body layers inside it so far.
  std::vector<const ir::Node*> running_;
  std::vector<std::string> paths_;
  std::vector<double> child_ms_;
  double last_body_ms_ = 0;
  std::shared_ptr<TacticRuntime> tactics_;
  std::vector<const Tensor*> in_tensors_;
  size_t tactic_runs_ = 0;
  std::vector<int64_t> declined_runs_;
};

}  // namespace kiln::engine
