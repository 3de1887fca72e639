// kiln_kernel_bench: kiln's own CPU tactics against the oneDNN ones on the layers of the benchmark
// models (BERT-base seq 128, resnet50, mobilenet_v2), at 1 and 2 threads. Each benchmark prepares
// one tactic for one layer and times PreparedLayer::run.
//
//   ninja -C build kiln_kernel_bench
//   build/bench/kiln_kernel_bench --benchmark_filter='dw_' --benchmark_min_time=0.2
//
// Names: <layer>/<tactic>/threads:<n>. KILN_ISA=avx2|portable (read by this benchmark only: it sets the
// signatures' instruction set, as kiln build --isa does) forces kiln's kernels onto a path;
// KILN_GEMM_KC/MC/NC (this benchmark only) set kiln's GEMM cache blocks.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../tests/unit/backends/layer_case.h"
#include "backends/cpu/cpu_features.h"
#include "backends/cpu/gemm_kernels.h"
#include "backends/cpu/test_hooks.h"
#include "backends/registry.h"
#include "core/parallel.h"
#include "ir/attribute_builders.h"
#include "ops/quantized_layers.h"

namespace {

using kiln::DataType;
using kiln::Dims;
using kiln::Tensor;
namespace ir = kiln::ir;
namespace be = kiln::backends;
using kiln::testing::make_node;

// The instruction set the benchmark's signatures offer: KILN_ISA (a level of kiln build --isa), else
// this machine's.
kiln::IsaSet bench_isa() {
  static const kiln::IsaSet isa = [] {
    kiln::IsaSet s = kiln::host_isa();
    if (const char* e = std::getenv("KILN_ISA"); e && *e) {
      std::string name = std::string(e) == "scalar" ? "portable" : e;
      if (!kiln::parse_isa_level(name, &s)) {
        std::fprintf(stderr, "KILN_ISA=%s: one of %s\n", e, kiln::isa_level_names());
        std::exit(2);
      }
      s &= kiln::host_isa();
    }
    return s;
  }();
  return isa;
}

be::LayerSignature bench_signature(const kiln::testing::LayerCase& l) {
  be::LayerSignature sig = kiln::testing::layer_signature(l);
  sig.isa = bench_isa();
  if (kiln::ops::computes_in_int8(l.node)) sig.compute = DataType::kInt8;  // as engine::signature_of
  return sig;
}

Tensor random_tensor(const Dims& d, uint64_t seed) {
  Tensor t(DataType::kFloat32, d);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// One layer (node, inputs, which are constants) and the benchmark's name for it.
struct Layer : kiln::testing::LayerCase {
  std::string name;
};

// FusedMatMul [m, k] x [k, n] + bias (+ residual) (activation).
Layer matmul(const std::string& name, int64_t m, int64_t k, int64_t n, const std::string& act, bool residual) {
  Layer l{{make_node("kiln", "FusedMatMul", residual ? 4 : 3), {}, {}}, name};
  if (!act.empty()) l.node.attrs["activation"] = ir::attr_string(act);
  l.inputs = {random_tensor({m, k}, 1), random_tensor({k, n}, 2), random_tensor({n}, 3)};
  l.constant = {false, true, true, false};
  if (residual) l.inputs.push_back(random_tensor({m, n}, 4));
  return l;
}

// kiln.DynQMatMul (quantize_dynamic's linear layer, src/passes/fold_qdq_matmul.cc): [m, k] quantized at
// run time x int8 [k, n], scale, bias (+ residual) (activation): the INT8 twin of matmul().
Layer dynq(const std::string& name, int64_t m, int64_t k, int64_t n, const std::string& act, bool residual) {
  Layer l{{make_node("kiln", "DynQMatMul", residual ? 6 : 5), {}, {}}, name};
  if (!act.empty()) l.node.attrs["activation"] = ir::attr_string(act);
  Tensor w(DataType::kInt8, {k, n});
  std::mt19937 rng(2);
  for (int64_t i = 0; i < w.numel(); ++i)
    w.data<int8_t>()[i] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  l.inputs = {random_tensor({m, k}, 1), w, Tensor::scalar<int8_t>(DataType::kInt8, 0),
              Tensor::scalar<float>(DataType::kFloat32, 0.01f), random_tensor({n}, 3)};
  l.constant = {false, true, true, true, true, false};
  if (residual) l.inputs.push_back(random_tensor({m, n}, 4));
  return l;
}

// Gemm [m, k] x [n, k]^T + C[n] (a classifier).
Layer gemm_t(const std::string& name, int64_t m, int64_t k, int64_t n) {
  Layer l{{make_node("", "Gemm", 3), {}, {}}, name};
  l.node.attrs["transB"] = ir::attr_int(1);
  l.inputs = {random_tensor({m, k}, 1), random_tensor({n, k}, 2), random_tensor({n}, 3)};
  l.constant = {false, true, true};
  return l;
}

// FusedConv NCHW, bias, optional residual, activation.
Layer conv(const std::string& name, int64_t batch, int64_t c, int64_t h, int64_t w, int64_t m, int64_t kernel,
           int64_t stride, int64_t group, const std::string& act, bool residual) {
  Layer l{{make_node("kiln", "FusedConv", residual ? 4 : 3), {}, {}}, name};
  int64_t pad = kernel / 2;
  l.node.attrs["group"] = ir::attr_int(group);
  l.node.attrs["strides"] = ir::attr_ints({stride, stride});
  l.node.attrs["pads"] = ir::attr_ints({pad, pad, pad, pad});
  if (!act.empty()) l.node.attrs["activation"] = ir::attr_string(act);
  if (act == "Clip") {
    l.node.attrs["activation_min"] = ir::attr_float(0.f);
    l.node.attrs["activation_max"] = ir::attr_float(6.f);
  }
  int64_t oh = (h + 2 * pad - kernel) / stride + 1, ow = (w + 2 * pad - kernel) / stride + 1;
  l.inputs = {random_tensor({batch, c, h, w}, 1), random_tensor({m, c / group, kernel, kernel}, 2),
              random_tensor({m}, 3)};
  l.constant = {false, true, true, false};
  if (residual) l.inputs.push_back(random_tensor({batch, m, oh, ow}, 4));
  return l;
}

Layer pool(const std::string& name, const std::string& op, int64_t batch, int64_t c, int64_t h, int64_t w,
           int64_t kernel, int64_t stride, int64_t pad) {
  Layer l{{make_node("", op, 1), {}, {}}, name};
  l.node.opset = 17;
  if (op == "MaxPool" || op == "AveragePool") {
    l.node.attrs["kernel_shape"] = ir::attr_ints({kernel, kernel});
    l.node.attrs["strides"] = ir::attr_ints({stride, stride});
    l.node.attrs["pads"] = ir::attr_ints({pad, pad, pad, pad});
  }
  l.inputs = {random_tensor({batch, c, h, w}, 1)};
  l.constant = {false};
  return l;
}

std::vector<Layer> layers() {
  std::vector<Layer> v;
  // BERT-base encoder, seq 128 (batch 1): QKV, attention output, FFN up (Gelu), FFN down.
  v.push_back(matmul("bert_qkv_128x768x2304", 128, 768, 2304, "", false));
  v.push_back(matmul("bert_out_128x768x768", 128, 768, 768, "", true));
  v.push_back(matmul("bert_ffn1_128x768x3072", 128, 768, 3072, "Gelu", false));
  v.push_back(matmul("bert_ffn2_128x3072x768", 128, 3072, 768, "", true));
  v.push_back(matmul("bert_ffn1_b8_1024x768x3072", 1024, 768, 3072, "Gelu", false));
  // The same layers in INT8 (ONNX Runtime's quantize_dynamic BERT, ../shared/data/qdq).
  v.push_back(dynq("bert_int8_qkv_128x768x2304", 128, 768, 2304, "", false));
  v.push_back(dynq("bert_int8_out_128x768x768", 128, 768, 768, "", false));
  v.push_back(dynq("bert_int8_ffn1_128x768x3072", 128, 768, 3072, "Gelu", false));
  v.push_back(dynq("bert_int8_ffn2_128x3072x768", 128, 3072, 768, "", true));
  v.push_back(dynq("bert_int8_ffn1_b8_1024x768x3072", 1024, 768, 3072, "Gelu", false));
  // ViT-B/32 encoder at batch 8 (8 x 50 tokens, FP32): QKV, attention output, MLP up (Gelu), MLP down.
  v.push_back(matmul("vit_b8_qkv_400x768x2304", 400, 768, 2304, "", false));
  v.push_back(matmul("vit_b8_out_400x768x768", 400, 768, 768, "", true));
  v.push_back(matmul("vit_b8_mlp1_400x768x3072", 400, 768, 3072, "Gelu", false));
  v.push_back(matmul("vit_b8_mlp2_400x3072x768", 400, 3072, 768, "", true));
  // Classifiers.
  v.push_back(gemm_t("resnet_fc_1x2048x1000", 1, 2048, 1000));
  v.push_back(gemm_t("resnet_fc_8x2048x1000", 8, 2048, 1000));
  v.push_back(gemm_t("mobilenet_fc_1x1280x1000", 1, 1280, 1000));
  // 1x1 convolutions (batch 1): resnet50 bottlenecks, mobilenet_v2 expand / project.
  v.push_back(conv("pw_resnet_64x56_to256", 1, 64, 56, 56, 256, 1, 1, 1, "", true));
  v.push_back(conv("pw_resnet_256x56_to64", 1, 256, 56, 56, 64, 1, 1, 1, "Relu", false));
  v.push_back(conv("pw_resnet_512x28_to128", 1, 512, 28, 28, 128, 1, 1, 1, "Relu", false));
  v.push_back(conv("pw_resnet_1024x14_to256", 1, 1024, 14, 14, 256, 1, 1, 1, "Relu", false));
  v.push_back(conv("pw_resnet_512x7_to2048", 1, 512, 7, 7, 2048, 1, 1, 1, "Relu", true));
  v.push_back(conv("pw_mobilenet_16x112_to96", 1, 16, 112, 112, 96, 1, 1, 1, "Clip", false));
  v.push_back(conv("pw_mobilenet_96x56_to24", 1, 96, 56, 56, 24, 1, 1, 1, "", false));
  v.push_back(conv("pw_b8_mobilenet_16x112_to96", 8, 16, 112, 112, 96, 1, 1, 1, "Clip", false));
  v.push_back(conv("pw_b8_resnet_64x56_to256", 8, 64, 56, 56, 256, 1, 1, 1, "", true));
  v.push_back(conv("pw_mobilenet_144x56_to24", 1, 144, 56, 56, 24, 1, 1, 1, "", true));
  v.push_back(conv("pw_mobilenet_32x28_to192", 1, 32, 28, 28, 192, 1, 1, 1, "Clip", false));
  v.push_back(conv("pw_mobilenet_384x14_to64", 1, 384, 14, 14, 64, 1, 1, 1, "", true));
  v.push_back(conv("pw_mobilenet_576x14_to96", 1, 576, 14, 14, 96, 1, 1, 1, "", true));
  v.push_back(conv("pw_mobilenet_160x7_to960", 1, 160, 7, 7, 960, 1, 1, 1, "Clip", false));
  v.push_back(conv("pw_mobilenet_320x7_to1280", 1, 320, 7, 7, 1280, 1, 1, 1, "Clip", false));
  // Depthwise 3x3 of mobilenet_v2 (batch 1), bias + Relu6.
  const int64_t dw[][3] = {{32, 112, 1}, {96, 112, 2}, {144, 56, 1}, {144, 56, 2}, {192, 28, 1},
                           {192, 28, 2}, {384, 14, 1}, {576, 14, 1}, {576, 14, 2}, {960, 7, 1}};
  for (const auto& d : dw)
    v.push_back(conv("dw_" + std::to_string(d[0]) + "x" + std::to_string(d[1]) + "_s" + std::to_string(d[2]), 1, d[0],
                     d[1], d[1], d[0], 3, d[2], d[0], "Clip", false));
  v.push_back(conv("dw_b8_144x56_s1", 8, 144, 56, 56, 144, 3, 1, 144, "Clip", false));
  // Pooling.
  v.push_back(pool("maxpool_resnet_64x112_k3s2", "MaxPool", 1, 64, 112, 112, 3, 2, 1));
  v.push_back(pool("avgpool_64x56_k3s1", "AveragePool", 1, 64, 56, 56, 3, 1, 1));
  v.push_back(pool("gap_resnet_2048x7", "GlobalAveragePool", 1, 2048, 7, 7, 1, 1, 0));
  v.push_back(pool("gap_mobilenet_1280x7", "GlobalAveragePool", 1, 1280, 7, 7, 1, 1, 0));
  v.push_back(pool("gap_b8_2048x7", "GlobalAveragePool", 8, 2048, 7, 7, 1, 1, 0));
  return v;
}

void run_layer(benchmark::State& state, const Layer* l, const be::Tactic* t, int threads) {
  kiln::set_num_threads(threads);
  auto prepared = t->prepare(bench_signature(*l));
  if (!prepared.ok()) {
    state.SkipWithError(prepared.status().to_string().c_str());
    return;
  }
  Tensor out(DataType::kFloat32, prepared.value()->output_shapes()[0]);
  std::vector<const Tensor*> ins;
  for (const auto& x : l->inputs) ins.push_back(x.defined() ? &x : nullptr);
  // The workspace once, 64-byte aligned, as the execution context's arena gives it.
  const size_t bytes = prepared.value()->workspace_bytes(threads);
  std::vector<uint8_t> arena(bytes + 64);
  be::RunContext ctx;
  ctx.threads = threads;
  ctx.workspace = arena.data() + (64 - reinterpret_cast<uintptr_t>(arena.data()) % 64) % 64;
  ctx.workspace_bytes = bytes;
  for (auto _ : state) {
    auto st = prepared.value()->run(ctx, ins, {&out});
    if (!st.ok()) {
      state.SkipWithError(st.to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize(out.raw());
  }
}

// The fused epilogue's activations alone: in place over a BERT FFN activation (128 x 3072).
void run_activation(benchmark::State& state, kiln::backends::cpu::ActKind kind) {
  namespace cpu = kiln::backends::cpu;
  cpu::Activation act;
  act.kind = kind, act.alpha = 0.1f, act.lo = 0.f, act.hi = 6.f;
  Tensor x = random_tensor({128, 3072}, 7);
  cpu::Isa isa = cpu::cpu_isa(bench_isa());
  for (auto _ : state) {
    cpu::activate_inplace(isa, x.data<float>(), x.numel(), act);
    benchmark::DoNotOptimize(x.raw());
  }
  state.SetItemsProcessed(state.iterations() * x.numel());
}

}  // namespace

int main(int argc, char** argv) {
  {  // Experiments: KILN_GEMM_KC / _MC / _NC set kiln's GEMM cache blocks (test_hooks.h), this benchmark only.
    auto& h = kiln::backends::cpu::kernel_test_hooks();
    const std::pair<const char*, int64_t*> knobs[] = {
        {"KILN_GEMM_KC", &h.gemm_kc}, {"KILN_GEMM_MC", &h.gemm_mc}, {"KILN_GEMM_NC", &h.gemm_nc}};
    for (const auto& [env, knob] : knobs)
      if (const char* e = std::getenv(env); e && *e) *knob = std::atoll(e);
  }
  {
    namespace cpu = kiln::backends::cpu;
    const std::pair<const char*, cpu::ActKind> acts[] = {
        {"Relu", cpu::ActKind::kRelu},       {"Clip", cpu::ActKind::kClip},
        {"Sigmoid", cpu::ActKind::kSigmoid}, {"Tanh", cpu::ActKind::kTanh},
        {"SiLU", cpu::ActKind::kSiLU},       {"HardSwish", cpu::ActKind::kHardSwish},
        {"GeluErf", cpu::ActKind::kGeluErf}, {"GeluTanh", cpu::ActKind::kGeluTanh}};
    for (const auto& [name, kind] : acts)
      benchmark::RegisterBenchmark((std::string("activation_128x3072/") + name).c_str(), run_activation, kind)
          ->Unit(benchmark::kMicrosecond);
  }
  static std::vector<Layer> all = layers();
  for (const Layer& l : all) {
    be::LayerSignature sig = bench_signature(l);
    for (const be::Tactic* t : be::candidate_tactics(sig))
      for (int threads : {1, 2})
        benchmark::RegisterBenchmark((l.name + "/" + t->name() + "/threads:" + std::to_string(threads)).c_str(),
                                     run_layer, &l, t, threads)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime()
            ->ComputeStatistics("min",
                                [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); });
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
