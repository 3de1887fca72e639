#include "engine/executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <set>
#include <tuple>

#include "core/parallel.h"
#include "ir/rewrite.h"
#include "ops/deadline.h"
#include "ops/shape_inference.h"

namespace kiln::engine {

LayerExecutor::LayerExecutor(std::shared_ptr<const ir::Graph> graph, std::shared_ptr<TacticRuntime> tactics)
    : ops::Interpreter(graph), tactics_(std::move(tactics)) {
  if (tactics_ && !tactics_->any()) tactics_.reset();
  declined_runs_.assign(graph->nodes.size(), 0);
}

namespace {
bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.raw() || !b.raw()) return false;
  auto a0 = static_cast<const uint8_t*>(a.raw()), b0 = static_cast<const uint8_t*>(b.raw());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

bool dims_known(const Dims& d) {
  for (int64_t x : d)
    if (x < 0) return false;
  return true;
}

bool has_bodies(const ir::Node& n) {
  for (const auto& [k, a] : n.attrs)
    if (a.g || !a.graphs.empty()) return true;
  return false;
}

bool values_small(const std::vector<const ops::Value*>& ins, const std::vector<ops::Value>& outs) {
  for (const ops::Value* v : ins)
    if (v && (!v->is_tensor() || !small_for_shape_work(v->tensor.dtype(), v->tensor.numel()))) return false;
  for (const ops::Value& v : outs)
    if (v.is_tensor() && !small_for_shape_work(v.tensor.dtype(), v.tensor.numel())) return false;
  return true;
}

std::string value_signature(const ops::Value* v) {
  if (!v) return "-;";
  if (!v->is_tensor()) return "s;";
  return std::to_string(static_cast<int>(v->tensor.dtype())) + dims_str(v->tensor.shape()) + ";";
}

// Types of a body copy that were inferred at other shapes: forgotten, so that inference at the run's
// shapes does not meet them (nested bodies take their input types from their control-flow node).
void forget_types(ir::Graph& g, bool keep_inputs) {
  g.value_types.clear();
  for (auto& o : g.outputs) o.type = ir::TypeInfo();
  if (!keep_inputs)
    for (auto& in : g.inputs) in.type = ir::TypeInfo();
  for (auto& n : g.nodes)
    for (auto& [k, a] : n.attrs) {
      if (a.g) forget_types(*a.g, false);
      for (auto& sg : a.graphs) forget_types(*sg, false);
    }
}

std::shared_ptr<uint8_t[]> alloc_arena(size_t n) {
  return std::shared_ptr<uint8_t[]>(
      static_cast<uint8_t*>(::operator new[](std::max<size_t>(n, 64), std::align_val_t(64))),
      [](uint8_t* p) { ::operator delete[](p, std::align_val_t(64)); });
}
}  // namespace

std::string split_point_reason(const ir::Node& n, bool prepared, const MemoryPlan& plan) {
  const std::string layer = "layer '" + n.name + "' (" + n.op_type + ")";
  // A body needs the interpreter's frames; kiln's fused ops keep theirs private, run by their tactic.
  if (has_bodies(n) && !prepared) return layer + " has a subgraph body";
  for (const auto& o : n.outputs)
    if (plan.dynamic.count(o)) return layer + ": output '" + o + "' has a size not known at build time";
  return "";
}

Status LayerExecutor::run_subgraph_into(const ir::Graph& g, const std::vector<ops::Value>& inputs,
                                        std::vector<ops::Value>& results) {
  ++body_memory_.runs;
  BodyState* st = nullptr;
  const MemoryPlan* plan = nullptr;
  if (plan_bodies_) {
    BodyState& s = bodies_[&g];
    plan = body_plan(g, inputs, s);
    if (plan) st = &s;
  }
  body_memory_.unplanned_runs += plan == nullptr;
  if (st) st->active = true;
  active_.push_back({&g, st, plan});
  struct Pop {
    std::vector<ActiveBody>& active;
    ~Pop() {
      if (active.back().state) active.back().state->active = false;
      active.pop_back();
    }
  } pop{active_};
  if (!body_timer || running_.empty()) return ops::Interpreter::run_subgraph_into(g, inputs, results);
  // The body's path: the enclosing layer's, its name and the attribute holding this body.
  const ir::Node& n = *running_.back();
  std::string attr = g.name;
  for (const auto& [k, a] : n.attrs) {
    if (a.g.get() == &g) attr = k;
    for (size_t s = 0; s < a.graphs.size(); ++s)
      if (a.graphs[s].get() == &g) attr = k + "[" + std::to_string(s) + "]";
  }
  std::string prefix = paths_.empty() ? "" : paths_.back() + "/";
  paths_.push_back(prefix + (n.name.empty() ? n.op_type : n.name) + "/" + attr);
  Status r = ops::Interpreter::run_subgraph_into(g, inputs, results);
  paths_.pop_back();
  return r;
}

const MemoryPlan* LayerExecutor::body_plan(const ir::Graph& g, const std::vector<ops::Value>& inputs, BodyState& st) {
  if (st.active) return nullptr;  // never while its arena holds live values (a body cannot re-enter itself)
  if (!st.initialized) {
    for (const auto& r : g.outer_references())
      if (!ir::outer_constant(g, r)) st.outer.push_back(r);
    st.initialized = true;
  }
  // The types the signature is made of, compared with the last run's first: a Loop's iterations (and
  // a steady state's runs) find their plan without building the signature string.
  const size_t n = inputs.size() + st.outer.size();
  auto value_at = [&](size_t k) { return k < inputs.size() ? &inputs[k] : visible_value(st.outer[k - inputs.size()]); };
  auto same_type = [](const BodyState::ValueType& t, const ops::Value* v) {
    if (!v) return !t.present;
    if (!v->is_tensor()) return t.present && !t.tensor;
    return t.present && t.tensor && t.dtype == v->tensor.dtype() && t.shape == v->tensor.shape();
  };
  bool same = st.last_plan && st.last_types.size() == n;
  for (size_t k = 0; k < n && same; ++k) same = same_type(st.last_types[k], value_at(k));
  if (!same) {
    std::string sig;
    for (const auto& v : inputs) sig += value_signature(&v);
    sig += "|";
    for (const auto& r : st.outer) sig += value_signature(visible_value(r));
    auto it = st.plans.find(sig);
    if (it == st.plans.end()) {
      if (st.plans.size() >= kMaxBodyPlans) return nullptr;
      ++body_memory_.plans_made;
      it = st.plans.emplace(sig, make_body_plan(g, inputs)).first;
    }
    if (!it->second) return nullptr;
    st.last_plan = it->second.get();
    st.last_types.resize(n);
    for (size_t k = 0; k < n; ++k) {
      const ops::Value* v = value_at(k);
      BodyState::ValueType& t = st.last_types[k];
      t.present = v != nullptr, t.tensor = v && v->is_tensor();
      t.dtype = t.tensor ? v->tensor.dtype() : DataType::kUndefined;
      if (t.tensor)
        t.shape = v->tensor.shape();
      else
        t.shape.clear();
    }
  }
  const MemoryPlan* plan = st.last_plan;
  if (st.capacity < plan->arena_bytes) {
    st.views.clear();  // over the old arena
    st.arena = alloc_arena(plan->arena_bytes);
    st.capacity = plan->arena_bytes;
  }
  return plan;
}

std::shared_ptr<const MemoryPlan> LayerExecutor::make_body_plan(const ir::Graph& g,
                                                                const std::vector<ops::Value>& inputs) const {
  // The body alone, at the run's shapes: its inputs as given, the outer values it reads as inputs of
  // their run-time types (constants as initializers: their values fold shape arithmetic).
  std::shared_ptr<ir::Graph> copy = ir::deep_copy(g, nullptr);
  forget_types(*copy, true);
  for (size_t i = 0; i < copy->inputs.size() && i < inputs.size(); ++i) {
    const ops::Value& v = inputs[i];
    if (v.is_tensor())
      copy->inputs[i].type = ir::TypeInfo::tensor(v.tensor.dtype(), SymShape::from_dims(v.tensor.shape()));
  }
  for (const auto& r : g.outer_references()) {
    if (const Tensor* t = ir::outer_constant(g, r)) {
      copy->initializers[r] = *t;
      continue;
    }
    const ops::Value* v = visible_value(r);
    ir::ValueInfo in;
    in.name = r;
    if (v && v->is_tensor()) in.type = ir::TypeInfo::tensor(v->tensor.dtype(), SymShape::from_dims(v->tensor.shape()));
    copy->inputs.push_back(std::move(in));
  }
  ops::InferOptions opts;
  opts.fold_constants = true;
  if (!ops::infer_shapes(*copy, opts).ok()) return nullptr;  // the run itself reports what is wrong
  std::set<std::string> outputs;
  for (const auto& o : g.outputs) outputs.insert(o.name);
  auto plan = std::make_shared<MemoryPlan>(plan_memory(g, [&](const std::string& v) -> std::optional<size_t> {
    if (outputs.count(v)) return std::nullopt;  // kept by the control-flow kernel past this run
    auto it = copy->value_types.find(v);
    if (it == copy->value_types.end() || !it->second.is_tensor() || !it->second.shape.fully_known() ||
        it->second.elem == DataType::kString || dtype_size(it->second.elem) == 0)
      return std::nullopt;
    return static_cast<size_t>(dims_numel(it->second.shape.concrete())) * dtype_size(it->second.elem);
  }));
  return plan;
}

const Tensor* LayerExecutor::body_slot(const ir::Graph& g, const ir::Node& n, size_t o, DataType dt,
                                       const Dims& shape) const {
  if (active_.empty() || active_.back().graph != &g || !active_.back().plan || o >= n.outputs.size()) return nullptr;
  const MemoryPlan& p = *active_.back().plan;
  auto off = p.offsets.find(n.outputs[o]);
  if (off == p.offsets.end() || static_cast<size_t>(dims_numel(shape)) * dtype_size(dt) > p.sizes.at(n.outputs[o]))
    return nullptr;
  BodyState& st = *active_.back().state;
  Tensor& view = st.views[{&p, &n.outputs[o]}];
  if (view.dtype() != dt || view.shape() != shape || view.raw() != st.arena.get() + off->second)
    view = Tensor::alias(dt, shape, st.arena, off->second);
  return &view;
}

bool LayerExecutor::in_own_slot(const ir::Graph& g, const std::string& name, const Tensor& t) const {
  if (active_.empty() || active_.back().graph != &g || !active_.back().plan || !t.raw()) return false;
  const MemoryPlan& p = *active_.back().plan;
  auto off = p.offsets.find(name);
  return off != p.offsets.end() && t.raw() == active_.back().state->arena.get() + off->second;
}

void LayerExecutor::own_views(std::vector<ops::Value>& outs, const ir::Node& n, const ir::Graph& g) const {
  for (size_t o = 0; o < outs.size() && o < n.outputs.size(); ++o) {
    if (!outs[o].is_tensor() || !outs[o].tensor.raw() || !outs[o].tensor.nbytes()) continue;
    const Tensor& t = outs[o].tensor;
    if (in_own_slot(g, n.outputs[o], t)) continue;
    auto* b = static_cast<const uint8_t*>(t.raw());
    for (const ActiveBody& a : active_)
      if (a.state && b >= a.state->arena.get() && b < a.state->arena.get() + a.state->capacity) {
        outs[o] = ops::Value(t.clone());
        break;
      }
  }
}

Status LayerExecutor::run_layer(const ir::Graph& g, size_t i, const ops::OpSchema& schema,
                                const std::vector<const ops::Value*>& ins, bool top_level,
                                std::vector<ops::Value>& outs) {
  if (tail_running_ && top_level && i < split_) {
    // A split run's bound prefix already ran this layer: its outputs are handed over (host copies of
    // a device engine's where the loop reads them).
    const Step& s = steps_[i];
    for (size_t o = 0; o < outs.size() && o < s.outs.size(); ++o) {
      outs[o].kind = ops::Value::Kind::kTensor;
      outs[o].tensor = o < s.host_outs.size() && s.host_outs[o].defined() ? s.host_outs[o] : s.outs[o];
    }
    return Status::Ok();
  }
  if (!body_timer) return run_prepared(g, i, schema, ins, top_level, nullptr, outs);
  std::string kernel;
  const ir::Node& n = g.nodes[i];
  const bool control_flow = has_bodies(n);
  if (control_flow) running_.push_back(&n);
  child_ms_.push_back(0);
  const auto begin = std::chrono::steady_clock::now();
  Status r = run_prepared(g, i, schema, ins, top_level, &kernel, outs);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  const double inside = child_ms_.back();
  child_ms_.pop_back();
  if (control_flow) running_.pop_back();
  if (!child_ms_.empty()) child_ms_.back() += ms;
  if (top_level) {
    last_body_ms_ = inside;
  } else if (r.ok()) {
    BodyLayerTime t;
    t.path = (paths_.empty() ? "" : paths_.back() + "/") + (n.name.empty() ? n.op_type : n.name);
    t.kernel = std::move(kernel);
    t.node = &n;
    t.shape_work = t.kernel == "reference" && (moves_no_elements(n) || values_small(ins, outs));
    t.begin = begin;
    t.self_ms = std::max(0.0, ms - inside);
    body_timer(t);
  }
  return r;
}

const LayerExecutor::OutputTypes& LayerExecutor::output_types(const std::shared_ptr<const backends::PreparedLayer>& p) {
  auto it = output_types_.find(p.get());
  if (it == output_types_.end())
    it = output_types_.emplace(p.get(), OutputTypes{p, p->output_shapes(), p->output_dtypes()}).first;
  return it->second;
}

Status LayerExecutor::run_prepared(const ir::Graph& g, size_t i, const ops::OpSchema& schema,
                                   const std::vector<const ops::Value*>& ins, bool top_level, std::string* kernel,
                                   std::vector<ops::Value>& outs) {
  // A device engine's split run: the interpreter loop runs on the host, where its device tactics
  // cannot (they read device memory): reference kernels.
  const bool host_loop = rt_ && tail_running_;
  auto prepared = tactics_ && !host_loop ? tactics_->prepared(g, i, ins) : nullptr;
  if (!prepared) {
    // A tactic that declined these run-time shapes (TacticRuntime warned once): counted per layer.
    if (top_level && tactics_ && !host_loop && tactics_->has_tactic(i)) ++declined_runs_[i];
    if (kernel) {
      const backends::Tactic* t = tactics_ ? tactics_->tactic_of(g, i) : nullptr;
      *kernel = t ? "reference (" + t->name() + " declined)" : "reference";
    }
    const bool view = is_view(g.nodes[i]);
    if (!view || !view_from_last(g.nodes[i], ins, outs)) {
      KILN_RETURN_IF_ERROR(ops::Interpreter::run_layer(g, i, schema, ins, top_level, outs));
      if (view) remember_view(g.nodes[i], ins, outs);
    }
    if (!top_level) {
      own_views(outs, g.nodes[i], g);
      for (size_t o = 0; o < g.nodes[i].outputs.size(); ++o) body_memory_.fresh_outputs += g.nodes[i].has_output(o);
    }
    return Status::Ok();
  }
  if (kernel) *kernel = tactics_->tactic_of(g, i)->name();
  const ir::Node& n = g.nodes[i];
  // Scratch reused across layers: a tactic's run never re-enters run_layer.
  in_tensors_.clear();
  for (const ops::Value* v : ins) in_tensors_.push_back(v ? &v->tensor : nullptr);
  const OutputTypes& types = output_types(prepared);
  const std::vector<Dims>& shapes = types.shapes;
  const std::vector<DataType>& dtypes = types.dtypes;
  // The node's outputs are `outs` (emptied by the interpreter's loop); a tactic's outputs beyond the
  // node's go to scratch tensors.
  if (shapes.size() > outs.size()) extra_outs_.resize(shapes.size() - outs.size());
  out_ptrs_.clear();
  for (size_t o = 0; o < shapes.size(); ++o) {
    Tensor& t = o < outs.size() ? outs[o].tensor : extra_outs_[o - outs.size()];
    if (o < outs.size()) outs[o].kind = ops::Value::Kind::kTensor;
    out_ptrs_.push_back(&t);
    // An output whose shape depends on the data (a dim of -1: NonZero, NonMaxSuppression, TopK with a
    // computed K) is left undefined: the tactic allocates it once it knows the shape.
    if (!dims_known(shapes[o])) continue;
    const Tensor* slot = top_level ? (allocate_output ? allocate_output(n, o, dtypes[o], shapes[o]) : nullptr)
                                   : body_slot(g, n, o, dtypes[o], shapes[o]);
    for (const Tensor* x : in_tensors_)
      if (slot && x && overlaps(*slot, *x)) slot = nullptr;
    if (slot)
      t = *slot;  // assigned over the last run's tensor: its shape vector is reused
    else
      t.renew(dtypes[o], shapes[o]);  // likewise
  }
  backends::RunContext rc;
  rc.threads = std::max(1, kiln::max_threads());
  std::tie(rc.workspace, rc.workspace_bytes) = workspace_for(i, top_level, prepared->workspace_bytes(rc.threads));
  Status st = prepared->run(rc, in_tensors_, out_ptrs_);
  if (!st.ok()) return st.with_context(n.where());
  for (size_t o = 0; o < shapes.size(); ++o)
    if (!out_ptrs_[o]->defined() || out_ptrs_[o]->dtype() != dtypes[o])
      return Internal(n.where(), "tactic ", tactics_->tactic_of(g, i)->name(), " left output ", o,
                      " without a tensor of dtype ", dtype_name(dtypes[o]));
  for (Tensor& t : extra_outs_) t = Tensor();
  ++tactic_runs_;
  if (!top_level)
    for (size_t o = 0; o < outs.size() && o < shapes.size(); ++o) {
      if (!n.has_output(o)) continue;
      bool planned = in_own_slot(g, n.outputs[o], outs[o].tensor);
      body_memory_.planned_outputs += planned, body_memory_.fresh_outputs += !planned;
    }
  return Status::Ok();
}

std::pair<void*, size_t> LayerExecutor::workspace_for(size_t i, bool top_level, size_t bytes) {
  if (bytes == 0) return {nullptr, 0};
  if (top_level && ws_plan_ && ws_arena_) {
    auto off = ws_plan_->workspace_offsets.find(i);
    if (off != ws_plan_->workspace_offsets.end() && ws_plan_->workspace_sizes.at(i) >= bytes)
      return {ws_arena_ + off->second, ws_plan_->workspace_sizes.at(i)};
  }
  // Not planned (a body layer, shapes the plan did not see): the executor's own buffer, grown as
  // needed. Layers run one at a time on this thread, so one buffer serves them all.
  if (own_ws_bytes_ < bytes) {
    own_ws_bytes_ = backends::workspace_piece(bytes);
    own_ws_ = {static_cast<uint8_t*>(::operator new[](own_ws_bytes_, std::align_val_t(64))),
               [](uint8_t* q) { ::operator delete[](q, std::align_val_t(64)); }};
  }
  return {own_ws_.get(), own_ws_bytes_};
}

std::string LayerExecutor::bind_step(size_t i, const MemoryPlan& plan,
                                     const std::vector<std::shared_ptr<const backends::PreparedLayer>>& prepared,
                                     const ir::Graph& typed, int threads, const std::shared_ptr<uint8_t[]>& arena,
                                     const std::map<std::string, ops::Value>& inputs,
                                     std::map<std::string, std::pair<size_t, size_t>>& produced) {
  const ir::Graph& g = graph();
  const ir::Node& n = g.nodes[i];
  const std::string layer = "layer '" + n.name + "' (" + n.op_type + ")";
  if (std::string why = split_point_reason(n, prepared[i] != nullptr, plan); !why.empty()) return why;
  Step& s = steps_[i];
  s.node = &n;
  s.layer = prepared[i];
  if (!s.layer) {
    s.kind = is_view(n) ? Step::Kind::kView : Step::Kind::kReference;
    s.schema = ops::OpRegistry::get().find(n.domain, n.op_type, n.opset);
    s.declined = tactics_ && tactics_->has_tactic(i);
    if (!s.schema) return layer + " has no reference kernel";
  }
  std::vector<std::pair<size_t, const ops::Value*>> input_uses;  // (input slot, graph input)
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const std::string& name = n.inputs[k];
    if (name.empty()) {
      s.ins.push_back(nullptr);
      continue;
    }
    if (auto p = produced.find(name); p != produced.end()) {
      s.ins.push_back(&steps_[p->second.first].outs[p->second.second]);
      continue;
    }
    if (auto in = inputs.find(name); in != inputs.end()) {
      if (!in->second.is_tensor()) return layer + " reads a non-tensor input";
      s.ins.push_back(nullptr);  // set at every run
      input_uses.emplace_back(k, &in->second);
      continue;
    }
    auto init = g.initializers.find(name);
    if (init == g.initializers.end()) return layer + ": input '" + name + "' has no value";
    s.ins.push_back(&init->second);
  }
  std::vector<Dims> shapes;
  std::vector<DataType> dtypes;
  if (s.layer) {
    shapes = s.layer->output_shapes();
    dtypes = s.layer->output_dtypes();
    if (shapes.size() < n.outputs.size()) return layer + " declares fewer outputs than it has";
  } else {
    for (const auto& o : n.outputs) {
      auto t = typed.value_types.find(o);
      if (o.empty() || t == typed.value_types.end() || !t->second.is_tensor() || !t->second.shape.fully_known())
        return layer + ": output '" + o + "' has no known tensor type";
      shapes.push_back(t->second.shape.concrete());
      dtypes.push_back(t->second.elem);
    }
    if (s.kind == Step::Kind::kView && (s.ins.empty() || n.outputs.size() != 1))
      return layer + " is not a one-output view";
  }
  s.outs.resize(shapes.size());
  for (size_t o = 0; o < shapes.size(); ++o) {
    if (o >= n.outputs.size() || n.outputs[o].empty()) return layer + " has an unnamed output";
    if (!dims_known(shapes[o]))  // the tactic allocates it once it knows the shape (see the top of executor.h)
      return layer + ": output '" + n.outputs[o] + "' has a shape that depends on the data";
    auto off = plan.offsets.find(n.outputs[o]);
    size_t bytes = static_cast<size_t>(dims_numel(shapes[o])) * dtype_size(dtypes[o]);
    if (off == plan.offsets.end() || dtypes[o] == DataType::kString || bytes > plan.sizes.at(n.outputs[o]))
      return layer + ": output '" + n.outputs[o] + "' has no planned slot of its size";
    MemoryLocation where;
    if (rt_) where = {MemoryLocation::Kind::kCuda, device_.index};
    s.outs[o] = Tensor::alias(dtypes[o], shapes[o], arena, off->second, where);
  }
  size_t need = s.layer ? s.layer->workspace_bytes(threads) : 0;
  if (need) {
    auto off = plan.workspace_offsets.find(i);
    if (off == plan.workspace_offsets.end() || plan.workspace_sizes.at(i) < need)
      return layer + ": its workspace is not planned";
  }
  // Bound: what later steps and runs find.
  for (size_t o = 0; o < n.outputs.size(); ++o) produced[n.outputs[o]] = {i, o};
  for (const auto& [k, v] : input_uses) {
    const std::string& name = n.inputs[k];
    auto b =
        std::find_if(bound_inputs_.begin(), bound_inputs_.end(), [&](const BoundInput& x) { return x.name == name; });
    if (b == bound_inputs_.end()) {
      bound_inputs_.push_back({name, v->tensor.dtype(), v->tensor.shape(), {}});
      b = bound_inputs_.end() - 1;
    }
    b->uses.emplace_back(i, k);
  }
  for (Tensor& t : s.outs) s.out_ptrs.push_back(&t);
  if (s.kind == Step::Kind::kReference) {
    s.in_values.resize(s.ins.size());
    for (size_t k = 0; k < s.ins.size(); ++k)
      s.in_value_ptrs.push_back(n.inputs[k].empty() ? nullptr : &s.in_values[k]);
  }
  s.ctx.threads = threads;
  s.ctx.device = device_, s.ctx.stream = stream_;
  if (need) {
    s.ctx.workspace = arena.get() + plan.workspace_offsets.at(i);
    s.ctx.workspace_bytes = plan.workspace_sizes.at(i);
  }
  return "";
}

std::string LayerExecutor::bind(const MemoryPlan& plan,
                                const std::vector<std::shared_ptr<const backends::PreparedLayer>>& prepared,
                                const ir::Graph& typed, int threads, const std::shared_ptr<uint8_t[]>& arena,
                                const std::map<std::string, ops::Value>& inputs) {
  bound_ = false;
  const ir::Graph& g = graph();
  if (prepared.size() != g.nodes.size()) return "the layers were not prepared";
  steps_.clear();
  steps_.resize(g.nodes.size());  // never resized again: steps point at each other's outputs
  bound_inputs_.clear();
  bound_outputs_.clear();
  host_inputs_.clear();
  tail_inputs_.clear();
  split_reason_.clear();
  std::map<std::string, std::pair<size_t, size_t>> produced;  // value -> (step, output)
  split_ = 0;
  for (; split_ < g.nodes.size(); ++split_) {
    split_reason_ = bind_step(split_, plan, prepared, typed, threads, arena, inputs, produced);
    if (!split_reason_.empty()) break;
  }
  if (split_ == 0 && !g.nodes.empty()) {  // not one layer bound (a graph of none binds: its outputs are values)
    steps_.clear();
    return split_reason_;
  }
  // A device engine's split run (its loop on the host) crashed in its first GPU test (session 10: a host
  // read of device memory, not found yet): off unless KILN_EXPERIMENTAL_DEVICE_SPLIT=1, so that such an
  // engine fails with this reason as before instead.
  if (rt_ && split_ < g.nodes.size()) {
    const char* on = std::getenv("KILN_EXPERIMENTAL_DEVICE_SPLIT");
    if (!on || std::string(on) != "1") {
      steps_.clear();
      return split_reason_ +
             " (a device engine runs its layers after that on the host only with "
             "KILN_EXPERIMENTAL_DEVICE_SPLIT=1: experimental, it crashed in its first GPU test)";
    }
  }
  for (size_t i = split_; i < steps_.size(); ++i) steps_[i] = Step();  // a failed bind_step's leftovers
  if (split_ == g.nodes.size()) {
    for (const auto& o : g.outputs) {
      BoundOutput b;
      if (auto p = produced.find(o.name); p != produced.end()) {
        b.step = p->second.first, b.index = p->second.second;
      } else if (inputs.count(o.name)) {
        b.input = o.name;
      } else if (auto init = g.initializers.find(o.name); init != g.initializers.end()) {
        b.constant = &init->second;
      } else {
        return "graph output '" + o.name + "' has no value";
      }
      bound_outputs_.push_back(std::move(b));
    }
  } else {
    // Graph outputs of the prefix are its bound tensors (device ones on a device engine), whatever
    // copy the loop read.
    for (size_t o = 0; o < g.outputs.size(); ++o)
      if (auto p = produced.find(g.outputs[o].name); p != produced.end()) {
        BoundOutput b;
        b.step = p->second.first, b.index = p->second.second;
        bound_outputs_.resize(o + 1);
        bound_outputs_[o] = b;
      }
    // The loop may read any graph input: a bound run takes only the shapes of them all it was bound for.
    for (const auto& in : inputs) {
      const std::string& name = in.first;  // not a structured binding: clang 14 lambdas cannot capture one
      const ops::Value& v = in.second;
      if (v.is_tensor() &&
          std::none_of(bound_inputs_.begin(), bound_inputs_.end(), [&](const BoundInput& x) { return x.name == name; }))
        bound_inputs_.push_back({name, v.tensor.dtype(), v.tensor.shape(), {}});
    }
  }
  if (split_ < g.nodes.size() && rt_) {
    // The values the interpreter loop reads (its layers' inputs, and what their bodies read from outside)
    // get host tensors: prefix outputs, and graph inputs that live on the device.
    std::set<std::string> read;
    for (size_t i = split_; i < g.nodes.size(); ++i) {
      const ir::Node& n = g.nodes[i];
      for (const auto& name : n.inputs) read.insert(name);
      for (const auto& [k, a] : n.attrs) {
        if (a.g)
          for (const auto& r : a.g->outer_references()) read.insert(r);
        for (const auto& sg : a.graphs)
          for (const auto& r : sg->outer_references()) read.insert(r);
      }
    }
    for (size_t i = 0; i < split_; ++i) {
      Step& s = steps_[i];
      s.host_outs.resize(s.node->outputs.size());
      for (size_t o = 0; o < s.node->outputs.size(); ++o)
        if (read.count(s.node->outputs[o]))
          s.host_outs[o] = Tensor::uninitialized(s.outs[o].dtype(), s.outs[o].shape());
    }
    for (const auto& [name, v] : inputs) {
      if (read.count(name) && v.is_tensor() && !v.tensor.location().host())
        host_inputs_[name] = Tensor::uninitialized(v.tensor.dtype(), v.tensor.shape());
      tail_inputs_[name] = v;
    }
  }
  bound_threads_ = threads;
  bound_input_count_ = inputs.size();
  bound_ = true;
  return "";
}

bool LayerExecutor::hands_over(const ir::Node& n) const {
  const auto& nodes = graph().nodes;
  return tail_running_ && &n >= nodes.data() && &n < nodes.data() + split_;
}

Status LayerExecutor::run_tail(const std::map<std::string, ops::Value>& inputs, std::vector<ops::Value>& outputs) {
  const std::map<std::string, ops::Value>* loop_inputs = &inputs;
  if (rt_) {
    // The device values the loop reads come to the host once, after the prefix's work.
    for (size_t i = 0; i < split_; ++i) {
      Step& s = steps_[i];
      for (size_t o = 0; o < s.host_outs.size(); ++o)
        if (s.host_outs[o].defined() && s.outs[o].nbytes())
          KILN_RETURN_IF_ERROR(rt_->copy(s.host_outs[o].raw(), s.outs[o].raw(), s.outs[o].nbytes(),
                                         backends::DeviceRuntime::Copy::kDeviceToHost, stream_));
    }
    for (auto& [name, v] : tail_inputs_) {
      auto in = inputs.find(name);
      if (in == inputs.end()) return Internal("split run: input '", name, "' was not given");
      auto h = host_inputs_.find(name);
      if (h == host_inputs_.end()) {
        v = in->second;
        continue;
      }
      if (h->second.nbytes())
        KILN_RETURN_IF_ERROR(rt_->copy(h->second.raw(), in->second.tensor.raw(), h->second.nbytes(),
                                       backends::DeviceRuntime::Copy::kDeviceToHost, stream_));
      v.kind = ops::Value::Kind::kTensor;
      v.tensor = h->second;
    }
    KILN_RETURN_IF_ERROR(rt_->synchronize(stream_));
    loop_inputs = &tail_inputs_;
  }
  // The last run's outputs give their buffers back first (as the context's run_loop does).
  for (ops::Value& v : outputs) ops::clear_value(v);
  // An observer of every layer (the numerics guard on a device engine) saw the prefix through
  // run_bound's after_layer: the loop shows it the rest only.
  std::function<void(const ir::Graph&, const ir::Node&, const std::vector<const ops::Value*>&,
                     const std::vector<ops::Value>&)>
      observer;
  if (on_layer) {
    observer = std::move(on_layer);
    on_layer = [this, &observer](const ir::Graph& g, const ir::Node& n, const std::vector<const ops::Value*>& ins,
                                 const std::vector<ops::Value>& outs) {
      if (&g != &graph() || !hands_over(n)) observer(g, n, ins, outs);
    };
  }
  tail_running_ = true;
  Status st = ops::Interpreter::run(*loop_inputs, outputs);
  tail_running_ = false;
  if (observer) on_layer = std::move(observer);
  KILN_RETURN_IF_ERROR(st);
  for (size_t o = 0; o < bound_outputs_.size() && o < outputs.size(); ++o)
    if (bound_outputs_[o].step != SIZE_MAX)
      outputs[o].tensor = steps_[bound_outputs_[o].step].outs[bound_outputs_[o].index];
  return Status::Ok();
}

std::string LayerExecutor::graph_blocker() const {
  if (!bound_) return "the layer list is not bound";
  if (!rt_) return "a CPU engine";
  if (split_ < steps_.size())
    return "the layers from '" + steps_[split_].node->name +
           "' on run on the host (interpreter loop): " + split_reason_;
  for (const Step& s : steps_) {
    const std::string who =
        "layer '" + (s.node->name.empty() ? s.node->op_type : s.node->name) + "' (" + s.node->op_type + ")";
    if (s.kind == Step::Kind::kReference) return who + " runs on the host (reference kernel): it synchronizes";
    if (s.kind == Step::Kind::kView && !s.ins.empty() && s.ins[0] && s.ins[0]->location().host() &&
        s.outs[0].raw() != s.ins[0]->raw())
      return who + " copies from host memory";
  }
  return "";
}

bool LayerExecutor::is_view(const ir::Node& n) {
  static const char* const kViews[] = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"};
  if (!n.domain.empty()) return false;
  for (const char* v : kViews)
    if (n.op_type == v) return true;
  return false;
}

namespace {
// Whether `args` holds the bytes of inputs 1.. of a view (each: present, dtype, rank, dims, bytes);
// with `write`, makes it so.
bool view_args(const std::vector<const ops::Value*>& inputs, std::vector<uint8_t>& args, bool write) {
  size_t at = 0;
  bool same = true;
  auto put = [&](const void* p, size_t n) {
    if (write) {
      args.resize(at + n);
      std::memcpy(args.data() + at, p, n);
    } else {
      same = same && at + n <= args.size() && std::memcmp(args.data() + at, p, n) == 0;
    }
    at += n;
  };
  for (size_t k = 1; k < inputs.size() && same; ++k) {
    const ops::Value* v = inputs[k];
    const uint8_t present = v && v->is_tensor();
    put(&present, 1);
    if (!present) continue;
    const Tensor& t = v->tensor;
    const DataType dt = t.dtype();
    const size_t rank = t.shape().size();
    put(&dt, sizeof(dt));
    put(&rank, sizeof(rank));
    put(t.shape().data(), rank * sizeof(int64_t));
    if (dt != DataType::kString) put(t.raw(), t.nbytes());
  }
  if (write) args.resize(at);
  return same && at == args.size();
}
}  // namespace

bool LayerExecutor::view_from_last(const ir::Node& n, const std::vector<const ops::Value*>& inputs,
                                   std::vector<ops::Value>& outs) {
  auto it = view_shapes_.find(&n);
  if (it == view_shapes_.end() || !it->second.known || inputs.empty() || !inputs[0] || !inputs[0]->is_tensor() ||
      outs.size() != 1)
    return false;
  ViewShape& v = it->second;
  const Tensor& x = inputs[0]->tensor;
  if (x.dtype() != v.dtype || x.shape() != v.in || !x.raw() || !view_args(inputs, v.args, false)) return false;
  outs[0].kind = ops::Value::Kind::kTensor;
  outs[0].tensor.assign_view(x, v.out);  // the output's shape vector keeps its capacity
  return true;
}

void LayerExecutor::remember_view(const ir::Node& n, const std::vector<const ops::Value*>& inputs,
                                  const std::vector<ops::Value>& outs) {
  ViewShape& v = view_shapes_[&n];
  v.known = false;
  if (inputs.empty() || !inputs[0] || !inputs[0]->is_tensor() || outs.size() != 1 || !outs[0].is_tensor() ||
      outs[0].tensor.dtype() != inputs[0]->tensor.dtype() || outs[0].tensor.dtype() == DataType::kString ||
      !outs[0].tensor.raw() || outs[0].tensor.raw() != inputs[0]->tensor.raw() ||
      outs[0].tensor.location() != inputs[0]->tensor.location())
    return;  // not the input's storage at another shape: the reference runs every time
  v.dtype = inputs[0]->tensor.dtype();
  v.in = inputs[0]->tensor.shape();
  v.out = outs[0].tensor.shape();
  view_args(inputs, v.args, true);
  v.known = true;
}

Status LayerExecutor::run_reference_step(Step& s) {
  // A device engine's layer without a device kernel runs here on the host, between copies (reported
  // at build time as a layer left on its reference kernel).
  if (rt_) KILN_RETURN_IF_ERROR(rt_->synchronize(stream_));
  for (size_t k = 0; k < s.ins.size(); ++k)
    if (s.ins[k]) {
      s.in_values[k].kind = ops::Value::Kind::kTensor;
      if (rt_ && !s.ins[k]->location().host()) {
        KILN_ASSIGN_OR_RETURN(s.in_values[k].tensor, backends::to_host(*rt_, *s.ins[k], stream_));
      } else {
        s.in_values[k].tensor = *s.ins[k];
      }
    }
  // The interpreter loop's node runner, with one output list for every reference step (they do not
  // nest: the bound path has no bodies) kept between runs and emptied after each: only the kernel
  // allocates.
  thread_local std::vector<ops::Value> outs;
  struct Empty {
    ~Empty() {
      for (ops::Value& v : outs) ops::clear_value(v);
    }
  } empty;
  KILN_RETURN_IF_ERROR(ops::run_node_into(*s.node, *s.schema, s.in_value_ptrs, nullptr, outs));
  for (size_t o = 0; o < s.outs.size(); ++o) {
    Tensor& slot = s.outs[o];
    if (o >= outs.size() || !outs[o].is_tensor() || outs[o].tensor.dtype() != slot.dtype() ||
        outs[o].tensor.shape() != slot.shape()) {
      bound_mismatch_ = true;
      return Internal(s.node->where(), "output '", s.node->outputs[o], "' is not the ", slot.describe(),
                      " shape inference gave it at these input shapes");
    }
    if (rt_ && slot.nbytes())
      KILN_RETURN_IF_ERROR(rt_->copy(slot.raw(), outs[o].tensor.raw(), slot.nbytes(),
                                     backends::DeviceRuntime::Copy::kHostToDevice, stream_));
    else if (slot.nbytes())
      std::memcpy(slot.raw(), outs[o].tensor.raw(), slot.nbytes());
  }
  return Status::Ok();
}

bool LayerExecutor::bound_accepts(const std::map<std::string, ops::Value>& inputs) const {
  if (!bound_ || inputs.size() != bound_input_count_ || std::max(1, kiln::max_threads()) != bound_threads_)
    return false;
  for (const BoundInput& b : bound_inputs_) {
    auto it = inputs.find(b.name);
    if (it == inputs.end() || !it->second.is_tensor() || it->second.tensor.dtype() != b.dtype ||
        it->second.tensor.shape() != b.shape)
      return false;
  }
  return true;
}

Status LayerExecutor::run_bound(const std::map<std::string, ops::Value>& inputs, std::vector<ops::Value>& outputs,
                                const std::function<void(size_t, const ir::Node&)>& after_layer) {
  for (const BoundInput& b : bound_inputs_) {
    const Tensor* t = &inputs.find(b.name)->second.tensor;
    for (const auto& [step, slot] : b.uses) steps_[step].ins[slot] = t;
  }
  for (size_t i = 0; i < split_; ++i) {
    Step& s = steps_[i];
    KILN_RETURN_IF_ERROR(ops::check_deadline(*s.node));
    if (s.declined) ++declined_runs_[i];
    if (s.kind == Step::Kind::kTactic) {
      Status st = s.layer->run(s.ctx, s.ins, s.out_ptrs);
      if (!st.ok()) return st.with_context(s.node->where());
      ++tactic_runs_;
    } else if (s.kind == Step::Kind::kView) {
      // In place when the planner gave the output its input's bytes; else a copy into its slot.
      Tensor& y = s.outs[0];
      if (y.raw() != s.ins[0]->raw() && y.nbytes()) {
        if (rt_)
          KILN_RETURN_IF_ERROR(rt_->copy(y.raw(), s.ins[0]->raw(), y.nbytes(),
                                         s.ins[0]->location().host() ? backends::DeviceRuntime::Copy::kHostToDevice
                                                                     : backends::DeviceRuntime::Copy::kDeviceToDevice,
                                         stream_));
        else
          std::memcpy(y.raw(), s.ins[0]->raw(), y.nbytes());
      }
    } else {
      KILN_RETURN_IF_ERROR(run_reference_step(s));
    }
    if (after_layer) after_layer(i, *s.node);
  }
  if (split_ < steps_.size()) return run_tail(inputs, outputs);
  outputs.resize(bound_outputs_.size());
  for (size_t o = 0; o < bound_outputs_.size(); ++o) {
    const BoundOutput& b = bound_outputs_[o];
    const Tensor& t = b.step != SIZE_MAX ? steps_[b.step].outs[b.index]
                      : b.constant       ? *b.constant
                                         : inputs.find(b.input)->second.tensor;
    // Copy-assigned over the previous run's Value: its shape vector keeps its capacity.
    outputs[o].kind = ops::Value::Kind::kTensor;
    outputs[o].tensor = t;
    outputs[o].sequence.clear();  // an interpreter-loop run before may have left a sequence
  }
  return Status::Ok();
}

}  // namespace kiln::engine
