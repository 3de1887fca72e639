// fold_pad_into_window, prune_padding_taps, and the remove_noop_ops cases exports brought in (a
// Dropout of ratio 0 in training mode, an all-zero Pad): each rewrite is checked structurally and
// numerically (before/after on random inputs).
#include <gtest/gtest.h>

#include "engine/profiles.h"
#include "pass_test_util.h"

namespace kiln {
namespace {

using testing::apply_pass;
using testing::count_op;
using testing::find_op;
using testing::GraphBuilder;
using testing::i64s;
using testing::max_abs_diff;
using testing::random_tensor;

TEST(RemoveNoopOps, DropoutOfRatioZeroInTrainingModeIsAnIdentity) {
  GraphBuilder b;
  b.input("x", {2, 5}).output("y");
  b.init("ratio", testing::scalar_f(0.0f)).init("train", Tensor::scalar<bool>(DataType::kBool, true));
  b.node("Dropout", {"x", "ratio", "train"}, {"d", "mask"});
  b.node("Relu", {"d"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::remove_noop_ops, &changed);
  EXPECT_EQ(changed, 1);
  EXPECT_EQ(count_op(*after.graph, "Dropout"), 0);
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(RemoveNoopOps, KeepsATrainingDropoutWithARatio) {
  GraphBuilder b;
  b.input("x", {2, 5}).output("y");
  b.init("ratio", testing::scalar_f(0.5f)).init("train", Tensor::scalar<bool>(DataType::kBool, true));
  b.node("Dropout", {"x", "ratio", "train"}, {"y", "mask"});
  ir::Model m = b.finish();
  EXPECT_EQ(passes::remove_noop_ops(*m.graph).value(), 0);
}

TEST(RemoveNoopOps, AllZeroPadIsAnIdentityAndANonZeroOneStays) {
  GraphBuilder b;
  b.input("x", {1, 2, 3, 3}).output("y");
  b.init("zero", i64s({0, 0, 0, 0, 0, 0, 0, 0})).init("one", i64s({0, 0, 1, 0, 0, 0, 0, 1}));
  b.node("Pad", {"x", "zero"}, {"p0"});
  b.node("Pad", {"p0", "one"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::remove_noop_ops, &changed);
  EXPECT_EQ(changed, 1);
  EXPECT_EQ(count_op(*after.graph, "Pad"), 1);
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

// x -> Pad(spatial p) -> window op; returns the model.
ir::Model pad_then(const std::string& op, std::vector<int64_t> pads, std::vector<int64_t> own_pads,
                   int64_t count_include_pad) {
  GraphBuilder b;
  b.input("x", {1, 3, 7, 6}).output("y").init("pads", i64s(pads));
  b.node("Pad", {"x", "pads"}, {"p"});
  if (op == "Conv") {
    b.init("w", random_tensor({4, 3, 3, 2}, 3)).init("bias", random_tensor({4}, 4));
    ir::Node& n = b.node("Conv", {"p", "w", "bias"}, {"y"});
    if (!own_pads.empty()) GraphBuilder::set_ints(n, "pads", own_pads);
  } else {
    ir::Node& n = b.node(op, {"p"}, {"y"});
    GraphBuilder::set_ints(n, "kernel_shape", {3, 3});
    if (!own_pads.empty()) GraphBuilder::set_ints(n, "pads", own_pads);
    if (count_include_pad >= 0) GraphBuilder::set_int(n, "count_include_pad", count_include_pad);
  }
  return b.finish();
}

TEST(FoldPadIntoWindow, ZeroPadFoldsIntoConvPads) {
  ir::Model before = pad_then("Conv", {0, 0, 1, 2, 0, 0, 2, 0}, {1, 0, 0, 1}, -1);
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fold_pad_into_window, &changed);
  EXPECT_EQ(changed, 1);
  EXPECT_EQ(count_op(*after.graph, "Pad"), 0);
  EXPECT_EQ(find_op(*after.graph, "Conv")->attr_ints("pads"), (std::vector<int64_t>{2, 2, 2, 1}));
  EXPECT_LT(max_abs_diff(before, after), 1e-5);
}

TEST(FoldPadIntoWindow, ZeroPadBeforeAveragePoolCountsThePadding) {
  for (int64_t cip : {-1, 0, 1}) {
    ir::Model before = pad_then("AveragePool", {0, 0, 1, 1, 0, 0, 1, 1}, {}, cip);
    int changed = 0;
    ir::Model after = apply_pass(before, passes::fold_pad_into_window, &changed);
    EXPECT_EQ(changed, 1) << cip;
    EXPECT_EQ(find_op(*after.graph, "AveragePool")->attr_int("count_include_pad", 0), 1);
    EXPECT_LT(max_abs_diff(before, after), 1e-6) << cip;
  }
  // Own pads counted too: the sum, exact.
  ir::Model before = pad_then("AveragePool", {0, 0, 1, 0, 0, 0, 0, 1}, {1, 1, 1, 1}, 1);
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fold_pad_into_window, &changed);
  EXPECT_EQ(changed, 1);
  EXPECT_LT(max_abs_diff(before, after), 1e-6);
}

TEST(FoldPadIntoWindow, LeavesMaxPoolMixedCountingAndNonZeroPadsAlone) {
  int changed = 0;
  apply_pass(pad_then("MaxPool", {0, 0, 1, 1, 0, 0, 1, 1}, {}, -1), passes::fold_pad_into_window, &changed);
  EXPECT_EQ(changed, 0);  // MaxPool pads with -inf, the Pad with 0
  apply_pass(pad_then("AveragePool", {0, 0, 1, 1, 0, 0, 1, 1}, {1, 1, 1, 1}, 0), passes::fold_pad_into_window,
             &changed);
  EXPECT_EQ(changed, 0);  // own pads not counted, the Pad's would be
  apply_pass(pad_then("AveragePool", {0, 1, 1, 1, 0, 0, 1, 1}, {}, -1), passes::fold_pad_into_window, &changed);
  EXPECT_EQ(changed, 0);  // pads the channel dim
  GraphBuilder b;
  b.input("x", {1, 3, 7, 6}).output("y").init("pads", i64s({0, 0, 1, 1, 0, 0, 1, 1}));
  b.init("value", testing::scalar_f(2.0f)).init("w", random_tensor({4, 3, 3, 3}, 3));
  b.node("Pad", {"x", "pads", "value"}, {"p"});
  b.node("Conv", {"p", "w"}, {"y"});
  apply_pass(b.finish(), passes::fold_pad_into_window, &changed);
  EXPECT_EQ(changed, 0);  // pads with 2, not 0
}

// Conv over a `h` x `w` map with a 3x3 kernel of dilation `d`, padding `d` (DeepLabV3's ASPP).
ir::Model dilated_conv(int64_t h, int64_t w, int64_t d, int64_t stride = 1) {
  GraphBuilder b;
  b.input("x", {1, 5, h, w}).output("y");
  b.init("w", random_tensor({6, 5, 3, 3}, 7)).init("bias", random_tensor({6}, 8));
  ir::Node& n = b.node("Conv", {"x", "w", "bias"}, {"y"});
  GraphBuilder::set_ints(n, "pads", {d, d, d, d});
  GraphBuilder::set_ints(n, "dilations", {d, d});
  if (stride != 1) GraphBuilder::set_ints(n, "strides", {stride, stride});
  return b.finish();
}

TEST(PrunePaddingTaps, DilationBeyondTheMapLeavesTheCentreTap) {
  ir::Model before = dilated_conv(7, 5, 9);
  int changed = 0;
  ir::Model after = apply_pass(before, passes::prune_padding_taps, &changed);
  EXPECT_EQ(changed, 1);
  const ir::Node* conv = find_op(*after.graph, "Conv");
  EXPECT_EQ(conv->attr_ints("kernel_shape"), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(conv->attr_ints("pads"), (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(after.graph->initializers.at(conv->inputs[1]).shape(), (Dims{6, 5, 1, 1}));
  EXPECT_LT(max_abs_diff(before, after), 1e-5);
}

TEST(PrunePaddingTaps, OneAxisOnlyAndStridedCasesStayExact) {
  // 7 rows reach the outer taps at dilation 4, 3 columns do not.
  for (auto [h, w, d, s] : std::vector<std::array<int64_t, 4>>{{7, 3, 4, 1}, {9, 2, 3, 2}, {3, 11, 5, 3}}) {
    ir::Model before = dilated_conv(h, w, d, s);
    int changed = 0;
    ir::Model after = apply_pass(before, passes::prune_padding_taps, &changed);
    EXPECT_EQ(changed, 1) << h << "x" << w << " d" << d << " s" << s;
    EXPECT_LT(max_abs_diff(before, after), 1e-5) << h << "x" << w << " d" << d << " s" << s;
  }
}

TEST(PrunePaddingTaps, LeavesConvsWhoseTapsAllReadDataOrWhoseSizeIsSymbolic) {
  int changed = 0;
  apply_pass(dilated_conv(20, 20, 2), passes::prune_padding_taps, &changed);
  EXPECT_EQ(changed, 0);
  ir::Model dynamic = dilated_conv(7, 5, 9);
  dynamic.graph->inputs[0].type.shape.dims[2] = Dim::symbol("h");
  dynamic.graph->value_types.clear();
  ASSERT_TRUE(ops::infer_shapes(*dynamic.graph).ok());
  apply_pass(dynamic, passes::prune_padding_taps, &changed);
  EXPECT_EQ(changed, 0);
}

TEST(SpecializeFixedDims, PinsDimsEveryProfileFixesAndKeepsTheRest) {
  GraphBuilder b;
  b.input("x", {1, 3}).output("y");
  b.node("Relu", {"x"}, {"y"});
  ir::Model m = b.finish();
  m.graph->inputs[0].type.shape.dims = {Dim::symbol("batch"), Dim::symbol("seq")};
  Profile p0, p1;
  p0.inputs["x"] = ShapeRange{{2, 8}, {2, 16}, {2, 32}};
  p1.inputs["x"] = ShapeRange{{2, 1}, {2, 1}, {2, 1}};
  EXPECT_EQ(detail::specialize_fixed_dims(*m.graph, {p0, p1}), 1);
  const auto& dims = m.graph->inputs[0].type.shape.dims;
  EXPECT_EQ(dims[0].value, 2);
  EXPECT_FALSE(dims[1].known());  // 8..32 in one profile, 1 in the other
  EXPECT_EQ(detail::specialize_fixed_dims(*m.graph, {}), 0);
}

// pool_before_pointwise_conv: DenseNet's transition (ReLU -> 1x1 conv -> 2x2 average pool), odd
// spatial sizes, a bias, groups, overlapping 3x3 windows with stride 2: the pool moves before the
// conv, which keeps writing the pool's output; the values stay those of the original graph.
TEST(PoolBeforePointwiseConv, AveragePoolMovesBeforeA1x1Conv) {
  struct Case {
    int64_t group, kernel, stride;
  };
  for (const Case& k : {Case{1, 2, 2}, Case{3, 2, 2}, Case{1, 3, 2}, Case{2, 1, 1}}) {
    GraphBuilder b(13);
    b.input("x", {2, 12, 9, 7}).output("y");
    b.init("w", random_tensor({6, 12 / k.group, 1, 1}, 1)).init("bias", random_tensor({6}, 2));
    b.node("Relu", {"x"}, {"r"});
    GraphBuilder::set_int(b.node("Conv", {"r", "w", "bias"}, {"c"}), "group", k.group);
    auto& pool = b.node("AveragePool", {"c"}, {"y"});
    GraphBuilder::set_ints(pool, "kernel_shape", {k.kernel, k.kernel});
    GraphBuilder::set_ints(pool, "strides", {k.stride, k.stride});
    ir::Model before = b.finish();
    int changed = 0;
    ir::Model after = apply_pass(before, passes::pool_before_pointwise_conv, &changed);
    EXPECT_EQ(changed, 1);
    const ir::Node* p = find_op(*after.graph, "AveragePool");
    const ir::Node* c = find_op(*after.graph, "Conv");
    ASSERT_TRUE(p && c);
    EXPECT_EQ(p->inputs[0], "r");
    EXPECT_EQ(c->inputs[0], p->outputs[0]);
    EXPECT_EQ(c->outputs[0], "y");
    EXPECT_LT(max_abs_diff(before, after), 1e-5);
  }
}

// Left alone: pads or ceil_mode on the pool (padded or partial windows), a strided, padded or 3x3
// conv, a MaxPool, and a conv output that something else reads too.
TEST(PoolBeforePointwiseConv, LeavesOtherWindowsAndSharedConvsAlone) {
  for (int variant = 0; variant < 7; ++variant) {
    GraphBuilder b(13);
    b.input("x", {1, 8, 8, 8}).output("y");
    if (variant == 6) b.output("c");
    b.init("w", random_tensor({4, 8, variant == 4 ? 3 : 1, variant == 4 ? 3 : 1}, 1));
    auto& conv = b.node("Conv", {"x", "w"}, {"c"});
    if (variant == 2) GraphBuilder::set_ints(conv, "strides", {2, 2});
    if (variant == 3) GraphBuilder::set_ints(conv, "pads", {1, 1, 1, 1});
    auto& pool = b.node(variant == 5 ? "MaxPool" : "AveragePool", {"c"}, {"y"});
    GraphBuilder::set_ints(pool, "kernel_shape", {2, 2});
    GraphBuilder::set_ints(pool, "strides", {2, 2});
    if (variant == 0) GraphBuilder::set_ints(pool, "pads", {1, 1, 0, 0});
    if (variant == 1) GraphBuilder::set_int(pool, "ceil_mode", 1);
    ir::Model m = b.finish();
    int changed = 0;
    ir::Model after = apply_pass(m, passes::pool_before_pointwise_conv, &changed);
    EXPECT_EQ(changed, 0) << "variant " << variant;
  }
}

// lower_patchify_conv: a ViT-style patch embedding (kernel == stride, read as tokens) becomes
// patches x MatMul; with the model's Reshape + Transpose to [N, tokens, channels] after it, the
// transposes cancel and only the patch gather remains. Odd channel and patch counts, with and without
// bias, a non-square kernel.
TEST(LowerPatchifyConv, PatchEmbeddingBecomesAMatMulAndTheTransposesCancel) {
  struct Case {
    int64_t c, oc, kh, kw, h, w;
    bool bias;
  };
  for (const Case& k : {Case{3, 5, 4, 4, 12, 20, true}, Case{1, 7, 2, 3, 6, 9, false}, Case{5, 3, 5, 5, 5, 15, true}}) {
    GraphBuilder b(13);
    b.input("x", {2, k.c, k.h, k.w}).output("y");
    b.init("w", random_tensor({k.oc, k.c, k.kh, k.kw}, 1)).init("bias", random_tensor({k.oc}, 2));
    b.init("shape", i64s({2, k.oc, (k.h / k.kh) * (k.w / k.kw)}));
    std::vector<std::string> in = {"x", "w"};
    if (k.bias) in.push_back("bias");
    GraphBuilder::set_ints(b.node("Conv", in, {"c"}), "strides", {k.kh, k.kw});
    b.node("Reshape", {"c", "shape"}, {"r"});
    GraphBuilder::set_ints(b.node("Transpose", {"r"}, {"y"}), "perm", {0, 2, 1});
    ir::Model before = b.finish();
    int changed = 0;
    ir::Model after = apply_pass(before, passes::lower_patchify_conv, &changed);
    EXPECT_EQ(changed, 1);
    EXPECT_EQ(count_op(*after.graph, "Conv"), 0);
    EXPECT_EQ(count_op(*after.graph, "MatMul"), 1);
    EXPECT_LT(max_abs_diff(before, after), 1e-4);
    ir::Model cleaned = apply_pass(after, passes::remove_noop_ops, &changed);
    EXPECT_EQ(count_op(*cleaned.graph, "Transpose"), 1);  // the patch gather; the rest cancelled
    EXPECT_LT(max_abs_diff(before, cleaned), 1e-4);
  }
}

// ConvNeXt's stem: the patch conv permuted to channels-last for a LayerNorm reads the tokens through a
// Reshape, without a transpose back to NCHW and forth.
TEST(LowerPatchifyConv, AChannelsLastReaderTakesTheTokensDirectly) {
  GraphBuilder b(13);
  b.input("x", {1, 3, 12, 8}).output("y");
  b.init("w", random_tensor({6, 3, 4, 4}, 1)).init("bias", random_tensor({6}, 2));
  GraphBuilder::set_ints(b.node("Conv", {"x", "w", "bias"}, {"c"}), "strides", {4, 4});
  GraphBuilder::set_ints(b.node("Transpose", {"c"}, {"t"}), "perm", {0, 2, 3, 1});
  b.node("Relu", {"t"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::lower_patchify_conv, &changed);
  EXPECT_EQ(changed, 1);
  ir::Model cleaned = apply_pass(after, passes::remove_dead_nodes, &changed);
  EXPECT_EQ(count_op(*cleaned.graph, "Conv"), 0);
  EXPECT_EQ(count_op(*cleaned.graph, "Transpose"), 1);  // the patch gather
  EXPECT_LT(max_abs_diff(before, cleaned), 1e-4);
}

// Left alone: a stride other than the kernel, pads, dilations, groups, a height the kernel does not
// divide, a conv read by a non-movement op (a ReLU: it feeds conv-land), a conv that is a graph output.
TEST(LowerPatchifyConv, LeavesOtherConvsAlone) {
  for (int variant = 0; variant < 7; ++variant) {
    GraphBuilder b(13);
    b.input("x", {1, 4, variant == 4 ? 10 : 8, 8}).output("y");
    if (variant == 6) b.output("c");
    b.init("w", random_tensor({6, variant == 3 ? 2 : 4, 4, 4}, 1));
    auto& conv = b.node("Conv", {"x", "w"}, {"c"});
    GraphBuilder::set_ints(conv, "strides", variant == 0 ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{4, 4});
    if (variant == 1) GraphBuilder::set_ints(conv, "pads", {1, 1, 1, 1});
    if (variant == 2) GraphBuilder::set_ints(conv, "dilations", {2, 2});
    if (variant == 3) GraphBuilder::set_int(conv, "group", 2);
    b.node(variant == 5 ? "Relu" : "Flatten", {"c"}, {"y"});
    ir::Model m = b.finish();
    int changed = 0;
    ir::Model after = apply_pass(m, passes::lower_patchify_conv, &changed);
    EXPECT_EQ(changed, 0) << "variant " << variant;
  }
}

}  // namespace
}  // namespace kiln
