// Bounded execution and build-time validation (issue 15 items 3 and 6): deadlines stop Loops in the
// interpreter and in an engine (ExecutionContext::set_deadline), nested Loops load in linear time, and
// a build refuses with the interpreter's message what a run would refuse.
#include <gtest/gtest.h>

#include "ir/attribute_builders.h"

#include <chrono>
#include <cmath>
#include <limits>

#include "../graph_builder.h"
#include "engine/engine_impl.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "ops/interpreter.h"
#include "ops/shape_inference.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;
using testing::GraphBuilder;

ir::TypeInfo tensor_t(DataType dt, std::vector<Dim> d) { return ir::TypeInfo::tensor(dt, SymShape(std::move(d))); }

ir::Node node(const std::string& op, std::vector<std::string> ins, std::vector<std::string> outs, int opset = 13) {
  ir::Node n;
  n.name = op + "_" + outs[0];
  n.op_type = op;
  n.opset = opset;
  n.inputs = std::move(ins);
  n.outputs = std::move(outs);
  return n;
}

// The body of a Loop carrying one float [1] value at nesting `level` of `depth`: the innermost adds 1,
// the others run the next level once. The outermost Loop runs `trips` times: y = x + trips.
std::shared_ptr<ir::Graph> nested_body(const ir::Graph* parent, int level, int depth) {
  auto b = std::make_shared<ir::Graph>();
  b->parent = parent;
  const std::string s = std::to_string(level);
  b->name = "body" + s;
  b->inputs = {{"i" + s, tensor_t(DataType::kInt64, {})},
               {"c" + s, tensor_t(DataType::kBool, {})},
               {"v" + s, tensor_t(DataType::kFloat32, {1})}};
  b->nodes.push_back(node("Identity", {"c" + s}, {"co" + s}));
  if (level == depth - 1) {
    b->initializers["one" + s] = Tensor::from_vector<float>(DataType::kFloat32, {1}, {1.0f});
    b->nodes.push_back(node("Add", {"v" + s, "one" + s}, {"vo" + s}));
  } else {
    b->initializers["m" + s] = Tensor::scalar<int64_t>(DataType::kInt64, 1);
    ir::Node loop = node("Loop", {"m" + s, "", "v" + s}, {"vo" + s});
    loop.attrs["body"] = ir::attr_graph(nested_body(b.get(), level + 1, depth));
    b->nodes.push_back(std::move(loop));
  }
  b->outputs = {{"co" + s, ir::TypeInfo()}, {"vo" + s, ir::TypeInfo()}};
  return b;
}

// y = Loop(M, x) around `body_of(graph)`.
ir::Model loop_model(int64_t trips, int depth) {
  ir::Model m;
  m.ir_version = 8;
  m.opset_imports[""] = 13;
  m.graph = std::make_shared<ir::Graph>();
  m.graph->name = "loops";
  m.graph->opset_imports[""] = 13;
  m.graph->inputs = {{"x", tensor_t(DataType::kFloat32, {1})}};
  m.graph->initializers["M"] = Tensor::scalar<int64_t>(DataType::kInt64, trips);
  ir::Node loop = node("Loop", {"M", "", "x"}, {"y"});
  loop.attrs["body"] = ir::attr_graph(nested_body(m.graph.get(), 0, depth));
  m.graph->nodes.push_back(std::move(loop));
  m.graph->outputs = {{"y", ir::TypeInfo()}};
  return m;
}

std::map<std::string, ops::Value> x_zero() {
  return {{"x", ops::Value(Tensor::from_vector<float>(DataType::kFloat32, {1}, {0.0f}))}};
}

TEST(Deadline, StopsAnInterpretedLoopOf1e18Trips) {
  ir::Model m = loop_model(int64_t{1000000000} * 1000000000, 1);
  ASSERT_TRUE(ops::infer_shapes(*m.graph).ok());
  ops::Interpreter interp(m.graph);
  auto t0 = Clock::now();
  interp.set_deadline(t0 + std::chrono::milliseconds(200));
  auto r = interp.run(x_zero());
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kDeadlineExceeded) << r.status().to_string();
  // Stopped in the Loop between iterations, or in its body before a node: either names the node.
  EXPECT_NE(r.status().message().find(", opset 13): the run passed its deadline ("), std::string::npos)
      << r.status().message();
  EXPECT_LT(s, 20.0);  // generous: the loaded machine; unbounded without the check
}

TEST(Deadline, StopsAnEngineRunThroughTheContext) {
  std::string bytes = onnx_import::serialize_model(loop_model(int64_t{1000000000} * 1000000000, 2)).value();
  auto engine = Builder().build_from_memory(bytes);
  auto ctx = engine->create_context();
  float x = 0;
  ctx->set_input("x", HostTensor::f32({1}, &x));
  ctx->set_deadline(Clock::now() + std::chrono::milliseconds(200));
  try {
    ctx->run();
    FAIL() << "a Loop of 10^18 trips finished";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kDeadlineExceeded) << e.what();
  }
}

TEST(Deadline, AFarDeadlineLetsARunFinishAndClearsAway) {
  std::string bytes = onnx_import::serialize_model(loop_model(5, 1)).value();
  auto engine = Builder().build_from_memory(bytes);
  auto ctx = engine->create_context();
  float x = 1;
  ctx->set_input("x", HostTensor::f32({1}, &x));
  ctx->set_deadline(Clock::now() + std::chrono::hours(1));
  ctx->run();
  EXPECT_EQ(ctx->output("y").as<float>()[0], 6.0f);
  ctx->set_deadline(Clock::now() - std::chrono::seconds(1));  // already passed
  EXPECT_THROW(ctx->run(), Error);
  ctx->clear_deadline();
  ctx->run();
  EXPECT_EQ(ctx->output("y").as<float>()[0], 6.0f);
}

// Each level's body used to be inferred twice (a scratch round, then for real): 2^depth inferences,
// 20 levels took 5 s and 60 never finished. Now one inference per level.
TEST(NestedLoops, SixtyLevelsInferBuildAndRun) {
  auto t0 = Clock::now();
  ir::Model m = loop_model(3, 60);
  ASSERT_TRUE(ops::infer_shapes(*m.graph).ok());
  EXPECT_EQ(m.graph->value_types.at("y").str(), "float32[1]");
  ops::Interpreter interp(m.graph);
  auto r = interp.run(x_zero());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value()[0].tensor.data<float>()[0], 3.0f);
  auto engine = Builder().build_from_memory(onnx_import::serialize_model(m).value());
  auto ctx = engine->create_context();
  float x = 0;
  ctx->set_input("x", HostTensor::f32({1}, &x));
  ctx->run();
  EXPECT_EQ(ctx->output("y").as<float>()[0], 3.0f);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 60.0);  // generous (loaded machine)
}

// The messages of an interpreter run and of a build, for a model whose input "x" is dynamic (so the
// importer's inference at the declared shapes sees nothing wrong) at the concrete shape `at`.
std::pair<std::string, std::string> run_and_build_errors(const ir::Model& m, const Dims& at) {
  std::string run_msg = "ran", build_msg = "built";
  ops::Interpreter interp(m.graph);
  auto r = interp.run({{"x", ops::Value(testing::random_tensor(at, 1))}});
  if (!r.ok()) run_msg = r.status().message();
  BuilderConfig cfg;
  Profile p;
  p.inputs["x"] = {at, at, at};
  cfg.profiles = {p};
  try {
    Builder(cfg).build_from_memory(onnx_import::serialize_model(m).value());
  } catch (const Error& e) {
    build_msg = e.what();
  }
  return {run_msg, build_msg};
}

TEST(BuildValidates, BatchNormScaleOfLengthOneOverThreeChannels) {
  // Conv then BatchNormalization, all static: inference refuses it (fold_batch_norm used to
  // broadcast the scale into the conv weights while the interpreter refused the model).
  GraphBuilder b(13);
  b.input("x", {1, 3, 4, 4}).output("y");
  b.init("w", testing::random_tensor({3, 3, 1, 1}, 1)).init("s", testing::random_tensor({1}, 2));
  b.init("bb", testing::random_tensor({3}, 3)).init("m", testing::random_tensor({3}, 4));
  b.init("v", testing::random_tensor({3}, 5, DataType::kFloat32, 0.5, 1.5));
  b.conv({"x", "w"}, "c");
  b.node("BatchNormalization", {"c", "s", "bb", "m", "v"}, {"y"});
  try {
    b.finish();
    FAIL() << "inference accepted a scale of length 1 over 3 channels";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("scale must have 3 elements (channels), got float32[1]"), std::string::npos)
        << e.what();
  }
}

TEST(BuildValidates, ABuildAtTheProfileShapesRefusesWhatARunRefuses) {
  struct Case {
    const char* what;
    Dims declared, at;
    std::function<void(GraphBuilder&)> make;
    const char* fragment;
  };
  std::vector<Case> cases = {
      {"Reshape count",
       {-1, 2},
       {2, 2},
       [](GraphBuilder& b) {
         b.init("sh", Tensor::from_vector<int64_t>(DataType::kInt64, {2}, {3, 3}));
         b.node("Reshape", {"x", "sh"}, {"y"});
       },
       "cannot reshape float32[2,2] (4 elements) to [3,3] (9 elements)"},
      {"BatchNormalization scale length",
       {1, -1, 2, 2},
       {1, 3, 2, 2},
       [](GraphBuilder& b) {
         b.init("s", testing::random_tensor({1}, 2)).init("bb", testing::random_tensor({3}, 3));
         b.init("m", testing::random_tensor({3}, 4)).init("v", testing::random_tensor({3}, 5));
         b.node("BatchNormalization", {"x", "s", "bb", "m", "v"}, {"y"});
       },
       "scale must have 3 elements (channels), got float32[1]"},
      {"DFT of an empty signal",
       {1, -1, 1},
       {1, 0, 1},
       [](GraphBuilder& b) { b.node("DFT", {"x"}, {"y"}); },
       "dft_length must be in [1, "},
  };
  for (const auto& c : cases) {
    GraphBuilder b(c.what[0] == 'D' ? 17 : 13);
    b.input("x", c.declared).output("y");
    c.make(b);
    ir::Model m = b.finish();  // fine at the declared (dynamic) shapes
    auto [run_msg, build_msg] = run_and_build_errors(m, c.at);
    EXPECT_NE(run_msg.find(c.fragment), std::string::npos) << c.what << ": run: " << run_msg;
    EXPECT_NE(build_msg.find(c.fragment), std::string::npos) << c.what << ": build: " << build_msg;
  }
}

TEST(BuildValidates, ConstantAttributesAreCheckedByInference) {
  struct Case {
    const char* what;
    std::function<void(GraphBuilder&)> make;
    const char* fragment;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<Case> cases = {
      {"Resize scales NaN",
       [&](GraphBuilder& b) {
         b.init("sc", Tensor::from_vector<float>(DataType::kFloat32, {4}, {1, 1, nan, 1}));
         b.node("Resize", {"x", "", "sc"}, {"y"});
       },
       "scales value nan must be positive and finite"},
      {"Resize scales negative",
       [&](GraphBuilder& b) {
         b.init("sc", Tensor::from_vector<float>(DataType::kFloat32, {4}, {1, 1, -2, 1}));
         b.node("Resize", {"x", "", "sc"}, {"y"});
       },
       "scales value -2 must be positive and finite"},
      {"Resize scales 2^33",
       [&](GraphBuilder& b) {
         b.init("sc", Tensor::from_vector<float>(DataType::kFloat32, {4}, {1, 1, 8589934592.0f, 1}));
         b.node("Resize", {"x", "", "sc"}, {"y"});
       },
       "is out of range"},
      {"CumSum axis",
       [&](GraphBuilder& b) {
         b.init("ax", Tensor::scalar<int64_t>(DataType::kInt64, 7));
         b.node("CumSum", {"x", "ax"}, {"y"});
       },
       "axis 7 is out of range for rank 4"},
  };
  for (const auto& c : cases) {
    GraphBuilder b(13);
    b.input("x", {1, 1, 256, 2}).output("y");  // 256 * 2^33 > 2^40: an extent out of range
    c.make(b);
    try {
      b.finish();
      ADD_FAILURE() << c.what << ": inference accepted it";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(c.fragment), std::string::npos) << c.what << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln
