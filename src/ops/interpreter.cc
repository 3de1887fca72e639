#include "ops/interpreter.h"

#include <new>
#include <set>
#include <unordered_set>

namespace kiln::ops {

namespace {
void collect_unsupported(const ir::Graph& g, std::vector<std::string>& out, std::set<std::string>& seen_ops) {
  const OpRegistry& reg = OpRegistry::get();
  for (const auto& n : g.nodes) {
    if (!reg.find(n.domain, n.op_type, n.opset)) {
      std::string dom = n.domain.empty() ? "ai.onnx" : n.domain;
      std::string why = reg.knows(n.domain, n.op_type) ? " (kiln supports this op only from a later opset)" : "";
      out.push_back("  - '" + n.name + "': " + n.op_type + " (domain " + dom + ", opset " + std::to_string(n.opset) +
                    ")" + why);
      seen_ops.insert(dom + "::" + n.op_type);
    }
    for (const auto& [k, a] : n.attrs) {
      if (a.g) collect_unsupported(*a.g, out, seen_ops);
      for (const auto& sg : a.graphs) collect_unsupported(*sg, out, seen_ops);
    }
  }
}
}  // namespace

Status check_supported(const ir::Graph& g) {
  std::vector<std::string> lines;
  std::set<std::string> ops;
  collect_unsupported(g, lines, ops);
  if (lines.empty()) return Status::Ok();
  std::string msg = std::to_string(lines.size()) + " node(s) use ops kiln does not support:\n";
  for (const auto& l : lines) msg += l + "\n";
  msg +=
      "To run this model, add these ops as a plugin: a shared library implementing kiln/plugin.h "
      "(shape inference and CPU kernels), loaded with `kiln <command> --plugin libmyops.so`, "
      "KILN_PLUGIN_PATH, kiln::load_plugin() (C++) or kiln.load_plugin() (Python); or, to prototype in "
      "Python, a numpy kernel decorated with @kiln.custom_op(domain, op_type, shape=...) — see "
      "examples/plugins/ (README.md, python_ops.py) for a custom activation and a fused rotary embedding "
      "both ways; or replace the nodes when exporting the model.";
  return Unsupported(msg);
}

Status check_input_value(const ir::ValueInfo& decl, const Value& v) {
  const ir::TypeInfo& t = decl.type;
  if (t.kind == ir::TypeInfo::Kind::kTensor) {
    if (!v.is_tensor())
      return InvalidArgument("input '", decl.name, "' expects a tensor ", t.str(), ", got a ",
                             v.is_sequence() ? "sequence" : "missing value");
    if (t.elem != DataType::kUndefined && v.tensor.dtype() != t.elem)
      return InvalidArgument("input '", decl.name, "' expects dtype ", dtype_name(t.elem), " (", t.str(), "), got ",
                             v.tensor.describe(), " — convert the input to ", dtype_name(t.elem));
    if (t.shape.rank_known) {
      const Dims& d = v.tensor.shape();
      if (d.size() != t.shape.rank())
        return OutOfRange("input '", decl.name, "' expects rank ", t.shape.rank(), " ", t.str(), ", got ",
                          v.tensor.describe());
      for (size_t i = 0; i < d.size(); ++i)
        if (t.shape.dims[i].known() && t.shape.dims[i].value != d[i])
          return OutOfRange("input '", decl.name, "' expects shape ", t.shape.str(), ", got ", dims_str(d), " (dim ", i,
                            " must be ", t.shape.dims[i].value, ")");
    }
  } else if (t.kind == ir::TypeInfo::Kind::kSequence && !v.is_sequence()) {
    return InvalidArgument("input '", decl.name, "' expects a sequence ", t.str());
  }
  return Status::Ok();
}

const Value* Interpreter::Frame::find(const std::string& name) const {
  for (const Frame* f = this; f; f = f->parent) {
    if (auto it = f->plan->slot_of.find(name); it != f->plan->slot_of.end() && f->present[it->second])
      return &f->values[it->second];
    if (auto c = f->plan->constants.find(name); c != f->plan->constants.end()) return &c->second;
  }
  return nullptr;
}

Interpreter::Interpreter(std::shared_ptr<const ir::Graph> graph) : graph_(std::move(graph)) {}

Interpreter::Ref Interpreter::resolve(const ir::Graph& g, const Plan& plan, const std::string& name) {
  Ref r;
  if (name.empty()) return r;
  r.name = &name;
  if (auto it = plan.slot_of.find(name); it != plan.slot_of.end()) {
    r.slot = it->second;
    return r;
  }
  if (auto c = plan.constants.find(name); c != plan.constants.end()) {
    r.constant = &c->second;
    return r;
  }
  // An outer-scope read: the innermost enclosing graph that defines it. A graph run without its
  // enclosing ones on the frame stack finds it by name at run time (lookup's fallback).
  for (const ir::Graph* scope = g.parent; scope; scope = scope->parent) {
    auto outer = plan_for(*scope);
    if (!outer.ok()) break;
    const Plan& p = *outer.value();
    if (auto it = p.slot_of.find(name); it != p.slot_of.end()) {
      r.slot = it->second, r.scope = scope;
      return r;
    }
    if (auto c = p.constants.find(name); c != p.constants.end()) {
      r.constant = &c->second;
      return r;
    }
  }
  return r;
}

const Value* Interpreter::lookup(const Frame& frame, const Ref& r) const {
  if (r.constant) return r.constant;
  if (r.slot >= 0) {
    if (!r.scope) return frame.present[r.slot] ? &frame.values[r.slot] : nullptr;
    for (const Frame* f = frame.parent; f; f = f->parent)
      if (f->graph == r.scope) return f->present[r.slot] ? &f->values[r.slot] : nullptr;
  }
  return frame.parent ? frame.parent->find(*r.name) : nullptr;
}

Result<const Interpreter::Plan*> Interpreter::plan_for(const ir::Graph& g) {
  auto it = plans_.find(&g);
  if (it != plans_.end()) return it->second.get();
  KILN_RETURN_IF_ERROR(check_supported(g));
  auto plan = std::make_unique<Plan>();
  const OpRegistry& reg = OpRegistry::get();
  auto slot = [&](const std::string& name) {
    return plan->slot_of.emplace(name, static_cast<int>(plan->slot_of.size())).first->second;
  };
  for (const auto& in : g.inputs) plan->input_slots.push_back(slot(in.name));
  for (const auto& [name, t] : g.initializers)
    if (!plan->slot_of.count(name)) plan->constants.emplace(name, Value(t));
  std::unordered_map<std::string, size_t> last_use;
  std::unordered_set<std::string> keep;
  for (const auto& o : g.outputs) keep.insert(o.name);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    plan->schemas.push_back(reg.find(n.domain, n.op_type, n.opset));
    for (const auto& in : n.inputs)
      if (!in.empty()) last_use[in] = i;
    for (const auto& [k, a] : n.attrs) {
      std::vector<std::shared_ptr<ir::Graph>> subs = a.graphs;
      if (a.g) subs.push_back(a.g);
      for (const auto& sg : subs)
        for (const auto& r : sg->outer_references()) last_use[r] = i;
    }
    std::vector<int> outs;
    for (const auto& o : n.outputs) outs.push_back(o.empty() ? -1 : slot(o));
    plan->outputs.push_back(std::move(outs));
  }
  // Inputs resolve after every output has its slot (a graph is sorted, but a read of a value produced
  // later would otherwise resolve outward).
  for (const auto& n : g.nodes) {
    std::vector<Ref> ins;
    for (const auto& in : n.inputs) ins.push_back(resolve(g, *plan, in));
    plan->inputs.push_back(std::move(ins));
  }
  for (const auto& o : g.outputs) plan->results.push_back(resolve(g, *plan, o.name));
  plan->release_after.resize(g.nodes.size());
  plan->outs.resize(g.nodes.size());
  for (const auto& [name, idx] : last_use) {
    auto s = plan->slot_of.find(name);
    if (!keep.count(name) && s != plan->slot_of.end() && !g.initializers.count(name))
      plan->release_after[idx].push_back(s->second);
  }
  const Plan* p = plan.get();
  plans_[&g] = std::move(plan);
  return p;
}

std::unique_ptr<Interpreter::Frame> Interpreter::acquire_frame(const ir::Graph& g, const Plan& plan) {
  std::unique_ptr<Frame> f;
  auto& spare = plan.spare;
  if (!spare.empty()) {
    f = std::move(spare.back());
    spare.pop_back();
  } else {
    f = std::make_unique<Frame>();
    f->values.resize(plan.slot_of.size());
    f->present.assign(plan.slot_of.size(), 0);
  }
  f->graph = &g;
  f->plan = &plan;
  f->parent = frames_.empty() ? nullptr : frames_.back();
  return f;
}

void Interpreter::release_frame(std::unique_ptr<Frame> f) {
  for (size_t s = 0; s < f->present.size(); ++s)
    if (f->present[s]) clear_value(f->values[s]), f->present[s] = 0;
  auto& spare = f->plan->spare;
  if (spare.size() < 4) spare.push_back(std::move(f));
}

void clear_value(Value& v) {
  static const Tensor kEmpty;
  v.kind = Value::Kind::kNone;
  v.tensor = kEmpty;  // assigned, not moved: the shape vector keeps its capacity
  v.sequence.clear();
  v.sequence_elem = DataType::kUndefined;
}

Result<std::vector<Value>> run_node(const ir::Node& node, const OpSchema& schema,
                                    const std::vector<const Value*>& inputs, SubgraphRunner* runner) {
  std::vector<Value> outs;
  KILN_RETURN_IF_ERROR(run_node_into(node, schema, inputs, runner, outs));
  return outs;
}

namespace {
// Input lists lent to KernelContexts (swapped in and back): a kernel running a body nests, so a
// thread keeps one per depth; none allocates once grown.
thread_local std::vector<std::vector<const Value*>> t_input_lists;
}  // namespace

Status run_node_into(const ir::Node& node, const OpSchema& schema, const std::vector<const Value*>& inputs,
                     SubgraphRunner* runner, std::vector<Value>& outs) {
  size_t given = inputs.size();
  if (static_cast<int>(given) < schema.min_inputs ||
      (schema.max_inputs >= 0 && static_cast<int>(given) > schema.max_inputs))
    return InvalidModel(node.where(), "has ", given, " inputs; ", node.op_type, " takes ", schema.min_inputs,
                        schema.max_inputs < 0 ? " or more" : " to " + std::to_string(schema.max_inputs));
  KernelContext ctx(node);
  outs.resize(node.outputs.size());
  for (Value& v : outs) clear_value(v);
  // The context works on the caller's output vector and a lent input list (swapped back on every
  // exit): a steady-state run of this node allocates only what its kernel does.
  std::vector<const Value*> lent;
  if (!t_input_lists.empty()) {
    lent.swap(t_input_lists.back());
    t_input_lists.pop_back();
  }
  lent = inputs;
  ctx.inputs.swap(lent);
  ctx.outputs.swap(outs);
  struct GiveBack {
    KernelContext& ctx;
    std::vector<Value>& outs;
    ~GiveBack() {
      ctx.outputs.swap(outs);
      t_input_lists.emplace_back().swap(ctx.inputs);
    }
  } give_back{ctx, outs};
  ctx.subgraphs = runner;
  // Kernels report errors as Status; an exception escaping one (allocation failure on a huge shape,
  // a library throwing) still becomes a clean error naming the node.
  try {
    KILN_RETURN_IF_ERROR(schema.reference(ctx));
  } catch (const MissingInput& m) {
    return InvalidModel(node.where(), "input #", m.index,
                        m.wrong_kind ? " must be a tensor" : " is required but missing");
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfRange, node.where() + "out of memory while computing the outputs");
  } catch (const std::length_error& e) {  // a size that overflows (dims_numel, Tensor)
    return Status(ErrorCode::kOutOfRange, node.where() + "a size is too large (" + e.what() + ")");
  } catch (const std::exception& e) {
    return Internal(node.where(), "kernel threw: ", e.what());
  }
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    if (node.has_output(i) && ctx.outputs[i].is_tensor() && !ctx.outputs[i].tensor.defined())
      return Internal(node.where(), "kernel produced an undefined tensor for output '", node.outputs[i], "'");
  }
  return Status::Ok();
}

Status Interpreter::run_layer(const ir::Graph& g, size_t i, const OpSchema& schema,
                              const std::vector<const Value*>& inputs, bool, std::vector<Value>& outs) {
  return run_node_into(g.nodes[i], schema, inputs, this, outs);
}

Status Interpreter::execute(const ir::Graph& g, Frame& frame, bool top_level, std::vector<Value>& results) {
  const Plan& plan = *frame.plan;
  frames_.push_back(&frame);
  struct Pop {
    std::vector<Frame*>& f;
    ~Pop() { f.pop_back(); }
  } pop{frames_};
  std::vector<const Value*>& ins = frame.ins;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    KILN_RETURN_IF_ERROR(check_deadline(n));
    ins.clear();
    for (const Ref& r : plan.inputs[i]) {
      if (!r.name) {
        ins.push_back(nullptr);
        continue;
      }
      const Value* v = lookup(frame, r);
      if (!v) return Internal(n.where(), "input '", *r.name, "' has no value at run time");
      ins.push_back(v);
    }
    // The node's own output vector (values of the last run emptied, their shape vectors kept); the
    // outputs are assigned into the frame, not moved, for the same reason.
    std::vector<Value>& outs = plan.outs[i];
    outs.resize(n.outputs.size());
    Status st = run_layer(g, i, *plan.schemas[i], ins, top_level, outs);
    if (!st.ok()) {
      for (Value& v : outs) clear_value(v);
      if (st.message().rfind("node '", 0) == 0) return st;
      return st.with_context(n.where());
    }
    if (top_level && place_outputs) place_outputs(n, outs);
    if (top_level && on_node) on_node(n, outs);
    if (on_layer) on_layer(g, n, ins, outs);
    const std::vector<int>& slots = plan.outputs[i];
    for (size_t o = 0; o < slots.size() && o < outs.size(); ++o)
      if (slots[o] >= 0) frame.values[slots[o]] = outs[o], frame.present[slots[o]] = 1;
    for (Value& v : outs) clear_value(v);
    for (int dead : plan.release_after[i]) clear_value(frame.values[dead]), frame.present[dead] = 0;
  }
  results.resize(plan.results.size());
  for (size_t o = 0; o < plan.results.size(); ++o) {
    const Value* v = plan.results[o].name ? lookup(frame, plan.results[o]) : nullptr;
    if (!v) return InvalidModel("graph '", g.name, "': output '", g.outputs[o].name, "' was never produced");
    results[o] = *v;
  }
  return Status::Ok();
}

Result<std::vector<Value>> Interpreter::run(const std::map<std::string, Value>& inputs) {
  std::vector<Value> results;
  KILN_RETURN_IF_ERROR(run(inputs, results));
  return results;
}

Status Interpreter::run(const std::map<std::string, Value>& inputs, std::vector<Value>& results) {
  DeadlineScope deadline(deadline_);
  for (const auto& decl : graph_->inputs) {
    auto it = inputs.find(decl.name);
    if (it == inputs.end()) {
      if (graph_->initializers.count(decl.name)) continue;  // the initializer is the default
      return InvalidArgument("missing input '", decl.name, "' (", decl.type.str(), ")");
    }
    KILN_RETURN_IF_ERROR(check_input_value(decl, it->second));
  }
  for (const auto& [name, v] : inputs) {
    bool declared = false;
    for (const auto& decl : graph_->inputs) declared |= decl.name == name;
    if (!declared) return InvalidArgument("'", name, "' is not an input of the model");
  }
  KILN_ASSIGN_OR_RETURN(const Plan* plan, plan_for(*graph_));
  std::unique_ptr<Frame> frame = acquire_frame(*graph_, *plan);
  struct Release {
    Interpreter& self;
    std::unique_ptr<Frame>& frame;
    ~Release() { self.release_frame(std::move(frame)); }
  } release{*this, frame};
  for (size_t k = 0; k < graph_->inputs.size(); ++k) {
    const ir::ValueInfo& decl = graph_->inputs[k];
    const int s = plan->input_slots[k];
    auto it = inputs.find(decl.name);
    if (it != inputs.end())
      frame->values[s] = it->second;
    else
      frame->values[s] = Value(graph_->initializers.at(decl.name));
    frame->present[s] = 1;
  }
  return execute(*graph_, *frame, true, results);
}

Status Interpreter::run_subgraph_into(const ir::Graph& g, const std::vector<Value>& inputs,
                                      std::vector<Value>& results) {
  if (inputs.size() != g.inputs.size())
    return InvalidModel("subgraph '", g.name, "' takes ", g.inputs.size(), " inputs, given ", inputs.size());
  KILN_ASSIGN_OR_RETURN(const Plan* plan, plan_for(g));
  std::unique_ptr<Frame> frame = acquire_frame(g, *plan);
  struct Release {
    Interpreter& self;
    std::unique_ptr<Frame>& frame;
    ~Release() { self.release_frame(std::move(frame)); }
  } release{*this, frame};
  for (size_t i = 0; i < inputs.size(); ++i) {
    frame->values[plan->input_slots[i]] = inputs[i];
    frame->present[plan->input_slots[i]] = 1;
  }
  return execute(g, *frame, false, results);
}

}  // namespace kiln::ops
