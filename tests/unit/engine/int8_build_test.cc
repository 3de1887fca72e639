// kiln's own INT8 builds (calibrated) and Q/DQ models end up in INT8 layers, never in float work
// between Q/DQ pairs: the calibrator puts Q/DQ only where an INT8 layer takes them (a transformer's
// projections become kiln.QMatMul, its attention products and residual Adds stay FP32; a CNN's convs,
// residual Adds, pools and classifier are INT8), and a QuantizeLinear/DequantizeLinear that no INT8
// layer takes is a build warning, counted and recorded (build["qdq_unfolded"]), and fails the build
// under strict_tactics (engine/qdq_findings.cc).
#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "../graph_builder.h"
#include "backends/registry.h"
#include "core/npy.h"
#include "engine/engine_impl.h"
#include "ir/attribute_builders.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::GraphBuilder;
using testing::random_tensor;

// A transformer block in small, odd sizes: x [2, 9, 24] -> Q/K projections -> scores (Q K^T, an
// activation product) -> Softmax -> P V -> output projection + residual -> FFN (MatMul, GELU, MatMul)
// + residual -> y.
std::string block_bytes() {
  GraphBuilder b(20);
  b.input("x", {2, 9, 24}).output("y");
  auto linear = [&](const std::string& in, const std::string& p, int64_t k, int64_t n, const std::string& out) {
    b.init(p + "_w", random_tensor({k, n}, static_cast<uint64_t>(p[0]) * 7, DataType::kFloat32, -0.3, 0.3));
    b.init(p + "_b", random_tensor({n}, static_cast<uint64_t>(p[0]) * 7 + 1));
    b.node("MatMul", {in, p + "_w"}, {p + "_m"});
    b.node("Add", {p + "_m", p + "_b"}, {out});
  };
  linear("x", "q", 24, 24, "q");
  linear("x", "k", 24, 24, "k");
  linear("x", "v", 24, 24, "v");
  b.node("Transpose", {"k"}, {"kt"}).attrs["perm"] = ir::attr_ints({0, 2, 1});
  b.node("MatMul", {"q", "kt"}, {"s"});
  b.node("Softmax", {"s"}, {"p"}).attrs["axis"] = ir::attr_int(-1);
  b.node("MatMul", {"p", "v"}, {"ctx"});
  linear("ctx", "o", 24, 24, "o");
  b.node("Add", {"o", "x"}, {"h"});
  linear("h", "f", 24, 37, "f");
  b.node("Gelu", {"f"}, {"g"});
  linear("g", "e", 37, 24, "e");
  b.node("Add", {"e", "h"}, {"y"});
  return onnx_import::serialize_model(b.finish()).value();
}

// Conv -> Relu -> Conv -> Add(residual) -> Relu -> GlobalAveragePool -> Flatten -> Gemm, batch 2.
std::string cnn_bytes() {
  GraphBuilder b;
  b.input("x", {2, 3, 11, 9});
  b.init("w1", random_tensor({6, 3, 3, 3}, 1)).init("b1", random_tensor({6}, 2));
  b.init("w2", random_tensor({6, 6, 3, 3}, 3, DataType::kFloat32, -0.3, 0.3));
  b.init("wf", random_tensor({4, 6}, 4)).init("bf", random_tensor({4}, 5));
  b.conv({"x", "w1", "b1"}, "c1", 1);
  b.node("Relu", {"c1"}, {"r1"});
  b.conv({"r1", "w2"}, "c2", 1);
  b.node("Add", {"c2", "r1"}, {"a"});
  b.node("Relu", {"a"}, {"r2"});
  b.node("GlobalAveragePool", {"r2"}, {"p"});
  b.node("Flatten", {"p"}, {"f"});
  b.gemm_t({"f", "wf", "bf"}, "logits");
  b.output("logits");
  return onnx_import::serialize_model(b.finish()).value();
}

struct Int8BuildTest : ::testing::Test {
  fs::path dir;
  std::vector<std::string> warnings;
  void SetUp() override {
    if (!backends::find_tactic("q_matmul_onednn_u8s8s32")) GTEST_SKIP() << "built without oneDNN";
    dir = fs::temp_directory_path() / ("kiln_int8_build_test_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  BuilderConfig config(const std::string& input, Dims calib) {
    BuilderConfig c;
    c.precision = Precision::kINT8;
    c.calib_data = (dir / "calib.npz").string();
    c.calib_batch_size = 2;
    EXPECT_TRUE(write_npz(c.calib_data, {{input, random_tensor(calib, 99)}}).ok());
    c.warn = [this](const std::string& w) { warnings.push_back(w); };
    return c;
  }
  static std::map<std::string, int> ops(const Engine& e) {
    std::map<std::string, int> n;
    for (const auto& l : e.impl().layers) n[(l.domain.empty() ? "" : l.domain + ".") + l.op_type]++;
    return n;
  }
  static std::vector<float> run(const Engine& e, const std::string& in, const Tensor& x, const std::string& out) {
    auto ctx = e.create_context();
    ctx->set_input(in, HostTensor::f32(x.shape(), x.data<float>()));
    ctx->run();
    HostTensor y = ctx->output(out);
    return std::vector<float>(y.as<float>(), y.as<float>() + y.numel());
  }
  static void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double rel) {
    ASSERT_EQ(got.size(), ref.size());
    double worst = 0, span = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - ref[i])));
    for (float v : ref) span = std::max(span, double(std::fabs(v)));
    EXPECT_GT(worst, 0) << "quantization changes the numbers";
    EXPECT_LT(worst, rel * span);
  }
};

TEST_F(Int8BuildTest, TransformerProjectionsBecomeQMatMulAndNothingIsLeft) {
  const std::string model = block_bytes();
  auto e = Builder(config("x", {4, 9, 24})).build_from_memory(model);
  auto n = ops(*e);
  EXPECT_EQ(n["kiln.QMatMul"], 6) << e->inspect_json();       // q, k, v, o and the FFN's two
  EXPECT_EQ(n["QuantizeLinear"] + n["DequantizeLinear"], 1);  // x's quantizer, shared by q, k, v
  const auto& rec = e->impl().build["qdq_unfolded"];
  EXPECT_EQ(rec["layers"].get<int>(), 0) << rec.dump();
  EXPECT_EQ(rec["int8_layers"].get<int>(), 6);
  for (const auto& w : warnings) EXPECT_EQ(w.find("no INT8 layer takes"), std::string::npos) << w;
  for (const auto& l : e->impl().layers)
    if (l.op_type == "QMatMul") EXPECT_EQ(l.kernel, "q_matmul_onednn_u8s8s32");
  Tensor x = random_tensor({2, 9, 24}, 5);
  auto fp32 = Builder().build_from_memory(model);
  expect_close(run(*e, "x", x, "y"), run(*fp32, "x", x, "y"), 0.05);
}

TEST_F(Int8BuildTest, CnnIsInt8FromInputToLogits) {
  const std::string model = cnn_bytes();
  auto e = Builder(config("x", {8, 3, 11, 9})).build_from_memory(model);
  auto n = ops(*e);
  EXPECT_EQ(n["kiln.QConv"], 2);
  EXPECT_EQ(n["kiln.QPool"], 1);
  EXPECT_EQ(n["kiln.QMatMul"], 1);  // the classifier, float logits out
  EXPECT_EQ(n["Gemm"] + n["kiln.FusedGemm"] + n["DequantizeLinear"], 0);
  EXPECT_EQ(e->impl().build["qdq_unfolded"]["layers"].get<int>(), 0);
  Tensor x = random_tensor({2, 3, 11, 9}, 5);
  auto fp32 = Builder().build_from_memory(model);
  expect_close(run(*e, "x", x, "logits"), run(*fp32, "x", x, "logits"), 0.1);
}

// x -> Q -> DQ -> Sigmoid (no INT8 layer) -> y: both conversions are findings.
std::string unfolded_bytes() {
  GraphBuilder b(13);
  b.input("x", {3, 40}).output("y");
  b.init("s", Tensor::scalar<float>(DataType::kFloat32, 0.02f))
      .init("z", Tensor::scalar<uint8_t>(DataType::kUInt8, 128));
  b.node("QuantizeLinear", {"x", "s", "z"}, {"xq"}).name = "quant_x";
  b.node("DequantizeLinear", {"xq", "s", "z"}, {"xd"}).name = "dequant_x";
  b.node("Sigmoid", {"xd"}, {"y"}).name = "gate";
  return onnx_import::serialize_model(b.finish()).value();
}

TEST_F(Int8BuildTest, UnfoldedQdqIsWarnedRecordedAndFailsUnderStrict) {
  BuilderConfig c;
  c.warn = [this](const std::string& w) { warnings.push_back(w); };
  auto e = Builder(c).build_from_memory(unfolded_bytes());
  const auto& rec = e->impl().build["qdq_unfolded"];
  EXPECT_EQ(rec["layers"].get<int>(), 2);
  ASSERT_EQ(rec["list"].size(), 2u);
  EXPECT_EQ(rec["list"][0]["layer"], "quant_x");
  EXPECT_NE(rec["list"][0]["reason"].get<std::string>().find("'gate' (Sigmoid)"), std::string::npos) << rec.dump();
  EXPECT_EQ(rec["list"][1]["layer"], "dequant_x");
  int warned = 0;
  for (const auto& w : warnings) warned += w.find("no INT8 layer takes it") != std::string::npos;
  EXPECT_EQ(warned, 2);
  // Kept in the engine file: kiln inspect shows it.
  auto loaded = Engine::deserialize(e->serialize());
  auto j = nlohmann::json::parse(loaded->inspect_json());
  EXPECT_EQ(j["build"]["qdq_unfolded"]["layers"].get<int>(), 2);

  c.strict_tactics = true;
  try {
    Builder(c).build_from_memory(unfolded_bytes());
    FAIL() << "strict_tactics built an engine with unfolded Q/DQ";
  } catch (const Error& err) {
    EXPECT_EQ(err.category(), ErrorCategory::kUnsupported);
    std::string m = err.what();
    EXPECT_NE(m.find("2 QuantizeLinear/DequantizeLinear layers that no INT8 layer takes"), std::string::npos) << m;
    EXPECT_NE(m.find("layer 'quant_x' (QuantizeLinear)"), std::string::npos) << m;
    EXPECT_NE(m.find("layer 'dequant_x' (DequantizeLinear)"), std::string::npos) << m;
  }
}

TEST_F(Int8BuildTest, FloatEnginesHaveNoRecord) {
  auto e = Builder().build_from_memory(cnn_bytes());
  EXPECT_FALSE(e->impl().build.contains("qdq_unfolded"));
}

}  // namespace
}  // namespace kiln
