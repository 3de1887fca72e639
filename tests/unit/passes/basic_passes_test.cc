// Before/after tests for the cleanup passes: structure changes as intended, numbers do not.
#include <gtest/gtest.h>

#include <set>

#include "../graph_builder.h"
#include "passes/pass.h"

namespace kiln {
namespace {

using testing::clone;
using testing::count_op;
using testing::GraphBuilder;
using testing::max_abs_diff;
using testing::random_tensor;

Tensor i64(std::vector<int64_t> v) {
  return Tensor::from_vector<int64_t>(DataType::kInt64, {static_cast<int64_t>(v.size())}, v);
}

TEST(FoldConstants, FoldsAShapeSubgraphFeedingReshape) {
  // Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])) == Reshape(x, [2, -1]) for static x.
  GraphBuilder b;
  b.input("x", {2, 3, 4}).output("y").init("zero", Tensor::scalar<int64_t>(DataType::kInt64, 0)).init("axes", i64({0}));
  b.init("minus1", i64({-1}));
  b.node("Shape", {"x"}, {"s"});
  b.node("Gather", {"s", "zero"}, {"d0"});
  b.node("Unsqueeze", {"d0", "axes"}, {"d0v"});
  auto& c = b.node("Concat", {"d0v", "minus1"}, {"shape"});
  GraphBuilder::set_int(c, "axis", 0);
  b.node("Reshape", {"x", "shape"}, {"y"});
  ir::Model before = b.finish();
  ir::Model after = clone(before);
  auto changed = passes::fold_constants(*after.graph);
  ASSERT_TRUE(changed.ok()) << changed.status().to_string();
  EXPECT_EQ(changed.value(), 4);
  ASSERT_EQ(after.graph->nodes.size(), 1u);
  EXPECT_EQ(after.graph->nodes[0].op_type, "Reshape");
  EXPECT_EQ(after.graph->initializers.at("shape").get_i64(0), 2);
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(RemoveDeadNodes, DropsUnreadNodesAndInitializers) {
  GraphBuilder b;
  b.input("x", {4}).output("y").init("unused_w", random_tensor({4}, 1));
  b.node("Relu", {"x"}, {"y"});
  b.node("Sigmoid", {"x"}, {"dead1"});
  b.node("Tanh", {"dead1"}, {"dead2"});
  ir::Model m = b.finish();
  auto r = passes::remove_dead_nodes(*m.graph);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), 3);  // two nodes, one initializer
  EXPECT_EQ(m.graph->nodes.size(), 1u);
  EXPECT_TRUE(m.graph->initializers.empty());
}

TEST(EliminateCommonSubexpressions, MergesIdenticalNodes) {
  GraphBuilder b;
  b.input("x", {3, 5}).output("y");
  b.node("Relu", {"x"}, {"a"});
  b.node("Relu", {"x"}, {"b"});
  GraphBuilder::set_int(b.node("Softmax", {"a"}, {"sa"}), "axis", 1);
  GraphBuilder::set_int(b.node("Softmax", {"b"}, {"sb"}), "axis", 1);
  b.node("Add", {"sa", "sb"}, {"y"});
  ir::Model before = b.finish();
  ir::Model after = clone(before);
  auto r = passes::eliminate_common_subexpressions(*after.graph);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), 2);  // the second Relu, then the second Softmax
  EXPECT_EQ(count_op(*after.graph, "Relu"), 1);
  EXPECT_EQ(count_op(*after.graph, "Softmax"), 1);
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(EliminateCommonSubexpressions, KeepsNodesWithDifferentAttributes) {
  GraphBuilder b;
  b.input("x", {3, 5}).output("y");
  // Each node's attribute is set before the next node is added: node() returns a reference into
  // the graph's node vector, which the next node() may reallocate.
  GraphBuilder::set_int(b.node("Softmax", {"x"}, {"a"}), "axis", 0);
  GraphBuilder::set_int(b.node("Softmax", {"x"}, {"b"}), "axis", 1);
  b.node("Add", {"a", "b"}, {"y"});
  ir::Model m = b.finish();
  std::multiset<int64_t> axes;
  for (const auto& n : m.graph->nodes)
    if (n.op_type == "Softmax") axes.insert(n.attr_int("axis", -1));
  ASSERT_EQ(axes, (std::multiset<int64_t>{0, 1}));
  EXPECT_EQ(passes::eliminate_common_subexpressions(*m.graph).value(), 0);
}

TEST(RemoveNoopOps, RemovesIdentityDropoutCastAndTransposePairs) {
  GraphBuilder b;
  b.input("x", {2, 3, 4}).output("y").init("shape1", i64({6, 4})).init("shape2", i64({4, 6}));
  b.node("Identity", {"x"}, {"i"});
  b.node("Dropout", {"i"}, {"d"});
  auto& cast = b.node("Cast", {"d"}, {"c"});
  GraphBuilder::set_int(cast, "to", 1);
  auto& t1 = b.node("Transpose", {"c"}, {"t1"});
  GraphBuilder::set_ints(t1, "perm", {1, 2, 0});
  auto& t2 = b.node("Transpose", {"t1"}, {"t2"});
  GraphBuilder::set_ints(t2, "perm", {2, 0, 1});  // composes to the identity
  b.node("Reshape", {"t2", "shape1"}, {"r1"});
  b.node("Reshape", {"r1", "shape2"}, {"r2"});
  b.node("Relu", {"r2"}, {"y"});
  ir::Model before = b.finish();
  ir::Model after = clone(before);
  auto r = passes::remove_noop_ops(*after.graph);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_GE(r.value(), 5);
  EXPECT_EQ(count_op(*after.graph, "Identity"), 0);
  EXPECT_EQ(count_op(*after.graph, "Dropout"), 0);
  EXPECT_EQ(count_op(*after.graph, "Cast"), 0);
  EXPECT_EQ(count_op(*after.graph, "Transpose"), 0);
  EXPECT_EQ(count_op(*after.graph, "Reshape"), 1);
  ASSERT_TRUE(after.graph->topological_sort().ok());
  ASSERT_TRUE(ops::infer_shapes(*after.graph).ok());
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(RemoveNoopOps, KeepsAnIdentityBetweenGraphInputAndOutput) {
  GraphBuilder b;
  b.input("x", {3}).output("y");
  b.node("Identity", {"x"}, {"y"});
  ir::Model m = b.finish();
  EXPECT_EQ(passes::remove_noop_ops(*m.graph).value(), 0);
  EXPECT_EQ(m.graph->nodes.size(), 1u);
}

ir::Node& add_bn(GraphBuilder& b, const std::string& x, const std::string& y, int64_t c, uint64_t seed) {
  b.init(y + "_gamma", random_tensor({c}, seed, DataType::kFloat32, 0.5, 1.5));
  b.init(y + "_beta", random_tensor({c}, seed + 1));
  b.init(y + "_mean", random_tensor({c}, seed + 2));
  b.init(y + "_var", random_tensor({c}, seed + 3, DataType::kFloat32, 0.5, 2.0));
  auto& bn = b.node("BatchNormalization", {x, y + "_gamma", y + "_beta", y + "_mean", y + "_var"}, {y});
  GraphBuilder::set_float(bn, "epsilon", 1e-3f);
  return bn;
}

TEST(FoldBatchNorm, FoldsIntoConvWeightsAndBias) {
  GraphBuilder b;
  b.input("x", {1, 3, 9, 7}).output("y").init("w", random_tensor({5, 3, 3, 3}, 3)).init("bias", random_tensor({5}, 4));
  auto& conv = b.node("Conv", {"x", "w", "bias"}, {"c"});
  GraphBuilder::set_ints(conv, "pads", {1, 1, 1, 1});
  add_bn(b, "c", "bn", 5, 10);
  b.node("Relu", {"bn"}, {"y"});
  ir::Model before = b.finish();
  ir::Model after = clone(before);
  auto r = passes::fold_batch_norm(*after.graph);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value(), 1);
  EXPECT_EQ(count_op(*after.graph, "BatchNormalization"), 0);
  EXPECT_EQ(count_op(*after.graph, "Conv"), 1);
  ASSERT_TRUE(after.graph->topological_sort().ok());
  EXPECT_LT(max_abs_diff(before, after), 1e-5);
}

TEST(FoldBatchNorm, FoldsIntoGemmAndLowersStandaloneToMulAdd) {
  GraphBuilder b;
  b.input("x", {4, 6}).input("z", {2, 5, 3, 3}).output("y").output("y2").init("w", random_tensor({5, 6}, 5));
  auto& gemm = b.node("Gemm", {"x", "w"}, {"g"});
  GraphBuilder::set_int(gemm, "transB", 1);
  add_bn(b, "g", "y", 5, 20);
  add_bn(b, "z", "y2", 5, 30);  // after a graph input: standalone
  ir::Model before = b.finish();
  ir::Model after = clone(before);
  auto r = passes::fold_batch_norm(*after.graph);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value(), 2);
  EXPECT_EQ(count_op(*after.graph, "BatchNormalization"), 0);
  EXPECT_EQ(count_op(*after.graph, "Mul"), 1);
  EXPECT_EQ(count_op(*after.graph, "Add"), 1);
  ASSERT_TRUE(after.graph->topological_sort().ok());
  EXPECT_LT(max_abs_diff(before, after), 1e-5);
}

TEST(Pipeline, RejectsUnknownPassNames) {
  GraphBuilder b;
  b.input("x", {3}).output("y");
  b.node("Relu", {"x"}, {"y"});
  ir::Model m = b.finish();
  auto r = passes::optimize(m, {"no_such_pass"}, Target{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("fold_constants"), std::string::npos);
}

}  // namespace
}  // namespace kiln
