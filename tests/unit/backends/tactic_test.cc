// Every tactic of the variant list (backends::all_tactics) against the reference kernel, on random
// layers it claims to support: odd sizes, non-multiples of the vector width, groups, depthwise,
// strides/pads/dilations, 1x1, transposes, every epilogue.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "../graph_builder.h"
#include "backends/cpu/xformer_tactics.h"
#include "backends/device_runtime.h"
#include "backends/registry.h"
#include "layer_case.h"
#include "longtail_cases.h"
#include "ops/interpreter.h"
#include "ops/kiln_layout.h"

namespace kiln {
namespace {

using testing::add_epilogue;
using testing::LayerCase;
using testing::make_node;
using testing::pick;
using testing::set_string;

// A random Conv / kiln.FusedConv: plain, depthwise or grouped; strides, dilations, pads or auto_pad; 1x1.
LayerCase conv_case(std::mt19937& rng, uint64_t seed) {
  bool fused = rng() % 2;
  int64_t n = pick(rng, 1, 2), c, m, group;
  switch (rng() % 3) {
    case 0: group = 1, c = pick(rng, 1, 19), m = pick(rng, 1, 21); break;
    case 1: group = c = m = pick(rng, 1, 24); break;  // depthwise
    default: group = pick(rng, 2, 3), c = group * pick(rng, 1, 5), m = group * pick(rng, 1, 6); break;
  }
  int64_t kh = rng() % 3 == 0 ? 1 : pick(rng, 1, 5), kw = rng() % 3 == 0 ? kh : pick(rng, 1, 4);
  int64_t sh = pick(rng, 1, 3), sw = pick(rng, 1, 2), dh = pick(rng, 1, 2), dw = rng() % 4 ? 1 : 2;
  std::vector<int64_t> pads = {pick(rng, 0, 2), pick(rng, 0, 1), pick(rng, 0, 2), pick(rng, 0, 2)};
  int64_t h = pick(rng, (kh - 1) * dh + 1, 19), w = pick(rng, (kw - 1) * dw + 1, 23);
  std::string auto_pad = std::vector<std::string>{"NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"}[rng() % 5];
  if (auto_pad != "NOTSET") pads = {0, 0, 0, 0};
  if (group == 1 && rng() % 4 == 0) kh = kw = sh = sw = 1, pads = {0, 0, 0, 0};  // pointwise (1x1 GEMM tactics)
  bool bias = rng() % 2, residual = fused && rng() % 2;
  LayerCase lc;
  lc.node = make_node(fused ? "kiln" : "", fused ? "FusedConv" : "Conv", residual ? 4 : (bias ? 3 : 2));
  if (residual && !bias) lc.node.inputs[2] = "";
  auto& nd = lc.node;
  testing::GraphBuilder::set_int(nd, "group", group);
  testing::GraphBuilder::set_ints(nd, "strides", {sh, sw});
  testing::GraphBuilder::set_ints(nd, "dilations", {dh, dw});
  if (auto_pad == "NOTSET")
    testing::GraphBuilder::set_ints(nd, "pads", pads);
  else
    set_string(nd, "auto_pad", auto_pad);
  if (rng() % 2) testing::GraphBuilder::set_ints(nd, "kernel_shape", {kh, kw});
  if (fused) add_epilogue(rng, nd);
  testing::add_conv_inputs(lc, seed, {n, c, h, w}, {m, c / group, kh, kw}, bias, residual);
  return lc;
}

LayerCase matmul_case(std::mt19937& rng, uint64_t seed) {
  bool fused = rng() % 2, constant_b = rng() % 2;
  int64_t rank = pick(rng, 2, 4), m = pick(rng, 1, 37), k = pick(rng, 1, 70), n = pick(rng, 1, 45);
  Dims a(static_cast<size_t>(rank)), b;
  for (int64_t i = 0; i + 2 < rank; ++i) a[i] = pick(rng, 1, 3);
  a[rank - 2] = m, a[rank - 1] = k;
  if (constant_b && rng() % 3) {
    b = {k, n};
  } else {
    b = a;
    b[rank - 2] = k, b[rank - 1] = n;
    if (rng() % 2) {  // numpy batch broadcasting: dims of 1 on either side, fewer dims on either side
      for (int64_t i = 0; i + 2 < rank; ++i)
        if (rng() % 2) (rng() % 2 ? a : b)[static_cast<size_t>(i)] = 1;
      if (rng() % 3 == 0) b.erase(b.begin(), b.begin() + static_cast<int64_t>(rng() % (b.size() - 1)));
      if (rng() % 4 == 0) a.erase(a.begin(), a.begin() + static_cast<int64_t>(rng() % (a.size() - 1)));
      if (rng() % 4 == 0) b.insert(b.begin(), pick(rng, 1, 3));  // B of higher rank than A
    }
  }
  bool bias = fused && rng() % 2, residual = fused && rng() % 2;
  LayerCase lc;
  lc.node = make_node(fused ? "kiln" : "", fused ? "FusedMatMul" : "MatMul", residual ? 4 : (bias ? 3 : 2));
  if (residual && !bias) lc.node.inputs[2] = "";
  if (fused) add_epilogue(rng, lc.node);
  lc.inputs = {testing::random_tensor(a, seed), testing::random_tensor(b, seed + 1),
               bias ? testing::random_tensor(rng() % 2 ? Dims{n} : Dims{1, n}, seed + 2) : Tensor()};
  lc.constant = {false, constant_b, true, false};
  if (residual) {
    Dims y;
    backends::cpu::xf_broadcast(Dims(a.begin(), a.end() - 2), b.size() > 2 ? Dims(b.begin(), b.end() - 2) : Dims{}, &y);
    y.insert(y.end(), {a[a.size() - 2], n});
    lc.inputs.push_back(testing::random_tensor(y, seed + 3));
  }
  return lc;
}

LayerCase gemm_case(std::mt19937& rng, uint64_t seed) {
  bool fused = rng() % 2, ta = rng() % 2, tb = rng() % 2;
  int64_t m = pick(rng, 1, 33), k = pick(rng, 1, 67), n = pick(rng, 1, 41);
  std::vector<Dims> c_shapes = {{}, {n}, {1, n}, {m, n}, {m, 1}, {1}};
  int which = static_cast<int>(rng() % 7);  // 6: no C
  bool residual = fused && rng() % 2;
  LayerCase lc;
  lc.node = make_node(fused ? "kiln" : "", fused ? "FusedGemm" : "Gemm", residual ? 4 : (which < 6 ? 3 : 2));
  if (residual && which == 6) lc.node.inputs[2] = "";
  auto& nd = lc.node;
  testing::GraphBuilder::set_int(nd, "transA", ta);
  testing::GraphBuilder::set_int(nd, "transB", tb);
  if (rng() % 2) testing::GraphBuilder::set_float(nd, "alpha", 0.75f);
  if (rng() % 2) testing::GraphBuilder::set_float(nd, "beta", 1.5f);
  if (fused) add_epilogue(rng, nd);
  lc.inputs = {testing::random_tensor(ta ? Dims{k, m} : Dims{m, k}, seed),
               testing::random_tensor(tb ? Dims{n, k} : Dims{k, n}, seed + 1),
               which < 6 ? testing::random_tensor(c_shapes[which], seed + 2) : Tensor()};
  lc.constant = {false, true, true, false};
  if (residual) lc.inputs.push_back(testing::random_tensor({m, n}, seed + 3));
  return lc;
}

LayerCase pool_case(std::mt19937& rng, uint64_t seed) {
  static const char* kOps[] = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"};
  std::string op = kOps[rng() % 4];
  LayerCase lc;
  lc.node = make_node("", op, 1);
  lc.node.opset = op == "AveragePool" ? 19 : 12;
  int64_t kh = pick(rng, 1, 4), kw = pick(rng, 1, 3), dh = rng() % 3 ? 1 : 2, dw = 1;
  int64_t h = pick(rng, (kh - 1) * dh + 1, 21), w = pick(rng, kw, 19);
  if (op == "MaxPool" || op == "AveragePool") {
    auto& nd = lc.node;
    testing::GraphBuilder::set_ints(nd, "kernel_shape", {kh, kw});
    testing::GraphBuilder::set_ints(nd, "strides", {pick(rng, 1, 3), pick(rng, 1, 2)});
    if (dh > 1) testing::GraphBuilder::set_ints(nd, "dilations", {dh, dw});
    if (rng() % 3 == 0)
      set_string(nd, "auto_pad", rng() % 2 ? "SAME_UPPER" : "SAME_LOWER");
    else
      testing::GraphBuilder::set_ints(
          nd, "pads", {pick(rng, 0, kh - 1), pick(rng, 0, kw - 1), pick(rng, 0, kh - 1), pick(rng, 0, kw - 1)});
    if (op == "AveragePool") testing::GraphBuilder::set_int(nd, "count_include_pad", rng() % 2);
  }
  lc.inputs = {testing::random_tensor({pick(rng, 1, 2), pick(rng, 1, 19), h, w}, seed)};
  lc.constant = {false};
  return lc;
}

// The channel-blocked ops of the layout pass (ops/kiln_layout.h): kiln.BlockedConv (group 1 or
// depthwise, X blocked or plain, blocked residual; a third of them Winograd-shaped: 3x3, stride 1,
// channels multiples of 16), kiln.BlockedPool, kiln.ReorderToBlocked / ReorderFromBlocked. Blocks of
// 16 and 8; channel counts that are not multiples of either; every activation, so the zero padding
// lanes of the outputs are checked with epilogues where f(0) != 0 (Sigmoid, Clip with min > 0...).
Tensor blocked(const Tensor& t, int64_t block) { return ops::to_channel_blocked(t, block).value(); }

void to_blocked_node(ir::Node& n, const std::string& op, int64_t block) {
  n.domain = "kiln";
  n.op_type = op;
  n.opset = 1;
  testing::GraphBuilder::set_int(n, "block", block);
}

LayerCase winograd_conv_case(std::mt19937& rng, uint64_t seed) {
  // up to 80 output channels: two 64-channel column blocks for kiln's Winograd (its threads split them)
  int64_t n = pick(rng, 1, 2), c = 16 * pick(rng, 1, 3), m = 16 * pick(rng, 1, 5);
  int64_t h = pick(rng, 3, 17), w = pick(rng, 3, 19), p = pick(rng, 0, 1);
  bool bias = rng() % 2, residual = rng() % 2;
  LayerCase lc;
  lc.node = make_node("kiln", "FusedConv", residual ? 4 : (bias ? 3 : 2));
  if (residual && !bias) lc.node.inputs[2] = "";
  testing::GraphBuilder::set_ints(lc.node, "pads", {p, p, p, p});
  if (rng() % 2) testing::GraphBuilder::set_ints(lc.node, "kernel_shape", {3, 3});
  if (rng() % 4 == 0)  // oneDNN's Winograd has ReLU as its only activation; the others go direct
    add_epilogue(rng, lc.node);
  else if (rng() % 2)
    set_string(lc.node, "activation", "Relu");
  lc.inputs = {testing::random_tensor({n, c, h, w}, seed), testing::random_tensor({m, c, 3, 3}, seed + 1),
               bias ? testing::random_tensor({m}, seed + 2) : Tensor()};
  lc.constant = {false, true, true, false};
  if (residual) lc.inputs.push_back(testing::random_tensor({n, m, h + 2 * p - 2, w + 2 * p - 2}, seed + 3));
  return lc;
}

// kiln.BlockedConvDw: 1x1 conv (C -> M) into a 3x3 depthwise conv (stride 1 or 2, pads 1) of its M
// channels, each with its own bias and activation (the depthwise one's attributes prefixed "dw.").
LayerCase conv_dw_case(std::mt19937& rng, uint64_t seed, int64_t block) {
  int64_t n = pick(rng, 1, 2), c = pick(rng, 1, 40), m = rng() % 2 ? 16 * pick(rng, 1, 4) : pick(rng, 1, 40);
  int64_t h = pick(rng, 1, 15), w = pick(rng, 1, 17), s = pick(rng, 1, 2);
  bool b1 = rng() % 2, b2 = rng() % 2;
  LayerCase lc;
  lc.node = make_node("kiln", "BlockedConvDw", b2 ? 5 : 4);
  if (!b1) lc.node.inputs[2] = "";
  auto& nd = lc.node;
  testing::GraphBuilder::set_int(nd, "block", block);
  if (rng() % 2) testing::GraphBuilder::set_ints(nd, "kernel_shape", {1, 1});
  add_epilogue(rng, nd);
  ir::Node dw = make_node("kiln", "FusedConv", 2);
  testing::GraphBuilder::set_int(dw, "group", m);
  testing::GraphBuilder::set_ints(dw, "strides", {s, s});
  testing::GraphBuilder::set_ints(dw, "pads", {1, 1, 1, 1});
  add_epilogue(rng, dw);
  for (const auto& [k, a] : dw.attrs) nd.attrs["dw." + k] = a;
  lc.inputs = {blocked(testing::random_tensor({n, c, h, w}, seed), block),
               testing::random_tensor({m, c, 1, 1}, seed + 1), b1 ? testing::random_tensor({m}, seed + 2) : Tensor(),
               testing::random_tensor({m, 1, 3, 3}, seed + 3)};
  if (b2) lc.inputs.push_back(testing::random_tensor({m}, seed + 4));
  lc.constant = {false, true, true, true, true};
  return lc;
}

// A kiln.BlockedConv grouped into whole blocks (ResNeXt's later stages): 2-4 groups of 1-2 blocks in
// and out, 3x3 or 1x1, stride 1 or 2, with an epilogue and maybe a (blocked) residual; X plain in
// a quarter of them.
LayerCase grouped_blocks_conv_case(std::mt19937& rng, uint64_t seed) {
  const int64_t block = rng() % 2 ? 16 : 8;
  const int64_t group = pick(rng, 2, 4), c = group * block * pick(rng, 1, 2), m = group * block * pick(rng, 1, 2);
  const int64_t k = rng() % 3 ? 3 : 1, s = pick(rng, 1, 2), p = k / 2, h = pick(rng, 3, 11), w = pick(rng, 3, 13);
  const bool bias = rng() % 2, residual = rng() % 2;
  LayerCase lc;
  lc.node = make_node("kiln", "FusedConv", residual ? 4 : (bias ? 3 : 2));
  if (residual && !bias) lc.node.inputs[2] = "";
  testing::GraphBuilder::set_int(lc.node, "group", group);
  testing::GraphBuilder::set_ints(lc.node, "strides", {s, s});
  testing::GraphBuilder::set_ints(lc.node, "pads", {p, p, p, p});
  add_epilogue(rng, lc.node);
  testing::add_conv_inputs(lc, seed, {pick(rng, 1, 2), c, h, w}, {m, c / group, k, k}, bias, residual);
  to_blocked_node(lc.node, "BlockedConv", block);
  if (rng() % 4) lc.inputs[0] = blocked(lc.inputs[0], block);
  if (residual) lc.inputs[3] = blocked(lc.inputs[3], block);
  return lc;
}

LayerCase blocked_case(std::mt19937& rng, uint64_t seed) {
  int64_t block = rng() % 4 ? 16 : 8;
  const int kind = static_cast<int>(rng() % 12);
  if (kind >= 10) return conv_dw_case(rng, seed, block);
  LayerCase lc;
  if (kind < 6) {  // BlockedConv
    bool winograd = rng() % 3 == 0;
    if (winograd) {
      lc = winograd_conv_case(rng, seed);
      block = 16;
    } else {
      do {  // group 1 or depthwise: the blocked kernels' cases
        lc = conv_case(rng, seed);
      } while (lc.node.attr_int("group", 1) != 1 && lc.node.attr_int("group", 1) != lc.inputs[0].dim(1));
    }
    to_blocked_node(lc.node, "BlockedConv", block);
    // X stays plain NCHW in a quarter of the cases (a network's first conv).
    if (winograd || rng() % 4) lc.inputs[0] = blocked(lc.inputs[0], block);
    if (lc.inputs.size() > 3 && lc.inputs[3].defined()) lc.inputs[3] = blocked(lc.inputs[3], block);
  } else if (kind < 8) {  // BlockedPool
    lc = pool_case(rng, seed);
    std::string op = lc.node.op_type;
    int opset = lc.node.opset;
    to_blocked_node(lc.node, "BlockedPool", block);
    set_string(lc.node, "pool", op);
    testing::GraphBuilder::set_int(lc.node, "pool_opset", opset);
    lc.inputs[0] = blocked(lc.inputs[0], block);
  } else {  // reorders
    int64_t c = pick(rng, 1, 40);
    Tensor x = testing::random_tensor({pick(rng, 1, 2), c, pick(rng, 1, 9), pick(rng, 1, 11)}, seed);
    bool to = kind == 8;
    lc.node = make_node("kiln", to ? "ReorderToBlocked" : "ReorderFromBlocked", 1);
    testing::GraphBuilder::set_int(lc.node, "block", block);
    if (!to) testing::GraphBuilder::set_int(lc.node, "channels", c);
    lc.inputs = {to ? x : blocked(x, block)};
    lc.constant = {false};
  }
  return lc;
}

// The Concat layout_blocked keeps blocked: 1-4 channel-blocked values [N, Cb_i, H, W, B] along axis
// 1 (or -4), some of one block, some empty of blocks.
LayerCase blocked_concat_case(std::mt19937& rng, uint64_t seed) {
  const int64_t n = pick(rng, 1, 3), h = pick(rng, 1, 9), w = pick(rng, 1, 11), b = rng() % 2 ? 16 : 8;
  const size_t k = static_cast<size_t>(pick(rng, 1, 4));
  LayerCase lc;
  lc.node = make_node("", "Concat", k);
  lc.node.opset = 13;
  testing::GraphBuilder::set_int(lc.node, "axis", rng() % 2 ? 1 : -4);
  for (size_t i = 0; i < k; ++i) {
    lc.inputs.push_back(testing::random_tensor({n, pick(rng, i == 0 ? 1 : 0, 5), h, w, b}, seed + i));
    lc.constant.push_back(false);
  }
  return lc;
}

// The squeeze-excite pieces of the mobile CNNs: the channel scale on blocked values, Mul of a map
// [N, Cb, H, W, B] and its scale [N, Cb, 1, 1, B] in either order; and kiln.FusedConv /
// kiln.BlockedConv with a HardSigmoid epilogue (the gate of opset < 14 exports, made by
// fuse_hard_activations), odd channel counts, batch 1 and more.
LayerCase squeeze_excite_case(std::mt19937& rng, uint64_t seed) {
  const int kind = static_cast<int>(rng() % 3);
  LayerCase lc;
  if (kind == 0) {
    const int64_t n = pick(rng, 1, 3), cb = pick(rng, 1, 5), h = pick(rng, 1, 13), w = pick(rng, 1, 11);
    const int64_t b = rng() % 2 ? 16 : 8;
    lc.node = make_node("", "Mul", 2);
    Tensor x = testing::random_tensor({n, cb, h, w, b}, seed), sc = testing::random_tensor({n, cb, 1, 1, b}, seed + 1);
    lc.inputs = rng() % 2 ? std::vector<Tensor>{x, sc} : std::vector<Tensor>{sc, x};
    lc.constant = {false, false};
    return lc;
  }
  const int64_t n = pick(rng, 1, 2), c = pick(rng, 1, 40), m = pick(rng, 1, 40), h = pick(rng, 1, 9),
                w = pick(rng, 1, 9);
  const int64_t k = rng() % 2 ? 1 : 3;
  const bool bias = rng() % 2, residual = rng() % 2;
  lc.node = make_node("kiln", "FusedConv", residual ? 4 : (bias ? 3 : 2));
  if (residual && !bias) lc.node.inputs[2] = "";
  testing::GraphBuilder::set_ints(lc.node, "pads", {k / 2, k / 2, k / 2, k / 2});
  set_string(lc.node, "activation", "HardSigmoid");
  testing::set_float(lc.node, "activation_alpha", rng() % 2 ? 1.f / 6.f : 0.2f);
  if (rng() % 2) testing::set_float(lc.node, "activation_beta", 0.4f);
  testing::add_conv_inputs(lc, seed, {n, c, h, w}, {m, c, k, k}, bias, residual);
  if (kind == 2) {
    const int64_t block = rng() % 2 ? 16 : 8;
    to_blocked_node(lc.node, "BlockedConv", block);
    if (rng() % 4) lc.inputs[0] = blocked(lc.inputs[0], block);
    if (residual) lc.inputs[3] = blocked(lc.inputs[3], block);
  }
  return lc;
}

// ---- convolution and pooling of every rank (each case in the range some tactic must take) ----

// A Conv / kiln.FusedConv over 1, 2 or 3 spatial dims (a third of them 1-D with many channels,
// Whisper-like), or a ConvTranspose over 1 to 3: groups, depthwise, strides, dilations, asymmetric
// pads (smaller than the dilated kernel) or auto_pad, ConvTranspose's output_padding or output_shape.
LayerCase conv_nd_case(std::mt19937& rng, uint64_t seed) {
  const bool transpose = rng() % 3 == 0;
  static const int64_t kRanks[] = {1, 1, 2, 3};
  const size_t rank = static_cast<size_t>(transpose ? pick(rng, 1, 3) : kRanks[rng() % 4]);
  const bool fused = !transpose && rng() % 2;
  int64_t n = pick(rng, 1, 2), group = 1, cg = 1, mg = 1;
  switch (rng() % 4) {
    case 0: group = pick(rng, 2, 3), cg = pick(rng, 1, 4), mg = pick(rng, 1, 5); break;
    case 1: group = pick(rng, 1, 12); break;  // depthwise
    default: cg = pick(rng, 1, rank == 1 ? 40 : 13), mg = pick(rng, 1, rank == 1 ? 37 : 17); break;
  }
  Dims x{n, group * cg}, w = transpose ? Dims{group * cg, mg} : Dims{group * mg, cg};
  Dims ks, st, dl, pads_b, pads_e, out_pad, out_shape;
  const int64_t max_in = rank == 3 ? 7 : rank == 2 ? 13 : 41;
  std::string auto_pad = "NOTSET";
  const int ap = static_cast<int>(rng() % 6);
  if (ap == 1) auto_pad = "VALID";
  if (ap == 2) auto_pad = rng() % 2 ? "SAME_UPPER" : "SAME_LOWER";
  const bool with_out_shape = transpose && ap == 3;
  for (size_t d = 0; d < rank; ++d) {
    int64_t k = pick(rng, 1, rank == 3 ? 3 : 5), s = pick(rng, 1, rank == 3 ? 2 : 3), dil = rng() % 4 ? 1 : 2;
    const int64_t ext = (k - 1) * dil + 1;
    if (transpose && auto_pad.rfind("SAME", 0) == 0) s = std::min(s, ext);  // else bias-only outputs
    const int64_t in = pick(rng, transpose ? 1 : ext, std::max(ext, max_in));
    const int64_t pb = pick(rng, 0, std::min<int64_t>(ext - 1, 2));
    int64_t pe = pick(rng, 0, std::min<int64_t>(ext - 1, 2));
    if (transpose) pe = std::min(pe, (in - 1) * s + ext - pb - 1);  // an output of at least 1
    // output_padding < max(stride, dilation); past the end pad it leaves bias-only outputs, which
    // the oneDNN tactics take less than a stride deep (as are the output_shape ones below).
    const int64_t op_max = std::min(std::max(s, dil) - 1, (auto_pad == "NOTSET" ? pe : 0) + s - 1);
    const int64_t op = transpose && !with_out_shape && rng() % 3 == 0 ? pick(rng, 0, op_max) : 0;
    ks.push_back(k), st.push_back(s), dl.push_back(dil), pads_b.push_back(pb), pads_e.push_back(pe);
    out_pad.push_back(op);
    out_shape.push_back((in - 1) * s + ext - pick(rng, 1 - s, std::min<int64_t>(ext - 1, 2)));
    x.push_back(in), w.push_back(k);
  }
  const bool bias = rng() % 2, residual = fused && rng() % 2;
  LayerCase lc;
  lc.node = make_node(fused ? "kiln" : "", transpose ? "ConvTranspose" : fused ? "FusedConv" : "Conv", bias ? 3 : 2);
  auto& nd = lc.node;
  testing::GraphBuilder::set_int(nd, "group", group);
  testing::GraphBuilder::set_ints(nd, "strides", st);
  testing::GraphBuilder::set_ints(nd, "dilations", dl);
  if (rng() % 2) testing::GraphBuilder::set_ints(nd, "kernel_shape", ks);
  if (with_out_shape) {
    testing::GraphBuilder::set_ints(nd, "output_shape", out_shape);
  } else if (auto_pad == "NOTSET") {
    Dims pads = pads_b;
    pads.insert(pads.end(), pads_e.begin(), pads_e.end());
    testing::GraphBuilder::set_ints(nd, "pads", pads);
  } else {
    set_string(nd, "auto_pad", auto_pad);
  }
  if (transpose && !with_out_shape && rng() % 2) testing::GraphBuilder::set_ints(nd, "output_padding", out_pad);
  if (fused) add_epilogue(rng, nd);
  lc.inputs = {testing::random_tensor(x, seed), testing::random_tensor(w, seed + 1),
               bias ? testing::random_tensor({transpose ? group * mg : w[0]}, seed + 2) : Tensor()};
  lc.constant = {false, true, true, false};
  if (residual) {  // of the output's shape, as the reference computes it
    Tensor y = testing::reference_output(lc);
    if (y.defined()) {
      nd.inputs = {"in0", "in1", bias ? "in2" : "", "in3"};
      lc.inputs.push_back(testing::random_tensor(y.shape(), seed + 3));
    }
  }
  return lc;
}

// MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool over 1, 2 or 3 spatial dims, or (a
// quarter) a 2-D kiln.BlockedPool: ceil_mode, dilations, asymmetric pads (smaller than the dilated
// window) or auto_pad, count_include_pad.
LayerCase pool_nd_case(std::mt19937& rng, uint64_t seed) {
  static const char* kOps[] = {"MaxPool",     "MaxPool",           "AveragePool",
                               "AveragePool", "GlobalAveragePool", "GlobalMaxPool"};
  const std::string op = kOps[rng() % 6];
  const bool blocked_pool = rng() % 4 == 0;
  const size_t rank = blocked_pool ? 2 : static_cast<size_t>(pick(rng, 1, 3));
  LayerCase lc;
  lc.node = make_node("", op, 1);
  auto& nd = lc.node;
  nd.opset = op == "AveragePool" ? (rng() % 2 ? 19 : 11) : 12;
  const bool dilated = op == "MaxPool" || nd.opset >= 19;
  Dims x{pick(rng, 1, 2), pick(rng, 1, 19)}, ks, st, dl, pads_b, pads_e;
  const bool set_dilations = dilated && rng() % 2;
  for (size_t d = 0; d < rank; ++d) {
    const int64_t k = pick(rng, 1, rank == 3 ? 3 : 4), s = pick(rng, 1, 3);
    const int64_t dil = set_dilations && rng() % 3 == 0 ? 2 : 1;
    const int64_t ext = (k - 1) * dil + 1;
    ks.push_back(k), st.push_back(s), dl.push_back(dil);
    pads_b.push_back(pick(rng, 0, std::min<int64_t>(ext - 1, 2)));
    pads_e.push_back(pick(rng, 0, std::min<int64_t>(ext - 1, 2)));
    x.push_back(pick(rng, ext, std::max<int64_t>(ext, rank == 3 ? 8 : 23)));
  }
  if (op == "MaxPool" || op == "AveragePool") {
    testing::GraphBuilder::set_ints(nd, "kernel_shape", ks);
    testing::GraphBuilder::set_ints(nd, "strides", st);
    if (set_dilations) testing::GraphBuilder::set_ints(nd, "dilations", dl);
    if (rng() % 5 == 0) {
      set_string(nd, "auto_pad", rng() % 2 ? "SAME_UPPER" : "SAME_LOWER");
    } else if (rng() % 4) {
      Dims pads = pads_b;
      pads.insert(pads.end(), pads_e.begin(), pads_e.end());
      testing::GraphBuilder::set_ints(nd, "pads", pads);
    }
    if (rng() % 2) testing::GraphBuilder::set_int(nd, "ceil_mode", 1);
    if (op == "AveragePool") testing::GraphBuilder::set_int(nd, "count_include_pad", rng() % 2);
  }
  lc.inputs = {testing::random_tensor(x, seed)};
  lc.constant = {false};
  if (blocked_pool) {
    const int64_t block = rng() % 2 ? 16 : 8;
    const int opset = nd.opset;
    to_blocked_node(nd, "BlockedPool", block);
    set_string(nd, "pool", op);
    testing::GraphBuilder::set_int(nd, "pool_opset", opset);
    lc.inputs[0] = blocked(lc.inputs[0], block);
  }
  return lc;
}

// ---- transformer ops (kiln's own kernels: every ISA path is run, see the test below) ----

Dims random_dims(std::mt19937& rng, int64_t rank, int64_t hi) {
  Dims d(static_cast<size_t>(rank));
  for (auto& x : d) x = rng() % 5 == 0 ? pick(rng, 17, 3 * hi) : pick(rng, 1, hi);
  return d;
}

LayerCase layer_norm_case(std::mt19937& rng, uint64_t seed) {
  bool kiln_op = rng() % 2;
  int64_t rank = pick(rng, 1, 4);
  Dims x = random_dims(rng, rank, 13);
  if (rng() % 3 == 0) x.back() = pick(rng, 60, 800);
  int64_t axis = pick(rng, -rank, rank - 1), a = axis < 0 ? axis + rank : axis;
  Dims block(x.begin() + a, x.end());
  auto param = [&](uint64_t sd) {
    switch (rng() % 4) {
      case 0: return testing::random_tensor({1}, sd);
      case 1: {
        Dims b = block;
        b.insert(b.begin(), 1);
        return testing::random_tensor(b, sd);
      }
      default: return testing::random_tensor(block, sd);
    }
  };
  bool scale = !kiln_op || rng() % 3, bias = rng() % 3;
  LayerCase lc;
  lc.node = make_node(kiln_op ? "kiln" : "", "LayerNormalization", bias ? 3 : (scale ? 2 : 1));
  if (bias && !scale) lc.node.inputs[1] = "";
  testing::GraphBuilder::set_int(lc.node, "axis", axis);
  if (rng() % 2) testing::GraphBuilder::set_float(lc.node, "epsilon", 1e-3f);
  lc.inputs = {testing::random_tensor(x, seed, DataType::kFloat32, -3, 5), scale ? param(seed + 1) : Tensor(),
               bias ? param(seed + 2) : Tensor()};
  lc.constant = {false, rng() % 2 == 0, rng() % 2 == 0};
  return lc;
}

LayerCase softmax_case(std::mt19937& rng, uint64_t seed) {
  LayerCase lc;
  lc.node = make_node("", rng() % 4 ? "Softmax" : "LogSoftmax", 1);
  lc.node.opset = rng() % 3 ? 13 : 11;
  int64_t rank = pick(rng, 1, 4);
  Dims x = random_dims(rng, rank, 9);
  if (rng() % 3 == 0) x.back() = pick(rng, 60, 300);
  int64_t axis = rng() % 3 ? -1 : pick(rng, -rank, rank - 1);
  if (rng() % 4) testing::GraphBuilder::set_int(lc.node, "axis", axis);
  double shift = rng() % 4 == 0 ? 3000 : 0;  // large logits: x - max must not round at their scale
  lc.inputs = {testing::random_tensor(x, seed, DataType::kFloat32, shift - 8, shift + 8)};
  lc.constant = {false};
  return lc;
}

LayerCase attention_case(std::mt19937& rng, uint64_t seed) {
  int64_t b = pick(rng, 1, 2), h = pick(rng, 1, 3), sq = pick(rng, 1, 40), sk = pick(rng, 1, 70);
  int64_t d = pick(rng, 1, 40), dv = rng() % 2 ? d : pick(rng, 1, 40);
  if (rng() % 4 == 0) sq = sk = 128, d = dv = 64;
  int64_t layout = rng() % 4;  // 0: [b,h,s,d]  1: [h,s,d]  2: [s,d]  3: K/V shared by the heads
  auto shape = [&](int64_t r, int64_t c, bool kv) {
    if (layout == 1) return Dims{h, r, c};
    if (layout == 2) return Dims{r, c};
    return Dims{b, layout == 3 && kv ? 1 : h, r, c};
  };
  bool kt = rng() % 2;
  int mask_kind = static_cast<int>(rng() % 6);  // 0: none
  LayerCase lc;
  lc.node = make_node("kiln", "Attention", mask_kind ? 4 : 3);
  testing::GraphBuilder::set_int(lc.node, "k_transposed", kt);
  if (rng() % 3) testing::GraphBuilder::set_float(lc.node, "scale", rng() % 2 ? 0.125f : 0.37f);
  lc.inputs = {
      testing::random_tensor(shape(sq, d, false), seed, DataType::kFloat32, -2, 2),
      testing::random_tensor(kt ? shape(d, sk, true) : shape(sk, d, true), seed + 1, DataType::kFloat32, -2, 2),
      testing::random_tensor(shape(sk, dv, true), seed + 2)};
  Dims m;
  switch (mask_kind) {
    case 1: m = layout >= 2 ? Dims{1, sk} : Dims{b, 1, 1, sk}; break;
    case 2: m = shape(sq, sk, false); break;
    case 3: m = {sq, sk}; break;
    case 4: m = {sq, 1}; break;
    case 5: m = {}; break;
  }
  if (layout == 1 && m.size() == 4) m.erase(m.begin());
  if (layout == 2 && m.size() > 2) m = {sq, sk};
  if (mask_kind) {
    Tensor mt = testing::random_tensor(m, seed + 3, DataType::kFloat32, -3, 1);
    // Masked-out keys, never a whole row: scores of a fully masked row all sit near -10000,
    // where float spacing (1e-3) makes the softmax differ with the summation order.
    int64_t mc = m.empty() ? 1 : m.back();
    for (int64_t i = 0; i < mt.numel(); ++i)
      if (mc > 1 && i % mc != 0 && mt.data<float>()[i] < -2.f) mt.data<float>()[i] = -10000.f;
    lc.inputs.push_back(mt);
  }
  lc.constant = {false, false, false, rng() % 2 == 0};
  return lc;
}

// A body of 2-7 elementwise nodes over 1-4 inputs broadcast into one output shape.
LayerCase fused_elementwise_case(std::mt19937& rng, uint64_t seed, bool blocked = false) {
  int64_t rank = pick(rng, 0, 4);
  Dims out = random_dims(rng, rank, 7);
  if (rank && rng() % 3 == 0) out.back() = pick(rng, 500, 1100);  // more than one 512-element chunk
  // `blocked`: the channel-blocked [N, C/B, H, W, B] against per-channel [1, C/B, 1, 1, B] operands
  // (rows that repeat a period of B), odd H and W, rows shorter and longer than a 512-element chunk.
  static const int64_t kBlock[] = {2, 8, 16, 32};
  if (blocked) out = {pick(rng, 1, 3), pick(rng, 1, 4), pick(rng, 1, 9), pick(rng, 1, 11), kBlock[rng() % 4]};
  int n_in = static_cast<int>(pick(rng, 1, 4));
  LayerCase lc;
  auto body = std::make_shared<ir::Graph>();
  body->name = "body";
  std::vector<std::string> in_names;
  for (int i = 0; i < n_in; ++i) {
    Dims d;
    int kind = i == 0 ? 0 : static_cast<int>(rng() % 4);  // 0: full, 1: scalar, 2/3: some dims broadcast
    if (blocked && i > 0 && rng() % 3 != 0) {
      d = {out[1], 1, 1, out[4]};
      if (rng() % 2) d.insert(d.begin(), 1);
    } else if (kind == 1) {
      d = rng() % 2 ? Dims{} : Dims{1};
    } else {
      size_t drop = kind == 0 ? 0 : rng() % (out.size() + 1);
      d.assign(out.begin() + drop, out.end());
      for (auto& x : d)
        if (kind != 0 && rng() % 2) x = 1;
    }
    in_names.push_back("x" + std::to_string(i));
    body->inputs.push_back({in_names.back(), ir::TypeInfo::tensor(DataType::kFloat32)});
    lc.inputs.push_back(testing::random_tensor(d, seed + i, DataType::kFloat32, -2, 2));
    lc.constant.push_back(rng() % 3 == 0);
  }
  int counter = 0;
  auto add = [&](const std::string& op, std::vector<std::string> ins, const std::string& domain = "") {
    ir::Node n;
    n.name = "n" + std::to_string(counter);
    n.op_type = op;
    n.domain = domain;
    n.opset = domain.empty() ? (op == "Gelu" ? 20 : 17) : 1;
    n.inputs = std::move(ins);
    n.outputs = {"t" + std::to_string(counter++)};
    body->nodes.push_back(n);
    return &body->nodes.back();
  };
  auto constant_input = [&](float v) {
    in_names.push_back("x" + std::to_string(lc.inputs.size()));
    body->inputs.push_back({in_names.back(), ir::TypeInfo::tensor(DataType::kFloat32)});
    lc.inputs.push_back(Tensor::scalar<float>(DataType::kFloat32, v));
    lc.constant.push_back(true);
    return in_names.back();
  };
  static const char* kSmooth[] = {"Abs",      "Neg",       "Relu", "Sigmoid", "Tanh",        "Erf",
                                  "Softsign", "LeakyRelu", "Elu",  "Selu",    "HardSigmoid", "HardSwish",
                                  "Gelu",     "kiln.Gelu", "Exp",  "Clip"};
  static const char* kStep[] = {"Floor", "Ceil", "Round", "Sign"};
  static const char* kBinary[] = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "PRelu", "Pow"};
  std::string v = in_names[0];
  // Steps act on inputs only (exact values: no rounding difference can move them across a step).
  if (rng() % 4 == 0) v = add(kStep[rng() % 4], {v})->outputs[0];
  int used = 1, nodes = static_cast<int>(pick(rng, 2, 6)), exps = 0;
  for (int k = 0; k < nodes || used < n_in; ++k) {
    if (used < n_in || rng() % 2) {
      std::string op = kBinary[rng() % 9];
      std::string other = used < n_in ? in_names[static_cast<size_t>(used++)] : in_names[rng() % in_names.size()];
      if (op == "PRelu") {  // the slope broadcasts into X: keep X the full-shaped value
        add(op, {v, other});
      } else if (op == "Pow") {
        static const float kExp[] = {0.f, 0.5f, 1.f, 2.f, 3.f, -1.f};
        float e = kExp[rng() % 6];
        std::string base = v;
        if (e == 0.5f || e == -1.f)  // keep the base positive and away from 0
          base = add("Add", {add("Abs", {v})->outputs[0], constant_input(0.5f)})->outputs[0];
        add(op, {base, constant_input(e)});
        if (other != in_names[0]) add("Mul", {body->nodes.back().outputs[0], other});
      } else if (op == "Div") {
        std::string den = add("Add", {add("Abs", {other})->outputs[0], constant_input(0.5f)})->outputs[0];
        add(op, {v, den});  // den / v would be ill-conditioned where v cancels to ~0
      } else {
        add(op, rng() % 2 ? std::vector<std::string>{v, other} : std::vector<std::string>{other, v});
      }
    } else {
      std::string op = kSmooth[rng() % 16];
      if (op == "Exp" && exps++) op = "Tanh";
      ir::Node* n = op == "kiln.Gelu" ? add("Gelu", {v}, "kiln") : add(op, {v});
      if (op == "Clip") {
        n->inputs.push_back(rng() % 2 ? constant_input(-0.5f) : "");
        if (rng() % 2) n->inputs.push_back(constant_input(0.8f));
      }
      if ((op == "Gelu" || op == "kiln.Gelu") && rng() % 2) set_string(*n, "approximate", "tanh");
      if (op == "LeakyRelu" || op == "Elu") testing::GraphBuilder::set_float(*n, "alpha", 0.3f);
    }
    v = body->nodes.back().outputs[0];
  }
  body->outputs.push_back({v, ir::TypeInfo::tensor(DataType::kFloat32)});
  lc.node = make_node("kiln", "FusedElementwise", in_names.size());
  ir::Attribute at;
  at.type = ir::Attribute::Type::kGraph;
  at.g = body;
  lc.node.attrs["body"] = at;
  return lc;
}

// One ONNX elementwise node (the fused_elementwise tactic takes them as one-node programs).
LayerCase onnx_elementwise_case(std::mt19937& rng, uint64_t seed) {
  static const char* kOps[] = {"Add",   "Sub",      "Mul",  "Div",        "Max",     "Min",  "PRelu",
                               "Pow",   "Clip",     "Abs",  "Relu",       "Sigmoid", "Tanh", "Erf",
                               "Exp",   "Sqrt",     "Elu",  "HardSwish",  "Neg",     "Sign", "Floor",
                               "Round", "Softsign", "Selu", "Reciprocal", "Mish",    "Celu", "ThresholdedRelu",
                               "Swish"};
  std::string op = kOps[rng() % 29];
  Dims out = random_dims(rng, pick(rng, 0, 4), 8);
  if (!out.empty() && rng() % 3 == 0) out.back() = pick(rng, 500, 1100);
  auto broadcast_shape = [&]() {
    if (rng() % 3 == 0) return Dims{};
    Dims d(out.begin() + static_cast<int64_t>(rng() % (out.size() + 1)), out.end());
    for (auto& x : d)
      if (rng() % 2) x = 1;
    return d;
  };
  bool positive = op == "Sqrt" || op == "Reciprocal" || op == "Pow";
  LayerCase lc;
  lc.inputs = {testing::random_tensor(out, seed, DataType::kFloat32, positive ? 0.5 : -2, 2)};
  lc.constant = {false};
  if (op == "Pow") {
    static const float kExp[] = {0.5f, 2.f, 3.f, -1.f};
    lc.inputs.push_back(Tensor::scalar<float>(DataType::kFloat32, kExp[rng() % 4]));
    lc.constant.push_back(true);
  } else if (op == "Clip") {
    lc.inputs.push_back(rng() % 3 ? Tensor::scalar<float>(DataType::kFloat32, -0.6f) : Tensor());
    lc.inputs.push_back(rng() % 2 ? Tensor::scalar<float>(DataType::kFloat32, 0.9f) : Tensor());
    lc.constant.insert(lc.constant.end(), {rng() % 2 == 0, rng() % 2 == 0});
  } else if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Max" || op == "Min" || op == "PRelu") {
    Dims b = broadcast_shape();
    if (op == "Div")
      lc.inputs.push_back(testing::random_tensor(b, seed + 1, DataType::kFloat32, 0.5, 2));
    else
      lc.inputs.push_back(testing::random_tensor(b, seed + 1));
    lc.constant.push_back(rng() % 2 == 0);
    if (op != "PRelu" && rng() % 2) std::swap(lc.inputs[0], lc.inputs[1]);
  }
  lc.node = make_node("", op, lc.inputs.size());
  if (op == "Mish") lc.node.opset = 18;
  if (op == "Swish") lc.node.opset = 24;
  if (op == "Celu" || op == "ThresholdedRelu" || op == "Swish")
    testing::GraphBuilder::set_float(lc.node, "alpha", rng() % 2 ? 0.7f : 1.3f);
  for (size_t i = 0; i < lc.inputs.size(); ++i)
    if (!lc.inputs[i].defined()) lc.node.inputs[i] = "";
  while (!lc.node.inputs.empty() && lc.node.inputs.back().empty()) lc.node.inputs.pop_back();
  lc.inputs.resize(lc.node.inputs.size());
  lc.constant.resize(lc.node.inputs.size());
  return lc;
}

LayerCase gelu_case(std::mt19937& rng, uint64_t seed) {
  bool kiln_op = rng() % 2;
  LayerCase lc;
  lc.node = make_node(kiln_op ? "kiln" : "", "Gelu", 1);
  if (!kiln_op) lc.node.opset = 20;
  if (rng() % 2) set_string(lc.node, "approximate", "tanh");
  lc.inputs = {testing::random_tensor(random_dims(rng, pick(rng, 0, 4), 40), seed, DataType::kFloat32, -6, 6)};
  lc.constant = {false};
  return lc;
}

// kiln.MultiHeadAttention: heads read in place from [batch..., S, H*D] (or one packed QKV).
LayerCase multi_head_attention_case(std::mt19937& rng, uint64_t seed) {
  int64_t b = pick(rng, 1, 2), h = pick(rng, 1, 4), sq = pick(rng, 1, 40), d = pick(rng, 1, 24);
  bool packed = rng() % 2;
  int64_t sk = packed ? sq : pick(rng, 1, 70), dv = packed || rng() % 2 ? d : pick(rng, 1, 24);
  if (rng() % 4 == 0) sq = sk = 128, d = dv = 64, h = 2;
  int64_t rank = pick(rng, 2, 4);  // [S, E], [B, S, E], [2, B, S, E]
  auto shape = [&](int64_t s, int64_t e) {
    Dims x = {s, e};
    if (rank >= 3) x.insert(x.begin(), b);
    if (rank == 4) x.insert(x.begin(), 2);
    return x;
  };
  int mask_kind = static_cast<int>(rng() % 4);  // 0: none, 1: [.., 1, 1, sk] keys, 2: [h, sq, sk], 3: [sq, sk]
  LayerCase lc;
  lc.node = make_node("kiln", "MultiHeadAttention", 4);
  testing::GraphBuilder::set_int(lc.node, "num_heads", h);
  if (rng() % 3) testing::GraphBuilder::set_float(lc.node, "scale", 0.125f);
  lc.inputs.push_back(testing::random_tensor(shape(sq, packed ? 3 * h * d : h * d), seed, DataType::kFloat32, -2, 2));
  if (packed) {
    lc.node.inputs[1] = lc.node.inputs[2] = "";
    lc.inputs.push_back(Tensor());
    lc.inputs.push_back(Tensor());
  } else {
    lc.inputs.push_back(testing::random_tensor(shape(sk, h * d), seed + 1, DataType::kFloat32, -2, 2));
    lc.inputs.push_back(testing::random_tensor(shape(sk, h * dv), seed + 2));
  }
  Dims m = mask_kind == 1 ? Dims{b, 1, 1, sk} : mask_kind == 2 ? Dims{h, sq, sk} : Dims{sq, sk};
  if (mask_kind == 1 && rank < 3) m = {1, sk};
  if (mask_kind) {
    Tensor mt = testing::random_tensor(m, seed + 3, DataType::kFloat32, -3, 1);
    for (int64_t i = 0; i < mt.numel(); ++i)  // never a whole row (see attention_case)
      if (sk > 1 && i % sk != 0 && mt.data<float>()[i] < -2.f) mt.data<float>()[i] = -10000.f;
    lc.inputs.push_back(mt);
  } else {
    lc.node.inputs.pop_back();
  }
  lc.constant = {false, false, false, false};
  return lc;
}

LayerCase xformer_case(std::mt19937& rng, uint64_t seed, int which) {
  switch (which % 7) {
    case 6: return onnx_elementwise_case(rng, seed);
    case 0: return layer_norm_case(rng, seed);
    case 1: return softmax_case(rng, seed);
    case 2: return attention_case(rng, seed);
    case 3: return fused_elementwise_case(rng, seed);
    case 4: return multi_head_attention_case(rng, seed);
    default: return gelu_case(rng, seed);
  }
}

// kiln's own kernels take their instruction set from cpu_isa(sig.isa) when prepared: each of them is
// prepared and checked once per ISA this CPU has (the signature's isa caps it, as kiln build --isa
// does). oneDNN picks its own ISA: its tactics run once.
std::vector<std::string> isas_to_test() {
  std::vector<std::string> isas = {"scalar"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isas.push_back("avx2");
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    isas.push_back("avx512");
  return isas;
}

std::string describe_case(const LayerCase& lc) {
  std::string s = lc.node.domain + "." + lc.node.op_type + " x" + dims_str(lc.inputs[0].shape());
  if (lc.inputs.size() > 1 && lc.inputs[1].defined()) s += " w" + dims_str(lc.inputs[1].shape());
  for (const auto& [k, a] : lc.node.attrs) {
    s += " " + k + "=";
    if (a.type == ir::Attribute::Type::kInts) s += dims_str(a.ints);
    if (a.type == ir::Attribute::Type::kInt) s += std::to_string(a.i);
    if (a.type == ir::Attribute::Type::kString) s += a.s;
  }
  return s;
}

// Every listed tactic that supports `lc` against the reference kernel's output `want` (each of
// kiln's own once per ISA); counts the tactics checked per name in `checked`, and in `*took` how
// many tactics took the case.
void check_tactics(const LayerCase& lc, const std::vector<Tensor>& want, int iter, const std::vector<std::string>& isas,
                   std::map<std::string, int>& checked, int* took) {
  *took = 0;
  backends::LayerSignature sig = testing::layer_signature(lc);
  for (const backends::Tactic* t : backends::all_tactics()) {
    auto ops = t->ops();
    if (std::find(ops.begin(), ops.end(), std::make_pair(lc.node.domain, lc.node.op_type)) == ops.end()) continue;
    if (!backends::why_declined(*t, sig).empty()) continue;
    ++*took;
    bool onednn = t->name().find("onednn") != std::string::npos;
    for (const std::string& isa : isas) {
      if (onednn && isa != isas.back()) continue;
      ASSERT_TRUE(parse_isa_level(isa == "scalar" ? "portable" : isa, &sig.isa)) << isa;
      if (std::getenv("KILN_TACTIC_TEST_TRACE")) {
        std::fprintf(stderr, "case %d %s %s %s %s\n", iter, t->name().c_str(), isa.c_str(), lc.node.op_type.c_str(),
                     dims_str(lc.inputs[0].shape()).c_str());
        if (const ir::Attribute* b = lc.node.attr("body"))
          for (const auto& n : b->g->nodes) std::fprintf(stderr, "  %s\n", n.op_type.c_str());
      }
      auto prepared = t->prepare(sig);
      ASSERT_TRUE(prepared.ok()) << t->name() << " on case " << iter << " (" << describe_case(lc)
                                 << "): " << prepared.status().to_string();
      std::vector<Dims> shapes = prepared.value()->output_shapes();
      std::vector<DataType> dtypes = prepared.value()->output_dtypes();
      ASSERT_EQ(shapes.size(), want.size()) << t->name() << " on case " << iter;
      ASSERT_EQ(dtypes.size(), want.size()) << t->name() << " on case " << iter;
      std::vector<Tensor> got;
      std::vector<Tensor*> got_ptrs;
      for (size_t o = 0; o < want.size(); ++o) {
        // A dim of -1: the shape depends on the data and the tactic allocates the output (engine/executor.h).
        bool dynamic = std::any_of(shapes[o].begin(), shapes[o].end(), [](int64_t d) { return d < 0; });
        if (dynamic)
          ASSERT_EQ(shapes[o].size(), want[o].shape().size()) << t->name() << " on case " << iter;
        else
          ASSERT_EQ(shapes[o], want[o].shape()) << t->name() << " on case " << iter << " " << lc.node.op_type;
        ASSERT_EQ(dtypes[o], want[o].dtype()) << t->name() << " on case " << iter << " " << lc.node.op_type;
        got.push_back(dynamic ? Tensor() : Tensor(dtypes[o], shapes[o]));
      }
      for (Tensor& g : got) got_ptrs.push_back(&g);
      std::vector<const Tensor*> ins;
      for (size_t i = 0; i < lc.node.inputs.size(); ++i)
        ins.push_back(lc.node.inputs[i].empty() || !lc.inputs[i].defined() ? nullptr : &lc.inputs[i]);
      Status st = prepared.value()->run_standalone(ins, got_ptrs);
      ASSERT_TRUE(st.ok()) << st.to_string();
      for (size_t o = 0; o < want.size(); ++o) {
        ASSERT_TRUE(got[o].defined()) << t->name() << " on case " << iter << " left output " << o << " undefined";
        ASSERT_EQ(got[o].shape(), want[o].shape()) << t->name() << " on case " << iter << " " << lc.node.op_type;
      }
      for (size_t o = 0; o < want.size(); ++o) {
        int bad = 0;
        const bool is_float = want[o].dtype() == DataType::kFloat32;
        const size_t es = dtype_size(want[o].dtype());
        for (int64_t i = 0; i < want[o].numel(); ++i) {
          bool same;
          if (is_float) {
            float w = want[o].data<float>()[i], g = got[o].data<float>()[i];
            same =
                std::fabs(w - g) <= 1e-4f * std::max(1.f, std::fabs(w)) || (std::isnan(w) && std::isnan(g)) || w == g;
            if (!same && bad < 3)
              ADD_FAILURE() << "output " << o << " element " << i << ": want " << w << ", got " << g;
          } else {  // exact: integers and bools
            same = std::memcmp(static_cast<const char*>(want[o].raw()) + static_cast<size_t>(i) * es,
                               static_cast<const char*>(got[o].raw()) + static_cast<size_t>(i) * es, es) == 0;
            if (!same && bad < 3)
              ADD_FAILURE() << "output " << o << " element " << i << ": want " << want[o].get_f64(i) << ", got "
                            << got[o].get_f64(i);
          }
          bad += !same;
        }
        EXPECT_EQ(bad, 0) << t->name() << " [" << isa << "] on case " << iter << " (" << lc.node.op_type << " "
                          << dims_str(lc.inputs[0].shape()) << ")";
      }
      checked[t->name()]++;
    }
  }
}

// check_tactics on a case that must be a valid layer and that some tactic must take (none left to
// the reference kernel).
void check_taken(const LayerCase& lc, int iter, const std::vector<std::string>& isas,
                 std::map<std::string, int>& checked) {
  std::vector<Tensor> want = testing::reference_outputs(lc);
  ASSERT_FALSE(want.empty()) << "case " << iter << " is not a valid layer: " << describe_case(lc);
  int took = 0;
  check_tactics(lc, want, iter, isas, checked, &took);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_GT(took, 0) << "no tactic takes case " << iter << ": " << describe_case(lc);
}

// kiln.BlockedConcatElementwise: 1-4 blocked pieces of 1-3 channel blocks each (N 1-3, odd H and W,
// blocks 2, 8, 16), then a body of Mul / Add by per-channel or one-value operands and an activation.
LayerCase blocked_concat_elementwise_case(std::mt19937& rng, uint64_t seed) {
  static const int64_t kBlock[] = {2, 8, 16};
  const int64_t n = pick(rng, 1, 3), h = pick(rng, 1, 9), w = pick(rng, 1, 12), block = kBlock[rng() % 3];
  const int64_t pieces = pick(rng, 1, 4);
  LayerCase lc;
  int64_t blocks = 0;
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t cb = pick(rng, 1, 3);
    blocks += cb;
    lc.inputs.push_back(testing::random_tensor({n, cb, h, w, block}, seed + static_cast<uint64_t>(p)));
    lc.constant.push_back(false);
  }
  auto body = std::make_shared<ir::Graph>();
  body->name = "body";
  body->inputs.push_back({"c", ir::TypeInfo::tensor(DataType::kFloat32)});
  std::string v = "c";
  int counter = 0;
  auto add = [&](const std::string& op, std::vector<std::string> ins) {
    ir::Node nd;
    nd.name = "n" + std::to_string(counter);
    nd.op_type = op;
    nd.opset = 17;
    nd.inputs = std::move(ins);
    nd.outputs = {"t" + std::to_string(counter++)};
    body->nodes.push_back(nd);
    v = nd.outputs[0];
  };
  auto operand = [&]() {
    const std::string name = "k" + std::to_string(lc.inputs.size());
    body->inputs.push_back({name, ir::TypeInfo::tensor(DataType::kFloat32)});
    lc.inputs.push_back(rng() % 4 == 0
                            ? Tensor::scalar<float>(DataType::kFloat32, 0.75f)
                            : testing::random_tensor({1, blocks, 1, 1, block}, seed + 50 + lc.inputs.size()));
    lc.constant.push_back(true);
    return name;
  };
  if (rng() % 4)
    add("Mul", rng() % 2 ? std::vector<std::string>{v, operand()} : std::vector<std::string>{operand(), v});
  if (rng() % 4 || counter == 0) add("Add", {v, operand()});
  static const char* kAct[] = {"Relu", "Sigmoid", "Tanh", ""};
  if (std::string act = kAct[rng() % 4]; !act.empty()) add(act, {v});
  body->outputs.push_back({v, ir::TypeInfo::tensor(DataType::kFloat32)});
  lc.node = make_node("kiln", "BlockedConcatElementwise", lc.inputs.size());
  testing::GraphBuilder::set_int(lc.node, "block", block);
  testing::GraphBuilder::set_int(lc.node, "pieces", pieces);
  ir::Attribute at;
  at.type = ir::Attribute::Type::kGraph;
  at.g = body;
  lc.node.attrs["body"] = at;
  return lc;
}

TEST(Tactics, EveryTacticMatchesTheReferenceKernel) {
  std::map<std::string, int> checked;
  std::mt19937 rng(1234);
  const char* more = std::getenv("KILN_TACTIC_TEST_CASES");  // longer soak runs
  int cases = more ? std::atoi(more) : 300;
  std::vector<std::string> isas = isas_to_test();
  for (int iter = 0; iter < cases * 8 / 3; ++iter) {
    uint64_t seed = 1000 + 10 * iter;
    const int family = iter % 8;
    LayerCase lc = family == 0   ? conv_case(rng, seed)
                   : family == 1 ? matmul_case(rng, seed)
                   : family == 2 ? gemm_case(rng, seed)
                   : family == 3 ? pool_case(rng, seed)
                   : family == 4 ? blocked_case(rng, seed)
                   : family == 7 ? testing::longtail_case(rng, seed, iter / 8)
                                 : xformer_case(rng, seed, iter / 8 * 2 + family - 5);
    bool known = false;
    std::vector<Tensor> want = testing::reference_outputs(lc, &known);
    EXPECT_TRUE(known) << lc.node.op_type;
    if (want.empty()) continue;  // a case the op itself rejects
    int took = 0;
    check_tactics(lc, want, iter, isas, checked, &took);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Convolution and pooling of every rank and variant, blocked convs grouped into whole blocks and
  // blocked Concats, alone or with the elementwise layer after them (their own random stream, so the cases
  // above stay as they were): each must be taken by a
  // tactic, none left to the reference kernel.
  std::mt19937 rng_nd(4321);
  for (int iter = 0; iter < cases; ++iter) {
    uint64_t seed = 500000 + 10 * iter;
    LayerCase lc = iter % 20 == 19  ? blocked_concat_elementwise_case(rng_nd, seed)
                   : iter % 10 == 9 ? blocked_concat_case(rng_nd, seed)
                   : iter % 5 == 4  ? grouped_blocks_conv_case(rng_nd, seed)
                   : iter % 5 % 2   ? conv_nd_case(rng_nd, seed)
                                    : pool_nd_case(rng_nd, seed);
    check_taken(lc, iter, isas, checked);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Squeeze-excite pieces (their own stream as well); each must be taken by a tactic.
  std::mt19937 rng_se(9876);
  for (int iter = 0; iter < cases / 5; ++iter) {
    uint64_t seed = 900000 + 10 * iter;
    LayerCase lc = squeeze_excite_case(rng_se, seed);
    check_taken(lc, iter, isas, checked);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // kiln.ChannelShuffle (its own stream too); each must be taken by a tactic.
  std::mt19937 rng_cs(2468);
  for (int iter = 0; iter < cases / 5; ++iter) {
    LayerCase lc = testing::channel_shuffle_case(rng_cs);
    check_taken(lc, iter, isas, checked);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // oneDNN's Winograd exists for AVX-512 only (ONEDNN_MAX_CPU_ISA=AVX2 runs this test as an AVX2 machine).
  const char* dnnl_isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  bool avx512 = __builtin_cpu_supports("avx512f") && !(dnnl_isa && std::string(dnnl_isa).rfind("AVX512", 0) != 0);
  for (const backends::Tactic* t : backends::all_tactics()) {
    if (!avx512 && t->name().find("winograd") != std::string::npos) continue;
    // The detection post-processing tactics have cases of their own, checked bit for bit on every ISA
    // (detection_tactic_test.cc); fill_kiln's Expand is checked here too.
    static const std::set<std::string> kOwnCases = {"nms_kiln", "roi_align_kiln", "topk_kiln", "gather_nd_kiln",
                                                    "nonzero_kiln", "scatter_elements_kiln", "fill_kiln",
                                                    // BF16: bf16_tactic_test.cc, with bf16's tolerance
                                                    "conv2d_onednn_nchwc_bf16", "matmul_onednn_bf16_packed",
                                                    "conv2d_onednn_nhwc_bf16", "pool2d_onednn_nhwc_bf16",
                                                    "matmul_onednn_bf16_io",
                                                    // the float32 channels-last ones too (their cases are there)
                                                    "conv2d_onednn_nhwc", "pool2d_onednn_nhwc"};
    // The INT8 CNN tactics likewise (int8_tactic_test.cc).
    if (t->name() == "conv2d_onednn_int8_nhwc" || t->name() == "conv2d_onednn_int8_nhwc_vnni" ||
        t->name() == "pool2d_kiln_int8_nhwc" || t->name() == "pool2d_onednn_int8_nhwc" ||
        t->name() == "quantize_linear_kiln" || t->name() == "quantize_channels_last_kiln")
      continue;
    if (kOwnCases.count(t->name())) continue;
    // The INT8 linear layers likewise (int8_matmul_test.cc: integer inputs, bit for bit).
    if (t->name().find("_onednn_u8s8s32") != std::string::npos) continue;
    // CUDA tactics run on the GPU, checked in cuda_tactic_test.cc.
    if (t->info().device != DeviceKind::kCPU) continue;
    EXPECT_GT(checked[t->name()], 5) << t->name() << " was checked on too few random layers";
  }
}

// kiln.FusedElementwise on the channel-blocked layout with per-channel operands (layout_blocked keeps
// DenseNet's BatchNormalization pre-activations so), and kiln.BlockedConcatElementwise (the Concat
// before them fused in): a tactic takes each case, and matches the reference on every ISA.
TEST(Tactics, FusedElementwiseOnBlockedPerChannelOperandsMatchesReference) {
  std::map<std::string, int> checked;
  std::mt19937 rng(2468);
  std::vector<std::string> isas = isas_to_test();
  const char* isa_env = std::getenv("KILN_ISA");
  std::string saved_isa = isa_env ? isa_env : "";
  for (int iter = 0; iter < 60; ++iter) {
    LayerCase lc = fused_elementwise_case(rng, 900000 + 10 * iter, true);
    check_taken(lc, iter, isas, checked);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (int iter = 0; iter < 60; ++iter) {
    LayerCase lc = blocked_concat_elementwise_case(rng, 950000 + 10 * iter);
    check_taken(lc, iter, isas, checked);
    if (::testing::Test::HasFatalFailure()) return;
  }
  if (isa_env)
    setenv("KILN_ISA", saved_isa.c_str(), 1);
  else
    unsetenv("KILN_ISA");
  // Empty dims (ONNX's affine_grid tests): a last dim group of 0 elements is no period (no division by it).
  for (const auto& [x, k] : std::vector<std::pair<Dims, Dims>>{{{2, 3, 0}, {3, 0}}, {{2, 0, 4}, {1, 4}}}) {
    LayerCase lc;
    auto body = std::make_shared<ir::Graph>();
    body->inputs = {{"a", ir::TypeInfo::tensor(DataType::kFloat32)}, {"b", ir::TypeInfo::tensor(DataType::kFloat32)}};
    ir::Node mul;
    mul.name = "m";
    mul.op_type = "Mul";
    mul.opset = 17;
    mul.inputs = {"a", "b"};
    mul.outputs = {"t"};
    body->nodes.push_back(mul);
    body->outputs.push_back({"t", ir::TypeInfo::tensor(DataType::kFloat32)});
    lc.node = make_node("kiln", "FusedElementwise", 2);
    ir::Attribute at;
    at.type = ir::Attribute::Type::kGraph;
    at.g = body;
    lc.node.attrs["body"] = at;
    lc.inputs = {testing::random_tensor(x, 7), testing::random_tensor(k, 8)};
    lc.constant = {false, true};
    std::vector<Tensor> want = testing::reference_outputs(lc);
    ASSERT_FALSE(want.empty()) << describe_case(lc);
    int took = 0;
    check_tactics(lc, want, 0, isas, checked, &took);
    EXPECT_GT(took, 0) << describe_case(lc);
  }
  EXPECT_EQ(checked["fused_elementwise_kiln"], 62 * static_cast<int>(isas.size()));  // once per ISA
  EXPECT_EQ(checked["concat_elementwise_blocked_kiln"], 60 * static_cast<int>(isas.size()));
  EXPECT_EQ(checked["concat_elementwise_blocked_kiln_single_thread"], 60 * static_cast<int>(isas.size()));
}

// AveragePool with count_include_pad whose last ceil_mode window reaches past the declared pads
// (in 6, kernel 3, stride 2, pads 1 + 1: the last window covers input 5, the end pad and one
// position beyond it, which ONNX does not count): oneDNN's divisor is rescaled there. 1-D, 2-D,
// 3-D and blocked; each must be taken by a oneDNN tactic and match.
TEST(Tactics, CeilModeAverageCountingPadsMatchesReference) {
  std::map<std::string, int> checked;
  for (int shape = 0; shape < 4; ++shape) {
    const size_t rank = shape == 3 ? 2 : static_cast<size_t>(shape + 1);
    LayerCase lc;
    lc.node = make_node("", "AveragePool", 1);
    lc.node.opset = 19;
    Dims x{2, 5}, pads;
    for (size_t d = 0; d < rank; ++d) x.push_back(6 + static_cast<int64_t>(d));
    testing::GraphBuilder::set_ints(lc.node, "kernel_shape", Dims(rank, 3));
    testing::GraphBuilder::set_ints(lc.node, "strides", Dims(rank, 2));
    testing::GraphBuilder::set_ints(lc.node, "pads", Dims(2 * rank, 1));
    testing::GraphBuilder::set_int(lc.node, "ceil_mode", 1);
    testing::GraphBuilder::set_int(lc.node, "count_include_pad", 1);
    lc.inputs = {testing::random_tensor(x, 77 + shape)};
    lc.constant = {false};
    if (shape == 3) {
      to_blocked_node(lc.node, "BlockedPool", 8);
      set_string(lc.node, "pool", "AveragePool");
      testing::GraphBuilder::set_int(lc.node, "pool_opset", 19);
      lc.inputs[0] = blocked(lc.inputs[0], 8);
    }
    std::vector<Tensor> want = testing::reference_outputs(lc);
    ASSERT_FALSE(want.empty());
    int took = 0;
    check_tactics(lc, want, shape, {isas_to_test().back()}, checked, &took);
    EXPECT_GT(took, 0) << describe_case(lc);
  }
  EXPECT_EQ(checked["pool1d_onednn_ncw"], 1);
  EXPECT_EQ(checked["pool2d_onednn_nchw"], 1);
  EXPECT_EQ(checked["pool3d_onednn_ncdhw"], 1);
  EXPECT_EQ(checked["pool2d_onednn_nchwc"], 1);
  EXPECT_EQ(checked["pool2d_onednn_nchwc_single_thread"], 1);
}

// Transposes that move the innermost dim (attention's K^T: [S,B*H,D] -> [B*H,D,S]) copy tiles of the
// dim that reads contiguously by the innermost one; odd sizes leave partial tiles on both edges.
TEST(Tactics, TransposeMovingTheInnermostDimMatchesReference) {
  struct Case {
    Dims x;
    std::vector<int64_t> perm;
    DataType dt;
  };
  const Case cases[] = {
      {{50, 96, 64}, {1, 2, 0}, DataType::kFloat32},     {{9, 33}, {1, 0}, DataType::kFloat32},
      {{3, 65, 17, 10}, {0, 3, 1, 2}, DataType::kInt64}, {{70, 8}, {1, 0}, DataType::kUInt8},
      {{2, 11, 40, 3}, {0, 2, 3, 1}, DataType::kInt16},  {{5, 130, 9}, {2, 1, 0}, DataType::kFloat32},
  };
  std::map<std::string, int> checked;
  int iter = 0;
  for (const Case& c : cases) {
    LayerCase lc;
    lc.node = make_node("", "Transpose", 1);
    testing::GraphBuilder::set_ints(lc.node, "perm", c.perm);
    std::mt19937 rng(static_cast<uint32_t>(iter));
    lc.inputs = {testing::small_ints(c.x, c.dt, rng, -100, 100)};
    lc.constant = {false};
    std::vector<Tensor> want = testing::reference_outputs(lc);
    ASSERT_FALSE(want.empty());
    int took = 0;
    check_tactics(lc, want, iter++, {isas_to_test().back()}, checked, &took);
    EXPECT_GT(took, 0) << describe_case(lc);
  }
  EXPECT_EQ(checked["movement_kiln"], 6);
}

// A Gather index out of range is the user's error: the run returns it (the reference kernel does too).
TEST(Tactics, GatherIndexOutOfRangeIsAnError) {
  testing::LayerCase lc;
  lc.node = make_node("", "Gather", 2);
  lc.inputs = {testing::random_tensor({4, 3}, 1), testing::i64_tensor({1, 4})};
  lc.constant = {false, false};
  const backends::Tactic* t = backends::find_tactic("movement_kiln");
  ASSERT_NE(t, nullptr);
  auto p = t->prepare(testing::layer_signature(lc));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  Tensor y(DataType::kFloat32, {2, 3});
  Status st = p.value()->run_standalone({&lc.inputs[0], &lc.inputs[1]}, {&y});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("out of range"), std::string::npos) << st.message();
  EXPECT_FALSE(testing::reference_output(lc).defined());
}

TEST(Tactics, LibrariesNameTheirRuntimeVersion) {
  std::string libs = backends::tactic_libraries();
  bool onednn = false;
  for (const backends::Tactic* t : backends::all_tactics()) onednn |= t->name().find("onednn") != std::string::npos;
  if (!onednn) {
    EXPECT_EQ(libs, "");
    return;
  }
  // "oneDNN X.Y.Z", the version of the library loaded (the timing cache is stale after an upgrade),
  // then, in a CUDA build, " + CUDA runtime X.Y + cuBLASLt X.Y.Z".
  ASSERT_EQ(libs.rfind("oneDNN ", 0), 0u) << libs;
  std::string onednn_part = libs.substr(0, libs.find(" + "));
  EXPECT_EQ(std::count(onednn_part.begin(), onednn_part.end(), '.'), 2) << libs;
  if (backends::device_runtime(DeviceKind::kCUDA)) {
    EXPECT_NE(libs.find(" + CUDA runtime "), std::string::npos) << libs;
    EXPECT_NE(libs.find(" + cuBLASLt "), std::string::npos) << libs;
  }
}

TEST(Tactics, NamesAreUniqueAndFindable) {
  std::set<std::string> names;
  for (const backends::Tactic* t : backends::all_tactics()) {
    EXPECT_TRUE(names.insert(t->name()).second) << t->name();
    EXPECT_EQ(backends::find_tactic(t->name()), t);
  }
  EXPECT_EQ(backends::find_tactic("no_such_tactic"), nullptr);
}

}  // namespace
}  // namespace kiln
