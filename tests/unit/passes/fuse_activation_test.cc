// fuse_activation: Conv/Gemm/MatMul + residual Add + activation become one kiln.Fused* node.
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

// Conv(x) -> activation built by `act` -> y; returns the model.
template <typename F>
ir::Model conv_then(F act, int opset = 17) {
  GraphBuilder b(opset);
  b.input("x", {1, 3, 6, 6}).output("y");
  b.init("w", random_tensor({4, 3, 3, 3}, 1)).init("b", random_tensor({4}, 2));
  GraphBuilder::set_ints(b.node("Conv", {"x", "w", "b"}, {"c"}), "pads", {1, 1, 1, 1});
  act(b);
  return b.finish();
}

void expect_one_fused(const ir::Model& before, const std::string& op, const std::string& act, double tol = 0) {
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_activation, &changed);
  EXPECT_GE(changed, 1);
  ASSERT_EQ(after.graph->nodes.size(), 1u) << act;
  const ir::Node& n = after.graph->nodes[0];
  EXPECT_EQ(n.domain, "kiln");
  EXPECT_EQ(n.op_type, op);
  EXPECT_EQ(n.attr_string("activation", ""), act);
  EXPECT_EQ(n.outputs[0], "y");
  double d = max_abs_diff(before, after);
  if (tol == 0)
    EXPECT_EQ(d, 0.0) << act;
  else
    EXPECT_LT(d, tol) << act;
}

TEST(FuseActivation, ConvWithEachActivation) {
  for (const char* op : {"Relu", "Sigmoid", "Tanh", "HardSwish"})
    expect_one_fused(conv_then([&](GraphBuilder& b) { b.node(op, {"c"}, {"y"}); }), "FusedConv", op);
  expect_one_fused(
      conv_then([](GraphBuilder& b) { GraphBuilder::set_float(b.node("LeakyRelu", {"c"}, {"y"}), "alpha", 0.2f); }),
      "FusedConv", "LeakyRelu");
  expect_one_fused(conv_then([](GraphBuilder& b) {
                     b.init("lo", scalar_f(0.0f)).init("hi", scalar_f(6.0f));
                     b.node("Clip", {"c", "lo", "hi"}, {"y"});
                   }),
                   "FusedConv", "Clip");
  expect_one_fused(conv_then(
                       [](GraphBuilder& b) {
                         auto& c = b.node("Clip", {"c"}, {"y"});
                         GraphBuilder::set_float(c, "max", 0.5f);
                       },
                       9),
                   "FusedConv", "Clip");
  expect_one_fused(conv_then([](GraphBuilder& b) {
                     b.node("Sigmoid", {"c"}, {"s"});
                     b.node("Mul", {"s", "c"}, {"y"});
                   }),
                   "FusedConv", "SiLU");
  expect_one_fused(conv_then([](GraphBuilder& b) { kiln_op(b, "Gelu", {"c"}, {"y"}); }), "FusedConv", "Gelu");
  expect_one_fused(conv_then([](GraphBuilder& b) { b.node("Gelu", {"c"}, {"y"}); }, 20), "FusedConv", "Gelu");
}

TEST(FuseActivation, GemmAndMatMulAndFusedMatMul) {
  {
    GraphBuilder b(13);
    b.input("a", {3, 4}).output("y").init("w", random_tensor({5, 4}, 1)).init("c", random_tensor({5}, 2));
    auto& g = b.node("Gemm", {"a", "w", "c"}, {"g"});
    GraphBuilder::set_int(g, "transB", 1);
    GraphBuilder::set_float(g, "alpha", 0.5f);
    b.node("Relu", {"g"}, {"y"});
    expect_one_fused(b.finish(), "FusedGemm", "Relu");
  }
  {
    GraphBuilder b(13);
    b.input("a", {2, 3, 4}).output("y").init("w", random_tensor({4, 5}, 1));
    b.node("MatMul", {"a", "w"}, {"m"});
    b.node("Tanh", {"m"}, {"y"});
    expect_one_fused(b.finish(), "FusedMatMul", "Tanh");
  }
  {
    GraphBuilder b(13);
    b.input("a", {2, 3, 4}).output("y").init("w", random_tensor({4, 5}, 1)).init("bias", random_tensor({5}, 2));
    kiln_op(b, "FusedMatMul", {"a", "w", "bias"}, {"m"});
    ir::Attribute tanh;
    tanh.type = ir::Attribute::Type::kString;
    tanh.s = "tanh";
    kiln_op(b, "Gelu", {"m"}, {"y"}).attrs["approximate"] = tanh;
    expect_one_fused(b.finish(), "FusedMatMul", "Gelu");
  }
}

TEST(FuseActivation, ResidualAddThenRelu) {
  // A ResNet block's end: Conv -> Add(identity) -> Relu.
  GraphBuilder b(13);
  b.input("x", {1, 4, 5, 5}).output("y");
  b.init("w", random_tensor({4, 4, 3, 3}, 1)).init("b", random_tensor({4}, 2));
  GraphBuilder::set_ints(b.node("Conv", {"x", "w", "b"}, {"c"}), "pads", {1, 1, 1, 1});
  b.node("Add", {"x", "c"}, {"s"});
  b.node("Relu", {"s"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_activation, &changed);
  EXPECT_EQ(changed, 2);  // residual, then activation
  ASSERT_EQ(after.graph->nodes.size(), 1u);
  const ir::Node& n = after.graph->nodes[0];
  EXPECT_EQ(n.op_type, "FusedConv");
  ASSERT_EQ(n.inputs.size(), 4u);
  EXPECT_EQ(n.inputs[3], "x");
  EXPECT_EQ(n.attr_string("activation", ""), "Relu");
  EXPECT_EQ(ir::sources_of(n).size(), 3u);
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(FuseActivation, LeavesSharedOutputsAndNonConstantBoundsAlone) {
  {  // the Conv output is read twice
    ir::Model m = conv_then([](GraphBuilder& b) {
      b.node("Relu", {"c"}, {"r"});
      b.node("Add", {"r", "c"}, {"y"});
    });
    EXPECT_EQ(passes::fuse_activation(*m.graph).value(), 0);
  }
  {  // Clip with a bound computed at run time
    ir::Model m = conv_then([](GraphBuilder& b) {
      b.init("hi", scalar_f(6.0f));
      b.node("Neg", {"hi"}, {"lo"});
      b.node("Clip", {"c", "lo", "hi"}, {"y"});
    });
    m.graph->initializers.erase("hi");
    m.graph->inputs.push_back({"hi", ir::TypeInfo::tensor(DataType::kFloat32, SymShape::from_dims({}))});
    EXPECT_EQ(passes::fuse_activation(*m.graph).value(), 0);
  }
  {  // a residual that broadcasts the Conv output up
    GraphBuilder b(13);
    b.input("x", {1, 3, 4, 4}).input("r", {2, 4, 4, 4}).output("y");
    b.init("w", random_tensor({4, 3, 1, 1}, 1));
    b.node("Conv", {"x", "w"}, {"c"});
    b.node("Add", {"c", "r"}, {"y"});
    ir::Model m = b.finish();
    EXPECT_EQ(passes::fuse_activation(*m.graph).value(), 0);
  }
}

}  // namespace
}  // namespace kiln
