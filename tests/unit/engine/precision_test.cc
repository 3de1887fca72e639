// Per-layer precision (engine/precision.h): the build's allowed precisions, --layer-precisions with
// --precision-constraints obey / prefer / none, --strongly-typed, --fp16's refusal, and what the
// engine records (each layer's precision, kept by the engine file).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "../graph_builder.h"
#include "backends/registry.h"
#include "core/target.h"
#include "engine/engine_impl.h"
#include "engine/precision.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "tune/layer_key.h"

namespace kiln {
namespace {

using testing::GraphBuilder;
using testing::random_tensor;

bool has_bf16_cpu() { return (host_isa() & kIsaAvx512Bf16) != 0; }
// The BF16 tactics are oneDNN's: a build without oneDNN (the sanitizer tree) has none.
bool has_bf16_tactics() { return backends::find_tactic("matmul_onednn_bf16_packed") != nullptr; }

// x [8, 256] -> fc1 (MatMul 256x192) -> + b -> Relu -> fc2 (MatMul 192x40) -> y
std::string mlp_onnx() {
  GraphBuilder b(13);
  b.input("x", {8, 256}).output("y");
  b.init("w1", random_tensor({256, 192}, 21)).init("b1", random_tensor({192}, 22));
  b.init("w2", random_tensor({192, 40}, 23));
  b.node("MatMul", {"x", "w1"}, {"h"}).name = "fc1";
  b.node("Add", {"h", "b1"}, {"hb"}).name = "bias1";
  b.node("Relu", {"hb"}, {"r"}).name = "relu1";
  b.node("MatMul", {"r", "w2"}, {"y"}).name = "fc2";
  return onnx_import::serialize_model(b.finish()).value();
}

// The layer that came from ONNX node `source` (its name or one of its sources).
nlohmann::json layer_from(const nlohmann::json& inspect, const std::string& source) {
  for (const auto& l : inspect["layers"]) {
    if (l["name"] == source) return l;
    for (const auto& s : l["sources"])
      if (s == source) return l;
  }
  ADD_FAILURE() << "no layer from " << source;
  return {};
}

std::vector<float> run_mlp(const Engine& e) {
  Tensor x = random_tensor({8, 256}, 5);
  auto ctx = e.create_context();
  ctx->set_input("x", HostTensor::f32({8, 256}, x.data<float>()));
  ctx->run();
  HostTensor y = ctx->output("y");
  return std::vector<float>(y.as<float>(), y.as<float>() + y.numel());
}

std::string build_error(const BuilderConfig& cfg, ErrorCategory* cat = nullptr) {
  try {
    Builder(cfg).build_from_memory(mlp_onnx());
  } catch (const Error& e) {
    if (cat) *cat = e.category();
    return e.what();
  }
  return "";
}

TEST(Precision, GlobsMatchLikeTheShell) {
  EXPECT_TRUE(engine::glob_match("fc1", "fc1"));
  EXPECT_FALSE(engine::glob_match("fc1", "fc10"));
  EXPECT_TRUE(engine::glob_match("fc*", "fc10"));
  EXPECT_TRUE(engine::glob_match("/encoder/*/attention/*", "/encoder/layer.3/attention/MatMul_1"));
  EXPECT_TRUE(engine::glob_match("*", ""));
  EXPECT_TRUE(engine::glob_match("a?c", "abc"));
  EXPECT_FALSE(engine::glob_match("a?c", "ac"));
  EXPECT_TRUE(engine::glob_match("*a*b", "xxaxxbyyb"));
  EXPECT_FALSE(engine::glob_match("*a*b", "xxaxxby"));
}

TEST(Precision, Fp16IsRefusedSayingWhy) {
  BuilderConfig cfg;
  cfg.precision = Precision::kFP16;
  ErrorCategory cat{};
  const std::string msg = build_error(cfg, &cat);
  EXPECT_EQ(cat, ErrorCategory::kUnsupported);
  EXPECT_NE(msg.find("no kernel computing in fp16 on cpu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("FP16 arithmetic"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--bf16"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--fp32"), std::string::npos) << msg;
  // --best allows every precision that has kernels: FP16 has none here, and that is no error.
  cfg.precision = Precision::kMixed;
  EXPECT_EQ(build_error(cfg), "");
}

TEST(Precision, StronglyTypedTakesNoOtherPrecision) {
  BuilderConfig cfg;
  cfg.strongly_typed = true;
  cfg.precision = Precision::kBF16;
  ErrorCategory cat{};
  EXPECT_NE(build_error(cfg, &cat).find("--strongly-typed"), std::string::npos);
  EXPECT_EQ(cat, ErrorCategory::kInvalidArgument);
  cfg.precision = Precision::kFP32;
  cfg.layer_precisions = {{"fc1", Precision::kBF16}};
  EXPECT_NE(build_error(cfg).find("--strongly-typed"), std::string::npos);
  // A float32 graph, strongly typed: every layer computes in float32.
  cfg.layer_precisions.clear();
  auto e = Builder(cfg).build_from_memory(mlp_onnx());
  const nlohmann::json parsed1 = nlohmann::json::parse(e->inspect_json());
  for (const auto& l : parsed1["layers"]) EXPECT_EQ(l["precision"], "fp32");
}

TEST(Precision, LayerPrecisionsObeyedPerLayer) {
  if (!has_bf16_cpu()) GTEST_SKIP() << "this CPU lacks AVX-512 BF16";
  if (!has_bf16_tactics()) GTEST_SKIP() << "built without oneDNN: no BF16 tactics";
  BuilderConfig cfg;
  cfg.precision = Precision::kBF16;
  cfg.precision_constraints = PrecisionConstraints::kObey;
  cfg.layer_precisions = {{"fc1", Precision::kFP32}, {"fc*", Precision::kBF16}};  // first match wins
  auto e = Builder(cfg).build_from_memory(mlp_onnx());
  auto j = nlohmann::json::parse(e->inspect_json());
  nlohmann::json fc1 = layer_from(j, "fc1"), fc2 = layer_from(j, "fc2");
  EXPECT_EQ(fc1["precision"], "fp32") << fc1.dump();
  const backends::Tactic* t1 = backends::find_tactic(fc1["kernel"].get<std::string>());
  ASSERT_NE(t1, nullptr) << fc1["kernel"];
  EXPECT_EQ(t1->info().compute, DataType::kFloat32);
  EXPECT_EQ(fc2["precision"], "bf16") << fc2.dump();
  EXPECT_EQ(fc2["kernel"], "matmul_onednn_bf16_packed");
  // No BF16 candidate was offered to fc1, and only BF16 ones to fc2.
  for (const auto& c : fc1["candidates"]) EXPECT_NE(c["tactic"], "matmul_onednn_bf16_packed");
  for (const auto& c : fc2["candidates"]) EXPECT_EQ(c["tactic"], "matmul_onednn_bf16_packed");
  // The engine file keeps each layer's precision.
  auto loaded = Engine::deserialize(e->serialize());
  auto jl = nlohmann::json::parse(loaded->inspect_json());
  EXPECT_EQ(layer_from(jl, "fc2")["precision"], "bf16");
  EXPECT_EQ(layer_from(jl, "fc1")["precision"], "fp32");
  // It computes what the FP32 engine does, to bf16's rounding of fc2's operands (K = 192), and not
  // exactly (its kernel rounds).
  std::vector<float> got = run_mlp(*loaded), want = run_mlp(*Builder().build_from_memory(mlp_onnx()));
  ASSERT_EQ(got.size(), want.size());
  double max_err = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i)
    max_err = std::max(max_err, double(std::fabs(got[i] - want[i]))),
    scale = std::max(scale, double(std::fabs(want[i])));
  EXPECT_GT(max_err, 0);
  EXPECT_LT(max_err, 0.02 * scale);
}

TEST(Precision, ObeyFailsNamingTheLayerAndPreferFallsBack) {
  BuilderConfig cfg;
  cfg.precision_constraints = PrecisionConstraints::kObey;
  cfg.layer_precisions = {{"fc2", Precision::kFP16}};  // no FP16 kernel exists
  ErrorCategory cat{};
  std::string msg = build_error(cfg, &cat);
  EXPECT_EQ(cat, ErrorCategory::kUnsupported);
  EXPECT_NE(msg.find("layer 'fc2'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'fc2:fp16' cannot be met"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--precision-constraints prefer"), std::string::npos) << msg;

  cfg.precision_constraints = PrecisionConstraints::kPrefer;
  std::vector<std::string> warnings;
  cfg.warn = [&](const std::string& w) { warnings.push_back(w); };
  auto e = Builder(cfg).build_from_memory(mlp_onnx());
  auto fc2 = layer_from(nlohmann::json::parse(e->inspect_json()), "fc2");
  EXPECT_EQ(fc2["precision"], "fp32");
  EXPECT_NE(fc2["kernel"], "reference");  // the fallback got its FP32 tactic back
  bool named = false;
  for (const auto& w : warnings) named |= w.find("layer 'fc2'") != std::string::npos;
  EXPECT_TRUE(named) << "no warning names fc2";

  // none: layer precisions ignored, with a warning that they are.
  cfg.precision_constraints = PrecisionConstraints::kNone;
  warnings.clear();
  Builder(cfg).build_from_memory(mlp_onnx());
  bool ignored = false;
  for (const auto& w : warnings) ignored |= w.find("--layer-precisions: ignored") != std::string::npos;
  EXPECT_TRUE(ignored);
}

// A target without AVX-512 BF16 (here: --isa avx512_vnni caps this machine's): --bf16 warns, naming
// the feature, and every layer stays FP32.
TEST(Precision, Bf16WithoutAvx512Bf16WarnsAndBuildsFp32) {
  if (!(host_isa() & kIsaAvx512Vnni)) GTEST_SKIP() << "needs a CPU with avx512_vnni (the cap used)";
  if (!has_bf16_tactics()) GTEST_SKIP() << "built without oneDNN: no BF16 tactics";
  BuilderConfig cfg;
  cfg.precision = Precision::kBF16;
  cfg.isa = "avx512_vnni";
  std::vector<std::string> warnings;
  cfg.warn = [&](const std::string& w) { warnings.push_back(w); };
  auto e = Builder(cfg).build_from_memory(mlp_onnx());
  bool said = false;
  for (const auto& w : warnings) said |= w.find("--bf16: its kernels need avx512_bf16") != std::string::npos;
  EXPECT_TRUE(said) << (warnings.empty() ? "no warning" : warnings[0]);
  const nlohmann::json parsed2 = nlohmann::json::parse(e->inspect_json());
  for (const auto& l : parsed2["layers"]) EXPECT_EQ(l["precision"], "fp32");
}

// The timing cache keys a layer's timings on the precision it computes in.
TEST(Precision, TimingCacheKeysCarryThePrecision) {
  ir::Node n;
  n.op_type = "MatMul", n.opset = 13, n.inputs = {"a", "b"}, n.outputs = {"y"};
  backends::LayerSignature sig;
  sig.node = &n;
  const std::string f32 = tune::layer_key(sig);
  sig.compute = DataType::kBFloat16;
  EXPECT_NE(tune::layer_key(sig), f32);
  EXPECT_NE(tune::layer_key(sig).find("bfloat16"), std::string::npos) << tune::layer_key(sig);
}

TEST(Precision, ResolutionPerLayer) {
  engine::PrecisionPolicy p;
  p.allowed = {DataType::kFloat32, DataType::kBFloat16};
  p.rules = {{"enc/*", DataType::kFloat32}};
  auto lp = engine::layer_precisions(p, {"fused_3", "enc/fc"}, DataType::kFloat32);  // matched by a source
  EXPECT_EQ(lp.allowed, std::vector<DataType>{DataType::kFloat32});
  EXPECT_EQ(lp.required, DataType::kFloat32);
  EXPECT_EQ(lp.fallback, p.allowed);
  EXPECT_TRUE(engine::layer_pinned_fp32(p, {"enc/fc"}));
  lp = engine::layer_precisions(p, {"dec/fc"}, DataType::kFloat32);
  EXPECT_EQ(lp.allowed, p.allowed);
  EXPECT_EQ(lp.required, DataType::kUndefined);
  EXPECT_FALSE(engine::layer_pinned_fp32(p, {"dec/fc"}));
  // The graph's int8 input (a Q/DQ-folded layer) allows int8 first, without --int8.
  lp = engine::layer_precisions(p, {"qconv"}, DataType::kUInt8);
  EXPECT_EQ(lp.allowed, (std::vector<DataType>{DataType::kInt8, DataType::kFloat32, DataType::kBFloat16}));
  p.constraints = PrecisionConstraints::kNone;
  EXPECT_FALSE(engine::layer_pinned_fp32(p, {"enc/fc"}));
  p.strongly_typed = true;
  EXPECT_EQ(engine::layer_precisions(p, {"x"}, DataType::kBFloat16).allowed,
            std::vector<DataType>{DataType::kBFloat16});
}

}  // namespace
}  // namespace kiln
