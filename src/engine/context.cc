// Engine (public) and ExecutionContext: running an engine with memory-planned activations.
#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "core/buffer_cache.h"
#include "core/checked_size.h"
#include "core/mapped_file.h"
#include "core/parallel.h"
#include "core/process_threads.h"
#include "engine/device_session.h"
#include "engine/engine_impl.h"
#include "engine/executor.h"
#include "engine/numerics_guard.h"
#include "engine/profiles.h"
#include "ops/interpreter.h"

namespace kiln {

namespace detail {

struct ContextImpl {
  std::shared_ptr<const EngineImpl> engine;
  std::unique_ptr<engine::LayerExecutor> interp;  // tactics, else reference kernels
  std::map<std::string, ops::Value> inputs;
  std::vector<ops::Value> outputs;
  // Memory plans (activations and layer workspaces, with the layers prepared at those shapes) per
  // input-shape signature: memory follows the actual shapes.
  std::map<std::string, std::shared_ptr<LayerPlan>> plans;
  std::shared_ptr<const engine::MemoryPlan> plan;
  std::shared_ptr<uint8_t[]> arena;
  size_t arena_capacity = 0;
  // The buffers of the tensors that runs create outside the arena (data-dependent outputs, If/Loop
  // results, reference kernels' outputs), reused by later runs (core/buffer_cache.h).
  BufferCache buffers;
  std::string buffers_sig;                          // the input shapes the cached buffers were taken at
  ShapeState shape_state;                           // declared shapes and profile choice (profiles.cc)
  LayerTimer layer_timer;                           // kiln bench's per-layer profile (set_layer_timer)
  ops::Deadline deadline;                           // set_deadline: installed around each run (ops/deadline.h)
  std::unique_ptr<engine::NumericsGuard> numerics;  // set_numerics_check: observes every layer of each run
  // A device engine's stream, device arena and boundary copies (engine/device_session.h), opened on first
  // use; `device_inputs` are the staged copies of `inputs` the layers read.
  std::unique_ptr<engine::DeviceSession> device;
  bool device_opened = false;
  std::map<std::string, ops::Value> device_inputs;
  DeviceRunOptions device_options;  // graphs, boundary copies (set_device_run_options)
  DeviceRunStats device_stats;
  bool staged_once = false;
  std::vector<ops::Value> fetched;  // the last outputs fetched (data_transfers off: what output() reads)
  // The captured graph and what it was captured with: the bound signature, the input and arena addresses.
  std::shared_ptr<void> graph;
  std::string graph_sig;
  std::vector<const void*> graph_addresses;
  std::vector<ops::Value> graph_outputs;  // the device outputs the graph writes
  std::string warm_sig;                   // the signature whose first (uncaptured) run was made
  // Device buffers of the caller (ExecutionContext::set_input_device / set_output_device): the stream
  // each bound input is produced on, the buffer each bound output is delivered to (per graph output),
  // the last run's device outputs (output_device), and the event that orders the streams.
  std::map<std::string, void*> input_streams;
  std::vector<std::optional<DeviceTensor>> output_buffers;
  std::vector<ops::Value> device_outputs;
  std::vector<bool> keep_on_device;  // per output: bound to a caller's buffer (not fetched to the host)
  std::shared_ptr<void> order_event;
  Status wait_for_callers();
  Status check_device_buffer(const char* what, const std::string& name, const DeviceTensor& t);
  Status deliver_outputs();
  Status run_graph(const std::string& sig, const std::map<std::string, ops::Value>& run_inputs);
  Status open_device();
  Result<std::shared_ptr<uint8_t[]>> allocate_arena(size_t bytes);

  Status run();
  // The memory plan and arena for the engine's typical shapes, made when the context is: a first
  // run() at those shapes then plans and allocates nothing (the arena's pages are touched here too).
  void plan_ahead();
  std::pair<std::string, std::shared_ptr<LayerPlan>> ahead;  // its signature and plan
  Result<std::shared_ptr<LayerPlan>> plan_for(const std::map<std::string, Dims>& shapes) const;

  // The steady-state path (engine/executor.h): bound at the first run of each input shape, taken by
  // the next runs at that shape while the forced profile stays what it was at binding.
  bool may_bind() const;
  // One run of the bound path bound for `sig`: its status, or nullopt when the run must start again
  // through the interpreter loop (see the definition).
  std::optional<Status> run_bound(const std::string& sig, const std::map<std::string, ops::Value>& run_inputs);
  int bound_forced = -1;
  std::string unbound_reason;        // why the last shape runs through the interpreter loop ("": it does not)
  std::string bound_sig;             // the signature the bound path is for
  std::set<std::string> never_bind;  // signatures whose bound run met a shape-inference mismatch
  std::function<void(size_t, const ir::Node&)> bound_timer;  // layer_timer over run_bound's hook
  std::chrono::steady_clock::time_point layer_begin;
  // The interpreter loop's arena slots per main-graph node output, for plan `slots_for`: looked up by
  // node index instead of by value name in the plan's maps (a layer's outputs are placed per run).
  struct Slot {
    size_t offset = SIZE_MAX, bytes = 0;
    Tensor view;  // over the slot, as the last allocate_output made it (reused at the same dtype and shape)
  };
  std::vector<std::vector<Slot>> slots;
  const engine::MemoryPlan* slots_for = nullptr;
  Slot* slot_of(const ir::Node& n, size_t o);
  // A tensor of `dt` and `shape` over slot `sl` of the arena: its view, remade only when they change.
  Tensor& slot_view(Slot& sl, DataType dt, const Dims& shape) {
    if (sl.view.dtype() != dt || sl.view.shape() != shape || sl.view.raw() != arena.get() + sl.offset)
      sl.view = Tensor::alias(dt, shape, arena, sl.offset);
    return sl.view;
  }

  // The interpreter loop (control flow, data-dependent shapes, observers): run_loop runs it with the
  // plan, arena and slots in place. The inputs of its last successful run (names, dtypes, shapes),
  // with the forced profile, thread count and may_bind(): a run that matches all of them skips the
  // choice of profile, plan and binding (which would give the same answers) and allocates nothing
  // beyond what the layers do.
  Status run_loop();
  // The interpreter loop's arena hooks and slots for plan `p` (run_loop; a split bound run's loop too).
  void use_slots(const engine::MemoryPlan& p);
  void install_loop_hooks();
  struct LoopKey {
    bool valid = false, may_bind = false;
    int forced = -1, threads = 0;
    std::vector<std::string> names;
    std::vector<Dims> shapes;
    std::vector<DataType> dtypes;
  };
  LoopKey loop_key;
  bool loop_key_matches(const std::map<std::string, ops::Value>& in) const;
  void remember_loop_key(const std::map<std::string, ops::Value>& in);
  bool loop_hooks = false;  // place_outputs / allocate_output installed (once: they read members only)
  size_t loop_layer_index = 0;
  std::chrono::steady_clock::time_point loop_layer_begin;
};

namespace {
// The input shapes and the thread count (the layers' workspaces are sized for it).
std::string signature(const std::map<std::string, ops::Value>& inputs) {
  std::string s;
  for (const auto& [k, v] : inputs) s += k + (v.is_tensor() ? dims_str(v.tensor.shape()) : "seq") + ";";
  return s + "@" + std::to_string(std::max(1, kiln::max_threads()));
}

std::shared_ptr<uint8_t[]> alloc_arena(size_t n) {
  return std::shared_ptr<uint8_t[]>(
      static_cast<uint8_t*>(::operator new[](std::max<size_t>(n, 64), std::align_val_t(64))),
      [](uint8_t* p) { ::operator delete[](p, std::align_val_t(64)); });
}
}  // namespace

Result<std::shared_ptr<LayerPlan>> ContextImpl::plan_for(const std::map<std::string, Dims>& shapes) const {
  auto tactics = interp->tactics();
  KILN_ASSIGN_OR_RETURN(LayerPlan planned, plan_layers_at(*engine->model.graph, shapes, tactics.get()));
  return std::make_shared<LayerPlan>(std::move(planned));
}

ContextImpl::Slot* ContextImpl::slot_of(const ir::Node& n, size_t o) {
  const auto& nodes = engine->model.graph->nodes;
  // A device engine's arena is device memory: its interpreter loop (a split run's, on the host) keeps
  // its outputs in tensors of their own.
  if (device || slots.size() != nodes.size() || &n < nodes.data() || &n >= nodes.data() + nodes.size()) return nullptr;
  auto& s = slots[static_cast<size_t>(&n - nodes.data())];
  return o < s.size() && s[o].offset != SIZE_MAX ? &s[o] : nullptr;
}

bool ContextImpl::loop_key_matches(const std::map<std::string, ops::Value>& in) const {
  const LoopKey& k = loop_key;
  if (!k.valid || k.forced != shape_state.forced || k.threads != std::max(1, kiln::max_threads()) ||
      k.may_bind != may_bind() || k.names.size() != in.size())
    return false;
  size_t i = 0;
  for (const auto& [name, v] : in) {
    if (!v.is_tensor() || k.names[i] != name || k.dtypes[i] != v.tensor.dtype() || k.shapes[i] != v.tensor.shape())
      return false;
    ++i;
  }
  return true;
}

void ContextImpl::remember_loop_key(const std::map<std::string, ops::Value>& in) {
  LoopKey& k = loop_key;
  k.valid = true;
  for (const auto& [name, v] : in) k.valid &= v.is_tensor();
  k.forced = shape_state.forced, k.threads = std::max(1, kiln::max_threads()), k.may_bind = may_bind();
  k.names.resize(in.size()), k.shapes.resize(in.size()), k.dtypes.resize(in.size());
  size_t i = 0;
  for (const auto& [name, v] : in) {
    k.names[i] = name, k.shapes[i] = v.tensor.shape(), k.dtypes[i] = v.tensor.dtype();
    ++i;
  }
}

// The numerics guard (on_layer) rides on a device engine's bound run, which copies each layer's
// tensors to the host for it (run_bound); the CPU's bound run has no per-layer values to show it.
bool ContextImpl::may_bind() const { return !interp->on_node && (!interp->on_layer || (device && numerics)); }

Status ContextImpl::open_device() {
  if (device_opened) return Status::Ok();
  KILN_ASSIGN_OR_RETURN(device, engine::DeviceSession::open(engine->built_for, engine->target));
  device_opened = true;
  if (device) interp->set_device(&device->runtime(), device->device(), device->stream());
  return Status::Ok();
}

// The context's stream waits for the work each caller queued on its input's stream (the host goes on).
Status ContextImpl::wait_for_callers() {
  if (input_streams.empty()) return Status::Ok();
  const backends::DeviceRuntime& rt = device->runtime();
  if (!order_event) {
    KILN_ASSIGN_OR_RETURN(order_event, rt.create_event(device->device().index));
  }
  for (const auto& [name, stream] : input_streams)
    KILN_RETURN_IF_ERROR(rt.order_after(device->stream(), stream, order_event.get()));
  return Status::Ok();
}

// A caller's buffer for set_input_device / set_output_device: a CUDA engine, the engine's device, and
// memory the driver says lives there.
Status ContextImpl::check_device_buffer(const char* what, const std::string& name, const DeviceTensor& t) {
  const Device want = engine->built_for.device;
  if (want.kind == DeviceKind::kCPU)
    return InvalidArgument(what, " '", name, "': a device buffer was given, but this engine runs on the CPU — pass ",
                           "host memory (set_input / output), or build the engine with --device cuda");
  if (t.device != want)
    return InvalidArgument(what, " '", name, "': the buffer is said to live on ", device_name(t.device),
                           ", but this engine runs on ", device_name(want), " — copy it to ", device_name(want));
  KILN_RETURN_IF_ERROR(open_device());
  if (t.nbytes == 0) return Status::Ok();
  if (!t.data) return InvalidArgument(what, " '", name, "': a null device pointer for ", t.nbytes, " bytes");
  KILN_ASSIGN_OR_RETURN(MemoryLocation at, device->runtime().locate(t.data));
  if (at.host())
    return InvalidArgument(what, " '", name, "': ", t.data, " is host memory, not device memory — use ",
                           std::string(what) == "input" ? "set_input" : "output()",
                           " for host tensors, or give a cudaMalloc'd pointer");
  if (at != device->location())
    return InvalidArgument(what, " '", name, "': ", t.data, " lives in ", at.str(), " memory, but this engine runs on ",
                           device_name(want), " — copy it to ", device_name(want));
  return Status::Ok();
}

// Copies each output bound to a caller's buffer there (on the context's stream) and makes the caller's
// stream wait for the copy; keeps the run's device outputs for output_device().
Status ContextImpl::deliver_outputs() {
  device_outputs.assign(outputs.begin(), outputs.end());
  keep_on_device.assign(outputs.size(), false);
  if (output_buffers.empty()) return Status::Ok();
  const backends::DeviceRuntime& rt = device->runtime();
  const auto& decl = engine->model.graph->outputs;
  for (size_t o = 0; o < output_buffers.size() && o < outputs.size(); ++o) {
    if (!output_buffers[o]) continue;
    const DeviceTensor& b = *output_buffers[o];
    const ops::Value& v = outputs[o];
    if (!v.is_tensor())
      return Unsupported("output '", decl[o].name, "' is not a tensor: it cannot go to a device buffer");
    const Tensor& t = v.tensor;
    if (t.dtype() != static_cast<DataType>(b.dtype) || t.shape() != b.shape)
      return InvalidArgument("output '", decl[o].name, "' is ", t.describe(), " in this run, but its device buffer ",
                             "(set_output_device) is for ", dtype_name(static_cast<DataType>(b.dtype)),
                             dims_str(b.shape),
                             " — bind a buffer of the output's shape (output_shape() says it before run())");
    if (t.nbytes()) {
      if (t.location().host())  // a host layer produced it: copied up
        KILN_RETURN_IF_ERROR(
            rt.copy(b.data, t.raw(), t.nbytes(), backends::DeviceRuntime::Copy::kHostToDevice, device->stream()));
      else
        KILN_RETURN_IF_ERROR(
            rt.copy(b.data, t.raw(), t.nbytes(), backends::DeviceRuntime::Copy::kDeviceToDevice, device->stream()));
    }
    if (!order_event) {
      KILN_ASSIGN_OR_RETURN(order_event, rt.create_event(device->device().index));
    }
    KILN_RETURN_IF_ERROR(rt.order_after(b.stream, device->stream(), order_event.get()));
    keep_on_device[o] = true;
  }
  return Status::Ok();
}

Result<std::shared_ptr<uint8_t[]>> ContextImpl::allocate_arena(size_t bytes) {
  if (device) return device->allocate_arena(bytes);
  return alloc_arena(bytes);
}

void ContextImpl::plan_ahead() {
  auto shapes = engine->ahead_shapes();
  if (!shapes.ok()) return;
  std::string sig;  // as signature() writes it for inputs of these shapes
  for (const auto& [k, d] : shapes.value()) sig += k + dims_str(d) + ";";
  sig += "@" + std::to_string(std::max(1, kiln::max_threads()));
  if (!open_device().ok()) return;  // run() reports why
  auto planned = plan_for(shapes.value());
  if (!planned.ok()) return;
  auto a = allocate_arena(planned.value()->plan.arena_bytes);
  if (!a.ok()) return;
  ahead = {sig, planned.value()};
  arena = std::move(a).value();
  arena_capacity = ahead.second->plan.arena_bytes;
  if (!device) std::memset(arena.get(), 0, arena_capacity);
}

std::optional<Status> ContextImpl::run_bound(const std::string& sig,
                                             const std::map<std::string, ops::Value>& run_inputs) {
  ops::DeadlineScope scope(deadline);
  layer_begin = std::chrono::steady_clock::now();
  loop_layer_index = 0;  // a split run's loop times the layers after the bound ones
  loop_layer_begin = layer_begin;
  std::function<void(size_t, const ir::Node&)> after = layer_timer ? bound_timer : nullptr;
  Status observed = Status::Ok();
  if (device && numerics) {
    // The guard reads host tensors: each layer's inputs and outputs are copied back after it ran
    // (slow, like every observed run; the guard is a debugging run).
    after = [this, &observed, timer = after](size_t i, const ir::Node& n) {
      if (timer) timer(i, n);
      if (!observed.ok()) return;
      std::vector<ops::Value> ins, outs;
      for (const Tensor* t : interp->bound_step_inputs(i)) {
        ins.emplace_back();
        if (!t) continue;
        auto h = t->location().host() ? Result<Tensor>(*t) : backends::to_host(device->runtime(), *t, device->stream());
        if (!h.ok()) return void(observed = h.status());
        ins.back() = ops::Value(std::move(h).value());
      }
      for (const Tensor& t : interp->bound_step_outputs(i)) {
        auto h = backends::to_host(device->runtime(), t, device->stream());
        if (!h.ok()) return void(observed = h.status());
        outs.push_back(ops::Value(std::move(h).value()));
      }
      std::vector<const ops::Value*> in_ptrs;
      for (size_t k = 0; k < ins.size(); ++k) in_ptrs.push_back(interp->bound_step_inputs(i)[k] ? &ins[k] : nullptr);
      numerics->observe(*engine->model.graph, n, in_ptrs, outs);
    };
  }
  Status s = Status::Ok();
  auto c0 = std::chrono::steady_clock::now();
  if (device && device_options.cuda_graph && !numerics && !layer_timer) {
    s = run_graph(sig, run_inputs);
  } else {
    if (device && device_options.cuda_graph)
      device_stats.graph_blocker = numerics ? "the numerics guard observes every layer" : "a per-layer timer is set";
    s = interp->run_bound(run_inputs, outputs, after);
  }
  if (s.ok()) s = observed;
  if (s.ok() && device && device_options.time_phases) {
    s = device->runtime().synchronize(device->stream());
    device_stats.compute_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count();
  }
  if (s.ok() && device) s = deliver_outputs();
  if (s.ok() && device) {  // a device engine's outputs come back to the host (those not bound to the device)
    auto d0 = std::chrono::steady_clock::now();
    if (device_options.data_transfers || fetched.size() != outputs.size()) {
      s = device->fetch_outputs(outputs, keep_on_device);
      if (s.ok() && !device_options.data_transfers) fetched = outputs;
    } else {
      s = device->runtime().synchronize(device->stream());
      outputs = fetched;
    }
    device_stats.d2h_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d0).count();
  }
  if (s.ok()) shape_state.ran_with_current = true;
  if (s.ok() || !interp->bound_mismatch()) return s;
  // A reference kernel's output disagreed with shape inference: these shapes take the interpreter
  // loop from now on, and this run starts again there (layers compute from their inputs only).
  never_bind.insert(sig);
  interp->unbind();
  unbound_reason = s.message();
  return std::nullopt;
}

Status ContextImpl::run_graph(const std::string& sig, const std::map<std::string, ops::Value>& run_inputs) {
  const backends::DeviceRuntime& rt = device->runtime();
  std::vector<const void*> addresses{arena.get()};
  for (const auto& [name, v] : run_inputs) addresses.push_back(v.is_tensor() ? v.tensor.raw() : nullptr);
  if (graph && graph_sig == sig && graph_addresses == addresses) {
    KILN_RETURN_IF_ERROR(rt.launch_graph(graph.get(), device->stream()));
    outputs = graph_outputs;
    ++device_stats.graph_replays;
    device_stats.graph_blocker.clear();
    return Status::Ok();
  }
  graph.reset();
  // A signature's first run goes uncaptured: the kernels' modules load (lazily) and libraries set
  // themselves up outside the capture; the next run captures.
  if (warm_sig != sig) {
    warm_sig = sig;
    return interp->run_bound(run_inputs, outputs, nullptr);
  }
  if (std::string why = interp->graph_blocker(); !why.empty()) {
    device_stats.graph_blocker = why;
    return interp->run_bound(run_inputs, outputs, nullptr);
  }
  KILN_RETURN_IF_ERROR(rt.begin_capture(device->stream()));
  Status s = interp->run_bound(run_inputs, outputs, nullptr);  // recorded, not run
  auto captured = rt.end_capture(device->stream());
  if (!s.ok() || !captured.ok()) {  // a layer that cannot be captured: the run starts again, uncaptured
    device_stats.graph_blocker = !s.ok() ? "a layer failed under capture: " + s.message() : captured.status().message();
    return interp->run_bound(run_inputs, outputs, nullptr);
  }
  graph = std::move(captured).value();
  graph_sig = sig, graph_addresses = std::move(addresses), graph_outputs = outputs;
  ++device_stats.graph_captures;
  KILN_RETURN_IF_ERROR(rt.launch_graph(graph.get(), device->stream()));
  ++device_stats.graph_replays;
  device_stats.graph_blocker.clear();
  return Status::Ok();
}

Status ContextImpl::run() {
  const ir::Graph& g = *engine->model.graph;
  BufferCacheScope cached(&buffers);
  KILN_RETURN_IF_ERROR(open_device());
  // A device engine's layers read device copies of the inputs, and its outputs come back to the host.
  if (device) {
    auto h0 = std::chrono::steady_clock::now();
    bool restage = device_options.data_transfers || !staged_once || device_inputs.size() != inputs.size();
    for (const auto& [name, v] : inputs) {
      auto it = device_inputs.find(name);
      restage |= it == device_inputs.end() || !it->second.is_tensor() || !v.is_tensor() ||
                 it->second.tensor.shape() != v.tensor.shape() || it->second.tensor.dtype() != v.tensor.dtype();
    }
    for (const auto& [name, v] : inputs) {  // a device input bound at another address since the last staging
      auto it = device_inputs.find(name);
      restage |= v.is_tensor() && !v.tensor.location().host() && it != device_inputs.end() &&
                 it->second.tensor.raw() != v.tensor.raw();
    }
    KILN_RETURN_IF_ERROR(wait_for_callers());
    if (restage) KILN_RETURN_IF_ERROR(device->stage_inputs(inputs, device_inputs));
    staged_once = true;
    if (device_options.time_phases) KILN_RETURN_IF_ERROR(device->runtime().synchronize(device->stream()));
    device_stats.h2d_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count();
  }
  const std::map<std::string, ops::Value>& run_inputs = device ? device_inputs : inputs;
  // Steady state: the shapes of the last run, bound. Nothing below allocates (tests/noalloc).
  if (shape_state.forced == bound_forced && interp->bound_accepts(run_inputs) && may_bind())
    if (auto done = run_bound(bound_sig, run_inputs)) return *done;
  if (!device && loop_key_matches(run_inputs)) {
    Status s = run_loop();
    if (!s.ok()) loop_key.valid = false;
    return s;
  }
  loop_key.valid = false;
  interp->unbind();
  // Tensors know where their memory lives: this engine's layers read host memory.
  for (const auto& [name, v] : inputs)
    if (!device && v.is_tensor() && !v.tensor.location().host())
      return InvalidArgument("input '", name, "' (", v.tensor.describe(), ") lives in ", v.tensor.location().str(),
                             " memory, but this engine runs on the CPU — copy it to host memory first");
  KILN_RETURN_IF_ERROR(choose_profile(*engine, inputs, shape_state));
  std::string sig = signature(inputs);
  if (sig != buffers_sig) {  // new shapes: the cache keeps what runs at these shapes need, not the last ones'
    buffers.release_free();
    buffers_sig = sig;
  }
  auto it = plans.find(sig);
  if (it == plans.end()) {
    for (const auto& decl : g.inputs) {
      auto in = inputs.find(decl.name);
      if (in == inputs.end()) {
        if (g.initializers.count(decl.name)) continue;
        return InvalidArgument("missing input '", decl.name, "' (", decl.type.str(), ")");
      }
      KILN_RETURN_IF_ERROR(ops::check_input_value(decl, in->second));
    }
    std::shared_ptr<LayerPlan> plan_ptr = sig == ahead.first ? ahead.second : nullptr;
    if (!plan_ptr) {
      std::map<std::string, Dims> shapes;
      for (const auto& [k, v] : inputs)
        if (v.is_tensor()) shapes[k] = v.tensor.shape();
      KILN_ASSIGN_OR_RETURN(plan_ptr, plan_for(shapes));
    }
    it = plans.emplace(sig, plan_ptr).first;
  }
  const LayerPlan& lp = *it->second;
  plan = std::shared_ptr<const engine::MemoryPlan>(it->second, &lp.plan);
  if (arena_capacity < plan->arena_bytes) {
    KILN_ASSIGN_OR_RETURN(arena, allocate_arena(plan->arena_bytes));
    arena_capacity = plan->arena_bytes;
  }
  const engine::MemoryPlan& p = *plan;
  interp->set_workspaces(&p, arena.get());
  if (!may_bind())
    unbound_reason = "an observer or test hook is installed";
  else if (never_bind.count(sig))
    unbound_reason = "a reference kernel's output differed from shape inference at these shapes";
  else if (lp.threads != std::max(1, kiln::max_threads()))
    unbound_reason = "the thread count changed since the plan was made";
  else
    unbound_reason = interp->bind(p, lp.prepared, *lp.typed, lp.threads, arena, run_inputs);
  if (unbound_reason.empty()) {
    bound_forced = shape_state.forced;
    bound_sig = sig;
    // A split run's interpreter loop on the CPU places its layers' outputs in the arena as run_loop's
    // does (a device engine's loop runs on the host, outside the device arena: only its layers' times).
    if (interp->bound_layers() < g.nodes.size()) {
      if (!device) use_slots(p);
      install_loop_hooks();
    }
    if (auto done = run_bound(sig, run_inputs)) return *done;
  }
  if (device)  // the interpreter loop's kernels read host memory
    return Unsupported("this engine runs on ", device_name(device->device()),
                       " through the bound layer list (with the interpreter loop on the host after it), which these "
                       "inputs cannot take: ",
                       unbound_reason);
  use_slots(p);
  KILN_RETURN_IF_ERROR(run_loop());
  remember_loop_key(run_inputs);
  return Status::Ok();
}

void ContextImpl::use_slots(const engine::MemoryPlan& p) {
  if (slots_for == &p) return;
  const ir::Graph& g = *engine->model.graph;
  slots.assign(g.nodes.size(), {});
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const auto& name : g.nodes[i].outputs) {
      Slot sl;
      if (auto off = p.offsets.find(name); !name.empty() && off != p.offsets.end())
        sl.offset = off->second, sl.bytes = p.sizes.at(name);
      slots[i].push_back(sl);
    }
  slots_for = &p;
}

Status ContextImpl::run_loop() {
  install_loop_hooks();
  loop_layer_index = 0;
  loop_layer_begin = std::chrono::steady_clock::now();
  // The executor's layer loop, the interpreter and Loop/Scan iterations all check this scope's
  // deadline (one ops::check_deadline call each), whatever executes the layers.
  ops::DeadlineScope scope(deadline);
  // The last run's outputs give their buffers back first (a caller's copy keeps its own); emptied,
  // not destroyed, so that this run's are assigned over them.
  for (ops::Value& v : outputs) ops::clear_value(v);
  KILN_RETURN_IF_ERROR(interp->run(inputs, outputs));
  shape_state.ran_with_current = true;
  return Status::Ok();
}

void ContextImpl::install_loop_hooks() {
  if (!loop_hooks) {
    interp->place_outputs = [this](const ir::Node& n, std::vector<ops::Value>& outs) {
      if (interp->hands_over(n)) {  // a split run's bound layer: its outputs are in their slots, its time taken
        if (layer_timer) ++loop_layer_index, loop_layer_begin = std::chrono::steady_clock::now();
        return;
      }
      for (size_t i = 0; i < outs.size() && i < n.outputs.size() && !device; ++i) {
        if (!outs[i].is_tensor()) continue;
        const Tensor& t = outs[i].tensor;
        Slot* sl = slot_of(n, i);
        if (!sl || t.dtype() == DataType::kString || t.nbytes() > sl->bytes) {
          // Kept dynamic. A kernel may hand back a view of an input (an If branch or a Loop passing an
          // outer value through): when that lies in the arena, its slot is reused once the input dies,
          // so the output takes its own copy.
          auto* b = static_cast<const uint8_t*>(t.raw());
          if (b && t.nbytes() && b >= arena.get() && b < arena.get() + arena_capacity) outs[i] = ops::Value(t.clone());
          continue;
        }
        if (t.raw() == arena.get() + sl->offset) continue;  // a tactic wrote it there already
        Tensor& slot = slot_view(*sl, t.dtype(), t.shape());
        if (t.nbytes()) std::memmove(slot.raw(), t.raw(), t.nbytes());
        outs[i].tensor = slot;  // assigned: the output's shape vector is reused
      }
      if (layer_timer) {
        auto now = std::chrono::steady_clock::now();
        // The time of its body layers went to the body timer (set_body_layer_timer): not counted twice.
        auto begin = loop_layer_begin;
        if (interp->body_timer)
          begin =
              std::min(now, loop_layer_begin + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                   std::chrono::duration<double, std::milli>(interp->last_body_ms())));
        layer_timer(loop_layer_index++, n, begin, now);
        loop_layer_begin = now;
      }
    };
    interp->allocate_output = [this](const ir::Node& n, size_t i, DataType dt, const Dims& shape) -> const Tensor* {
      Slot* sl = slot_of(n, i);
      if (!sl || static_cast<size_t>(dims_numel(shape)) * dtype_size(dt) > sl->bytes) return nullptr;
      return &slot_view(*sl, dt, shape);
    };
    loop_hooks = true;
  }
}

void set_layer_timer(ContextImpl& ctx, LayerTimer timer) {
  ctx.layer_timer = std::move(timer);
  ctx.bound_timer = [c = &ctx](size_t i, const ir::Node& n) {
    auto now = std::chrono::steady_clock::now();
    c->layer_timer(i, n, c->layer_begin, now);
    c->layer_begin = now;
  };
}

void set_body_layer_timer(ContextImpl& ctx, BodyLayerTimer timer) { ctx.interp->body_timer = std::move(timer); }

std::vector<int64_t> declined_runs(const ContextImpl& ctx) { return ctx.interp->declined_runs(); }

std::string steady_state_blocker(const ContextImpl& ctx) { return ctx.unbound_reason; }

BoundSplit bound_split(const ContextImpl& ctx) {
  return {ctx.interp->bound_layers(), ctx.engine->model.graph->nodes.size(), ctx.interp->split_reason()};
}

void set_device_run_options(ContextImpl& ctx, const DeviceRunOptions& o) {
  ctx.device_options = o;
  ctx.fetched.clear();
  if (!o.cuda_graph) ctx.graph.reset();
}
DeviceRunStats device_run_stats(const ContextImpl& ctx) { return ctx.device_stats; }
bool runs_on_device(const ContextImpl& ctx) { return ctx.engine->built_for.device.kind != DeviceKind::kCPU; }

Result<std::vector<ops::Value>> run_engine(
    const EngineImpl& e, const std::map<std::string, ops::Value>& inputs, int profile, RunInfo* info,
    std::function<void(const ir::Node&, const std::vector<ops::Value>&)> on_layer) {
  ContextImpl ctx;
  ctx.engine =
      std::shared_ptr<const EngineImpl>(std::shared_ptr<const EngineImpl>(), &e);  // non-owning: e outlives ctx
  ctx.interp = std::make_unique<engine::LayerExecutor>(e.model.graph, e.tactic_runtime());
  ctx.interp->on_node = std::move(on_layer);
  ctx.inputs = inputs;
  ctx.shape_state.forced = profile;
  KILN_RETURN_IF_ERROR(ctx.run());
  if (info) *info = {ctx.shape_state.chosen, ctx.plan ? ctx.plan->arena_bytes : 0};
  return std::move(ctx.outputs);
}

Result<std::vector<ops::Value>> run_engine_graphed(const EngineImpl& e, const std::map<std::string, ops::Value>& inputs,
                                                   int profile, RunInfo* info, DeviceRunStats* stats) {
  ContextImpl ctx;
  ctx.engine = std::shared_ptr<const EngineImpl>(std::shared_ptr<const EngineImpl>(), &e);  // non-owning
  ctx.interp = std::make_unique<engine::LayerExecutor>(e.model.graph, e.tactic_runtime());
  if (e.built_for.device.kind == DeviceKind::kCPU)
    return InvalidArgument("--use-cuda-graph: this engine runs on the CPU (build it with --device cuda)");
  ctx.device_options.cuda_graph = true;
  ctx.inputs = inputs;
  ctx.shape_state.forced = profile;
  for (int run = 0; run < 2; ++run) KILN_RETURN_IF_ERROR(ctx.run());
  if (info) *info = {ctx.shape_state.chosen, ctx.plan ? ctx.plan->arena_bytes : 0};
  if (stats) *stats = ctx.device_stats;
  return std::move(ctx.outputs);
}

void set_numerics_check(ContextImpl& ctx, const NumericsCheck& check) {
  if (!check.enabled) {
    ctx.numerics.reset();
    ctx.interp->on_layer = nullptr;
    return;
  }
  ctx.numerics = std::make_unique<engine::NumericsGuard>(ctx.engine->model.graph, check);
  ctx.numerics->attach(*ctx.interp);
}

Result<std::vector<ops::Value>> run_engine_checked(const EngineImpl& e, const std::map<std::string, ops::Value>& inputs,
                                                   const NumericsCheck& check, NumericsReport* report, int profile,
                                                   RunInfo* info) {
  ContextImpl ctx;
  ctx.engine = std::shared_ptr<const EngineImpl>(std::shared_ptr<const EngineImpl>(), &e);  // non-owning
  ctx.interp = std::make_unique<engine::LayerExecutor>(e.model.graph, e.tactic_runtime());
  set_numerics_check(ctx, check);
  ctx.inputs = inputs;
  ctx.shape_state.forced = profile;
  if (ctx.numerics) ctx.numerics->begin_run(inputs);
  KILN_RETURN_IF_ERROR(ctx.run());
  if (info) *info = {ctx.shape_state.chosen, ctx.plan ? ctx.plan->arena_bytes : 0};
  if (report && ctx.numerics) *report = ctx.numerics->report();
  return std::move(ctx.outputs);
}

Result<std::vector<ops::Value>> run_engine_observed(
    const EngineImpl& e, const std::map<std::string, ops::Value>& inputs,
    std::function<void(const ir::Node&, const std::vector<ops::Value>&)> on_layer) {
  return run_engine(e, inputs, -1, nullptr, std::move(on_layer));
}

Result<std::vector<ops::Value>> run_engine_observed_layers(
    const EngineImpl& e, const std::map<std::string, ops::Value>& inputs,
    std::function<void(const ir::Graph&, const ir::Node&, const std::vector<const ops::Value*>&,
                       const std::vector<ops::Value>&)>
        on_layer) {
  ContextImpl ctx;
  ctx.engine = std::shared_ptr<const EngineImpl>(std::shared_ptr<const EngineImpl>(), &e);  // non-owning
  ctx.interp = std::make_unique<engine::LayerExecutor>(e.model.graph, e.tactic_runtime());
  ctx.interp->on_layer = std::move(on_layer);  // the interpreter loop: every layer, bodies included
  ctx.inputs = inputs;
  KILN_RETURN_IF_ERROR(ctx.run());
  return std::move(ctx.outputs);
}

}  // namespace detail

// ---- HostTensor

HostTensor HostTensor::f32(std::vector<int64_t> shape, const float* values) {
  HostTensor t;
  t.dtype = kFloat32;
  t.shape = std::move(shape);
  if (__builtin_mul_overflow(static_cast<size_t>(t.numel()), size_t{4}, &t.nbytes))
    detail::throw_error(OutOfRange("host tensor: shape ", dims_str(t.shape), " takes more bytes than fit in 64 bits"));
  auto buf = std::shared_ptr<float[]>(new float[std::max<size_t>(t.nbytes / 4, 1)]);
  if (t.nbytes) std::memcpy(buf.get(), values, t.nbytes);
  t.data = std::shared_ptr<const void>(buf, buf.get());
  return t;
}

HostTensor HostTensor::borrow(DataTypeCode dtype, std::vector<int64_t> shape, const void* data, size_t nbytes) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.nbytes = nbytes;
  t.data = std::shared_ptr<const void>(data, [](const void*) {});
  return t;
}

int64_t HostTensor::numel() const {
  auto n = checked_numel(shape, "host tensor", ErrorCode::kOutOfRange);  // negative dims, int64 overflow
  if (!n.ok()) detail::throw_error(n.status());
  return n.value();
}

// ---- Engine

Engine::Engine(std::shared_ptr<detail::EngineImpl> impl) : impl_(std::move(impl)) {}

std::shared_ptr<Engine> Engine::deserialize(const std::string& bytes) try {
  auto e = detail::deserialize_engine(bytes);
  if (!e.ok()) detail::throw_error(e.status());
  return std::make_shared<Engine>(std::move(e).value());
} catch (...) {
  detail::rethrow_as_error("deserializing an engine");
}

std::shared_ptr<Engine> Engine::load(const std::string& path) try {
  auto e = detail::load_engine_file(path);  // checked before mapped; the weights alias the mapping
  if (!e.ok()) detail::throw_error(e.status());
  return std::make_shared<Engine>(std::move(e).value());
} catch (...) {
  detail::rethrow_as_error("loading engine file '" + path + "'");
}

std::string Engine::serialize() const try {
  auto s = detail::serialize_engine(*impl_);
  if (!s.ok()) detail::throw_error(s.status());
  return std::move(s).value();
} catch (...) {
  detail::rethrow_as_error("serializing the engine");
}

void Engine::save(const std::string& path) const try {
  if (Status s = detail::write_engine(*impl_, path); !s.ok()) detail::throw_error(s);
} catch (...) {
  detail::rethrow_as_error("saving the engine to '" + path + "'");
}

namespace {
TensorDesc desc_of(const ir::ValueInfo& v) {
  TensorDesc d;
  d.name = v.name;
  d.dtype = static_cast<DataTypeCode>(v.type.elem);
  for (const Dim& dim : v.type.shape.dims) {
    d.shape.push_back(dim.known() ? dim.value : -1);
    d.dim_names.push_back(dim.param);
  }
  return d;
}
}  // namespace

std::vector<TensorDesc> Engine::inputs() const {
  std::vector<TensorDesc> out;
  for (const auto& v : impl_->model.graph->inputs)
    if (!impl_->model.graph->initializers.count(v.name)) out.push_back(desc_of(v));
  return out;
}

std::vector<TensorDesc> Engine::outputs() const {
  std::vector<TensorDesc> out;
  for (const auto& v : impl_->model.graph->outputs) out.push_back(desc_of(v));
  return out;
}

std::unique_ptr<ExecutionContext> Engine::create_context() const try {
  return std::make_unique<ExecutionContext>(shared_from_this());
} catch (...) {
  detail::rethrow_as_error("creating an execution context");
}

std::string Engine::inspect_json() const { return detail::inspect(*impl_).dump(1); }

// ---- ExecutionContext

ExecutionContext::ExecutionContext(std::shared_ptr<const Engine> engine) : engine_(std::move(engine)) {
  sync_process_threads();  // plan_ahead prepares the layers with the process's thread count
  impl_ = std::make_unique<detail::ContextImpl>();
  impl_->engine = std::shared_ptr<const detail::EngineImpl>(engine_, &engine_->impl());
  impl_->interp = std::make_unique<engine::LayerExecutor>(impl_->engine->model.graph, impl_->engine->tactic_runtime());
  impl_->plan_ahead();
}

ExecutionContext::~ExecutionContext() = default;

void ExecutionContext::set_input(const std::string& name, HostTensor t) { bind_input(name, std::move(t), false); }

void ExecutionContext::set_input_shared(const std::string& name, HostTensor t) { bind_input(name, std::move(t), true); }

namespace {
// Checks a binding of input (or output) `name` against the graph's declaration: a known dtype that
// matches, no negative dims, `nbytes` as dtype and shape need. Throws naming what is wrong.
DataType check_binding(const std::vector<ir::ValueInfo>& decls, const char* what, const std::string& name,
                       DataTypeCode code, const std::vector<int64_t>& shape, size_t nbytes) {
  const ir::ValueInfo* info = nullptr;
  for (const auto& in : decls)
    if (in.name == name) info = &in;
  if (!info) detail::throw_error(InvalidArgument("'", name, "' is not an ", what, " of the engine"));
  if (!dtype_is_known(code) || static_cast<DataType>(code) == DataType::kString)
    detail::throw_error(InvalidArgument(what, " '", name, "': unsupported dtype code ", code));
  if (info->type.kind == ir::TypeInfo::Kind::kTensor && info->type.elem != DataType::kUndefined &&
      info->type.elem != static_cast<DataType>(code))
    detail::throw_error(InvalidArgument(what, " '", name, "' expects dtype ", dtype_name(info->type.elem), ", got ",
                                        dtype_name(static_cast<DataType>(code)), dims_str(shape), " — convert the ",
                                        what, " to ", dtype_name(info->type.elem)));
  for (int64_t d : shape)
    if (d < 0) detail::throw_error(InvalidArgument(what, " '", name, "': negative dimension ", d));
  const auto dtype = static_cast<DataType>(code);
  const int64_t numel = dims_numel(shape);  // throws (out of range) when the count overflows int64
  if (static_cast<uint64_t>(numel) > SIZE_MAX / dtype_size(dtype))
    detail::throw_error(OutOfRange(what, " '", name, "': ", dtype_name(dtype), dims_str(shape), " has more bytes ",
                                   "than fit in memory"));
  const size_t needed = static_cast<size_t>(numel) * dtype_size(dtype);
  if (needed != nbytes)
    detail::throw_error(InvalidArgument(what, " '", name, "': ", nbytes, " bytes given, ", dtype_name(dtype),
                                        dims_str(shape), " needs ", needed));
  return dtype;
}
}  // namespace

void ExecutionContext::bind_input(const std::string& name, HostTensor t, bool share) try {
  const DataType dtype = check_binding(impl_->engine->model.graph->inputs, "input", name, t.dtype, t.shape, t.nbytes);
  // A device input before: its staged copy was the caller's buffer, which host bytes must not overwrite.
  if (impl_->input_streams.erase(name)) impl_->device_inputs.erase(name);
  // Shared: the context holds the caller's bytes (their owner in t.data) instead of a copy, when they
  // are aligned as kiln's own tensors are (64 bytes; kernels may assume it) and not strings.
  const bool aligned = reinterpret_cast<uintptr_t>(t.data.get()) % 64 == 0;
  if (share && aligned && t.nbytes && dtype != DataType::kString) {
    auto* bytes = static_cast<uint8_t*>(const_cast<void*>(t.data.get()));
    impl_->inputs[name] = ops::Value(Tensor::alias(dtype, t.shape, std::shared_ptr<uint8_t[]>(t.data, bytes), 0));
  } else {
    Tensor x(dtype, t.shape);
    if (t.nbytes) std::memcpy(x.raw(), t.data.get(), t.nbytes);
    impl_->inputs[name] = ops::Value(std::move(x));
  }
  detail::declare_shape(impl_->shape_state, name, t.shape);
} catch (...) {
  detail::rethrow_as_error("binding input '" + name + "'");
}

void ExecutionContext::set_input_device(const std::string& name, const DeviceTensor& t) try {
  const DataType dtype = check_binding(impl_->engine->model.graph->inputs, "input", name, t.dtype, t.shape, t.nbytes);
  if (Status s = impl_->check_device_buffer("input", name, t); !s.ok()) detail::throw_error(s);
  // Borrowed: the caller owns the memory (no-op deleter).
  std::shared_ptr<uint8_t[]> bytes(static_cast<uint8_t*>(t.data), [](uint8_t*) {});
  impl_->inputs[name] = ops::Value(Tensor::alias(dtype, t.shape, std::move(bytes), 0, impl_->device->location()));
  impl_->input_streams[name] = t.stream;
  detail::declare_shape(impl_->shape_state, name, t.shape);
} catch (...) {
  detail::rethrow_as_error("binding input '" + name + "' to device memory");
}

void ExecutionContext::set_output_device(const std::string& name, const DeviceTensor& t) try {
  const auto& outs = impl_->engine->model.graph->outputs;
  check_binding(outs, "output", name, t.dtype, t.shape, t.nbytes);
  if (Status s = impl_->check_device_buffer("output", name, t); !s.ok()) detail::throw_error(s);
  impl_->output_buffers.resize(outs.size());
  for (size_t o = 0; o < outs.size(); ++o)
    if (outs[o].name == name) impl_->output_buffers[o] = t;
} catch (...) {
  detail::rethrow_as_error("binding output '" + name + "' to device memory");
}

void ExecutionContext::clear_output_device(const std::string& name) {
  const auto& outs = impl_->engine->model.graph->outputs;
  for (size_t o = 0; o < outs.size() && o < impl_->output_buffers.size(); ++o)
    if (outs[o].name == name) impl_->output_buffers[o].reset();
}

DeviceTensor ExecutionContext::output_device(const std::string& name) const try {
  if (!detail::runs_on_device(*impl_))
    detail::throw_error(InvalidArgument("output '", name, "': this engine runs on the CPU; read it with output()"));
  const auto& outs = impl_->engine->model.graph->outputs;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].name != name) continue;
    if (i >= impl_->device_outputs.size())
      detail::throw_error(InvalidArgument("output '", name, "' is not available: call run() first"));
    const ops::Value& v = impl_->device_outputs[i];
    if (!v.is_tensor()) detail::throw_error(Unsupported("output '", name, "' is not a tensor"));
    if (v.tensor.location().host())
      detail::throw_error(Unsupported("output '", name, "' was computed on the host (a host layer gives it): read it ",
                                      "with output()"));
    DeviceTensor d;
    d.dtype = static_cast<DataTypeCode>(v.tensor.dtype());
    d.shape = v.tensor.shape();
    d.data = const_cast<void*>(static_cast<const void*>(v.tensor.raw()));
    d.nbytes = v.tensor.nbytes();
    d.device = impl_->engine->built_for.device;
    return d;
  }
  detail::throw_error(InvalidArgument("'", name, "' is not an output of the engine"));
} catch (...) {
  detail::rethrow_as_error("reading output '" + name + "' on the device");
}

size_t ExecutionContext::arena_bytes() const { return impl_->arena_capacity; }

void ExecutionContext::set_input_shape(const std::string& name, std::vector<int64_t> dims) try {
  Status s = detail::set_input_shape(*impl_->engine, impl_->shape_state, name, std::move(dims));
  if (!s.ok()) detail::throw_error(s);
} catch (...) {
  detail::rethrow_as_error("declaring the shape of input '" + name + "'");
}

void ExecutionContext::set_profile(int index) {
  Status s = detail::force_profile(*impl_->engine, impl_->shape_state, index);
  if (!s.ok()) detail::throw_error(s);
}

int ExecutionContext::profile_index() const {
  auto r = detail::current_profile(*impl_->engine, impl_->shape_state);
  if (!r.ok()) detail::throw_error(r.status());
  return r.value();
}

std::vector<int64_t> ExecutionContext::output_shape(const std::string& name) const try {
  auto r = detail::output_shape(*impl_->engine, impl_->shape_state, impl_->outputs, name);
  if (!r.ok()) detail::throw_error(r.status());
  return r.value();
} catch (...) {
  detail::rethrow_as_error("computing the shape of output '" + name + "'");
}

void ExecutionContext::run() try {
  sync_process_threads();
  if (impl_->numerics && !impl_->input_streams.empty())
    detail::throw_error(Unsupported("the numerics guard reads the inputs on the host: bind host inputs (set_input) ",
                                    "while it is on"));
  if (impl_->numerics) impl_->numerics->begin_run(impl_->inputs);
  Status s = impl_->run();
  if (!s.ok()) detail::throw_error(s);
} catch (...) {
  detail::rethrow_as_error("running the engine");
}

void ExecutionContext::set_deadline(std::chrono::steady_clock::time_point deadline) { impl_->deadline = deadline; }

void ExecutionContext::clear_deadline() { impl_->deadline.reset(); }

std::vector<std::string> ExecutionContext::output_names() const {
  std::vector<std::string> out;
  for (const auto& o : impl_->engine->model.graph->outputs) out.push_back(o.name);
  return out;
}

HostTensor ExecutionContext::output(const std::string& name) const try {
  const auto& outs = impl_->engine->model.graph->outputs;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].name != name) continue;
    if (i >= impl_->outputs.size())
      detail::throw_error(InvalidArgument("output '", name, "' is not available: call run() first"));
    const ops::Value& v = impl_->outputs[i];
    if (!v.is_tensor()) detail::throw_error(Unsupported("output '", name, "' is not a tensor"));
    if (!v.tensor.location().host())
      detail::throw_error(InvalidArgument("output '", name, "' went to its device buffer (set_output_device): read it ",
                                          "there, or clear_output_device() to read it here"));
    HostTensor h;
    h.dtype = static_cast<DataTypeCode>(v.tensor.dtype());
    h.shape = v.tensor.shape();
    h.nbytes = v.tensor.nbytes();
    auto keep = std::make_shared<Tensor>(v.tensor);
    h.data = std::shared_ptr<const void>(keep, keep->raw());
    return h;
  }
  detail::throw_error(InvalidArgument("'", name, "' is not an output of the engine"));
} catch (...) {
  detail::rethrow_as_error("reading output '" + name + "'");
}

void ExecutionContext::set_numerics_check(const NumericsCheck& check) try {
  detail::set_numerics_check(*impl_, check);
} catch (...) {
  detail::rethrow_as_error("setting the numerics check");
}

NumericsReport ExecutionContext::numerics_report() const {
  return impl_->numerics ? impl_->numerics->report() : NumericsReport();
}

size_t ExecutionContext::activation_bytes() const { return impl_->plan ? impl_->plan->arena_bytes : 0; }

}  // namespace kiln
