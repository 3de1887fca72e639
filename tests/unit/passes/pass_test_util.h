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

// A small resnet (the layout passes' tests): image conv (3 channels) -> relu -> maxpool -> 3x3 conv -> relu -> 1x1 conv
// + identity -> relu -> global average pool -> flatten -> gemm, with the fusions applied.
inline ir::Model small_resnet(int64_t c = 20) {
  GraphBuilder b(13);
  b.input("x", {2, 3, 15, 13}).output("logits");
  b.init("w0", random_tensor({c, 3, 3, 3}, 1)).init("b0", random_tensor({c}, 2));
  b.init("w1", random_tensor({c, c, 3, 3}, 3)).init("w2", random_tensor({c, c, 1, 1}, 4));
  b.init("fc", random_tensor({5, c}, 5));
  auto& c0 = b.node("Conv", {"x", "w0", "b0"}, {"c0"});
  GraphBuilder::set_ints(c0, "pads", {1, 1, 1, 1});
  GraphBuilder::set_ints(c0, "strides", {2, 2});
  b.node("Relu", {"c0"}, {"r0"});
  auto& mp = b.node("MaxPool", {"r0"}, {"p0"});
  GraphBuilder::set_ints(mp, "kernel_shape", {3, 3});
  GraphBuilder::set_ints(mp, "pads", {1, 1, 1, 1});
  GraphBuilder::set_ints(b.node("Conv", {"p0", "w1"}, {"c1"}), "pads", {1, 1, 1, 1});
  b.node("Relu", {"c1"}, {"r1"});
  GraphBuilder::set_ints(b.node("Conv", {"r1", "w2"}, {"c2"}), "pads", {0, 0, 0, 0});
  b.node("Add", {"c2", "p0"}, {"s2"});
  b.node("Relu", {"s2"}, {"r2"});
  b.node("GlobalAveragePool", {"r2"}, {"g"});
  b.node("Flatten", {"g"}, {"f"});
  auto& gemm = b.node("Gemm", {"f", "fc"}, {"logits"});
  GraphBuilder::set_int(gemm, "transB", 1);
  ir::Model m = b.finish();
  int changed = 0;
  return apply_pass(m, passes::fuse_activation, &changed);
}

}  // namespace kiln::testing
