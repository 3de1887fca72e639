// The reference interpreter: runs a graph node by node with the plain kernels of src/ops. It is
// the ground truth every optimized engine is compared against, so it favours obviousness.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "ops/deadline.h"
#include "ops/registry.h"
#include "ops/value.h"

namespace kiln::ops {

// Every node (subgraphs included) without a reference kernel, in one error that names each one
// and says how a plugin would add it. Ok when all are supported.
Status check_supported(const ir::Graph& g);

// Validates a value given for a graph input against its declared type.
Status check_input_value(const ir::ValueInfo& decl, const Value& v);

class Interpreter : public SubgraphRunner {
 public:
  explicit Interpreter(std::shared_ptr<const ir::Graph> graph);

  // Runs the graph; `inputs` by name (inputs that are also initializers may be omitted).
  // Returns the graph outputs in declaration order.
  Result<std::vector<Value>> run(const std::map<std::string, Value>& inputs);
  // The same, into `outputs` (resized to the graph's outputs): its values are assigned over, so that
  // a caller running the same shapes again reuses their shape vectors (no allocation).
  Status run(const std::map<std::string, Value>& inputs, std::vector<Value>& outputs);

  // Called after every node of the main graph with its outputs (parity tools hook in here).
  std::function<void(const ir::Node&, const std::vector<Value>&)> on_node;

  // Called after every node, the nodes of subgraph bodies included (If branches, each Loop/Scan
  // iteration, nested bodies), in execution order, with the graph it belongs to, its inputs and its
  // outputs: the numerics guard (engine/numerics_guard.h) hooks in here. A body's nodes come before
  // the control-flow node that ran them. The tensors may live in an arena: clone what must outlive
  // the call. An engine context takes the interpreter loop (not its bound path) while it is set.
  std::function<void(const ir::Graph&, const ir::Node&, const std::vector<const Value*>&, const std::vector<Value>&)>
      on_layer;

  // Called for every node of the main graph before its outputs are stored: the engine runtime
  // moves them into its memory-planned arena here.
  std::function<void(const ir::Node&, std::vector<Value>&)> place_outputs;

  // Runs stop with a kDeadlineExceeded error at the next node (or Loop/Scan iteration) once this
  // time has passed (fuzzing, services). A deadline installed by an enclosing DeadlineScope (the
  // engine's context) applies too; the earlier one wins.
  void set_deadline(std::chrono::steady_clock::time_point t) { deadline_ = t; }

  Status run_subgraph_into(const ir::Graph& g, const std::vector<Value>& inputs, std::vector<Value>& results) override;

 protected:
  const ir::Graph& graph() const { return *graph_; }
  // Runs node i of `g` (the main graph when `top_level`, else a subgraph body) on its inputs into
  // `outs` (one per node output, each empty: kind kNone, an undefined tensor): its reference kernel
  // here. The engine's executor (engine/executor.h) overrides it to run a prepared tactic where the
  // layer has one, so both share this loop, its frames and its liveness. `outs` is the node's own
  // vector, kept by the plan from run to run: values assigned over it (not moved in) reuse the shape
  // vectors of the last run's.
  virtual Status run_layer(const ir::Graph& g, size_t i, const OpSchema& schema,
                           const std::vector<const Value*>& inputs, bool top_level, std::vector<Value>& outs);
  // The value `name` has in the innermost running graph (or an enclosing one); nullptr if none. Called
  // from run_subgraph before the body's own frame exists, it finds the values the body reads from outside.
  const Value* visible_value(const std::string& name) const {
    return frames_.empty() ? nullptr : frames_.back()->find(name);
  }

 private:
  struct Plan;
  // A running graph's values, by slot (Plan::slot_of): a vector, not a map by name, so that a layer
  // finds its inputs and stores its outputs without hashing strings (shape layers are mostly this).
  struct Frame {
    const ir::Graph* graph = nullptr;
    const Plan* plan = nullptr;
    std::vector<Value> values;
    std::vector<uint8_t> present;
    std::vector<const Value*> ins;  // the inputs of the node running (reused)
    const Frame* parent = nullptr;
    // By name, innermost graph first (its values, then its initializers), then the enclosing ones.
    const Value* find(const std::string& name) const;
  };
  // Where a node input (or a graph output) comes from, resolved when the graph is planned.
  struct Ref {
    int slot = -1;                      // a slot of this graph's frame, or of `scope`'s
    const ir::Graph* scope = nullptr;   // an enclosing graph defining it (outer-scope read)
    const Value* constant = nullptr;    // an initializer (of this graph or an enclosing one)
    const std::string* name = nullptr;  // nullptr: an omitted optional input
  };
  struct Plan {
    std::vector<const OpSchema*> schemas;
    std::unordered_map<std::string, int> slot_of;       // graph inputs and node outputs
    std::unordered_map<std::string, Value> constants;   // initializers that are not graph inputs
    std::vector<int> input_slots;                       // per graph input
    std::vector<std::vector<Ref>> inputs;               // per node input
    std::vector<std::vector<int>> outputs;              // per node output (-1: unnamed)
    std::vector<std::vector<int>> release_after;        // slots dead after node i
    std::vector<Ref> results;                           // per graph output
    mutable std::vector<std::vector<Value>> outs;       // per node: run_layer's outputs (reused)
    mutable std::vector<std::unique_ptr<Frame>> spare;  // frames of finished runs, reused
  };
  Result<const Plan*> plan_for(const ir::Graph& g);
  Ref resolve(const ir::Graph& g, const Plan& plan, const std::string& name);
  const Value* lookup(const Frame& frame, const Ref& r) const;
  std::unique_ptr<Frame> acquire_frame(const ir::Graph& g, const Plan& plan);
  void release_frame(std::unique_ptr<Frame> frame);
  Status execute(const ir::Graph& g, Frame& frame, bool top_level, std::vector<Value>& results);

  std::shared_ptr<const ir::Graph> graph_;
  std::unordered_map<const ir::Graph*, std::unique_ptr<Plan>> plans_;
  std::vector<Frame*> frames_;  // innermost last; subgraphs see these
  std::optional<std::chrono::steady_clock::time_point> deadline_;
};

// Runs one node's reference kernel on concrete inputs (used by constant folding too).
Result<std::vector<Value>> run_node(const ir::Node& node, const OpSchema& schema,
                                    const std::vector<const Value*>& inputs, SubgraphRunner* runner);
// The same into `outs` (resized to the node's outputs, each emptied first; their shape vectors are
// kept): the interpreter's loop, which reuses one vector per node.
Status run_node_into(const ir::Node& node, const OpSchema& schema, const std::vector<const Value*>& inputs,
                     SubgraphRunner* runner, std::vector<Value>& outs);

// Empties `v` (kind kNone, an undefined tensor, no sequence) without freeing its tensor's shape
// vector: a value assigned over it later at the same rank allocates nothing.
void clear_value(Value& v);

}  // namespace kiln::ops
