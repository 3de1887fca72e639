#include "engine/executor.h"

#include <algorithm>

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
}  // namespace

Result<std::vector<ops::Value>> LayerExecutor::run_subgraph(const ir::Graph& g, const std::vector<ops::Value>& inputs) {
  if (!body_timer || running_.empty()) return ops::Interpreter::run_subgraph(g, inputs);
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
  auto r = ops::Interpreter::run_subgraph(g, inputs);
  paths_.pop_back();
  return r;
}

Result<std::vector<ops::Value>> LayerExecutor::run_layer(const ir::Graph& g, size_t i, const ops::OpSchema& schema,
                                                         const std::vector<const ops::Value*>& ins, bool top_level) {
  std::string kernel;
  if (!body_timer) return run_prepared(g, i, schema, ins, top_level, &kernel);
  const ir::Node& n = g.nodes[i];
  const bool control_flow = has_bodies(n);
  if (control_flow) running_.push_back(&n);
  child_ms_.push_back(0);
  const auto begin = std::chrono::steady_clock::now();
  auto r = run_prepared(g, i, schema, ins, top_level, &kernel);
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
    t.shape_work = t.kernel == "reference" && (moves_no_elements(n) || values_small(ins, r.value()));
    t.begin = begin;
    t.self_ms = std::max(0.0, ms - inside);
    body_timer(t);
  }
  return r;
}

Result<std::vector<ops::Value>> LayerExecutor::run_prepared(const ir::Graph& g, size_t i, const ops::OpSchema& schema,
                                                            const std::vector<const ops::Value*>& ins, bool top_level,
                                                            std::string* kernel) {
  auto prepared = tactics_ ? tactics_->prepared(g, i, ins) : nullptr;
  if (!prepared) {
    // A tactic that declined these run-time shapes (TacticRuntime warned once): counted per layer.
    if (top_level && tactics_ && tactics_->has_tactic(i)) ++declined_runs_[i];
    const backends::Tactic* t = tactics_ ? tactics_->tactic_of(g, i) : nullptr;
    *kernel = t ? "reference (" + t->name() + " declined)" : "reference";
    return ops::Interpreter::run_layer(g, i, schema, ins, top_level);
  }
  *kernel = tactics_->tactic_of(g, i)->name();
  const ir::Node& n = g.nodes[i];
  // Scratch reused across layers: a tactic's run never re-enters run_layer.
  in_tensors_.clear();
  for (const ops::Value* v : ins) in_tensors_.push_back(v ? &v->tensor : nullptr);
  const std::vector<Dims> shapes = prepared->output_shapes();
  const std::vector<DataType> dtypes = prepared->output_dtypes();
  std::vector<Tensor> out_tensors(shapes.size());
  std::vector<Tensor*> out_ptrs;
  for (size_t o = 0; o < shapes.size(); ++o) {
    // An output whose shape depends on the data (a dim of -1: NonZero, NonMaxSuppression, TopK with a
    // computed K) is left undefined: the tactic allocates it once it knows the shape.
    if (!dims_known(shapes[o])) {
      out_ptrs.push_back(&out_tensors[o]);
      continue;
    }
    Tensor t = top_level && allocate_output ? allocate_output(n, o, dtypes[o], shapes[o]) : Tensor();
    for (const Tensor* x : in_tensors_)
      if (t.defined() && x && overlaps(t, *x)) t = Tensor();
    out_tensors[o] = t.defined() ? std::move(t) : Tensor(dtypes[o], shapes[o]);
    out_ptrs.push_back(&out_tensors[o]);
  }
  Status st = prepared->run(in_tensors_, out_ptrs);
  if (!st.ok()) return st.with_context(n.where());
  for (size_t o = 0; o < shapes.size(); ++o)
    if (!out_tensors[o].defined() || out_tensors[o].dtype() != dtypes[o])
      return Internal(n.where(), "tactic ", *kernel, " left output ", o, " without a tensor of dtype ",
                      dtype_name(dtypes[o]));
  ++tactic_runs_;
  std::vector<ops::Value> outs(n.outputs.size());
  for (size_t o = 0; o < shapes.size() && o < outs.size(); ++o) outs[o] = ops::Value(std::move(out_tensors[o]));
  return outs;
}

}  // namespace kiln::engine
