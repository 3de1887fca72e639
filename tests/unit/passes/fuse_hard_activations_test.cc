// fuse_hard_activations: HardSwish / HardSigmoid written with HardSigmoid + Mul or Add + Clip + Div
// become the single op (and then, through fuse_activation, a conv's epilogue); near misses stay.
#include "engine/target.h"
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

// x in [-5, 5]: both clamps of the hard activations are reached.
GraphBuilder& wide_input(GraphBuilder& b, Dims dims = {2, 5, 3, 3}) {
  b.input("in", std::move(dims)).init("five", scalar_f(5.0f));
  b.node("Mul", {"in", "five"}, {"x"});
  return b;
}

// Applies the pass, expects `changed` sites, and checks the numbers against the unfused graph.
ir::Model fused(const ir::Model& before, int want_changed) {
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_hard_activations, &changed);
  EXPECT_EQ(changed, want_changed);
  EXPECT_LT(max_abs_diff(before, after), 2e-6);
  return after;
}

void clip06(GraphBuilder& b, int opset, const std::string& in, const std::string& out, float hi = 6.0f) {
  if (opset >= 11) {
    b.init("zero", scalar_f(0.0f)).init("hi", scalar_f(hi));
    b.node("Clip", {in, "zero", "hi"}, {out});
  } else {
    ir::Node& c = b.node("Clip", {in}, {out});
    GraphBuilder::set_float(c, "min", 0.0f);
    GraphBuilder::set_float(c, "max", hi);
  }
}

TEST(FuseHardActivations, MulByHardSigmoidIsHardSwish) {
  for (bool x_first : {true, false}) {
    GraphBuilder b(11);
    wide_input(b).output("y");
    GraphBuilder::set_float(b.node("HardSigmoid", {"x"}, {"h"}), "alpha", 1.0f / 6.0f);
    b.node("Mul", x_first ? std::vector<std::string>{"x", "h"} : std::vector<std::string>{"h", "x"}, {"y"});
    ir::Model after = fused(b.finish(), 1);
    const ir::Node* hs = find_op(*after.graph, "HardSwish");
    ASSERT_NE(hs, nullptr);
    EXPECT_EQ(hs->opset, 14);
    EXPECT_EQ(hs->inputs[0], "x");
    EXPECT_EQ(hs->outputs[0], "y");
    EXPECT_EQ(after.graph->nodes.size(), 2u);  // the input scaling and HardSwish
  }
}

TEST(FuseHardActivations, HardSigmoidNearMissesStay) {
  // Default alpha (0.2): not HardSwish's 1/6.
  {
    GraphBuilder b(11);
    wide_input(b).output("y");
    b.node("HardSigmoid", {"x"}, {"h"});
    b.node("Mul", {"x", "h"}, {"y"});
    fused(b.finish(), 0);
  }
  // Mul by another value than the HardSigmoid's input.
  {
    GraphBuilder b(11);
    wide_input(b).output("y");
    b.node("Relu", {"x"}, {"r"});
    GraphBuilder::set_float(b.node("HardSigmoid", {"x"}, {"h"}), "alpha", 1.0f / 6.0f);
    b.node("Mul", {"r", "h"}, {"y"});
    fused(b.finish(), 0);
  }
  // The HardSigmoid is also a graph output (a squeeze-excite scale read twice).
  {
    GraphBuilder b(11);
    wide_input(b).output("y").output("h");
    GraphBuilder::set_float(b.node("HardSigmoid", {"x"}, {"h"}), "alpha", 1.0f / 6.0f);
    b.node("Mul", {"x", "h"}, {"y"});
    fused(b.finish(), 0);
  }
}

TEST(FuseHardActivations, ClipOverSixIsHardSigmoid) {
  for (int opset : {10, 13}) {
    for (bool div : {true, false}) {
      GraphBuilder b(opset);
      wide_input(b).output("y");
      b.init("three", scalar_f(3.0f)).init("six", scalar_f(6.0f)).init("sixth", scalar_f(1.0f / 6.0f));
      b.node("Add", {"three", "x"}, {"a"});
      clip06(b, opset, "a", "c");
      b.node(div ? "Div" : "Mul", {"c", div ? "six" : "sixth"}, {"y"});
      ir::Model after = fused(b.finish(), 1);
      const ir::Node* h = find_op(*after.graph, "HardSigmoid");
      ASSERT_NE(h, nullptr) << opset << div;
      EXPECT_NEAR(h->attr_float("alpha", 0), 1.0 / 6.0, 1e-7);
      EXPECT_EQ(h->attr_float("beta", 0), 0.5f);
      EXPECT_EQ(after.graph->nodes.size(), 2u);
    }
  }
}

TEST(FuseHardActivations, DecomposedHardSwishInEachGrouping) {
  // 0: (x * c) / 6   1: (c * x) * (1/6)   2: x * (c / 6)   3: (c * (1/6)) * x
  for (int form = 0; form < 4; ++form) {
    GraphBuilder b(13);
    wide_input(b).output("y");
    b.init("three", scalar_f(3.0f)).init("six", scalar_f(6.0f)).init("sixth", scalar_f(1.0f / 6.0f));
    b.node("Add", {"x", "three"}, {"a"});
    clip06(b, 13, "a", "c");
    if (form == 0) b.node("Mul", {"x", "c"}, {"p"}), b.node("Div", {"p", "six"}, {"y"});
    if (form == 1) b.node("Mul", {"c", "x"}, {"p"}), b.node("Mul", {"p", "sixth"}, {"y"});
    if (form == 2) b.node("Div", {"c", "six"}, {"s"}), b.node("Mul", {"x", "s"}, {"y"});
    if (form == 3) b.node("Mul", {"c", "sixth"}, {"s"}), b.node("Mul", {"s", "x"}, {"y"});
    ir::Model after = fused(b.finish(), 1);
    EXPECT_EQ(count_op(*after.graph, "HardSwish"), 1) << form;
    EXPECT_EQ(after.graph->nodes.size(), 2u) << form;
    const ir::Node* hs = find_op(*after.graph, "HardSwish");
    ASSERT_NE(hs, nullptr);
    EXPECT_EQ(ir::sources_of(*hs).size(), 4u);  // Add, Clip, Mul, Div
  }
}

TEST(FuseHardActivations, DecomposedNearMissesStay) {
  struct Case {
    const char* what;
    float three, hi, six;
    bool extra_reader;
  };
  for (Case k : {Case{"Clip max 5", 3.f, 5.f, 6.f, false}, Case{"x + 2.9", 2.9f, 6.f, 6.f, false},
                 Case{"/ 5", 3.f, 6.f, 5.f, false}, Case{"Add read twice", 3.f, 6.f, 6.f, true}}) {
    GraphBuilder b(13);
    wide_input(b).output("y");
    b.init("three", scalar_f(k.three)).init("six", scalar_f(k.six));
    b.node("Add", {"x", "three"}, {"a"});
    clip06(b, 13, "a", "c", k.hi);
    b.node("Mul", {"x", "c"}, {"p"});
    if (k.extra_reader) {
      b.node("Div", {"p", "six"}, {"d"});
      b.node("Add", {"d", "a"}, {"y"});
    } else {
      b.node("Div", {"p", "six"}, {"y"});
    }
    ir::Model after = fused(b.finish(), 0);
    EXPECT_EQ(count_op(*after.graph, "HardSwish") + count_op(*after.graph, "HardSigmoid"), 0) << k.what;
  }
  // A [1, 5, 1, 1] constant 3 broadcasts like a scalar over x's shape but is not one: per-channel
  // constants are left alone.
  {
    GraphBuilder b(13);
    wide_input(b).output("y");
    Tensor three(DataType::kFloat32, {1, 5, 1, 1});
    for (int i = 0; i < 5; ++i) three.data<float>()[i] = 3.0f;
    b.init("three", three).init("six", scalar_f(6.0f));
    b.node("Add", {"x", "three"}, {"a"});
    clip06(b, 13, "a", "c");
    b.node("Mul", {"x", "c"}, {"p"});
    b.node("Div", {"p", "six"}, {"y"});
    fused(b.finish(), 0);
  }
}

// The whole pipeline: a conv followed by an opset-11 HardSwish, and a squeeze-excite style
// conv -> HardSigmoid, each become one kiln.FusedConv with the activation in its epilogue.
TEST(FuseHardActivations, ConvEpilogueThroughThePipeline) {
  GraphBuilder b(11);
  b.input("x", {2, 3, 7, 7}).output("y").output("z");
  b.init("w", random_tensor({5, 3, 3, 3}, 1, DataType::kFloat32, -2, 2)).init("b", random_tensor({5}, 2));
  b.init("w2", random_tensor({6, 5, 1, 1}, 3, DataType::kFloat32, -2, 2));
  GraphBuilder::set_ints(b.node("Conv", {"x", "w", "b"}, {"c"}), "pads", {1, 1, 1, 1});
  GraphBuilder::set_float(b.node("HardSigmoid", {"c"}, {"h"}), "alpha", 1.0f / 6.0f);
  b.node("Mul", {"c", "h"}, {"y"});
  b.node("Conv", {"y", "w2"}, {"c2"});
  ir::Node& hs = b.node("HardSigmoid", {"c2"}, {"z"});
  GraphBuilder::set_float(hs, "alpha", 0.25f);
  GraphBuilder::set_float(hs, "beta", 0.4f);
  ir::Model before = b.finish();
  ir::Model after = clone(before);
  auto stats = passes::optimize(after, {"layout_blocked"}, engine::host_target());
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  const ir::Graph& g = *after.graph;
  ASSERT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.nodes[0].attr_string("activation", ""), "HardSwish");
  EXPECT_EQ(g.nodes[1].attr_string("activation", ""), "HardSigmoid");
  EXPECT_EQ(g.nodes[1].attr_float("activation_alpha", 0), 0.25f);
  EXPECT_EQ(g.nodes[1].attr_float("activation_beta", 0), 0.4f);
  EXPECT_LT(max_abs_diff(before, after), 1e-5);
}

}  // namespace
}  // namespace kiln
