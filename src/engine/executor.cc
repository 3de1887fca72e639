#include "engine/executor.h"

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
  Status st = prepared->run(in_tensors_, out_ptrs);
  if (!st.ok()) return st.with_context(n.where());
  ++tactic_runs_;
  std::vector<ops::Value> outs(n.outputs.size());
  for (size_t o = 0; o < shapes.size() && o < outs.size(); ++o) outs[o] = ops::Value(std::move(out_tensors[o]));
  return outs;
}

}  // namespace kiln::engine
