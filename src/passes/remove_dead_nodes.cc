// remove_dead_nodes: drops nodes none of whose outputs are read (by a node, a subgraph or a graph
// output), repeatedly, then initializers nothing reads. Graph inputs are never removed.
#include "ir/rewrite.h"
#include "passes/pass.h"

namespace kiln::passes {

Result<int> remove_dead_nodes(ir::Graph& g) {
  int removed = 0;
  for (;;) {
    ir::UseIndex uses(g);
    std::set<int> dead;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      bool live = false;
      for (const auto& o : g.nodes[i].outputs)
        if (!o.empty() && (!uses.consumers(o).empty() || uses.is_graph_output(o))) live = true;
      if (!live) dead.insert(static_cast<int>(i));
    }
    if (dead.empty()) break;
    removed += static_cast<int>(dead.size());
    ir::remove_nodes(g, dead);
  }
  ir::UseIndex uses(g);
  std::set<std::string> inputs;
  for (const auto& in : g.inputs) inputs.insert(in.name);
  for (auto it = g.initializers.begin(); it != g.initializers.end();) {
    if (!inputs.count(it->first) && uses.consumers(it->first).empty() && !uses.is_graph_output(it->first)) {
      it = g.initializers.erase(it);
      ++removed;
    } else {
      ++it;
    }
  }
  return removed;
}

}  // namespace kiln::passes
