// fuse_gelu: erf and tanh GELUs in the operand orders exporters emit become kiln.Gelu.
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

// torch (opset < 20): Mul(Mul(x, Add(Erf(Div(x, sqrt2)), 1)), 0.5)
void torch_erf_gelu(GraphBuilder& b, const std::string& x, const std::string& y) {
  b.init("sqrt2", scalar_f(1.41421356f)).init("one", scalar_f(1.0f)).init("half", scalar_f(0.5f));
  b.node("Div", {x, "sqrt2"}, {"g_div"});
  b.node("Erf", {"g_div"}, {"g_erf"});
  b.node("Add", {"g_erf", "one"}, {"g_add"});
  b.node("Mul", {x, "g_add"}, {"g_mul"});
  b.node("Mul", {"g_mul", "half"}, {y});
}

TEST(FuseGelu, TorchErfForm) {
  GraphBuilder b(13);
  b.input("x", {2, 3, 8}).output("y");
  b.node("Relu", {"x"}, {"r"});
  torch_erf_gelu(b, "r", "y");
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_gelu, &changed);
  EXPECT_EQ(changed, 1);
  ASSERT_EQ(after.graph->nodes.size(), 2u);
  EXPECT_EQ(count_kiln(*after.graph, "Gelu"), 1);
  const ir::Node* g = find_op(*after.graph, "Gelu");
  EXPECT_EQ(g->attr_string("approximate", ""), "none");
  EXPECT_EQ(g->inputs[0], "r");
  EXPECT_EQ(ir::sources_of(*g).size(), 5u);  // Div, Erf, Add, Mul, Mul
  EXPECT_LT(max_abs_diff(before, after), 1e-6);
}

TEST(FuseGelu, HalfTimesXTimesOnePlusErfOfScaledX) {
  // 0.5 * x * (1 + erf(x * 0.70710678)), constants on the left.
  GraphBuilder b(13);
  b.input("x", {4, 16}).output("y");
  b.init("half", scalar_f(0.5f)).init("one", scalar_f(1.0f)).init("rs2", scalar_f(0.70710678f));
  b.node("Mul", {"half", "x"}, {"hx"});
  b.node("Mul", {"x", "rs2"}, {"xs"});
  b.node("Erf", {"xs"}, {"e"});
  b.node("Add", {"one", "e"}, {"ope"});
  b.node("Mul", {"hx", "ope"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_gelu, &changed);
  EXPECT_EQ(changed, 1);
  ASSERT_EQ(after.graph->nodes.size(), 1u);
  EXPECT_EQ(after.graph->nodes[0].op_type, "Gelu");
  EXPECT_EQ(after.graph->nodes[0].outputs[0], "y");  // graph output name kept
  EXPECT_LT(max_abs_diff(before, after), 1e-6);
}

TEST(FuseGelu, TorchTanhForm) {
  // 0.5 * (x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * (x * (x * x))))))
  GraphBuilder b(13);
  b.input("x", {3, 10}).output("y");
  b.init("beta", scalar_f(0.7978845608f)).init("kappa", scalar_f(0.044715f));
  b.init("one", scalar_f(1.0f)).init("half", scalar_f(0.5f));
  b.node("Mul", {"x", "x"}, {"x2"});
  b.node("Mul", {"x", "x2"}, {"x3"});
  b.node("Mul", {"kappa", "x3"}, {"kx3"});
  b.node("Add", {"x", "kx3"}, {"inner"});
  b.node("Mul", {"beta", "inner"}, {"arg"});
  b.node("Tanh", {"arg"}, {"t"});
  b.node("Add", {"one", "t"}, {"opt"});
  b.node("Mul", {"x", "opt"}, {"xo"});
  b.node("Mul", {"half", "xo"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_gelu, &changed);
  EXPECT_EQ(changed, 1);
  ASSERT_EQ(after.graph->nodes.size(), 1u);
  EXPECT_EQ(after.graph->nodes[0].attr_string("approximate", ""), "tanh");
  EXPECT_LT(max_abs_diff(before, after), 1e-6);
}

TEST(FuseGelu, PowCubeVariant) {
  GraphBuilder b(13);
  b.input("x", {3, 10}).output("y");
  b.init("three", scalar_f(3.0f)).init("kappa", scalar_f(0.044715f)).init("beta", scalar_f(0.7978845608f));
  b.init("one", scalar_f(1.0f)).init("half", scalar_f(0.5f));
  b.node("Pow", {"x", "three"}, {"x3"});
  b.node("Mul", {"x3", "kappa"}, {"kx3"});
  b.node("Add", {"x", "kx3"}, {"inner"});
  b.node("Mul", {"inner", "beta"}, {"arg"});
  b.node("Tanh", {"arg"}, {"t"});
  b.node("Add", {"t", "one"}, {"opt"});
  b.node("Mul", {"x", "half"}, {"hx"});
  b.node("Mul", {"hx", "opt"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_gelu, &changed);
  EXPECT_EQ(changed, 1);
  EXPECT_EQ(after.graph->nodes.size(), 1u);
  EXPECT_LT(max_abs_diff(before, after), 1e-6);
}

TEST(FuseGelu, OnnxFunctionBodyAfterConstantFolding) {
  // ONNX's Gelu function: constants go through CastLike(c, x), sqrt(2) is computed, 1 + erf is a Sum.
  GraphBuilder b(20);
  b.input("x", {7}).output("y");
  b.init("half", scalar_f(0.5f)).init("one", scalar_f(1.0f)).init("two", scalar_f(2.0f));
  b.node("CastLike", {"half", "x"}, {"half_c"});
  b.node("CastLike", {"one", "x"}, {"one_c"});
  b.node("CastLike", {"two", "x"}, {"two_c"});
  b.node("Sqrt", {"two_c"}, {"sqrt2"});
  b.node("Div", {"x", "sqrt2"}, {"xs"});
  b.node("Erf", {"xs"}, {"e"});
  b.node("Sum", {"one_c", "e"}, {"phi"});
  b.node("Mul", {"half_c", "x"}, {"hx"});
  b.node("Mul", {"hx", "phi"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model folded = apply_pass(before, passes::fold_constants, &changed);
  EXPECT_EQ(changed, 4);  // three CastLikes, then the Sqrt
  ir::Model after = apply_pass(folded, passes::fuse_gelu, &changed);
  EXPECT_EQ(changed, 1);
  ASSERT_EQ(after.graph->nodes.size(), 1u);
  EXPECT_EQ(count_kiln(*after.graph, "Gelu"), 1);
  EXPECT_LT(max_abs_diff(before, after), 1e-6);
}

TEST(FuseGelu, LeavesWrongConstantsAndSharedIntermediatesAlone) {
  {  // x / 1.5 is not x / sqrt(2)
    GraphBuilder b(13);
    b.input("x", {4}).output("y");
    b.init("c", scalar_f(1.5f)).init("one", scalar_f(1.0f)).init("half", scalar_f(0.5f));
    b.node("Div", {"x", "c"}, {"d"});
    b.node("Erf", {"d"}, {"e"});
    b.node("Add", {"e", "one"}, {"a"});
    b.node("Mul", {"x", "a"}, {"m"});
    b.node("Mul", {"m", "half"}, {"y"});
    ir::Model m = b.finish();
    EXPECT_EQ(passes::fuse_gelu(*m.graph).value(), 0);
    EXPECT_EQ(m.graph->nodes.size(), 5u);
  }
  {  // the Erf output is also a graph output
    GraphBuilder b(13);
    b.input("x", {4}).output("y").output("g_erf");
    torch_erf_gelu(b, "x", "y");
    ir::Model m = b.finish();
    EXPECT_EQ(passes::fuse_gelu(*m.graph).value(), 0);
  }
  {  // 0.25 * x * (1 + erf(...)) is not GELU
    GraphBuilder b(13);
    b.input("x", {4}).output("y");
    b.init("sqrt2", scalar_f(1.41421356f)).init("one", scalar_f(1.0f)).init("q", scalar_f(0.25f));
    b.node("Div", {"x", "sqrt2"}, {"d"});
    b.node("Erf", {"d"}, {"e"});
    b.node("Add", {"e", "one"}, {"a"});
    b.node("Mul", {"x", "a"}, {"m"});
    b.node("Mul", {"m", "q"}, {"y"});
    ir::Model m = b.finish();
    EXPECT_EQ(passes::fuse_gelu(*m.graph).value(), 0);
  }
}

}  // namespace
}  // namespace kiln
