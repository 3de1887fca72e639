// Tactic selection (build time) and the prepared tactics of an engine (run time).
//
// Build: every layer whose op has tactics gets the fastest of the tactics that support its signature at
// the opt shapes, as the auto-tuner (src/tune) times them (or its timing cache remembers); its name
// becomes the layer's kernel (the engine file stores it with every candidate's time, kiln inspect
// shows them). Layers without a tactic that prepares keep "reference": the builder records why (each
// tactic of the op that declined the layer, with its reason) and warns (engine/builder.cc).
//
// Run: TacticRuntime prepares a layer's tactic once per input-shape signature, shared by every
// context of the engine (a mutex per layer guards the cache; prepared layers run const). The engine
// prepares every layer ahead for profile 0's opt shapes (prepare_ahead), so that a loaded engine's
// first run() does not pay for reordering weights; other shapes are prepared on first use. A tactic
// that cannot take a run-time shape leaves the layer on its reference kernel for those shapes, with a
// warning on stderr the first time per layer.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/registry.h"
#include "core/target.h"
#include "ir/graph.h"
#include "ops/value.h"
#include "tune/tuner.h"

namespace kiln::engine {

// Which tactics may be used: from BuilderConfig::tactics (kiln build --tactics), at build time:
//   {name, name}  only these
//   {"reference"} none: every layer runs its reference kernel
// and at run time KILN_REFERENCE_KERNELS=1 ignores the engine's tactics (debugging: it changes no
// engine and no timing, only which kernels a run uses).
struct TacticFilter {
  bool none = false;
  std::vector<std::string> allowed;  // empty: all
  bool allows(const std::string& name) const;
};
TacticFilter tactic_filter(const std::vector<std::string>& configured);
bool reference_kernels_forced();

// The signature of node `n` given its input and output types (shapes may be partly unknown) and
// constants, on the target's device, instruction set and precision. The builder passes a copy of the
// graph inferred at the first profile's opt shapes (infer_at), so the shapes of models with symbolic
// dims (batch, seq) are concrete there and tactics can be timed.
backends::LayerSignature signature_of(const ir::Graph& g, const ir::Node& n, const Target& target);

// A tactic of the layer's op that is not a candidate for it, and why ("1-D convolution not supported",
// "needs avx512_bf16; the target has avx2", or that --tactics leaves it out).
struct Declined {
  std::string tactic, reason;
};
struct Candidates {
  std::vector<const backends::Tactic*> allowed;  // support `sig`, allowed by the filter, in priority order
  std::vector<Declined> declined;                // implement the op on the device but are not allowed
};
Candidates candidates_for(const backends::LayerSignature& sig, const TacticFilter& filter);
// The tactics that support `sig` and that the filter allows, in priority order.
std::vector<const backends::Tactic*> allowed_candidates(const backends::LayerSignature& sig,
                                                        const TacticFilter& filter);

// Build time: the layer's kernel (a tactic's name, or "reference") and every candidate's result, chosen
// by `tuner` among the allowed candidates. `g` carries concrete shapes (inferred at the opt shapes).
struct LayerChoice {
  tune::LayerTuning tuning;
  std::vector<Declined> declined;
};
// `precisions`: the compute dtypes the layer may use (engine/precision.h), in order; empty: the
// target's. The candidates of every precision are timed against each other (each with the signature of
// its precision, so the timing cache keys them apart); the fastest wins, ties going to the earlier
// precision. A tactic that computes in no particular precision (data movement) is a candidate once.
LayerChoice choose_tactic(const ir::Graph& g, const ir::Node& n, const Target& target, const TacticFilter& filter,
                          tune::Tuner& tuner, const std::vector<DataType>& precisions = {});
// The precision a layer running `kernel` computes in: its tactic's (TacticInfo::compute), or, for the
// reference kernel and tactics of no particular precision, the dtype of the layer's first input.
DataType kernel_precision(const std::string& kernel, const ir::Graph& g, const ir::Node& n);

// Why a layer that runs its reference kernel does, one reason per line: "TACTIC: REASON" for every
// tactic of its op that declined it or failed to prepare or run, or "no tactic implements OP".
std::vector<std::string> reference_reasons(const ir::Node& n, const LayerChoice& c, const TacticFilter& filter);

// Whether a reference layer is shape work rather than a hot-path finding: an op that moves no
// elements (Shape, Size, Constant, Identity, and the views Reshape/Flatten/Squeeze/Unsqueeze), or one
// whose every input and output is known at the opt shapes (`g`) and small: at most 64 elements, or at
// most 4096 integer/boolean ones (shape arithmetic, index and mask computations).
bool is_shape_work(const ir::Graph& g, const ir::Node& n);
// The two halves of that rule: an op that moves no elements, and a tensor small enough to be shape work.
bool moves_no_elements(const ir::Node& n);
bool small_for_shape_work(DataType dt, int64_t numel);

// Build time: the kernel of every node of the subgraph bodies of `g` (If/Loop/Scan, nested too),
// chosen as choose_tactic does for a layer and recorded in the node's kBodyKernelAttr. `typed` is
// g's copy inferred at the opt shapes (infer_at: the same structure). Shapes that depend on the data
// stay unknown there: the chosen tactic then prepares at run time for the shapes that come.
struct BodyTuning {
  int layers = 0;                      // body nodes examined
  std::map<std::string, int> kernels;  // kernel -> count (body nodes with a tactic only)
  // Body nodes left on their reference kernel (control-flow nodes aside: their bodies are examined),
  // reported like main-graph reference layers (engine/reference_layers.cc).
  struct Reference {
    std::string path;  // "If_3404/else_branch/NonMaxSuppression_3422", as kiln bench's profile names it
    std::string op_type, domain;
    int opset = 0;
    std::vector<std::string> reasons;
    bool shape_work = false;
  };
  std::vector<Reference> reference;
};
BodyTuning choose_body_tactics(ir::Graph& g, const ir::Graph& typed, const Target& target, const TacticFilter& filter,
                               tune::Tuner& tuner);

// Where a node of a subgraph body (If/Loop/Scan, nested too) records its kernel: body nodes are not
// layers of the engine's layer list, and the engine file stores node attributes with the graph.
inline constexpr const char* kBodyKernelAttr = "kiln.kernel";

class TacticRuntime {
 public:
  // kernels[i]: the kernel recorded for graph node i ("reference" or a tactic name); nodes of
  // subgraph bodies carry theirs in kBodyKernelAttr (absent: reference). Layers are prepared for
  // `target` (the engine's: its instruction set caps the kernels' paths).
  TacticRuntime(std::shared_ptr<const ir::Graph> g, const std::vector<std::string>& kernels, Target target);
  bool any() const { return any_; }
  // Whether node i of the main graph has a tactic (it may still decline some run-time shapes).
  bool has_tactic(size_t i) const {
    const auto& top = layers_.at(graph_.get());
    return i < top.size() && top[i]->tactic;
  }
  // The prepared tactic of node i of `g` (the engine's graph or one of its bodies) for these input
  // values, or nullptr: run the reference kernel (no tactic, or the tactic cannot take these shapes).
  std::shared_ptr<const backends::PreparedLayer> prepared(const ir::Graph& g, size_t i,
                                                          const std::vector<const ops::Value*>& inputs);
  // The tactic recorded for node i of `g` (nullptr: reference).
  const backends::Tactic* tactic_of(const ir::Graph& g, size_t i) const {
    auto layers = layers_.find(&g);
    return layers == layers_.end() || i >= layers->second.size() ? nullptr : layers->second[i]->tactic;
  }
  std::shared_ptr<const backends::PreparedLayer> prepared(size_t i, const std::vector<const ops::Value*>& inputs) {
    return prepared(*graph_, i, inputs);
  }
  // Prepares every main-graph layer with a tactic for the value types of `typed` (the engine's graph
  // inferred at some concrete input shapes), on all threads. Layers whose input shapes are not known
  // there (and body layers) are left to run time. Returns how many layers it prepared.
  int prepare_ahead(const ir::Graph& typed);
  // The same, returning every main-graph node's prepared layer at `typed`'s shapes (nullptr: none, or
  // its input shapes are not known there): the context plans their workspaces and binds them.
  std::vector<std::shared_ptr<const backends::PreparedLayer>> prepare_all(const ir::Graph& typed);
  // How many times a tactic was prepared (ahead or at run time): tests check run() prepares nothing.
  int prepares() const { return prepares_.load(); }

 private:
  struct InputType {
    bool present = false;
    DataType dtype = DataType::kUndefined;
    Dims shape;
  };
  struct Layer {
    const backends::Tactic* tactic = nullptr;
    std::mutex mu;
    std::map<std::string, std::shared_ptr<const backends::PreparedLayer>> by_shapes;
    bool warned = false;  // a run-time decline was reported (once per layer)
    // The input types of the last lookup and its answer: a run at unchanged shapes compares them
    // instead of formatting the key (measured: ~3 us a layer, 15% of mobilenet_v3_small at batch 1).
    bool has_last = false;
    std::vector<InputType> last_types;
    std::shared_ptr<const backends::PreparedLayer> last;
  };
  static std::string key_of(const std::vector<InputType>& types);
  // The prepared layer of node i of `g` for `types` (key `key`), preparing it when new. Takes the
  // layer's lock.
  std::shared_ptr<const backends::PreparedLayer> get(const ir::Graph& g, size_t i, const std::string& key,
                                                     const std::vector<InputType>& types);
  void add_bodies(const ir::Graph& g, bool off);
  std::shared_ptr<const ir::Graph> graph_;
  Target target_;
  // Per graph (the main graph and every body), per node; fixed after construction.
  std::unordered_map<const ir::Graph*, std::vector<std::unique_ptr<Layer>>> layers_;
  bool any_ = false;
  std::atomic<int> prepares_{0};
};

}  // namespace kiln::engine
