// Layer workspaces (PreparedLayer::workspace_bytes): planned in the activation arena as values alive
// during their layer only, capped by BuilderConfig::workspace_bytes (kiln build --workspace) with an
// error naming the layer, shown by inspect; tensors know where their memory lives.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../expect_status.h"
#include "../graph_builder.h"
#include "backends/tactic.h"
#include "engine/engine_impl.h"
#include "engine/memory_planner.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"

namespace kiln {
namespace {

using testing::GraphBuilder;
using testing::random_tensor;

// x -> Relu a (4 KiB) -> Sigmoid b (64 B) -> Tanh c (64 B) -> Neg y: `a` is dead while c runs, so
// the 4 KiB workspace of c fits in its bytes; it never overlaps what c reads or writes.
TEST(MemoryPlanner, PlacesWorkspacesOverDeadActivations) {
  GraphBuilder gb;
  gb.input("x", {1024}).output("y");
  gb.node("Relu", {"x"}, {"a"});
  gb.node("Sigmoid", {"a"}, {"b"});
  gb.node("Tanh", {"b"}, {"c"});
  gb.node("Neg", {"c"}, {"y"});
  ir::Model m = gb.finish();
  std::map<std::string, size_t> bytes = {{"a", 4096}, {"b", 64}, {"c", 64}, {"y", 64}};
  auto size_of = [&](const std::string& v) -> std::optional<size_t> { return bytes.at(v); };
  engine::LayerNeeds needs;
  needs.workspace = [](size_t i) -> size_t { return i == 2 ? 4000 : 0; };
  needs.in_place_ok = [](size_t) { return false; };
  engine::MemoryPlan p = engine::plan_memory(*m.graph, size_of, needs);
  ASSERT_EQ(p.workspace_offsets.size(), 1u);
  EXPECT_EQ(p.workspace_sizes.at(2), 4032u);  // 64-byte aligned
  EXPECT_EQ(p.workspace_bytes, 4032u);
  const size_t w0 = p.workspace_offsets.at(2), w1 = w0 + p.workspace_sizes.at(2);
  for (const char* v : {"b", "c"}) {  // what node 2 reads and writes
    size_t v0 = p.offsets.at(v), v1 = v0 + p.sizes.at(v);
    EXPECT_TRUE(w1 <= v0 || v1 <= w0) << v;
  }
  // Without the workspace the plan needs 4096 + 64 + 64; the workspace adds nothing (a's bytes).
  engine::MemoryPlan without = engine::plan_memory(*m.graph, size_of, {});
  EXPECT_EQ(p.arena_bytes, without.arena_bytes);
  // A workspace bigger than any dead gap grows the arena by what does not fit.
  needs.workspace = [](size_t i) -> size_t { return i == 2 ? 8192 : 0; };
  EXPECT_GT(engine::plan_memory(*m.graph, size_of, needs).arena_bytes, without.arena_bytes);
}

TEST(MemoryPlanner, InPlaceOnlyWhereTheLayerAllowsIt) {
  GraphBuilder gb;
  gb.input("x", {16}).output("y");
  gb.node("Neg", {"x"}, {"a"});
  gb.node("Relu", {"a"}, {"y"});  // may write over `a`
  ir::Model m = gb.finish();
  auto size_of = [](const std::string&) -> std::optional<size_t> { return 64; };
  EXPECT_EQ(engine::plan_memory(*m.graph, size_of).in_place, 1);
  engine::LayerNeeds needs;
  needs.in_place_ok = [](size_t i) { return i != 1; };  // node 1 runs a tactic: no
  EXPECT_EQ(engine::plan_memory(*m.graph, size_of, needs).in_place, 0);
}

// conv -> relu -> conv: oneDNN's convolutions with a user-managed scratchpad have a workspace.
std::string conv_model() {
  GraphBuilder b(13);
  b.input("x", {1, 3, 19, 23}).output("y");
  b.init("w0", random_tensor({24, 3, 5, 5}, 1)).init("w1", random_tensor({24, 24, 3, 3}, 2));
  b.conv({"x", "w0"}, "c0", 2);
  b.node("Relu", {"c0"}, {"r0"});
  b.conv({"r0", "w1"}, "y", 1);
  return onnx_import::serialize_model(b.finish()).value();
}

TEST(Workspace, BuildFailsClearlyBelowWhatALayerNeeds) {
  BuilderConfig cfg;
  cfg.warn = [](const std::string&) {};
  // Plain-layout convolutions: oneDNN computes them in a blocked layout, reordering X and Y through
  // the workspace (the blocked layout pass would make those reorders layers of their own).
  cfg.disabled_passes = {"layout_blocked"};
  // One tactic, so that every build chooses the same kernels (and so needs the same workspaces).
  if (!backends::find_tactic("conv2d_onednn_blocked")) GTEST_SKIP() << "no conv2d_onednn_blocked";
  cfg.tactics = {"conv2d_onednn_blocked"};
  auto e = Builder(cfg).build_from_memory(conv_model());
  auto j = nlohmann::json::parse(e->inspect_json());
  std::string layer, kernel;
  size_t need = 0;
  for (const auto& l : j["layers"])
    if (l["workspace_bytes"].get<size_t>() > need)
      need = l["workspace_bytes"].get<size_t>(), layer = l["name"], kernel = l["kernel"];
  if (need == 0) GTEST_SKIP() << "no layer of this build has a workspace (no oneDNN?)";
  EXPECT_EQ(j["memory"]["workspace"]["largest_bytes"].get<size_t>(), need);
  EXPECT_EQ(j["memory"]["workspace"]["limit_bytes"].get<size_t>(), cfg.workspace_bytes);
  EXPECT_GE(j["memory"]["arena_bytes"].get<size_t>(), need);  // planned in the arena

  cfg.workspace_bytes = need;  // exactly enough
  EXPECT_NO_THROW(Builder(cfg).build_from_memory(conv_model()));
  cfg.workspace_bytes = need - 1;
  try {
    Builder(cfg).build_from_memory(conv_model());
    FAIL() << "built with a workspace limit below what layer '" << layer << "' needs";
  } catch (const Error& err) {
    const std::string msg = err.what();
    EXPECT_EQ(err.category(), ErrorCategory::kOutOfRange) << msg;
    EXPECT_NE(msg.find("layer '" + layer + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("kernel " + kernel), std::string::npos) << msg;
    EXPECT_NE(msg.find("needs " + std::to_string(need) + " bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limit of " + std::to_string(need - 1) + " bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Raise --workspace"), std::string::npos) << msg;
    EXPECT_NE(msg.find("exclude the tactic"), std::string::npos) << msg;
  }
}

// A tactic's workspace is undefined at every run: run_standalone hands out a NaN-filled one, and the
// engine's (a slice of the arena, holding dead activations) gives the same results.
TEST(Workspace, EngineRunsMatchReferenceKernels) {
  BuilderConfig cfg;
  cfg.warn = [](const std::string&) {};
  auto fast = Builder(cfg).build_from_memory(conv_model());
  cfg.tactics = {"reference"};
  auto ref = Builder(cfg).build_from_memory(conv_model());
  Tensor x = random_tensor({1, 3, 19, 23}, 9);
  std::vector<float> got, want;
  for (auto* e : {fast.get(), ref.get()}) {
    auto ctx = e->create_context();
    ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
    for (int run = 0; run < 2; ++run) ctx->run();  // the second run: the steady-state path
    HostTensor y = ctx->output("y");
    (e == fast.get() ? got : want).assign(y.as<float>(), y.as<float>() + y.numel());
  }
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-3 * std::max(1.f, std::fabs(want[i]))) << i;
}

TEST(TensorLocation, DeviceTensorGivenToACpuEngineIsAClearError) {
  BuilderConfig cfg;
  cfg.warn = [](const std::string&) {};
  auto e = Builder(cfg).build_from_memory(conv_model());
  Tensor host = random_tensor({1, 3, 19, 23}, 3);
  EXPECT_TRUE(host.location().host());
  auto bytes = std::shared_ptr<uint8_t[]>(new uint8_t[host.nbytes()]);
  Tensor device = Tensor::alias(DataType::kFloat32, host.shape(), bytes, 0, {MemoryLocation::Kind::kCuda, 1});
  EXPECT_EQ(device.location().str(), "cuda:1");
  auto r = detail::run_engine(e->impl(), {{"x", ops::Value(device)}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("input 'x'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("lives in cuda:1 memory"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("copy it to host memory"), std::string::npos) << r.status().message();
  EXPECT_TRUE(detail::run_engine(e->impl(), {{"x", ops::Value(host)}}).ok());
}

}  // namespace
}  // namespace kiln
