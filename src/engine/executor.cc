#include "engine/executor.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <tuple>

#include "core/parallel.h"
#include "ops/deadline.h"

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
}  // namespace

Result<std::vector<ops::Value>> LayerExecutor::run_layer(const ir::Graph& g, size_t i, const ops::OpSchema& schema,
                                                         const std::vector<const ops::Value*>& ins, bool top_level) {
  auto prepared = tactics_ ? tactics_->prepared(g, i, ins) : nullptr;
  if (!prepared) {
    // A tactic that declined these run-time shapes (TacticRuntime warned once): counted per layer.
    if (top_level && tactics_ && tactics_->has_tactic(i)) ++declined_runs_[i];
    return ops::Interpreter::run_layer(g, i, schema, ins, top_level);
  }
  const ir::Node& n = g.nodes[i];
  // Scratch reused across layers: a tactic's run never re-enters run_layer.
  in_tensors_.clear();
  for (const ops::Value* v : ins) in_tensors_.push_back(v ? &v->tensor : nullptr);
  const std::vector<Dims> shapes = prepared->output_shapes();
  const std::vector<DataType> dtypes = prepared->output_dtypes();
  std::vector<Tensor> out_tensors(shapes.size());
  std::vector<Tensor*> out_ptrs;
  for (size_t o = 0; o < shapes.size(); ++o) {
    Tensor t = top_level && allocate_output ? allocate_output(n, o, dtypes[o], shapes[o]) : Tensor();
    for (const Tensor* x : in_tensors_)
      if (t.defined() && x && overlaps(t, *x)) t = Tensor();
    out_tensors[o] = t.defined() ? std::move(t) : Tensor(dtypes[o], shapes[o]);
    out_ptrs.push_back(&out_tensors[o]);
  }
  backends::RunContext rc;
  rc.threads = std::max(1, kiln::max_threads());
  std::tie(rc.workspace, rc.workspace_bytes) = workspace_for(i, top_level, prepared->workspace_bytes(rc.threads));
  Status st = prepared->run(rc, in_tensors_, out_ptrs);
  if (!st.ok()) return st.with_context(n.where());
  ++tactic_runs_;
  std::vector<ops::Value> outs(n.outputs.size());
  for (size_t o = 0; o < shapes.size() && o < outs.size(); ++o) outs[o] = ops::Value(std::move(out_tensors[o]));
  return outs;
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

std::string LayerExecutor::bind(const MemoryPlan& plan,
                                const std::vector<std::shared_ptr<const backends::PreparedLayer>>& prepared,
                                const ir::Graph& typed, int threads, const std::shared_ptr<uint8_t[]>& arena,
                                const std::map<std::string, ops::Value>& inputs) {
  bound_ = false;
  const ir::Graph& g = graph();
  if (!plan.dynamic.empty()) return "value '" + *plan.dynamic.begin() + "' has a data-dependent size";
  if (prepared.size() != g.nodes.size()) return "the layers were not prepared";
  steps_.clear();
  steps_.resize(g.nodes.size());  // never resized again: steps point at each other's outputs
  bound_inputs_.clear();
  bound_outputs_.clear();
  std::map<std::string, std::pair<size_t, size_t>> produced;  // value -> (step, output)
  const ops::OpRegistry& registry = ops::OpRegistry::get();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    const std::string layer = "layer '" + n.name + "' (" + n.op_type + ")";
    // A body (If/Loop/Scan) needs the interpreter's frames; kiln's fused ops keep theirs private, run
    // by their tactic.
    for (const auto& [k, a] : n.attrs)
      if ((a.g || !a.graphs.empty()) && !prepared[i]) return layer + " has a subgraph body";
    Step& s = steps_[i];
    s.node = &n;
    s.layer = prepared[i];
    if (!s.layer) {
      s.kind = is_view(n) ? Step::Kind::kView : Step::Kind::kReference;
      s.schema = registry.find(n.domain, n.op_type, n.opset);
      s.declined = tactics_ && tactics_->has_tactic(i);
      if (!s.schema) return layer + " has no reference kernel";
    }
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
        auto b = std::find_if(bound_inputs_.begin(), bound_inputs_.end(),
                              [&](const BoundInput& x) { return x.name == name; });
        if (b == bound_inputs_.end()) {
          bound_inputs_.push_back({name, in->second.tensor.dtype(), in->second.tensor.shape(), {}});
          b = bound_inputs_.end() - 1;
        }
        b->uses.emplace_back(i, k);
        s.ins.push_back(nullptr);  // set at every run
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
      auto off = plan.offsets.find(n.outputs[o]);
      size_t bytes = static_cast<size_t>(dims_numel(shapes[o])) * dtype_size(dtypes[o]);
      if (off == plan.offsets.end() || dtypes[o] == DataType::kString || bytes > plan.sizes.at(n.outputs[o]))
        return layer + ": output '" + n.outputs[o] + "' has no planned slot of its size";
      s.outs[o] = Tensor::alias(dtypes[o], shapes[o], arena, off->second);
      produced[n.outputs[o]] = {i, o};
    }
    for (Tensor& t : s.outs) s.out_ptrs.push_back(&t);
    if (s.kind == Step::Kind::kReference) {
      s.in_values.resize(s.ins.size());
      for (size_t k = 0; k < s.ins.size(); ++k)
        s.in_value_ptrs.push_back(n.inputs[k].empty() ? nullptr : &s.in_values[k]);
    }
    s.ctx.threads = threads;
    if (size_t need = s.layer ? s.layer->workspace_bytes(threads) : 0) {
      auto off = plan.workspace_offsets.find(i);
      if (off == plan.workspace_offsets.end() || plan.workspace_sizes.at(i) < need)
        return layer + ": its workspace is not planned";
      s.ctx.workspace = arena.get() + off->second;
      s.ctx.workspace_bytes = plan.workspace_sizes.at(i);
    }
  }
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
  bound_threads_ = threads;
  bound_input_count_ = inputs.size();
  bound_ = true;
  return "";
}

bool LayerExecutor::is_view(const ir::Node& n) {
  static const char* const kViews[] = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"};
  if (!n.domain.empty()) return false;
  for (const char* v : kViews)
    if (n.op_type == v) return true;
  return false;
}

Status LayerExecutor::run_reference_step(Step& s) {
  for (size_t k = 0; k < s.ins.size(); ++k)
    if (s.ins[k]) {
      s.in_values[k].kind = ops::Value::Kind::kTensor;
      s.in_values[k].tensor = *s.ins[k];
    }
  KILN_ASSIGN_OR_RETURN(std::vector<ops::Value> outs, ops::run_node(*s.node, *s.schema, s.in_value_ptrs, nullptr));
  for (size_t o = 0; o < s.outs.size(); ++o) {
    Tensor& slot = s.outs[o];
    if (o >= outs.size() || !outs[o].is_tensor() || outs[o].tensor.dtype() != slot.dtype() ||
        outs[o].tensor.shape() != slot.shape()) {
      bound_mismatch_ = true;
      return Internal(s.node->where(), "output '", s.node->outputs[o], "' is not the ", slot.describe(),
                      " shape inference gave it at these input shapes");
    }
    if (slot.nbytes()) std::memcpy(slot.raw(), outs[o].tensor.raw(), slot.nbytes());
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
  for (size_t i = 0; i < steps_.size(); ++i) {
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
      if (y.raw() != s.ins[0]->raw() && y.nbytes()) std::memcpy(y.raw(), s.ins[0]->raw(), y.nbytes());
    } else {
      KILN_RETURN_IF_ERROR(run_reference_step(s));
    }
    if (after_layer) after_layer(i, *s.node);
  }
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
