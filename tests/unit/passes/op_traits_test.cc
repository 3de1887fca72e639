// Op traits (ops/registry.h): the table for a sample of ops; each reader's former op list is
// exactly the set of ops declaring its trait (so switching to traits changed no behaviour); the
// facts themselves hold (kKeepsZero ops give 0 on 0, epilogues fuse and run as kiln.Fused*
// activations); and an op registered with a trait is picked up by the passes and the planner.
#include <set>

#include "engine/memory_planner.h"
#include "engine/tactics.h"
#include "ops/op_traits.h"
#include "ops/registry.h"
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT
namespace trait = ops::trait;

// "domain.op" ("Relu" for ONNX) of every op declaring any of the flags in t.
std::set<std::string> ops_with(uint32_t t) {
  std::set<std::string> out;
  const ops::OpTraitTable& r = ops::OpTraitTable::get();
  for (const auto& [domain, op] : r.ops())
    if (r.of(domain, op).has(t) && domain.rfind("kiln.test", 0) != 0)
      out.insert(domain.empty() ? op : domain + "." + op);
  return out;
}

TEST(OpTraits, TableForASampleOfOps) {
  const ops::OpTraitTable& r = ops::OpTraitTable::get();
  const ops::OpTraits& relu = r.of("", "Relu");
  EXPECT_TRUE(relu.has(trait::kElementwiseUnary));
  EXPECT_TRUE(relu.has(trait::kInPlace));
  EXPECT_TRUE(relu.has(trait::kKeepsZero));
  EXPECT_TRUE(relu.has(trait::kEpilogue));
  EXPECT_FALSE(relu.has(trait::kElementwiseBroadcast | trait::kView | trait::kShapeQuery));
  EXPECT_STREQ(relu.onednn_post_op, "eltwise_relu");
  EXPECT_EQ(r.of("ai.onnx", "Relu").bits, relu.bits);  // the ONNX domain's two spellings
  EXPECT_TRUE(r.of("", "Add").has(trait::kElementwiseBroadcast));
  EXPECT_FALSE(r.of("", "Add").has(trait::kElementwiseUnary | trait::kKeepsZero | trait::kEpilogue));
  EXPECT_FALSE(r.of("", "Exp").has(trait::kKeepsZero));   // exp(0) = 1
  EXPECT_FALSE(r.of("", "Clip").has(trait::kKeepsZero));  // the bounds may exclude 0
  EXPECT_TRUE(r.of("", "Clip").has(trait::kEpilogue));
  EXPECT_FALSE(r.of("", "Sigmoid").has(trait::kKeepsZero));
  EXPECT_TRUE(r.of("", "Reshape").has(trait::kView));
  EXPECT_TRUE(r.of("", "Shape").has(trait::kShapeQuery));
  EXPECT_FALSE(r.of("", "Shape").has(trait::kInPlace));
  EXPECT_TRUE(r.of("kiln", "Gelu").has(trait::kEpilogue));
  EXPECT_FALSE(r.of("kiln", "Gelu").has(trait::kInPlace));
  EXPECT_EQ(r.of("", "Conv").bits, 0u);
  EXPECT_EQ(r.of("", "NoSuchOp").bits, 0u);
  EXPECT_EQ(r.of("", "NoSuchOp").onednn_post_op, nullptr);
}

// The op lists the readers kept before the traits, verbatim.
TEST(OpTraits, CoverThePassesFormerOpListsExactly) {
  const std::set<std::string> fuse_elementwise_unary = {
      "Abs",       "Neg", "Exp",  "Log",         "Sqrt",      "Reciprocal", "Relu", "Sigmoid",  "Tanh",
      "Erf",       "Sin", "Cos",  "Floor",       "Ceil",      "Round",      "Sign", "Softplus", "Softsign",
      "LeakyRelu", "Elu", "Selu", "HardSigmoid", "HardSwish", "Clip",       "Gelu", "kiln.Gelu"};
  const std::set<std::string> fuse_elementwise_binary = {"Add",   "Sub", "Mul", "Div", "Pow",
                                                         "PRelu", "Max", "Min", "Sum"};
  EXPECT_EQ(ops_with(trait::kElementwiseUnary), fuse_elementwise_unary);
  // kiln.FusedElementwise is elementwise for layout_blocked; fuse_elementwise skips it (a body).
  std::set<std::string> broadcast = fuse_elementwise_binary;
  broadcast.insert("kiln.FusedElementwise");
  EXPECT_EQ(ops_with(trait::kElementwiseBroadcast), broadcast);
  // layout_blocked's is_elementwise_op: fuse_elementwise's set, kiln.Gelu and kiln.FusedElementwise.
  std::set<std::string> layout = fuse_elementwise_unary;
  layout.insert(broadcast.begin(), broadcast.end());
  EXPECT_EQ(ops_with(trait::kElementwiseUnary | trait::kElementwiseBroadcast), layout);
  // memory_planner's op_allows_in_place.
  const std::set<std::string> in_place = {"Relu",
                                          "Sigmoid",
                                          "Tanh",
                                          "Exp",
                                          "Log",
                                          "Abs",
                                          "Neg",
                                          "Sqrt",
                                          "Reciprocal",
                                          "Clip",
                                          "LeakyRelu",
                                          "Elu",
                                          "Selu",
                                          "Celu",
                                          "HardSigmoid",
                                          "HardSwish",
                                          "Erf",
                                          "Softplus",
                                          "Softsign",
                                          "Gelu",
                                          "Mish",
                                          "Sin",
                                          "Cos",
                                          "Floor",
                                          "Ceil",
                                          "Round",
                                          "Sign",
                                          "Add",
                                          "Sub",
                                          "Mul",
                                          "Div",
                                          "Pow",
                                          "Max",
                                          "Min",
                                          "Sum",
                                          "Mean",
                                          "PRelu",
                                          "Identity",
                                          "Dropout",
                                          "Reshape",
                                          "Flatten",
                                          "Squeeze",
                                          "Unsqueeze",
                                          "BatchNormalization",
                                          "kiln.FusedElementwise"};
  EXPECT_EQ(ops_with(trait::kInPlace), in_place);
  // fuse_activation's set_activation.
  EXPECT_EQ(ops_with(trait::kEpilogue), (std::set<std::string>{"Relu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid",
                                                               "LeakyRelu", "Gelu", "kiln.Gelu", "Clip"}));
  // engine::is_shape_work's ops that move no element; remove_noop_ops' reshapes (and Identity).
  EXPECT_EQ(
      ops_with(trait::kView | trait::kShapeQuery),
      (std::set<std::string>{"Shape", "Size", "Constant", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze"}));
  EXPECT_EQ(ops_with(trait::kView), (std::set<std::string>{"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze"}));
}

// kKeepsZero is a fact: the op's reference kernel gives 0 on 0 (default attributes).
TEST(OpTraits, KeepsZeroOpsGiveZeroOnZero) {
  int checked = 0;
  for (const std::string& name : ops_with(trait::kKeepsZero)) {
    GraphBuilder b(20);
    b.input("x", {1, 3}).output("y");
    ir::Node& n = b.node(name.rfind("kiln.", 0) == 0 ? name.substr(5) : name, {"x"}, {"y"});
    if (name.rfind("kiln.", 0) == 0) n.domain = "kiln", n.opset = 1;
    ir::Model m = b.finish();
    std::map<std::string, ops::Value> in;
    Tensor z(DataType::kFloat32, {1, 3});
    for (int64_t i = 0; i < 3; ++i) z.set_f64(i, 0.0);
    in["x"] = ops::Value(z);
    auto y = run(m, in);
    for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(y[0].tensor.get_f64(i), 0.0) << name;
    ++checked;
  }
  EXPECT_GE(checked, 15);
}

// kEpilogue is a fact: Conv -> op fuses into one kiln.FusedConv that computes the same.
TEST(OpTraits, EpilogueOpsFuseIntoTheConvAndMatch) {
  for (const std::string& name : ops_with(trait::kEpilogue)) {
    GraphBuilder b(20);
    b.input("x", {1, 4, 5, 5}).output("y");
    b.init("w", random_tensor({3, 4, 3, 3}, 2));
    b.conv({"x", "w"}, "c", 1);
    ir::Node& n = b.node(name.rfind("kiln.", 0) == 0 ? name.substr(5) : name, {"c"}, {"y"});
    if (name.rfind("kiln.", 0) == 0) n.domain = "kiln", n.opset = 1;
    ir::Model before = b.finish();
    int changed = 0;
    ir::Model after = apply_pass(before, passes::fuse_activation, &changed);
    EXPECT_EQ(changed, 1) << name;
    EXPECT_EQ(count_kiln(*after.graph, "FusedConv"), 1) << name;
    EXPECT_LT(max_abs_diff(before, after), 1e-5) << name;
  }
}

// A test op: y = x * x, elementwise.
Status infer_same(ops::InferContext& ctx) {
  ctx.set_output(0, ctx.input(0));
  return Status::Ok();
}
Status square_kernel(ops::KernelContext& ctx) {
  Tensor y = ctx.input(0);
  for (int64_t i = 0; i < y.numel(); ++i) y.set_f64(i, y.get_f64(i) * y.get_f64(i));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

void register_test_op(const std::string& op, uint32_t traits) {
  ops::OpRegistry& r = ops::OpRegistry::get();
  if (!r.knows("kiln.test", op)) r.add({"kiln.test", op, 1, infer_same, square_kernel, 1, 1});
  ops::OpTraitTable::get().add("kiln.test", op, {traits, nullptr});
}

ir::Node& test_op(GraphBuilder& b, const std::string& op, std::vector<std::string> in, std::vector<std::string> out) {
  ir::Node& n = b.node(op, std::move(in), std::move(out));
  n.domain = "kiln.test";
  n.opset = 1;
  return n;
}

TEST(OpTraits, AnOpDeclaredElementwiseIsFused) {
  auto model = [](const std::string& op) {
    GraphBuilder b(13);
    b.input("x", {2, 5}).output("y");
    b.node("Relu", {"x"}, {"r"});
    test_op(b, op, {"r"}, {"s"});
    b.node("Neg", {"s"}, {"y"});
    return b.finish();
  };
  register_test_op("SquarePlain", 0);
  int changed = 0;
  ir::Model plain = model("SquarePlain");
  apply_pass(plain, passes::fuse_elementwise, &changed);
  EXPECT_EQ(changed, 0);  // without the trait the chain is cut in the middle: single nodes stay

  register_test_op("SquareElementwise", trait::kElementwiseUnary);
  ir::Model before = model("SquareElementwise");
  ir::Model after = apply_pass(before, passes::fuse_elementwise, &changed);
  EXPECT_EQ(changed, 1);
  ASSERT_EQ(after.graph->nodes.size(), 1u);
  EXPECT_EQ(after.graph->nodes[0].attr("body")->g->nodes.size(), 3u);
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(OpTraits, AnOpDeclaredInPlaceSharesItsInputsBuffer) {
  register_test_op("SquareNotInPlace", 0);
  register_test_op("SquareInPlace", trait::kInPlace);
  for (const std::string op : {"SquareNotInPlace", "SquareInPlace"}) {
    const bool in_place = op == "SquareInPlace";
    GraphBuilder b(13);
    b.input("x", {4, 4}).output("y");
    b.node("Neg", {"x"}, {"a"});
    test_op(b, op, {"a"}, {"y"});  // a dies here
    ir::Model m = b.finish();
    EXPECT_EQ(engine::op_allows_in_place(m.graph->nodes[1]), in_place);
    auto plan = engine::plan_memory(*m.graph, [](const std::string&) { return std::optional<size_t>(64); });
    EXPECT_EQ(plan.in_place, in_place ? 1 : 0) << op;
    EXPECT_EQ(plan.offsets.at("y") == plan.offsets.at("a"), in_place) << op;
  }
}

TEST(OpTraits, AViewOrShapeQueryIsShapeWork) {
  GraphBuilder b(13);
  b.input("x", {64, 64}).output("y").output("s");
  b.init("shape", i64s({4096}));
  b.node("Reshape", {"x", "shape"}, {"y"});
  b.node("Shape", {"x"}, {"s"});
  b.node("Relu", {"x"}, {"r"});
  ir::Model m = b.finish();
  EXPECT_TRUE(engine::is_shape_work(*m.graph, m.graph->nodes[0]));
  EXPECT_TRUE(engine::is_shape_work(*m.graph, m.graph->nodes[1]));
  EXPECT_FALSE(engine::is_shape_work(*m.graph, m.graph->nodes[2]));  // 4096 floats
}

}  // namespace
}  // namespace kiln
