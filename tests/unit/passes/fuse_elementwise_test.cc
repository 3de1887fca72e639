// fuse_elementwise: trees of single-use elementwise nodes become one kiln.FusedElementwise.
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

TEST(FuseElementwise, FusesAChainWithConstantsAndSideInputs) {
  GraphBuilder b(13);
  b.input("x", {2, 3, 4}).input("z", {3, 1}).output("y");
  b.init("scale", random_tensor({4}, 1)).init("shift", scalar_f(0.25f));
  b.node("Mul", {"x", "scale"}, {"a"});
  b.node("Add", {"a", "shift"}, {"b"});
  b.node("Sub", {"b", "z"}, {"c"});
  b.node("Relu", {"c"}, {"d"});
  b.node("Sigmoid", {"d"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_elementwise, &changed);
  EXPECT_EQ(changed, 1);
  ASSERT_EQ(after.graph->nodes.size(), 1u);
  const ir::Node& f = after.graph->nodes[0];
  EXPECT_EQ(f.domain, "kiln");
  EXPECT_EQ(f.op_type, "FusedElementwise");
  EXPECT_EQ(f.inputs, (std::vector<std::string>{"x", "scale", "shift", "z"}));
  ASSERT_NE(f.attr("body"), nullptr);
  EXPECT_EQ(f.attr("body")->g->nodes.size(), 5u);
  EXPECT_EQ(ir::sources_of(f).size(), 5u);
  EXPECT_EQ(f.outputs[0], "y");
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(FuseElementwise, FusesATreeAndStopsAtSharedValues) {
  // y = Exp(x) * Tanh(x) + Neg(t) with t = Abs(x) also an output: Abs stays outside.
  GraphBuilder b(13);
  b.input("x", {5, 6}).output("y").output("t");
  b.node("Exp", {"x"}, {"e"});
  b.node("Tanh", {"x"}, {"h"});
  b.node("Mul", {"e", "h"}, {"m"});
  b.node("Abs", {"x"}, {"t"});
  b.node("Neg", {"t"}, {"n"});
  b.node("Add", {"m", "n"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_elementwise, &changed);
  EXPECT_EQ(changed, 1);
  EXPECT_EQ(after.graph->nodes.size(), 2u);
  EXPECT_EQ(count_op(*after.graph, "Abs"), 1);
  EXPECT_EQ(find_op(*after.graph, "FusedElementwise")->attr("body")->g->nodes.size(), 5u);
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(FuseElementwise, LeavesBroadcastUpAndSingleNodesAlone) {
  {  // Relu([3,1]) + [1,4] -> [3,4]: the Relu's output would be broadcast up
    GraphBuilder b(13);
    b.input("x", {3, 1}).input("z", {1, 4}).output("y");
    b.node("Relu", {"x"}, {"r"});
    b.node("Add", {"r", "z"}, {"y"});
    ir::Model m = b.finish();
    EXPECT_EQ(passes::fuse_elementwise(*m.graph).value(), 0);
  }
  {  // an intermediate read twice
    GraphBuilder b(13);
    b.input("x", {4}).output("y");
    b.node("Exp", {"x"}, {"e"});
    b.node("Mul", {"e", "e"}, {"y"});
    ir::Model m = b.finish();
    EXPECT_EQ(passes::fuse_elementwise(*m.graph).value(), 0);
  }
}

}  // namespace
}  // namespace kiln
