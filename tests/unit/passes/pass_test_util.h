// Helpers for the fusion pass tests: run one pass on a copy of a model the way optimize() does
// (then re-sort and re-infer), count kiln-domain nodes, read attributes.
#pragma once

#include <gtest/gtest.h>

#include <stdexcept>

#include "../graph_builder.h"
#include "ir/rewrite.h"
#include "passes/pass.h"

namespace kiln::testing {

// Applies `pass` to a copy of `before`; `changed` receives its result.
inline ir::Model apply_pass(const ir::Model& before, passes::PassFn pass, int* changed) {
  ir::Model after = clone(before);
  auto r = pass(*after.graph);
  if (!r.ok()) throw std::runtime_error(r.status().to_string());
  *changed = r.value();
  std::unordered_map<std::string, ir::TypeInfo> keep;
  for (const auto& in : after.graph->inputs) keep[in.name] = in.type;
  after.graph->value_types = std::move(keep);
  Status s = after.graph->topological_sort();
  if (s.ok()) s = ops::infer_shapes(*after.graph);
  if (!s.ok()) throw std::runtime_error("after the pass: " + s.to_string());
  return after;
}

inline int count_kiln(const ir::Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes) n += node.domain == "kiln" && node.op_type == op;
  return n;
}

inline const ir::Node* find_op(const ir::Graph& g, const std::string& op) {
  for (const auto& node : g.nodes)
    if (node.op_type == op) return &node;
  return nullptr;
}

inline ir::Node& kiln_op(GraphBuilder& b, const std::string& op, std::vector<std::string> in,
                         std::vector<std::string> out) {
  ir::Node& n = b.node(op, std::move(in), std::move(out));
  n.domain = "kiln";
  n.opset = 1;
  return n;
}

inline Tensor scalar_f(float v) { return Tensor::scalar<float>(DataType::kFloat32, v); }
inline Tensor i64s(std::vector<int64_t> v) {
  return Tensor::from_vector<int64_t>(DataType::kInt64, {static_cast<int64_t>(v.size())}, v);
}

}  // namespace kiln::testing
