// The pass pipeline on control-flow bodies: a Loop body's Conv + BatchNormalization + Relu (weights
// read from the main graph) is folded and fused, each If branch's MatMul + bias + GELU (constants as
// Constant nodes inside the branch) becomes one fused layer, the bodies keep their inputs, outputs and
// outer reads by name and type, and the optimized model computes what the original does.
#include "engine/target.h"
#include "ir/attribute_builders.h"
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

ir::Node make_node(const std::string& name, const std::string& op, std::vector<std::string> in,
                   std::vector<std::string> out) {
  ir::Node n;
  n.name = name;
  n.op_type = op;
  n.opset = 13;
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

ir::Node constant(const std::string& name, Tensor t) {
  ir::Node n = make_node(name, "Constant", {}, {name});
  ir::Attribute a;
  a.type = ir::Attribute::Type::kTensor;
  a.t = std::move(t);
  n.attrs["value"] = a;
  return n;
}

std::shared_ptr<ir::Graph> body(const std::string& name, std::vector<ir::Node> nodes, std::vector<std::string> outs,
                                std::vector<ir::ValueInfo> ins = {}) {
  auto g = std::make_shared<ir::Graph>();
  g->name = name;
  g->nodes = std::move(nodes);
  g->inputs = std::move(ins);
  for (auto& o : outs) g->outputs.push_back({o, ir::TypeInfo()});
  return g;
}

void set_parents(ir::Graph& g) {
  for (auto& n : g.nodes)
    for (auto& [k, a] : n.attrs)
      if (a.g) {
        a.g->parent = &g;
        set_parents(*a.g);
      }
}

// GraphBuilder::finish inferred the bodies before they knew their parents (outer types unknown).
void reinfer_with_parents(ir::Model& m) {
  set_parents(*m.graph);
  Status s = ops::infer_shapes(*m.graph);
  if (!s.ok()) throw std::runtime_error(s.to_string());
}

const ir::Graph& body_of(const ir::Graph& g, const std::string& op, const std::string& attr) {
  for (const auto& n : g.nodes)
    if (n.op_type == op) return *n.attrs.at(attr).g;
  throw std::runtime_error("no " + op);
}
const ir::Graph& body_of(const ir::Model& m, const std::string& op, const std::string& attr) {
  return body_of(*m.graph, op, attr);
}

std::vector<ops::Value> run_on(const ir::Model& m, const std::map<std::string, ops::Value>& in) {
  return testing::run(m, in);
}

double worst_diff(const std::vector<ops::Value>& a, const std::vector<ops::Value>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].tensor.shape() != b[i].tensor.shape()) return INFINITY;
    for (int64_t k = 0; k < a[i].tensor.numel(); ++k)
      worst = std::max(worst, std::fabs(a[i].tensor.get_f64(k) - b[i].tensor.get_f64(k)));
  }
  return worst;
}

// Loop (3 trips) carrying st [1, 16, 7, 9]: st -> Conv(w, outer) -> BatchNormalization (outer
// parameters) -> Relu -> Add(outer activation `xa`, not a constant) -> Mul(Constant 0.5) -> st; the
// Relu output is also a scan output, and `cond` passes through an Identity.
ir::Model loop_conv_bn_relu() {
  GraphBuilder b(13);
  b.input("x", {1, 16, 7, 9}).output("final").output("relus");
  b.init("w", random_tensor({16, 16, 3, 3}, 1, DataType::kFloat32, -0.1, 0.1));
  b.init("gamma", random_tensor({16}, 2, DataType::kFloat32, 0.5, 1.5));
  b.init("beta", random_tensor({16}, 3));
  b.init("mean", random_tensor({16}, 4));
  b.init("var", random_tensor({16}, 5, DataType::kFloat32, 0.5, 2));
  b.init("trips", Tensor::scalar<int64_t>(DataType::kInt64, 3));
  b.node("Sigmoid", {"x"}, {"xa"});
  auto i64 = ir::TypeInfo::tensor(DataType::kInt64, SymShape(std::vector<Dim>{}));
  auto bl = ir::TypeInfo::tensor(DataType::kBool, SymShape(std::vector<Dim>{}));
  auto f = ir::TypeInfo::tensor(DataType::kFloat32, SymShape::from_dims({1, 16, 7, 9}));
  ir::Node conv = make_node("lb_conv", "Conv", {"st", "w"}, {"c"});
  GraphBuilder::set_ints(conv, "pads", {1, 1, 1, 1});
  ir::Node bn = make_node("lb_bn", "BatchNormalization", {"c", "gamma", "beta", "mean", "var"}, {"n"});
  auto loop_body =
      body("loop_body",
           {conv, bn, make_node("lb_relu", "Relu", {"n"}, {"r"}), make_node("lb_add", "Add", {"r", "xa"}, {"s"}),
            constant("half", scalar_f(0.5f)), make_node("lb_mul", "Mul", {"s", "half"}, {"st2"}),
            make_node("lb_id", "Identity", {"cond"}, {"co"})},
           {"co", "st2", "r"}, {{"iter", i64}, {"cond", bl}, {"st", f}});
  ir::Node& loop = b.node("Loop", {"trips", "", "x"}, {"final", "relus"});
  loop.attrs["body"] = ir::attr_graph(loop_body);
  ir::Model m = b.finish();
  reinfer_with_parents(m);
  return m;
}

TEST(SubgraphPasses, LoopBodyConvBatchNormReluIsFoldedAndFused) {
  ir::Model before = loop_conv_bn_relu();
  ir::Model after = clone(before);
  set_parents(*after.graph);
  auto stats = passes::optimize(after, {}, engine::host_target());
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  const ir::Graph& lb = body_of(after, "Loop", "body");
  EXPECT_EQ(count_op(lb, "BatchNormalization"), 0);
  EXPECT_EQ(count_op(lb, "Relu"), 0);      // into the conv
  EXPECT_EQ(count_op(lb, "Constant"), 0);  // folded into an initializer
  EXPECT_EQ(count_op(lb, "Identity"), 1);  // cond -> co: a body input to a body output stays
  int convs = 0;
  for (const auto& n : lb.nodes) convs += n.domain == "kiln" && n.op_type.find("Conv") != std::string::npos;
  EXPECT_EQ(convs, 1);
  int bn_folds = 0;
  for (const auto& s : stats.value()) bn_folds += s.name == "fold_batch_norm" ? s.changed : 0;
  EXPECT_GE(bn_folds, 1);
  // The body's interface is unchanged: inputs and outputs by name and type; it still reads `xa`.
  const ir::Graph& lb0 = body_of(before, "Loop", "body");
  ASSERT_EQ(lb.inputs.size(), lb0.inputs.size());
  for (size_t i = 0; i < lb.inputs.size(); ++i) EXPECT_EQ(lb.inputs[i].name, lb0.inputs[i].name);
  ASSERT_EQ(lb.outputs.size(), lb0.outputs.size());
  for (size_t i = 0; i < lb.outputs.size(); ++i) {
    EXPECT_EQ(lb.outputs[i].name, lb0.outputs[i].name);
    EXPECT_EQ(lb.outputs[i].type.str(), lb0.outputs[i].type.str()) << lb.outputs[i].name;  // plain layout
  }
  auto refs = lb.outer_references();
  EXPECT_NE(std::find(refs.begin(), refs.end(), "xa"), refs.end());
  // The folded weights live in the body; the main graph no longer keeps the BatchNormalization's.
  EXPECT_FALSE(after.graph->initializers.count("gamma"));
  EXPECT_FALSE(after.graph->initializers.count("w"));
  for (uint64_t seed : {7u, 8u}) {
    std::map<std::string, ops::Value> in = {{"x", ops::Value(random_tensor({1, 16, 7, 9}, seed))}};
    EXPECT_LT(worst_diff(run_on(after, in), run_on(before, in)), 1e-4) << "seed " << seed;
  }
}

// 0.5 * y * (1 + erf(y / sqrt2)) with y = MatMul(x, W) + b, constants as Constant nodes of the branch.
std::shared_ptr<ir::Graph> matmul_gelu_branch(const std::string& p, const std::string& w, const std::string& bias) {
  return body(
      p,
      {make_node(p + "_mm", "MatMul", {"x", w}, {p + "_m"}), make_node(p + "_b", "Add", {p + "_m", bias}, {p + "_y"}),
       constant(p + "_sqrt2", scalar_f(1.41421356f)), constant(p + "_one", scalar_f(1.0f)),
       constant(p + "_half", scalar_f(0.5f)), make_node(p + "_div", "Div", {p + "_y", p + "_sqrt2"}, {p + "_d"}),
       make_node(p + "_erf", "Erf", {p + "_d"}, {p + "_e"}),
       make_node(p + "_add", "Add", {p + "_e", p + "_one"}, {p + "_a"}),
       make_node(p + "_mul", "Mul", {p + "_y", p + "_a"}, {p + "_ya"}),
       make_node(p + "_mul2", "Mul", {p + "_ya", p + "_half"}, {p + "_out"})},
      {p + "_out"});
}

ir::Model if_matmul_gelu() {
  GraphBuilder b(13);
  b.input("x", {5, 24}).input("c", {}, DataType::kBool).output("y");
  b.init("w1", random_tensor({24, 12}, 11, DataType::kFloat32, -0.3, 0.3)).init("b1", random_tensor({12}, 12));
  b.init("w2", random_tensor({24, 12}, 13, DataType::kFloat32, -0.3, 0.3)).init("b2", random_tensor({12}, 14));
  ir::Node& n = b.node("If", {"c"}, {"y"});
  n.attrs["then_branch"] = ir::attr_graph(matmul_gelu_branch("then", "w1", "b1"));
  n.attrs["else_branch"] = ir::attr_graph(matmul_gelu_branch("else", "w2", "b2"));
  ir::Model m = b.finish();
  reinfer_with_parents(m);
  return m;
}

TEST(SubgraphPasses, IfBranchesMatMulBiasGeluAreFused) {
  ir::Model before = if_matmul_gelu();
  ir::Model after = clone(before);
  set_parents(*after.graph);
  ASSERT_TRUE(passes::optimize(after, {}, engine::host_target()).ok());
  for (const char* branch : {"then_branch", "else_branch"}) {
    const ir::Graph& g = body_of(after, "If", branch);
    ASSERT_EQ(g.nodes.size(), 1u) << branch;
    EXPECT_EQ(g.nodes[0].domain, "kiln") << branch;
    EXPECT_EQ(g.nodes[0].op_type, "FusedMatMul") << branch;
    EXPECT_EQ(g.outputs[0].name, body_of(before, "If", branch).outputs[0].name);
  }
  for (bool c : {true, false}) {
    std::map<std::string, ops::Value> in = {{"x", ops::Value(random_tensor({5, 24}, 21))},
                                            {"c", ops::Value(Tensor::scalar<bool>(DataType::kBool, c))}};
    EXPECT_LT(worst_diff(run_on(after, in), run_on(before, in)), 1e-5) << "c=" << c;
  }
}

TEST(SubgraphPasses, DisabledPassesStayOffInBodies) {
  ir::Model after = if_matmul_gelu();
  after = clone(after);
  set_parents(*after.graph);
  ASSERT_TRUE(passes::optimize(after, {"fuse_gelu", "fuse_elementwise"}, engine::host_target()).ok());
  EXPECT_EQ(count_op(body_of(after, "If", "then_branch"), "Erf"), 1);
}

// Constant folding in a nested body: a Loop body holds an If whose then-branch computes k * 2 from the
// main graph's initializer k (two scopes up) and a Constant, so it folds; kin * 2 does not, since kin
// is also a main-graph input (the caller may override the initializer).
TEST(SubgraphPasses, NestedBodyFoldsOuterConstantsButNotOverridableInputs) {
  GraphBuilder b(13);
  b.input("x", {12}).input("c", {}, DataType::kBool).input("kin", {12}).output("out");
  b.init("k", random_tensor({12}, 31)).init("kin", random_tensor({12}, 32));
  b.init("trips", Tensor::scalar<int64_t>(DataType::kInt64, 2));
  auto then_g = body("then",
                     {constant("two", scalar_f(2.0f)), make_node("t_k2", "Mul", {"k", "two"}, {"k2"}),
                      make_node("t_kin2", "Mul", {"kin", "two"}, {"kin2"}),
                      make_node("t_a", "Add", {"st", "k2"}, {"ta"}), make_node("t_b", "Add", {"ta", "kin2"}, {"tb"})},
                     {"tb"});
  auto else_g = body("else", {make_node("e_neg", "Neg", {"st"}, {"en"})}, {"en"});
  ir::Node inner = make_node("inner_if", "If", {"c"}, {"st2"});
  inner.attrs["then_branch"] = ir::attr_graph(then_g);
  inner.attrs["else_branch"] = ir::attr_graph(else_g);
  auto i64 = ir::TypeInfo::tensor(DataType::kInt64, SymShape(std::vector<Dim>{}));
  auto bl = ir::TypeInfo::tensor(DataType::kBool, SymShape(std::vector<Dim>{}));
  auto f = ir::TypeInfo::tensor(DataType::kFloat32, SymShape::from_dims({12}));
  auto loop_body = body("loop", {inner, make_node("l_id", "Identity", {"cond"}, {"co"})}, {"co", "st2"},
                        {{"iter", i64}, {"cond", bl}, {"st", f}});
  ir::Node& loop = b.node("Loop", {"trips", "", "x"}, {"out"});
  loop.attrs["body"] = ir::attr_graph(loop_body);
  ir::Model before = b.finish();
  reinfer_with_parents(before);
  ir::Model after = clone(before);
  set_parents(*after.graph);
  ASSERT_TRUE(passes::optimize(after, {}, engine::host_target()).ok());
  const ir::Graph& lb = body_of(after, "Loop", "body");
  const ir::Graph& th = body_of(lb, "If", "then_branch");
  // k * 2 became a constant of the branch; kin * 2 is still computed (as a Mul or inside a fused chain).
  int reads_kin = 0, reads_k = 0;
  for (const auto& n : th.nodes)
    for (const auto& in : n.inputs) reads_kin += in == "kin", reads_k += in == "k";
  EXPECT_EQ(reads_k, 0);
  EXPECT_EQ(reads_kin, 1);
  EXPECT_EQ(count_op(th, "Constant"), 0);
  for (bool c : {true, false}) {
    std::map<std::string, ops::Value> in = {{"x", ops::Value(random_tensor({12}, 33))},
                                            {"c", ops::Value(Tensor::scalar<bool>(DataType::kBool, c))},
                                            {"kin", ops::Value(random_tensor({12}, 34))}};
    EXPECT_LT(worst_diff(run_on(after, in), run_on(before, in)), 1e-5) << "c=" << c;
  }
}

}  // namespace
}  // namespace kiln
