#include "engine/tactics.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

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

std::vector<const backends::Tactic*> allowed_candidates(const backends::LayerSignature& sig,
                                                        const TacticFilter& filter) {
  std::vector<const backends::Tactic*> out;
  if (filter.none) return out;
  for (const backends::Tactic* t : backends::candidate_tactics(sig))
    if (filter.allows(t->name())) out.push_back(t);
  return out;
}

tune::LayerTuning choose_tactic(const ir::Graph& g, const ir::Node& n, const TacticFilter& filter, tune::Tuner& tuner) {
  if (filter.none) return {};
  backends::LayerSignature sig = signature_of(g, n);
  return tuner.tune(sig, allowed_candidates(sig, filter));
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
        tune::LayerTuning t = choose_tactic(typed_body, typed_body.nodes[j], filter, tuner);
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
  std::string key;
  for (const ops::Value* v : inputs) {
    if (!v) {
      key += "-;";
      continue;
    }
    if (!v->is_tensor()) return nullptr;
    key += std::to_string(static_cast<int>(v->tensor.dtype())) + dims_str(v->tensor.shape()) + ";";
  }
  std::lock_guard<std::mutex> lock(l.mu);
  auto it = l.by_shapes.find(key);
  if (it != l.by_shapes.end()) return it->second;
  const ir::Node& n = g.nodes[i];
  backends::LayerSignature sig = signature_of(g, n);
  for (size_t k = 0; k < inputs.size() && k < sig.inputs.size(); ++k) {
    if (!inputs[k]) continue;
    sig.inputs[k].present = true;
    sig.inputs[k].dtype = inputs[k]->tensor.dtype();
    sig.inputs[k].shape = inputs[k]->tensor.shape();
  }
  std::shared_ptr<const backends::PreparedLayer> p;
  std::string why = l.tactic->why_unsupported(sig);
  if (why.empty()) {
    auto r = l.tactic->prepare(sig);
    if (r.ok())
      p = std::move(r).value();
    else
      why = r.status().message();
  }
  if (!p && std::getenv("KILN_DEBUG_TACTICS"))
    std::fprintf(stderr, "[kiln] layer '%s': tactic %s cannot take %s: %s (reference kernel)\n", n.name.c_str(),
                 l.tactic->name().c_str(), key.c_str(), why.c_str());
  l.by_shapes.emplace(key, p);  // nullptr too: these shapes take the reference kernel
  return p;
}

}  // namespace kiln::engine
