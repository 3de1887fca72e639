// fold_constants: replaces every node whose outputs are all known at build time (all inputs
// constant, or a shape computation over static shapes, e.g. Shape -> Gather -> Unsqueeze -> Concat
// feeding a Reshape) by initializers. Random ops and nodes with subgraphs are left alone (shape
// inference never folds them); outputs larger than 1M elements are not folded (they would bloat
// the engine file more than they save).
#include "ir/rewrite.h"
#include "ops/shape_inference.h"
#include "passes/pass.h"

namespace kiln::passes {

Result<int> fold_constants(ir::Graph& g) {
  std::map<std::string, Tensor> known;
  ops::InferOptions opts;
  opts.constants_out = &known;
  KILN_RETURN_IF_ERROR(ops::infer_shapes(g, opts));
  std::set<int> folded;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    bool all = !n.outputs.empty();
    for (const auto& o : n.outputs)
      if (!o.empty() && !known.count(o)) all = false;
    if (!all) continue;
    for (const auto& o : n.outputs)
      if (!o.empty()) g.initializers[o] = known.at(o);
    folded.insert(static_cast<int>(i));
  }
  ir::remove_nodes(g, folded);
  return static_cast<int>(folded.size());
}

}  // namespace kiln::passes
