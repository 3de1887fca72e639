#include "engine/tactics.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

#include "core/parallel.h"
#include "ops/kiln_quantized.h"
#include "ops/op_traits.h"
#include "ops/quantized_layers.h"

namespace kiln::engine {

bool TacticFilter::allows(const std::string& name) const {
  if (none) return false;
  if (allowed.empty()) return true;
  for (const auto& a : allowed)
    if (a == name) return true;
  return false;
}

TacticFilter tactic_filter(const std::vector<std::string>& configured) {
  TacticFilter f;
  f.allowed = configured;
  for (const auto& a : f.allowed) f.none |= a == "reference";
  f.none |= reference_kernels_forced();
  return f;
}

bool reference_kernels_forced() {
  const char* env = std::getenv("KILN_REFERENCE_KERNELS");
  return env && *env && std::strcmp(env, "0") != 0;
}

namespace {
// The type of value `name` as the innermost graph from `g` outwards that defines it knows it.
const ir::TypeInfo* type_in_scope(const ir::Graph& g, const std::string& name) {
  const ir::Graph* scope = &g;
  while (scope->parent && !scope->defines(name)) scope = scope->parent;
  auto it = scope->value_types.find(name);
  return it == scope->value_types.end() ? nullptr : &it->second;
}
}  // namespace

backends::LayerSignature signature_of(const ir::Graph& g, const ir::Node& n, const Target& target) {
  backends::LayerSignature sig;
  sig.node = &n;
  sig.device = target.device;
  sig.isa = target.isa;
  sig.compute = target.precision;
  if (ops::computes_in_int8(n)) sig.compute = DataType::kInt8;  // quantized by the graph
  sig.tf32 = target.tf32;
  sig.exact_gelu = target.exact_gelu;
  for (const auto& name : n.inputs) {
    backends::TensorSig t;
    // A body node may read values of enclosing graphs: the innermost graph that defines the name.
    const ir::Graph* scope = &g;
    while (scope->parent && !scope->defines(name)) scope = scope->parent;
    if (!name.empty()) {
      t.present = true;
      auto init = scope->initializers.find(name);
      if (init != scope->initializers.end()) {
        t.constant = &init->second;
        t.dtype = init->second.dtype();
        t.shape = init->second.shape();
      } else if (auto it = scope->value_types.find(name); it != scope->value_types.end() && it->second.is_tensor()) {
        t.dtype = it->second.elem;
        if (it->second.shape.rank_known)
          for (const Dim& d : it->second.shape.dims) t.shape.push_back(d.known() ? d.value : -1);
        else
          t.dtype = DataType::kUndefined;  // rank unknown: no tactic will claim it
      }
    }
    sig.inputs.push_back(std::move(t));
  }
  for (const auto& name : n.outputs) {
    backends::TensorSig t;
    const ir::TypeInfo* type = name.empty() ? nullptr : type_in_scope(g, name);
    if (type && type->is_tensor()) {
      t.present = true;
      t.dtype = type->elem;
      if (type->shape.rank_known)
        for (const Dim& d : type->shape.dims) t.shape.push_back(d.known() ? d.value : -1);
    }
    sig.outputs.push_back(std::move(t));
  }
  return sig;
}

Candidates candidates_for(const backends::LayerSignature& sig, const TacticFilter& filter) {
  Candidates c;
  if (filter.none) return c;
  for (const backends::Tactic* t : backends::all_tactics()) {
    if (!backends::implements(*t, sig)) continue;
    if (!filter.allows(t->name())) {
      c.declined.push_back({t->name(), "left out by --tactics"});
      continue;
    }
    std::string why = backends::why_declined(*t, sig);
    if (why.empty())
      c.allowed.push_back(t);
    else
      c.declined.push_back({t->name(), std::move(why)});
  }
  return c;
}

std::vector<const backends::Tactic*> allowed_candidates(const backends::LayerSignature& sig,
                                                        const TacticFilter& filter) {
  return candidates_for(sig, filter).allowed;
}

LayerChoice choose_tactic(const ir::Graph& g, const ir::Node& n, const Target& target, const TacticFilter& filter,
                          tune::Tuner& tuner, const std::vector<DataType>& precisions) {
  if (filter.none) return {};
  backends::LayerSignature sig = signature_of(g, n, target);
  if (precisions.empty() || (precisions.size() == 1 && precisions[0] == sig.compute)) {
    Candidates c = candidates_for(sig, filter);
    return {tuner.tune(sig, c.allowed), std::move(c.declined)};
  }
  // One group of candidates per precision, each under the signature of its precision.
  struct Group {
    backends::LayerSignature sig;
    std::vector<const backends::Tactic*> allowed;
  };
  std::vector<Group> groups;
  std::vector<Declined> declined;
  std::set<const backends::Tactic*> taken;
  size_t total = 0;
  for (DataType p : precisions) {
    Group grp{sig, {}};
    grp.sig.compute = p;
    Candidates c = candidates_for(grp.sig, filter);
    for (const backends::Tactic* t : c.allowed)
      if (taken.insert(t).second) grp.allowed.push_back(t);
    // A tactic of another precision declines every group but its own: keep the reasons of the first
    // group and, later, those of the group's own tactics.
    for (auto& d : c.declined) {
      const backends::Tactic* t = backends::find_tactic(d.tactic);
      if (groups.empty() || (t && t->info().compute == p)) declined.push_back(std::move(d));
    }
    total += grp.allowed.size();
    groups.push_back(std::move(grp));
  }
  LayerChoice out;
  const tune::CandidateResult* best = nullptr;
  std::vector<tune::CandidateResult> all;
  for (const Group& grp : groups) {
    if (grp.allowed.empty()) continue;
    tune::LayerTuning t = tuner.tune(grp.sig, grp.allowed, /*force_timing=*/total > 1);
    out.tuning.timed += t.timed, out.tuning.prepared += t.prepared, out.tuning.cache_hits += t.cache_hits;
    for (auto& c : t.candidates) all.push_back(std::move(c));
  }
  // The lowest median wins (ties: the earlier precision, then priority order); without timings (shapes
  // unknown, or a single candidate) the first that can run.
  using State = tune::CandidateResult::State;
  for (const auto& c : all)
    if (c.state == State::kTimed && (!best || best->state != State::kTimed || c.ms < best->ms))
      best = &c;
    else if ((c.state == State::kPrepared || c.state == State::kUnproven) && !best)
      best = &c;
  if (best) out.tuning.kernel = best->tactic;
  out.tuning.candidates = std::move(all);
  // Declined by every group: not a candidate anywhere.
  for (auto& d : declined)
    if (!taken.count(backends::find_tactic(d.tactic))) out.declined.push_back(std::move(d));
  return out;
}

DataType kernel_precision(const std::string& kernel, const ir::Graph& g, const ir::Node& n) {
  if (const backends::Tactic* t = kernel == "reference" ? nullptr : backends::find_tactic(kernel))
    if (t->info().compute != DataType::kUndefined) return t->info().compute;
  if (ops::computes_in_int8(n)) return DataType::kInt8;  // quantized by the graph (its input may be float)
  for (const auto& name : n.inputs) {
    if (name.empty()) continue;
    if (auto init = g.initializers.find(name); init != g.initializers.end()) return init->second.dtype();
    if (const ir::TypeInfo* type = type_in_scope(g, name); type && type->is_tensor()) return type->elem;
    break;
  }
  return DataType::kUndefined;
}

std::vector<std::string> reference_reasons(const ir::Node& n, const LayerChoice& c, const TacticFilter& filter) {
  std::vector<std::string> out;
  if (filter.none) {
    out.push_back("reference kernels requested (--tactics reference or KILN_REFERENCE_KERNELS)");
    return out;
  }
  for (const auto& d : c.declined) out.push_back(d.tactic + ": " + d.reason);
  for (const auto& r : c.tuning.candidates)
    if (!r.error.empty()) out.push_back(r.tactic + ": " + r.error);
  if (out.empty()) out.push_back("no tactic implements " + (n.domain.empty() ? n.op_type : n.domain + "." + n.op_type));
  return out;
}

bool moves_no_elements(const ir::Node& n) {
  return n.domain.empty() && ops::has_trait(n, ops::trait::kView | ops::trait::kShapeQuery);
}

bool small_for_shape_work(DataType dt, int64_t numel) {
  bool integral = dt == DataType::kBool || dtype_is_integer(dt);
  return numel <= 64 || (integral && numel <= 4096);
}

bool is_shape_work(const ir::Graph& g, const ir::Node& n) {
  if (moves_no_elements(n)) return true;
  auto small = [&](const std::string& name) {
    if (name.empty()) return true;
    DataType dt;
    int64_t numel;
    if (auto init = g.initializers.find(name); init != g.initializers.end()) {
      dt = init->second.dtype(), numel = init->second.numel();
    } else {
      auto it = g.value_types.find(name);
      if (it == g.value_types.end() || !it->second.is_tensor() || !it->second.shape.fully_known()) return false;
      dt = it->second.elem, numel = dims_numel(it->second.shape.concrete());
    }
    return small_for_shape_work(dt, numel);
  };
  for (const auto& v : n.inputs)
    if (!small(v)) return false;
  for (const auto& v : n.outputs)
    if (!small(v)) return false;
  return true;
}

namespace {
// The subgraphs of a node, in a fixed order (attribute name, then position), with their names in a
// body layer's path ("else_branch", "body", "branches[1]": as LayerExecutor::run_subgraph names them).
std::vector<std::pair<std::string, ir::Graph*>> bodies_of(const ir::Node& n) {
  std::vector<std::pair<std::string, ir::Graph*>> out;
  for (const auto& [k, a] : n.attrs) {
    if (a.g) out.emplace_back(k, a.g.get());
    for (size_t s = 0; s < a.graphs.size(); ++s) out.emplace_back(k + "[" + std::to_string(s) + "]", a.graphs[s].get());
  }
  return out;
}

void tune_bodies(ir::Graph& g, const ir::Graph& typed, const Target& target, const TacticFilter& filter,
                 tune::Tuner& tuner, const std::string& prefix, BodyTuning& out) {
  for (size_t i = 0; i < g.nodes.size() && i < typed.nodes.size(); ++i) {
    // kiln's fused ops keep their body private (the fused op's own kernel runs it).
    if (g.nodes[i].domain == "kiln") continue;
    auto subs = bodies_of(g.nodes[i]), typed_subs = bodies_of(typed.nodes[i]);
    const std::string& owner = g.nodes[i].name.empty() ? g.nodes[i].op_type : g.nodes[i].name;
    for (size_t s = 0; s < subs.size() && s < typed_subs.size(); ++s) {
      ir::Graph& body = *subs[s].second;
      const ir::Graph& typed_body = *typed_subs[s].second;
      const std::string path = prefix + owner + "/" + subs[s].first + "/";
      for (size_t j = 0; j < body.nodes.size() && j < typed_body.nodes.size(); ++j) {
        ir::Node& n = body.nodes[j];
        n.attrs.erase(kBodyKernelAttr);
        ++out.layers;
        LayerChoice c = choose_tactic(typed_body, typed_body.nodes[j], target, filter, tuner);
        const tune::LayerTuning& t = c.tuning;
        if (t.kernel.empty() || t.kernel == "reference") {
          // Reported like a main-graph reference layer (engine/reference_layers.cc); control flow
          // itself is not: its body layers are.
          bool control_flow = !bodies_of(n).empty();
          if (!control_flow)
            out.reference.push_back({path + (n.name.empty() ? n.op_type : n.name), n.op_type, n.domain, n.opset,
                                     reference_reasons(n, c, filter), is_shape_work(typed_body, typed_body.nodes[j])});
          continue;
        }
        ir::Attribute a;
        a.type = ir::Attribute::Type::kString;
        a.s = t.kernel;
        n.attrs[kBodyKernelAttr] = a;
        out.kernels[t.kernel]++;
      }
      tune_bodies(body, typed_body, target, filter, tuner, path, out);
    }
  }
}
}  // namespace

BodyTuning choose_body_tactics(ir::Graph& g, const ir::Graph& typed, const Target& target, const TacticFilter& filter,
                               tune::Tuner& tuner) {
  BodyTuning out;
  tune_bodies(g, typed, target, filter, tuner, "", out);
  return out;
}

TacticRuntime::TacticRuntime(std::shared_ptr<const ir::Graph> g, const std::vector<std::string>& kernels, Target target)
    : graph_(std::move(g)), target_(target) {
  bool off = reference_kernels_forced();
  auto& top = layers_[graph_.get()];
  for (size_t i = 0; i < graph_->nodes.size(); ++i) {
    auto l = std::make_unique<Layer>();
    if (!off && i < kernels.size() && kernels[i] != "reference") l->tactic = backends::find_tactic(kernels[i]);
    any_ |= l->tactic != nullptr;
    top.push_back(std::move(l));
  }
  add_bodies(*graph_, off);
}

std::string TacticRuntime::key_of(const std::vector<InputType>& types) {
  std::string key;
  for (const InputType& t : types)
    key += t.present ? std::to_string(static_cast<int>(t.dtype)) + dims_str(t.shape) + ";" : "-;";
  return key;
}

void TacticRuntime::add_bodies(const ir::Graph& g, bool off) {
  for (const auto& n : g.nodes)
    for (const auto& [k, a] : n.attrs) {
      std::vector<std::shared_ptr<ir::Graph>> subs = a.graphs;
      if (a.g) subs.push_back(a.g);
      for (const auto& sg : subs) {
        auto& layers = layers_[sg.get()];
        for (const auto& bn : sg->nodes) {
          auto l = std::make_unique<Layer>();
          std::string kernel = bn.attr_string(kBodyKernelAttr, "reference");
          if (!off && kernel != "reference") l->tactic = backends::find_tactic(kernel);
          any_ |= l->tactic != nullptr;
          layers.push_back(std::move(l));
        }
        add_bodies(*sg, off);
      }
    }
}

std::shared_ptr<const backends::PreparedLayer> TacticRuntime::prepared(const ir::Graph& g, size_t i,
                                                                       const std::vector<const ops::Value*>& inputs) {
  auto layers = layers_.find(&g);
  if (layers == layers_.end() || i >= layers->second.size()) return nullptr;  // not a graph of this engine
  Layer& l = *layers->second[i];
  if (!l.tactic) return nullptr;
  {
    std::lock_guard<std::mutex> lock(l.mu);
    if (l.has_last && l.last_types.size() == inputs.size()) {
      bool same = true;
      for (size_t k = 0; k < inputs.size() && same; ++k) {
        const ops::Value* v = inputs[k];
        const InputType& t = l.last_types[k];
        same = v ? v->is_tensor() && t.present && t.dtype == v->tensor.dtype() && t.shape == v->tensor.shape()
                 : !t.present;
      }
      if (same) return l.last;
    }
  }
  std::vector<InputType> types(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const ops::Value* v = inputs[k];
    if (!v) continue;
    if (!v->is_tensor()) return nullptr;
    types[k] = {true, v->tensor.dtype(), v->tensor.shape()};
  }
  auto p = get(g, i, key_of(types), types);
  std::lock_guard<std::mutex> lock(l.mu);
  l.has_last = true;
  l.last_types = std::move(types);
  l.last = p;
  return p;
}

std::shared_ptr<const backends::PreparedLayer> TacticRuntime::get(const ir::Graph& g, size_t i, const std::string& key,
                                                                  const std::vector<InputType>& types) {
  Layer& l = *layers_.at(&g)[i];
  std::lock_guard<std::mutex> lock(l.mu);
  auto it = l.by_shapes.find(key);
  if (it != l.by_shapes.end()) return it->second;
  const ir::Node& n = g.nodes[i];
  backends::LayerSignature sig = signature_of(g, n, target_);
  // The layer computes in its tactic's precision, which the build chose (engine/precision.h).
  if (l.tactic->info().compute != DataType::kUndefined) sig.compute = l.tactic->info().compute;
  for (size_t k = 0; k < types.size() && k < sig.inputs.size(); ++k) {
    if (!types[k].present) continue;
    sig.inputs[k].present = true;
    sig.inputs[k].dtype = types[k].dtype;
    sig.inputs[k].shape = types[k].shape;
  }
  std::shared_ptr<const backends::PreparedLayer> p;
  // A tactic of another op (an engine whose stored layer order no longer matches its graph's) would
  // compute something else: never prepared.
  std::string why = backends::implements(*l.tactic, sig)
                        ? backends::why_declined(*l.tactic, sig)
                        : "it does not implement " + (n.domain.empty() ? n.op_type : n.domain + "." + n.op_type) +
                              " (the engine's layers do not match its graph: rebuild the engine)";
  if (why.empty()) {
    ++prepares_;
    try {
      auto r = l.tactic->prepare(sig);
      if (r.ok())
        p = std::move(r).value();
      else
        why = r.status().message();
    } catch (const std::exception& e) {  // prepare_ahead runs it inside a parallel region
      why = std::string("exception: ") + e.what();
    }
  }
  if (!p && !l.warned) {
    // Not silent (issue 11): the layer runs its reference kernel for these shapes. Once per layer.
    l.warned = true;
    std::string shapes;
    for (const InputType& t : types) shapes += (shapes.empty() ? "" : ", ") + (t.present ? dims_str(t.shape) : "-");
    std::fprintf(stderr,
                 "kiln: warning: layer '%s' (%s): tactic %s cannot take the input shapes %s (%s); the layer runs "
                 "its reference kernel for them\n",
                 n.name.c_str(), n.op_type.c_str(), l.tactic->name().c_str(), shapes.c_str(), why.c_str());
  }
  l.by_shapes.emplace(key, p);  // nullptr too: these shapes take the reference kernel
  return p;
}

int TacticRuntime::prepare_ahead(const ir::Graph& typed) {
  int done = 0;
  for (const auto& p : prepare_all(typed)) done += p != nullptr;
  return done;
}

std::vector<std::shared_ptr<const backends::PreparedLayer>> TacticRuntime::prepare_all(const ir::Graph& typed) {
  // The layers whose every input type is known in `typed`, with those types.
  std::vector<std::pair<size_t, std::vector<InputType>>> todo;
  const auto& top = layers_.at(graph_.get());
  for (size_t i = 0; i < top.size() && i < typed.nodes.size(); ++i) {
    if (!top[i]->tactic) continue;
    const ir::Node& n = typed.nodes[i];
    std::vector<InputType> types(n.inputs.size());
    bool known = true;
    for (size_t k = 0; k < n.inputs.size() && known; ++k) {
      const std::string& name = n.inputs[k];
      if (name.empty()) continue;
      if (auto init = typed.initializers.find(name); init != typed.initializers.end()) {
        types[k] = {true, init->second.dtype(), init->second.shape()};
        continue;
      }
      auto it = typed.value_types.find(name);
      known = it != typed.value_types.end() && it->second.is_tensor() && it->second.shape.fully_known();
      if (known) types[k] = {true, it->second.elem, it->second.shape.concrete()};
    }
    if (known) todo.emplace_back(i, std::move(types));
  }
  // Layers differ in cost by orders of magnitude: each thread takes the next layer as it finishes one.
  std::vector<std::shared_ptr<const backends::PreparedLayer>> out(top.size());
  std::atomic<size_t> next{0};
  int threads = std::max(1, kiln::max_threads());
  kiln::parallel_for(threads, 1, [&](int64_t, int64_t) {
    for (size_t t; (t = next++) < todo.size();) {
      auto& [i, types] = todo[t];
      out[i] = get(*graph_, i, key_of(types), types);
    }
  });
  return out;
}

}  // namespace kiln::engine
