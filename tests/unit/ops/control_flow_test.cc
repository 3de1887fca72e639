// If / Loop / Scan and the sequence and optional ops: exact values through the interpreter,
// inference of branch merges and of loop-carried values that change shape, error paths.
#include "cf_test_util.h"

namespace kiln::ops {
namespace {

using namespace cftest;  // NOLINT

// Tiny kernels for loop bodies, registered in a private test domain so they never collide with
// the real ops of other families.
Status test_identity_infer(InferContext& ctx) {
  if (ctx.has_input(0)) ctx.set_output(0, ctx.input(0));
  return Status::Ok();
}
Status test_identity(KernelContext& ctx) {
  ctx.set_output_value(0, ctx.input_value(0));
  return Status::Ok();
}
// Grow: appends one 0 to a 1-D float tensor.
Status test_grow_infer(InferContext& ctx) {
  const SymShape& s = ctx.input_shape(0);
  Dim d = s.rank_known && s.rank() == 1 && s.dims[0].known() ? Dim(s.dims[0].value + 1) : Dim();
  ctx.set_output(0, DataType::kFloat32, SymShape({d}));
  return Status::Ok();
}
Status test_grow(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor out(DataType::kFloat32, {x.numel() + 1});
  for (int64_t i = 0; i < x.numel(); ++i) out.data<float>()[i] = x.data<float>()[i];
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}
// Below: bool scalar (input + 1 < limit), for while-style loop conditions.
Status test_below_infer(InferContext& ctx) {
  ctx.set_output(0, DataType::kBool, SymShape(std::vector<Dim>{}));
  return Status::Ok();
}
Status test_below(KernelContext& ctx) {
  bool v = ctx.input(0).get_i64(0) + 1 < ctx.node.attr_int("limit", 0);
  ctx.set_output(0, Tensor::scalar<bool>(DataType::kBool, v));
  return Status::Ok();
}
// Broken: inference always fails (a branch that cannot run).
Status test_broken_infer(InferContext& ctx) { return ctx.error("this node cannot run"); }
Status test_broken(KernelContext& ctx) { return ctx.error("this node cannot run"); }

KILN_REGISTER_OP("kiln.test", Identity, 1, test_identity_infer, test_identity);
KILN_REGISTER_OP("kiln.test", Grow, 1, test_grow_infer, test_grow);
KILN_REGISTER_OP("kiln.test", Below, 1, test_below_infer, test_below);
KILN_REGISTER_OP("kiln.test", Broken, 1, test_broken_infer, test_broken);

ir::Node test_node(const std::string& op, std::vector<std::string> ins, std::vector<std::string> outs,
                   std::map<std::string, ir::Attribute> attrs = {}) {
  return make_node(op, std::move(ins), std::move(outs), 1, std::move(attrs), "kiln.test");
}

ir::TypeInfo tensor_t(DataType dt, std::vector<Dim> d) { return ir::TypeInfo::tensor(dt, SymShape(std::move(d))); }
ir::TypeInfo scalar_t(DataType dt) { return tensor_t(dt, {}); }

struct Model {
  std::shared_ptr<ir::Graph> g = std::make_shared<ir::Graph>();
  Model() { g->opset_imports[""] = 21; }
  std::shared_ptr<ir::Graph> sub(const std::string& name) {
    auto s = std::make_shared<ir::Graph>();
    s->name = name;
    s->parent = g.get();
    return s;
  }
  Status infer() { return infer_shapes(*g); }
  Result<std::vector<Value>> run(std::map<std::string, Value> in) {
    Interpreter interp(g);
    return interp.run(in);
  }
  const ir::TypeInfo& type(const std::string& v) { return g->value_types.at(v); }
};

// --- If ----------------------------------------------------------------------------------------

Model if_model(bool broken_else = false) {
  Model m;
  m.g->inputs.push_back({"cond", scalar_t(DataType::kBool)});
  auto then_g = m.sub("then");
  then_g->initializers["a"] = f32({1, 2, 3});
  then_g->outputs.push_back({"a", ir::TypeInfo()});
  auto else_g = m.sub("else");
  else_g->initializers["b"] = f32({4, 5});
  if (broken_else) {
    else_g->nodes.push_back(test_node("Broken", {"b"}, {"c"}));
    else_g->outputs.push_back({"c", ir::TypeInfo()});
  } else {
    else_g->outputs.push_back({"b", ir::TypeInfo()});
  }
  m.g->nodes.push_back(make_node("If", {"cond"}, {"res"}, 16,
                                 {{"then_branch", graph_attr(then_g)}, {"else_branch", graph_attr(else_g)}}));
  m.g->outputs.push_back({"res", ir::TypeInfo()});
  return m;
}

TEST(If, RunsTheTakenBranch) {
  Model m = if_model();
  ASSERT_TRUE(m.infer().ok());
  auto t = m.run({{"cond", Tensor::scalar<bool>(DataType::kBool, true)}});
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(values(t.value()[0].tensor), (std::vector<double>{1, 2, 3}));
  auto f = m.run({{"cond", Tensor::scalar<bool>(DataType::kBool, false)}});
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(values(f.value()[0].tensor), (std::vector<double>{4, 5}));
}

TEST(If, BranchShapesMergeToASymbol) {
  Model m = if_model();
  ASSERT_TRUE(m.infer().ok());
  const ir::TypeInfo& t = m.type("res");
  ASSERT_TRUE(t.is_tensor());
  EXPECT_EQ(t.elem, DataType::kFloat32);
  ASSERT_TRUE(t.shape.rank_known);
  ASSERT_EQ(t.shape.rank(), 1u);
  EXPECT_FALSE(t.shape.dims[0].known());  // 3 or 2 depending on cond
  EXPECT_FALSE(t.shape.dims[0].param.empty());
}

TEST(If, ConstantConditionUsesTheTakenBranchType) {
  Model m = if_model();
  m.g->inputs.clear();
  m.g->initializers["cond"] = Tensor::scalar<bool>(DataType::kBool, true);
  ASSERT_TRUE(m.infer().ok());
  EXPECT_EQ(m.type("res").shape.str(), "[3]");
}

TEST(If, BranchThatCannotRunOnlyFailsWhenTaken) {
  Model m = if_model(/*broken_else=*/true);
  Status st = m.infer();
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(m.type("res").shape.str(), "[3]");
  auto t = m.run({{"cond", Tensor::scalar<bool>(DataType::kBool, true)}});
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  auto f = m.run({{"cond", Tensor::scalar<bool>(DataType::kBool, false)}});
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(contains(f.status().message(), "cannot run")) << f.status().to_string();
}

TEST(If, DtypeMismatchBetweenBranchesIsAnError) {
  Model m = if_model();
  auto& else_g = *m.g->nodes[0].attrs["else_branch"].g;
  else_g.initializers["b"] = i64({4, 5});
  Status st = m.infer();
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "then_branch")) << st.to_string();
}

// --- Loop --------------------------------------------------------------------------------------

// y (int64 [1]) += iteration number; scan output: y after each iteration.
Model sum_loop(bool with_m = true, int64_t below = -1) {
  Model m;
  if (with_m) m.g->inputs.push_back({"M", scalar_t(DataType::kInt64)});
  m.g->inputs.push_back({"cond", scalar_t(DataType::kBool)});
  m.g->inputs.push_back({"y0", tensor_t(DataType::kInt64, {1})});
  auto body = m.sub("body");
  body->inputs = {{"i", scalar_t(DataType::kInt64)}, {"c", scalar_t(DataType::kBool)}, {"y", ir::TypeInfo()}};
  if (below >= 0)
    body->nodes.push_back(test_node("Below", {"i"}, {"c_out"}, {{"limit", int_attr(below)}}));
  else
    body->nodes.push_back(test_node("Identity", {"c"}, {"c_out"}));
  body->nodes.push_back(make_node("Add", {"y", "i"}, {"y_out"}, 21));
  body->nodes.push_back(test_node("Identity", {"y_out"}, {"scan"}));
  body->outputs = {{"c_out", ir::TypeInfo()}, {"y_out", ir::TypeInfo()}, {"scan", ir::TypeInfo()}};
  m.g->nodes.push_back(
      make_node("Loop", {with_m ? "M" : "", "cond", "y0"}, {"y_final", "ys"}, 21, {{"body", graph_attr(body)}}));
  m.g->outputs = {{"y_final", ir::TypeInfo()}, {"ys", ir::TypeInfo()}};
  return m;
}

std::map<std::string, Value> loop_inputs(int64_t trips, bool cond) {
  return {{"M", i64s(trips)}, {"cond", Tensor::scalar<bool>(DataType::kBool, cond)}, {"y0", i64({0})}};
}

TEST(Loop, CarriesValuesAndConcatenatesScanOutputs) {
  Model m = sum_loop();
  ASSERT_TRUE(m.infer().ok());
  auto r = m.run(loop_inputs(5, true));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values(r.value()[0].tensor), (std::vector<double>{10}));
  EXPECT_EQ(r.value()[1].tensor.shape(), (Dims{5, 1}));
  EXPECT_EQ(values(r.value()[1].tensor), (std::vector<double>{0, 1, 3, 6, 10}));
}

TEST(Loop, InferenceKeepsCarriedShapeAndAddsTripAxis) {
  Model m = sum_loop();
  ASSERT_TRUE(m.infer().ok());
  EXPECT_EQ(m.type("y_final").str(), "int64[1]");
  const ir::TypeInfo& ys = m.type("ys");
  ASSERT_EQ(ys.shape.rank(), 2u);
  EXPECT_FALSE(ys.shape.dims[0].known());
  EXPECT_EQ(ys.shape.dims[1].value, 1);
}

TEST(Loop, ZeroIterationsReturnInitialValuesAndEmptyScans) {
  Model m = sum_loop();
  ASSERT_TRUE(m.infer().ok());
  for (auto [trips, cond] : {std::pair{int64_t{0}, true}, std::pair{int64_t{4}, false}}) {
    auto r = m.run(loop_inputs(trips, cond));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(values(r.value()[0].tensor), (std::vector<double>{0}));
    EXPECT_EQ(r.value()[1].tensor.shape(), (Dims{0, 1}));
    EXPECT_EQ(r.value()[1].tensor.dtype(), DataType::kInt64);
  }
}

TEST(Loop, BodyConditionStopsAWhileLoop) {
  Model m = sum_loop(/*with_m=*/false, /*below=*/3);
  ASSERT_TRUE(m.infer().ok());
  auto r = m.run({{"cond", Tensor::scalar<bool>(DataType::kBool, true)}, {"y0", i64({0})}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values(r.value()[1].tensor), (std::vector<double>{0, 1, 3}));  // i = 0, 1, 2
}

TEST(Loop, CarriedValueThatGrowsIsInferredWithUnknownDim) {
  Model m;
  m.g->inputs.push_back({"M", scalar_t(DataType::kInt64)});
  m.g->inputs.push_back({"x0", tensor_t(DataType::kFloat32, {2})});
  auto body = m.sub("body");
  body->inputs = {{"i", scalar_t(DataType::kInt64)}, {"c", scalar_t(DataType::kBool)}, {"x", ir::TypeInfo()}};
  body->nodes.push_back(test_node("Identity", {"c"}, {"c_out"}));
  body->nodes.push_back(test_node("Grow", {"x"}, {"x_out"}));
  body->outputs = {{"c_out", ir::TypeInfo()}, {"x_out", ir::TypeInfo()}};
  m.g->nodes.push_back(make_node("Loop", {"M", "", "x0"}, {"x_final"}, 21, {{"body", graph_attr(body)}}));
  m.g->outputs = {{"x_final", ir::TypeInfo()}};
  ASSERT_TRUE(m.infer().ok());
  const ir::TypeInfo& out = m.type("x_final");
  ASSERT_EQ(out.shape.rank(), 1u);
  EXPECT_FALSE(out.shape.dims[0].known()) << out.str();
  // The body's own types hold for every iteration, not just the first.
  EXPECT_FALSE(body->inputs[2].type.shape.dims[0].known()) << body->inputs[2].type.str();
  EXPECT_FALSE(body->value_types.at("x_out").shape.dims[0].known());
  auto r = m.run({{"M", i64s(3)}, {"x0", f32({1, 2})}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value()[0].tensor.shape(), (Dims{5}));
}

TEST(Loop, CarriesASequence) {
  Model m;
  m.g->inputs.push_back({"M", scalar_t(DataType::kInt64)});
  m.g->nodes.push_back(make_node("SequenceEmpty", {}, {"s0"}, 21));
  auto body = m.sub("body");
  body->inputs = {{"i", scalar_t(DataType::kInt64)}, {"c", scalar_t(DataType::kBool)}, {"s", ir::TypeInfo()}};
  body->initializers["t"] = f32({7});
  body->nodes.push_back(test_node("Identity", {"c"}, {"c_out"}));
  body->nodes.push_back(make_node("SequenceInsert", {"s", "t"}, {"s_out"}, 21));
  body->outputs = {{"c_out", ir::TypeInfo()}, {"s_out", ir::TypeInfo()}};
  m.g->nodes.push_back(make_node("Loop", {"M", "", "s0"}, {"s_final"}, 21, {{"body", graph_attr(body)}}));
  m.g->nodes.push_back(make_node("SequenceLength", {"s_final"}, {"n"}, 21));
  m.g->outputs = {{"n", ir::TypeInfo()}};
  ASSERT_TRUE(m.infer().ok());
  EXPECT_EQ(m.type("s_final").kind, ir::TypeInfo::Kind::kSequence);
  auto r = m.run({{"M", i64s(3)}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values(r.value()[0].tensor), (std::vector<double>{3}));
}

TEST(Loop, BodyArityMismatchIsAnError) {
  Model m = sum_loop();
  m.g->nodes[0].inputs.push_back("y0");  // two carried values, body takes one
  Status st = m.infer();
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "body takes 3 inputs")) << st.to_string();
}

// --- Scan --------------------------------------------------------------------------------------

// Running sum: state s += x_t; scan output: s after each step.
std::shared_ptr<ir::Graph> sum_body(Model& m) {
  auto body = m.sub("body");
  body->inputs = {{"s", ir::TypeInfo()}, {"x", ir::TypeInfo()}};
  body->nodes.push_back(make_node("Add", {"s", "x"}, {"s_out"}, 21));
  body->nodes.push_back(test_node("Identity", {"s_out"}, {"y"}));
  body->outputs = {{"s_out", ir::TypeInfo()}, {"y", ir::TypeInfo()}};
  return body;
}

TEST(Scan, ReverseInputAndPrependedOutputAlongAxis1) {
  Model m;
  m.g->inputs = {{"s0", tensor_t(DataType::kFloat32, {2})}, {"x", tensor_t(DataType::kFloat32, {3, 2})}};
  m.g->nodes.push_back(make_node("Scan", {"s0", "x"}, {"s", "ys"}, 21,
                                 {{"body", graph_attr(sum_body(m))},
                                  {"num_scan_inputs", int_attr(1)},
                                  {"scan_input_directions", ints_attr({1})},
                                  {"scan_output_axes", ints_attr({1})},
                                  {"scan_output_directions", ints_attr({1})}}));
  m.g->outputs = {{"s", ir::TypeInfo()}, {"ys", ir::TypeInfo()}};
  ASSERT_TRUE(m.infer().ok());
  EXPECT_EQ(m.type("s").str(), "float32[2]");
  EXPECT_EQ(m.type("ys").str(), "float32[2,3]");
  auto r = m.run({{"s0", f32({0, 0})}, {"x", f32({1, 10, 2, 20, 3, 30}, {3, 2})}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values(r.value()[0].tensor), (std::vector<double>{6, 60}));
  // Steps visit rows 2, 1, 0: sums (3,30), (5,50), (6,60); prepending reverses them.
  EXPECT_EQ(values(r.value()[1].tensor), (std::vector<double>{6, 5, 3, 60, 50, 30}));
}

TEST(Scan, ScanInputAxis) {
  Model m;
  m.g->inputs = {{"s0", tensor_t(DataType::kFloat32, {2})}, {"x", tensor_t(DataType::kFloat32, {2, 3})}};
  m.g->nodes.push_back(make_node(
      "Scan", {"s0", "x"}, {"s", "ys"}, 21,
      {{"body", graph_attr(sum_body(m))}, {"num_scan_inputs", int_attr(1)}, {"scan_input_axes", ints_attr({-1})}}));
  m.g->outputs = {{"s", ir::TypeInfo()}, {"ys", ir::TypeInfo()}};
  ASSERT_TRUE(m.infer().ok());
  EXPECT_EQ(m.type("ys").str(), "float32[3,2]");
  auto r = m.run({{"s0", f32({0, 0})}, {"x", f32({1, 2, 3, 10, 20, 30}, {2, 3})}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values(r.value()[0].tensor), (std::vector<double>{6, 60}));
  EXPECT_EQ(values(r.value()[1].tensor), (std::vector<double>{1, 10, 3, 30, 6, 60}));
}

TEST(Scan, Opset8BatchesWithSequenceLengths) {
  Model m;
  m.g->opset_imports[""] = 8;
  m.g->inputs = {{"lens", tensor_t(DataType::kInt64, {2})},
                 {"s0", tensor_t(DataType::kFloat32, {2, 1})},
                 {"x", tensor_t(DataType::kFloat32, {2, 3, 1})}};
  m.g->nodes.push_back(make_node("Scan", {"lens", "s0", "x"}, {"s", "ys"}, 8,
                                 {{"body", graph_attr(sum_body(m))}, {"num_scan_inputs", int_attr(1)}}));
  m.g->outputs = {{"s", ir::TypeInfo()}, {"ys", ir::TypeInfo()}};
  ASSERT_TRUE(m.infer().ok());
  EXPECT_EQ(m.type("s").str(), "float32[2,1]");
  EXPECT_EQ(m.type("ys").str(), "float32[2,3,1]");
  auto r = m.run({{"lens", i64({3, 1})}, {"s0", f32({0, 100}, {2, 1})}, {"x", f32({1, 2, 3, 4, 5, 6}, {2, 3, 1})}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values(r.value()[0].tensor), (std::vector<double>{6, 104}));
  EXPECT_EQ(values(r.value()[1].tensor), (std::vector<double>{1, 3, 6, 104, 0, 0}));  // zero padding
}

TEST(Scan, BadAttributesAreErrors) {
  Model m;
  m.g->inputs = {{"s0", tensor_t(DataType::kFloat32, {2})}, {"x", tensor_t(DataType::kFloat32, {3, 2})}};
  m.g->nodes.push_back(make_node("Scan", {"s0", "x"}, {"s", "ys"}, 21,
                                 {{"body", graph_attr(sum_body(m))}, {"num_scan_inputs", int_attr(0)}}));
  m.g->outputs = {{"s", ir::TypeInfo()}, {"ys", ir::TypeInfo()}};
  Status st = m.infer();
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "num_scan_inputs")) << st.to_string();
  m.g->nodes[0].attrs["num_scan_inputs"] = int_attr(1);
  m.g->nodes[0].attrs["scan_input_axes"] = ints_attr({2});
  st = m.infer();
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "scan_input_axes")) << st.to_string();
}

// --- Sequences ---------------------------------------------------------------------------------

Value seq(std::vector<Tensor> items) {
  DataType dt = items.empty() ? DataType::kFloat32 : items[0].dtype();
  return Value::make_sequence(std::move(items), dt);
}

TEST(Sequence, SplitThenConcatRoundTrips) {
  Tensor x = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  auto s = run(make_node("SplitToSequence", {"x", "split"}, {"s"}, 21, {{"axis", int_attr(1)}}), {x, i64s(2)});
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const auto& items = s.value()[0].sequence;
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].shape(), (Dims{2, 2}));
  EXPECT_EQ(items[1].shape(), (Dims{2, 1}));  // the remainder
  auto c = run_values(make_node("ConcatFromSequence", {"s"}, {"y"}, 21, {{"axis", int_attr(1)}}), {s.value()[0]});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c.value()[0].tensor.shape(), (Dims{2, 3}));
  EXPECT_EQ(values(c.value()[0].tensor), values(x));
}

TEST(Sequence, ConcatWithNewAxisStacks) {
  auto c =
      run_values(make_node("ConcatFromSequence", {"s"}, {"y"}, 21, {{"axis", int_attr(-1)}, {"new_axis", int_attr(1)}}),
                 {seq({f32({1, 2}), f32({3, 4}), f32({5, 6})})});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c.value()[0].tensor.shape(), (Dims{2, 3}));
  EXPECT_EQ(values(c.value()[0].tensor), (std::vector<double>{1, 3, 5, 2, 4, 6}));
}

TEST(Sequence, InsertAtErasePositions) {
  Value s = seq({f32({1}), f32({2})});
  auto ins = run_values(make_node("SequenceInsert", {"s", "t", "p"}, {"o"}, 21), {s, f32({9}), i64s(-1)});
  ASSERT_TRUE(ins.ok()) << ins.status().to_string();
  const auto& items = ins.value()[0].sequence;
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(values(items[1]), (std::vector<double>{9}));
  auto at = run_values(make_node("SequenceAt", {"s", "p"}, {"o"}, 21), {ins.value()[0], i64s(-1)});
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(values(at.value()[0].tensor), (std::vector<double>{2}));
  auto er = run_values(make_node("SequenceErase", {"s"}, {"o"}, 21), {ins.value()[0]});  // default: last
  ASSERT_TRUE(er.ok());
  ASSERT_EQ(er.value()[0].sequence.size(), 2u);
  EXPECT_EQ(values(er.value()[0].sequence[1]), (std::vector<double>{9}));
}

TEST(Sequence, OutOfRangePositionsAreErrors) {
  Value s = seq({f32({1}), f32({2})});
  auto at = run_values(make_node("SequenceAt", {"s", "p"}, {"o"}, 21), {s, i64s(2)});
  ASSERT_FALSE(at.ok());
  EXPECT_TRUE(contains(at.status().message(), "position 2 is out of range")) << at.status().to_string();
  auto ins = run_values(make_node("SequenceInsert", {"s", "t", "p"}, {"o"}, 21), {s, f32({9}), i64s(-3)});
  ASSERT_FALSE(ins.ok());
  auto er = run_values(make_node("SequenceErase", {"s"}, {"o"}, 21), {seq({})});
  ASSERT_FALSE(er.ok());
  EXPECT_TRUE(contains(er.status().message(), "sequence of 0")) << er.status().to_string();
  auto bad = run_values(make_node("SequenceInsert", {"s", "t"}, {"o"}, 21), {s, i64({1})});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status().message(), "cannot insert")) << bad.status().to_string();
}

TEST(Sequence, InferenceThroughSequenceOps) {
  Model m;
  m.g->inputs = {{"x", tensor_t(DataType::kFloat32, {Dim::symbol("N"), 4})}};
  m.g->nodes.push_back(
      make_node("SplitToSequence", {"x"}, {"s"}, 21, {{"axis", int_attr(1)}, {"keepdims", int_attr(0)}}));
  m.g->nodes.push_back(make_node("SequenceAt", {"s", "p"}, {"e"}, 21));
  m.g->nodes.push_back(
      make_node("ConcatFromSequence", {"s"}, {"c"}, 21, {{"axis", int_attr(0)}, {"new_axis", int_attr(1)}}));
  m.g->nodes.push_back(make_node("SequenceLength", {"s"}, {"n"}, 21));
  m.g->initializers["p"] = i64s(0);
  m.g->outputs = {{"e", ir::TypeInfo()}, {"c", ir::TypeInfo()}, {"n", ir::TypeInfo()}};
  ASSERT_TRUE(m.infer().ok());
  EXPECT_EQ(m.type("s").str(), "seq(float32[N])");
  EXPECT_EQ(m.type("e").str(), "float32[N]");
  EXPECT_EQ(m.type("c").shape.rank(), 2u);
  EXPECT_EQ(m.type("c").shape.dims[1].param, "N");
  EXPECT_EQ(m.type("n").str(), "int64[]");
}

TEST(Sequence, ConstructWidensElementShapes) {
  Model m;
  m.g->inputs = {{"a", tensor_t(DataType::kFloat32, {2, 3})}, {"b", tensor_t(DataType::kFloat32, {5, 3})}};
  m.g->nodes.push_back(make_node("SequenceConstruct", {"a", "b"}, {"s"}, 21));
  m.g->outputs = {{"s", ir::TypeInfo()}};
  ASSERT_TRUE(m.infer().ok());
  EXPECT_EQ(m.type("s").str(), "seq(float32[?,3])");
  auto r = run(make_node("SequenceConstruct", {"a", "b"}, {"s"}, 21), {f32({1}), i64({1})});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "share one dtype")) << r.status().to_string();
}

TEST(Sequence, MapRunsTheBodyPerElement) {
  Model m;
  m.g->inputs = {{"s", ir::TypeInfo::sequence(tensor_t(DataType::kFloat32, {Dim::symbol("N")}))},
                 {"t", tensor_t(DataType::kFloat32, {1})}};
  auto body = m.sub("body");
  body->inputs = {{"e", ir::TypeInfo()}, {"k", ir::TypeInfo()}};
  body->nodes.push_back(make_node("Add", {"e", "k"}, {"o"}, 21));
  body->outputs = {{"o", ir::TypeInfo()}};
  m.g->nodes.push_back(make_node("SequenceMap", {"s", "t"}, {"r"}, 21, {{"body", graph_attr(body)}}));
  m.g->outputs = {{"r", ir::TypeInfo()}};
  ASSERT_TRUE(m.infer().ok());
  EXPECT_EQ(m.type("r").str(), "seq(float32[N])");
  auto r = m.run({{"s", seq({f32({1, 2}), f32({3})})}, {"t", f32({10})}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const auto& items = r.value()[0].sequence;
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(values(items[0]), (std::vector<double>{11, 12}));
  EXPECT_EQ(values(items[1]), (std::vector<double>{13}));
}

// --- Optionals ---------------------------------------------------------------------------------

TEST(Optional, HasAndGetElement) {
  auto none = run_values(make_node("OptionalHasElement", {"o"}, {"b"}, 18), {Value::none()});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none.value()[0].tensor.data<bool>()[0]);
  auto some = run_values(make_node("OptionalHasElement", {"o"}, {"b"}, 18), {Value(f32({1}))});
  ASSERT_TRUE(some.ok());
  EXPECT_TRUE(some.value()[0].tensor.data<bool>()[0]);
  auto get = run_values(make_node("OptionalGetElement", {"o"}, {"v"}, 18), {Value::none()});
  ASSERT_FALSE(get.ok());
  EXPECT_TRUE(contains(get.status().message(), "empty")) << get.status().to_string();
  auto made = run_values(make_node("Optional", {}, {"o"}, 18), {});
  ASSERT_TRUE(made.ok());
  EXPECT_TRUE(made.value()[0].is_none());
}

TEST(Optional, InferenceWrapsAndUnwraps) {
  Model m;
  m.g->inputs = {{"x", tensor_t(DataType::kFloat32, {3})}};
  m.g->nodes.push_back(make_node("Optional", {"x"}, {"o"}, 18));
  m.g->nodes.push_back(make_node("OptionalGetElement", {"o"}, {"y"}, 18));
  m.g->nodes.push_back(make_node("OptionalHasElement", {"o"}, {"h"}, 18));
  ir::Node empty = make_node("Optional", {}, {"e"}, 18);
  ir::Attribute tp;
  tp.type = ir::Attribute::Type::kTypeProto;
  tp.type_proto = ir::TypeInfo::sequence(tensor_t(DataType::kInt64, {}));
  empty.attrs["type"] = tp;
  m.g->nodes.push_back(empty);
  m.g->outputs = {{"y", ir::TypeInfo()}, {"h", ir::TypeInfo()}, {"e", ir::TypeInfo()}};
  ASSERT_TRUE(m.infer().ok());
  EXPECT_EQ(m.type("o").str(), "optional(float32[3])");
  EXPECT_EQ(m.type("y").str(), "float32[3]");
  EXPECT_EQ(m.type("h").str(), "bool[]");
  EXPECT_EQ(m.type("e").str(), "optional(seq(int64[]))");
}

}  // namespace
}  // namespace kiln::ops
