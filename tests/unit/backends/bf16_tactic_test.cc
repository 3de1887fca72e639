// The BF16 tactics (backends/cpu/onednn_bf16.cc; the channels-last ones of onednn_nhwc_bf16.cc at the end) against the
// reference kernel (float32) on random layers with odd sizes: kiln.BlockedConv (group 1, depthwise, groups of whole
// blocks; X plain or blocked; strides, dilations, pads; bias, residual, every epilogue) and MatMul / Gemm / kiln.Fused*
// with constant weights (A of rank 2 to 4, transposes, alpha, beta, every C shape).
//
// The tolerance, per output element. A BF16 layer rounds each activation x and weight w once to
// bf16 (8 significant bits, round to nearest even: relative error at most u = 2^-8), multiplies
// exactly (a product of two 8-bit significands fits in fp32) and accumulates in fp32. So each product
// carries a relative error of at most 2u + u^2, and the sum of K of them an absolute error of at
// most (2u + u^2 + K * 2^-24) * S, where S = sum_k |x_k| |w_k| (the last term: fp32 accumulation of
// K terms in any order, K * eps32 / 2 per term, a loose bound). S is computed by the reference kernel
// itself on |X| and |W| (no bias, residual or activation: those add exactly in fp32). The epilogue
// activation is at most 1.5-Lipschitz (HardSwish's steepest slope; ReLU, Tanh, Clip 1; SiLU and GELU
// about 1.1), so the bound is scaled by 1.5, plus the fp32 tolerance of tactic_test.cc (1e-4
// relative) for the epilogue's own rounding. A wrong layout, a lost block or an un-rounded-back sum
// puts errors of order S, far outside it; the typical error is about sqrt(K) * u * S / K.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "../graph_builder.h"
#include "backends/registry.h"
#include "layer_case.h"
#include "ops/kiln_layout.h"

namespace kiln {
namespace {

using testing::LayerCase;
using testing::make_node;
using testing::pick;

bool has_bf16_cpu() { return (host_isa() & kIsaAvx512Bf16) != 0; }

// A kiln.FusedConv of channels c -> m in `group` groups and random geometry (kernel 1 to 5, stride,
// dilation, pads; bias, residual and an epilogue at random): X [n, c, H, W]. `pads_below_kernel`:
// asymmetric pads each smaller than the kernel; else one pad up to k / 2 + 1 on every side.
LayerCase fused_conv_case(std::mt19937& rng, uint64_t seed, int64_t n, int64_t c, int64_t m, int64_t group,
                          bool pads_below_kernel) {
  const int64_t k = rng() % 3 == 0 ? 1 : pick(rng, 2, 5), s = pick(rng, 1, 2), d = rng() % 4 ? 1 : 2;
  const int64_t p = pads_below_kernel ? pick(rng, 0, k - 1) : pick(rng, 0, k / 2 + 1);
  const int64_t pb = pads_below_kernel ? pick(rng, 0, k - 1) : p;
  const int64_t h = pick(rng, (k - 1) * d + 1, 17), w = pick(rng, (k - 1) * d + 1, 19);
  const bool bias = rng() % 2, residual = rng() % 2;
  LayerCase lc;
  lc.node = make_node("kiln", "FusedConv", residual ? 4 : (bias ? 3 : 2));
  if (residual && !bias) lc.node.inputs[2] = "";
  testing::GraphBuilder::set_int(lc.node, "group", group);
  testing::GraphBuilder::set_ints(lc.node, "strides", {s, s});
  testing::GraphBuilder::set_ints(lc.node, "dilations", {d, d});
  testing::GraphBuilder::set_ints(lc.node, "pads", {p, p, pb, p});
  testing::add_epilogue(rng, lc.node);
  testing::add_conv_inputs(lc, seed, {n, c, h, w}, {m, c / group, k, k}, bias, residual);
  return lc;
}

LayerCase blocked_conv_case(std::mt19937& rng, uint64_t seed) {
  const int64_t n = pick(rng, 1, 2);
  int64_t c, m, group;
  switch (rng() % 3) {
    case 0: group = 1, c = pick(rng, 1, 40), m = pick(rng, 1, 37); break;
    // depthwise: mostly whole blocks of 16 (the BF16 tactic declines others: oneDNN 2.6 has no BF16 kernel)
    case 1: group = c = m = rng() % 4 ? 16 * pick(rng, 1, 2) : pick(rng, 1, 35); break;
    default: group = 2, c = 2 * 16 * pick(rng, 1, 2), m = 2 * 16 * pick(rng, 1, 2); break;  // whole blocks
  }
  LayerCase lc = fused_conv_case(rng, seed, n, c, m, group, false);
  lc.node.domain = "kiln", lc.node.op_type = "BlockedConv", lc.node.opset = 1;
  testing::GraphBuilder::set_int(lc.node, "block", 16);
  if (rng() % 4) lc.inputs[0] = ops::to_channel_blocked(lc.inputs[0], 16).value();  // else plain X (first layer)
  if (lc.node.has_input(3)) lc.inputs[3] = ops::to_channel_blocked(lc.inputs[3], 16).value();
  return lc;
}

LayerCase matmul_case(std::mt19937& rng, uint64_t seed) {
  const bool fused = rng() % 2;
  const int64_t rank = pick(rng, 2, 4), m = pick(rng, 1, 37), k = pick(rng, 1, 300), n = pick(rng, 1, 45);
  Dims a;
  for (int64_t i = 0; i + 2 < rank; ++i) a.push_back(pick(rng, 1, 3));
  a.insert(a.end(), {m, k});
  const bool bias = fused && rng() % 2, residual = fused && rng() % 2;
  LayerCase lc;
  lc.node = make_node(fused ? "kiln" : "", fused ? "FusedMatMul" : "MatMul", residual ? 4 : (bias ? 3 : 2));
  if (residual && !bias) lc.node.inputs[2] = "";
  if (fused) testing::add_epilogue(rng, lc.node);
  lc.inputs = {testing::random_tensor(a, seed), testing::random_tensor({k, n}, seed + 1),
               bias ? testing::random_tensor({n}, seed + 2) : Tensor()};
  lc.constant = {false, true, true, false};
  if (residual) {
    Dims y = a;
    y.back() = n;
    lc.inputs.push_back(testing::random_tensor(y, seed + 3));
  }
  return lc;
}

LayerCase gemm_case(std::mt19937& rng, uint64_t seed) {
  const bool fused = rng() % 2, ta = rng() % 2, tb = rng() % 2;
  const int64_t m = pick(rng, 1, 33), k = pick(rng, 1, 260), n = pick(rng, 1, 41);
  const std::vector<Dims> c_shapes = {{}, {n}, {1, n}, {m, n}, {m, 1}, {1}};
  const int which = static_cast<int>(rng() % 7);  // 6: no C
  const bool residual = fused && rng() % 2;
  LayerCase lc;
  lc.node = make_node(fused ? "kiln" : "", fused ? "FusedGemm" : "Gemm", residual ? 4 : (which < 6 ? 3 : 2));
  if (residual && which == 6) lc.node.inputs[2] = "";
  testing::GraphBuilder::set_int(lc.node, "transA", ta);
  testing::GraphBuilder::set_int(lc.node, "transB", tb);
  if (rng() % 2) testing::GraphBuilder::set_float(lc.node, "alpha", 0.75f);
  if (rng() % 2) testing::GraphBuilder::set_float(lc.node, "beta", 1.5f);
  if (fused) testing::add_epilogue(rng, lc.node);
  lc.inputs = {testing::random_tensor(ta ? Dims{k, m} : Dims{m, k}, seed),
               testing::random_tensor(tb ? Dims{n, k} : Dims{k, n}, seed + 1),
               which < 6 ? testing::random_tensor(c_shapes[which], seed + 2) : Tensor()};
  lc.constant = {false, true, true, false};
  if (residual) lc.inputs.push_back(testing::random_tensor({m, n}, seed + 3));
  return lc;
}

Tensor abs_of(const Tensor& t) {
  Tensor r = t;  // copies
  Tensor out(t.dtype(), t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) out.data<float>()[i] = std::fabs(r.data<float>()[i]);
  return out;
}

// S = sum_k |x_k| |w_k| per output element: the layer on |X|, |W| without bias, residual or activation.
Tensor abs_product_sums(const LayerCase& lc) {
  LayerCase s = lc;
  for (auto it = s.node.attrs.begin(); it != s.node.attrs.end();)
    it = it->first.rfind("activation", 0) == 0 || it->first == "beta" ? s.node.attrs.erase(it) : std::next(it);
  s.node.inputs.resize(2);
  s.inputs.resize(2);
  s.inputs[0] = abs_of(lc.inputs[0]);
  s.inputs[1] = abs_of(lc.inputs[1]);
  return testing::reference_output(s);
}

// The reduction length of the case: C/group * kH * kW for a conv, K for a matrix product.
int64_t reduction_length(const LayerCase& lc) {
  const Dims& w = lc.inputs[1].shape();
  if (lc.node.op_type == "BlockedConv" || lc.node.op_type == "NhwcConv") return w[1] * w[2] * w[3];
  if (lc.node.op_type == "Gemm" || lc.node.op_type == "FusedGemm") return lc.node.attr_int("transB", 0) ? w[1] : w[0];
  return w[0];
}

// Checks `tactic` on `lc` against the reference; returns false when the tactic declines it.
bool check_bf16(const backends::Tactic& tactic, const LayerCase& lc, int iter) {
  backends::LayerSignature sig = testing::layer_signature(lc);
  sig.compute = DataType::kBFloat16;
  if (!backends::why_declined(tactic, sig).empty()) return false;
  std::vector<Tensor> want = testing::reference_outputs(lc);
  if (want.empty()) return false;
  Tensor sums = abs_product_sums(lc);
  EXPECT_EQ(sums.shape(), want[0].shape());
  auto prepared = tactic.prepare(sig);
  // oneDNN 2.6's BF16 depthwise kernel does not take every geometry (e.g. 4x4, stride 2, pads 2 on a
  // 4x6 X): the tactic then declines at prepare, naming its reference implementation, and the tuner
  // keeps FP32. Allowed for depthwise / grouped layers only: group 1 convs and matrix products prepare.
  if (!prepared.ok() && lc.node.attr_int("group", 1) > 1 &&
      prepared.status().message().find("only its reference kernel") != std::string::npos)
    return false;
  EXPECT_TRUE(prepared.ok()) << tactic.name() << " case " << iter << " (x " << dims_str(lc.inputs[0].shape()) << " w "
                             << dims_str(lc.inputs[1].shape()) << " group " << lc.node.attr_int("group", 1)
                             << " strides " << dims_str(lc.node.attr_ints("strides", {})) << " dilations "
                             << dims_str(lc.node.attr_ints("dilations", {})) << " pads "
                             << dims_str(lc.node.attr_ints("pads", {})) << "): " << prepared.status().to_string();
  if (!prepared.ok()) return true;
  EXPECT_EQ(prepared.value()->output_shapes()[0], want[0].shape());
  Tensor got(DataType::kFloat32, want[0].shape());
  std::vector<const Tensor*> ins;
  for (size_t i = 0; i < lc.node.inputs.size(); ++i)
    ins.push_back(lc.node.inputs[i].empty() || !lc.inputs[i].defined() ? nullptr : &lc.inputs[i]);
  std::vector<Tensor*> outs{&got};
  Status st = prepared.value()->run_standalone(ins, outs);
  EXPECT_TRUE(st.ok()) << st.to_string();
  const double u = std::ldexp(1.0, -8), k = static_cast<double>(reduction_length(lc));
  const double per_sum = 1.5 * (2 * u + u * u + k * std::ldexp(1.0, -24));
  int bad = 0;
  for (int64_t i = 0; i < want[0].numel(); ++i) {
    const double w = want[0].data<float>()[i], g = got.data<float>()[i];
    const double tol = per_sum * sums.data<float>()[i] + 1e-4 * std::max(1.0, std::fabs(w));
    if (!(std::fabs(w - g) <= tol)) {
      if (bad++ < 3)
        ADD_FAILURE() << tactic.name() << " case " << iter << " element " << i << ": want " << w << ", got " << g
                      << " (tolerance " << tol << ", K " << k << ")";
    }
  }
  EXPECT_EQ(bad, 0) << tactic.name() << " case " << iter << " " << dims_str(lc.inputs[0].shape()) << " w "
                    << dims_str(lc.inputs[1].shape());
  return true;
}

TEST(Bf16Tactics, MatchTheReferenceWithinBf16RoundingOfTheirOperands) {
  if (!has_bf16_cpu()) GTEST_SKIP() << "this CPU lacks AVX-512 BF16: the BF16 tactics decline every layer";
  const backends::Tactic* conv = backends::find_tactic("conv2d_onednn_nchwc_bf16");
  const backends::Tactic* mm = backends::find_tactic("matmul_onednn_bf16_packed");
  if (!conv || !mm) GTEST_SKIP() << "built without oneDNN";
  std::mt19937 rng(2024);
  int convs = 0, mms = 0;
  for (int iter = 0; iter < 360; ++iter) {
    const uint64_t seed = 7000 + 10 * static_cast<uint64_t>(iter);
    const int family = iter % 3;
    LayerCase lc = family == 0   ? blocked_conv_case(rng, seed)
                   : family == 1 ? matmul_case(rng, seed)
                                 : gemm_case(rng, seed);
    if (family == 0)
      convs += check_bf16(*conv, lc, iter);
    else
      mms += check_bf16(*mm, lc, iter);
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(convs, 45);  // of 120: plain X and depthwise geometries oneDNN lacks in BF16 are declined
  EXPECT_GT(mms, 200);
}

// The error is bf16's and not zero: a long reduction of random values differs from the float32
// reference by more than float32 rounding could (so a tactic that quietly ran float32 would fail).
TEST(Bf16Tactics, RoundToBf16ForReal) {
  if (!has_bf16_cpu()) GTEST_SKIP() << "this CPU lacks AVX-512 BF16";
  const backends::Tactic* mm = backends::find_tactic("matmul_onednn_bf16_packed");
  if (!mm) GTEST_SKIP() << "built without oneDNN";
  LayerCase lc;
  lc.node = make_node("", "MatMul", 2);
  lc.inputs = {testing::random_tensor({8, 512}, 11), testing::random_tensor({512, 16}, 12)};
  lc.constant = {false, true};
  backends::LayerSignature sig = testing::layer_signature(lc);
  sig.compute = DataType::kBFloat16;
  auto p = mm->prepare(sig);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  Tensor want = testing::reference_output(lc), got(DataType::kFloat32, want.shape());
  std::vector<const Tensor*> ins{&lc.inputs[0], &lc.inputs[1]};
  std::vector<Tensor*> outs{&got};
  ASSERT_TRUE(p.value()->run_standalone(ins, outs).ok());
  double max_err = 0;
  for (int64_t i = 0; i < want.numel(); ++i)
    max_err = std::max(max_err, static_cast<double>(std::fabs(want.data<float>()[i] - got.data<float>()[i])));
  EXPECT_GT(max_err, 1e-4);  // float32 over K = 512 of values in [-1, 1]: ~1e-6
  // A float32 layer is declined by the BF16 tactic, and a BF16 layer by the float32 one.
  sig.compute = DataType::kFloat32;
  EXPECT_NE(backends::why_declined(*mm, sig), "");
  sig.compute = DataType::kBFloat16;
  EXPECT_NE(backends::why_declined(*backends::find_tactic("matmul_onednn_packed"), sig), "");
}

// ---------------------------------------------------------------- channels-last (onednn_nhwc_bf16.cc)

// kiln.NhwcConv of random geometry (group 1, depthwise, grouped; strides, dilations, pads; bias,
// residual, every epilogue): X and the residual channels-last, W and B as they are.
LayerCase nhwc_conv_case(std::mt19937& rng, uint64_t seed) {
  const int64_t n = pick(rng, 1, 2);
  int64_t c, m, group;
  switch (rng() % 3) {
    case 0: group = 1, c = pick(rng, 1, 40), m = pick(rng, 1, 37); break;
    case 1: group = c = m = pick(rng, 1, 35); break;  // depthwise
    default: group = pick(rng, 2, 3), c = group * pick(rng, 1, 9), m = group * pick(rng, 1, 9); break;
  }
  // (pads below the kernel: oneDNN takes no pad as large as it, resolve_conv declines those)
  LayerCase lc = fused_conv_case(rng, seed, n, c, m, group, true);
  const bool residual = lc.node.has_input(3);
  lc.node.domain = "kiln", lc.node.op_type = "NhwcConv", lc.node.opset = 1;
  lc.inputs[0] = ops::nchw_to_nhwc(lc.inputs[0]).value();
  if (residual) lc.inputs[3] = ops::nchw_to_nhwc(lc.inputs[3]).value();
  return lc;
}

// kiln.NhwcPool: MaxPool / AveragePool (pads, strides, ceil_mode, count_include_pad) or a global pool.
LayerCase nhwc_pool_case(std::mt19937& rng, uint64_t seed) {
  static const char* kOps[] = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"};
  const std::string op = kOps[rng() % 4];
  const int64_t n = pick(rng, 1, 2), c = pick(rng, 1, 40), h = pick(rng, 4, 17), w = pick(rng, 4, 19);
  LayerCase lc;
  lc.node = make_node("kiln", "NhwcPool", 1);
  testing::set_string(lc.node, "pool", op);
  testing::GraphBuilder::set_int(lc.node, "pool_opset", 11);
  if (op == "MaxPool" || op == "AveragePool") {
    const int64_t kh = pick(rng, 1, 4), kw = pick(rng, 1, 4);
    testing::GraphBuilder::set_ints(lc.node, "kernel_shape", {kh, kw});
    testing::GraphBuilder::set_ints(lc.node, "strides", {pick(rng, 1, 3), pick(rng, 1, 3)});
    testing::GraphBuilder::set_ints(
        lc.node, "pads", {pick(rng, 0, kh - 1), pick(rng, 0, kw - 1), pick(rng, 0, kh - 1), pick(rng, 0, kw - 1)});
    if (rng() % 3 == 0) testing::GraphBuilder::set_int(lc.node, "ceil_mode", 1);
    if (op == "AveragePool" && rng() % 2) testing::GraphBuilder::set_int(lc.node, "count_include_pad", 1);
  }
  lc.inputs = {ops::nchw_to_nhwc(testing::random_tensor({n, c, h, w}, seed)).value()};
  lc.constant = {false};
  return lc;
}

std::string case_str(const LayerCase& lc) {
  std::string s = lc.node.op_type + " x " + dims_str(lc.inputs[0].shape());
  if (lc.inputs.size() > 1 && lc.inputs[1].defined()) s += " w " + dims_str(lc.inputs[1].shape());
  for (const char* a : {"kernel_shape", "strides", "dilations", "pads"})
    if (lc.node.attr(a)) s += std::string(" ") + a + " " + dims_str(lc.node.attr_ints(a, {}));
  for (const char* a : {"group", "ceil_mode", "count_include_pad"})
    if (lc.node.attr(a)) s += std::string(" ") + a + " " + std::to_string(lc.node.attr_int(a, 0));
  s += " " + lc.node.attr_string("pool", "") + " " + lc.node.attr_string("activation", "");
  return s;
}

// Runs the tactic on `lc` with `ins` as given and returns its first output (undefined when it
// declines or fails to prepare; a failure other than a declined reference kernel is reported).
Tensor run_tactic(const backends::Tactic& tactic, const LayerCase& lc, DataType compute, DataType out_dtype, int iter) {
  backends::LayerSignature sig = testing::layer_signature(lc);
  sig.compute = compute;
  if (!backends::why_declined(tactic, sig).empty()) return Tensor();
  auto prepared = tactic.prepare(sig);
  if (!prepared.ok() && prepared.status().message().find("only its reference kernel") != std::string::npos)
    return Tensor();
  EXPECT_TRUE(prepared.ok()) << tactic.name() << " case " << iter << ": " << prepared.status().to_string();
  if (!prepared.ok()) return Tensor();
  Tensor got(out_dtype, prepared.value()->output_shapes()[0]);
  std::vector<const Tensor*> ins;
  for (size_t i = 0; i < lc.node.inputs.size(); ++i)
    ins.push_back(lc.node.inputs[i].empty() || !lc.inputs[i].defined() ? nullptr : &lc.inputs[i]);
  std::vector<Tensor*> outs{&got};
  Status st = prepared.value()->run_standalone(ins, outs);
  EXPECT_TRUE(st.ok()) << tactic.name() << " case " << iter << ": " << st.to_string();
  return got;
}

// A tactic on bfloat16 storage (X, W, B, the residual and Y bf16) against the reference kernel run in
// float32 on the same bf16 values: what is left is the float32 accumulation (K * 2^-24 * S, as above)
// and the rounding of the output to bf16 (at most 2^-9 of it), bounded here by 2^-8 |y|, plus the
// float32 epilogue tolerance. Returns false when the tactic declines the case.
bool check_bf16_storage(const backends::Tactic& tactic, const LayerCase& lc, int iter) {
  LayerCase bf = lc, rounded = lc;
  for (size_t i = 0; i < lc.inputs.size(); ++i) {
    if (!lc.inputs[i].defined()) continue;
    bf.inputs[i] = lc.inputs[i].cast(DataType::kBFloat16).value();
    rounded.inputs[i] = bf.inputs[i].cast(DataType::kFloat32).value();
  }
  std::vector<Tensor> want = testing::reference_outputs(rounded);
  if (want.empty()) return false;
  Tensor got16 = run_tactic(tactic, bf, DataType::kBFloat16, DataType::kBFloat16, iter);
  if (!got16.defined()) return false;
  EXPECT_EQ(got16.shape(), want[0].shape()) << tactic.name() << " case " << iter << ": " << case_str(lc);
  if (got16.shape() != want[0].shape()) return true;
  const bool pool = lc.node.op_type == "NhwcPool";
  Tensor sums = pool ? Tensor() : abs_product_sums(rounded);
  const double k = pool ? 0.0 : static_cast<double>(reduction_length(lc));
  Tensor got = got16.cast(DataType::kFloat32).value();
  int bad = 0;
  for (int64_t i = 0; i < want[0].numel(); ++i) {
    const double w = want[0].data<float>()[i], g = got.data<float>()[i];
    const double acc = pool ? 0.0 : 1.5 * k * std::ldexp(1.0, -24) * sums.data<float>()[i];
    const double tol = std::ldexp(1.0, -8) * std::fabs(w) + acc + 1e-4 * std::max(1.0, std::fabs(w)) * (pool ? 0 : 1);
    if (!(std::fabs(w - g) <= tol) && bad++ < 3)
      ADD_FAILURE() << tactic.name() << " case " << iter << " element " << i << ": want " << w << ", got " << g
                    << " (tolerance " << tol << "): " << case_str(lc);
  }
  EXPECT_EQ(bad, 0) << tactic.name() << " case " << iter << ": " << case_str(lc);
  return true;
}

bool has_amx_cpu() { return (host_isa() & kIsaAmx) != 0; }

TEST(Bf16Tactics, ChannelsLastBf16StorageMatchesTheReference) {
  if (!has_amx_cpu()) GTEST_SKIP() << "this CPU lacks AMX: the channels-last BF16 tactics decline every layer";
  const backends::Tactic* conv = backends::find_tactic("conv2d_onednn_nhwc_bf16");
  const backends::Tactic* pool = backends::find_tactic("pool2d_onednn_nhwc_bf16");
  const backends::Tactic* mm = backends::find_tactic("matmul_onednn_bf16_io");
  if (!conv || !pool || !mm) GTEST_SKIP() << "built without oneDNN";
  std::mt19937 rng(4048);
  int convs = 0, pools = 0, mms = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const uint64_t seed = 40000 + 10 * static_cast<uint64_t>(iter);
    const int family = iter % 4;
    LayerCase lc = family == 0   ? nhwc_conv_case(rng, seed)
                   : family == 1 ? nhwc_pool_case(rng, seed)
                   : family == 2 ? matmul_case(rng, seed)
                                 : gemm_case(rng, seed);
    if (family == 0) convs += check_bf16_storage(*conv, lc, iter);
    if (family == 1) pools += check_bf16_storage(*pool, lc, iter);
    if (family >= 2) mms += check_bf16_storage(*mm, lc, iter);
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(convs, 60);  // of 100
  EXPECT_GT(pools, 60);  // of 100: averages counting padding past the declared one (ceil_mode) are declined
  EXPECT_GT(mms, 100);   // of 200: Gemm with transA or a C that is not per-column is declined
}

// The float32 channels-last tactics (layers of a channels-last graph kept float32) against the
// reference, with tactic_test.cc's float32 tolerance.
TEST(NhwcTactics, Float32ConvAndPoolMatchTheReference) {
  const backends::Tactic* conv = backends::find_tactic("conv2d_onednn_nhwc");
  const backends::Tactic* pool = backends::find_tactic("pool2d_onednn_nhwc");
  if (!conv || !pool) GTEST_SKIP() << "built without oneDNN";
  std::mt19937 rng(8080);
  int convs = 0, pools = 0;
  for (int iter = 0; iter < 200; ++iter) {
    const uint64_t seed = 80000 + 10 * static_cast<uint64_t>(iter);
    const bool is_conv = iter % 2 == 0;
    LayerCase lc = is_conv ? nhwc_conv_case(rng, seed) : nhwc_pool_case(rng, seed);
    std::vector<Tensor> want = testing::reference_outputs(lc);
    if (want.empty()) continue;
    Tensor got = run_tactic(is_conv ? *conv : *pool, lc, DataType::kFloat32, DataType::kFloat32, iter);
    if (!got.defined()) continue;
    (is_conv ? convs : pools)++;
    ASSERT_EQ(got.shape(), want[0].shape()) << case_str(lc);
    int bad = 0;
    for (int64_t i = 0; i < want[0].numel(); ++i) {
      const double w = want[0].data<float>()[i], g = got.data<float>()[i];
      if (!(std::fabs(w - g) <= 1e-4 * std::max(1.0, std::fabs(w))) && bad++ < 3)
        ADD_FAILURE() << "case " << iter << " element " << i << ": want " << w << ", got " << g << ": " << case_str(lc);
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(convs, 80);  // of 100
  EXPECT_GT(pools, 60);  // of 100
}

// Where bfloat16 storage meets float32: cast_kiln's bf16 paths equal the reference Cast bit for bit
// (round to nearest even, ties, NaN, infinities, subnormals, odd lengths).
TEST(Bf16Tactics, CastBetweenFloat32AndBf16IsBitExact) {
  const backends::Tactic* cast = backends::find_tactic("cast_kiln");
  ASSERT_NE(cast, nullptr);
  std::mt19937 rng(77);
  for (int iter = 0; iter < 40; ++iter) {
    const bool to_bf16 = iter % 2 == 0;
    const int64_t n = pick(rng, 1, 5000);
    Tensor x(to_bf16 ? DataType::kFloat32 : DataType::kBFloat16, {n});
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits = static_cast<uint32_t>(rng());
      if (i % 7 == 0) bits = (bits & 0xffff0000u) | 0x8000u;        // a tie
      if (i % 101 == 0) bits = 0x7f800000u | (bits & 0x80000000u);  // +-Inf
      if (i % 103 == 0) bits = 0x7fc00001u;                         // NaN
      if (to_bf16) {
        float f;
        std::memcpy(&f, &bits, 4);
        x.data<float>()[i] = f;
      } else {
        static_cast<uint16_t*>(x.raw())[i] = static_cast<uint16_t>(bits >> 16);
      }
    }
    LayerCase lc;
    lc.node = make_node("", "Cast", 1);
    testing::GraphBuilder::set_int(lc.node, "to",
                                   static_cast<int64_t>(to_bf16 ? DataType::kBFloat16 : DataType::kFloat32));
    lc.inputs = {x};
    lc.constant = {false};
    Tensor want = testing::reference_output(lc);
    ASSERT_TRUE(want.defined());
    Tensor got = run_tactic(*cast, lc, DataType::kUndefined, want.dtype(), iter);
    ASSERT_TRUE(got.defined()) << "cast_kiln declines " << dtype_name(x.dtype()) << " -> " << dtype_name(want.dtype());
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), static_cast<size_t>(n) * dtype_size(want.dtype())), 0)
        << "case " << iter << ": " << dtype_name(x.dtype()) << " -> " << dtype_name(want.dtype());
  }
}

}  // namespace
}  // namespace kiln
