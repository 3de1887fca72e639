// eliminate_common_subexpressions: two nodes with the same op, domain, inputs and attributes
// compute the same values; the later one's readers switch to the earlier one's outputs. Nodes with
// subgraphs, random ops and nodes producing graph outputs are left alone.
#include <map>
#include <sstream>

#include "ir/rewrite.h"
#include "passes/pass.h"

namespace kiln::passes {

namespace {
bool is_random(const std::string& op) {
  return op.rfind("Random", 0) == 0 || op == "Multinomial" || op == "Bernoulli" || op == "Dropout";
}

// A key identifying what the node computes; empty when the node must not be merged.
std::string node_key(const ir::Node& n) {
  if (is_random(n.op_type)) return "";
  std::ostringstream k;
  k << n.domain << "|" << n.op_type << "|" << n.opset << "|";
  for (const auto& i : n.inputs) k << i << ",";
  k << "|" << n.outputs.size() << "|";
  for (const auto& [name, a] : n.attrs) {
    if (a.g || !a.graphs.empty()) return "";
    k << name << "=" << static_cast<int>(a.type) << ":" << a.i << ":" << a.f << ":" << a.s << ":";
    for (auto v : a.ints) k << v << ",";
    for (auto v : a.floats) k << v << ",";
    for (const auto& v : a.strings) k << v << ",";
    if (a.t.defined()) {
      k << a.t.describe() << ":";
      if (a.t.dtype() == DataType::kString) {
        for (int64_t i = 0; i < a.t.numel(); ++i) k << a.t.strings()[i] << ",";
      } else {
        k.write(static_cast<const char*>(a.t.raw()), static_cast<std::streamsize>(a.t.nbytes()));
      }
    }
    k << ";";
  }
  return k.str();
}
}  // namespace

Result<int> eliminate_common_subexpressions(ir::Graph& g) {
  std::map<std::string, int> seen;
  std::set<int> dup;
  ir::UseIndex uses(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    std::string key = node_key(g.nodes[i]);
    if (key.empty()) continue;
    auto [it, inserted] = seen.emplace(key, static_cast<int>(i));
    if (inserted) continue;
    const ir::Node& first = g.nodes[static_cast<size_t>(it->second)];
    ir::Node& again = g.nodes[i];
    bool blocked = false;  // a graph output, or an output `first` does not produce
    for (size_t o = 0; o < again.outputs.size(); ++o)
      blocked |= uses.is_graph_output(again.outputs[o]) || (!again.outputs[o].empty() && first.outputs[o].empty());
    if (blocked) continue;
    for (size_t o = 0; o < again.outputs.size(); ++o)
      if (!again.outputs[o].empty()) ir::replace_uses(g, again.outputs[o], first.outputs[o]);
    dup.insert(static_cast<int>(i));
  }
  ir::remove_nodes(g, dup);
  return static_cast<int>(dup.size());
}

}  // namespace kiln::passes
