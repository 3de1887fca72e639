// Helpers for passes: who produces and who consumes each value, constants, renaming, removal.
#pragma once

#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

// Producer and consumers of every value of one graph (subgraph reads count as uses by the node
// that owns the subgraph). Rebuild after mutating the graph.
class UseIndex {
 public:
  explicit UseIndex(const Graph& g);
  // Index of the node producing `value`, or -1 (graph input, initializer, outer value).
  int producer(const std::string& value) const;
  // Node indices reading `value` (a node reading it twice appears twice).
  const std::vector<int>& consumers(const std::string& value) const;
  bool is_graph_output(const std::string& value) const { return outputs_.count(value) > 0; }
  // Read by exactly one node and not a graph output: safe to fold into that node.
  bool single_use(const std::string& value) const;

 private:
  std::unordered_map<std::string, int> producer_;
  std::unordered_map<std::string, std::vector<int>> consumers_;
  std::set<std::string> outputs_;
};

// The value of an initializer that is not also a graph input (inputs can override initializers).
const Tensor* constant_value(const Graph& g, const std::string& name);
// The constant behind an outer value that `body` reads by name: an initializer of the innermost
// enclosing graph defining it, unless that graph also takes it as an input (a caller may override
// it); nullptr otherwise.
const Tensor* outer_constant(const Graph& body, const std::string& name);
bool is_constant(const Graph& g, const std::string& name);
// A scalar (or one-element) float constant.
bool constant_scalar(const Graph& g, const std::string& name, double* out);

// Replaces every read of `from` by `to` in nodes (and in subgraphs' outer reads). Graph outputs
// are not renamed: callers keep output names stable by renaming producers instead.
void replace_uses(Graph& g, const std::string& from, const std::string& to);
// Removes the nodes at the given indices (order of the rest kept).
void remove_nodes(Graph& g, const std::set<int>& indices);
// A value or node name not used anywhere in the graph: base, base_1, base_2, ...
std::string unique_name(const Graph& g, const std::string& base);

}  // namespace kiln::ir

namespace kiln::ir {
// Provenance: the ONNX nodes a (fused) node stands for, kept in the "kiln.sources" attribute.
std::vector<std::string> sources_of(const Node& n);
void add_sources(Node& into, const Node& from);
}  // namespace kiln::ir
