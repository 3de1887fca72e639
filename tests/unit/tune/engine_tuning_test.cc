// The builder's use of the auto-tuner: timings recorded per layer in the engine (and its file), a warm
// timing cache that makes a rebuild time and prepare nothing, the thread count in the key, and engine
// files of the previous format refused with the rebuild advice.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "../graph_builder.h"
#include "backends/registry.h"
#include "engine/engine_impl.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"

namespace kiln {
namespace {

using testing::GraphBuilder;
using testing::random_tensor;

// Two convolutions (two oneDNN candidates each), the second one twice with identical shapes, and a Gemm.
std::string model_onnx() {
  GraphBuilder b(13);
  b.input("x", {1, 8, 20, 20}).output("y");
  b.init("w1", random_tensor({16, 8, 3, 3}, 1)).init("w2", random_tensor({16, 16, 3, 3}, 2));
  b.init("w3", random_tensor({16, 16, 3, 3}, 3)).init("fc", random_tensor({5, 16 * 20 * 20}, 4));
  for (auto [in, w, out] : {std::tuple{"x", "w1", "c1"}, std::tuple{"c1", "w2", "c2"}, std::tuple{"c2", "w3", "c3"}}) {
    b.conv({in, w}, out, 1);
  }
  b.node("Flatten", {"c3"}, {"f"});
  b.gemm_t({"f", "fc"}, "y");
  return onnx_import::serialize_model(b.finish()).value();
}

std::string temp_path(const std::string& name) {
  auto d = std::filesystem::path(::testing::TempDir()) / ("kiln_tune_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  std::filesystem::remove(d / name);
  return (d / name).string();
}

nlohmann::json tuning_of(const Engine& e) { return nlohmann::json::parse(e.inspect_json())["build"]["tuning"]; }

class EngineTuning : public ::testing::Test {
 protected:
  void SetUp() override {
    if (backends::all_tactics().empty()) GTEST_SKIP() << "built without oneDNN: no tactics";
    threads_ = kiln::threads();
  }
  void TearDown() override { kiln::set_threads(threads_); }
  int threads_ = 0;
};

TEST_F(EngineTuning, CandidatesTimedRecordedAndReusedFromTheCache) {
  std::string cache = temp_path("tc.json");
  BuilderConfig cfg;
  cfg.timing_cache = cache;
  auto cold = Builder(cfg).build_from_memory(model_onnx());
  nlohmann::json t = tuning_of(*cold);
  EXPECT_EQ(t["threads"].get<int>(), kiln::threads());
  EXPECT_GE(t["timed"].get<int>(), 4);       // two convolution shapes x two tactics
  EXPECT_GE(t["cache_hits"].get<int>(), 2);  // the third convolution repeats the second
  EXPECT_TRUE(std::filesystem::exists(cache));
  // The share of the tuner's thread time spent waiting for a core (the machine's load) is recorded.
  ASSERT_TRUE(t.contains("runqueue_wait_share")) << t.dump();
  EXPECT_GE(t["runqueue_wait_share"].get<double>(), 0.0);
  EXPECT_LE(t["runqueue_wait_share"].get<double>(), 1.0);
  int timed_layers = 0;
  for (const auto& l : cold->impl().layers) {
    if (l.candidates.size() < 2) continue;
    ++timed_layers;
    const tune::CandidateResult* best = nullptr;
    for (const auto& c : l.candidates)
      if (c.state == tune::CandidateResult::State::kTimed && (!best || c.ms < best->ms)) best = &c;
    ASSERT_NE(best, nullptr) << l.name;
    EXPECT_EQ(l.kernel, best->tactic) << l.name;  // the fastest won
  }
  EXPECT_GE(timed_layers, 3);

  auto warm = Builder(cfg).build_from_memory(model_onnx());
  nlohmann::json w = tuning_of(*warm);
  EXPECT_EQ(w["timed"].get<int>(), 0);
  EXPECT_EQ(w["prepared"].get<int>(), 0);
  EXPECT_GT(w["cache_hits"].get<int>(), 0);
  ASSERT_EQ(warm->impl().layers.size(), cold->impl().layers.size());
  for (size_t i = 0; i < warm->impl().layers.size(); ++i)
    EXPECT_EQ(warm->impl().layers[i].kernel, cold->impl().layers[i].kernel) << i;

  // Another thread count is another key: timed again, into the same file.
  kiln::set_threads(kiln::threads() == 1 ? 2 : 1);
  auto other = Builder(cfg).build_from_memory(model_onnx());
  EXPECT_GE(tuning_of(*other)["timed"].get<int>(), 4);
  EXPECT_EQ(tuning_of(*other)["threads"].get<int>(), kiln::threads());
}

// The build options that change kernels change the timing cache's keys: --isa (in every layer key)
// and --layout-block (the blocked layers differ); repeating a build with the same options times nothing.
TEST_F(EngineTuning, InstructionSetAndLayoutBlockAreInTheKeys) {
  if (!(host_isa() & kIsaAvx2)) GTEST_SKIP() << "no AVX2 on this machine";
  std::string cache = temp_path("tc_target.json");
  auto build = [&](const std::string& isa, int block) {
    BuilderConfig cfg;
    cfg.timing_cache = cache;
    cfg.isa = isa;
    cfg.layout_block = block;
    return tuning_of(*Builder(cfg).build_from_memory(model_onnx()));
  };
  // Work = candidates timed + layers only prepared (one viable candidate: conv2d_onednn_nchw declines
  // the 3x3 convs oneDNN would run as im2col, leaving conv2d_onednn_blocked alone on them).
  auto work = [](const nlohmann::json& t) { return t["timed"].get<int>() + t["prepared"].get<int>(); };
  EXPECT_GE(work(build("avx2", 0)), 4);
  nlohmann::json again = build("avx2", 0);
  EXPECT_EQ(work(again), 0);
  EXPECT_GT(again["cache_hits"].get<int>(), 0);
  EXPECT_GE(work(build("portable", 0)), 4);  // the same graph, another instruction set
  // Blocked convs: new layers (on AVX2 one candidate each, only prepared), then cached.
  EXPECT_GE(work(build("avx2", 8)), 2);
  EXPECT_EQ(work(build("avx2", 8)), 0);
}

TEST_F(EngineTuning, EngineFileKeepsTheCandidates) {
  auto e = Builder().build_from_memory(model_onnx());
  auto loaded = Engine::deserialize(e->serialize());
  const auto &a = e->impl().layers, &b = loaded->impl().layers;
  ASSERT_EQ(a.size(), b.size());
  size_t seen = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].candidates.size(), b[i].candidates.size()) << a[i].name;
    for (size_t k = 0; k < a[i].candidates.size(); ++k) {
      const auto &x = a[i].candidates[k], &y = b[i].candidates[k];
      EXPECT_EQ(x.tactic, y.tactic);
      EXPECT_EQ(x.state, y.state);
      EXPECT_DOUBLE_EQ(x.ms, y.ms);
      EXPECT_EQ(x.runs, y.runs);
      EXPECT_EQ(x.from_cache, y.from_cache);
      EXPECT_EQ(x.error, y.error);
      ++seen;
    }
  }
  EXPECT_GE(seen, 7u);
  // Engine::save streams the same bytes as serialize() (the weights are not assembled in memory first).
  std::string path = temp_path("e.kiln");
  e->save(path);
  std::ifstream f(path, std::ios::binary);
  std::string saved((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(saved == e->serialize());
  EXPECT_EQ(tuning_of(*loaded), tuning_of(*e));
  auto j = nlohmann::json::parse(loaded->inspect_json());
  bool listed = false;
  for (const auto& l : j["layers"]) listed |= l["candidates"].size() == 2;
  EXPECT_TRUE(listed);
}

TEST_F(EngineTuning, PreviousEngineFormatIsRefusedWithRebuildAdvice) {
  std::string bytes = Builder().build_from_memory(model_onnx())->serialize();
  uint32_t v1 = 1;
  std::memcpy(bytes.data() + 8, &v1, 4);  // the format version field (not covered by the checksums)
  try {
    Engine::deserialize(bytes);
    FAIL() << "loaded an engine of format version 1";
  } catch (const Error& err) {
    std::string what = err.what();
    EXPECT_NE(what.find("format version 1"), std::string::npos) << what;
    EXPECT_NE(what.find("rebuild"), std::string::npos) << what;
  }
}

TEST_F(EngineTuning, RestrictedTacticsAreTheOnlyCandidates) {
  BuilderConfig cfg;
  cfg.tactics = {"conv2d_onednn_blocked"};
  auto e = Builder(cfg).build_from_memory(model_onnx());
  for (const auto& l : e->impl().layers) {
    EXPECT_TRUE(l.kernel == "reference" || l.kernel == "conv2d_onednn_blocked") << l.kernel;
    for (const auto& c : l.candidates) EXPECT_EQ(c.tactic, "conv2d_onednn_blocked");
  }
  cfg.tactics = {"reference"};
  auto r = Builder(cfg).build_from_memory(model_onnx());
  for (const auto& l : r->impl().layers) EXPECT_TRUE(l.candidates.empty());
}

}  // namespace
}  // namespace kiln
