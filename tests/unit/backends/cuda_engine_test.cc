// Whole engines built for cuda:0: an MLP (with a layer that has no CUDA kernel, run on the host between
// copies) and a transformer encoder block give the CPU engine's outputs, in the steady state too, from
// two contexts (streams) at once, and after a save/load; an engine from another GPU is refused with
// what differs. Without a GPU, building for CUDA is a clear error.
#include <gtest/gtest.h>

#include <thread>

#include "../engine_util.h"
#include "../graph_builder.h"
#include "cuda_test_util.h"
#include "engine/engine_impl.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::GraphBuilder;
using testing::random_tensor;
using testing::run_logits;

Tensor int64s(const std::vector<int64_t>& v) {
  Tensor t(DataType::kInt64, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.data<int64_t>()[i] = v[i];
  return t;
}

// x [5, 37] -> MatMul + bias -> Relu -> Cos (no CUDA kernel) -> Gemm (transB) -> Softmax.
std::string mlp_onnx() {
  GraphBuilder b(17);
  b.input("x", {5, 37}).output("logits");
  b.init("w1", random_tensor({37, 29}, 1)).init("b1", random_tensor({29}, 2));
  b.init("w2", random_tensor({11, 29}, 3)).init("b2", random_tensor({11}, 4));
  b.node("MatMul", {"x", "w1"}, {"h"});
  b.node("Add", {"h", "b1"}, {"hb"});
  b.node("Relu", {"hb"}, {"r"});
  b.node("Cos", {"r"}, {"c"});
  b.gemm_t({"c", "w2", "b2"}, "z");
  b.node("Softmax", {"z"}, {"logits"});
  return onnx_import::serialize_model(b.finish()).value();
}

// One pre-norm transformer encoder block: x [2, 7, 32], 4 heads of 8, MLP of 64.
std::string block_onnx() {
  GraphBuilder b(17);
  b.input("x", {2, 7, 32}).output("logits");
  uint64_t seed = 10;
  auto w = [&](const std::string& n, Dims d) { b.init(n, random_tensor(d, seed++, DataType::kFloat32, -0.3, 0.3)); };
  w("g1", {32}), w("be1", {32}), w("wq", {32, 32}), w("wk", {32, 32}), w("wv", {32, 32}), w("wo", {32, 32});
  w("g2", {32}), w("be2", {32}), w("w1", {32, 64}), w("bb1", {64}), w("w2", {64, 32}), w("bb2", {32});
  b.init("heads", int64s({2, 7, 4, 8})).init("merged", int64s({2, 7, 32}));
  b.init("scale", Tensor::scalar<float>(DataType::kFloat32, 1.f / std::sqrt(8.f)));
  GraphBuilder::set_int(b.node("LayerNormalization", {"x", "g1", "be1"}, {"ln1"}), "axis", -1);
  for (const char* p : {"q", "k", "v"}) {
    std::string s = p;
    b.node("MatMul", {"ln1", "w" + s}, {s});
    b.node("Reshape", {s, "heads"}, {s + "4"});
    GraphBuilder::set_ints(b.node("Transpose", {s + "4"}, {s + "h"}), "perm",
                           s == "k" ? std::vector<int64_t>{0, 2, 3, 1} : std::vector<int64_t>{0, 2, 1, 3});
  }
  b.node("MatMul", {"qh", "kh"}, {"scores"});
  b.node("Mul", {"scores", "scale"}, {"scaled"});
  GraphBuilder::set_int(b.node("Softmax", {"scaled"}, {"probs"}), "axis", -1);
  b.node("MatMul", {"probs", "vh"}, {"ctx"});
  GraphBuilder::set_ints(b.node("Transpose", {"ctx"}, {"ctx_t"}), "perm", {0, 2, 1, 3});
  b.node("Reshape", {"ctx_t", "merged"}, {"ctx_m"});
  b.node("MatMul", {"ctx_m", "wo"}, {"attn"});
  b.node("Add", {"x", "attn"}, {"r1"});
  GraphBuilder::set_int(b.node("LayerNormalization", {"r1", "g2", "be2"}, {"ln2"}), "axis", -1);
  b.node("MatMul", {"ln2", "w1"}, {"f1"});
  b.node("Add", {"f1", "bb1"}, {"f1b"});
  b.node("Relu", {"f1b"}, {"f1r"});
  b.node("MatMul", {"f1r", "w2"}, {"f2"});
  b.node("Add", {"f2", "bb2"}, {"f2b"});
  b.node("Add", {"r1", "f2b"}, {"logits"});
  return onnx_import::serialize_model(b.finish()).value();
}

BuilderConfig cuda_config(std::vector<std::string>* warnings) {
  BuilderConfig cfg;
  cfg.device = {DeviceKind::kCUDA, 0};
  cfg.warn = [warnings](const std::string& w) { warnings->push_back(w); };
  return cfg;
}

int cuda_layers(const Engine& e) {
  int n = 0;
  for (const auto& l : e.impl().layers)
    n += l.kernel.find("cuda") != std::string::npos || l.kernel.find("cublaslt") != std::string::npos;
  return n;
}

TEST(CudaEngine, WithoutAGpuBuildingForCudaIsAClearError) {
  std::string why;
  if (testing::cuda_device(&why)) GTEST_SKIP() << "this machine has a GPU";
  std::vector<std::string> warnings;
  try {
    Builder(cuda_config(&warnings)).build_from_memory(mlp_onnx());
    FAIL() << "built for cuda:0 without a GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("device cuda:0: "), std::string::npos) << e.what();
  }
}

TEST(CudaEngine, MlpWithAHostFallbackMatchesTheCpu) {
  KILN_SKIP_WITHOUT_GPU();
  std::string onnx = mlp_onnx();
  std::vector<std::string> warnings;
  auto gpu_engine = Builder(cuda_config(&warnings)).build_from_memory(onnx);
  BuilderConfig cpu_cfg;
  cpu_cfg.warn = [](const std::string&) {};
  auto cpu_engine = Builder(cpu_cfg).build_from_memory(onnx);
  EXPECT_GE(cuda_layers(*gpu_engine), 3);
  bool reported = false;
  for (const auto& w : warnings)
    reported |= w.find("Cos") != std::string::npos && w.find("on the host") != std::string::npos;
  EXPECT_TRUE(reported) << "the Cos layer's host fallback was not reported";
  Tensor x = random_tensor({5, 37}, 42);
  auto want = run_logits(*cpu_engine, x);
  auto ctx = gpu_engine->create_context();
  for (int run = 0; run < 3; ++run) {  // the first run binds, the next ones take the steady-state path
    ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
    ctx->run();
    HostTensor y = ctx->output("logits");
    expect_close(std::vector<float>(y.as<float>(), y.as<float>() + y.numel()), want);
  }
  EXPECT_NE(gpu_engine->inspect_json().find("compute_capability"), std::string::npos);
}

// A model with a dynamic batch built for cuda:0 without shapes: its layers cannot be bound (their
// sizes are not known at build time), so the build says they run on the host and which input to give
// shapes for; with a profile every layer binds to the device.
TEST(CudaEngine, DynamicBatchWithoutShapesSaysWhichInputToShape) {
  KILN_SKIP_WITHOUT_GPU();
  GraphBuilder b(17);
  b.input("x", {1, 3, 17, 19}).output("y");
  b.init("w", random_tensor({8, 3, 3, 3}, 1)).init("bias", random_tensor({8}, 2));
  b.init("w2", random_tensor({4, 8, 3, 3}, 3));
  b.conv({"x", "w", "bias"}, "c", 1);
  b.node("Relu", {"c"}, {"r"});
  b.conv({"r", "w2"}, "c2", 1);
  b.node("Relu", {"c2"}, {"y"});
  ir::Model m = b.finish();
  m.graph->inputs[0].type.shape.dims[0] = Dim::symbol("batch");
  const std::string onnx = onnx_import::serialize_model(m).value();
  std::vector<std::string> warnings;
  auto unshaped = Builder(cuda_config(&warnings)).build_from_memory(onnx);
  bool said = false;
  for (const auto& w : warnings)
    said |= w.find("on the host") != std::string::npos &&
            w.find("no shapes for input 'x' [batch,3,17,19]") != std::string::npos &&
            w.find("--shapes") != std::string::npos;
  std::string all;
  for (const auto& w : warnings) all += "\n  " + w;
  EXPECT_TRUE(said) << "no warning names the unshaped input:" << all;
  BuilderConfig cfg = cuda_config(&warnings);
  Profile p;
  p.inputs["x"] = {{2, 3, 17, 19}, {2, 3, 17, 19}, {2, 3, 17, 19}};
  cfg.profiles = {p};
  warnings.clear();
  auto shaped = Builder(cfg).build_from_memory(onnx);
  for (const auto& w : warnings) EXPECT_EQ(w.find("on the host"), std::string::npos) << w;
  int device_layers = 0;
  for (const auto& l : shaped->impl().layers) device_layers += l.kernel.find("cud") != std::string::npos;
  EXPECT_GE(device_layers, 1);
}

TEST(CudaEngine, TransformerBlockMatchesTheCpuOnTwoStreams) {
  KILN_SKIP_WITHOUT_GPU();
  std::string onnx = block_onnx();
  std::vector<std::string> warnings;
  auto gpu_engine = Builder(cuda_config(&warnings)).build_from_memory(onnx);
  BuilderConfig cpu_cfg;
  cpu_cfg.warn = [](const std::string&) {};
  auto cpu_engine = Builder(cpu_cfg).build_from_memory(onnx);
  // Two LayerNorms, the merged Q/K/V projection, one MultiHeadAttention (the heads read in place),
  // the output projection and the two FFN products, each with its bias/activation/residual fused.
  EXPECT_GE(cuda_layers(*gpu_engine), 7);
  int attention = 0;
  for (const auto& l : gpu_engine->impl().layers)
    attention += l.op_type == "MultiHeadAttention" && l.kernel == "attention_cublaslt_cuda";
  EXPECT_EQ(attention, 1) << gpu_engine->inspect_json();
  for (const auto& w : warnings) ADD_FAILURE() << "unexpected warning: " << w;
  Tensor x = random_tensor({2, 7, 32}, 43);
  auto want = run_logits(*cpu_engine, x);
  expect_close(run_logits(*gpu_engine, x), want);

  auto loaded = Engine::deserialize(gpu_engine->serialize());
  std::vector<std::vector<float>> got(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      for (int k = 0; k < 5; ++k) got[t] = run_logits(*loaded, x);
    });
  for (auto& t : threads) t.join();
  for (const auto& g : got) expect_close(g, want);

  // An engine whose GPU differs from this one is refused, naming what differs.
  auto foreign = Engine::deserialize(gpu_engine->serialize());
  const_cast<detail::EngineImpl&>(foreign->impl()).target.gpu["name"] = "NVIDIA Imaginary 9000";
  try {
    run_logits(*foreign, x);
    FAIL() << "ran an engine built for another GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("name 'NVIDIA Imaginary 9000' at build"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
