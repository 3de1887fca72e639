// fuse_layer_norm: decomposed layer normalizations (torch opset < 17 and variants) become
// kiln.LayerNormalization; normalizations over other axes stay.
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

struct LnOptions {
  int opset = 13;
  std::vector<int64_t> axes = {-1};
  bool gamma = true, beta = true;
  bool mul_square = false;  // Mul(d, d) instead of Pow(d, 2)
  bool reciprocal = false;  // Mul(d, Reciprocal(s)) instead of Div(d, s)
  Dims shape = {2, 5, 16};
};

GraphBuilder layer_norm(const LnOptions& o) {
  GraphBuilder b(o.opset);
  b.input("x", o.shape).output("y");
  int64_t h = o.shape.back();
  b.init("two", scalar_f(2.0f)).init("eps", scalar_f(1e-5f));
  b.init("gamma", random_tensor({h}, 7, DataType::kFloat32, 0.5, 1.5)).init("beta", random_tensor({h}, 8));
  auto mean = [&](const std::string& in, const std::string& out) {
    if (o.opset >= 18) {
      b.init("axes", i64s(o.axes));
      b.node("ReduceMean", {in, "axes"}, {out});
    } else {
      GraphBuilder::set_ints(b.node("ReduceMean", {in}, {out}), "axes", o.axes);
    }
  };
  mean("x", "mean");
  b.node("Sub", {"x", "mean"}, {"d"});
  if (o.mul_square)
    b.node("Mul", {"d", "d"}, {"sq"});
  else
    b.node("Pow", {"d", "two"}, {"sq"});
  mean("sq", "var");
  b.node("Add", {"var", "eps"}, {"ve"});
  b.node("Sqrt", {"ve"}, {"sd"});
  std::string last = o.gamma || o.beta ? "n" : "y";
  if (o.reciprocal) {
    b.node("Reciprocal", {"sd"}, {"rs"});
    b.node("Mul", {"rs", "d"}, {last});
  } else {
    b.node("Div", {"d", "sd"}, {last});
  }
  if (o.gamma) b.node("Mul", {last, "gamma"}, {o.beta ? "ng" : "y"});
  if (o.beta) b.node("Add", {"beta", o.gamma ? "ng" : last}, {"y"});
  return b;
}

void expect_fused(const LnOptions& o, size_t inputs) {
  ir::Model before = layer_norm(o).finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_layer_norm, &changed);
  EXPECT_EQ(changed, 1);
  ASSERT_EQ(after.graph->nodes.size(), 1u);
  const ir::Node& ln = after.graph->nodes[0];
  EXPECT_EQ(ln.domain, "kiln");
  EXPECT_EQ(ln.op_type, "LayerNormalization");
  EXPECT_EQ(ln.attr_int("axis", 0), -static_cast<int64_t>(o.axes.size()));
  EXPECT_FLOAT_EQ(ln.attr_float("epsilon", 0), 1e-5f);
  EXPECT_EQ(ln.inputs.size(), inputs);
  EXPECT_EQ(ln.outputs[0], "y");
  EXPECT_LT(max_abs_diff(before, after), 1e-5);
}

TEST(FuseLayerNorm, TorchOpset13WithGammaBeta) { expect_fused({}, 3); }

TEST(FuseLayerNorm, WithoutGammaAndBeta) {
  LnOptions o;
  o.gamma = o.beta = false;
  expect_fused(o, 1);
}

TEST(FuseLayerNorm, MulSquareReciprocalAndOnlyBeta) {
  LnOptions o;
  o.mul_square = o.reciprocal = true;
  o.gamma = false;
  expect_fused(o, 3);  // x, "", beta
}

TEST(FuseLayerNorm, Opset18AxesInputOverLastTwoDims) {
  LnOptions o;
  o.opset = 18;
  o.axes = {-2, 2};
  o.shape = {3, 4, 6};
  o.gamma = o.beta = false;
  expect_fused(o, 1);
}

TEST(FuseLayerNorm, LeavesOtherAxesAndSharedIntermediatesAlone) {
  {  // normalizing over axis 1 of a rank-3 tensor: not the last dims
    LnOptions o;
    o.axes = {1};
    o.gamma = o.beta = false;
    ir::Model m = layer_norm(o).finish();
    EXPECT_EQ(passes::fuse_layer_norm(*m.graph).value(), 0);
  }
  {  // the variance is also a graph output
    GraphBuilder b = layer_norm({});
    b.output("var");
    ir::Model m = b.finish();
    EXPECT_EQ(passes::fuse_layer_norm(*m.graph).value(), 0);
    EXPECT_EQ(count_op(*m.graph, "ReduceMean"), 2);
  }
  {  // a gamma varying along a non-normalized dim is not a LayerNormalization scale
    LnOptions o;
    o.beta = false;
    GraphBuilder b = layer_norm(o);
    ir::Model m = b.finish();
    m.graph->initializers["gamma"] = random_tensor({5, 16}, 9);
    ASSERT_TRUE(ops::infer_shapes(*m.graph).ok());
    int changed = 0;
    ir::Model after = apply_pass(m, passes::fuse_layer_norm, &changed);
    EXPECT_EQ(changed, 1);  // the normalization fuses, the Mul stays
    EXPECT_EQ(count_op(*after.graph, "Mul"), 1);
    EXPECT_LT(max_abs_diff(m, after), 1e-5);
  }
}

}  // namespace
}  // namespace kiln
