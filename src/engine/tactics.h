// Tactic selection (build time) and the prepared tactics of an engine (run time).
//
// Build: every layer whose op has tactics gets the fastest of the tactics that support its signature at
// the opt shapes, as the auto-tuner (src/tune) times them (or its timing cache remembers); its name
// becomes the layer's kernel (the engine file stores it with every candidate's time, kiln inspect
// shows them). Layers without a tactic that prepares keep "reference".
//
// Run: TacticRuntime prepares a layer's tactic lazily, once per input-shape signature, shared by
// every context of the engine (a mutex per layer guards the cache; prepared layers run const).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/tactic.h"
#include "ir/graph.h"
#include "ops/value.h"
#include "tune/tuner.h"

namespace kiln::engine {

// Which tactics may be used: from BuilderConfig::tactics and the environment.
//   KILN_TACTICS=name,name   only these (build time)
//   KILN_TACTICS=reference   none: every layer runs its reference kernel (build time)
//   KILN_REFERENCE_KERNELS=1 ignore the engine's tactics at run time as well (tests, debugging)
struct TacticFilter {
  bool none = false;
  std::vector<std::string> allowed;  // empty: all
  bool allows(const std::string& name) const;
};
TacticFilter tactic_filter(const std::vector<std::string>& configured);
bool reference_kernels_forced();

// The signature of node `n` given its input types (shapes may be partly unknown) and constants. The
// builder passes a copy of the graph inferred at the first profile's opt shapes (infer_at), so the
// shapes of models with symbolic dims (batch, seq) are concrete there and tactics can be timed.
backends::LayerSignature signature_of(const ir::Graph& g, const ir::Node& n);

// The tactics that support `sig` and that the filter allows, in priority order.
std::vector<const backends::Tactic*> allowed_candidates(const backends::LayerSignature& sig,
                                                        const TacticFilter& filter);

// Build time: the layer's kernel (a tactic's name, or "reference") and every candidate's result, chosen
// by `tuner` among the allowed candidates. `g` carries concrete shapes (inferred at the opt shapes).
tune::LayerTuning choose_tactic(const ir::Graph& g, const ir::Node& n, const TacticFilter& filter, tune::Tuner& tuner);

// Build time: the kernel of every node of the subgraph bodies of `g` (If/Loop/Scan, nested too),
// chosen as choose_tactic does for a layer and recorded in the node's kBodyKernelAttr. `typed` is
// g's copy inferred at the opt shapes (infer_at: the same structure). Shapes that depend on the data
// stay unknown there: the chosen tactic then prepares at run time for the shapes that come.
struct BodyTuning {
  int layers = 0;                      // body nodes examined
  std::map<std::string, int> kernels;  // kernel -> count (body nodes with a tactic only)
};
BodyTuning choose_body_tactics(ir::Graph& g, const ir::Graph& typed, const TacticFilter& filter, tune::Tuner& tuner);

// Where a node of a subgraph body (If/Loop/Scan, nested too) records its kernel: body nodes are not
// layers of the engine's layer list, and the engine file stores node attributes with the graph.
inline constexpr const char* kBodyKernelAttr = "kiln.kernel";

class TacticRuntime {
 public:
  // kernels[i]: the kernel recorded for graph node i ("reference" or a tactic name); nodes of
  // subgraph bodies carry theirs in kBodyKernelAttr (absent: reference).
  TacticRuntime(std::shared_ptr<const ir::Graph> g, const std::vector<std::string>& kernels);
  bool any() const { return any_; }
  // The prepared tactic of node i of `g` (the engine's graph or one of its bodies) for these input
  // values, or nullptr: run the reference kernel (no tactic, or the tactic cannot take these shapes).
  std::shared_ptr<const backends::PreparedLayer> prepared(const ir::Graph& g, size_t i,
                                                          const std::vector<const ops::Value*>& inputs);
  std::shared_ptr<const backends::PreparedLayer> prepared(size_t i, const std::vector<const ops::Value*>& inputs) {
    return prepared(*graph_, i, inputs);
  }

 private:
  struct Layer {
    const backends::Tactic* tactic = nullptr;
    std::mutex mu;
    std::map<std::string, std::shared_ptr<const backends::PreparedLayer>> by_shapes;
  };
  void add_bodies(const ir::Graph& g, bool off);
  std::shared_ptr<const ir::Graph> graph_;
  // Per graph (the main graph and every body), per node; fixed after construction.
  std::unordered_map<const ir::Graph*, std::vector<std::unique_ptr<Layer>>> layers_;
  bool any_ = false;
};

}  // namespace kiln::engine
