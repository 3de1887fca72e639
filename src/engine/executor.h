// The engine's runtime loop: runs the optimized graph layer by layer, each layer through its
// prepared tactic when it has one (writing straight into the memory-planned arena), else through
// its reference kernel. Graphs whose top level holds subgraph ops (If/Loop/Scan) run entirely
// through the reference interpreter for now.
#pragma once

#include <functional>
#include <map>
#include <memory>

#include "engine/tactics.h"
#include "ops/interpreter.h"

namespace kiln::engine {

// The top-level node of `g` holding a subgraph (If/Loop/Scan; kiln's fused ops keep self-contained
// bodies and do not count), or nullptr. While there is one the whole graph runs in the reference
// interpreter: the builder reports every layer as a reference layer then.
const ir::Node* top_level_control_flow(const ir::Graph& g);

class LayerExecutor {
 public:
  LayerExecutor(std::shared_ptr<const ir::Graph> graph, std::shared_ptr<TacticRuntime> tactics);

  // The same hooks as ops::Interpreter (the context's memory planning and observers use them).
  std::function<void(const ir::Node&, const std::vector<ops::Value>&)> on_node;
  std::function<void(const ir::Node&, std::vector<ops::Value>&)> place_outputs;
  // Where a tactic writes output i of a node (an arena slot); an undefined tensor: a fresh one.
  std::function<Tensor(const ir::Node&, size_t, DataType, const Dims&)> allocate_output;

  Result<std::vector<ops::Value>> run(const std::map<std::string, ops::Value>& inputs);

  // Per layer: how many runs its tactic declined the run-time shapes, so that the layer ran its
  // reference kernel (TacticRuntime warns the first time; kiln bench --dump-profile shows the counts).
  const std::vector<int64_t>& declined_runs() const { return declined_runs_; }

 private:
  std::shared_ptr<const ir::Graph> graph_;
  std::shared_ptr<TacticRuntime> tactics_;
  ops::Interpreter interp_;
  bool has_subgraphs_ = false;
  std::vector<const ops::OpSchema*> schemas_;
  std::vector<std::vector<std::string>> release_after_;
  std::vector<int64_t> declined_runs_;
};

}  // namespace kiln::engine
