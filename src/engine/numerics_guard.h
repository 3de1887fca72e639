// The numerics guard (kiln/numerics.h): an observer of a run that checks every layer's outputs
// (main graph and bodies, in execution order) for Inf/NaN, values beyond FP16's range and INT8
// saturation. It rides on the interpreter's per-layer hook (ops::Interpreter::on_layer), the same
// loop kiln compare observes, so it works for any runner built on that loop: the engine's executor
// (tactics of any device or precision), the reference interpreter. It knows nothing of kernels: a
// layer's precision comes from layer_precision() below, its values from the tensors it produced.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "ir/graph.h"
#include "kiln/numerics.h"
#include "ops/interpreter.h"
#include "ops/value.h"

namespace kiln::engine {

constexpr double kFP16Max = 65504.0;

// The precision layer `n` runs in: the node's "kiln.precision" attribute when a build recorded one
// (fp32, fp16, bf16, int8), else the dtype of its outputs (float16 -> fp16, bfloat16 -> bf16,
// int8/uint8 -> int8), else fp32. Reduced-precision builds that keep FP32 storage for a reduced
// precision layer say so with the attribute.
std::string layer_precision(const ir::Node& n, const std::vector<ops::Value>& outs);

// The range of one value (min/max over finite values, NaN and Inf counts).
NumericsRange range_of(const std::string& name, const ops::Value* v);

class NumericsGuard {
 public:
  // `graph`: the graph the runner executes (its bodies give body layers their paths).
  NumericsGuard(std::shared_ptr<const ir::Graph> graph, NumericsCheck check);

  // Starts a run: forgets the last one's findings and checks the graph inputs (an input already
  // holding NaN/Inf is a finding of its own, index -1).
  void begin_run(const std::map<std::string, ops::Value>& inputs);
  // Checks one layer (of `g`, the main graph or a body) after it ran.
  void observe(const ir::Graph& g, const ir::Node& n, const std::vector<const ops::Value*>& ins,
               const std::vector<ops::Value>& outs);
  // Installs observe() as the interpreter's on_layer hook (the guard must outlive its runs).
  void attach(ops::Interpreter& interp);

  const NumericsReport& report() const { return report_; }
  const NumericsCheck& check() const { return check_; }

 private:
  std::string path_of(const ir::Graph& g, const ir::Node& n) const;
  void add(NumericsFinding f);

  std::shared_ptr<const ir::Graph> graph_;
  NumericsCheck check_;
  struct BodyOwner {
    const ir::Graph* parent;
    std::string node, attr;
  };
  std::unordered_map<const ir::Graph*, BodyOwner> owners_;  // body -> the layer and attribute holding it
  NumericsReport report_;
  std::unordered_map<std::string, NumericsRange> produced_;  // each value's range when it was made
  int64_t index_ = 0;
  bool have_first_[3] = {false, false, false};
  int64_t kind_count_[3] = {0, 0, 0};            // findings of each kind this run (listed or not)
  bool from_bodies_[3] = {false, false, false};  // the layer being observed: its bodies found this kind
  std::unordered_map<const ir::Graph*, std::array<int64_t, 3>> last_counts_;  // kind_count_ after a graph's last layer
};

// The report as JSON (kiln compare's report "numerics"), and as the lines the CLI prints: the
// first error (or that there is none), then each other finding; `who` names the runner
// ("engine model.kiln").
nlohmann::json numerics_json(const NumericsReport& r);
std::vector<std::string> numerics_lines(const NumericsReport& r, const std::string& who);

}  // namespace kiln::engine
