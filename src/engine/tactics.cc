#include "engine/tactics.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/parallel.h"

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
  if (const char* env = std::getenv("KILN_TACTICS"); env && *env) {
    f.allowed.clear();
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) f.allowed.push_back(item);
  }
  for (const auto& a : f.allowed) f.none |= a == "reference";
  f.none |= reference_kernels_forced();
  return f;
}

bool reference_kernels_forced() {
  const char* env = std::getenv("KILN_REFERENCE_KERNELS");
  return env && *env && std::strcmp(env, "0") != 0;
}

backends::LayerSignature signature_of(const ir::Graph& g, const ir::Node& n) {
  backends::LayerSignature sig;
  sig.node = &n;
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
  for (size_t i = 0; i < n.outputs.size(); ++i) sig.outputs.push_back({});
  return sig;
}

Candidates candidates_for(const backends::LayerSignature& sig, const TacticFilter& filter) {
  Candidates c;
  if (filter.none) return c;
  const auto op = std::make_pair(sig.domain(), sig.op());
  for (const backends::Tactic* t : backends::all_tactics()) {
    auto ops = t->ops();
    if (std::find(ops.begin(), ops.end(), op) == ops.end() || t->device() != sig.device) continue;
    if (!filter.allows(t->name())) {
      c.declined.push_back({t->name(), "left out by --tactics / KILN_TACTICS"});
      continue;
    }
    std::string why = t->why_unsupported(sig);
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

LayerChoice choose_tactic(const ir::Graph& g, const ir::Node& n, const TacticFilter& filter, tune::Tuner& tuner) {
  if (filter.none) return {};
  backends::LayerSignature sig = signature_of(g, n);
  Candidates c = candidates_for(sig, filter);
  return {tuner.tune(sig, c.allowed), std::move(c.declined)};
}

std::vector<std::string> reference_reasons(const ir::Node& n, const LayerChoice& c, const TacticFilter& filter) {
  std::vector<std::string> out;
  if (filter.none) {
    out.push_back("reference kernels requested (--tactics reference, KILN_TACTICS or KILN_REFERENCE_KERNELS)");
    return out;
  }
  for (const auto& d : c.declined) out.push_back(d.tactic + ": " + d.reason);
  for (const auto& r : c.tuning.candidates)
    if (!r.error.empty()) out.push_back(r.tactic + ": " + r.error);
  if (out.empty()) out.push_back("no tactic implements " + (n.domain.empty() ? n.op_type : n.domain + "." + n.op_type));
  return out;
}

bool is_shape_work(const ir::Graph& g, const ir::Node& n) {
  static const char* const kNoElementsMoved[] = {"Shape",   "Size",    "Constant", "Identity",
                                                 "Reshape", "Flatten", "Squeeze",  "Unsqueeze"};
  if (n.domain.empty())
    for (const char* op : kNoElementsMoved)
      if (n.op_type == op) return true;
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
    bool integral = dt == DataType::kBool || dtype_is_integer(dt);
    return numel <= 64 || (integral && numel <= 4096);
  };
  for (const auto& v : n.inputs)
    if (!small(v)) return false;
  for (const auto& v : n.outputs)
    if (!small(v)) return false;
  return true;
}

namespace {
// The subgraphs of a node, in a fixed order (attribute name, then position).
std::vector<ir::Graph*> bodies_of(const ir::Node& n) {
  std::vector<ir::Graph*> out;
  for (const auto& [k, a] : n.attrs) {
    if (a.g) out.push_back(a.g.get());
    for (const auto& sg : a.graphs) out.push_back(sg.get());
  }
  return out;
}

void tune_bodies(ir::Graph& g, const ir::Graph& typed, const TacticFilter& filter, tune::Tuner& tuner,
                 BodyTuning& out) {
  for (size_t i = 0; i < g.nodes.size() && i < typed.nodes.size(); ++i) {
    // kiln's fused ops keep their body private (the fused op's own kernel runs it).
    if (g.nodes[i].domain == "kiln") continue;
    std::vector<ir::Graph*> subs = bodies_of(g.nodes[i]), typed_subs = bodies_of(typed.nodes[i]);
    for (size_t s = 0; s < subs.size() && s < typed_subs.size(); ++s) {
      ir::Graph& body = *subs[s];
      const ir::Graph& typed_body = *typed_subs[s];
      for (size_t j = 0; j < body.nodes.size() && j < typed_body.nodes.size(); ++j) {
        ir::Node& n = body.nodes[j];
        n.attrs.erase(kBodyKernelAttr);
        ++out.layers;
        tune::LayerTuning t = choose_tactic(typed_body, typed_body.nodes[j], filter, tuner).tuning;
        if (t.kernel.empty() || t.kernel == "reference") continue;
        ir::Attribute a;
        a.type = ir::Attribute::Type::kString;
        a.s = t.kernel;
        n.attrs[kBodyKernelAttr] = a;
        out.kernels[t.kernel]++;
      }
      tune_bodies(body, typed_body, filter, tuner, out);
    }
  }
}
}  // namespace

BodyTuning choose_body_tactics(ir::Graph& g, const ir::Graph& typed, const TacticFilter& filter, tune::Tuner& tuner) {
  BodyTuning out;
  tune_bodies(g, typed, filter, tuner, out);
  return out;
}

TacticRuntime::TacticRuntime(std::shared_ptr<const ir::Graph> g, const std::vector<std::string>& kernels)
    : graph_(std::move(g)) {
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
  std::vector<InputType> types(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const ops::Value* v = inputs[k];
    if (!v) continue;
    if (!v->is_tensor()) return nullptr;
    types[k] = {true, v->tensor.dtype(), v->tensor.shape()};
  }
  return get(g, i, key_of(types), types);
}

std::shared_ptr<const backends::PreparedLayer> TacticRuntime::get(const ir::Graph& g, size_t i, const std::string& key,
                                                                  const std::vector<InputType>& types) {
  Layer& l = *layers_.at(&g)[i];
  std::lock_guard<std::mutex> lock(l.mu);
  auto it = l.by_shapes.find(key);
  if (it != l.by_shapes.end()) return it->second;
  const ir::Node& n = g.nodes[i];
  backends::LayerSignature sig = signature_of(g, n);
  for (size_t k = 0; k < types.size() && k < sig.inputs.size(); ++k) {
    if (!types[k].present) continue;
    sig.inputs[k].present = true;
    sig.inputs[k].dtype = types[k].dtype;
    sig.inputs[k].shape = types[k].shape;
  }
  std::shared_ptr<const backends::PreparedLayer> p;
  std::string why = l.tactic->why_unsupported(sig);
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
