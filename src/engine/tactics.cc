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
    if (!name.empty()) {
      t.present = true;
      auto init = g.initializers.find(name);
      if (init != g.initializers.end()) {
        t.constant = &init->second;
        t.dtype = init->second.dtype();
        t.shape = init->second.shape();
      } else if (auto it = g.value_types.find(name); it != g.value_types.end() && it->second.is_tensor()) {
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

TacticRuntime::TacticRuntime(std::shared_ptr<const ir::Graph> g, const std::vector<std::string>& kernels)
    : graph_(std::move(g)) {
  bool off = reference_kernels_forced();
  for (size_t i = 0; i < graph_->nodes.size(); ++i) {
    auto l = std::make_unique<Layer>();
    if (!off && i < kernels.size() && kernels[i] != "reference") l->tactic = backends::find_tactic(kernels[i]);
    any_ |= l->tactic != nullptr;
    layers_.push_back(std::move(l));
  }
}

std::shared_ptr<const backends::PreparedLayer> TacticRuntime::prepared(size_t i,
                                                                       const std::vector<const ops::Value*>& inputs) {
  Layer& l = *layers_[i];
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
  const ir::Node& n = graph_->nodes[i];
  backends::LayerSignature sig = signature_of(*graph_, n);
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
