// The numerics guard (engine/numerics_guard.h, ExecutionContext::set_numerics_check): the first layer
// making Inf/NaN, exceeding FP16's range or saturating INT8 is named with its range, on the engine
// (main graph and If bodies) and on the reference interpreter; off, the bound path is untouched.
#include <gtest/gtest.h>

#include <cmath>

#include "../graph_builder.h"
#include "backends/device_runtime.h"
#include "engine/engine_impl.h"
#include "engine/numerics_guard.h"
#include "ir/attribute_builders.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

using testing::GraphBuilder;

Tensor filled(Dims d, float v) {
  Tensor t(DataType::kFloat32, d);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = v;
  return t;
}

Tensor ramp(Dims d, float lo, float hi) {
  Tensor t(DataType::kFloat32, d);
  int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    t.data<float>()[i] = lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n - 1);
  return t;
}

std::shared_ptr<Engine> build(ir::Model m, BuilderConfig cfg = {}) {
  auto e = detail::build_engine(std::move(m), cfg);
  if (!e.ok()) throw std::runtime_error(e.status().to_string());
  return std::make_shared<Engine>(e.value());
}

NumericsReport run_checked(const Engine& e, const std::map<std::string, Tensor>& inputs) {
  auto ctx = e.create_context();
  NumericsCheck check;
  check.enabled = true;
  ctx->set_numerics_check(check);
  for (const auto& [name, t] : inputs) ctx->set_input(name, HostTensor::f32(t.shape(), t.data<float>()));
  ctx->run();
  return ctx->numerics_report();
}

NumericsReport run_reference_checked(const ir::Model& m, const std::map<std::string, ops::Value>& inputs) {
  NumericsCheck check;
  check.enabled = true;
  engine::NumericsGuard guard(m.graph, check);
  ops::Interpreter interp(m.graph);
  guard.attach(interp);
  guard.begin_run(inputs);
  auto r = interp.run(inputs);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return guard.report();
}

// x [2, 4] in [0.5, 1] -> MatMul "mm1" (column 1 of W1 negative) -> Log "log" (NaN in column 1) ->
// MatMul "mm2" -> y: the first non-finite layer is log; mm2 only carries it.
ir::Model nan_model() {
  GraphBuilder b(13);
  b.input("x", {2, 4}).output("y");
  Tensor w1 = filled({4, 4}, 0.25f);
  for (int k = 0; k < 4; ++k) w1.data<float>()[k * 4 + 1] = -0.25f;
  b.init("w1", w1).init("w2", filled({4, 3}, 0.5f));
  b.node("MatMul", {"x", "w1"}, {"h"}).name = "mm1";
  b.node("Log", {"h"}, {"l"}).name = "log";
  b.node("MatMul", {"l", "w2"}, {"y"}).name = "mm2";
  return b.finish();
}

TEST(NumericsGuard, NamesTheFirstLayerMakingNaN) {
  ir::Model m = nan_model();
  Tensor x = ramp({2, 4}, 0.5f, 1.f);
  auto e = build(testing::clone(m));
  for (const NumericsReport& r : {run_checked(*e, {{"x", x}}), run_reference_checked(m, {{"x", ops::Value(x)}})}) {
    const NumericsFinding* f = r.first_error();
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->kind, NumericsFinding::Kind::kNonFinite);
    EXPECT_EQ(f->layer, "log");
    EXPECT_EQ(f->op_type, "Log");
    EXPECT_EQ(f->output, "l");
    EXPECT_EQ(f->range.nan, 2);  // column 1 of both rows
    EXPECT_EQ(f->bad, 2);
    EXPECT_EQ(f->range.elements, 8);
    EXPECT_TRUE(f->introduced);
    ASSERT_EQ(f->inputs.size(), 1u);
    EXPECT_EQ(f->inputs[0].name, "h");
    EXPECT_LT(f->inputs[0].min, 0);  // the negative column that Log turned into NaN
    EXPECT_EQ(f->inputs[0].nan, 0);
    EXPECT_NE(f->message.find("layer 'log' (Log, fp32)"), std::string::npos) << f->message;
    // mm2 only carries the NaN: counted, not listed.
    EXPECT_EQ(r.findings.size(), 1u);
    EXPECT_EQ(r.propagated, 1);
    EXPECT_EQ(r.layers_checked, 3);
  }
}

TEST(NumericsGuard, GraphInputWithNaNIsAFindingOfItsOwn) {
  ir::Model m = nan_model();
  Tensor x = ramp({2, 4}, 0.5f, 1.f);
  x.data<float>()[3] = NAN;
  NumericsReport r = run_reference_checked(m, {{"x", ops::Value(x)}});
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].index, -1);
  EXPECT_EQ(r.findings[0].output, "x");
  // The layers after it only carry the input's NaN, except log, which adds its own.
  EXPECT_GE(r.propagated, 1);
}

// x [1, 16] in [0.5, 1] -> MatMul "mm1" (0.1) -> Relu -> MatMul "big_matmul" (2e4) -> y: about 2.4e5
// in every element of y, beyond FP16's 65504 by construction.
ir::Model fp16_overflow_model() {
  GraphBuilder b(13);
  b.input("x", {1, 16}).output("y");
  b.init("w1", filled({16, 16}, 0.1f)).init("w2", filled({16, 8}, 2e4f));
  b.node("MatMul", {"x", "w1"}, {"h"}).name = "mm1";
  b.node("Relu", {"h"}, {"r"}).name = "relu";
  b.node("MatMul", {"r", "w2"}, {"y"}).name = "big_matmul";
  return b.finish();
}

TEST(NumericsGuard, FP32EngineWarnsWhereFP16WouldOverflow) {
  ir::Model m = fp16_overflow_model();
  Tensor x = ramp({1, 16}, 0.5f, 1.f);
  auto ref = testing::run(m, {{"x", ops::Value(x)}});
  double ymin = INFINITY, ymax = -INFINITY;
  for (int64_t i = 0; i < ref[0].tensor.numel(); ++i)
    ymin = std::min(ymin, ref[0].tensor.get_f64(i)), ymax = std::max(ymax, ref[0].tensor.get_f64(i));
  ASSERT_GT(ymin, engine::kFP16Max);
  auto e = build(testing::clone(m));
  NumericsReport r = run_checked(*e, {{"x", x}});
  EXPECT_EQ(r.first_error(), nullptr) << "an FP32 engine has no FP16 error";
  ASSERT_EQ(r.findings.size(), 1u);
  const NumericsFinding& f = r.findings[0];
  EXPECT_EQ(f.kind, NumericsFinding::Kind::kFP16Overflow);
  EXPECT_TRUE(f.warning);
  EXPECT_EQ(f.precision, "fp32");
  EXPECT_NE(f.layer.find("big_matmul"), std::string::npos) << f.layer;
  EXPECT_EQ(f.output, "y");
  EXPECT_EQ(f.bad, 8);
  EXPECT_NEAR(f.range.min, ymin, 1e-4 * ymin);
  EXPECT_NEAR(f.range.max, ymax, 1e-4 * ymax);
  EXPECT_NE(f.message.find("--layer-precisions"), std::string::npos) << f.message;
  // Its input (the ReLU's output, within range) is named with its range.
  ASSERT_FALSE(f.inputs.empty());
  EXPECT_LT(f.inputs[0].max, 10);
}

// The acceptance of issue 12 item 6 under --fp16: the same model is an error there. Enabled once the
// builder makes FP16 engines (it refuses them as Unsupported until then); the --layer-precisions fix is
// checked end to end by tests/e2e/test_numerics.py.
TEST(NumericsGuard, FP16EngineOverflowIsAnError) {
  BuilderConfig cfg;
  cfg.precision = Precision::kFP16;
  auto built = detail::build_engine(fp16_overflow_model(), cfg);
  // The CPU has no FP16 kernels (refused): the FP16 engine is a cuda:0 one, where there is a GPU.
  if (!built.ok() && built.status().code() == ErrorCode::kUnsupported) {
    cfg.device = {DeviceKind::kCUDA, 0};
    const backends::DeviceRuntime* rt = backends::device_runtime(DeviceKind::kCUDA);
    if (!rt || !rt->why_unavailable(0).empty())
      GTEST_SKIP() << "FP16 engines are built for GPUs only, and this machine has none: " << built.status().message();
    built = detail::build_engine(fp16_overflow_model(), cfg);
  }
  ASSERT_TRUE(built.ok()) << built.status().to_string();
  auto shared = std::make_shared<Engine>(built.value());
  NumericsReport r = run_checked(*shared, {{"x", ramp({1, 16}, 0.5f, 1.f)}});
  const NumericsFinding* f = r.first_error();
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->kind == NumericsFinding::Kind::kFP16Overflow || f->kind == NumericsFinding::Kind::kNonFinite);
  EXPECT_NE(f->layer.find("big_matmul"), std::string::npos) << f->layer;
  EXPECT_EQ(f->precision, "fp16");
  // --layer-precisions big_matmul:fp32 fixes it: the layer reads a float32 copy of its input.
  cfg.layer_precisions = {{"big_matmul", Precision::kFP32}};
  auto fixed = detail::build_engine(fp16_overflow_model(), cfg);
  ASSERT_TRUE(fixed.ok()) << fixed.status().to_string();
  auto fixed_engine = std::make_shared<Engine>(fixed.value());
  NumericsReport fr = run_checked(*fixed_engine, {{"x", ramp({1, 16}, 0.5f, 1.f)}});
  EXPECT_EQ(fr.first_error(), nullptr) << fr.first_error()->message;
}

// QuantizeLinear "q" of x in [-4, 4] with scale 0.01 (int8 covers [-1.28, 1.27]): about 68% clipped.
ir::Model quantize_model(float scale, DataType zp_type, int64_t zp) {
  GraphBuilder b(13);
  b.input("x", {2, 50}).output("q").output("y");
  b.init("s", Tensor::scalar<float>(DataType::kFloat32, scale));
  Tensor z(zp_type, {});
  z.set_i64(0, zp);
  b.init("z", z);
  b.node("QuantizeLinear", {"x", "s", "z"}, {"q"}).name = "quant";
  b.node("DequantizeLinear", {"q", "s", "z"}, {"y"}).name = "dequant";
  return b.finish();
}

int64_t expected_clipped(const Tensor& x, float scale, int64_t zp, int64_t lo, int64_t hi) {
  int64_t n = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    double r = std::nearbyint(x.get_f64(i) / scale) + static_cast<double>(zp);
    n += r < static_cast<double>(lo) || r > static_cast<double>(hi);
  }
  return n;
}

TEST(NumericsGuard, QuantizeLinearSaturationShare) {
  Tensor x = ramp({2, 50}, -4.f, 4.f);
  ir::Model m = quantize_model(0.01f, DataType::kInt8, 0);
  int64_t want = expected_clipped(x, 0.01f, 0, -128, 127);
  ASSERT_GT(want, 50);
  auto e = build(testing::clone(m));
  for (const NumericsReport& r : {run_checked(*e, {{"x", x}}), run_reference_checked(m, {{"x", ops::Value(x)}})}) {
    const NumericsFinding* f = r.first_error();
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->kind, NumericsFinding::Kind::kINT8Saturation);
    EXPECT_EQ(f->layer, "quant");
    EXPECT_EQ(f->output, "q");
    EXPECT_EQ(f->precision, "int8");
    EXPECT_EQ(f->bad, want);
    EXPECT_NEAR(f->share, static_cast<double>(want) / 100.0, 1e-12);
    EXPECT_EQ(f->range.min, -128);
    EXPECT_EQ(f->range.max, 127);
    ASSERT_GE(f->inputs.size(), 1u);
    EXPECT_NEAR(f->inputs[0].min, -4, 1e-6);
    EXPECT_NEAR(f->inputs[0].max, 4, 1e-6);
  }
  // A scale covering the range: nothing clipped, nothing reported. uint8 with zero point 128.
  ir::Model fits = quantize_model(0.05f, DataType::kUInt8, 128);
  EXPECT_EQ(expected_clipped(x, 0.05f, 128, 0, 255), 0);
  NumericsReport r = run_reference_checked(fits, {{"x", ops::Value(x)}});
  EXPECT_TRUE(r.findings.empty()) << r.findings[0].message;
  // uint8 with zero point 0 clamps every negative x at 0 (half the values): a ReLU folded into the
  // quantization range, not saturation.
  ir::Model relu_like = quantize_model(0.05f, DataType::kUInt8, 0);
  ASSERT_EQ(expected_clipped(x, 0.05f, 0, 0, 255), 50);
  NumericsReport folded = run_reference_checked(relu_like, {{"x", ops::Value(x)}});
  EXPECT_TRUE(folded.findings.empty()) << folded.findings[0].message;
  // A little clipping (uint8, zero point 200: values above 55 * 0.05 = 2.75 clip) under the threshold
  // is not reported; above a lower threshold it is.
  ir::Model some = quantize_model(0.05f, DataType::kUInt8, 200);
  int64_t few = expected_clipped(x, 0.05f, 200, 0, 255);
  ASSERT_GT(few, 0);
  NumericsCheck check;
  check.enabled = true;
  check.int8_saturation = static_cast<double>(few) / 100.0 + 0.01;
  for (double threshold : {check.int8_saturation, static_cast<double>(few) / 100.0 - 0.01}) {
    check.int8_saturation = threshold;
    engine::NumericsGuard guard(some.graph, check);
    ops::Interpreter interp(some.graph);
    guard.attach(interp);
    std::map<std::string, ops::Value> in{{"x", ops::Value(x)}};
    guard.begin_run(in);
    ASSERT_TRUE(interp.run(in).ok());
    bool expect = threshold < static_cast<double>(few) / 100.0;
    ASSERT_EQ(guard.report().findings.size(), expect ? 1u : 0u) << threshold;
    if (expect) EXPECT_EQ(guard.report().findings[0].bad, few);
  }
}

// If(c): then = Log(x) (NaN for x < 0), else = Abs(x); the NaN is named inside the then-branch.
ir::Model if_model() {
  GraphBuilder b(13);
  b.input("x", {3, 4}).input("c", {}, DataType::kBool).output("y");
  auto branch = [](const std::string& name, const std::string& op, const std::string& out) {
    auto g = std::make_shared<ir::Graph>();
    g->name = name;
    ir::Node n;
    n.name = name + "_" + op;
    n.op_type = op;
    n.opset = 13;
    n.inputs = {"x"};
    n.outputs = {out};
    g->nodes.push_back(n);
    g->outputs.push_back({out, ir::TypeInfo()});
    return g;
  };
  ir::Node& n = b.node("If", {"c"}, {"branch_out"});
  n.name = "cond";
  n.attrs["then_branch"] = ir::attr_graph(branch("then", "Log", "t"));
  n.attrs["else_branch"] = ir::attr_graph(branch("else", "Abs", "e"));
  b.node("Relu", {"branch_out"}, {"y"}).name = "after";
  return b.finish();
}

TEST(NumericsGuard, BodyLayerOfAnIfIsNamedByItsPath) {
  ir::Model m = if_model();
  Tensor x = ramp({3, 4}, -1.f, 1.f);  // 6 negative values
  auto e = build(testing::clone(m));
  auto ctx = e->create_context();
  NumericsCheck check;
  check.enabled = true;
  ctx->set_numerics_check(check);
  bool c = true;
  ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
  ctx->set_input("c", HostTensor::borrow(static_cast<DataTypeCode>(DataType::kBool), {}, &c, 1));
  ctx->run();
  NumericsReport r = ctx->numerics_report();
  const NumericsFinding* f = r.first_error();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->layer, "cond/then_branch/then_Log");
  EXPECT_EQ(f->output, "t");
  EXPECT_EQ(f->bad, 6);
  EXPECT_EQ(f->index, 0) << "the body layer runs first, before its If is reported";
  EXPECT_EQ(r.layers_checked, 3);  // then_Log, cond, after
  // The else branch: nothing to report; the same context, the report is the new run's.
  c = false;
  ctx->set_input("c", HostTensor::borrow(static_cast<DataTypeCode>(DataType::kBool), {}, &c, 1));
  ctx->run();
  EXPECT_TRUE(ctx->numerics_report().findings.empty());
  // The reference interpreter names the same layer.
  std::map<std::string, ops::Value> in{{"x", ops::Value(x)},
                                       {"c", ops::Value(Tensor::scalar<bool>(DataType::kBool, true))}};
  NumericsReport rr = run_reference_checked(m, in);
  ASSERT_NE(rr.first_error(), nullptr);
  EXPECT_EQ(rr.first_error()->layer, "cond/then_branch/then_Log");
}

// Loop (3 trips): v = v * 1000 in the body; the second iteration leaves FP16's range (1e6), first
// seen inside the body, named by its path; the Loop's own output only carries it.
TEST(NumericsGuard, BodyLayerOfALoopIsCheckedEveryIteration) {
  GraphBuilder b(13);
  b.input("v0", {3}).output("v");
  b.init("trips", Tensor::scalar<int64_t>(DataType::kInt64, 3));
  b.init("go", Tensor::scalar<bool>(DataType::kBool, true));
  b.init("k", filled({3}, 1000.f));
  auto body = std::make_shared<ir::Graph>();
  body->name = "body";
  body->inputs = {{"i", ir::TypeInfo::tensor(DataType::kInt64, SymShape::from_dims({}))},
                  {"c", ir::TypeInfo::tensor(DataType::kBool, SymShape::from_dims({}))},
                  {"vin", ir::TypeInfo::tensor(DataType::kFloat32, SymShape::from_dims({3}))}};
  ir::Node id;
  id.name = "keep_going";
  id.op_type = "Identity";
  id.opset = 13;
  id.inputs = {"c"};
  id.outputs = {"cout"};
  ir::Node mul;
  mul.name = "scale";
  mul.op_type = "Mul";
  mul.opset = 13;
  mul.inputs = {"vin", "k"};
  mul.outputs = {"vout"};
  body->nodes = {id, mul};
  body->outputs = {{"cout", ir::TypeInfo()}, {"vout", ir::TypeInfo()}};
  ir::Node& loop = b.node("Loop", {"trips", "go", "v0"}, {"v"});
  loop.name = "loop";
  loop.attrs["body"] = ir::attr_graph(body);
  ir::Model m = b.finish();
  Tensor v0 = filled({3}, 1.f);
  auto e = build(testing::clone(m));
  for (const NumericsReport& r : {run_checked(*e, {{"v0", v0}}), run_reference_checked(m, {{"v0", ops::Value(v0)}})}) {
    EXPECT_EQ(r.layers_checked, 7);  // 3 iterations of 2 body layers, then the Loop
    ASSERT_EQ(r.findings.size(), 1u);
    const NumericsFinding& f = r.findings[0];
    EXPECT_EQ(f.kind, NumericsFinding::Kind::kFP16Overflow);
    EXPECT_EQ(f.layer, "loop/body/scale");
    EXPECT_EQ(f.index, 3) << "the second iteration's Mul";
    EXPECT_EQ(f.range.max, 1e6);
    ASSERT_GE(f.inputs.size(), 1u);
    EXPECT_EQ(f.inputs[0].max, 1e3);
    EXPECT_GE(r.propagated, 2);  // the third iteration and the Loop's output
  }
}

// Off, a context binds the steady-state path as before; on, it runs the observing path; off again,
// bound again.
TEST(NumericsGuard, OffLeavesTheBoundPathAlone) {
  auto e = build(fp16_overflow_model());
  auto ctx = e->create_context();
  Tensor x = ramp({1, 16}, 0.5f, 1.f);
  ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
  ctx->run();
  ctx->run();
  EXPECT_EQ(detail::steady_state_blocker(ctx->impl()), "");
  EXPECT_TRUE(ctx->numerics_report().findings.empty());
  NumericsCheck check;
  check.enabled = true;
  ctx->set_numerics_check(check);
  ctx->run();
  EXPECT_NE(detail::steady_state_blocker(ctx->impl()), "");
  EXPECT_EQ(ctx->numerics_report().findings.size(), 1u);
  HostTensor y = ctx->output("y");
  EXPECT_GT(y.as<float>()[0], engine::kFP16Max);
  check.enabled = false;
  ctx->set_numerics_check(check);
  ctx->run();
  ctx->run();
  EXPECT_EQ(detail::steady_state_blocker(ctx->impl()), "");
  EXPECT_TRUE(ctx->numerics_report().findings.empty());
}

TEST(NumericsGuard, LayerPrecisionFollowsTheAttributeThenTheDtype) {
  ir::Node n;
  n.op_type = "MatMul";
  std::vector<ops::Value> f32{ops::Value(Tensor(DataType::kFloat32, {2}))};
  std::vector<ops::Value> f16{ops::Value(Tensor(DataType::kFloat16, {2}))};
  std::vector<ops::Value> i8{ops::Value(Tensor(DataType::kInt8, {2}))};
  EXPECT_EQ(engine::layer_precision(n, f32), "fp32");
  EXPECT_EQ(engine::layer_precision(n, f16), "fp16");
  EXPECT_EQ(engine::layer_precision(n, i8), "int8");
  n.attrs["kiln.precision"] = ir::attr_string("fp16");
  EXPECT_EQ(engine::layer_precision(n, f32), "fp16");
}

// A layer marked fp16 whose FP32 output exceeds 65504 is an error, not a warning.
TEST(NumericsGuard, FP16LayerBeyondRangeIsAnError) {
  ir::Model m = fp16_overflow_model();
  for (auto& n : m.graph->nodes)
    if (n.name == "big_matmul") n.attrs["kiln.precision"] = ir::attr_string("fp16");
  NumericsReport r = run_reference_checked(m, {{"x", ops::Value(ramp({1, 16}, 0.5f, 1.f))}});
  const NumericsFinding* f = r.first_error();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->kind, NumericsFinding::Kind::kFP16Overflow);
  EXPECT_EQ(f->layer, "big_matmul");
  EXPECT_EQ(f->precision, "fp16");
  EXPECT_FALSE(f->warning);
}

}  // namespace
}  // namespace kiln
