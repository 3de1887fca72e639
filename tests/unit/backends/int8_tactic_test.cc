// The INT8 CNN tactics (kiln.QConv, kiln.QPool, per-tensor QuantizeLinear / DequantizeLinear)
// against their reference kernels on random layers: odd channel counts and sizes, groups and
// depthwise, strides, pads, dilations, zero points, residuals, activations, uint8 and int8.
// kiln.QConv's oneDNN kernel rescales in float where the reference rescales in double: results may
// differ by one unit where a value sits at a rounding half-way point (so: at most 1, and rarely);
// the pooling and (de)quantization kernels use the reference's own arithmetic: bit-exact.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "backends/registry.h"
#include "layer_case.h"
#include "ops/kiln_quantized.h"

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

LayerCase qconv_case(std::mt19937& rng) {
  const bool gemm = rng() % 6 == 0;
  int64_t n = pick(rng, 1, 3), c, m, group = 1;
  switch (gemm ? 0 : rng() % 3) {
    case 0: c = pick(rng, 1, 70), m = pick(rng, 1, 67); break;
    case 1: group = c = m = pick(rng, 1, 40); break;  // depthwise
    default: group = pick(rng, 2, 4), c = group * pick(rng, 1, 9), m = group * pick(rng, 1, 7); break;
  }
  int64_t kh = gemm ? 1 : pick(rng, 1, 3) * 2 - 1, kw = rng() % 4 ? kh : pick(rng, 1, 3);
  if (gemm) kw = 1;
  const int64_t sh = gemm ? 1 : pick(rng, 1, 2), sw = gemm ? 1 : pick(rng, 1, 2), dh = !gemm && rng() % 5 == 0 ? 2 : 1;
  const int64_t ph = std::min<int64_t>(pick(rng, 0, 2), (kh - 1) * dh), pw = std::min<int64_t>(pick(rng, 0, 1), kw - 1);
  const int64_t h = gemm ? 1 : pick(rng, (kh - 1) * dh + 1, 17), w = gemm ? 1 : pick(rng, kw, 19);
  const int64_t oh = (h + 2 * ph - (kh - 1) * dh - 1) / sh + 1, ow = (w + 2 * pw - kw) / sw + 1;
  const bool bias = rng() % 4 != 0, residual = rng() % 3 == 0;
  LayerCase lc;
  lc.node = make_node("kiln", "QConv", residual ? 4 : bias ? 3 : 2);
  if (residual && !bias) lc.node.inputs[2] = "";
  ir::Node& nd = lc.node;
  if (!gemm) {
    set_int(nd, "channels_last", 1);
    set_int(nd, "group", group);
    nd.attrs["kernel_shape"] = ir::attr_ints({kh, kw});
    nd.attrs["strides"] = ir::attr_ints({sh, sw});
    nd.attrs["dilations"] = ir::attr_ints({dh, 1});
    nd.attrs["pads"] = ir::attr_ints({ph, pw, ph, pw});
  }
  const DataType xt = random_8bit(rng), yt = random_8bit(rng);
  const float xs = uniform(rng, 0.005f, 0.05f);
  const int64_t xzp = rng() % 2 ? 0 : pick(rng, lo_of(xt), hi_of(xt));
  std::vector<float> ws;
  const int64_t scales = rng() % 4 ? m : 1;
  for (int64_t k = 0; k < scales; ++k) ws.push_back(uniform(rng, 0.002f, 0.02f));
  const int64_t taps = c / group * kh * kw;
  // Outputs spread over a few dozen units, some saturating.
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
  const Dims x_shape = gemm ? Dims{n, c} : Dims{n, h, w, c};
  lc.inputs.push_back(random_int(xt, x_shape, rng, lo_of(xt), hi_of(xt)));
  lc.inputs.push_back(random_int(DataType::kInt8, {m, c / group, kh, kw}, rng, -127, 127));
  lc.inputs.push_back(bias ? random_int(DataType::kInt32, {m}, rng, -3000, 3000) : Tensor());
  lc.constant = {false, true, true, false};
  if (residual) {
    const DataType rt = random_8bit(rng);
    set_float(nd, "residual_scale", ys * uniform(rng, 0.5f, 2.f));
    set_int(nd, "residual_zero_point", pick(rng, lo_of(rt) / 2, hi_of(rt) / 2));
    // The conv's own quantization before the sum (a folded Q/DQ residual Add; never with a Clip after it).
    if (rng() % 3 && nd.attr_string("activation", "") != "Clip") {
      const DataType it = random_8bit(rng);
      set_float(nd, "inner_scale", ys * uniform(rng, 0.4f, 1.5f));
      set_int(nd, "inner_zero_point", pick(rng, lo_of(it) / 2, hi_of(it) / 2));
      set_int(nd, "inner_type", static_cast<int64_t>(it));
    }
    lc.inputs.push_back(random_int(rt, gemm ? Dims{n, m} : Dims{n, oh, ow, m}, rng, lo_of(rt), hi_of(rt)));
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
    const int64_t p = mode == "MaxPool" ? std::min<int64_t>(pick(rng, 0, 1), k - 1) : 0;
    nd.attrs["pads"] = ir::attr_ints({p, p, p, p});
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

LayerCase quantize_case(std::mt19937& rng) {
  const bool quantize = rng() % 2;
  const DataType qt = random_8bit(rng);
  const Dims shape{pick(rng, 1, 3), pick(rng, 1, 37), pick(rng, 1, 41)};
  LayerCase lc;
  lc.node = make_node("", quantize ? "QuantizeLinear" : "DequantizeLinear", 3);
  lc.node.opset = 13;
  const float s = uniform(rng, 0.003f, 0.1f);
  lc.inputs.push_back(quantize ? testing::random_tensor(shape, rng(), DataType::kFloat32, -8, 8)
                               : random_int(qt, shape, rng, lo_of(qt), hi_of(qt)));
  lc.inputs.push_back(Tensor::scalar<float>(DataType::kFloat32, s));
  lc.inputs.push_back(random_int(qt, {}, rng, lo_of(qt) / 2, hi_of(qt) / 2));
  lc.constant = {false, true, true};
  return lc;
}

// The reference kernel's error on the case ("" when it runs).
std::string reference_error(const LayerCase& lc) {
  const ops::OpSchema* s = ops::OpRegistry::get().find(lc.node.domain, lc.node.op_type, lc.node.opset);
  std::vector<ops::Value> vals;
  for (const auto& t : lc.inputs) vals.emplace_back(t);
  std::vector<const ops::Value*> ins;
  for (size_t i = 0; i < lc.node.inputs.size(); ++i)
    ins.push_back(lc.node.inputs[i].empty() || !lc.inputs[i].defined() ? nullptr : &vals[i]);
  ops::Interpreter runner(std::make_shared<ir::Graph>());
  auto r = ops::run_node(lc.node, *s, ins, &runner);
  return r.ok() ? "" : r.status().to_string();
}

// Runs `t` on the case; returns the output.
Tensor run_tactic(const backends::Tactic& t, const LayerCase& lc, DataType out_type) {
  backends::LayerSignature sig = testing::layer_signature(lc);
  sig.compute = ops::is_kiln_quantized_layer(lc.node) ? DataType::kInt8 : DataType::kFloat32;
  sig.outputs[0].dtype = out_type;
  EXPECT_EQ(backends::why_declined(t, sig), "") << t.name();
  auto prepared = t.prepare(sig);
  EXPECT_TRUE(prepared.ok()) << prepared.status().to_string();
  if (!prepared.ok()) return Tensor();
  Tensor y(prepared.value()->output_dtypes()[0], prepared.value()->output_shapes()[0]);
  std::vector<const Tensor*> in;
  for (size_t i = 0; i < lc.inputs.size(); ++i) in.push_back(lc.inputs[i].defined() ? &lc.inputs[i] : nullptr);
  Status st = prepared.value()->run_standalone(in, {&y});
  EXPECT_TRUE(st.ok()) << st.to_string();
  return y;
}

// Largest difference in units and how many elements differ.
void compare_units(const Tensor& want, const Tensor& got, int64_t* max_diff, int64_t* differing) {
  *max_diff = 0, *differing = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const int64_t d = std::llabs(want.get_i64(i) - got.get_i64(i));
    *max_diff = std::max(*max_diff, d);
    *differing += d != 0;
  }
}

// oneDNN's tactic, when this build has oneDNN.
const backends::Tactic* onednn_qconv() { return backends::find_tactic("conv2d_onednn_int8_nhwc"); }

TEST(Int8Tactics, QConvMatchesTheReferenceWithinOneUnit) {
  const backends::Tactic* t = onednn_qconv();
  if (!t) GTEST_SKIP() << "built without oneDNN";
  std::mt19937 rng(2024);
  int64_t total = 0, differing_total = 0;
  for (int iter = 0; iter < 120; ++iter) {
    LayerCase lc = qconv_case(rng);
    Tensor want = testing::reference_output(lc);
    ASSERT_TRUE(want.defined()) << "case " << iter << " x" << dims_str(lc.inputs[0].shape()) << " w"
                                << dims_str(lc.inputs[1].shape()) << " pads " << dims_str(lc.node.attr_ints("pads"))
                                << " strides " << dims_str(lc.node.attr_ints("strides")) << ": " << reference_error(lc);
    Tensor got = run_tactic(*t, lc, want.dtype());
    ASSERT_TRUE(got.defined()) << "case " << iter;
    ASSERT_EQ(got.shape(), want.shape()) << "case " << iter;
    ASSERT_EQ(got.dtype(), want.dtype()) << "case " << iter;
    int64_t max_diff = 0, differing = 0;
    compare_units(want, got, &max_diff, &differing);
    EXPECT_LE(max_diff, 1) << "case " << iter << " x" << dims_str(lc.inputs[0].shape()) << " w"
                           << dims_str(lc.inputs[1].shape());
    total += want.numel(), differing_total += differing;
  }
  // Half-way points are rare: a systematic rounding difference (truncation, ties away from zero, a
  // missing zero point) would move far more than this.
  EXPECT_LT(static_cast<double>(differing_total), 0.005 * static_cast<double>(total))
      << differing_total << " of " << total << " outputs differ by one unit";
}

// ONNX Runtime's requantization of an int8 convolution (MLAS): the exact int32 accumulator (bias and
// zero points included) times the float scale x_scale * w_scale / y_scale, the activation on that,
// rounded to nearest even, then the zero point added and saturated: QuantizeLinear's order.
Tensor requantized_conv(const LayerCase& lc) {
  const ir::Node& nd = lc.node;
  const Tensor &x = lc.inputs[0], &w = lc.inputs[1];
  const bool gemm = x.rank() == 2;
  const int64_t n = x.dim(0), h = gemm ? 1 : x.dim(1), wd = gemm ? 1 : x.dim(2), c = gemm ? x.dim(1) : x.dim(3);
  const int64_t m = w.dim(0), cg = w.dim(1), kh = w.dim(2), kw = w.dim(3), group = nd.attr_int("group", 1);
  const auto strides = gemm ? std::vector<int64_t>{1, 1} : nd.attr_ints("strides");
  const auto dil = gemm ? std::vector<int64_t>{1, 1} : nd.attr_ints("dilations");
  const auto pads = gemm ? std::vector<int64_t>{0, 0, 0, 0} : nd.attr_ints("pads");
  const int64_t oh = (h + pads[0] + pads[2] - (kh - 1) * dil[0] - 1) / strides[0] + 1;
  const int64_t ow = (wd + pads[1] + pads[3] - (kw - 1) * dil[1] - 1) / strides[1] + 1;
  const float xs = nd.attr_float("x_scale", 1), ys = nd.attr_float("y_scale", 1);
  const int64_t xzp = nd.attr_int("x_zero_point", 0), yzp = nd.attr_int("y_zero_point", 0);
  const std::vector<float> ws = nd.attrs.at("w_scales").floats;
  const DataType yt = static_cast<DataType>(nd.attr_int("y_type", static_cast<int64_t>(DataType::kUInt8)));
  const std::string act = nd.attr_string("activation", "");
  Tensor y(yt, gemm ? Dims{n, m} : Dims{n, oh, ow, m});
  const int64_t mg = m / group;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j)
        for (int64_t o = 0; o < m; ++o) {
          int64_t acc = lc.inputs[2].defined() ? lc.inputs[2].get_i64(o) : 0;
          const int64_t g = o / mg;
          for (int64_t k = 0; k < cg; ++k)
            for (int64_t u = 0; u < kh; ++u)
              for (int64_t v = 0; v < kw; ++v) {
                const int64_t r = i * strides[0] - pads[0] + u * dil[0], q = j * strides[1] - pads[1] + v * dil[1];
                if (r < 0 || r >= h || q < 0 || q >= wd) continue;  // padding: the zero point, (zp - zp) = 0
                const int64_t xi = ((b * h + r) * wd + q) * c + g * cg + k;
                acc += (x.get_i64(xi) - xzp) * w.get_i64(((o * cg + k) * kh + u) * kw + v);
              }
          const float scale = xs * ws[ws.size() == 1 ? 0 : static_cast<size_t>(o)] / ys;
          float val = static_cast<float>(acc) * scale;
          if (act == "Relu") val = std::max(val, 0.f);
          if (act == "Clip")
            val = std::min(std::max(val, nd.attr_float("activation_min", 0) / ys),
                           nd.attr_float("activation_max", 0) / ys);
          const double out = std::nearbyint(static_cast<double>(val)) + static_cast<double>(yzp);
          y.set_i64(((b * oh + i) * ow + j) * m + o,
                    static_cast<int64_t>(std::min<double>(std::max<double>(out, lo_of(yt)), hi_of(yt))));
        }
  return y;
}

// Without a residual, oneDNN's kernel is ONNX Runtime's arithmetic to the bit, odd zero points included
// (oneDNN added the zero point before rounding: round(v + zp) where QuantizeLinear says round(v) + zp;
// mobilenet_v2_fmnist's Q/DQ file then moved 26 of 40 logits against ONNX Runtime's).
TEST(Int8Tactics, QConvRequantizesAsOnnxRuntime) {
  const backends::Tactic* t = onednn_qconv();
  if (!t) GTEST_SKIP() << "built without oneDNN";
  std::mt19937 rng(4049);
  int checked = 0, odd_zp = 0;
  for (int iter = 0; iter < 150; ++iter) {
    LayerCase lc = qconv_case(rng);
    if (lc.inputs.size() > 3 || lc.node.inputs.size() > 3) continue;  // a residual: rounded twice
    // Odd zero points and values on half-way points: ties decide the order of rounding and zero point.
    if (rng() % 2) lc.node.attrs["y_zero_point"] = ir::attr_int(2 * pick(rng, 1, 60) + 1);
    if (rng() % 4) {  // a power-of-two scale x_scale * w_scale / y_scale = 2^-k: a share 2^-k of exact ties
      ir::Attribute& wa = lc.node.attrs["w_scales"];
      for (float& v : wa.floats) v = wa.floats[0];
      const Dims& wd = lc.inputs[1].shape();
      const double spread = 1.5 * std::sqrt(static_cast<double>(wd[1] * wd[2] * wd[3])) * 60;
      const int k = std::max(1, static_cast<int>(std::lround(std::log2(spread / 40))));
      lc.node.attrs["y_scale"] = ir::attr_float(lc.node.attr_float("x_scale", 1) * wa.floats[0] * std::ldexp(1.f, k));
    }
    if (lc.node.attr_int("y_zero_point", 0) % 2) ++odd_zp;
    Tensor want = requantized_conv(lc);
    Tensor got = run_tactic(*t, lc, want.dtype());
    ASSERT_TRUE(got.defined()) << "case " << iter;
    ASSERT_EQ(got.shape(), want.shape()) << "case " << iter;
    int64_t max_diff = 0, differing = 0;
    compare_units(want, got, &max_diff, &differing);
    EXPECT_EQ(differing, 0) << "case " << iter << " x" << dims_str(lc.inputs[0].shape()) << " w"
                            << dims_str(lc.inputs[1].shape()) << " y_zero_point " << lc.node.attr_int("y_zero_point", 0)
                            << " activation " << lc.node.attr_string("activation", "");
    ++checked;
  }
  EXPECT_GT(checked, 60);
  EXPECT_GT(odd_zp, 20);
}

// The VNNI variant (oneDNN's implementation after its AMX ones, timed against AMX on CPUs that have
// it): within one unit of the reference on the same random layers, and ONNX Runtime's arithmetic to
// the bit without a residual. Layers oneDNN has only AMX kernels for (or AMX and its reference kernel)
// are declined at prepare.
TEST(Int8Tactics, QConvWithoutAmxMatchesTheReference) {
  const backends::Tactic* t = backends::find_tactic("conv2d_onednn_int8_nhwc_vnni");
  if (!t) GTEST_SKIP() << "built without oneDNN";
  if (!(host_isa() & kIsaAmx)) GTEST_SKIP() << "this CPU has no AMX: the variant is no candidate";
  std::mt19937 rng(2024);
  int checked = 0, exact = 0;
  for (int iter = 0; iter < 120; ++iter) {
    LayerCase lc = qconv_case(rng);
    Tensor want = testing::reference_output(lc);
    ASSERT_TRUE(want.defined()) << "case " << iter;
    backends::LayerSignature sig = testing::layer_signature(lc);
    sig.compute = DataType::kInt8;
    sig.outputs[0].dtype = want.dtype();
    ASSERT_EQ(backends::why_declined(*t, sig), "") << "case " << iter;
    auto prepared = t->prepare(sig);
    if (!prepared.ok()) {
      const std::string& m = prepared.status().message();
      EXPECT_TRUE(m.find("AMX") != std::string::npos || m.find("reference") != std::string::npos) << m;
      continue;
    }
    Tensor got = run_tactic(*t, lc, want.dtype());
    ASSERT_TRUE(got.defined()) << "case " << iter;
    ASSERT_EQ(got.shape(), want.shape()) << "case " << iter;
    int64_t max_diff = 0, differing = 0;
    compare_units(want, got, &max_diff, &differing);
    EXPECT_LE(max_diff, 1) << "case " << iter << " x" << dims_str(lc.inputs[0].shape()) << " w"
                           << dims_str(lc.inputs[1].shape());
    ++checked;
    if (lc.inputs.size() > 3 || lc.node.inputs.size() > 3) continue;  // a residual: rounded twice
    compare_units(requantized_conv(lc), got, &max_diff, &differing);
    EXPECT_EQ(differing, 0) << "case " << iter << ": not ONNX Runtime's requantization";
    ++exact;
  }
  EXPECT_GT(checked, 40);
  EXPECT_GT(exact, 15);
}

TEST(Int8Tactics, QPoolIsBitExact) {
  std::mt19937 rng(77);
  std::map<std::string, int> checked;
  for (int iter = 0; iter < 80; ++iter) {
    LayerCase lc = qpool_case(rng);
    Tensor want = testing::reference_output(lc);
    ASSERT_TRUE(want.defined()) << "case " << iter;
    // kiln's kernel takes every case, oneDNN's the MaxPools on the integers (when built with oneDNN).
    for (const char* name : {"pool2d_kiln_int8_nhwc", "pool2d_onednn_int8_nhwc"}) {
      const backends::Tactic* t = backends::find_tactic(name);
      if (!t) continue;
      backends::LayerSignature sig = testing::layer_signature(lc);
      sig.compute = DataType::kInt8;
      sig.outputs[0].dtype = want.dtype();
      if (!backends::why_declined(*t, sig).empty()) continue;
      ++checked[name];
      Tensor got = run_tactic(*t, lc, want.dtype());
      ASSERT_EQ(got.shape(), want.shape()) << name << " case " << iter;
      int64_t max_diff = 0, differing = 0;
      compare_units(want, got, &max_diff, &differing);
      EXPECT_EQ(max_diff, 0) << name << " case " << iter << " " << lc.node.attr_string("mode", "") << " x"
                             << dims_str(lc.inputs[0].shape());
    }
  }
  EXPECT_EQ(checked["pool2d_kiln_int8_nhwc"], 80);
  if (onednn_qconv()) EXPECT_GT(checked["pool2d_onednn_int8_nhwc"], 5);
}

TEST(Int8Tactics, QuantizeAndDequantizeAreBitExact) {
  std::mt19937 rng(5);
  for (int iter = 0; iter < 60; ++iter) {
    LayerCase lc = quantize_case(rng);
    Tensor want = testing::reference_output(lc);
    ASSERT_TRUE(want.defined()) << "case " << iter;
    Tensor got = run_tactic(*backends::find_tactic("quantize_linear_kiln"), lc, want.dtype());
    ASSERT_EQ(got.shape(), want.shape());
    ASSERT_EQ(got.dtype(), want.dtype());
    for (int64_t i = 0; i < want.numel(); ++i)
      ASSERT_EQ(want.get_f64(i), got.get_f64(i)) << "case " << iter << " element " << i;
  }
}

// uint8 QuantizeLinear runs the INT8 linear layers' vector quantizer: large tensors (several chunks,
// a ragged tail), NaN (-> the zero point), infinities and values far outside the range (saturated),
// exact ties (to even), on every CPU path.
TEST(Int8Tactics, QuantizeToUint8IsBitExactOnEveryPath) {
  std::mt19937 rng(17);
  for (int iter = 0; iter < 12; ++iter) {
    LayerCase lc;
    lc.node = make_node("", "QuantizeLinear", 3);
    lc.node.opset = 13;
    const float s = uniform(rng, 0.003f, 0.1f);
    Tensor x = testing::random_tensor({pick(rng, 1, 3), pick(rng, 1, 300), pick(rng, 1, 131)}, rng(),
                                      DataType::kFloat32, -12, 12);
    float* px = x.data<float>();
    for (int64_t i = 0; i < x.numel(); i += 7) px[i] = s * (static_cast<float>(pick(rng, -300, 300)) + 0.5f);  // ties
    px[0] = NAN;
    if (x.numel() > 2) px[1] = INFINITY, px[2] = -1e30f;
    lc.inputs = {x, Tensor::scalar<float>(DataType::kFloat32, s),
                 Tensor::scalar<uint8_t>(DataType::kUInt8, static_cast<uint8_t>(pick(rng, 0, 255)))};
    lc.constant = {false, true, true};
    Tensor want = testing::reference_output(lc);
    ASSERT_TRUE(want.defined());
    for (const char* path : {"portable", "avx512"}) {
      backends::LayerSignature sig = testing::layer_signature(lc);
      sig.outputs[0].dtype = DataType::kUInt8;
      if (!parse_isa_level(path, &sig.isa)) continue;  // not on this machine
      auto prepared = backends::find_tactic("quantize_linear_kiln")->prepare(sig);
      ASSERT_TRUE(prepared.ok()) << prepared.status().to_string();
      Tensor got(DataType::kUInt8, want.shape());
      ASSERT_TRUE(prepared.value()->run_standalone({&lc.inputs[0], &lc.inputs[1], &lc.inputs[2]}, {&got}).ok());
      for (int64_t i = 0; i < want.numel(); ++i)
        ASSERT_EQ(want.get_i64(i), got.get_i64(i)) << path << " case " << iter << " element " << i << " x " << px[i];
    }
  }
}

TEST(Int8Tactics, QuantizeChannelsLastIsBitExact) {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 30; ++iter) {
    LayerCase lc;
    lc.node = make_node("kiln", "QuantizeChannelsLast", 1);
    const DataType qt = random_8bit(rng);
    set_float(lc.node, "y_scale", uniform(rng, 0.003f, 0.1f));
    set_int(lc.node, "y_zero_point", pick(rng, lo_of(qt) / 2, hi_of(qt) / 2));
    set_int(lc.node, "y_type", static_cast<int64_t>(qt));
    lc.inputs.push_back(testing::random_tensor({pick(rng, 1, 3), pick(rng, 1, 5), pick(rng, 1, 17), pick(rng, 1, 19)},
                                               rng(), DataType::kFloat32, -8, 8));
    lc.constant = {false};
    Tensor want = testing::reference_output(lc);
    ASSERT_TRUE(want.defined());
    Tensor got = run_tactic(*backends::find_tactic("quantize_channels_last_kiln"), lc, want.dtype());
    ASSERT_EQ(got.shape(), want.shape());
    for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(want.get_i64(i), got.get_i64(i)) << "case " << iter;
  }
}

TEST(Int8Tactics, QConvTakesTheInt8Precision) {
  if (!onednn_qconv()) GTEST_SKIP() << "built without oneDNN";
  std::mt19937 rng(3);
  LayerCase lc = qconv_case(rng);
  backends::LayerSignature sig = testing::layer_signature(lc);
  sig.compute = DataType::kFloat32;
  EXPECT_NE(backends::why_declined(*onednn_qconv(), sig), "");
}

}  // namespace
}  // namespace kiln
