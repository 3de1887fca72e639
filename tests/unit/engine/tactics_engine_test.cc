// Engines choose a tactic per layer, record it, keep it across save/load, and run it: outputs
// match an engine built with reference kernels only, also from contexts running concurrently.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "../engine_util.h"
#include "../graph_builder.h"
#include "backends/registry.h"
#include "engine/engine_impl.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::GraphBuilder;
using testing::random_tensor;
using testing::run_logits;

// conv(+bias) -> relu -> depthwise conv (stride 2) -> conv + residual -> relu -> flatten -> gemm,
// at batch 2.
std::string cnn_onnx() {
  GraphBuilder b(13);
  b.input("x", {2, 5, 13, 11}).output("logits");
  b.init("w1", random_tensor({12, 5, 3, 3}, 1)).init("b1", random_tensor({12}, 2));
  b.init("wd", random_tensor({12, 1, 3, 3}, 3)).init("w3", random_tensor({12, 12, 1, 1}, 4));
  b.init("fc", random_tensor({7, 12 * 7 * 6}, 5)).init("fcb", random_tensor({7}, 6));
  b.conv({"x", "w1", "b1"}, "c1", 1);
  b.node("Relu", {"c1"}, {"r1"});
  b.conv({"r1", "wd"}, "d", 1, 2, 12);
  b.conv({"d", "w3"}, "c3");
  b.node("Add", {"c3", "d"}, {"res"});
  b.node("Relu", {"res"}, {"r2"});
  b.node("Flatten", {"r2"}, {"flat"});
  b.gemm_t({"flat", "fc", "fcb"}, "logits");
  ir::Model m = b.finish();
  return onnx_import::serialize_model(m).value();
}

TEST(EngineTactics, ChosenRecordedAndMatchingTheReference) {
  if (backends::all_tactics().empty()) GTEST_SKIP() << "built without oneDNN: no tactics";
  std::string onnx = cnn_onnx();
  auto fast = Builder().build_from_memory(onnx);
  BuilderConfig ref_cfg;
  ref_cfg.tactics = {"reference"};
  auto ref = Builder(ref_cfg).build_from_memory(onnx);

  int with_tactic = 0;
  for (const auto& l : fast->impl().layers) with_tactic += l.kernel != "reference";
  EXPECT_GE(with_tactic, 4);  // 3 convolutions and the Gemm
  for (const auto& l : ref->impl().layers) EXPECT_EQ(l.kernel, "reference") << l.name;
  EXPECT_NE(fast->inspect_json().find("conv2d_onednn"), std::string::npos);

  auto loaded = Engine::deserialize(fast->serialize());
  for (size_t i = 0; i < loaded->impl().layers.size(); ++i)
    EXPECT_EQ(loaded->impl().layers[i].kernel, fast->impl().layers[i].kernel);

  Tensor x = random_tensor({2, 5, 13, 11}, 42);
  auto want = run_logits(*ref, x);
  expect_close(run_logits(*fast, x), want);
  expect_close(run_logits(*loaded, x), want);

  // Contexts of one engine running at once share its prepared tactics.
  std::vector<std::vector<float>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int k = 0; k < 3; ++k) got[t] = run_logits(*loaded, x);
    });
  for (auto& t : threads) t.join();
  for (const auto& g : got) expect_close(g, want);
}

TEST(EngineTactics, RestrictedToNamedTactics) {
  if (backends::all_tactics().empty()) GTEST_SKIP() << "built without oneDNN: no tactics";
  BuilderConfig cfg;
  cfg.tactics = {"matmul_onednn_packed"};
  auto e = Builder(cfg).build_from_memory(cnn_onnx());
  for (const auto& l : e->impl().layers)
    EXPECT_TRUE(l.kernel == "reference" || l.kernel == "matmul_onednn_packed") << l.kernel;
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(EngineTactics, UnknownTacticInAnEngineFileIsAClearError) {
  auto e = Builder().build_from_memory(cnn_onnx());
  auto& impl = const_cast<detail::EngineImpl&>(e->impl());
  impl.layers[0].kernel = "conv2d_from_the_future";
  try {
    Engine::deserialize(e->serialize());
    FAIL() << "loaded an engine naming an unknown tactic";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("conv2d_from_the_future"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("rebuild"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(EngineTactics, UnknownTacticNameIsRejectedAtBuild) {
  BuilderConfig cfg;
  cfg.tactics = {"conv2d_typo"};
  try {
    Builder(cfg).build_from_memory(cnn_onnx());
    FAIL() << "built with an unknown tactic name";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("unknown tactic 'conv2d_typo'"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace kiln
