// fuse_attention: MatMul(Q, K^T) -> scale -> mask -> Softmax -> MatMul(V) becomes kiln.Attention.
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

TEST(FuseAttention, ScaledMaskedWithTransposedK) {
  GraphBuilder b(13);
  b.input("q", {2, 3, 5, 8}).input("k", {2, 3, 7, 8}).input("v", {2, 3, 7, 4}).input("mask", {2, 1, 1, 7});
  b.output("y").init("sqrt_d", scalar_f(2.0f));  // Div by 2 == Mul by 0.5 exactly
  GraphBuilder::set_ints(b.node("Transpose", {"k"}, {"kt"}), "perm", {0, 1, 3, 2});
  b.node("MatMul", {"q", "kt"}, {"s"});
  b.node("Div", {"s", "sqrt_d"}, {"ss"});
  b.node("Add", {"ss", "mask"}, {"sm"});
  GraphBuilder::set_int(b.node("Softmax", {"sm"}, {"p"}), "axis", -1);
  b.node("MatMul", {"p", "v"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_attention, &changed);
  EXPECT_EQ(changed, 1);
  ASSERT_EQ(after.graph->nodes.size(), 1u);
  const ir::Node& a = after.graph->nodes[0];
  EXPECT_EQ(a.domain, "kiln");
  EXPECT_EQ(a.op_type, "Attention");
  EXPECT_EQ(a.inputs, (std::vector<std::string>{"q", "k", "v", "mask"}));
  EXPECT_EQ(a.attr_int("k_transposed", -1), 0);
  EXPECT_FLOAT_EQ(a.attr_float("scale", 0), 0.5f);
  EXPECT_EQ(ir::sources_of(a).size(), 6u);
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(FuseAttention, PreTransposedKMaskFirstAndScaledQ) {
  // Torch-style heads: K arrives as [B, S, H, D] and one Transpose makes [B, H, D, S]; the scale
  // is applied to Q first (torch.nn.MultiheadAttention); the mask is the Add's first operand.
  GraphBuilder b(13);
  b.input("q", {2, 3, 5, 8}).input("k", {2, 7, 3, 8}).input("v", {2, 3, 7, 4}).input("mask", {7});
  b.output("y").init("c", scalar_f(0.35355339f));
  GraphBuilder::set_ints(b.node("Transpose", {"k"}, {"kt"}), "perm", {0, 2, 3, 1});
  b.node("Mul", {"q", "c"}, {"qs"});
  b.node("MatMul", {"qs", "kt"}, {"s"});
  b.node("Add", {"mask", "s"}, {"sm"});
  b.node("Softmax", {"sm"}, {"p"});
  b.node("MatMul", {"p", "v"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_attention, &changed);
  EXPECT_EQ(changed, 1);
  ASSERT_EQ(count_kiln(*after.graph, "Attention"), 1);
  EXPECT_EQ(after.graph->nodes.size(), 2u);  // the Transpose stays: it is not a last-two swap
  const ir::Node* a = find_op(*after.graph, "Attention");
  EXPECT_EQ(a->inputs, (std::vector<std::string>{"q", "kt", "v", "mask"}));
  EXPECT_EQ(a->attr_int("k_transposed", -1), 1);
  EXPECT_NEAR(a->attr_float("scale", 0), 0.35355339f, 1e-7);
  EXPECT_LT(max_abs_diff(before, after), 1e-5);
}

TEST(FuseAttention, NoScaleNoMask) {
  GraphBuilder b(13);
  b.input("q", {4, 6}).input("kt", {6, 9}).input("v", {9, 3}).output("y");
  b.node("MatMul", {"q", "kt"}, {"s"});
  b.node("Softmax", {"s"}, {"p"});
  b.node("MatMul", {"p", "v"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_attention, &changed);
  EXPECT_EQ(changed, 1);
  EXPECT_EQ(after.graph->nodes.size(), 1u);
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(FuseAttention, LeavesOtherAxesAndReusedProbabilitiesAlone) {
  {  // Softmax over axis 1 of [4, 6, 6]
    GraphBuilder b(13);
    b.input("q", {4, 6, 5}).input("kt", {4, 5, 6}).input("v", {4, 6, 3}).output("y");
    b.node("MatMul", {"q", "kt"}, {"s"});
    GraphBuilder::set_int(b.node("Softmax", {"s"}, {"p"}), "axis", 1);
    b.node("MatMul", {"p", "v"}, {"y"});
    ir::Model m = b.finish();
    EXPECT_EQ(passes::fuse_attention(*m.graph).value(), 0);
  }
  {  // the attention weights are an output too
    GraphBuilder b(13);
    b.input("q", {4, 6}).input("kt", {6, 9}).input("v", {9, 3}).output("y").output("p");
    b.node("MatMul", {"q", "kt"}, {"s"});
    b.node("Softmax", {"s"}, {"p"});
    b.node("MatMul", {"p", "v"}, {"y"});
    ir::Model m = b.finish();
    EXPECT_EQ(passes::fuse_attention(*m.graph).value(), 0);
  }
  {  // a mask broadcasting the scores up ([6,9] + [2,6,9])
    GraphBuilder b(13);
    b.input("q", {6, 4}).input("kt", {4, 9}).input("v", {9, 3}).input("mask", {2, 6, 9}).output("y");
    b.node("MatMul", {"q", "kt"}, {"s"});
    b.node("Add", {"s", "mask"}, {"sm"});
    b.node("Softmax", {"sm"}, {"p"});
    b.node("MatMul", {"p", "v"}, {"y"});
    ir::Model m = b.finish();
    EXPECT_EQ(passes::fuse_attention(*m.graph).value(), 0);
  }
}

}  // namespace
}  // namespace kiln
