#include "engine/executor.h"

#include <unordered_map>
#include <unordered_set>

namespace kiln::engine {

const ir::Node* top_level_control_flow(const ir::Graph& g) {
  // Control flow (If/Loop/Scan) may read outer-scope values: the interpreter's frames handle that.
  // kiln's fused ops keep a self-contained body (it reads only the node's inputs) and stay here.
  for (const auto& n : g.nodes)
    if (n.domain != "kiln")
      for (const auto& [k, a] : n.attrs)
        if (a.g != nullptr || !a.graphs.empty()) return &n;
  return nullptr;
}

LayerExecutor::LayerExecutor(std::shared_ptr<const ir::Graph> graph, std::shared_ptr<TacticRuntime> tactics)
    : graph_(std::move(graph)), tactics_(std::move(tactics)), interp_(graph_) {
  const ir::Graph& g = *graph_;
  const ops::OpRegistry& reg = ops::OpRegistry::get();
  std::unordered_map<std::string, size_t> last_use;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    schemas_.push_back(reg.find(n.domain, n.op_type, n.opset));
    for (const auto& in : n.inputs)
      if (!in.empty()) last_use[in] = i;
  }
  has_subgraphs_ = top_level_control_flow(g) != nullptr;
  std::unordered_set<std::string> keep;
  for (const auto& o : g.outputs) keep.insert(o.name);
  release_after_.resize(g.nodes.size());
  declined_runs_.assign(g.nodes.size(), 0);
  for (const auto& [name, i] : last_use)
    if (!keep.count(name) && !g.initializers.count(name)) release_after_[i].push_back(name);
}

namespace {
bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.raw() || !b.raw()) return false;
  auto a0 = static_cast<const uint8_t*>(a.raw()), b0 = static_cast<const uint8_t*>(b.raw());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}
}  // namespace

Result<std::vector<ops::Value>> LayerExecutor::run(const std::map<std::string, ops::Value>& inputs) {
  if (!tactics_ || !tactics_->any() || has_subgraphs_) {
    interp_.on_node = on_node;
    interp_.place_outputs = place_outputs;
    return interp_.run(inputs);
  }
  const ir::Graph& g = *graph_;
  for (const auto& [name, v] : inputs) {
    bool declared = false;
    for (const auto& decl : g.inputs) declared |= decl.name == name;
    if (!declared) return InvalidArgument("'", name, "' is not an input of the model");
  }
  std::unordered_map<std::string, ops::Value> values;
  for (const auto& decl : g.inputs) {
    auto it = inputs.find(decl.name);
    if (it == inputs.end()) {
      if (g.initializers.count(decl.name)) continue;
      return InvalidArgument("missing input '", decl.name, "' (", decl.type.str(), ")");
    }
    KILN_RETURN_IF_ERROR(ops::check_input_value(decl, it->second));
    values[decl.name] = it->second;
  }
  for (const auto& [name, t] : g.initializers)
    if (!values.count(name)) values.emplace(name, ops::Value(t));
  std::vector<const ops::Value*> ins;
  std::vector<const Tensor*> in_tensors;
  std::vector<Tensor*> out_ptrs;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    KILN_RETURN_IF_ERROR(ops::check_deadline(n));  // the caller's DeadlineScope (ContextImpl::run)
    ins.clear();
    for (const auto& name : n.inputs) {
      if (name.empty()) {
        ins.push_back(nullptr);
        continue;
      }
      auto it = values.find(name);
      if (it == values.end()) return Internal(n.where(), "input '", name, "' has no value at run time");
      ins.push_back(&it->second);
    }
    std::vector<ops::Value> outs;
    auto prepared = tactics_->prepared(i, ins);
    if (prepared) {
      in_tensors.clear();
      for (const ops::Value* v : ins) in_tensors.push_back(v ? &v->tensor : nullptr);
      std::vector<Dims> shapes = prepared->output_shapes();
      std::vector<DataType> dtypes = prepared->output_dtypes();
      outs.resize(n.outputs.size());
      std::vector<Tensor> out_tensors(shapes.size());
      out_ptrs.clear();
      for (size_t o = 0; o < shapes.size(); ++o) {
        Tensor t = allocate_output ? allocate_output(n, o, dtypes[o], shapes[o]) : Tensor();
        for (const Tensor* x : in_tensors)
          if (t.defined() && x && overlaps(t, *x)) t = Tensor();
        out_tensors[o] = t.defined() ? std::move(t) : Tensor(dtypes[o], shapes[o]);
        out_ptrs.push_back(&out_tensors[o]);
      }
      Status st = prepared->run(in_tensors, out_ptrs);
      if (!st.ok()) return st.with_context(n.where());
      for (size_t o = 0; o < shapes.size() && o < outs.size(); ++o) outs[o] = ops::Value(std::move(out_tensors[o]));
    } else {
      declined_runs_[i] += tactics_->has_tactic(i);
      if (!schemas_[i]) KILN_RETURN_IF_ERROR(ops::check_supported(g));
      auto res = ops::run_node(n, *schemas_[i], ins, &interp_);
      if (!res.ok()) {
        const Status& st = res.status();
        if (st.message().rfind("node '", 0) == 0) return st;
        return st.with_context(n.where());
      }
      outs = std::move(res).value();
    }
    if (place_outputs) place_outputs(n, outs);
    if (on_node) on_node(n, outs);
    for (size_t o = 0; o < n.outputs.size(); ++o)
      if (n.has_output(o)) values[n.outputs[o]] = std::move(outs[o]);
    for (const auto& dead : release_after_[i]) values.erase(dead);
  }
  std::vector<ops::Value> results;
  for (const auto& o : g.outputs) {
    auto it = values.find(o.name);
    if (it == values.end()) return InvalidModel("graph '", g.name, "': output '", o.name, "' was never produced");
    results.push_back(it->second);
  }
  return results;
}

}  // namespace kiln::engine
