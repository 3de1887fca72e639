// kiln's Winograd F(4x4, 3x3) convolution (conv2d_winograd_f4x3_nchw16c, winograd_nchwc.cc) against
// the reference kernel on every instruction-set path: dilated layers (each residue class tiled on its
// own: dilations 1-4 per axis, pads up to 2 x dilation, odd sizes so that classes of unequal size and
// partial tiles occur), and the chunked order that layers with large transformed weights take
// (forced here on small layers through the test hooks, with chunks of a few tiles so that several
// chunks and partial ones run), with bias, residual and epilogues.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backends/cpu/nchwc_tactics.h"
#include "backends/cpu/test_hooks.h"
#include "core/target.h"
#include "layer_case.h"
#include "ops/kiln_layout.h"

namespace kiln {
namespace {

using testing::LayerCase;
using testing::make_node;
using testing::pick;

Tensor blocked16(const Tensor& t) { return ops::to_channel_blocked(t, 16).value(); }

// A kiln.BlockedConv (block 16) the Winograd tactic takes: 3x3, stride 1, channels multiples of 16,
// dilations 1-4 (one axis at a time or both), pads 0 .. 2 x dilation per side, blocked X and residual.
LayerCase dilated_case(std::mt19937& rng, uint64_t seed) {
  const int64_t n = pick(rng, 1, 2), c = 16 * pick(rng, 1, 3), m = 16 * pick(rng, 1, 5);
  const int64_t dh = pick(rng, 1, 4), dw = rng() % 3 == 0 ? dh : pick(rng, 1, 4);
  const int64_t h = pick(rng, 2 * dh + 1, 2 * dh + 23), w = pick(rng, 2 * dw + 1, 2 * dw + 21);
  const bool bias = rng() % 2, residual = rng() % 2;
  LayerCase lc;
  lc.node = make_node("kiln", "BlockedConv", residual ? 4 : (bias ? 3 : 2));
  if (residual && !bias) lc.node.inputs[2] = "";
  testing::GraphBuilder::set_int(lc.node, "block", 16);
  testing::GraphBuilder::set_ints(lc.node, "dilations", {dh, dw});
  if (rng() % 2) {
    testing::GraphBuilder::set_ints(lc.node, "pads", {dh, dw, dh, dw});  // "same": DeepLab's and FCN's
  } else {
    testing::GraphBuilder::set_ints(
        lc.node, "pads", {pick(rng, 0, 2 * dh), pick(rng, 0, 2 * dw), pick(rng, 0, 2 * dh), pick(rng, 0, 2 * dw)});
  }
  testing::add_epilogue(rng, lc.node);
  testing::add_conv_inputs(lc, seed, {n, c, h, w}, {m, c, 3, 3}, bias, residual);
  lc.inputs[0] = blocked16(lc.inputs[0]);
  if (residual) lc.inputs[3] = blocked16(lc.inputs[3]);
  return lc;
}

// Runs the tactic on `cases` layers against the reference kernel on `isa`; returns how many it took.
int check(const std::string& isa, int cases, uint32_t seed) {
  const backends::Tactic* tactic = backends::cpu::conv2d_winograd_f4x3_nchw16c();
  std::mt19937 rng(seed);
  int checked = 0;
  for (int iter = 0; iter < cases; ++iter) {
    LayerCase lc = dilated_case(rng, seed + 10 * iter);
    backends::LayerSignature sig = testing::layer_signature(lc);
    EXPECT_TRUE(parse_isa_level(isa == "scalar" ? "portable" : isa, &sig.isa)) << isa;
    Tensor want = testing::reference_output(lc);
    if (!want.defined()) continue;  // a geometry the op rejects (no output rows)
    EXPECT_EQ(tactic->why_unsupported(sig), "") << "case " << iter;
    auto prepared = tactic->prepare(sig);
    EXPECT_TRUE(prepared.ok()) << "case " << iter << ": " << prepared.status().to_string();
    if (!prepared.ok()) continue;
    EXPECT_EQ(prepared.value()->output_shapes()[0], want.shape()) << "case " << iter;
    Tensor got(DataType::kFloat32, want.shape());
    std::vector<const Tensor*> ins;
    for (size_t i = 0; i < lc.node.inputs.size(); ++i)
      ins.push_back(lc.node.inputs[i].empty() || !lc.inputs[i].defined() ? nullptr : &lc.inputs[i]);
    Status st = prepared.value()->run_standalone(ins, {&got});
    EXPECT_TRUE(st.ok()) << st.to_string();
    int bad = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      const float wv = want.data<float>()[i], gv = got.data<float>()[i];
      if (!(std::fabs(wv - gv) <= 1e-4f * std::max(1.f, std::fabs(wv))) && bad++ < 3)
        ADD_FAILURE() << "case " << iter << " element " << i << ": want " << wv << ", got " << gv;
    }
    EXPECT_EQ(bad, 0) << "case " << iter << " [" << isa << "] x " << dims_str(lc.inputs[0].shape()) << " dilations "
                      << dims_str(lc.node.attr_ints("dilations")) << " pads " << dims_str(lc.node.attr_ints("pads"));
    ++checked;
  }
  return checked;
}

std::vector<std::string> isas() {
  std::vector<std::string> v = {"scalar"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) v.push_back("avx2");
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    v.push_back("avx512");
  return v;
}

TEST(Winograd, DilatedLayersMatchTheReferenceKernel) {
  for (const std::string& isa : isas()) EXPECT_GT(check(isa, 40, 61), 30) << isa;
}

TEST(Winograd, ChunkedOrderMatchesTheReferenceKernel) {
  auto& hooks = backends::cpu::kernel_test_hooks();
  for (const std::string& isa : isas()) {
    hooks.winograd_chunked_bytes = 0;                               // every layer's weights count as large
    hooks.winograd_chunk_tiles = static_cast<int64_t>(isa.size());  // 3, 4, 6 tiles a chunk
    EXPECT_GT(check(isa, 30, 73), 20) << isa;
    hooks.winograd_chunk_tiles = -1;  // one chunk (up to 96 tiles)
    EXPECT_GT(check(isa, 10, 79), 6) << isa;
  }
  hooks = {};
}

// The tactic takes dilated layers and the large ones (transformed weights past 16 MB), which it once
// left to oneDNN; strides other than 1 it still declines, saying so.
TEST(Winograd, TakesDilatedAndLargeLayersDeclinesStrides) {
  LayerCase lc;
  lc.node = make_node("kiln", "BlockedConv", 2);
  testing::GraphBuilder::set_int(lc.node, "block", 16);
  testing::GraphBuilder::set_ints(lc.node, "dilations", {4, 4});
  testing::GraphBuilder::set_ints(lc.node, "pads", {4, 4, 4, 4});
  lc.inputs = {Tensor(DataType::kFloat32, {1, 32, 28, 28, 16}), Tensor(DataType::kFloat32, {512, 512, 3, 3})};
  lc.constant = {false, true};
  const backends::Tactic* tactic = backends::cpu::conv2d_winograd_f4x3_nchw16c();
  EXPECT_EQ(tactic->why_unsupported(testing::layer_signature(lc)), "");
  testing::GraphBuilder::set_ints(lc.node, "strides", {2, 2});
  EXPECT_EQ(tactic->why_unsupported(testing::layer_signature(lc)), "stride is not 1");
}

}  // namespace
}  // namespace kiln
