// fuse_matmul_bias: MatMul + constant last-dim bias becomes kiln.FusedMatMul.
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

TEST(FuseMatMulBias, FusesLastDimBiasEitherOrder) {
  GraphBuilder b(13);
  b.input("x", {2, 3, 4}).output("y").output("z");
  b.init("w", random_tensor({4, 5}, 1)).init("bias", random_tensor({5}, 2));
  b.init("w2", random_tensor({4, 6}, 3)).init("bias2", random_tensor({1, 1, 6}, 4));
  b.node("MatMul", {"x", "w"}, {"m"});
  b.node("Add", {"m", "bias"}, {"y"});
  b.node("MatMul", {"x", "w2"}, {"m2"});
  b.node("Add", {"bias2", "m2"}, {"z"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_matmul_bias, &changed);
  EXPECT_EQ(changed, 2);
  EXPECT_EQ(count_kiln(*after.graph, "FusedMatMul"), 2);
  EXPECT_EQ(after.graph->nodes.size(), 2u);
  for (const auto& n : after.graph->nodes) {
    ASSERT_EQ(n.inputs.size(), 3u);
    EXPECT_EQ(after.graph->initializers.at(n.inputs[2]).rank(), 1);  // stored as [N]
  }
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(FuseMatMulBias, LeavesOtherAddsAlone) {
  GraphBuilder b(13);
  b.input("x", {3, 4}).input("r", {3, 5}).output("y1").output("y2").output("y3").output("m3");
  b.init("w", random_tensor({4, 5}, 1)).init("rowbias", random_tensor({3, 1}, 2)).init("bias", random_tensor({5}, 3));
  b.node("MatMul", {"x", "w"}, {"m1"});
  b.node("Add", {"m1", "rowbias"}, {"y1"});  // varies along rows, not the last dim
  b.node("MatMul", {"x", "w"}, {"m2"});
  b.node("Add", {"m2", "r"}, {"y2"});  // not a constant
  b.node("MatMul", {"x", "w"}, {"m3"});
  b.node("Add", {"m3", "bias"}, {"y3"});  // the product is an output too
  ir::Model m = b.finish();
  EXPECT_EQ(passes::fuse_matmul_bias(*m.graph).value(), 0);
  EXPECT_EQ(m.graph->nodes.size(), 6u);
}

}  // namespace
}  // namespace kiln
