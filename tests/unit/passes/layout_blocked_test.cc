// layout_blocked: convs and the pools after them become channel-blocked kiln ops, with one reorder
// per boundary value; the rewritten graph computes what the original did (reference interpreter).
#include <set>

#include "engine/target.h"
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

Result<int> blocked16(ir::Graph& g) { return passes::layout_blocked_with_block(g, 16); }
Result<int> blocked8(ir::Graph& g) { return passes::layout_blocked_with_block(g, 8); }
Result<int> blocked_off(ir::Graph& g) { return passes::layout_blocked_with_block(g, 0); }
Result<int> blocked16_by_cost(ir::Graph& g) { return passes::layout_blocked_with_block(g, 16, true); }

ir::Node& conv(GraphBuilder& b, const std::string& x, const std::string& w, const std::string& y, int64_t pad) {
  ir::Node& n = b.node("Conv", {x, w}, {y});
  GraphBuilder::set_ints(n, "pads", {pad, pad, pad, pad});
  return n;
}

TEST(LayoutBlocked, ResnetBlockStaysBlockedBetweenLayers) {
  for (auto pass : {blocked16, blocked8}) {
    ir::Model before = small_resnet();
    int changed = 0;
    ir::Model after = apply_pass(before, pass, &changed);
    EXPECT_EQ(changed, 5);  // 3 convs, 2 pools
    const ir::Graph& g = *after.graph;
    EXPECT_EQ(count_kiln(g, "BlockedConv"), 3);
    EXPECT_EQ(count_kiln(g, "BlockedPool"), 2);
    EXPECT_EQ(count_kiln(g, "ReorderToBlocked"), 0);    // the 3-channel image goes in plain
    EXPECT_EQ(count_kiln(g, "ReorderFromBlocked"), 1);  // only the pooled [2,20,1,1] leaves
    EXPECT_EQ(count_kiln(g, "FusedConv"), 0);
    const ir::Node* first = find_op(g, "BlockedConv");
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(first->inputs[0], "x");
    const ir::Node* from = find_op(g, "ReorderFromBlocked");
    ASSERT_NE(from, nullptr);
    EXPECT_EQ(from->outputs[0], "g");  // the escaping value keeps its name
    EXPECT_EQ(from->attr_int("channels", 0), 20);
    // The residual (the pool's output) is read blocked too.
    int residuals = 0;
    for (const auto& n : g.nodes)
      if (n.op_type == "BlockedConv" && n.has_input(3)) {
        ++residuals;
        EXPECT_EQ(n.inputs[3], find_op(g, "BlockedPool")->outputs[0]);
      }
    EXPECT_EQ(residuals, 1);
    EXPECT_EQ(max_abs_diff(before, after), 0.0);
  }
}

TEST(LayoutBlocked, OneReorderPerBoundaryValueAndKeptNames) {
  // x (32 channels) read by two convs: one shared ReorderToBlocked. c1 read by a conv, by a
  // Sigmoid and as a graph output: one ReorderFromBlocked, which produces "c1".
  GraphBuilder b(13);
  b.input("x", {1, 32, 7, 9}).output("c1").output("s").output("y");
  b.init("wa", random_tensor({24, 32, 3, 3}, 1)).init("wb", random_tensor({8, 32, 1, 1}, 2));
  b.init("wc", random_tensor({8, 24, 1, 1}, 3));
  conv(b, "x", "wa", "c1", 1);
  conv(b, "x", "wb", "c2", 0);
  b.node("Sigmoid", {"c1"}, {"s"});
  conv(b, "c1", "wc", "c3", 0);
  b.node("Add", {"c2", "c3"}, {"y0"});  // two blocked operands of one shape: stays blocked
  b.node("Relu", {"y0"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, blocked16, &changed);
  const ir::Graph& g = *after.graph;
  EXPECT_EQ(changed, 5);  // 3 convs, Add, Relu
  EXPECT_EQ(count_kiln(g, "ReorderToBlocked"), 1);
  EXPECT_EQ(count_kiln(g, "ReorderFromBlocked"), 2);  // c1 (output, Sigmoid), y (output)
  int readers_of_blocked_x = 0;
  const ir::Node* to = find_op(g, "ReorderToBlocked");
  ASSERT_NE(to, nullptr);
  for (const auto& n : g.nodes) readers_of_blocked_x += n.op_type == "BlockedConv" && n.inputs[0] == to->outputs[0];
  EXPECT_EQ(readers_of_blocked_x, 2);
  int made_c1 = 0;
  for (const auto& n : g.nodes)
    for (const auto& o : n.outputs) made_c1 += o == "c1";
  EXPECT_EQ(made_c1, 1);
  EXPECT_EQ(find_op(g, "Sigmoid")->inputs[0], "c1");
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(LayoutBlocked, ElementwiseOpsStayBlockedOnlyWhenZeroStaysZero) {
  // a, b: two convs (20 channels: 12 padding lanes at block 16). Add(a, b) -> Relu -> Mul by 0.5
  // stay blocked (f(0) = 0); Sigmoid (0.5), + 1 (a constant) and Div (0/0) would write the padding.
  GraphBuilder b(13);
  b.input("x", {1, 20, 6, 7}).output("s").output("t").output("u").output("v");
  b.init("wa", random_tensor({20, 20, 3, 3}, 1)).init("wb", random_tensor({20, 20, 1, 1}, 2));
  b.init("wc", random_tensor({20, 20, 1, 1}, 3)).init("half", scalar_f(0.5f)).init("one", scalar_f(1.0f));
  b.init("chan", random_tensor({20, 1, 1}, 4));
  conv(b, "x", "wa", "a", 1);
  conv(b, "x", "wb", "bb", 0);
  b.node("Add", {"a", "bb"}, {"sum"});
  b.node("Relu", {"sum"}, {"r"});
  b.node("Mul", {"r", "half"}, {"h"});
  conv(b, "h", "wc", "s", 0);
  b.node("Sigmoid", {"a"}, {"t"});
  b.node("Add", {"bb", "one"}, {"u"});
  b.node("Mul", {"a", "chan"}, {"v0"});  // a per-channel constant broadcasts over the plain layout only
  b.node("Div", {"v0", "bb"}, {"v"});
  ir::Model before = b.finish();
  for (auto pass : {blocked16, blocked8}) {
    int changed = 0;
    ir::Model after = apply_pass(before, pass, &changed);
    const ir::Graph& g = *after.graph;
    EXPECT_EQ(changed, 6);  // 3 convs, Add, Relu, Mul by 0.5
    for (const auto& n : g.nodes) {
      bool blocked_in = n.inputs[0].find(".blocked") != std::string::npos;
      if (n.op_type == "Relu" || (n.op_type == "Add" && n.inputs[1] != "one") ||
          (n.op_type == "Mul" && n.inputs[1] == "half")) {
        EXPECT_TRUE(blocked_in) << n.name;
      }
      if (n.op_type == "Sigmoid" || n.op_type == "Div" || (n.op_type == "Add" && n.inputs[1] == "one") ||
          (n.op_type == "Mul" && n.inputs[1] == "chan")) {
        EXPECT_FALSE(blocked_in) << n.name;
      }
    }
    EXPECT_EQ(count_kiln(g, "ReorderFromBlocked"), 3);  // a, bb (plain readers), s (output)
    EXPECT_LT(max_abs_diff(before, after), 1e-6);
  }
  // The same after fuse_elementwise: Add -> Relu -> Mul becomes a kiln.FusedElementwise that stays
  // blocked; Mul by the per-channel constant -> Div becomes one that does not.
  int changed = 0;
  ir::Model fused = apply_pass(before, passes::fuse_elementwise, &changed);
  ASSERT_EQ(count_kiln(*fused.graph, "FusedElementwise"), 2);
  ir::Model after = apply_pass(fused, blocked16, &changed);
  EXPECT_EQ(changed, 4);
  int blocked_fused = 0;
  for (const auto& n : after.graph->nodes)
    blocked_fused += n.op_type == "FusedElementwise" && n.inputs[0].find(".blocked") != std::string::npos;
  EXPECT_EQ(blocked_fused, 1);
  EXPECT_LT(max_abs_diff(before, after), 1e-6);
}

// DenseNet's dense layer: Concat of the block's feature maps -> BatchNormalization left as Mul and Add
// by per-channel constants ([C, 1, 1] and [1, C, 1, 1]) -> Relu -> 1x1 conv. With whole blocks the
// scale and shift become [1, C / B, 1, 1, B] constants and the layer stays blocked (no reorder
// around it); with a last partial block (24 channels at block 16) it stays plain.
TEST(LayoutBlocked, PerChannelConstantsStayBlockedOnWholeBlocks) {
  for (int64_t second : {16, 8}) {
    const int64_t c = 16 + second;
    GraphBuilder b(13);
    b.input("x", {2, 16, 7, 9}).output("y");
    b.init("wa", random_tensor({16, 16, 3, 3}, 1)).init("wb", random_tensor({second, 16, 1, 1}, 2));
    b.init("scale", random_tensor({c, 1, 1}, 3)).init("shift", random_tensor({1, c, 1, 1}, 4));
    b.init("wo", random_tensor({5, c, 1, 1}, 5));
    conv(b, "x", "wa", "a", 1);
    conv(b, "x", "wb", "bb", 0);
    GraphBuilder::set_int(b.node("Concat", {"a", "bb"}, {"cat"}), "axis", 1);
    b.node("Mul", {"cat", "scale"}, {"m"});
    b.node("Add", {"m", "shift"}, {"s"});
    b.node("Relu", {"s"}, {"r"});
    conv(b, "r", "wo", "y", 0);
    ir::Model before = b.finish();
    int fused_changed = 0;
    ir::Model fused = apply_pass(before, passes::fuse_elementwise, &fused_changed);
    ASSERT_EQ(count_kiln(*fused.graph, "FusedElementwise"), 1);
    for (auto pass : {blocked16, blocked8}) {
      const int64_t block = pass == blocked16 ? 16 : 8;
      const bool whole = c % block == 0;
      for (const ir::Model* m : {&before, &fused}) {
        int changed = 0;
        ir::Model after = apply_pass(*m, pass, &changed);
        const ir::Graph& g = *after.graph;
        const int elementwise = m == &before ? 3 : 1;
        EXPECT_EQ(changed, 4 + (whole ? elementwise : 0)) << c << " channels, block " << block;
        EXPECT_EQ(count_kiln(g, "ReorderFromBlocked"), whole ? 1 : 2);  // y (and cat when plain)
        for (const auto& n : g.nodes) {
          if (n.op_type != "Mul" && n.op_type != "Add" && n.op_type != "FusedElementwise") continue;
          for (const auto& in : n.inputs) {
            EXPECT_EQ(in.find(".blocked") != std::string::npos, whole) << n.name << " reads " << in;
            if (const Tensor* t = ir::constant_value(g, in); t && whole) {
              EXPECT_EQ(t->shape(), (Dims{1, c / block, 1, 1, block})) << in;
            }
          }
        }
        EXPECT_LT(max_abs_diff(before, after), 1e-5);
      }
    }
  }
}

// layout_fuse_concat_elementwise on that dense layer: the blocked Concat and the blocked
// FusedElementwise after it become one kiln.BlockedConcatElementwise (three pieces, the Concat
// read by body input 1 of 2: the body's inputs are reordered), computing the same; a Concat that is
// also a graph output stays.
TEST(LayoutFuseConcatElementwise, DenseLayerConcatAndPreActivationBecomeOneLayer) {
  for (bool shared : {false, true}) {
    GraphBuilder b(13);
    b.input("x", {2, 16, 7, 9}).output("y");
    if (shared) b.output("cat");
    b.init("wa", random_tensor({16, 16, 3, 3}, 1)).init("wb", random_tensor({8, 16, 1, 1}, 2));
    b.init("wc", random_tensor({16, 16, 1, 1}, 6));
    b.init("scale", random_tensor({40, 1, 1}, 3)).init("shift", random_tensor({1, 40, 1, 1}, 4));
    b.init("wo", random_tensor({5, 40, 1, 1}, 5));
    conv(b, "x", "wa", "a", 1);
    conv(b, "x", "wc", "cc", 0);
    conv(b, "x", "wb", "bb", 0);
    GraphBuilder::set_int(b.node("Concat", {"a", "cc", "bb"}, {"cat"}), "axis", 1);
    b.node("Mul", {"scale", "cat"}, {"m"});
    b.node("Add", {"m", "shift"}, {"s"});
    b.node("Relu", {"s"}, {"r"});
    conv(b, "r", "wo", "y", 0);
    ir::Model before = b.finish();
    int changed = 0;
    ir::Model fused = apply_pass(before, passes::fuse_elementwise, &changed);
    ir::Model blocked = apply_pass(fused, blocked8, &changed);
    ASSERT_EQ(count_kiln(*blocked.graph, "FusedElementwise"), 1);
    ir::Model after = apply_pass(blocked, passes::layout_fuse_concat_elementwise, &changed);
    const ir::Graph& g = *after.graph;
    EXPECT_EQ(changed, shared ? 0 : 1);
    EXPECT_EQ(count_kiln(g, "BlockedConcatElementwise"), shared ? 0 : 1);
    EXPECT_EQ(count_op(g, "Concat"), shared ? 1 : 0);
    if (const ir::Node* f = find_op(g, "BlockedConcatElementwise")) {
      EXPECT_EQ(f->attr_int("pieces", 0), 3);
      EXPECT_EQ(f->attr_int("block", 0), 8);
      ASSERT_EQ(f->inputs.size(), 5u);  // a, cc, bb, then the scale and shift
      EXPECT_NE(f->inputs[3].find("scale"), std::string::npos);
    }
    EXPECT_LT(max_abs_diff(before, after), 1e-5);
  }
}

TEST(LayoutBlocked, DepthwiseAndOddChannelsConvertGroupedStayPlain) {
  GraphBuilder b(13);
  b.input("x", {1, 21, 9, 9}).output("y");
  b.init("w1", random_tensor({21, 21, 1, 1}, 1)).init("wd", random_tensor({21, 1, 3, 3}, 2));
  b.init("wg", random_tensor({6, 7, 3, 3}, 3)).init("w4", random_tensor({5, 6, 1, 1}, 4));
  conv(b, "x", "w1", "a", 0);
  auto& dw = conv(b, "a", "wd", "d", 1);
  GraphBuilder::set_int(dw, "group", 21);
  GraphBuilder::set_ints(dw, "strides", {2, 2});
  auto& gc = conv(b, "d", "wg", "e", 1);  // 3 groups of 7 channels: not blockable
  GraphBuilder::set_int(gc, "group", 3);
  conv(b, "e", "w4", "y", 0);
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, blocked8, &changed);
  const ir::Graph& g = *after.graph;
  EXPECT_EQ(changed, 3);
  EXPECT_EQ(count_kiln(g, "BlockedConv"), 3);
  EXPECT_EQ(count_op(g, "Conv"), 1);
  EXPECT_EQ(count_kiln(g, "ReorderToBlocked"), 1);    // x (21 channels); e has 6, fewer than a block
  EXPECT_EQ(count_kiln(g, "ReorderFromBlocked"), 2);  // d (the grouped conv), y (graph output)
  EXPECT_LT(max_abs_diff(before, after), 1e-6);
}

// A grouped conv goes blocked when each of its groups is whole blocks in and out (ResNeXt: 32
// groups of 8 channels take blocks of 8, not of 16).
TEST(LayoutBlocked, GroupsOfWholeBlocksConvert) {
  for (int64_t block : {8, 16}) {
    GraphBuilder b(13);
    b.input("x", {1, 32, 7, 7}).output("y");
    b.init("w1", random_tensor({32, 32, 1, 1}, 1)).init("wg", random_tensor({32, 8, 3, 3}, 2));
    b.init("w2", random_tensor({16, 32, 1, 1}, 3));
    conv(b, "x", "w1", "a", 0);
    auto& gc = conv(b, "a", "wg", "g", 1);  // 4 groups of 8 channels
    GraphBuilder::set_int(gc, "group", 4);
    conv(b, "g", "w2", "y", 0);
    ir::Model before = b.finish();
    int changed = 0;
    ir::Model after = apply_pass(before, block == 8 ? blocked8 : blocked16, &changed);
    const ir::Graph& g = *after.graph;
    EXPECT_EQ(count_kiln(g, "BlockedConv"), block == 8 ? 3 : 2) << block;
    EXPECT_EQ(count_op(g, "Conv"), block == 8 ? 0 : 1) << block;
    EXPECT_EQ(count_kiln(g, "ReorderFromBlocked"), block == 8 ? 1 : 2) << block;
    EXPECT_LT(max_abs_diff(before, after), 1e-5);
  }
}

TEST(LayoutBlocked, PoolsFollowOnlyBlockedInputs) {
  GraphBuilder b(13);
  b.input("x", {1, 4, 8, 8}).output("y").output("z").output("i");
  b.init("w", random_tensor({4, 4, 1, 1}, 1));
  auto& p0 = b.node("AveragePool", {"x"}, {"p"});  // plain input: stays plain
  GraphBuilder::set_ints(p0, "kernel_shape", {2, 2});
  conv(b, "p", "w", "c", 0);
  auto& p1 = b.node("MaxPool", {"c"}, {"y"});
  GraphBuilder::set_ints(p1, "kernel_shape", {2, 2});
  auto& p2 = b.node("MaxPool", {"c"}, {"z", "i"});  // Indices: positions in the plain layout
  GraphBuilder::set_ints(p2, "kernel_shape", {2, 2});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, blocked16, &changed);
  const ir::Graph& g = *after.graph;
  EXPECT_EQ(count_kiln(g, "BlockedPool"), 1);
  EXPECT_EQ(count_op(g, "AveragePool"), 1);
  EXPECT_EQ(count_op(g, "MaxPool"), 1);
  EXPECT_EQ(count_kiln(g, "ReorderFromBlocked"), 2);  // y, and c for the MaxPool with Indices
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

// A squeeze-excite block (MobileNetV3, EfficientNet): conv (20 channels, odd for both blocks) ->
// GlobalAveragePool -> 1x1 conv + Relu -> 1x1 conv + HardSigmoid / Sigmoid -> Mul with the feature
// map -> 1x1 conv. The channel scale [N, C, 1, 1] broadcasts over the plane in the blocked layout
// too, so the whole block stays blocked: the only reorder is the graph output's. A map of other
// channels (1: a spatial gate) does not broadcast like that and stays plain.
TEST(LayoutBlocked, SqueezeExciteStaysBlocked) {
  for (bool scale_first : {true, false}) {
    for (const char* gate : {"HardSigmoid", "Sigmoid"}) {
      GraphBuilder b(13);
      b.input("x", {2, 20, 7, 6}).output("y");
      b.init("w0", random_tensor({20, 20, 3, 3}, 1))
          .init("w1", random_tensor({6, 20, 1, 1}, 2, DataType::kFloat32, -2, 2));
      b.init("b1", random_tensor({6}, 3)).init("w2", random_tensor({20, 6, 1, 1}, 4, DataType::kFloat32, -2, 2));
      b.init("b2", random_tensor({20}, 5)).init("w3", random_tensor({12, 20, 1, 1}, 6));
      conv(b, "x", "w0", "f", 1);
      b.node("GlobalAveragePool", {"f"}, {"p"});
      b.node("Conv", {"p", "w1", "b1"}, {"s1"});
      b.node("Relu", {"s1"}, {"r1"});
      b.node("Conv", {"r1", "w2", "b2"}, {"s2"});
      b.node(gate, {"s2"}, {"s"});
      b.node("Mul", scale_first ? std::vector<std::string>{"s", "f"} : std::vector<std::string>{"f", "s"}, {"m"});
      conv(b, "m", "w3", "y", 0);
      ir::Model before = b.finish();
      int changed = 0;
      ir::Model fused = apply_pass(before, passes::fuse_activation, &changed);
      for (auto pass : {blocked16, blocked8}) {
        ir::Model after = apply_pass(fused, pass, &changed);
        const ir::Graph& g = *after.graph;
        EXPECT_EQ(changed, 6);                              // 4 convs, the pool, the Mul
        EXPECT_EQ(count_kiln(g, "ReorderFromBlocked"), 1);  // y
        EXPECT_EQ(count_kiln(g, "ReorderToBlocked"), 1);    // x
        const ir::Node* mul = find_op(g, "Mul");
        ASSERT_NE(mul, nullptr);
        EXPECT_NE(mul->inputs[0].find(".blocked"), std::string::npos);
        EXPECT_NE(mul->inputs[1].find(".blocked"), std::string::npos);
        EXPECT_LT(max_abs_diff(before, after), 1e-5) << gate;
      }
    }
  }
  // Near miss: a 1-channel map [N, 1, H, W] times the 20-channel feature map.
  GraphBuilder b(13);
  b.input("x", {1, 20, 5, 5}).output("y");
  b.init("w0", random_tensor({20, 20, 3, 3}, 1)).init("wg", random_tensor({1, 20, 1, 1}, 2));
  conv(b, "x", "w0", "f", 1);
  conv(b, "f", "wg", "gmap", 0);
  b.node("Mul", {"f", "gmap"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, blocked16, &changed);
  const ir::Node* mul = find_op(*after.graph, "Mul");
  ASSERT_NE(mul, nullptr);
  EXPECT_EQ(mul->inputs[0], "f");
  EXPECT_EQ(mul->inputs[1], "gmap");
  EXPECT_LT(max_abs_diff(before, after), 1e-6);
}

// SqueezeNet's fire module: squeeze conv -> two expand convs -> Concat of the channels -> MaxPool
// with ceil_mode. The Concat stays blocked when every input but the last fills whole blocks (16 + 13
// channels, block 8: the 13's padding lanes end the output), and the pool after it then too; the
// other order (13 + 16) needs the plain values.
TEST(LayoutBlocked, ChannelConcatsOfWholeBlocksStayBlocked) {
  for (bool whole : {true, false}) {
    GraphBuilder b(13);
    b.input("x", {1, 16, 9, 9}).output("y");
    b.init("ws", random_tensor({8, 16, 1, 1}, 1)).init("w1", random_tensor({16, 8, 1, 1}, 2));
    b.init("w3", random_tensor({13, 8, 3, 3}, 3)).init("wo", random_tensor({5, 29, 1, 1}, 4));
    conv(b, "x", "ws", "s", 0);
    conv(b, "s", "w1", "e1", 0);
    conv(b, "s", "w3", "e3", 1);
    auto& cat =
        b.node("Concat", whole ? std::vector<std::string>{"e1", "e3"} : std::vector<std::string>{"e3", "e1"}, {"cat"});
    GraphBuilder::set_int(cat, "axis", whole ? 1 : -3);
    auto& mp = b.node("MaxPool", {"cat"}, {"p"});
    GraphBuilder::set_ints(mp, "kernel_shape", {3, 3});
    GraphBuilder::set_ints(mp, "strides", {2, 2});
    GraphBuilder::set_int(mp, "ceil_mode", 1);
    conv(b, "p", "wo", "y", 0);
    ir::Model before = b.finish();
    int changed = 0;
    ir::Model after = apply_pass(before, blocked8, &changed);
    const ir::Graph& g = *after.graph;
    EXPECT_EQ(count_kiln(g, "BlockedConv"), 4);
    EXPECT_EQ(count_op(g, "Concat"), 1);
    const ir::Node* c = find_op(g, "Concat");
    ASSERT_NE(c, nullptr);
    if (whole) {
      EXPECT_EQ(changed, 6);  // 4 convs, the Concat, the pool
      EXPECT_EQ(count_kiln(g, "BlockedPool"), 1);
      EXPECT_EQ(c->attr_int("axis", 0), 1);
      EXPECT_NE(c->inputs[0].find(".blocked"), std::string::npos);
      EXPECT_EQ(count_kiln(g, "ReorderFromBlocked"), 1);  // y only
      EXPECT_EQ(count_kiln(g, "ReorderToBlocked"), 1);    // x (16 channels)
    } else {
      EXPECT_EQ(changed, 4);
      EXPECT_EQ(count_op(g, "MaxPool"), 1);
      EXPECT_EQ(c->inputs[0], "e3");
      EXPECT_EQ(count_kiln(g, "ReorderFromBlocked"), 3);  // e3, e1, y
      EXPECT_EQ(count_kiln(g, "ReorderToBlocked"), 2);    // x, p
    }
    EXPECT_LT(max_abs_diff(before, after), 1e-5);
  }
}

TEST(LayoutBlocked, LeavesOtherGraphsAlone) {
  GraphBuilder b(13);
  b.input("x", {1, 4, 6, 6}).input("w", {4, 4, 3, 3}).output("y").output("z");
  b.init("wc", random_tensor({4, 4, 3}, 1));
  b.node("Conv", {"x", "w"}, {"y"});                           // weights not constant
  b.input("x1", {1, 4, 6}).node("Conv", {"x1", "wc"}, {"z"});  // 1-D
  ir::Model before = b.finish();
  int changed = 0;
  apply_pass(before, blocked16, &changed);
  EXPECT_EQ(changed, 0);
  apply_pass(small_resnet(), blocked_off, &changed);
  EXPECT_EQ(changed, 0);
}

TEST(LayoutBlocked, InThePipelineAndSwitchable) {
  bool names_it = false;
  for (const auto& p : passes::pipeline()) names_it |= std::string(p.name) == "layout_blocked";
  EXPECT_TRUE(names_it);
  const Target host = engine::host_target();
  if (host.layout_block == 0) GTEST_SKIP() << "no blocked layout on this machine/build";
  ir::Model on = clone(small_resnet()), off = clone(small_resnet());
  ASSERT_TRUE(passes::optimize(on, {}, host).ok());
  ASSERT_TRUE(passes::optimize(off, {"layout_blocked"}, host).ok());
  EXPECT_EQ(count_kiln(*on.graph, "BlockedConv"), 3);
  EXPECT_EQ(count_kiln(*off.graph, "BlockedConv"), 0);
  EXPECT_EQ(max_abs_diff(on, off), 0.0);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

using namespace testing;  // NOLINT

// Expansion 1x1 conv + ReLU6 -> depthwise 3x3 (stride s) + ReLU6 -> projection 1x1 conv, blocked.
ir::Model inverted_residual(int64_t stride, bool share_expansion) {
  GraphBuilder b(13);
  b.input("x", {1, 16, 9, 11}).output("y");
  if (share_expansion) b.output("e");
  b.init("w1", random_tensor({40, 16, 1, 1}, 1)).init("b1", random_tensor({40}, 2));
  b.init("wd", random_tensor({40, 1, 3, 3}, 3)).init("bd", random_tensor({40}, 4));
  b.init("w2", random_tensor({24, 40, 1, 1}, 5)).init("lo", scalar_f(0.f)).init("hi", scalar_f(6.f));
  b.init("w0", random_tensor({16, 16, 1, 1}, 6));
  conv(b, "x", "w0", "x0", 0);  // makes the expansion's input blocked
  b.node("Conv", {"x0", "w1", "b1"}, {"c1"});
  b.node("Clip", {"c1", "lo", "hi"}, {"e"});
  auto& dw = b.node("Conv", {"e", "wd", "bd"}, {"c2"});
  GraphBuilder::set_int(dw, "group", 40);
  GraphBuilder::set_ints(dw, "pads", {1, 1, 1, 1});
  GraphBuilder::set_ints(dw, "strides", {stride, stride});
  b.node("Clip", {"c2", "lo", "hi"}, {"d"});
  b.node("Conv", {"d", "w2"}, {"y"});
  ir::Model m = b.finish();
  int changed = 0;
  m = apply_pass(m, passes::fuse_activation, &changed);
  return apply_pass(m, blocked16, &changed);
}

TEST(LayoutFuseConvDw, ExpansionAndDepthwiseBecomeOneLayer) {
  for (int64_t stride : {1, 2}) {
    ir::Model before = inverted_residual(stride, false);
    ASSERT_EQ(count_kiln(*before.graph, "BlockedConv"), 4);
    int changed = 0;
    ir::Model after = apply_pass(before, passes::layout_fuse_conv_dw, &changed);
    EXPECT_EQ(changed, 1);
    const ir::Graph& g = *after.graph;
    EXPECT_EQ(count_kiln(g, "BlockedConvDw"), 1);
    EXPECT_EQ(count_kiln(g, "BlockedConv"), 2);
    const ir::Node* f = find_op(g, "BlockedConvDw");
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->attr_string("activation", ""), "Clip");
    EXPECT_EQ(f->attr_string("dw.activation", ""), "Clip");
    EXPECT_EQ(f->attr_ints("dw.strides"), (std::vector<int64_t>{stride, stride}));
    EXPECT_EQ(f->attr_string("kiln.plain_value", ""), "d");
    EXPECT_EQ(ir::sources_of(*f).size(), 4u);  // two convs, two Clips
    EXPECT_EQ(max_abs_diff(before, after), 0.0);
  }
}

TEST(LayoutFuseConvDw, LeavesSharedExpansionsAlone) {
  int changed = 0;
  apply_pass(inverted_residual(1, true), passes::layout_fuse_conv_dw, &changed);
  EXPECT_EQ(changed, 0);  // the expansion's output is also a graph output
}

// The pipeline takes its block from the target, not from the machine it runs on: an AVX2 target
// (block 8) and an AVX-512 one (block 16) give their own layouts on any machine, a target with block 0
// (or a CUDA one) the plain layout, and each equals the unblocked graph numerically.
// The cost model (layout_blocked.cc): an island stays blocked when its convs gain at least the
// bytes its boundary reorders move. Two 3x3 convs between two layers that cannot run blocked
// (Softmax): plain, each would reorder its X and Y itself (gain 2 x (x + a) + 2 x (a + c) bytes),
// blocked the island pays one reorder in and one out (2 x x + 2 x c): it stays blocked.
TEST(LayoutBlocked, ByCostAnIslandOfConvsStaysBlocked) {
  GraphBuilder b(13);
  b.input("x", {1, 32, 9, 11}).output("y");
  b.init("w1", random_tensor({32, 32, 3, 3}, 1)).init("w2", random_tensor({32, 32, 3, 3}, 2));
  b.node("Softmax", {"x"}, {"s"});
  conv(b, "s", "w1", "a", 1);
  b.node("Relu", {"a"}, {"r"});
  conv(b, "r", "w2", "c", 1);
  b.node("Softmax", {"c"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, blocked16_by_cost, &changed);
  const ir::Graph& g = *after.graph;
  EXPECT_EQ(changed, 3);  // 2 convs, Relu
  EXPECT_EQ(count_kiln(g, "BlockedConv"), 2);
  EXPECT_EQ(count_kiln(g, "ReorderToBlocked"), 1);
  EXPECT_EQ(count_kiln(g, "ReorderFromBlocked"), 1);
  EXPECT_LT(max_abs_diff(before, after), 1e-5);
  // One 3x3 conv alone between them: its own reorders equal the island's (a tie stays blocked).
  GraphBuilder b1(13);
  b1.input("x", {1, 32, 9, 11}).output("y");
  b1.init("w1", random_tensor({48, 32, 3, 3}, 1));
  b1.node("Softmax", {"x"}, {"s"});
  conv(b1, "s", "w1", "a", 1);
  b1.node("Softmax", {"a"}, {"y"});
  ir::Model lone = b1.finish();
  ir::Model lone_after = apply_pass(lone, blocked16_by_cost, &changed);
  EXPECT_EQ(changed, 1);
  EXPECT_EQ(count_kiln(*lone_after.graph, "BlockedConv"), 1);
}

// A depthwise conv and an unpadded 1x1 conv (kernels kiln runs on NCHW directly: they gain no
// reorder blocked) between layers that cannot run blocked (ConvNeXt's depthwise conv between its
// residual Add and a Transpose): blocked they would cost a reorder on each side, so they stay plain,
// and nothing changes. Without the cost model they go blocked, as before.
TEST(LayoutBlocked, ByCostAConvWithAPlainKernelBetweenPlainLayersStaysPlain) {
  GraphBuilder b(13);
  b.input("x", {1, 32, 9, 11}).output("y");
  b.init("wd", random_tensor({32, 1, 7, 7}, 1)).init("w1", random_tensor({32, 32, 1, 1}, 2));
  b.node("Softmax", {"x"}, {"s"});
  auto& dw = conv(b, "s", "wd", "d", 3);
  GraphBuilder::set_int(dw, "group", 32);
  auto& t = b.node("Transpose", {"d"}, {"t"});
  GraphBuilder::set_ints(t, "perm", {0, 1, 3, 2});
  conv(b, "t", "w1", "p", 0);
  b.node("Softmax", {"p"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, blocked16_by_cost, &changed);
  EXPECT_EQ(changed, 0);
  EXPECT_EQ(count_kiln(*after.graph, "BlockedConv"), 0);
  EXPECT_EQ(count_kiln(*after.graph, "ReorderToBlocked"), 0);
  EXPECT_EQ(count_kiln(*after.graph, "ReorderFromBlocked"), 0);
  EXPECT_EQ(count_op(*after.graph, "Conv"), 2);
  ir::Model always = apply_pass(before, blocked16, &changed);
  EXPECT_EQ(changed, 2);
  EXPECT_EQ(count_kiln(*always.graph, "ReorderToBlocked"), 2);
  EXPECT_EQ(count_kiln(*always.graph, "ReorderFromBlocked"), 2);
  EXPECT_LT(max_abs_diff(before, always), 1e-5);
  // The same depthwise conv followed by a 3x3 conv (whose own reorders pay for the island's) in one
  // island: both go blocked.
  GraphBuilder b2(13);
  b2.input("x", {1, 32, 9, 11}).output("y");
  b2.init("wd", random_tensor({32, 1, 7, 7}, 1)).init("w3", random_tensor({32, 32, 3, 3}, 2));
  b2.node("Softmax", {"x"}, {"s"});
  auto& dw2 = conv(b2, "s", "wd", "d", 3);
  GraphBuilder::set_int(dw2, "group", 32);
  conv(b2, "d", "w3", "c", 1);
  b2.node("Softmax", {"c"}, {"y"});
  ir::Model before2 = b2.finish();
  ir::Model after2 = apply_pass(before2, blocked16_by_cost, &changed);
  EXPECT_EQ(changed, 2);
  EXPECT_EQ(count_kiln(*after2.graph, "BlockedConv"), 2);
  EXPECT_LT(max_abs_diff(before2, after2), 1e-5);
}

TEST(LayoutBlocked, FollowsTheTargetsBlock) {
  Target avx2, avx512, plain, cuda;
  avx2.isa = kIsaAvx2, avx2.layout_block = 8;
  avx512.isa = kIsaAvx2 | kIsaAvx512, avx512.layout_block = 16;
  plain.isa = kIsaAvx2 | kIsaAvx512, plain.layout_block = 0;
  cuda.device.kind = DeviceKind::kCUDA, cuda.layout_block = 16;
  auto blocks = [](const ir::Graph& g) {
    std::set<int64_t> b;
    for (const auto& n : g.nodes)
      if (n.domain == "kiln" && n.op_type == "BlockedConv") b.insert(n.attr_int("block", 0));
    return b;
  };
  ir::Model m8 = clone(small_resnet()), m16 = clone(small_resnet()), m0 = clone(small_resnet()),
            mc = clone(small_resnet());
  ASSERT_TRUE(passes::optimize(m8, {}, avx2).ok());
  ASSERT_TRUE(passes::optimize(m16, {}, avx512).ok());
  ASSERT_TRUE(passes::optimize(m0, {}, plain).ok());
  ASSERT_TRUE(passes::optimize(mc, {}, cuda).ok());
  EXPECT_EQ(blocks(*m8.graph), std::set<int64_t>{8});
  EXPECT_EQ(blocks(*m16.graph), std::set<int64_t>{16});
  EXPECT_EQ(count_kiln(*m8.graph, "BlockedConv"), 3);
  EXPECT_EQ(count_kiln(*m16.graph, "BlockedConv"), 3);
  EXPECT_EQ(count_kiln(*m0.graph, "BlockedConv"), 0);
  EXPECT_EQ(count_kiln(*mc.graph, "BlockedConv"), 0);
  EXPECT_EQ(max_abs_diff(m8, m0), 0.0);
  EXPECT_EQ(max_abs_diff(m16, m0), 0.0);
}

}  // namespace
}  // namespace kiln
