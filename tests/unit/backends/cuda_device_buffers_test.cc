// The C++ API's device buffers and concurrent contexts on a CUDA engine: inputs bound as device
// pointers with the caller's stream and outputs written into the caller's device buffers give the host
// API's outputs bit for bit; two and four contexts of one engine on their own threads and streams, each
// running many different inputs (batch sizes included), give what one context gives for each input, bit
// for bit (the coordinator also runs these under compute-sanitizer racecheck and memcheck); activation
// memory follows the actual batch, not the profile's max. The clear errors (a CPU engine, a host pointer,
// another device, wrong sizes, a wrong output shape) are checked too, the CPU's without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include "../graph_builder.h"
#include "cuda_test_util.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"
#include "ops/shape_inference.h"

namespace kiln {
namespace {

using testing::GraphBuilder;
using testing::random_tensor;
using Copy = backends::DeviceRuntime::Copy;

constexpr int64_t kIn = 37, kHidden = 29, kOut = 11, kMaxBatch = 8;

// x [batch, 37] -> MatMul + bias -> Relu -> MatMul + bias -> Softmax: logits [batch, 11].
std::string mlp_onnx() {
  GraphBuilder b(17);
  b.input("x", {1, kIn}).output("logits");
  b.init("w1", random_tensor({kIn, kHidden}, 1)).init("b1", random_tensor({kHidden}, 2));
  b.init("w2", random_tensor({kHidden, kOut}, 3)).init("b2", random_tensor({kOut}, 4));
  b.node("MatMul", {"x", "w1"}, {"h"});
  b.node("Add", {"h", "b1"}, {"hb"});
  b.node("Relu", {"hb"}, {"r"});
  b.node("MatMul", {"r", "w2"}, {"z"});
  b.node("Add", {"z", "b2"}, {"zb"});
  GraphBuilder::set_int(b.node("Softmax", {"zb"}, {"logits"}), "axis", -1);
  ir::Model m = b.finish();
  m.graph->inputs[0].type.shape.dims[0] = Dim::symbol("batch");
  m.graph->value_types.clear();
  Status s = ops::infer_shapes(*m.graph);
  if (!s.ok()) throw std::runtime_error(s.to_string());
  return onnx_import::serialize_model(m).value();
}

std::shared_ptr<Engine> build(Device device) {
  BuilderConfig cfg;
  cfg.device = device;
  // Any warning but the tuner's note on a busy machine (ctest -j2 on 2 cores) is a failure.
  cfg.warn = [](const std::string& w) {
    if (w.find("timings were disturbed") == std::string::npos) ADD_FAILURE() << "unexpected warning: " << w;
  };
  Profile p;
  p.inputs["x"] = {{1, kIn}, {1, kIn}, {kMaxBatch, kIn}};
  cfg.profiles = {p};
  return Builder(cfg).build_from_memory(mlp_onnx());
}

std::vector<float> run_host(ExecutionContext& ctx, const Tensor& x) {
  ctx.set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
  ctx.run();
  HostTensor y = ctx.output("logits");
  return std::vector<float>(y.as<float>(), y.as<float>() + y.numel());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

DeviceTensor device_tensor(void* data, Dims shape, void* stream) {
  DeviceTensor t;
  t.dtype = kFloat32;
  t.shape = shape;
  t.data = data;
  t.nbytes = static_cast<size_t>(dims_numel(shape)) * sizeof(float);
  t.stream = stream;
  return t;
}

// Inputs of batch 1, 2, 5, 8, ... (different values each).
std::vector<Tensor> inputs(int n) {
  static const int64_t kBatches[] = {1, 2, 5, 8};
  std::vector<Tensor> xs;
  for (int i = 0; i < n; ++i) xs.push_back(random_tensor({kBatches[i % 4], kIn}, 100 + i));
  return xs;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(DeviceBuffers, ACpuEngineRefusesThemAndSizesAreChecked) {
  auto engine = build({DeviceKind::kCPU, 0});
  auto ctx = engine->create_context();
  std::vector<float> host(2 * kIn);
  DeviceTensor t = device_tensor(host.data(), {2, kIn}, nullptr);
  std::string e = error_of([&] { ctx->set_input_device("x", t); });
  EXPECT_NE(e.find("runs on the CPU"), std::string::npos) << e;
  e = error_of([&] { ctx->set_output_device("logits", device_tensor(host.data(), {2, kOut}, nullptr)); });
  EXPECT_NE(e.find("runs on the CPU"), std::string::npos) << e;
  t.nbytes -= 4;
  e = error_of([&] { ctx->set_input_device("x", t); });
  EXPECT_NE(e.find("bytes given"), std::string::npos) << e;
  e = error_of([&] { ctx->set_input_device("nope", t); });
  EXPECT_NE(e.find("not an input"), std::string::npos) << e;
  e = error_of([&] { ctx->output_device("logits"); });
  EXPECT_NE(e.find("runs on the CPU"), std::string::npos) << e;
}

// Batch 1 takes less than the profile's max shapes (batch 8) need; batch 8 grows the arena, and then
// both shapes run in it (no growth) with batch 8's outputs unchanged.
void arena_follows_the_actual_batch(Device device) {
  auto engine = build(device);
  auto ctx = engine->create_context();
  auto x1 = random_tensor({1, kIn}, 7), x8 = random_tensor({kMaxBatch, kIn}, 8);
  run_host(*ctx, x1);
  const size_t a1 = ctx->arena_bytes();
  EXPECT_GT(a1, 0u);
  EXPECT_LT(a1, engine->profiles()[0].memory_max) << "batch 1 took the profile's max shapes' memory";
  std::vector<float> want8 = run_host(*ctx, x8);
  const size_t a8 = ctx->arena_bytes();
  EXPECT_GT(a8, a1);
  for (int k = 0; k < 3; ++k) {
    run_host(*ctx, x1);
    EXPECT_EQ(ctx->arena_bytes(), a8);
    EXPECT_LT(ctx->activation_bytes(), a8);  // the plan of the last run: batch 1's
    EXPECT_TRUE(same_bits(run_host(*ctx, x8), want8));
    EXPECT_EQ(ctx->arena_bytes(), a8);
  }
}

TEST(DeviceBuffers, ArenaFollowsTheActualBatchOnTheCpu) { arena_follows_the_actual_batch({DeviceKind::kCPU, 0}); }

TEST(CudaDeviceBuffers, InputsAndOutputsOnTheDeviceMatchTheHostApiBitwise) {
  KILN_SKIP_WITHOUT_GPU();
  auto engine = build({DeviceKind::kCUDA, 0});
  auto host_ctx = engine->create_context();
  auto ctx = engine->create_context();
  auto stream = gpu->create_stream(0).value();
  auto in = gpu->allocate(0, kMaxBatch * kIn * sizeof(float)).value();
  auto out = gpu->allocate(0, kMaxBatch * kOut * sizeof(float)).value();
  int k = 0;
  for (const Tensor& x : inputs(8)) {
    const int64_t batch = x.dim(0);
    std::vector<float> want = run_host(*host_ctx, x);
    // Every other run on the legacy default stream (nullptr), the others on the caller's own stream.
    void* s = k++ % 2 ? stream.get() : nullptr;
    ASSERT_TRUE(gpu->copy(in.get(), x.raw(), x.nbytes(), Copy::kHostToDevice, s).ok());
    ctx->set_input_device("x", device_tensor(in.get(), {batch, kIn}, s));
    EXPECT_EQ(ctx->output_shape("logits"), (std::vector<int64_t>{batch, kOut}));
    ctx->set_output_device("logits", device_tensor(out.get(), {batch, kOut}, s));
    ctx->run();
    std::vector<float> got(batch * kOut, -1.f), direct(batch * kOut, -2.f);
    ASSERT_TRUE(gpu->copy(got.data(), out.get(), got.size() * sizeof(float), Copy::kDeviceToHost, s).ok());
    DeviceTensor d = ctx->output_device("logits");  // the context's own copy, valid until the next run
    EXPECT_EQ(d.shape, (std::vector<int64_t>{batch, kOut}));
    ASSERT_TRUE(gpu->copy(direct.data(), d.data, d.nbytes, Copy::kDeviceToHost, s).ok());
    ASSERT_TRUE(gpu->synchronize(s).ok());
    EXPECT_TRUE(same_bits(got, want)) << "batch " << batch;
    EXPECT_TRUE(same_bits(direct, want)) << "batch " << batch;
    std::string e = error_of([&] { ctx->output("logits"); });
    EXPECT_NE(e.find("device buffer"), std::string::npos) << e;
  }
  // Back to host tensors: the bound input's buffer is not written, the output comes to the host again.
  ctx->clear_output_device("logits");
  Tensor x = random_tensor({3, kIn}, 55);
  EXPECT_TRUE(same_bits(run_host(*ctx, x), run_host(*host_ctx, x)));
}

TEST(CudaDeviceBuffers, WrongBuffersAreClearErrors) {
  KILN_SKIP_WITHOUT_GPU();
  auto engine = build({DeviceKind::kCUDA, 0});
  auto ctx = engine->create_context();
  std::vector<float> host(2 * kIn);
  std::string e = error_of([&] { ctx->set_input_device("x", device_tensor(host.data(), {2, kIn}, nullptr)); });
  EXPECT_NE(e.find("is host memory"), std::string::npos) << e;
  auto in = gpu->allocate(0, 2 * kIn * sizeof(float)).value();
  DeviceTensor t = device_tensor(in.get(), {2, kIn}, nullptr);
  t.device.index = 1;
  e = error_of([&] { ctx->set_input_device("x", t); });
  EXPECT_NE(e.find("cuda:1"), std::string::npos) << e;
  t.device.index = 0;
  t.nbytes += 4;
  e = error_of([&] { ctx->set_input_device("x", t); });
  EXPECT_NE(e.find("bytes given"), std::string::npos) << e;
  t.nbytes -= 4;
  ctx->set_input_device("x", t);
  auto out = gpu->allocate(0, 3 * kOut * sizeof(float)).value();
  ctx->set_output_device("logits", device_tensor(out.get(), {3, kOut}, nullptr));  // batch 2 gives [2, 11]
  e = error_of([&] { ctx->run(); });
  EXPECT_NE(e.find("[3,11]"), std::string::npos) << e;
}

TEST(CudaDeviceBuffers, ArenaFollowsTheActualBatch) {
  KILN_SKIP_WITHOUT_GPU();
  arena_follows_the_actual_batch({DeviceKind::kCUDA, 0});
}

// `contexts` contexts of `engine` on their own threads; even ones bind host tensors, odd ones device
// buffers on a stream of their own. Each runs every input three times (starting at its own offset) and
// checks each output against `want` bit for bit.
void stress(const Engine& engine, const backends::DeviceRuntime& gpu, int contexts, const std::vector<Tensor>& xs,
            const std::vector<std::vector<float>>& want) {
  std::vector<std::string> failures(contexts);
  std::vector<std::thread> threads;
  for (int c = 0; c < contexts; ++c)
    threads.emplace_back([&, c] {
      auto fail = [&](const std::string& m) {
        if (failures[c].empty()) failures[c] = m;
      };
      try {
        auto ctx = engine.create_context();
        const bool on_device = c % 2 == 1;
        std::shared_ptr<void> stream;
        std::shared_ptr<uint8_t[]> in, out;
        if (on_device) {
          stream = gpu.create_stream(0).value();
          in = gpu.allocate(0, kMaxBatch * kIn * sizeof(float)).value();
          out = gpu.allocate(0, kMaxBatch * kOut * sizeof(float)).value();
        }
        const size_t n = xs.size();
        for (size_t r = 0; r < 3 * n; ++r) {
          const size_t i = (r + 5 * static_cast<size_t>(c)) % n;
          const Tensor& x = xs[i];
          std::vector<float> got;
          if (!on_device) {
            got = run_host(*ctx, x);
          } else {
            const int64_t batch = x.dim(0);
            got.assign(batch * kOut, -1.f);
            Status s = gpu.copy(in.get(), x.raw(), x.nbytes(), Copy::kHostToDevice, stream.get());
            ctx->set_input_device("x", device_tensor(in.get(), {batch, kIn}, stream.get()));
            ctx->set_output_device("logits", device_tensor(out.get(), {batch, kOut}, stream.get()));
            ctx->run();
            if (s.ok()) s = gpu.copy(got.data(), out.get(), got.size() * 4, Copy::kDeviceToHost, stream.get());
            if (s.ok()) s = gpu.synchronize(stream.get());
            if (!s.ok()) return fail(s.to_string());
          }
          if (!same_bits(got, want[i]))
            return fail("input " + std::to_string(i) + " (run " + std::to_string(r) + ") differs from one context's");
        }
      } catch (const std::exception& e) {
        fail(e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (int c = 0; c < contexts; ++c) EXPECT_EQ(failures[c], "") << "context " << c << " of " << contexts;
}

TEST(CudaStreams, ContextsOnTheirOwnStreamsMatchOneContextBitwise) {
  KILN_SKIP_WITHOUT_GPU();
  auto engine = build({DeviceKind::kCUDA, 0});
  std::vector<Tensor> xs = inputs(16);
  std::vector<std::vector<float>> want;
  {
    auto one = engine->create_context();
    for (const Tensor& x : xs) want.push_back(run_host(*one, x));
  }
  stress(*engine, *gpu, 2, xs, want);
  stress(*engine, *gpu, 4, xs, want);
}

// The timing cache's keys of CUDA layers carry what the engine file records of the GPU: a cache
// written on one GPU model, driver or library version says nothing of another.
TEST(CudaTimingCache, KeysCarryTheGpuIdentity) {
  KILN_SKIP_WITHOUT_GPU();
  const std::string id = backends::identity_key(*gpu, 0);
  for (const char* field : {"name=", "compute_capability=", "driver=", "runtime=", "cublaslt=", "cudnn="})
    EXPECT_NE(id.find(field), std::string::npos) << field << " missing from " << id;
  EXPECT_EQ(id.find(' '), std::string::npos) << id;
  BuilderConfig cfg;
  cfg.device = {DeviceKind::kCUDA, 0};
  cfg.warn = [](const std::string&) {};
  cfg.timing_cache = ::testing::TempDir() + "/kiln_cuda_timing_cache.json";
  std::remove(cfg.timing_cache.c_str());
  // A convolution: cuDNN's heuristic offers several algorithms (conv_cudnn_h<k>), so the tuner times
  // candidates and the cache learns entries (the MLP's tiny products had one candidate each, nothing timed,
  // and no cache was written).
  GraphBuilder b(17);
  b.input("x", {2, 8, 20, 20}).output("y");
  b.init("w", random_tensor({16, 8, 3, 3}, 5));
  b.conv({"x", "w"}, "y", 1);
  ir::Model conv = b.finish();
  Builder(cfg).build_from_memory(onnx_import::serialize_model(conv).value());
  std::FILE* f = std::fopen(cfg.timing_cache.c_str(), "rb");
  ASSERT_NE(f, nullptr) << "no timing cache written";
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  EXPECT_NE(text.find("@cuda:0[" + id + "]"), std::string::npos) << "no CUDA layer key with the GPU identity";
  std::remove(cfg.timing_cache.c_str());
}

}  // namespace
}  // namespace kiln
