// fuse_horizontal_matmul: Q/K/V-style sibling projections become one MatMul + Split.
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

TEST(FuseHorizontalMatMul, MergesQkvProjectionsWithBiases) {
  GraphBuilder b(13);
  b.input("x", {2, 5, 8}).output("q").output("k").output("v");
  const char* names[] = {"q", "k", "v"};
  int64_t widths[] = {4, 4, 6};
  for (int i = 0; i < 3; ++i) {
    std::string n = names[i];
    b.init("w" + n, random_tensor({8, widths[i]}, 10 + i)).init("b" + n, random_tensor({widths[i]}, 20 + i));
    b.node("MatMul", {"x", "w" + n}, {"m" + n});
    b.node("Add", {"m" + n, "b" + n}, {n});
  }
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model fused = apply_pass(before, passes::fuse_matmul_bias, &changed);
  EXPECT_EQ(changed, 3);
  ir::Model after = apply_pass(fused, passes::fuse_horizontal_matmul, &changed);
  EXPECT_EQ(changed, 1);
  ASSERT_EQ(after.graph->nodes.size(), 2u);
  EXPECT_EQ(count_kiln(*after.graph, "FusedMatMul"), 1);
  EXPECT_EQ(count_op(*after.graph, "Split"), 1);
  const ir::Node* mm = find_op(*after.graph, "FusedMatMul");
  EXPECT_EQ(after.graph->initializers.at(mm->inputs[1]).shape(), (Dims{8, 14}));
  EXPECT_EQ(after.graph->initializers.at(mm->inputs[2]).shape(), (Dims{14}));
  EXPECT_EQ(ir::sources_of(*mm).size(), 6u);
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(FuseHorizontalMatMul, PlainMatMulsAtOldOpsetUseSplitAttribute) {
  GraphBuilder b(11);
  b.input("x", {3, 8}).output("a").output("c");
  b.init("w1", random_tensor({8, 2}, 1)).init("w2", random_tensor({8, 3}, 2));
  b.node("MatMul", {"x", "w1"}, {"a"});
  b.node("MatMul", {"x", "w2"}, {"c"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_horizontal_matmul, &changed);
  EXPECT_EQ(changed, 1);
  const ir::Node* split = find_op(*after.graph, "Split");
  ASSERT_NE(split, nullptr);
  EXPECT_EQ(split->attr_ints("split"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(FuseHorizontalMatMul, LeavesNonConstantWeightsAndDifferentActivationsAlone) {
  GraphBuilder b(13);
  b.input("x", {3, 8}).input("wdyn", {8, 4}).output("a").output("c").output("d");
  b.init("w1", random_tensor({8, 2}, 1)).init("w2", random_tensor({8, 3}, 2));
  b.node("MatMul", {"x", "wdyn"}, {"a"});  // weight is an input
  kiln_op(b, "FusedMatMul", {"x", "w1"}, {"c"});
  ir::Node& relu = kiln_op(b, "FusedMatMul", {"x", "w2"}, {"d"});
  ir::Attribute act;
  act.type = ir::Attribute::Type::kString;
  act.s = "Relu";
  relu.attrs["activation"] = act;
  ir::Model m = b.finish();
  EXPECT_EQ(passes::fuse_horizontal_matmul(*m.graph).value(), 0);
  EXPECT_EQ(m.graph->nodes.size(), 3u);
}

}  // namespace
}  // namespace kiln
