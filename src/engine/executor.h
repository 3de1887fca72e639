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
// prepared lazily per input shape). Values a body reads from outer scopes stay alive until the
// control-flow node is done: the interpreter's release lists and the memory planner both count
// Graph::outer_references() (transitively through nested bodies) as reads by that node.
//
// Bodies are memory planned too (run_subgraph): each body gets a plan per signature of its run-time
// input shapes (its inputs and the non-constant outer values it reads), made the first time a body
// runs with them (the body inferred at those shapes, engine::plan_memory) and reused by every later
// iteration or run; its tactics write their outputs into the body's own arena, reused across
// iterations. The body's outputs (Loop-carried values, scan outputs, branch results) are not planned:
// the control-flow kernel keeps them past the iteration (scan outputs until the end), so they are
// tensors of their own. Values whose size depends on data are not planned either (fresh tensors), and
// a body that meets more than kMaxBodyPlans input signatures (a carried value growing every
// iteration) runs unplanned after that: the work of planning stays bounded.
//
// A tactic whose output shape depends on the data (NonZero, NonMaxSuppression, TopK with a K
// computed at run time) reports that output's shape with a dim of -1 in output_shapes(): run_layer
// then hands it an undefined tensor, which the tactic's run() replaces with one it allocates (of
// output_dtypes()' dtype) once it knows the shape; such a main-graph output is moved into its arena
// slot afterwards when it fits (the context's place_outputs), else stays a tensor of its own. Such
// tensors (and every other one a run creates outside the arena: reference kernels' outputs, If/Loop
// results) take their bytes from the context's BufferCache (core/buffer_cache.h), installed around
// run(): buffers kept at their high-water capacity and reused by later runs, so a steady-state run of
// a detector allocates no buffer and touches no fresh page (tests/noalloc counts). The loop's
// bookkeeping does not allocate in a steady state either (per-node output lists kept by the
// interpreter's plan, values assigned over the last run's so their shape vectors are reused, output
// shapes of prepared layers asked once, tensors over arena slots reused, body plans found by comparing
// types, views without a slot made from the output shape they had last: view_from_last, tensors made outside an
// arena renewed in place over the last run's (Tensor::renew), bodies filling the If/Loop kernels' kept
// vectors: SubgraphRunner::run_subgraph_into); what still allocates is whatever a reference kernel
// allocates inside (its scratch, its fresh outputs).
//
// The steady-state path (bind / run_bound): when every value is planned at the context's shapes
// (none data-dependent) and no layer has a body, the executor binds once per shape: per layer its
// step, its input tensors (graph inputs, weights, earlier layers' arena slots), its output slots and,
// for a tactic, its RunContext (workspace in the arena). A step runs the prepared tactic; or, for a
// reference layer that only reshapes (Reshape, Flatten, Squeeze, Unsqueeze, Identity), nothing when the
// planner gave the output its input's bytes (in place), else a copy into its slot; or, for any other
// reference layer, its reference kernel, whose fresh outputs are copied into their slots (that step
// allocates: the bound path is allocation-free when every layer is a tactic or a view). A run walks
// the list (tests/noalloc). Observers run the interpreter's loop.
//
// Split runs (a bound prefix, then the interpreter loop): a layer with a body (If/Loop/Scan) or an
// output of data-dependent size (NonMaxSuppression, NonZero, TopK with a computed K) cannot bind, nor
// can anything after it. bind() then binds the layers before the first such layer (a detector's
// backbone and heads) and leaves it and every later layer (the post-processing) to the interpreter
// loop: run_bound runs the bound prefix, then the loop over the whole graph, in which each prefix
// layer only hands over its bound outputs (no kernel runs) and the rest run as in run(). The order is
// the graph's, so the memory plan's liveness holds for both parts. On a CPU engine the loop keeps its
// tactics and the context's arena hooks. On a device engine the loop runs on the host with reference
// kernels (the device tactics read device memory): the device values it reads (prefix outputs, graph
// inputs) are copied to host tensors kept from bind once per run, and its outputs are host tensors
// (the context's "computed on the host" outputs). A prefix of no layer is no binding (the whole run
// goes to the interpreter loop, as before).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/device_runtime.h"
#include "engine/memory_planner.h"
#include "engine/tactics.h"
#include "ops/interpreter.h"

namespace kiln::engine {

// Why main-graph layer `n` cannot join the bound layer list, whatever the layers before it do ("" when
// it can): a body (If/Loop/Scan) with no tactic (`prepared` false), or an output whose size depends on
// the data in `plan` (MemoryPlan::dynamic). Such a layer and every later one run through the interpreter
// loop (a split run, below); bind() and the builder's report (engine/reference_layers.cc) share the rule.
std::string split_point_reason(const ir::Node& n, bool prepared, const MemoryPlan& plan);

class LayerExecutor : public ops::Interpreter {
 public:
  LayerExecutor(std::shared_ptr<const ir::Graph> graph, std::shared_ptr<TacticRuntime> tactics);

  // Inherited: run(inputs), and the hooks on_node / place_outputs (the context's memory planning and
  // observers), called for the main graph's layers only.
  // Where a tactic writes output i of a main-graph layer: a tensor over its arena slot, kept by the
  // caller (copied from, so that the same slot at the same shape costs no allocation); nullptr: a
  // fresh tensor.
  std::function<const Tensor*(const ir::Node&, size_t, DataType, const Dims&)> allocate_output;

  // Layers that ran a prepared tactic (main graph and bodies) since construction: tests check that
  // control flow did not send the graph to reference kernels.
  size_t tactic_runs() const { return tactic_runs_; }
  std::shared_ptr<TacticRuntime> tactics() const { return tactics_; }

  // Per main-graph layer: how many runs its tactic declined the run-time shapes, so that the layer ran
  // its reference kernel (TacticRuntime warns the first time; kiln bench --dump-profile shows the counts).
  const std::vector<int64_t>& declined_runs() const { return declined_runs_; }

  // What body memory planning did since construction (tests count allocations per iteration here).
  struct BodyMemoryStats {
    int64_t runs = 0;             // body executions (Loop/Scan iterations, If branches taken)
    int64_t unplanned_runs = 0;   // of those, without a plan (cap reached, shapes not inferable)
    int64_t plans_made = 0;       // body plans computed (one per body and input signature)
    int64_t planned_outputs = 0;  // body layer outputs written into their planned arena slot
    int64_t fresh_outputs = 0;    // body layer outputs in tensors allocated for them
  };
  const BodyMemoryStats& body_memory() const { return body_memory_; }
  // Off: bodies allocate every layer output (the behaviour before body planning; tests compare).
  void set_plan_bodies(bool on) { plan_bodies_ = on; }
  static constexpr size_t kMaxBodyPlans = 8;

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

  Status run_subgraph_into(const ir::Graph& g, const std::vector<ops::Value>& inputs,
                           std::vector<ops::Value>& results) override;

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
  // A device engine's context (engine/device_session.h): the bound steps run on `stream` of device `d`,
  // their arena slots live in its memory, views copy there, and a reference step (host fallback) copies
  // its device inputs to the host and its outputs back. Set before bind(); nullptr: the CPU.
  void set_device(const backends::DeviceRuntime* rt, Device d, void* stream) {
    rt_ = rt, device_ = d, stream_ = stream;
  }
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
  // The tensors of bound step i (its inputs, nullptr for missing ones, and its outputs), as an
  // after_layer call of run_bound sees them (a device engine's live in device memory).
  const std::vector<const Tensor*>& bound_step_inputs(size_t i) const { return steps_[i].ins; }
  const std::vector<Tensor>& bound_step_outputs(size_t i) const { return steps_[i].outs; }
  // The layers bound (main-graph nodes [0, bound_layers())): all of them, or fewer when the run is split
  // (see the top of the file); 0 when not bound. split_reason(): why the first unbound layer is not
  // bound ("" when none is left out).
  size_t bound_layers() const { return bound_ ? split_ : 0; }
  const std::string& split_reason() const { return split_reason_; }
  // Whether `n` is a main-graph layer of the bound prefix while a split run's interpreter loop runs (its
  // outputs are the bound ones, handed over: the context's hooks skip it).
  bool hands_over(const ir::Node& n) const;
  // Why the bound layer list cannot be captured into a device graph ("" when it can): a layer that
  // runs on the host (its reference kernel, between synchronizing copies) or copies from host memory.
  std::string graph_blocker() const;

 protected:
  Status run_layer(const ir::Graph& g, size_t i, const ops::OpSchema& schema,
                   const std::vector<const ops::Value*>& inputs, bool top_level,
                   std::vector<ops::Value>& outs) override;

 private:
  struct BodyState {
    bool initialized = false;
    bool active = false;             // running now: its arena holds live values
    std::vector<std::string> outer;  // non-constant outer values it reads (part of the signature)
    std::map<std::string, std::shared_ptr<const MemoryPlan>> plans;  // by signature; nullptr: unplannable
    std::shared_ptr<uint8_t[]> arena;                                // reused by every run of the body
    size_t capacity = 0;
    // Tensors over the arena slots handed out (body_slot), by plan and value name: reused while the
    // slot's dtype, shape and address stay.
    std::map<std::pair<const MemoryPlan*, const std::string*>, Tensor> views;
    // The plan of the last run and the types (inputs, then `outer`) it was chosen by.
    struct ValueType {
      bool present = false, tensor = false;
      DataType dtype = DataType::kUndefined;
      Dims shape;
    };
    const MemoryPlan* last_plan = nullptr;
    std::vector<ValueType> last_types;
  };
  struct ActiveBody {
    const ir::Graph* graph;
    BodyState* state;        // nullptr: running unplanned
    const MemoryPlan* plan;  // nullptr: running unplanned
  };
  const MemoryPlan* body_plan(const ir::Graph& g, const std::vector<ops::Value>& inputs, BodyState& st);
  std::shared_ptr<const MemoryPlan> make_body_plan(const ir::Graph& g, const std::vector<ops::Value>& inputs) const;
  // A tensor over the arena slot of output `o` of body layer `n` of `g` (the running body), or nullptr.
  const Tensor* body_slot(const ir::Graph& g, const ir::Node& n, size_t o, DataType dt, const Dims& shape) const;
  bool in_own_slot(const ir::Graph& g, const std::string& name, const Tensor& t) const;
  // A reference kernel's output that views a value in a body arena (Identity, Reshape, a branch passing
  // a value through) would change when that value's slot is reused: it takes its own copy.
  void own_views(std::vector<ops::Value>& outs, const ir::Node& n, const ir::Graph& g) const;

  // `kernel` (nullptr: not wanted) receives the name of the kernel that ran the layer.
  Status run_prepared(const ir::Graph& g, size_t i, const ops::OpSchema& schema,
                      const std::vector<const ops::Value*>& inputs, bool top_level, std::string* kernel,
                      std::vector<ops::Value>& outs);
  // A prepared layer's output shapes and dtypes (constant for it), asked once: the calls build vectors.
  struct OutputTypes {
    std::shared_ptr<const backends::PreparedLayer> layer;  // keeps the key's address unique
    std::vector<Dims> shapes;
    std::vector<DataType> dtypes;
  };
  const OutputTypes& output_types(const std::shared_ptr<const backends::PreparedLayer>& p);
  std::unordered_map<const backends::PreparedLayer*, OutputTypes> output_types_;
  // body_timer's bookkeeping: the control-flow layers being run (innermost last), the path of the body
  // being run, and per layer being timed the time of the body layers inside it so far.
  std::vector<const ir::Node*> running_;
  std::vector<std::string> paths_;
  std::vector<double> child_ms_;
  double last_body_ms_ = 0;
  struct Step;
  static bool is_view(const ir::Node& n);
  // A view layer (is_view) of the interpreter loop without a tactic: its output shape (its output is
  // the input's storage at another shape, a function of the input's shape and its other inputs' values:
  // Reshape's shape, Squeeze's axes) remembered from the reference kernel's last run. When the input
  // has the same dtype and shape and the other inputs the same values, the output is made a view of
  // the input at that shape over the node's output (Tensor::assign_view: no allocation); else the
  // reference runs. Only the shape is kept, not the tensor: a remembered tensor would hold its input's
  // buffer past the run, so that the next run's producer of that input (a buffer-cache tensor) found
  // its buffer taken and allocated another (tests/noalloc's detectors).
  struct ViewShape {
    bool known = false;  // in/out/dtype/args describe the last run
    DataType dtype = DataType::kUndefined;
    Dims in, out;
    std::vector<uint8_t> args;  // inputs 1.. (presence, dtype, rank, dims, bytes)
  };
  bool view_from_last(const ir::Node& n, const std::vector<const ops::Value*>& inputs, std::vector<ops::Value>& outs);
  void remember_view(const ir::Node& n, const std::vector<const ops::Value*>& inputs,
                     const std::vector<ops::Value>& outs);
  std::unordered_map<const ir::Node*, ViewShape> view_shapes_;
  Status run_reference_step(Step& s);
  // bind()'s work for main-graph node i: "" when step i is bound, else why not (steps before it bound).
  std::string bind_step(size_t i, const MemoryPlan& plan,
                        const std::vector<std::shared_ptr<const backends::PreparedLayer>>& prepared,
                        const ir::Graph& typed, int threads, const std::shared_ptr<uint8_t[]>& arena,
                        const std::map<std::string, ops::Value>& inputs,
                        std::map<std::string, std::pair<size_t, size_t>>& produced);
  // A split run's interpreter loop (after the bound prefix ran).
  Status run_tail(const std::map<std::string, ops::Value>& inputs, std::vector<ops::Value>& outputs);
  // The workspace of node i for a prepared layer needing `bytes` (top level: the plan's slot).
  std::pair<void*, size_t> workspace_for(size_t i, bool top_level, size_t bytes);

  std::shared_ptr<TacticRuntime> tactics_;
  const backends::DeviceRuntime* rt_ = nullptr;
  Device device_;
  void* stream_ = nullptr;
  std::vector<const Tensor*> in_tensors_;
  std::vector<Tensor*> out_ptrs_;
  std::vector<Tensor> extra_outs_;  // a tactic's outputs beyond the node's
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
    // A device engine's split run: host copies of the outputs the interpreter loop reads (empty
    // tensors for the others), refreshed after the prefix ran.
    std::vector<Tensor> host_outs;
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
  size_t split_ = 0;  // steps [0, split_) are bound; the rest run in the interpreter loop
  std::string split_reason_;
  bool tail_running_ = false;  // a split run's interpreter loop is running
  // A device engine's split run: the graph inputs the loop reads, as host copies where they live on the
  // device (name -> kept tensor), and the inputs the loop is given (the others as they are).
  std::map<std::string, Tensor> host_inputs_;
  std::map<std::string, ops::Value> tail_inputs_;
  int bound_threads_ = 0;
  size_t bound_input_count_ = 0;
  std::vector<Step> steps_;
  std::vector<BoundInput> bound_inputs_;
  std::vector<BoundOutput> bound_outputs_;
  size_t tactic_runs_ = 0;
  std::vector<int64_t> declined_runs_;
  bool plan_bodies_ = true;
  std::unordered_map<const ir::Graph*, BodyState> bodies_;
  std::vector<ActiveBody> active_;  // innermost last
  BodyMemoryStats body_memory_;
};

}  // namespace kiln::engine
