// kiln's own CPU tactics (src/backends/cpu/kiln_tactics.h) against the reference kernels on every
// instruction-set path (the signature's isa: avx512, avx2, portable, capped by the CPU), on random layers built to
// hit their edges: sizes below, at and above the register tiles and vector widths, K past the cache
// block, every epilogue, strides / pads / dilations / ceil_mode. Plus the vector activations
// against the scalar ones on a sweep of inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>

#include "../graph_builder.h"
#include "backends/cpu/cpu_features.h"
#include "backends/cpu/gemm_kernels.h"
#include "backends/cpu/kiln_tactics.h"
#include "backends/cpu/test_hooks.h"
#include "layer_case.h"
#include "ops/interpreter.h"

namespace kiln {
namespace {

using testing::add_epilogue;
using testing::LayerCase;
using testing::make_node;
using testing::pick;
using testing::set_string;

using testing::GraphBuilder;

// Sizes around the tiles: AVX-512 GEMM 8x32, AVX2 6x16, scalar 4x8, K blocks of 256.
int64_t tile_size(std::mt19937& rng, int64_t big) {
  switch (rng() % 4) {
    case 0: return pick(rng, 1, 9);
    case 1: return pick(rng, 14, 50);
    case 2: return pick(rng, 51, std::max<int64_t>(big, 51));
    default: return 32 * pick(rng, 1, 3) + pick(rng, -1, 1);
  }
}

// `rows` > 0: A has that many rows (M), 2-D.
LayerCase gemm_case_rows(std::mt19937& rng, uint64_t seed, int64_t rows) {
  bool fused = rng() % 2, matmul = rng() % 2;
  int64_t m = rows > 0 ? rows : tile_size(rng, 70), n = tile_size(rng, 110),
          k = rng() % 5 == 0 ? pick(rng, 250, 600) : tile_size(rng, 90);
  bool residual = fused && rng() % 2;
  LayerCase lc;
  if (matmul) {
    bool bias = fused && rng() % 2;
    lc.node = make_node(fused ? "kiln" : "", fused ? "FusedMatMul" : "MatMul", residual ? 4 : (bias ? 3 : 2));
    if (residual && !bias) lc.node.inputs[2] = "";
    Dims a = rows > 0 || rng() % 2 ? Dims{m, k} : Dims{2, (m + 1) / 2, k};
    lc.inputs = {testing::random_tensor(a, seed), testing::random_tensor({k, n}, seed + 1),
                 bias ? testing::random_tensor({n}, seed + 2) : Tensor()};
    if (residual) {
      a.back() = n;
      lc.inputs.push_back(testing::random_tensor(a, seed + 3));
    }
  } else {
    bool ta = rng() % 2, tb = rng() % 2;
    std::vector<Dims> c_shapes = {{}, {n}, {1, n}, {m, n}, {m, 1}, {1}};
    int which = static_cast<int>(rng() % 7);  // 6: no C
    lc.node = make_node(fused ? "kiln" : "", fused ? "FusedGemm" : "Gemm", residual ? 4 : (which < 6 ? 3 : 2));
    if (residual && which == 6) lc.node.inputs[2] = "";
    GraphBuilder::set_int(lc.node, "transA", ta);
    GraphBuilder::set_int(lc.node, "transB", tb);
    if (rng() % 2) GraphBuilder::set_float(lc.node, "alpha", 0.75f);
    if (rng() % 2) GraphBuilder::set_float(lc.node, "beta", 1.5f);
    lc.inputs = {testing::random_tensor(ta ? Dims{k, m} : Dims{m, k}, seed),
                 testing::random_tensor(tb ? Dims{n, k} : Dims{k, n}, seed + 1),
                 which < 6 ? testing::random_tensor(c_shapes[which], seed + 2) : Tensor()};
    if (residual) lc.inputs.push_back(testing::random_tensor({m, n}, seed + 3));
  }
  if (fused) add_epilogue(rng, lc.node);
  lc.constant = {false, true, true, false};
  return lc;
}
LayerCase gemm_case(std::mt19937& rng, uint64_t seed) { return gemm_case_rows(rng, seed, 0); }

// Conv / FusedConv: pointwise (1x1, unpadded, sometimes strided) or depthwise, with bias / residual / epilogue.
LayerCase conv_case(std::mt19937& rng, uint64_t seed, bool depthwise) {
  bool fused = rng() % 2;
  int64_t n = pick(rng, 1, 2), c, m, kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, h, w;
  std::vector<int64_t> pads = {0, 0, 0, 0};
  std::string auto_pad = "NOTSET";
  if (depthwise) {
    c = m = pick(rng, 1, 12);
    static const int64_t kKernels[] = {3, 3, 5, 1, 2, 4, 7};
    kh = kKernels[rng() % 7], kw = rng() % 3 ? kh : kKernels[rng() % 7];
    sh = pick(rng, 1, 3), sw = rng() % 3 == 0 ? 3 : pick(rng, 1, 2);
    if (rng() % 4 == 0) dh = 2, dw = pick(rng, 1, 2);
    if (rng() % 2) kh = kw = rng() % 3 ? 3 : 5, sh = sw = pick(rng, 1, 2), dh = dw = 1;  // the fast kernels' shapes
    pads = {pick(rng, 0, kh), pick(rng, 0, kw), pick(rng, 0, kh), pick(rng, 0, kw)};
    h = pick(rng, (kh - 1) * dh + 1, 20);
    w = rng() % 3 ? pick(rng, (kw - 1) * dw + 1, 40) : pick(rng, 60, 150);
    auto_pad = std::vector<std::string>{"NOTSET", "NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"}[rng() % 6];
  } else {
    c = rng() % 6 == 0 ? pick(rng, 250, 400) : tile_size(rng, 70);
    m = tile_size(rng, 45);
    h = pick(rng, 1, 12), w = pick(rng, 1, 12);
    if (rng() % 4 == 0) h = pick(rng, 20, 30);
    if (rng() % 4 == 0) sh = pick(rng, 1, 3), sw = pick(rng, 1, 2);
    auto_pad = std::vector<std::string>{"NOTSET", "VALID", "SAME_UPPER"}[rng() % 3];
  }
  if (auto_pad != "NOTSET") pads = {0, 0, 0, 0};
  bool bias = rng() % 2, residual = fused && rng() % 2;
  LayerCase lc;
  lc.node = make_node(fused ? "kiln" : "", fused ? "FusedConv" : "Conv", residual ? 4 : (bias ? 3 : 2));
  if (residual && !bias) lc.node.inputs[2] = "";
  auto& nd = lc.node;
  GraphBuilder::set_int(nd, "group", depthwise ? c : 1);
  GraphBuilder::set_ints(nd, "strides", {sh, sw});
  if (dh > 1 || dw > 1) GraphBuilder::set_ints(nd, "dilations", {dh, dw});
  if (auto_pad == "NOTSET")
    GraphBuilder::set_ints(nd, "pads", pads);
  else
    set_string(nd, "auto_pad", auto_pad);
  if (fused) add_epilogue(rng, nd);
  testing::add_conv_inputs(lc, seed, {n, c, h, w}, {m, depthwise ? 1 : c, kh, kw}, bias, residual);
  return lc;
}

LayerCase pool_case(std::mt19937& rng, uint64_t seed) {
  static const char* kOps[] = {"MaxPool",     "AveragePool",       "MaxPool",
                               "AveragePool", "GlobalAveragePool", "GlobalMaxPool"};
  std::string op = kOps[rng() % 6];
  LayerCase lc;
  lc.node = make_node("", op, 1);
  lc.node.opset = op == "AveragePool" ? 19 : 12;
  int64_t kh = pick(rng, 1, 5), kw = pick(rng, 1, 4), dh = rng() % 4 ? 1 : 2, dw = rng() % 4 ? 1 : 2;
  int64_t sh = pick(rng, 1, 3), sw = pick(rng, 1, 3);
  if (rng() % 2) {  // the fast kernels' shapes: square windows, equal strides 1 or 2, no dilation
    static const int64_t kSquare[] = {2, 3, 3, 5};
    kh = kw = kSquare[rng() % 4], sh = sw = pick(rng, 1, 2), dh = dw = 1;
  }
  int64_t h = pick(rng, (kh - 1) * dh + 1, 24);
  int64_t w = rng() % 3 ? pick(rng, (kw - 1) * dw + 1, 40) : pick(rng, 60, 130);
  if (op == "MaxPool" || op == "AveragePool") {
    auto& nd = lc.node;
    GraphBuilder::set_ints(nd, "kernel_shape", {kh, kw});
    GraphBuilder::set_ints(nd, "strides", {sh, sw});
    if (dh > 1 || dw > 1) GraphBuilder::set_ints(nd, "dilations", {dh, dw});
    if (rng() % 4 == 0)
      set_string(nd, "auto_pad", rng() % 2 ? "SAME_UPPER" : "SAME_LOWER");
    else
      GraphBuilder::set_ints(nd, "pads",
                             {pick(rng, 0, kh - 1), pick(rng, 0, kw - 1), pick(rng, 0, kh - 1), pick(rng, 0, kw - 1)});
    if (rng() % 2) GraphBuilder::set_int(nd, "ceil_mode", 1);
    if (op == "AveragePool") GraphBuilder::set_int(nd, "count_include_pad", rng() % 2);
  }
  lc.inputs = {testing::random_tensor({pick(rng, 1, 2), pick(rng, 1, 9), h, w}, seed)};
  lc.constant = {false};
  return lc;
}

// The instruction set of the signatures check() makes (IsaScope sets it per test).
IsaSet g_isa = host_isa();

// Runs `tactic` on `cases` layers from `make`, against the reference kernel; returns how many it took.
int check(const backends::Tactic* tactic, int cases, uint64_t seed,
          const std::function<LayerCase(std::mt19937&, uint64_t)>& make) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  int checked = 0;
  for (int iter = 0; iter < cases; ++iter) {
    LayerCase lc = make(rng, seed + 10 * iter);
    backends::LayerSignature sig = testing::layer_signature(lc);
    sig.isa = g_isa;
    if (!tactic->supports(sig)) continue;
    bool known = false;
    Tensor want = testing::reference_output(lc, &known);
    EXPECT_TRUE(known) << lc.node.op_type;
    if (!want.defined()) continue;  // a case the op itself rejects
    auto prepared = tactic->prepare(sig);
    EXPECT_TRUE(prepared.ok()) << tactic->name() << " case " << iter << ": " << prepared.status().to_string();
    if (!prepared.ok()) continue;
    std::vector<Dims> shapes = prepared.value()->output_shapes();
    EXPECT_EQ(shapes[0], want.shape()) << tactic->name() << " case " << iter;
    if (shapes[0] != want.shape()) continue;
    Tensor got(DataType::kFloat32, shapes[0]);
    std::vector<const Tensor*> ins;
    for (size_t i = 0; i < lc.node.inputs.size(); ++i)
      ins.push_back(lc.node.inputs[i].empty() || !lc.inputs[i].defined() ? nullptr : &lc.inputs[i]);
    Status st = prepared.value()->run_standalone(ins, {&got});
    EXPECT_TRUE(st.ok()) << st.to_string();
    int bad = 0;
    int64_t first_bad = -1;
    for (int64_t i = 0; i < want.numel(); ++i) {
      float w = want.data<float>()[i], g = got.data<float>()[i];
      if (!(std::fabs(w - g) <= 1e-4f * std::max(1.f, std::fabs(w)))) {
        if (first_bad < 0) first_bad = i;
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << tactic->name() << " case " << iter << " (" << lc.node.op_type << " "
                      << dims_str(lc.inputs[0].shape()) << " -> " << dims_str(want.shape()) << "), first at "
                      << first_bad << ": want " << (bad ? want.data<float>()[first_bad] : 0.f) << " got "
                      << (bad ? got.data<float>()[first_bad] : 0.f);
    ++checked;
  }
  return checked;
}

// Sets the signatures' instruction set for the scope: a kiln build --isa level ("scalar": portable).
class IsaScope {
 public:
  explicit IsaScope(const std::string& isa) {
    EXPECT_TRUE(parse_isa_level(isa == "scalar" ? "portable" : isa, &g_isa)) << isa;
  }
  ~IsaScope() { g_isa = host_isa(); }
};

class KilnKernels : public ::testing::TestWithParam<const char*> {};

TEST_P(KilnKernels, GemmMatchesTheReferenceKernel) {
  IsaScope isa(GetParam());
  int n = check(backends::cpu::gemm_kiln_packed(), 120, 11, gemm_case);
  EXPECT_GT(n, 60);
}

// M = 1 (batch-1 fully connected layers) takes the GEMV path of kiln's GEMM: every epilogue, K
// below and past its four segments, N across panel tails.
TEST_P(KilnKernels, GemvMatchesTheReferenceKernel) {
  IsaScope isa(GetParam());
  int n = check(backends::cpu::gemm_kiln_packed(), 80, 13,
                [](std::mt19937& rng, uint64_t seed) { return gemm_case_rows(rng, seed, 1); });
  EXPECT_GT(n, 40);
}

// Small cache blocks: every K, M and N block boundary of kiln's GEMM is crossed on these sizes.
TEST_P(KilnKernels, GemmWithSmallCacheBlocksMatchesTheReferenceKernel) {
  IsaScope isa(GetParam());
  auto& hooks = backends::cpu::kernel_test_hooks();
  hooks.gemm_kc = 7, hooks.gemm_mc = 32, hooks.gemm_nc = 32;
  int n = check(backends::cpu::gemm_kiln_packed(), 60, 77, gemm_case);
  hooks = {};
  EXPECT_GT(n, 30);
}

TEST_P(KilnKernels, PointwiseConvMatchesTheReferenceKernel) {
  IsaScope isa(GetParam());
  int n = check(backends::cpu::conv2d_kiln_1x1(), 80, 22,
                [](std::mt19937& rng, uint64_t seed) { return conv_case(rng, seed, false); });
  EXPECT_GT(n, 40);
}

TEST_P(KilnKernels, PointwiseConvWithStreamedStoresMatchesTheReferenceKernel) {
  IsaScope isa(GetParam());
  backends::cpu::kernel_test_hooks().stream_bytes = 0;  // every output is "large"
  int n = check(backends::cpu::conv2d_kiln_1x1(), 60, 55,
                [](std::mt19937& rng, uint64_t seed) { return conv_case(rng, seed, false); });
  backends::cpu::kernel_test_hooks() = {};
  EXPECT_GT(n, 30);
}

TEST_P(KilnKernels, DepthwiseConvMatchesTheReferenceKernel) {
  IsaScope isa(GetParam());
  int n = check(backends::cpu::conv2d_kiln_depthwise(), 150, 33,
                [](std::mt19937& rng, uint64_t seed) { return conv_case(rng, seed, true); });
  EXPECT_GT(n, 60);
}

TEST_P(KilnKernels, PoolMatchesTheReferenceKernel) {
  IsaScope isa(GetParam());
  int n = check(backends::cpu::pool2d_kiln_nchw(), 150, 44, pool_case);
  EXPECT_GT(n, 80);
}

TEST_P(KilnKernels, VectorActivationsMatchScalar) {
  using namespace backends::cpu;
  IsaScope scope(GetParam());
  std::vector<float> xs;
  for (float x = -30.f; x <= 30.f; x += 0.0137f) xs.push_back(x);
  for (float x : {0.f, -0.f, 1e-6f, -1e-6f, 1e-30f, 88.f, -88.f, 100.f, -100.f, 1e4f, -1e4f}) xs.push_back(x);
  const ActKind kinds[] = {ActKind::kRelu, ActKind::kLeakyRelu, ActKind::kSigmoid,
                           ActKind::kTanh, ActKind::kHardSwish, ActKind::kClip,
                           ActKind::kSiLU, ActKind::kGeluErf,   ActKind::kGeluTanh};
  for (ActKind k : kinds) {
    Activation a;
    a.kind = k, a.alpha = 0.1f, a.lo = -0.5f, a.hi = 0.7f;
    std::vector<float> got = xs;
    activate_inplace(cpu_isa(g_isa), got.data(), static_cast<int64_t>(got.size()), a);
    int bad = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      float want = activate_scalar(xs[i], a);
      // exp / tanh / sigmoid to a few ulps; erf (GELU) to ~1.5e-7 absolute
      if (!(std::fabs(want - got[i]) <= 2e-6f * std::max(1.f, std::fabs(want)))) {
        if (bad++ < 3)
          ADD_FAILURE() << "activation " << static_cast<int>(k) << " at " << xs[i] << ": " << got[i] << " vs " << want;
      }
    }
    EXPECT_EQ(bad, 0) << "activation " << static_cast<int>(k);
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, KilnKernels, ::testing::Values("avx512", "avx2", "scalar"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

}  // namespace
}  // namespace kiln
