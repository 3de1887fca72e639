// Engine: build, save/load round trip, corrupted and foreign files, memory plan, concurrency.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include "../graph_builder.h"
#include "engine/engine_impl.h"
#include "engine/memory_planner.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"

namespace kiln {
namespace {

using testing::GraphBuilder;
using testing::random_tensor;

// conv -> bn -> relu -> conv -> add(residual) -> relu -> global pool -> gemm: a small CNN.
std::string small_cnn_onnx() {
  GraphBuilder b(13);
  b.input("x", {1, 3, 16, 16}).output("logits");
  b.init("w1", random_tensor({8, 3, 3, 3}, 1)).init("b1", random_tensor({8}, 2));
  b.init("g", random_tensor({8}, 3, DataType::kFloat32, 0.5, 1.5)).init("beta", random_tensor({8}, 4));
  b.init("mean", random_tensor({8}, 5)).init("var", random_tensor({8}, 6, DataType::kFloat32, 0.5, 1.5));
  b.init("w2", random_tensor({8, 8, 3, 3}, 7))
      .init("fc", random_tensor({10, 8}, 8))
      .init("fcb", random_tensor({10}, 9));
  b.conv({"x", "w1", "b1"}, "c1", 1);
  b.node("BatchNormalization", {"c1", "g", "beta", "mean", "var"}, {"bn"});
  b.node("Relu", {"bn"}, {"r1"});
  b.conv({"r1", "w2"}, "c2", 1);
  b.node("Add", {"c2", "r1"}, {"res"});
  b.node("Relu", {"res"}, {"r2"});
  b.node("GlobalAveragePool", {"r2"}, {"pool"});
  b.node("Flatten", {"pool"}, {"flat"});
  b.gemm_t({"flat", "fc", "fcb"}, "logits");
  ir::Model m = b.finish();
  return onnx_import::serialize_model(m).value();
}

std::vector<float> run_engine(const Engine& e, const std::vector<float>& x) {
  auto ctx = e.create_context();
  ctx->set_input("x", HostTensor::f32({1, 3, 16, 16}, x.data()));
  ctx->run();
  HostTensor y = ctx->output("logits");
  return std::vector<float>(y.as<float>(), y.as<float>() + y.numel());
}

std::vector<float> random_input(uint64_t seed) {
  Tensor t = random_tensor({1, 3, 16, 16}, seed);
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

TEST(Engine, BuildSaveLoadRunsLikeTheReference) {
  std::string onnx = small_cnn_onnx();
  auto engine = Builder().build_from_memory(onnx);
  auto j = nlohmann::json::parse(engine->inspect_json());
  EXPECT_EQ(j["layer_counts"].count("BatchNormalization"), 0u) << j["layer_counts"].dump();
  auto x = random_input(42);
  auto y1 = run_engine(*engine, x);
  auto loaded = Engine::deserialize(engine->serialize());
  auto y2 = run_engine(*loaded, x);
  ASSERT_EQ(y1.size(), 10u);
  EXPECT_EQ(y1, y2);
  // Against the reference interpreter on the unoptimized model.
  auto model = onnx_import::parse_model(onnx, "").value();
  ops::Interpreter interp(model.graph);
  Tensor xt = Tensor::from_vector<float>(DataType::kFloat32, {1, 3, 16, 16}, x);
  auto ref = interp.run({{"x", ops::Value(xt)}}).value();
  for (size_t i = 0; i < y1.size(); ++i) EXPECT_NEAR(y1[i], ref[0].tensor.data<float>()[i], 1e-4);
}

// An engine of ~5 MB of weights (several of save()'s 1 MiB pieces): y = relu(x W1 + b) W2.
std::string wide_mlp_onnx() {
  GraphBuilder b(13);
  b.input("x", {1, 1000}).output("y");
  b.init("w1", random_tensor({1000, 1100}, 11)).init("b", random_tensor({1100}, 12));
  b.init("w2", random_tensor({1100, 123}, 13));
  b.node("MatMul", {"x", "w1"}, {"h"});
  b.node("Add", {"h", "b"}, {"hb"});
  b.node("Relu", {"hb"}, {"r"});
  b.node("MatMul", {"r", "w2"}, {"y"});
  return onnx_import::serialize_model(b.finish()).value();
}

TEST(EngineFile, SaveWritesTheSerializedBytesAtAnyThreadCount) {
  auto engine = Builder().build_from_memory(wide_mlp_onnx());
  const std::string expected = engine->serialize();
  ASSERT_GT(expected.size(), size_t{4} << 20);
  const std::string path = ::testing::TempDir() + "kiln_save_test.kiln";
  const int before = threads();
  for (int n : {1, 2}) {  // save() checksums and writes piece by piece; the import copies with all threads
    set_threads(n);
    engine->save(path);
    std::ifstream f(path, std::ios::binary);
    std::string got((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(got == expected) << n << " threads: " << got.size() << " bytes vs " << expected.size();
    EXPECT_NO_THROW(Engine::load(path)) << n << " threads";
  }
  set_threads(before);
  std::remove(path.c_str());
}

ErrorCategory load_error(const std::string& bytes, std::string* msg) {
  try {
    Engine::deserialize(bytes);
  } catch (const Error& e) {
    *msg = e.what();
    return e.category();
  }
  *msg = "loaded";
  return ErrorCategory::kInternal;
}

TEST(EngineFile, EveryHeaderByteFlipIsACleanError) {
  std::string file = Builder().build_from_memory(small_cnn_onnx())->serialize();
  uint32_t header_len;
  std::memcpy(&header_len, file.data() + 12, 4);
  size_t header_end = 32 + header_len;
  ASSERT_LT(header_end, file.size());
  int checked = 0;
  for (size_t i = 0; i < header_end; ++i) {
    std::string bad = file;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    std::string msg;
    ErrorCategory c = load_error(bad, &msg);
    ASSERT_EQ(c, ErrorCategory::kInvalidModel) << "byte " << i << ": " << msg;
    ASSERT_NE(msg.find("rebuild"), std::string::npos) << "byte " << i << ": " << msg;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(header_end));
}

TEST(EngineFile, BodyFlipsTruncationAndForeignFilesAreCleanErrors) {
  std::string file = Builder().build_from_memory(small_cnn_onnx())->serialize();
  std::mt19937_64 rng(7);
  uint32_t header_len;
  std::memcpy(&header_len, file.data() + 12, 4);
  for (int k = 0; k < 300; ++k) {
    std::string bad = file;
    size_t at = 32 + header_len + rng() % (file.size() - 32 - header_len);
    bad[at] = static_cast<char>(bad[at] ^ (1 + rng() % 255));
    std::string msg;
    ASSERT_EQ(load_error(bad, &msg), ErrorCategory::kInvalidModel) << "byte " << at << ": " << msg;
    ASSERT_NE(msg.find("corrupted"), std::string::npos) << msg;
  }
  for (size_t cut : {size_t{0}, size_t{10}, size_t{31}, file.size() / 2, file.size() - 1}) {
    std::string msg;
    EXPECT_EQ(load_error(file.substr(0, cut), &msg), ErrorCategory::kInvalidModel) << cut;
  }
  std::string msg;
  load_error(small_cnn_onnx(), &msg);
  EXPECT_NE(msg.find("not a kiln engine"), std::string::npos) << msg;
  std::string newer = file;
  newer[8] = 9;  // format version 9
  load_error(newer, &msg);
  EXPECT_NE(msg.find("format version 9"), std::string::npos) << msg;
}

TEST(EngineFile, ForeignTargetIsRejectedWithWhatIsMissing) {
  auto impl = detail::build_engine(onnx_import::parse_model(small_cnn_onnx(), "").value(), BuilderConfig{}).value();
  impl->required_isa = {"avx512_imaginary"};
  impl->target.cpu_model = "Some Future CPU";
  std::string bytes = detail::serialize_engine(*impl).value();
  std::string msg;
  EXPECT_EQ(load_error(bytes, &msg), ErrorCategory::kUnsupported);
  EXPECT_NE(msg.find("avx512_imaginary"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Some Future CPU"), std::string::npos) << msg;
}

TEST(MemoryPlanner, SharesMemoryAcrossDisjointLifetimesAndNeverOverlapsLiveTensors) {
  // A chain of 20 unary ops with one long-lived skip value.
  GraphBuilder b;
  b.input("x", {64}).output("y");
  std::string prev = "x";
  for (int i = 0; i < 20; ++i) {
    std::string out = "v" + std::to_string(i);
    b.node(i % 2 ? "Sigmoid" : "Tanh", {prev}, {out});
    prev = out;
  }
  b.node("Add", {prev, "v0"}, {"y"});
  ir::Model m = b.finish();
  auto plan = engine::plan_memory(*m.graph, [&](const std::string& v) -> std::optional<size_t> {
    return dims_numel(m.graph->value_types.at(v).shape.concrete()) * 4;
  });
  EXPECT_EQ(plan.naive_bytes, 21u * 256);
  EXPECT_LE(plan.arena_bytes, 3u * 256);
  EXPECT_GT(plan.in_place, 0);
  // Property: two values alive at the same time never share bytes.
  std::map<std::string, std::pair<int, int>> life;
  for (size_t i = 0; i < m.graph->nodes.size(); ++i) {
    for (const auto& in : m.graph->nodes[i].inputs)
      if (life.count(in)) life[in].second = static_cast<int>(i);
    life[m.graph->nodes[i].outputs[0]] = {static_cast<int>(i), static_cast<int>(i)};
  }
  life["y"].second = 1000;
  for (const auto& [a, la] : life)
    for (const auto& [b2, lb] : life) {
      if (a >= b2 || la.second < lb.first || lb.second < la.first) continue;
      // In-place pairs hand the slot over at the op where one dies and the other is born.
      if (la.second == lb.first || lb.second == la.first) continue;
      size_t oa = plan.offsets.at(a), ob = plan.offsets.at(b2);
      EXPECT_TRUE(oa + plan.sizes.at(a) <= ob || ob + plan.sizes.at(b2) <= oa) << a << " and " << b2 << " overlap";
    }
}

TEST(ExecutionContext, ConcurrentContextsOnOneEngineAgree) {
  auto engine = Builder().build_from_memory(small_cnn_onnx());
  std::vector<std::vector<float>> inputs, expected;
  for (int t = 0; t < 4; ++t) {
    inputs.push_back(random_input(100 + t));
    expected.push_back(run_engine(*engine, inputs.back()));
  }
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t]() {
      auto ctx = engine->create_context();
      for (int it = 0; it < 10; ++it) {
        ctx->set_input("x", HostTensor::f32({1, 3, 16, 16}, inputs[static_cast<size_t>(t)].data()));
        ctx->run();
        HostTensor y = ctx->output("logits");
        std::vector<float> got(y.as<float>(), y.as<float>() + y.numel());
        mismatches[static_cast<size_t>(t)] += got != expected[static_cast<size_t>(t)];
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[static_cast<size_t>(t)], 0) << "thread " << t;
}

TEST(ExecutionContext, RejectsBadInputsClearly) {
  auto engine = Builder().build_from_memory(small_cnn_onnx());
  auto ctx = engine->create_context();
  std::vector<float> x(3 * 16 * 16);
  EXPECT_THROW(ctx->set_input("nope", HostTensor::f32({1, 3, 16, 16}, x.data())), Error);
  ctx->set_input("x", HostTensor::f32({1, 3, 16, 15}, x.data()));
  try {
    ctx->run();
    FAIL() << "ran with a wrong shape";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kOutOfRange);  // a shape the model does not take
    EXPECT_NE(std::string(e.what()).find("dim 3 must be 16"), std::string::npos) << e.what();
  }
}

TEST(Builder, ReducedPrecisionIsRejectedClearly) {
  BuilderConfig cfg;
  cfg.precision = Precision::kFP16;
  try {
    Builder(cfg).build_from_memory(small_cnn_onnx());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("--fp32"), std::string::npos);
  }
}

}  // namespace
}  // namespace kiln
