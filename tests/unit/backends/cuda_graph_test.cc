// CUDA graphs of a device engine's context (engine_impl.h: DeviceRunOptions): the replayed graph gives
// the layer-by-layer run's outputs for new input values (staged into the captured buffers), captures
// once per shape, and a layer on the host keeps the layer-by-layer run with the reason.
// --no-data-transfers keeps the last fetched outputs. Skipped without a GPU.
#include <gtest/gtest.h>

#include "../engine_util.h"
#include "../graph_builder.h"
#include "cuda_test_util.h"
#include "engine/engine_impl.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"

namespace kiln {
namespace {

using testing::random_tensor;
using GB = testing::GraphBuilder;

// x [4, 33] -> MatMul -> Add -> Gelu-free MLP with Softmax; `host_layer`: a Cos (no CUDA kernel) inside.
std::string mlp_onnx(bool host_layer) {
  GB b(17);
  b.input("x", {4, 33}).output("y");
  b.init("w1", random_tensor({33, 19}, 1)).init("b1", random_tensor({19}, 2)).init("w2", random_tensor({19, 5}, 3));
  b.node("MatMul", {"x", "w1"}, {"h"});
  b.node("Add", {"h", "b1"}, {"hb"});
  b.node(host_layer ? "Cos" : "Tanh", {"hb"}, {"t"});
  b.node("MatMul", {"t", "w2"}, {"z"});
  GB::set_int(b.node("Softmax", {"z"}, {"y"}), "axis", -1);
  return onnx_import::serialize_model(b.finish()).value();
}

std::shared_ptr<Engine> cuda_engine(const std::string& onnx) {
  BuilderConfig cfg;
  cfg.device = {DeviceKind::kCUDA, 0};
  cfg.warn = [](const std::string&) {};
  return Builder(cfg).build_from_memory(onnx);
}

std::vector<float> run_once(ExecutionContext& ctx, const Tensor& x) {
  ctx.set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
  ctx.run();
  HostTensor y = ctx.output("y");
  return std::vector<float>(y.as<float>(), y.as<float>() + y.numel());
}

TEST(CudaGraph, ReplaysMatchTheLayerByLayerRun) {
  KILN_SKIP_WITHOUT_GPU();
  auto e = cuda_engine(mlp_onnx(false));
  auto plain = e->create_context();
  auto graphed = e->create_context();
  detail::set_device_run_options(graphed->impl(), {/*cuda_graph=*/true, /*data_transfers=*/true, false});
  for (int run = 0; run < 5; ++run) {
    Tensor x = random_tensor({4, 33}, 100 + static_cast<uint64_t>(run));
    std::vector<float> want = run_once(*plain, x), got = run_once(*graphed, x);
    ASSERT_EQ(got.size(), want.size());
    // Same kernels, same algorithms: equal up to a split reduction's order.
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-6) << "run " << run << " element " << i;
  }
  detail::DeviceRunStats st = detail::device_run_stats(graphed->impl());
  EXPECT_EQ(st.graph_captures, 1);
  EXPECT_GE(st.graph_replays, 3);  // run 0 warms up, run 1 captures and launches, runs 2-4 replay
  EXPECT_EQ(st.graph_blocker, "");
  // --no-data-transfers: the outputs are not fetched again (the last fetched ones stay).
  detail::set_device_run_options(graphed->impl(), {true, false, true});
  Tensor x = random_tensor({4, 33}, 7);
  std::vector<float> first = run_once(*graphed, x);
  std::vector<float> again = run_once(*graphed, random_tensor({4, 33}, 8));
  EXPECT_EQ(first, again);
}

TEST(CudaGraph, AHostLayerKeepsTheLayerByLayerRunAndSaysWhy) {
  KILN_SKIP_WITHOUT_GPU();
  auto e = cuda_engine(mlp_onnx(true));
  auto plain = e->create_context();
  auto graphed = e->create_context();
  detail::set_device_run_options(graphed->impl(), {true, true, false});
  for (int run = 0; run < 3; ++run) {
    Tensor x = random_tensor({4, 33}, 200 + static_cast<uint64_t>(run));
    std::vector<float> got = run_once(*graphed, x), want = run_once(*plain, x);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-6) << "run " << run;
  }
  detail::DeviceRunStats st = detail::device_run_stats(graphed->impl());
  EXPECT_EQ(st.graph_captures, 0);
  EXPECT_NE(st.graph_blocker.find("runs on the host"), std::string::npos) << st.graph_blocker;
  EXPECT_NE(st.graph_blocker.find("Cos"), std::string::npos) << st.graph_blocker;
}

}  // namespace
}  // namespace kiln
