// Automatic mixed precision (engine/auto_precision.h): the --tolerance parser, the error metrics, and
// the search on a model where one layer is known to be wrecked by INT8 (it must stay FP32, the others
// reduced), with what kiln inspect records.
#include "engine/auto_precision.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

#include "../graph_builder.h"
#include "core/npy.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using detail::parse_tolerance;
using detail::Tolerance;

TEST(ToleranceParser, AtolRtolAndTopK) {
  auto t = parse_tolerance("logits:atol=1e-3,rtol=0.01");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t.value().output, "logits");
  EXPECT_EQ(t.value().kind, Tolerance::Kind::kClose);
  EXPECT_DOUBLE_EQ(t.value().atol, 1e-3);
  EXPECT_DOUBLE_EQ(t.value().rtol, 0.01);
  auto a = parse_tolerance("hidden:atol=0.05");
  ASSERT_TRUE(a.ok());
  EXPECT_DOUBLE_EQ(a.value().rtol, 0);
  auto k = parse_tolerance("out:put:top5=0.99");  // the output name may hold ':'
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  EXPECT_EQ(k.value().output, "out:put");
  EXPECT_EQ(k.value().kind, Tolerance::Kind::kTopK);
  EXPECT_EQ(k.value().k, 5);
  EXPECT_DOUBLE_EQ(k.value().agreement, 0.99);
}

TEST(ToleranceParser, RefusesMalformedSpecs) {
  for (const char* bad : {"logits", ":top1=0.9", "logits:", "logits:top1", "logits:top1=1.5", "logits:top1=0",
                          "logits:top0=0.9", "logits:atol=-1", "logits:atol=x", "logits:foo=1", "logits:atol=0,rtol=0",
                          "logits:atol=1e-3,top1=0.9", "logits:top1=0.9,top5=0.99"}) {
    auto t = parse_tolerance(bad);
    EXPECT_FALSE(t.ok()) << bad;
    if (!t.ok()) EXPECT_NE(t.status().message().find("--tolerance"), std::string::npos) << t.status().message();
  }
  // All-zero tolerances only FP32 meets: the message says so.
  EXPECT_NE(parse_tolerance("y:atol=0").status().message().find("only the FP32 engine"), std::string::npos);
}

TEST(ToleranceMetrics, CloseAndTopK) {
  Tensor ref = Tensor::from_vector<float>(DataType::kFloat32, {2, 3}, {1, 5, 2, 0, 0, 9});
  Tensor got = Tensor::from_vector<float>(DataType::kFloat32, {2, 3}, {1.01f, 4.9f, 6, 0, 0, 8.99f});
  Tolerance close = parse_tolerance("y:atol=0.2").value();
  detail::OutputError e;
  ASSERT_TRUE(detail::accumulate_error(close, ref, got, &e).ok());
  EXPECT_EQ(e.violations, 1);  // 2 -> 6
  EXPECT_FALSE(detail::tolerance_met(close, e));
  EXPECT_NEAR(e.worst_ratio, 4 / 0.2, 1e-4);
  Tolerance top1 = parse_tolerance("y:top1=0.5").value();
  detail::OutputError t;
  ASSERT_TRUE(detail::accumulate_error(top1, ref, got, &t).ok());
  EXPECT_EQ(t.rows, 2);
  EXPECT_EQ(t.agree, 1);  // row 0's class 1 lost to class 2
  EXPECT_TRUE(detail::tolerance_met(top1, t));
  Tolerance top1_all = parse_tolerance("y:top1=1").value();
  EXPECT_FALSE(detail::tolerance_met(top1_all, t));
  Tolerance top2 = parse_tolerance("y:top2=1").value();
  detail::OutputError t2;
  ASSERT_TRUE(detail::accumulate_error(top2, ref, got, &t2).ok());
  EXPECT_TRUE(detail::tolerance_met(top2, t2));
  // NaN never agrees and is never close.
  Tensor nan = Tensor::from_vector<float>(DataType::kFloat32, {1, 3}, {NAN, 0, 0});
  Tensor one = Tensor::from_vector<float>(DataType::kFloat32, {1, 3}, {1, 0, 0});
  detail::OutputError n1, n2;
  ASSERT_TRUE(detail::accumulate_error(close, one, nan, &n1).ok());
  EXPECT_FALSE(detail::tolerance_met(close, n1));
  ASSERT_TRUE(detail::accumulate_error(top1_all, one, nan, &n2).ok());
  EXPECT_FALSE(detail::tolerance_met(top1_all, n2));
}

// x -> Conv A -> Relu -> Mul -> Conv B (sensitive) -> Relu -> Conv C -> Relu -> GlobalAveragePool ->
// Flatten -> Gemm. The Mul scales channel 0 by 3e4 (a float layer: no INT8 layer takes a Mul), so B's
// input spans [0, 3e4] while A's output keeps its ordinary range (A quantized alone leaves INT8 at its
// own output, qdq_insert's exit rule). INT8's per-tensor activation scale for B's input (about 118)
// rounds every other channel (values near 1) to zero. B's weights from channel 0 are zero, so in FP32
// the outlier does not matter; quantizing B's input wipes out its signal. Every other layer quantizes well.
std::string sensitive_net() {
  testing::GraphBuilder b;
  const int64_t c = 32;
  b.input("x", {8, 16, 24, 24});
  Tensor wa = testing::random_tensor({c, 16, 3, 3}, 1, DataType::kFloat32, -0.2, 0.2);
  Tensor ba = testing::random_tensor({c}, 2, DataType::kFloat32, 0, 0.2);
  Tensor wb = testing::random_tensor({c, c, 3, 3}, 3, DataType::kFloat32, -0.15, 0.15);
  for (int64_t o = 0; o < c; ++o)
    for (int64_t k = 0; k < 9; ++k) wb.data<float>()[o * c * 9 + k] = 0;  // input channel 0
  Tensor wc = testing::random_tensor({c, c, 3, 3}, 4, DataType::kFloat32, -0.15, 0.15);
  Tensor scale(DataType::kFloat32, {1, c, 1, 1});
  for (int64_t k = 0; k < c; ++k) scale.data<float>()[k] = k == 0 ? 3e4f : 1.f;
  b.init("wa", wa).init("ba", ba).init("wb", wb).init("wc", wc).init("scale", scale);
  b.init("wf", testing::random_tensor({10, c}, 5)).init("bf", testing::random_tensor({10}, 6));
  b.conv({"x", "wa", "ba"}, "a", 1).name = "convA";
  b.node("Relu", {"a"}, {"ra"});
  b.node("Mul", {"ra", "scale"}, {"ma"});
  b.conv({"ma", "wb"}, "bb", 1).name = "convB";
  b.node("Relu", {"bb"}, {"rb"});
  b.conv({"rb", "wc"}, "cc", 1).name = "convC";
  b.node("Relu", {"cc"}, {"rc"});
  b.node("GlobalAveragePool", {"rc"}, {"p"});
  b.node("Flatten", {"p"}, {"f"});
  b.gemm_t({"f", "wf", "bf"}, "logits").name = "fc";
  b.output("logits");
  return onnx_import::serialize_model(b.finish()).value();
}

struct AutoPrecisionTest : ::testing::Test {
  fs::path dir;
  std::vector<std::string> warnings, lines;
  void SetUp() override {
    // Timings on a shared machine are noise: the test is about error (engine/auto_precision.cc).
    ::setenv("KILN_AUTO_PRECISION_IGNORE_TIME", "1", 1);
    dir = fs::temp_directory_path() / ("kiln_amp_test_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    // 48 samples: 6 batches of 8, the first 3 calibrate, 3 held back.
    ASSERT_TRUE(write_npz((dir / "calib.npz").string(), {{"x", testing::random_tensor({48, 16, 24, 24}, 7)}}).ok());
  }
  void TearDown() override {
    ::unsetenv("KILN_AUTO_PRECISION_IGNORE_TIME");
    fs::remove_all(dir);
  }
  BuilderConfig config(const std::string& tolerance) {
    BuilderConfig c;
    c.auto_precision = true;
    c.tolerances = {tolerance};
    c.precision = Precision::kINT8;  // the candidate: INT8 only
    c.calib_data = (dir / "calib.npz").string();
    c.calib_batch_size = 8;
    c.calib_batches = 3;
    c.warn = [this](const std::string& w) { warnings.push_back(w); };
    c.log = [this](const std::string& l) { lines.push_back(l); };
    return c;
  }
};

TEST_F(AutoPrecisionTest, KeepsTheSensitiveLayerFp32AndReducesTheRest) {
  const std::string model = sensitive_net();
  std::shared_ptr<Engine> e;
  try {
    e = Builder(config("logits:top1=0.9")).build_from_memory(model);
  } catch (const Error& err) {
    FAIL() << err.what();
  }
  const auto rec = nlohmann::json::parse(e->inspect_json())["build"]["auto_precision"];
  ASSERT_TRUE(rec.is_object());
  std::map<std::string, std::string> chosen;
  for (const auto& u : rec["assignment"])
    for (const auto& n : u["nodes"]) chosen[n.get<std::string>()] = u["precision"].get<std::string>();
  if (rec["ranking"].empty()) GTEST_SKIP() << "no INT8 kernel here";
  ASSERT_TRUE(chosen.count("convB"));
  EXPECT_EQ(chosen["convB"], "fp32");
  // convB is by far the most sensitive: its INT8 error dwarfs the others'.
  const auto& ranking = rec["ranking"];
  EXPECT_GE(ranking.size(), 3u);  // convA, convB, convC at least
  double worst_other = 0, convb = 0;
  for (const auto& r : ranking) {
    const bool is_b = r["layer"].get<std::string>().find("convB") != std::string::npos;
    (is_b ? convb : worst_other) = std::max(is_b ? convb : worst_other, r["error"].get<double>());
  }
  EXPECT_GT(convb, 10 * worst_other);
  // Every other unit (convA, convC, the pooling): INT8.
  for (const auto& r : ranking) {
    const std::string layer = r["layer"].get<std::string>();
    if (layer.find("convB") != std::string::npos) continue;
    for (const auto& u : rec["assignment"])
      if (u["layer"] == layer) EXPECT_EQ(u["precision"], "int8") << layer;
  }
  // The engine's layers agree with the record, and the held-back figures are recorded.
  bool saw_int8 = false;
  const auto inspected = nlohmann::json::parse(e->inspect_json());
  for (const auto& l : inspected["layers"]) {
    for (const auto& s : l["sources"])
      if (s == "convB") EXPECT_EQ(l["precision"], "fp32") << l.dump();
    saw_int8 |= l["precision"] == "int8" || l["precision"] == "uint8";
  }
  EXPECT_TRUE(saw_int8);
  EXPECT_NE(rec["held_back"].get<std::string>().find("top1 agreement"), std::string::npos);
  EXPECT_EQ(rec["held_back_batches"], 3);
  // The ranking and the assignment were printed.
  bool printed_ranking = false, printed_assignment = false;
  for (const auto& l : lines) {
    printed_ranking |= l.find("sensitivity ranking") != std::string::npos;
    printed_assignment |= l.find("chosen assignment") != std::string::npos;
  }
  EXPECT_TRUE(printed_ranking && printed_assignment);
  if (HasFailure())
    for (const auto& l : lines) std::fprintf(stderr, "%s\n", l.c_str());
}

TEST_F(AutoPrecisionTest, ClearErrors) {
  const std::string model = sensitive_net();
  auto message = [&](BuilderConfig c) -> std::string {
    try {
      Builder(std::move(c)).build_from_memory(model);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(config("probs:top1=0.9")).find("no output 'probs' (its outputs: 'logits')"), std::string::npos);
  BuilderConfig no_holdout = config("logits:top1=0.9");
  no_holdout.calib_batches = 6;
  EXPECT_NE(message(no_holdout).find("held-back"), std::string::npos);
  BuilderConfig no_data = config("logits:top1=0.9");
  no_data.calib_data.clear();
  EXPECT_NE(message(no_data).find("needs --calib-data"), std::string::npos);
  BuilderConfig no_tol = config("logits:top1=0.9");
  no_tol.tolerances.clear();
  EXPECT_NE(message(no_tol).find("needs a --tolerance"), std::string::npos);
}

}  // namespace
}  // namespace kiln
