// fuse_attention: MatMul(Q, K^T) -> scale -> mask -> Softmax -> MatMul(V) becomes kiln.Attention.
#include "engine/target.h"
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

// For a CUDA target, fuse_attention_for fuses only what the CUDA tactic takes: Q, K and V each with
// the output's batch dims or all ones. K/V heads shared by a group of query heads ([2, 1, 7, 8]
// against [2, 3, 5, 8]) stay plain ops there (their CUDA kernels run them), fused for the CPU.
TEST(FuseAttention, ForCudaOnlyWhatTheCudaTacticTakes) {
  auto model = [](Dims k, Dims v) {
    GraphBuilder b(13);
    b.input("q", {2, 3, 5, 8}).input("k", k).input("v", v).input("mask", {2, 1, 1, 7}).output("y");
    const size_t r = k.size();
    std::vector<int64_t> perm(r);
    for (size_t i = 0; i < r; ++i) perm[i] = static_cast<int64_t>(i);
    std::swap(perm[r - 1], perm[r - 2]);
    GraphBuilder::set_ints(b.node("Transpose", {"k"}, {"kt"}), "perm", perm);
    b.node("MatMul", {"q", "kt"}, {"s"});
    b.node("Add", {"s", "mask"}, {"sm"});
    b.node("Softmax", {"sm"}, {"p"});
    b.node("MatMul", {"p", "v"}, {"y"});
    return b.finish();
  };
  Target cpu = engine::host_target(), cuda = cpu;
  cuda.device = {DeviceKind::kCUDA, 0};
  {
    ir::Model m = model({2, 1, 7, 8}, {2, 1, 7, 4});  // grouped K/V heads: partial broadcasting
    ir::Model c = clone(m);
    EXPECT_EQ(passes::fuse_attention_for(*m.graph, cuda).value(), 0);
    EXPECT_EQ(passes::fuse_attention_for(*c.graph, cpu).value(), 1);
  }
  {
    ir::Model m = model({2, 3, 7, 8}, {2, 3, 7, 4});
    EXPECT_EQ(passes::fuse_attention_for(*m.graph, cuda).value(), 1);
  }
  {
    ir::Model m = model({7, 8}, {7, 4});  // one K/V for every problem: a batch stride of 0
    EXPECT_EQ(passes::fuse_attention_for(*m.graph, cuda).value(), 1);
  }
}

// ---- fuse_attention_heads ----

constexpr int64_t kB = 2, kS = 5, kH = 2, kD = 4, kE = kH * kD;

// X [B, S, E] -> Reshape [B, S, H, D] (shape from `shape`) -> Transpose(perm) -> y.
void split_heads(GraphBuilder& b, const std::string& x, const std::string& shape, const std::string& y,
                 std::vector<int64_t> perm) {
  b.node("Reshape", {x, shape}, {y + "_r"});
  GraphBuilder::set_ints(b.node("Transpose", {y + "_r"}, {y}), "perm", std::move(perm));
}

// kiln.Attention(qh, kt, vh, mask) -> Transpose -> Reshape [B, S, E] -> y.
void attention_and_merge(GraphBuilder& b, const std::string& merge_shape) {
  ir::Node& a = kiln_op(b, "Attention", {"qh", "kt", "vh", "mask"}, {"ctx"});
  GraphBuilder::set_int(a, "k_transposed", 1);
  GraphBuilder::set_float(a, "scale", 0.5f);
  GraphBuilder::set_ints(b.node("Transpose", {"ctx"}, {"ctx_t"}), "perm", {0, 2, 1, 3});
  b.node("Reshape", {"ctx_t", merge_shape}, {"y"});
}

TEST(FuseAttentionHeads, PackedQkvWithExportedShapeComputations) {
  // As torch exports a merged QKV projection after fuse_horizontal_matmul: the head shapes are
  // computed from Shape(q) and Shape(ctx), which read values the fusion removes.
  GraphBuilder b(13);
  b.input("qkv", {kB, kS, 3 * kE}).input("mask", {kB, 1, 1, kS}).output("y");
  b.init("sizes", i64s({kE, kE, kE})).init("zero", i64s({0})).init("i0", Tensor::scalar<int64_t>(DataType::kInt64, 0));
  b.init("tail", i64s({kS, kH, kD})).init("merge_tail", i64s({kS, kE}));
  GraphBuilder::set_int(b.node("Split", {"qkv", "sizes"}, {"q", "k", "v"}), "axis", -1);
  b.node("Shape", {"q"}, {"q_shape"});
  b.node("Gather", {"q_shape", "i0"}, {"batch"});
  b.node("Unsqueeze", {"batch", "zero"}, {"batch1"});
  GraphBuilder::set_int(b.node("Concat", {"batch1", "tail"}, {"heads_shape"}), "axis", 0);
  split_heads(b, "q", "heads_shape", "qh", {0, 2, 1, 3});
  split_heads(b, "k", "heads_shape", "kt", {0, 2, 3, 1});
  split_heads(b, "v", "heads_shape", "vh", {0, 2, 1, 3});
  b.node("Shape", {"ctx"}, {"ctx_shape"});
  b.node("Gather", {"ctx_shape", "i0"}, {"batch_c"});
  b.node("Unsqueeze", {"batch_c", "zero"}, {"batch_c1"});
  GraphBuilder::set_int(b.node("Concat", {"batch_c1", "merge_tail"}, {"merge_shape"}), "axis", 0);
  attention_and_merge(b, "merge_shape");
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_attention_heads, &changed);
  EXPECT_EQ(changed, 1);
  const ir::Node* m = find_op(*after.graph, "MultiHeadAttention");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->inputs, (std::vector<std::string>{"qkv", "", "", "mask"}));
  EXPECT_EQ(m->attr_int("num_heads", 0), kH);
  EXPECT_FLOAT_EQ(m->attr_float("scale", 0), 0.5f);
  EXPECT_EQ(count_op(*after.graph, "Split"), 0);
  EXPECT_EQ(count_op(*after.graph, "Transpose"), 0);
  EXPECT_EQ(count_op(*after.graph, "Reshape"), 0);
  for (const auto& n : after.graph->nodes)  // the Shape nodes now read kept values
    if (n.op_type == "Shape") {
      EXPECT_TRUE(n.inputs[0] == "qkv" || n.inputs[0] == "y") << n.inputs[0];
    }
  EXPECT_LT(max_abs_diff(before, after), 1e-6);
}

TEST(FuseAttentionHeads, SeparateProjections) {
  GraphBuilder b(13);
  b.input("q", {kB, kS, kE}).input("k", {kB, 7, kE}).input("v", {kB, 7, kE}).input("mask", {kS, 7}).output("y");
  b.init("heads_q", i64s({kB, kS, kH, kD})).init("heads_kv", i64s({kB, 7, kH, kD})).init("merge", i64s({kB, kS, kE}));
  split_heads(b, "q", "heads_q", "qh", {0, 2, 1, 3});
  split_heads(b, "k", "heads_kv", "kt", {0, 2, 3, 1});
  split_heads(b, "v", "heads_kv", "vh", {0, 2, 1, 3});
  attention_and_merge(b, "merge");
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_attention_heads, &changed);
  EXPECT_EQ(changed, 1);
  ASSERT_EQ(after.graph->nodes.size(), 1u);
  EXPECT_EQ(after.graph->nodes[0].inputs, (std::vector<std::string>{"q", "k", "v", "mask"}));
  EXPECT_LT(max_abs_diff(before, after), 1e-6);
}

TEST(FuseAttentionHeads, KeepsASplitReadElsewhereAndLeavesOtherLayoutsAlone) {
  {  // k is also read by an Add: the Split stays, the op reads the three parts
    GraphBuilder b(13);
    b.input("qkv", {kB, kS, 3 * kE}).input("mask", {kB, 1, 1, kS}).output("y").output("k2");
    b.init("sizes", i64s({kE, kE, kE})).init("heads", i64s({kB, kS, kH, kD})).init("merge", i64s({kB, kS, kE}));
    GraphBuilder::set_int(b.node("Split", {"qkv", "sizes"}, {"q", "k", "v"}), "axis", 2);
    b.node("Add", {"k", "k"}, {"k2"});
    split_heads(b, "q", "heads", "qh", {0, 2, 1, 3});
    split_heads(b, "k", "heads", "kt", {0, 2, 3, 1});
    split_heads(b, "v", "heads", "vh", {0, 2, 1, 3});
    attention_and_merge(b, "merge");
    ir::Model before = b.finish();
    int changed = 0;
    ir::Model after = apply_pass(before, passes::fuse_attention_heads, &changed);
    EXPECT_EQ(changed, 1);
    EXPECT_EQ(count_op(*after.graph, "Split"), 1);
    EXPECT_EQ(find_op(*after.graph, "MultiHeadAttention")->inputs, (std::vector<std::string>{"q", "k", "v", "mask"}));
    EXPECT_LT(max_abs_diff(before, after), 1e-6);
  }
  {  // torch.nn.MultiheadAttention's sequence-first heads ([S, B*H, D], rank 3): not this pattern
    GraphBuilder b(13);
    b.input("q", {kS, kB, kE}).input("k", {kS, kB, kE}).input("v", {kS, kB, kE}).input("mask", {kS, kS}).output("y");
    b.init("heads", i64s({kS, kB * kH, kD})).init("merge", i64s({kS, kB, kE}));
    split_heads(b, "q", "heads", "qh", {1, 0, 2});
    split_heads(b, "k", "heads", "kt", {1, 2, 0});
    split_heads(b, "v", "heads", "vh", {1, 0, 2});
    ir::Node& a = kiln_op(b, "Attention", {"qh", "kt", "vh", "mask"}, {"ctx"});
    GraphBuilder::set_int(a, "k_transposed", 1);
    GraphBuilder::set_ints(b.node("Transpose", {"ctx"}, {"ctx_t"}), "perm", {1, 0, 2});
    b.node("Reshape", {"ctx_t", "merge"}, {"y"});
    ir::Model m = b.finish();
    EXPECT_EQ(passes::fuse_attention_heads(*m.graph).value(), 0);
  }
  {  // the context is merged with another head order
    GraphBuilder b(13);
    b.input("q", {kB, kS, kE}).input("k", {kB, kS, kE}).input("v", {kB, kS, kE}).input("mask", {kS, kS}).output("y");
    b.init("heads", i64s({kB, kS, kH, kD})).init("merge", i64s({kB, kS, kE}));
    split_heads(b, "q", "heads", "qh", {0, 2, 1, 3});
    split_heads(b, "k", "heads", "kt", {0, 2, 3, 1});
    split_heads(b, "v", "heads", "vh", {0, 2, 1, 3});
    ir::Node& a = kiln_op(b, "Attention", {"qh", "kt", "vh", "mask"}, {"ctx"});
    GraphBuilder::set_int(a, "k_transposed", 1);
    GraphBuilder::set_ints(b.node("Transpose", {"ctx"}, {"ctx_t"}), "perm", {0, 2, 3, 1});
    b.node("Reshape", {"ctx_t", "merge"}, {"y"});
    ir::Model m = b.finish();
    EXPECT_EQ(passes::fuse_attention_heads(*m.graph).value(), 0);
  }
}

}  // namespace
}  // namespace kiln
