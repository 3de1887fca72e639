// Layers left on reference kernels are findings (issue 11): the builder records why (each declining
// tactic, or no tactic for the op), tells shape work apart, measures their share, keeps the record
// through save/load and inspect, fails under strict_tactics naming them; a tactic that declines the
// run-time shapes is counted per context and warned about once. Engines prepare their tactics ahead:
// run() prepares nothing at the typical shapes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../engine_util.h"
#include "../graph_builder.h"
#include "backends/registry.h"
#include "engine/engine_impl.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"

namespace kiln {
namespace {

using testing::GraphBuilder;
using testing::random_tensor;

// x [4, 32] -> MatMul (has tactics) -> CumSum along axis 1 (no tactic implements CumSum: a fallback
// until a test here changes) -> "logits" [4, 64]. Not shape work: 256 floats in.
std::string resize_onnx() {
  GraphBuilder b(13);
  b.input("x", {4, 32}).output("logits");
  b.init("w", random_tensor({32, 64}, 1));
  b.init("axis", Tensor::scalar<int64_t>(DataType::kInt64, 1));
  b.node("MatMul", {"x", "w"}, {"h"});
  b.node("CumSum", {"h", "axis"}, {"logits"}).name = "upsample";
  ir::Model m = b.finish();
  return onnx_import::serialize_model(m).value();
}

const detail::LayerInfo* layer(const Engine& e, const std::string& op) {
  for (const auto& l : e.impl().layers)
    if (l.op_type == op) return &l;
  return nullptr;
}

TEST(ReferenceLayers, RecordedWithReasonsAndMeasuredShare) {
  auto e = Builder().build_from_memory(resize_onnx());
  const detail::LayerInfo* r = layer(*e, "CumSum");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->kernel, "reference");
  EXPECT_TRUE(r->reference.recorded);
  EXPECT_FALSE(r->reference.shape_work);
  EXPECT_TRUE(r->finding());
  ASSERT_EQ(r->reference.reasons.size(), 1u);
  EXPECT_EQ(r->reference.reasons[0], "no tactic implements CumSum");
  EXPECT_GE(r->reference.ms, 0);
  const auto& rec = e->impl().build["reference"];
  EXPECT_EQ(rec["layers"].get<int>(), 1);
  EXPECT_GT(rec["estimated_ms"].get<double>(), 0);
  EXPECT_GE(rec["estimated_ms"].get<double>(), rec["reference_ms"].get<double>());
  if (!backends::all_tactics().empty()) {
    const detail::LayerInfo* mm = layer(*e, "MatMul");
    ASSERT_NE(mm, nullptr);
    EXPECT_NE(mm->kernel, "reference");
    EXPECT_FALSE(mm->reference.recorded);
  }

  // Kept through the engine file, listed by inspect with its share of the estimated time.
  auto loaded = Engine::deserialize(e->serialize());
  const detail::LayerInfo* lr = layer(*loaded, "CumSum");
  ASSERT_NE(lr, nullptr);
  EXPECT_TRUE(lr->finding());
  EXPECT_EQ(lr->reference.reasons, r->reference.reasons);
  EXPECT_DOUBLE_EQ(lr->reference.ms, r->reference.ms);
  auto j = nlohmann::json::parse(loaded->inspect_json());
  ASSERT_EQ(j["reference_layers"].size(), 1u);
  const auto& jl = j["reference_layers"][0];
  EXPECT_EQ(jl["layer"], "upsample");
  EXPECT_EQ(jl["op"], "CumSum");
  EXPECT_EQ(jl["opset"].get<int>(), 13);
  EXPECT_GT(jl["share"].get<double>(), 0);
  EXPECT_LE(jl["share"].get<double>(), 1);
  EXPECT_EQ(jl["reasons"][0], "no tactic implements CumSum");
}

TEST(ReferenceLayers, StrictTacticsFailsNamingEveryLayer) {
  BuilderConfig cfg;
  cfg.strict_tactics = true;
  try {
    Builder(cfg).build_from_memory(resize_onnx());
    FAIL() << "strict_tactics built an engine with a reference layer";
  } catch (const Error& err) {
    EXPECT_EQ(err.category(), ErrorCategory::kUnsupported);
    std::string m = err.what();
    EXPECT_NE(m.find("--strict-tactics: 1 layer would run reference kernels"), std::string::npos) << m;
    EXPECT_NE(m.find("layer 'upsample' (CumSum, opset 13): no tactic implements CumSum"), std::string::npos) << m;
    EXPECT_EQ(m.find("MatMul"), std::string::npos) << m;
  }
}

TEST(ReferenceLayers, TacticsLeftOutAreTheReason) {
  if (backends::all_tactics().empty()) GTEST_SKIP() << "built without tactics";
  BuilderConfig cfg;
  cfg.tactics = {"softmax_kiln"};  // nothing for the MatMul
  auto e = Builder(cfg).build_from_memory(resize_onnx());
  const detail::LayerInfo* mm = layer(*e, "MatMul");
  ASSERT_NE(mm, nullptr);
  EXPECT_TRUE(mm->finding());
  ASSERT_FALSE(mm->reference.reasons.empty());
  for (const auto& why : mm->reference.reasons)
    EXPECT_NE(why.find(": left out by --tactics"), std::string::npos) << why;
  EXPECT_EQ(e->impl().build["reference"]["layers"].get<int>(), 2);
}

// The rule that keeps shape computations out of the findings (engine::is_shape_work).
TEST(ReferenceLayers, ShapeWorkRule) {
  ir::Graph g;
  auto type = [&](const std::string& v, DataType dt, Dims d) {
    g.value_types[v] = ir::TypeInfo::tensor(dt, SymShape::from_dims(d));
  };
  type("big", DataType::kFloat32, {1, 8, 100});
  type("shape", DataType::kInt64, {3});
  type("shape_f", DataType::kFloat32, {3});
  type("ids", DataType::kInt64, {5000});
  type("pos", DataType::kInt64, {128});
  type("out", DataType::kFloat32, {1, 8, 200});
  auto node = [](const std::string& op, std::vector<std::string> in, std::vector<std::string> out) {
    ir::Node n;
    n.op_type = op, n.inputs = std::move(in), n.outputs = std::move(out);
    return n;
  };
  EXPECT_TRUE(engine::is_shape_work(g, node("Shape", {"big"}, {"shape"})));  // moves no elements
  EXPECT_TRUE(engine::is_shape_work(g, node("Reshape", {"big", "shape"}, {"out"})));
  EXPECT_TRUE(engine::is_shape_work(g, node("Cast", {"shape"}, {"shape_f"})));  // tiny
  EXPECT_TRUE(engine::is_shape_work(g, node("Range", {"", ""}, {"pos"})));      // small integers
  EXPECT_FALSE(engine::is_shape_work(g, node("CumSum", {"big", "", "shape_f"}, {"out"})));
  EXPECT_FALSE(engine::is_shape_work(g, node("Neg", {"ids"}, {"ids"})));        // 5000 integers
  EXPECT_FALSE(engine::is_shape_work(g, node("Neg", {"unknown"}, {"shape"})));  // size not known
}

// LayerNormalization asked for its Mean output: kiln's LayerNorm tactic declines it.
std::string layer_norm_with_mean_onnx() {
  GraphBuilder b(17);
  b.input("x", {8, 32}).output("logits").output("mean");
  b.init("scale", random_tensor({32}, 2));
  b.node("LayerNormalization", {"x", "scale"}, {"logits", "mean"}).name = "ln";
  ir::Model m = b.finish();
  return onnx_import::serialize_model(m).value();
}

TEST(ReferenceLayers, DecliningTacticIsNamedWithItsReason) {
  if (!backends::find_tactic("layer_norm_kiln")) GTEST_SKIP() << "no layer_norm_kiln";
  auto e = Builder().build_from_memory(layer_norm_with_mean_onnx());
  const detail::LayerInfo* ln = layer(*e, "LayerNormalization");
  ASSERT_NE(ln, nullptr);
  ASSERT_TRUE(ln->finding());
  bool named = false;
  for (const auto& why : ln->reference.reasons) named |= why == "layer_norm_kiln: Mean/InvStdDev outputs are asked for";
  EXPECT_TRUE(named) << ::testing::PrintToString(ln->reference.reasons);
}

// A tactic that cannot take the run-time shapes: here the engine's record names layer_norm_kiln for
// the layer it declines (as an engine tuned at other shapes would), so every run falls back.
TEST(ReferenceLayers, RunTimeDeclineIsCountedAndWarnedOnce) {
  if (!backends::find_tactic("layer_norm_kiln")) GTEST_SKIP() << "no layer_norm_kiln";
  auto built = Builder().build_from_memory(layer_norm_with_mean_onnx());
  auto impl = detail::deserialize_engine(built->serialize());
  ASSERT_TRUE(impl.ok()) << impl.status().to_string();
  for (auto& l : impl.value()->layers)
    if (l.op_type == "LayerNormalization") l.kernel = "layer_norm_kiln";
  auto e = std::make_shared<Engine>(impl.value());
  ::testing::internal::CaptureStderr();
  auto ctx = e->create_context();
  Tensor x = random_tensor({8, 32}, 5);
  ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
  for (int i = 0; i < 3; ++i) ctx->run();
  std::string err = ::testing::internal::GetCapturedStderr();
  size_t at = err.find("layer 'ln' (LayerNormalization): tactic layer_norm_kiln cannot take the input shapes");
  EXPECT_NE(at, std::string::npos) << err;
  EXPECT_EQ(err.find("layer 'ln'", at + 1), std::string::npos) << "warned more than once: " << err;
  std::vector<int64_t> declined = detail::declined_runs(ctx->impl());
  ASSERT_EQ(declined.size(), 1u);
  EXPECT_EQ(declined[0], 3);
  EXPECT_EQ(ctx->output("logits").shape, (std::vector<int64_t>{8, 32}));
}

// conv -> relu -> conv -> flatten -> gemm: every heavy layer has a tactic. `dynamic_batch`: the
// input's first dim is a symbol (an export with dynamic axes).
std::string cnn_onnx(bool dynamic_batch = false) {
  GraphBuilder b(13);
  b.input("x", {1, 4, 9, 9}).output("logits");
  b.init("w1", random_tensor({8, 4, 3, 3}, 1)).init("w2", random_tensor({8, 8, 1, 1}, 2));
  b.init("fc", random_tensor({5, 8 * 9 * 9}, 3));
  b.conv({"x", "w1"}, "c1", 1);
  b.node("Relu", {"c1"}, {"r1"});
  b.conv({"r1", "w2"}, "c2");
  b.node("Flatten", {"c2"}, {"flat"});
  b.gemm_t({"flat", "fc"}, "logits");
  ir::Model m = b.finish();
  if (dynamic_batch) {
    m.graph->inputs[0].type.shape.dims[0] = Dim::symbol("N");
    m.graph->value_types.clear();  // inferred at batch 1: the import infers them again
  }
  return onnx_import::serialize_model(m).value();
}

TEST(ReferenceLayers, LoadedEngineRunsWithoutPreparing) {
  if (backends::all_tactics().empty()) GTEST_SKIP() << "built without tactics";
  auto built = Builder().build_from_memory(cnn_onnx());
  auto e = Engine::deserialize(built->serialize());
  int with_tactic = 0;
  for (const auto& l : e->impl().layers) with_tactic += l.kernel != "reference";
  ASSERT_GE(with_tactic, 3);
  auto ctx = e->create_context();  // prepares every layer for the typical shapes
  auto runtime = e->impl().tactic_runtime();
  int prepared = runtime->prepares();
  EXPECT_EQ(prepared, with_tactic);
  Tensor x = random_tensor({1, 4, 9, 9}, 7);
  ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
  ctx->run();
  EXPECT_EQ(runtime->prepares(), prepared) << "run() prepared a tactic";
  auto other = e->create_context();  // shares the prepared layers
  other->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
  other->run();
  EXPECT_EQ(runtime->prepares(), prepared);
  BuilderConfig ref_cfg;
  ref_cfg.tactics = {"reference"};
  auto ref = Builder(ref_cfg).build_from_memory(cnn_onnx());
  testing::expect_close(testing::run_logits(*e, x), testing::run_logits(*ref, x));
}

// An export with a dynamic batch built without a profile (kiln build model.onnx -o model.kiln): the
// layers are prepared ahead at batch 1, so that a loaded engine's first run() at batch 1 prepares
// nothing (its weights are not reordered then); another batch is prepared on first use.
TEST(ReferenceLayers, DynamicBatchWithoutAProfileIsPreparedAheadAtBatchOne) {
  // Counts the layers prepared ahead: the CNN's convs have tactics only with oneDNN (not in the ASan tree).
  if (!backends::find_tactic("conv2d_onednn_nchwc")) GTEST_SKIP() << "built without oneDNN";
  auto built = Builder().build_from_memory(cnn_onnx(true));
  auto e = Engine::deserialize(built->serialize());
  auto ahead = e->impl().ahead_shapes();
  ASSERT_TRUE(ahead.ok()) << ahead.status().to_string();
  EXPECT_EQ(ahead.value().at("x"), (Dims{1, 4, 9, 9}));
  EXPECT_FALSE(e->impl().typical_shapes().ok()) << "no profile and a symbolic batch: no typical shapes";
  auto ctx = e->create_context();
  auto runtime = e->impl().tactic_runtime();
  const int prepared = runtime->prepares();
  EXPECT_GE(prepared, 3);
  BuilderConfig ref_cfg;
  ref_cfg.tactics = {"reference"};
  auto ref = Builder(ref_cfg).build_from_memory(cnn_onnx(true));
  Tensor x = random_tensor({1, 4, 9, 9}, 7);
  testing::expect_close(testing::run_logits(*e, x), testing::run_logits(*ref, x));
  ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
  ctx->run();
  EXPECT_EQ(runtime->prepares(), prepared) << "the first run() at batch 1 prepared a tactic";
  Tensor x2 = random_tensor({2, 4, 9, 9}, 8);
  testing::expect_close(testing::run_logits(*e, x2), testing::run_logits(*ref, x2));
  EXPECT_GT(runtime->prepares(), prepared) << "batch 2 is prepared on first use";
}

}  // namespace
}  // namespace kiln
