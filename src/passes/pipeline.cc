// The pass pipeline, in order, with the reason for each placement.
#include <chrono>

#include "ops/shape_inference.h"
#include "passes/pass.h"

namespace kiln::passes {

const std::vector<PassInfo>& pipeline() {
  static const std::vector<PassInfo> kPasses = {
      // First: turns Constant nodes and static shape computations into initializers, which every
      // later pattern relies on (it matches constants, not Constant nodes).
      {"fold_constants", fold_constants, "evaluate nodes whose inputs are known at build time"},
      {"remove_noop_ops", remove_noop_ops,
       "drop Identity/Dropout/no-op Cast/Reshape/Transpose, merge Reshape and Transpose pairs"},
      {"eliminate_common_subexpressions", eliminate_common_subexpressions, "merge nodes computing the same values"},
      // Before activation fusion: Conv -> BatchNorm -> Relu must become Conv -> Relu first.
      {"fold_batch_norm", fold_batch_norm, "fold BatchNormalization into Conv/Gemm weights, or lower it to Mul+Add"},
      // Last: rewrites leave orphans behind.
      {"remove_dead_nodes", remove_dead_nodes, "drop nodes and initializers nothing reads"},
  };
  return kPasses;
}

namespace {
// Re-derives types after a rewrite; stale entries of removed values go, declared outputs stay.
Status refresh(ir::Graph& g) {
  std::unordered_map<std::string, ir::TypeInfo> keep;
  for (const auto& in : g.inputs) keep[in.name] = in.type;
  g.value_types = std::move(keep);
  KILN_RETURN_IF_ERROR(g.topological_sort());
  return ops::infer_shapes(g);
}
}  // namespace

Result<std::vector<PassStat>> optimize(ir::Model& model, const std::set<std::string>& disabled) {
  for (const auto& d : disabled) {
    bool known = false;
    std::string names;
    for (const auto& p : pipeline()) {
      known |= d == p.name;
      names += std::string(names.empty() ? "" : ", ") + p.name;
    }
    if (!known) return InvalidArgument("unknown pass '", d, "' (passes: ", names, ")");
  }
  std::vector<PassStat> stats;
  ir::Graph& g = *model.graph;
  for (const auto& p : pipeline()) {
    PassStat st{p.name, 0, 0};
    if (!disabled.count(p.name)) {
      auto t0 = std::chrono::steady_clock::now();
      auto r = p.run(g);
      if (!r.ok()) return r.status().with_context(std::string("pass ") + p.name + ": ");
      st.changed = r.value();
      if (st.changed) {
        Status s = refresh(g);
        if (!s.ok())
          return s.with_context(std::string("after pass ") + p.name + " the graph is invalid (a kiln bug): ");
      }
      st.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    stats.push_back(st);
  }
  return stats;
}

}  // namespace kiln::passes
