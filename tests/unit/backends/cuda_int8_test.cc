// The CUDA backend's INT8 tactics (cuda_int8_tactics.cc) against the reference kernels of kiln.QConv,
// kiln.QPool, kiln.QuantizeChannelsLast, QuantizeLinear / DequantizeLinear and kiln.QMatMul on random
// layers, run on the GPU: odd channel counts and sizes (and multiples of 4, cuDNN's INT8 path and the
// dp4a loop), groups and depthwise, strides, dilations, asymmetric pads, zero points, uint8 and int8,
// residuals with and without the inner requantization, Relu / Clip, channels-last and NCHW, the Gemm
// form. kiln.QConv may differ from the reference by one unit of the output's step (the CPU tactics'
// contract; the kernels requantize in the reference's double arithmetic, so they should be exact), the
// others are bit-exact. Whole engines: a calibrated INT8 CNN built for cuda:0 runs no layer on the host
// and gives the reference interpreter's INT8 result. Skipped (with the reason) without a GPU; the
// decline reasons are checked without one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <random>

#include "../graph_builder.h"
#include "backends/registry.h"
#include "core/npy.h"
#include "cuda_test_util.h"
#include "engine/engine_impl.h"
#include "engine/tactics.h"
#include "kiln/kiln.h"
#include "layer_case.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "ops/kiln_quantized.h"
#include "ops/quantized_layers.h"
#include "ops/shape_inference.h"
#include "passes/pass.h"

namespace kiln {
namespace {

using testing::LayerCase;
using testing::make_node;
using testing::pick;

Tensor random_int(DataType t, const Dims& d, std::mt19937& rng, int64_t lo, int64_t hi) {
  Tensor x(t, d);
  for (int64_t i = 0; i < x.numel(); ++i) x.set_i64(i, pick(rng, lo, hi));
  return x;
}
DataType random_8bit(std::mt19937& rng) { return rng() % 2 ? DataType::kUInt8 : DataType::kInt8; }
int64_t lo_of(DataType t) { return t == DataType::kInt8 ? -128 : 0; }
int64_t hi_of(DataType t) { return t == DataType::kInt8 ? 127 : 255; }
float uniform(std::mt19937& rng, float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }
void set_float(ir::Node& n, const char* a, float v) { n.attrs[a] = ir::attr_float(v); }
void set_int(ir::Node& n, const char* a, int64_t v) { n.attrs[a] = ir::attr_int(v); }

// A random kiln.QConv: the CPU tactics' generator (int8_tactic_test.cc) plus NCHW layers, channel
// counts that are multiples of 4 half the time, and asymmetric pads.
LayerCase qconv_case(std::mt19937& rng) {
  const bool gemm = rng() % 6 == 0, aligned = rng() % 2, nchw = !gemm && rng() % 5 == 0;
  int64_t n = pick(rng, 1, 3), c, m, group = 1;
  switch (gemm || aligned ? 0 : rng() % 3) {
    case 0:
      c = aligned ? 4 * pick(rng, 1, 18) : pick(rng, 1, 70);
      m = aligned ? 4 * pick(rng, 1, 17) : pick(rng, 1, 67);
      break;
    case 1: group = c = m = pick(rng, 1, 40); break;  // depthwise
    default: group = pick(rng, 2, 4), c = group * pick(rng, 1, 9), m = group * pick(rng, 1, 7); break;
  }
  int64_t kh = gemm ? 1 : pick(rng, 1, 3) * 2 - 1, kw = rng() % 4 ? kh : pick(rng, 1, 3);
  if (gemm) kw = 1;
  const int64_t sh = gemm ? 1 : pick(rng, 1, 2), sw = gemm ? 1 : pick(rng, 1, 2), dh = !gemm && rng() % 5 == 0 ? 2 : 1;
  const int64_t ph = std::min<int64_t>(pick(rng, 0, 2), (kh - 1) * dh), pw = std::min<int64_t>(pick(rng, 0, 1), kw - 1);
  const int64_t pe_h = rng() % 4 ? ph : std::min<int64_t>(pick(rng, 0, 2), (kh - 1) * dh);  // sometimes asymmetric
  const int64_t h = gemm ? 1 : pick(rng, (kh - 1) * dh + 1, 17), w = gemm ? 1 : pick(rng, kw, 19);
  const int64_t oh = (h + ph + pe_h - (kh - 1) * dh - 1) / sh + 1, ow = (w + 2 * pw - kw) / sw + 1;
  const bool bias = rng() % 4 != 0, residual = rng() % 3 == 0;
  LayerCase lc;
  lc.node = make_node("kiln", "QConv", residual ? 4 : bias ? 3 : 2);
  if (residual && !bias) lc.node.inputs[2] = "";
  ir::Node& nd = lc.node;
  if (!gemm) {
    set_int(nd, "channels_last", nchw ? 0 : 1);
    set_int(nd, "group", group);
    nd.attrs["kernel_shape"] = ir::attr_ints({kh, kw});
    nd.attrs["strides"] = ir::attr_ints({sh, sw});
    nd.attrs["dilations"] = ir::attr_ints({dh, 1});
    nd.attrs["pads"] = ir::attr_ints({ph, pw, pe_h, pw});
  }
  const DataType xt = random_8bit(rng), yt = random_8bit(rng);
  const float xs = uniform(rng, 0.005f, 0.05f);
  const int64_t xzp = rng() % 2 ? 0 : pick(rng, lo_of(xt), hi_of(xt));
  std::vector<float> ws;
  const int64_t scales = rng() % 4 ? m : 1;
  for (int64_t k = 0; k < scales; ++k) ws.push_back(uniform(rng, 0.002f, 0.02f));
  const int64_t taps = c / group * kh * kw;
  const float ys = xs * ws[0] * 60.f * std::sqrt(static_cast<float>(taps)) / 40.f;
  set_float(nd, "x_scale", xs);
  set_int(nd, "x_zero_point", xzp);
  ir::Attribute wa;
  wa.type = ir::Attribute::Type::kFloats;
  wa.floats = ws;
  nd.attrs["w_scales"] = wa;
  set_float(nd, "y_scale", ys);
  set_int(nd, "y_zero_point", rng() % 2 ? 0 : pick(rng, lo_of(yt) / 2, hi_of(yt) / 2));
  set_int(nd, "y_type", static_cast<int64_t>(yt));
  switch (rng() % 3) {
    case 0: break;
    case 1: nd.attrs["activation"] = ir::attr_string("Relu"); break;
    default:
      nd.attrs["activation"] = ir::attr_string("Clip");
      set_float(nd, "activation_min", -10 * ys);
      set_float(nd, "activation_max", 30 * ys);
  }
  const Dims x_shape = gemm ? Dims{n, c} : nchw ? Dims{n, c, h, w} : Dims{n, h, w, c};
  lc.inputs.push_back(random_int(xt, x_shape, rng, lo_of(xt), hi_of(xt)));
  lc.inputs.push_back(random_int(DataType::kInt8, {m, c / group, kh, kw}, rng, -127, 127));
  lc.inputs.push_back(bias ? random_int(DataType::kInt32, {m}, rng, -3000, 3000) : Tensor());
  lc.constant = {false, true, true, false};
  if (residual) {
    const DataType rt = random_8bit(rng);
    set_float(nd, "residual_scale", ys * uniform(rng, 0.5f, 2.f));
    set_int(nd, "residual_zero_point", pick(rng, lo_of(rt) / 2, hi_of(rt) / 2));
    if (rng() % 3 && nd.attr_string("activation", "") != "Clip") {
      const DataType it = random_8bit(rng);
      set_float(nd, "inner_scale", ys * uniform(rng, 0.4f, 1.5f));
      set_int(nd, "inner_zero_point", pick(rng, lo_of(it) / 2, hi_of(it) / 2));
      set_int(nd, "inner_type", static_cast<int64_t>(it));
    }
    const Dims y_shape = gemm ? Dims{n, m} : nchw ? Dims{n, m, oh, ow} : Dims{n, oh, ow, m};
    lc.inputs.push_back(random_int(rt, y_shape, rng, lo_of(rt), hi_of(rt)));
  }
  return lc;
}

LayerCase qpool_case(std::mt19937& rng) {
  static const char* kModes[] = {"MaxPool", "AveragePool", "GlobalAveragePool"};
  const std::string mode = kModes[rng() % 3];
  const int64_t n = pick(rng, 1, 2), c = pick(rng, 1, 150), k = pick(rng, 1, 3);
  const int64_t h = pick(rng, k, 15), w = pick(rng, k, 13), s = pick(rng, 1, 2);
  LayerCase lc;
  lc.node = make_node("kiln", "QPool", 1);
  ir::Node& nd = lc.node;
  nd.attrs["mode"] = ir::attr_string(mode);
  set_int(nd, "channels_last", 1);
  if (mode != "GlobalAveragePool") {
    nd.attrs["kernel_shape"] = ir::attr_ints({k, k});
    nd.attrs["strides"] = ir::attr_ints({s, s});
    const int64_t p = std::min<int64_t>(pick(rng, 0, 1), k - 1);
    nd.attrs["pads"] = ir::attr_ints({p, p, p, p});
    if (rng() % 3 == 0) set_int(nd, "ceil_mode", 1);
  }
  const DataType xt = random_8bit(rng), yt = rng() % 2 ? xt : random_8bit(rng);
  const float xs = uniform(rng, 0.01f, 0.1f);
  const bool same = mode == "MaxPool" && rng() % 2;
  set_float(nd, "x_scale", xs);
  const int64_t xzp = pick(rng, lo_of(xt) / 2, hi_of(xt) / 2);
  set_int(nd, "x_zero_point", xzp);
  set_float(nd, "y_scale", same ? xs : xs * uniform(rng, 0.5f, 2.f));
  set_int(nd, "y_zero_point", same && xt == yt ? xzp : pick(rng, lo_of(yt) / 2, hi_of(yt) / 2));
  set_int(nd, "y_type", static_cast<int64_t>(same ? xt : yt));
  lc.inputs.push_back(random_int(xt, {n, h, w, c}, rng, lo_of(xt), hi_of(xt)));
  lc.constant = {false};
  return lc;
}

// The case's signature on cuda:0 as the builder makes it: the kiln INT8 layers compute in int8, and
// the outputs have the reference's dtypes.
backends::LayerSignature int8_signature(const LayerCase& lc, const std::vector<Tensor>& want) {
  backends::LayerSignature sig = testing::cuda_signature(lc);
  sig.compute = ops::computes_in_int8(lc.node) ? DataType::kInt8 : DataType::kFloat32;
  for (size_t o = 0; o < want.size() && o < sig.outputs.size(); ++o) sig.outputs[o].dtype = want[o].dtype();
  return sig;
}

std::string describe(const LayerCase& lc) {
  std::string s = lc.node.op_type;
  for (const Tensor& t : lc.inputs) s += " " + (t.defined() ? t.describe() : std::string("-"));
  for (const char* a : {"pads", "strides", "dilations"})
    if (lc.node.attrs.count(a)) s += std::string(" ") + a + dims_str(lc.node.attr_ints(a));
  s += " group " + std::to_string(lc.node.attr_int("group", 1)) + " cl " +
       std::to_string(lc.node.attr_int("channels_last", 0)) + " act '" + lc.node.attr_string("activation", "") +
       "' inner " + std::to_string(lc.node.attr_float("inner_scale", 0));
  return s;
}

// Runs every CUDA tactic of the case's op that takes it; each output must be within `units` of the
// reference's everywhere (integers) or equal (floats). Counts the runs per tactic in `ran`.
void check_int8(const backends::DeviceRuntime& rt, const LayerCase& lc, int64_t units, std::map<std::string, int>& ran,
                int64_t* differing = nullptr, int64_t* total = nullptr) {
  std::vector<Tensor> want = testing::reference_outputs(lc);
  ASSERT_FALSE(want.empty()) << "the reference rejects " << describe(lc);
  backends::LayerSignature sig = int8_signature(lc, want);
  for (const backends::Tactic* t : backends::all_tactics()) {
    if (t->info().device != DeviceKind::kCUDA || !backends::implements(*t, sig)) continue;
    if (std::string why = backends::why_declined(*t, sig); !why.empty()) continue;
    auto got = testing::run_signature_on_gpu(rt, *t, lc, sig);
    // cuDNN's INT8 convolution is tried at prepare time: a configuration it runs no algorithm for is
    // declined there (the H200 declines some strided/dilated ones), and the direct kernel takes it.
    if (!got.ok() && got.status().message().find("cuDNN runs no INT8 algorithm") != std::string::npos) {
      ++ran["declined at prepare: " + t->name()];
      continue;
    }
    ASSERT_TRUE(got.ok()) << t->name() << " on " << describe(lc) << ": " << got.status().message();
    ASSERT_EQ(got.value().size(), 1u);
    const Tensor& g = got.value()[0];
    ASSERT_EQ(g.dtype(), want[0].dtype()) << t->name() << " on " << describe(lc);
    ASSERT_EQ(g.shape(), want[0].shape()) << t->name() << " on " << describe(lc);
    int64_t worst = 0, diff = 0, first = -1;
    for (int64_t i = 0; i < g.numel(); ++i) {
      const bool fl = g.dtype() == DataType::kFloat32;
      const double d = fl ? std::fabs(g.get_f64(i) - want[0].get_f64(i))
                          : static_cast<double>(std::llabs(g.get_i64(i) - want[0].get_i64(i)));
      if (d > 0) {
        ++diff;
        if (first < 0) first = i;
      }
      worst = std::max<int64_t>(worst, fl ? (d > 0 ? units + 1 : 0) : static_cast<int64_t>(d));
    }
    EXPECT_LE(worst, units) << t->name() << " on " << describe(lc) << ": " << diff << " of " << g.numel()
                            << " differ, the first at " << first << " (got " << (first >= 0 ? g.get_f64(first) : 0)
                            << ", want " << (first >= 0 ? want[0].get_f64(first) : 0) << ")";
    if (differing) *differing += diff;
    if (total) *total += g.numel();
    ++ran[t->name()];
  }
}

void expect_ran(const std::map<std::string, int>& ran, const std::string& tactic, int at_least) {
  auto it = ran.find(tactic);
  EXPECT_GE(it == ran.end() ? 0 : it->second, at_least) << tactic << " ran on too few cases";
}

TEST(CudaInt8Tactics, QConvMatchesTheReferenceWithinOneUnit) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(2026);
  std::map<std::string, int> ran;
  int64_t differing = 0, total = 0;
  for (int iter = 0; iter < 160; ++iter) {
    SCOPED_TRACE("case " + std::to_string(iter));
    check_int8(*gpu, qconv_case(rng), 1, ran, &differing, &total);
  }
  expect_ran(ran, "qconv_cuda_direct", 160);
  expect_ran(ran, "qconv_cudnn_int8_nhwc", 30);
  // Half-way points are rare; a systematic rounding or zero point difference would move far more.
  EXPECT_LT(static_cast<double>(differing), 0.005 * static_cast<double>(total))
      << differing << " of " << total << " outputs differ by one unit";
}

// ResNet-50's shapes at batch 2 (the stem's C = 3 padded to 4 for cuDNN), uint8 and int8 activations
// with zero points: the shift, border fill and zero point compensation on real sizes.
TEST(CudaInt8Tactics, QConvResNetShapes) {
  KILN_SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t c, h, m, k, s, p;
  };
  const Shape shapes[] = {{3, 57, 64, 7, 2, 3},    {64, 28, 64, 1, 1, 0},   {64, 28, 64, 3, 1, 1},
                          {64, 28, 256, 1, 1, 0},  {256, 28, 128, 1, 2, 0}, {128, 14, 128, 3, 2, 1},
                          {512, 7, 2048, 1, 1, 0}, {2048, 7, 512, 1, 1, 0}, {512, 7, 512, 3, 1, 1}};
  std::mt19937 rng(50);
  std::map<std::string, int> ran;
  for (const Shape& sh : shapes) {
    for (DataType xt : {DataType::kUInt8, DataType::kInt8}) {
      LayerCase lc;
      lc.node = make_node("kiln", "QConv", 4);
      ir::Node& nd = lc.node;
      set_int(nd, "channels_last", 1);
      nd.attrs["kernel_shape"] = ir::attr_ints({sh.k, sh.k});
      nd.attrs["strides"] = ir::attr_ints({sh.s, sh.s});
      nd.attrs["pads"] = ir::attr_ints({sh.p, sh.p, sh.p, sh.p});
      const float xs = 0.02f;
      set_float(nd, "x_scale", xs);
      set_int(nd, "x_zero_point", xt == DataType::kUInt8 ? 37 : -5);
      ir::Attribute wa;
      wa.type = ir::Attribute::Type::kFloats;
      for (int64_t k = 0; k < sh.m; ++k) wa.floats.push_back(uniform(rng, 0.002f, 0.01f));
      nd.attrs["w_scales"] = wa;
      const float ys = xs * 0.006f * 60.f * std::sqrt(static_cast<float>(sh.c * sh.k * sh.k)) / 40.f;
      set_float(nd, "y_scale", ys);
      set_int(nd, "y_type", static_cast<int64_t>(DataType::kUInt8));
      nd.attrs["activation"] = ir::attr_string("Relu");
      set_float(nd, "residual_scale", ys);
      set_int(nd, "residual_zero_point", 3);
      set_float(nd, "inner_scale", ys * 0.8f);
      set_int(nd, "inner_type", static_cast<int64_t>(DataType::kInt8));
      const int64_t oh = (sh.h + 2 * sh.p - sh.k) / sh.s + 1;
      lc.inputs.push_back(random_int(xt, {2, sh.h, sh.h, sh.c}, rng, lo_of(xt), hi_of(xt)));
      lc.inputs.push_back(random_int(DataType::kInt8, {sh.m, sh.c, sh.k, sh.k}, rng, -127, 127));
      lc.inputs.push_back(random_int(DataType::kInt32, {sh.m}, rng, -20000, 20000));
      lc.inputs.push_back(random_int(DataType::kUInt8, {2, oh, oh, sh.m}, rng, 0, 255));
      lc.constant = {false, true, true, false};
      SCOPED_TRACE("c " + std::to_string(sh.c) + " m " + std::to_string(sh.m) + " k " + std::to_string(sh.k));
      check_int8(*gpu, lc, 1, ran);
    }
  }
  expect_ran(ran, "qconv_cudnn_int8_nhwc", 18);
  expect_ran(ran, "qconv_cuda_direct", 18);
}

TEST(CudaInt8Tactics, QPoolIsBitExact) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  std::map<std::string, int> ran;
  for (int iter = 0; iter < 60; ++iter) {
    SCOPED_TRACE("case " + std::to_string(iter));
    check_int8(*gpu, qpool_case(rng), 0, ran);
  }
  expect_ran(ran, "qpool_cuda_nhwc", 60);
}

TEST(CudaInt8Tactics, QuantizeDequantizeAndChannelsLastAreBitExact) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  std::map<std::string, int> ran;
  for (int iter = 0; iter < 40; ++iter) {
    const int kind = iter % 3;
    const DataType qt = random_8bit(rng);
    const float s = uniform(rng, 0.003f, 0.1f);
    const Dims shape{pick(rng, 1, 3), pick(rng, 1, 37), pick(rng, 1, 17), pick(rng, 1, 19)};
    LayerCase lc;
    if (kind == 2) {
      lc.node = make_node("kiln", "QuantizeChannelsLast", 1);
      set_float(lc.node, "y_scale", s);
      set_int(lc.node, "y_zero_point", pick(rng, lo_of(qt) / 2, hi_of(qt) / 2));
      set_int(lc.node, "y_type", static_cast<int64_t>(qt));
      lc.inputs.push_back(testing::random_tensor(shape, rng(), DataType::kFloat32, -8, 8));
      lc.constant = {false};
    } else {
      const bool quantize = kind == 0;
      lc.node = make_node("", quantize ? "QuantizeLinear" : "DequantizeLinear", 3);
      lc.node.opset = 13;
      lc.inputs.push_back(quantize ? testing::random_tensor(shape, rng(), DataType::kFloat32, -8, 8)
                                   : random_int(qt, shape, rng, lo_of(qt), hi_of(qt)));
      lc.inputs.push_back(Tensor::scalar<float>(DataType::kFloat32, s));
      lc.inputs.push_back(random_int(qt, {}, rng, lo_of(qt) / 2, hi_of(qt) / 2));
      lc.constant = {false, true, true};
    }
    SCOPED_TRACE("case " + std::to_string(iter));
    check_int8(*gpu, lc, 0, ran);
  }
  expect_ran(ran, "quantize_linear_cuda", 26);
  expect_ran(ran, "quantize_channels_last_cuda", 13);
}

TEST(CudaInt8Tactics, QMatMulIsExact) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  std::map<std::string, int> ran;
  for (int iter = 0; iter < 30; ++iter) {
    const int64_t rows = pick(rng, 1, 33), k = pick(rng, 1, 300), n = pick(rng, 1, 70);
    const bool x_float = rng() % 2, bias = rng() % 2, residual = rng() % 3 == 0, bzp = rng() % 2;
    const DataType bt = rng() % 4 ? DataType::kInt8 : DataType::kUInt8;
    LayerCase lc;
    lc.node = make_node("kiln", "QMatMul", residual ? 6 : bias ? 5 : 4);
    if (!bzp) lc.node.inputs[2] = "";
    if (residual && !bias) lc.node.inputs[4] = "";
    const float xs = uniform(rng, 0.01f, 0.05f);
    set_float(lc.node, "x_scale", xs);
    set_int(lc.node, "x_zero_point", pick(rng, 0, 255));
    if (rng() % 2) lc.node.attrs["activation"] = ir::attr_string("Relu");
    lc.inputs.push_back(x_float ? testing::random_tensor({rows, k}, rng(), DataType::kFloat32, -3, 3)
                                : random_int(DataType::kUInt8, {rows, k}, rng, 0, 255));
    lc.inputs.push_back(random_int(bt, {k, n}, rng, lo_of(bt), hi_of(bt)));
    lc.inputs.push_back(bzp ? random_int(bt, rng() % 2 ? Dims{n} : Dims{}, rng, lo_of(bt) / 4, hi_of(bt) / 4)
                            : Tensor());
    lc.inputs.push_back(testing::random_tensor(rng() % 2 ? Dims{n} : Dims{}, rng(), DataType::kFloat32, 0.001, 0.01));
    lc.inputs.push_back(bias ? testing::random_tensor({n}, rng()) : Tensor());
    if (residual) lc.inputs.push_back(testing::random_tensor({rows, n}, rng()));
    lc.constant = {false, true, true, true, true, false};
    SCOPED_TRACE("case " + std::to_string(iter));
    check_int8(*gpu, lc, 0, ran);
  }
  expect_ran(ran, "q_matmul_cuda", 30);
}

// What the tactics decline, and why (no GPU needed: why_unsupported reads the signature only).
TEST(CudaInt8Tactics, DeclineReasons) {
  const backends::Tactic* cudnn = backends::find_tactic("qconv_cudnn_int8_nhwc");
  const backends::Tactic* direct = backends::find_tactic("qconv_cuda_direct");
  if (!cudnn || !direct) GTEST_SKIP() << "built without the CUDA backend";
  std::mt19937 rng(1);
  int cudnn_took = 0, grouped = 0, odd = 0;
  for (int iter = 0; iter < 200; ++iter) {
    LayerCase lc = qconv_case(rng);
    std::vector<Tensor> want = testing::reference_outputs(lc);
    ASSERT_FALSE(want.empty());
    backends::LayerSignature sig = int8_signature(lc, want);
    EXPECT_EQ(direct->why_unsupported(sig), "") << describe(lc);
    const std::string why = cudnn->why_unsupported(sig);
    const Dims& x = lc.inputs[0].shape();
    const bool cl = lc.node.attr_int("channels_last", 0) && x.size() == 4;
    const int64_t group = lc.node.attr_int("group", 1);
    if (cl && group == 1 && lc.inputs[1].shape()[0] % 4 == 0) {  // C is padded to a multiple of 4
      EXPECT_EQ(why, "") << describe(lc);
      ++cudnn_took;
    } else {
      EXPECT_NE(why, "") << describe(lc);
      grouped += why.find("group") != std::string::npos;
      odd += why.find("multiple of 4") != std::string::npos;
    }
  }
  EXPECT_GT(cudnn_took, 20);
  EXPECT_GT(grouped, 5);
  EXPECT_GT(odd, 5);
  // The int8 compute precision is required: a float32 signature is not an INT8 tactic's.
  LayerCase lc = qconv_case(rng);
  backends::LayerSignature sig = testing::cuda_signature(lc);
  sig.compute = DataType::kFloat32;
  EXPECT_NE(backends::why_declined(*direct, sig), "");
}

// ---------------------------------------------------------------- engines

namespace fs = std::filesystem;

// Conv(3->8, 3x3) -> Relu -> Conv(8->8, 3x3) + residual -> Relu -> MaxPool 3x3/2 -> Conv(8->14, 1x1/2)
// -> Relu -> GlobalAveragePool -> Flatten -> Gemm(14->5): the first two through cuDNN's INT8
// convolution, the third (M = 14) direct.
std::string int8_cnn_bytes() {
  testing::GraphBuilder b;
  b.input("x", {2, 3, 19, 17});
  b.init("w1", testing::random_tensor({8, 3, 3, 3}, 1)).init("b1", testing::random_tensor({8}, 2));
  b.init("w2", testing::random_tensor({8, 8, 3, 3}, 3, DataType::kFloat32, -0.3, 0.3));
  b.init("w3", testing::random_tensor({14, 8, 1, 1}, 4)).init("b3", testing::random_tensor({14}, 5));
  b.init("wf", testing::random_tensor({5, 14}, 6)).init("bf", testing::random_tensor({5}, 7));
  b.conv({"x", "w1", "b1"}, "c1", 1);
  b.node("Relu", {"c1"}, {"r1"});
  b.conv({"r1", "w2"}, "c2", 1);
  b.node("Add", {"c2", "r1"}, {"a"});
  b.node("Relu", {"a"}, {"r2"});
  ir::Node& mp = b.node("MaxPool", {"r2"}, {"mp"});
  mp.attrs["kernel_shape"] = ir::attr_ints({3, 3});
  mp.attrs["strides"] = ir::attr_ints({2, 2});
  mp.attrs["pads"] = ir::attr_ints({1, 1, 1, 1});
  ir::Node& c3 = b.node("Conv", {"mp", "w3", "b3"}, {"c3"});
  c3.attrs["strides"] = ir::attr_ints({2, 2});
  b.node("Relu", {"c3"}, {"r3"});
  b.node("GlobalAveragePool", {"r3"}, {"p"});
  b.node("Flatten", {"p"}, {"f"});
  b.gemm_t({"f", "wf", "bf"}, "logits");
  b.output("logits");
  return onnx_import::serialize_model(b.finish()).value();
}

TEST(CudaInt8Engine, CalibratedCnnRunsEveryLayerOnTheGpuAsTheReference) {
  KILN_SKIP_WITHOUT_GPU();
  const fs::path dir = fs::temp_directory_path() / ("kiln_cuda_int8_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string model = int8_cnn_bytes();
  const std::string calib = (dir / "calib.npz").string(), cache = (dir / "calib.cache").string();
  ASSERT_TRUE(write_npz(calib, {{"x", testing::random_tensor({8, 3, 19, 17}, 99)}}).ok());
  std::vector<std::string> warnings;
  BuilderConfig cfg;
  cfg.precision = Precision::kINT8;
  cfg.calib_data = calib;
  cfg.calib_cache = cache;
  cfg.calib_batch_size = 2;
  cfg.device = {DeviceKind::kCUDA, 0};
  cfg.strict_tactics = true;
  cfg.deterministic_tactics = true;  // the registry's first choice: cuDNN's INT8 convolution where it applies
  cfg.warn = [&warnings](const std::string& w) { warnings.push_back(w); };
  auto gpu_engine = Builder(cfg).build_from_memory(model);
  for (const auto& w : warnings) EXPECT_EQ(w.find("on the host"), std::string::npos) << w;
  std::map<std::string, int> kernels;
  for (const auto& l : gpu_engine->impl().layers) {
    ++kernels[l.kernel];
    if (l.kernel == "reference") {
      EXPECT_TRUE(l.op_type == "Flatten" || l.op_type == "Reshape") << l.name << " (" << l.op_type << ") on the host";
      continue;
    }
    EXPECT_TRUE(l.kernel.find("cuda") != std::string::npos || l.kernel.find("cudnn") != std::string::npos)
        << l.name << " (" << l.op_type << "): " << l.kernel;
  }
  EXPECT_GE(kernels["qconv_cudnn_int8_nhwc"], 2) << gpu_engine->inspect_json();
  EXPECT_GE(kernels["qconv_cuda_direct"], 1) << gpu_engine->inspect_json();
  EXPECT_GE(kernels["qpool_cuda_nhwc"], 1) << gpu_engine->inspect_json();
  EXPECT_EQ(gpu_engine->impl().build["qdq_unfolded"]["layers"].get<int>(), 0);

  // The reference interpreter's INT8 result: the same ranges (the cache), every layer on its reference kernel.
  BuilderConfig ref_cfg;
  ref_cfg.precision = Precision::kINT8;
  ref_cfg.calib_cache = cache;
  ref_cfg.tactics = {"reference"};
  ref_cfg.warn = [](const std::string&) {};
  auto ref_engine = Builder(ref_cfg).build_from_memory(model);
  Tensor x = testing::random_tensor({2, 3, 19, 17}, 5);
  auto run = [&](const Engine& e) {
    auto ctx = e.create_context();
    ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
    ctx->run();
    HostTensor y = ctx->output("logits");
    return std::vector<float>(y.as<float>(), y.as<float>() + y.numel());
  };
  const std::vector<float> want = run(*ref_engine);
  for (int rep = 0; rep < 2; ++rep) {
    const std::vector<float> got = run(*gpu_engine);
    ASSERT_EQ(got.size(), want.size());
    // The kernels are the reference's arithmetic: equal logits (a one-unit difference upstream would
    // show here as a difference of a quantization step).
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "logit " << i << " run " << rep;
  }
  fs::remove_all(dir);
}

// ONNX Runtime's quantize_static format (QdqCnn of fold_qdq_conv_test.cc): uint8 activations with zero
// points (128 at the input), per-channel int8 weights, int32 biases, a residual Add, MaxPool,
// GlobalAveragePool, Flatten and the Gemm in Q/DQ, the output dequantized.
struct QdqCnn {
  testing::GraphBuilder b;
  std::mt19937 rng{7};
  int counter = 0;
  static Tensor u8(int64_t v) { return Tensor::from_vector<uint8_t>(DataType::kUInt8, {}, {static_cast<uint8_t>(v)}); }
  static Tensor floats(Dims d, std::vector<float> v) {
    return Tensor::from_vector<float>(DataType::kFloat32, std::move(d), v);
  }
  std::string qdq(const std::string& v, float scale, int64_t zp) {
    const std::string k = std::to_string(counter++);
    b.init("s" + k, Tensor::scalar<float>(DataType::kFloat32, scale)).init("z" + k, u8(zp));
    b.node("QuantizeLinear", {v, "s" + k, "z" + k}, {"q" + k});
    b.node("DequantizeLinear", {"q" + k, "s" + k, "z" + k}, {"dq" + k});
    return "dq" + k;
  }
  std::string weights(const std::string& name, Dims d, std::vector<float>* scales) {
    const int64_t m = d[0];
    scales->clear();
    for (int64_t k = 0; k < m; ++k) scales->push_back(0.004f + 0.001f * static_cast<float>(k % 5));
    b.init(name + "_q", random_int(DataType::kInt8, d, rng, -100, 100));
    b.init(name + "_s", floats({m}, *scales));
    b.init(name + "_z", Tensor::from_vector<int8_t>(DataType::kInt8, {m}, std::vector<int8_t>(m, 0)));
    ir::Node& n = b.node("DequantizeLinear", {name + "_q", name + "_s", name + "_z"}, {name});
    testing::GraphBuilder::set_int(n, "axis", 0);
    return name;
  }
  std::string bias(const std::string& name, float xs, const std::vector<float>& ws) {
    std::vector<float> s;
    for (float w : ws) s.push_back(xs * w);
    const int64_t m = static_cast<int64_t>(ws.size());
    b.init(name + "_q", random_int(DataType::kInt32, {m}, rng, -500, 500));
    b.init(name + "_s", floats({m}, s));
    b.init(name + "_z", Tensor::from_vector<int32_t>(DataType::kInt32, {m}, std::vector<int32_t>(m, 0)));
    ir::Node& n = b.node("DequantizeLinear", {name + "_q", name + "_s", name + "_z"}, {name});
    testing::GraphBuilder::set_int(n, "axis", 0);
    return name;
  }
  // x [2, 3, 19, 21] -> conv 3x3 (8) + Relu -> conv 1x1 (16) -> + conv 1x1 shortcut -> MaxPool 2x2
  // -> conv 3x3/2 (10, direct: M not a multiple of 4) -> GlobalAveragePool -> Flatten -> Gemm (5) -> y.
  std::string build() {
    b.input("x", {2, 3, 19, 21});
    const float xs = 1.f / 128;
    std::vector<float> w1s, w2s, w3s, w4s, w5s;
    std::string x = qdq("x", xs, 128);
    b.conv({x, weights("w1", {8, 3, 3, 3}, &w1s), bias("b1", xs, w1s)}, "c1", 1);
    b.node("Relu", {"c1"}, {"r1"});
    const float s1 = 4.f / 255;
    std::string a1 = qdq("r1", s1, 0);
    b.conv({a1, weights("w2", {16, 8, 1, 1}, &w2s), bias("b2", s1, w2s)}, "c2");
    std::string a2 = qdq("c2", 0.05f, 128);
    b.conv({a1, weights("w3", {16, 8, 1, 1}, &w3s), bias("b3", s1, w3s)}, "c3");
    std::string a3 = qdq("c3", 0.05f, 120);
    b.node("Add", {a2, a3}, {"sum"});
    b.node("Relu", {"sum"}, {"rs"});
    std::string a4 = qdq("rs", 0.06f, 0);
    ir::Node& mp = b.node("MaxPool", {a4}, {"mp"});
    testing::GraphBuilder::set_ints(mp, "kernel_shape", {2, 2});
    testing::GraphBuilder::set_ints(mp, "strides", {2, 2});
    std::string a5 = qdq("mp", 0.06f, 0);
    b.conv({a5, weights("w4", {10, 16, 3, 3}, &w4s), bias("b4", 0.06f, w4s)}, "c4", 1, 2);
    std::string a6 = qdq("c4", 0.04f, 110);
    b.node("GlobalAveragePool", {a6}, {"gap"});
    std::string a7 = qdq("gap", 0.03f, 100);
    b.node("Flatten", {a7}, {"flat"});
    std::string a8 = qdq("flat", 0.03f, 100);
    b.gemm_t({a8, weights("w5", {5, 10}, &w5s), bias("b5", 0.03f, w5s)}, "logits_f");
    std::string y = qdq("logits_f", 0.02f, 128);
    b.node("Identity", {y}, {"y"});
    b.output("y");
    return onnx_import::serialize_model(b.finish()).value();
  }
};

// After the pipeline for a CUDA target, every layer of `model` (its first input's batch set to `batch`)
// has a CUDA tactic that does not decline it (shape work aside): a GPU build places none on the host.
// Returns the count of each op.
std::map<std::string, int> expect_cuda_tactics_for_every_layer(ir::Model& model, int64_t batch) {
  std::map<std::string, int> ops;
  ir::TypeInfo& in = model.graph->inputs[0].type;
  if (in.shape.rank_known && in.shape.rank() > 0) in.shape.dims[0] = Dim(batch);
  model.graph->value_types.clear();
  Status st = ops::infer_shapes(*model.graph);
  EXPECT_TRUE(st.ok()) << st.to_string();
  Target t;
  t.device = {DeviceKind::kCUDA, 0};
  auto stats = passes::optimize(model, {}, t);
  EXPECT_TRUE(stats.ok()) << stats.status().to_string();
  if (!stats.ok()) return ops;
  const ir::Graph& g = *model.graph;
  for (const auto& n : g.nodes) {
    ++ops[n.op_type];
    if (n.op_type == "Flatten" || n.op_type == "Reshape" || n.op_type == "Identity") continue;
    const backends::LayerSignature sig = engine::signature_of(g, n, t);
    std::string reasons;
    bool taken = false;
    for (const backends::Tactic* tac : backends::all_tactics()) {
      if (tac->info().device != DeviceKind::kCUDA || !backends::implements(*tac, sig)) continue;
      const std::string why = backends::why_declined(*tac, sig);
      if (why.empty() && !taken) ++ops["first:" + tac->name()];  // the registry's first choice
      taken |= why.empty();
      reasons += " " + tac->name() + ": " + why + ";";
    }
    EXPECT_TRUE(taken) << n.name << " (" << n.domain << "." << n.op_type << ") has no CUDA tactic:" << reasons;
  }
  return ops;
}

// Without a GPU: the Q/DQ network's layers all have CUDA tactics.
TEST(CudaInt8Engine, QdqCnnLayersAllHaveACudaTactic) {
  if (!backends::find_tactic("qconv_cuda_direct")) GTEST_SKIP() << "built without the CUDA backend";
  QdqCnn net;
  auto model = onnx_import::parse_model(net.build(), "");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto ops = expect_cuda_tactics_for_every_layer(model.value(), 2);
  EXPECT_EQ(ops["QConv"], 5);
  EXPECT_EQ(ops["QPool"], 2);
}

// Without a GPU: ONNX Runtime's own INT8 resnet50 (../shared/data/qdq, when present) at batch 32: every
// layer has a CUDA tactic, its 53 convolutions and the classifier kiln.QConv.
TEST(CudaInt8Engine, OnnxRuntimeResnet50LayersAllHaveACudaTactic) {
  if (!backends::find_tactic("qconv_cuda_direct")) GTEST_SKIP() << "built without the CUDA backend";
  const std::string path = "../shared/data/qdq/resnet50.ort-int8-qdq.onnx";
  fs::path found;
  for (fs::path dir = fs::current_path(); !dir.empty(); dir = dir.parent_path()) {
    if (fs::exists(dir / path)) {
      found = dir / path;
      break;
    }
    if (dir == dir.parent_path()) break;
  }
  if (found.empty()) GTEST_SKIP() << path << " not found above the working directory";
  auto model = onnx_import::load_model(found.string());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto ops = expect_cuda_tactics_for_every_layer(model.value(), 32);
  EXPECT_EQ(ops["QConv"], 54);
  EXPECT_EQ(ops["first:qconv_cudnn_int8_nhwc"], 53);  // the classifier (the Gemm form) goes direct
  EXPECT_EQ(ops["first:qconv_cuda_direct"], 1);
  EXPECT_EQ(ops["Conv"] + ops["Gemm"] + ops["QuantizeLinear"], 0);
  std::string all;
  for (const auto& [op, count] : ops) all += " " + op + " " + std::to_string(count);
  std::cout << "resnet50 Q/DQ for cuda:" << all << "\n";
}

// The Q/DQ network built for cuda:0 runs no layer on the host and gives the reference interpreter's
// result on the same (folded) graph exactly.
TEST(CudaInt8Engine, QdqCnnRunsEveryLayerOnTheGpuAsTheReference) {
  KILN_SKIP_WITHOUT_GPU();
  QdqCnn net;
  const std::string model = net.build();
  std::vector<std::string> warnings;
  BuilderConfig cfg;
  cfg.device = {DeviceKind::kCUDA, 0};
  cfg.strict_tactics = true;
  cfg.deterministic_tactics = true;
  cfg.warn = [&warnings](const std::string& w) { warnings.push_back(w); };
  auto gpu_engine = Builder(cfg).build_from_memory(model);
  for (const auto& w : warnings) EXPECT_EQ(w.find("on the host"), std::string::npos) << w;
  std::map<std::string, int> kernels;
  for (const auto& l : gpu_engine->impl().layers) {
    ++kernels[l.kernel];
    if (l.kernel == "reference") {
      EXPECT_TRUE(l.op_type == "Flatten" || l.op_type == "Reshape" || l.op_type == "Identity")
          << l.name << " (" << l.op_type << ") on the host";
      continue;
    }
    EXPECT_TRUE(l.kernel.find("cuda") != std::string::npos || l.kernel.find("cudnn") != std::string::npos)
        << l.name << " (" << l.op_type << "): " << l.kernel;
  }
  EXPECT_GE(kernels["qconv_cudnn_int8_nhwc"], 3) << gpu_engine->inspect_json();
  EXPECT_GE(kernels["qconv_cuda_direct"], 2) << gpu_engine->inspect_json();  // the 10-channel conv, the Gemm
  BuilderConfig ref_cfg;
  ref_cfg.tactics = {"reference"};
  ref_cfg.warn = [](const std::string&) {};
  auto ref_engine = Builder(ref_cfg).build_from_memory(model);
  Tensor x = testing::random_tensor({2, 3, 19, 21}, 8, DataType::kFloat32, -1, 1);
  auto run = [&](const Engine& e) {
    auto ctx = e.create_context();
    ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
    ctx->run();
    HostTensor y = ctx->output("y");
    return std::vector<float>(y.as<float>(), y.as<float>() + y.numel());
  };
  const std::vector<float> want = run(*ref_engine);
  for (int rep = 0; rep < 2; ++rep) {
    const std::vector<float> got = run(*gpu_engine);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "output " << i << " run " << rep;
  }
}

}  // namespace
}  // namespace kiln
