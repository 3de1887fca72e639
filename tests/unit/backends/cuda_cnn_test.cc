// The CUDA backend's CNN tactics (cuDNN convolution, kiln's pooling and reduction kernels) against the
// reference kernels on random layers, run on the GPU: odd sizes, 1 to 3 spatial dims, groups and
// depthwise, strides, dilations, asymmetric and SAME pads, every kiln.FusedConv epilogue with a
// residual, ceil_mode and count_include_pad; float32, and float16/bfloat16 data within their own
// rounding. Whole engines: a ResNet-like and a MobileNet-like network built for cuda:0 run no layer on
// the host and give the CPU engine's outputs. Skipped (with the reason) without the CUDA backend or a
// GPU.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <random>

#include "../engine_util.h"
#include "../graph_builder.h"
#include "backends/registry.h"
#include "cuda_test_util.h"
#include "engine/engine_impl.h"
#include "kiln/kiln.h"
#include "layer_case.h"
#include "onnx/exporter.h"
#include "ops/kiln_layout.h"
#include "passes/pass.h"

namespace kiln {
namespace {

using testing::LayerCase;
using testing::make_node;
using testing::pick;
using testing::random_tensor;
using testing::set_string;
using GB = testing::GraphBuilder;

// The case with its float inputs (activations and constants) and the reference's output in `dt`.
LayerCase in_dtype(const LayerCase& lc, DataType dt) {
  LayerCase c = lc;
  for (auto& t : c.inputs)
    if (t.defined() && t.dtype() == DataType::kFloat32) t = t.cast(dt).value();
  return c;
}

// Tolerances for a result rounded to `dt` (the reference rounds its own result once per op; the
// kernels accumulate in float32 and round once per kernel).
void tolerance(DataType dt, double* atol, double* rtol) {
  if (dt == DataType::kFloat16)
    *atol = 1e-2, *rtol = 1e-2;
  else if (dt == DataType::kBFloat16)
    *atol = 6e-2, *rtol = 3e-2;
}

// Runs every CUDA tactic implementing the case's op (that does not decline it) against the reference;
// counts the runs per tactic in `ran`. A decline is counted in `declined` with its reason.
void check(const backends::DeviceRuntime& rt, const LayerCase& lc, double atol, double rtol,
           std::map<std::string, int>& ran, std::map<std::string, int>* declined = nullptr) {
  std::vector<Tensor> want = testing::reference_outputs(lc);
  ASSERT_FALSE(want.empty()) << "the reference rejects the case " << lc.node.op_type;
  backends::LayerSignature sig = testing::cuda_signature(lc);
  if (lc.inputs[0].dtype() != DataType::kFloat32) sig.compute = lc.inputs[0].dtype();
  std::string dims;
  for (const Tensor& x : lc.inputs) dims += (x.defined() ? x.describe() : std::string("-")) + " ";
  for (const backends::Tactic* t : backends::all_tactics()) {
    if (t->info().device != DeviceKind::kCUDA || !backends::implements(*t, sig)) continue;
    if (std::string why = backends::why_declined(*t, sig); !why.empty()) {
      if (declined) ++(*declined)[why];
      continue;
    }
    auto got = testing::run_on_gpu(rt, *t, lc);
    if (!got.ok() && got.status().message().find("heuristic offers") != std::string::npos) continue;
    // conv_cudnn_nhwc_fused_h<k>: a configuration cuDNN's fused call does not take fails at prepare.
    if (!got.ok() && (got.status().message().find("cuDNN declines the fused") != std::string::npos ||
                      got.status().message().find("cuDNN fuses no activation") != std::string::npos)) {
      if (declined) ++(*declined)[t->name() + ": " + got.status().message()];
      continue;
    }
    ASSERT_TRUE(got.ok()) << t->name() << " on " << lc.node.op_type << " " << dims << ": " << got.status().message();
    ASSERT_GE(got.value().size(), 1u);
    std::string where;
    EXPECT_TRUE(testing::close_to(got.value()[0], want[0], atol, rtol, &where))
        << t->name() << " on " << lc.node.op_type << " " << dims << ": " << where;
    ++ran[t->name()];
  }
}

void expect_ran(const std::map<std::string, int>& ran, const std::string& tactic, int at_least) {
  auto it = ran.find(tactic);
  EXPECT_GE(it == ran.end() ? 0 : it->second, at_least) << tactic << " ran on too few cases";
}

// A random Conv / kiln.FusedConv of `spatial` dims: plain, grouped or depthwise; strided, dilated;
// explicit (often asymmetric) pads or auto_pad; a bias, a residual and an epilogue activation.
LayerCase conv_case(std::mt19937& rng, uint64_t seed, size_t spatial) {
  bool fused = rng() % 2;
  int64_t n = pick(rng, 1, 3), group = 1, c, m;
  switch (rng() % 3) {
    case 0: c = pick(rng, 1, 9), m = pick(rng, 1, 11); break;
    case 1: group = c = pick(rng, 2, 13), m = c * pick(rng, 1, 2); break;  // depthwise
    default: group = pick(rng, 2, 3), c = group * pick(rng, 1, 5), m = group * pick(rng, 1, 6); break;
  }
  Dims k, s, d, x = {n, c}, pads_b, pads_e;
  for (size_t i = 0; i < spatial; ++i) {
    k.push_back(rng() % 3 == 0 ? 1 : pick(rng, 1, spatial == 3 ? 3 : 5));
    s.push_back(pick(rng, 1, 3));
    d.push_back(rng() % 3 ? 1 : 2);
    x.push_back(pick(rng, (k[i] - 1) * d[i] + 1, spatial == 3 ? 9 : 21));
    pads_b.push_back(pick(rng, 0, 2)), pads_e.push_back(pick(rng, 0, 2));
  }
  std::string auto_pad = std::vector<std::string>{"NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"}[rng() % 5];
  bool bias = rng() % 2, residual = fused && rng() % 2;
  LayerCase lc;
  lc.node = make_node(fused ? "kiln" : "", fused ? "FusedConv" : "Conv", residual ? 4 : (bias ? 3 : 2));
  if (residual && !bias) lc.node.inputs[2] = "";
  GB::set_int(lc.node, "group", group);
  GB::set_ints(lc.node, "strides", s);
  GB::set_ints(lc.node, "dilations", d);
  if (auto_pad == "NOTSET") {
    Dims pads = pads_b;
    pads.insert(pads.end(), pads_e.begin(), pads_e.end());
    GB::set_ints(lc.node, "pads", pads);
  } else {
    set_string(lc.node, "auto_pad", auto_pad);
  }
  if (fused) testing::add_epilogue(rng, lc.node);
  Dims w = {m, c / group};
  w.insert(w.end(), k.begin(), k.end());
  lc.inputs = {random_tensor(x, seed), random_tensor(w, seed + 1), bias ? random_tensor({m}, seed + 2) : Tensor()};
  lc.constant = {false, true, true, false};
  if (residual) {
    // The output's shape: the reference's own, from a run without the residual.
    LayerCase plain = lc;
    plain.node.inputs.resize(3);
    plain.inputs.resize(3);
    Tensor y = testing::reference_output(plain);
    if (y.defined())
      lc.inputs.push_back(random_tensor(y.shape(), seed + 3));
    else
      lc.node.inputs.resize(3);
  }
  return lc;
}

TEST(CudaCnnTactics, CudnnConvolutionFloat32) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(71);
  std::map<std::string, int> ran;
  for (int i = 0; i < 60; ++i) {
    size_t spatial = i % 6 == 0 ? 1 : i % 6 == 1 ? 3 : 2;
    LayerCase lc = conv_case(rng, 7000 + 10 * i, spatial);
    if (testing::reference_outputs(lc).empty()) continue;  // a window that does not fit
    check(*gpu, lc, 1e-4, 1e-4, ran);
  }
  expect_ran(ran, "conv_cudnn_h0", 50);
  expect_ran(ran, "conv_cudnn_h1", 20);
}

// The layers cuDNN fuses (float32 ReLU or identity with a bias and/or a residual): every heuristic rank.
TEST(CudaCnnTactics, CudnnConvolutionFusedBiasReluResidual) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(77);
  std::map<std::string, int> ran;
  int cases = 0;
  for (int i = 0; i < 40; ++i) {
    LayerCase lc;
    do {
      lc = conv_case(rng, 7600 + 10 * i, i % 8 == 0 ? 1 : i % 8 == 1 ? 3 : 2);
    } while (lc.node.op_type != "FusedConv");
    lc.node.attrs.erase("activation");
    if (i % 3) set_string(lc.node, "activation", "Relu");
    if (!lc.inputs[2].defined()) {  // a bias
      if (lc.node.inputs.size() < 3) lc.node.inputs.resize(3);
      lc.node.inputs[2] = "in2";
      lc.inputs[2] = random_tensor({lc.inputs[1].shape()[0]}, 7601 + 10 * i);
    }
    if (testing::reference_outputs(lc).empty()) continue;
    ++cases;
    check(*gpu, lc, 1e-4, 1e-4, ran);
  }
  EXPECT_GE(cases, 30);
  expect_ran(ran, "conv_cudnn_h0", cases);
  expect_ran(ran, "conv_cudnn_h2", cases / 3);
}

TEST(CudaCnnTactics, CudnnConvolutionHalfAndBFloat16) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(72);
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    std::map<std::string, int> ran;
    double atol = 0, rtol = 0;
    tolerance(dt, &atol, &rtol);
    for (int i = 0; i < 30; ++i) {
      LayerCase lc = in_dtype(conv_case(rng, 8000 + 10 * i, i % 5 == 0 ? 1 : 2), dt);
      if (testing::reference_outputs(lc).empty()) continue;
      check(*gpu, lc, atol, rtol, ran);
    }
    expect_ran(ran, "conv_cudnn_h0", 25);
  }
}

// A random MaxPool / AveragePool of `spatial` dims: ceil_mode, pads, dilations, auto_pad,
// count_include_pad.
LayerCase pool_case(std::mt19937& rng, uint64_t seed, size_t spatial) {
  bool max = rng() % 2;
  LayerCase lc;
  lc.node = make_node("", max ? "MaxPool" : "AveragePool", 1);
  lc.node.opset = 19;  // AveragePool dilations
  Dims k, s, d, x = {pick(rng, 1, 3), pick(rng, 1, 7)}, pads;
  for (size_t i = 0; i < spatial; ++i) {
    k.push_back(pick(rng, 1, 4));
    s.push_back(pick(rng, 1, 3));
    d.push_back(rng() % 4 ? 1 : 2);
    x.push_back(pick(rng, (k[i] - 1) * d[i] + 1, spatial == 3 ? 9 : 23));
  }
  for (size_t i = 0; i < 2 * spatial; ++i) pads.push_back(pick(rng, 0, k[i % spatial] - 1));
  GB::set_ints(lc.node, "kernel_shape", k);
  GB::set_ints(lc.node, "strides", s);
  GB::set_ints(lc.node, "dilations", d);
  if (rng() % 4 == 0)
    set_string(lc.node, "auto_pad", rng() % 2 ? "SAME_UPPER" : "SAME_LOWER");
  else
    GB::set_ints(lc.node, "pads", pads);
  if (rng() % 2) GB::set_int(lc.node, "ceil_mode", 1);
  if (!max && rng() % 2) GB::set_int(lc.node, "count_include_pad", 1);
  lc.inputs = {random_tensor(x, seed, DataType::kFloat32, -2, 2)};
  lc.constant = {false};
  return lc;
}

TEST(CudaCnnTactics, Pooling) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(74);
  std::map<std::string, int> ran;
  int cases = 0;
  for (int i = 0; i < 80; ++i) {
    LayerCase lc = pool_case(rng, 9100 + i, i % 8 == 0 ? 1 : i % 8 == 1 ? 3 : 2);
    if (testing::reference_outputs(lc).empty()) continue;
    ++cases;
    if (i % 4 == 3) {
      DataType dt = i % 8 == 3 ? DataType::kFloat16 : DataType::kBFloat16;
      double atol = 0, rtol = 0;
      tolerance(dt, &atol, &rtol);
      check(*gpu, in_dtype(lc, dt), atol, rtol, ran);
    } else {
      check(*gpu, lc, 1e-5, 1e-5, ran);
    }
  }
  expect_ran(ran, "pool_cuda", cases);
  EXPECT_GE(cases, 60);
}

// What the CNN tactics decline, with the reason: a signature check, so it runs in every CUDA build,
// GPU or not (skipped only without the CUDA backend).
TEST(CudaCnnTactics, DeclineReasons) {
  const backends::Tactic* conv = backends::find_tactic("conv_cudnn_h0");
  const backends::Tactic* pool = backends::find_tactic("pool_cuda");
  const backends::Tactic* global = backends::find_tactic("global_pool_cuda");
  if (!conv || !pool || !global) GTEST_SKIP() << "built without the CUDA backend";
  auto why = [](const backends::Tactic* t, const LayerCase& lc, DataType compute = DataType::kFloat32) {
    backends::LayerSignature sig = testing::cuda_signature(lc);
    sig.compute = compute;
    return backends::why_declined(*t, sig);
  };
  auto expect_reason = [](const std::string& got, const std::string& part) {
    EXPECT_NE(got.find(part), std::string::npos) << "'" << got << "' does not say '" << part << "'";
  };
  std::mt19937 rng(73);
  LayerCase lc = conv_case(rng, 9000, 2);
  EXPECT_EQ(why(conv, lc), "");
  EXPECT_EQ(why(conv, in_dtype(lc, DataType::kFloat16), DataType::kFloat16), "");
  expect_reason(why(conv, lc, DataType::kFloat16), "float32 data computed in float16");
  LayerCase f64 = lc;
  f64.inputs[0] = f64.inputs[0].cast(DataType::kFloat64).value();
  expect_reason(why(conv, f64), "float64");
  LayerCase act = conv_case(rng, 9010, 2);
  act.node.domain = "kiln", act.node.op_type = "FusedConv", act.node.opset = 1;
  set_string(act.node, "activation", "Mish");
  expect_reason(why(conv, act), "activation Mish has no kernel");
  LayerCase runtime_bias = lc;
  if (runtime_bias.node.inputs.size() < 3) runtime_bias.node.inputs.resize(3);
  runtime_bias.node.inputs[2] = "in2";
  runtime_bias.inputs[2] = random_tensor({lc.inputs[1].shape()[0]}, 9011);
  runtime_bias.constant[2] = false;
  expect_reason(why(conv, runtime_bias), "B is not a float constant");

  LayerCase mp = pool_case(rng, 9300, 2);
  mp.node.op_type = "MaxPool";
  mp.node.attrs.erase("count_include_pad");
  EXPECT_EQ(why(pool, mp), "");
  mp.node.outputs = {"y", "indices"};
  expect_reason(why(pool, mp), "Indices");

  LayerCase red;
  red.node = make_node("", "ReduceMean", 1);
  red.node.opset = 13;
  GB::set_ints(red.node, "axes", {1});
  red.inputs = {random_tensor({2, 3, 4}, 9301)};
  red.constant = {false};
  expect_reason(why(global, red), "not the trailing ones");
  GB::set_ints(red.node, "axes", {-1, 1});
  EXPECT_EQ(why(global, red), "");
}

TEST(CudaCnnTactics, GlobalPoolingAndTrailingReductions) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(76);
  std::map<std::string, int> ran, declined;
  const char* ops[] = {"GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceMax"};
  for (int i = 0; i < 48; ++i) {
    std::string op = ops[i % 4];
    int64_t rank = pick(rng, 3, 5);
    Dims x;
    for (int64_t r = 0; r < rank; ++r) x.push_back(pick(rng, 1, r < 2 ? 9 : 40));
    LayerCase lc;
    lc.node = make_node("", op, 1);
    lc.node.opset = 13;
    if (op.rfind("Reduce", 0) == 0) {
      std::vector<int64_t> axes;
      int64_t first = pick(rng, 0, rank - 1);
      for (int64_t a = first; a < rank; ++a) axes.push_back(rng() % 2 ? a : a - rank);
      if (i % 12 == 2) axes = {0};                           // not trailing (unless rank 1): declined
      if (i % 12 != 6) GB::set_ints(lc.node, "axes", axes);  // absent: every axis
      GB::set_int(lc.node, "keepdims", rng() % 2);
    }
    lc.inputs = {random_tensor(x, 9400 + i, DataType::kFloat32, -3, 3)};
    lc.constant = {false};
    if (i % 5 == 4)
      check(*gpu, in_dtype(lc, DataType::kFloat16), 1e-2, 1e-2, ran, &declined);
    else
      check(*gpu, lc, 1e-5, 1e-5, ran, &declined);
  }
  expect_ran(ran, "global_pool_cuda", 40);
  EXPECT_GE(declined["the reduced axes are not the trailing ones"], 3);
}

// Split (opset 11 attribute, opset 13 input, opset 18 num_outputs, uneven last part), float32 and
// int64 elements: every output against the reference.
TEST(CudaCnnTactics, Split) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(78);
  const backends::Tactic* t = backends::find_tactic("split_cuda");
  ASSERT_NE(t, nullptr);
  for (int i = 0; i < 24; ++i) {
    int64_t rank = pick(rng, 1, 4);
    Dims x;
    for (int64_t r = 0; r < rank; ++r) x.push_back(pick(rng, 1, 9));
    int64_t axis = pick(rng, 0, rank - 1);
    int64_t outs = pick(rng, 1, std::min<int64_t>(3, x[static_cast<size_t>(axis)]));
    LayerCase lc;
    lc.node = make_node("", "Split", 1);
    lc.node.outputs.clear();
    for (int64_t o = 0; o < outs; ++o) lc.node.outputs.push_back("y" + std::to_string(o));
    GB::set_int(lc.node, "axis", rng() % 2 ? axis : axis - rank);
    DataType dt = i % 3 == 2 ? DataType::kInt64 : DataType::kFloat32;
    lc.inputs = {random_tensor(x, 9500 + i, dt, -50, 50)};
    lc.constant = {false};
    std::vector<int64_t> split;
    int64_t left = x[static_cast<size_t>(axis)];
    for (int64_t o = 0; o + 1 < outs; ++o) {
      int64_t len = pick(rng, 0, left);
      split.push_back(len), left -= len;
    }
    split.push_back(left);
    switch (i % 3) {
      case 0: lc.node.opset = 11, GB::set_ints(lc.node, "split", split); break;
      case 1: {
        lc.node.opset = 13;
        lc.node.inputs.push_back("in1");
        Tensor s(DataType::kInt64, {outs});
        for (int64_t o = 0; o < outs; ++o) s.set_i64(o, split[static_cast<size_t>(o)]);
        lc.inputs.push_back(s);
        lc.constant.push_back(true);
        break;
      }
      default: lc.node.opset = 18, GB::set_int(lc.node, "num_outputs", outs); break;
    }
    std::vector<Tensor> want = testing::reference_outputs(lc);
    if (want.empty()) continue;  // num_outputs larger than the axis allows
    auto got = testing::run_on_gpu(*gpu, *t, lc);
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_EQ(got.value().size(), want.size());
    for (size_t o = 0; o < want.size(); ++o) {
      std::string where;
      EXPECT_TRUE(testing::close_to(got.value()[o], want[o], 0, 0, &where)) << "output " << o << ": " << where;
    }
  }
}

// ---------------------------------------------------------------- channels-last (layout_nhwc)

// A 2-D conv case as kiln.NhwcConv (X and the residual channels-last; W, B as they are) or a 2-D
// pool case as kiln.NhwcPool; the reference kernels transpose around the plain op.
LayerCase as_nhwc(const LayerCase& lc) {
  LayerCase c = lc;
  const std::string op = lc.node.op_type;
  c.node.domain = "kiln", c.node.opset = 1;
  if (op == "Conv" || op == "FusedConv") {
    c.node.op_type = "NhwcConv";
    if (c.inputs.size() > 3 && c.inputs[3].defined()) c.inputs[3] = ops::nchw_to_nhwc(c.inputs[3]).value();
  } else {
    c.node.op_type = "NhwcPool";
    set_string(c.node, "pool", op);
    GB::set_int(c.node, "pool_opset", lc.node.opset);
  }
  c.inputs[0] = ops::nchw_to_nhwc(c.inputs[0]).value();
  return c;
}

// A conv of the given geometry: X [n, c, h, w], W [m, c / group, k, k], pads (top, left, bottom, right),
// a bias, a residual and a ReLU when `fused`.
LayerCase fixed_conv(uint64_t seed, Dims x, int64_t m, int64_t group, int64_t k, int64_t stride, int64_t dil, Dims pads,
                     bool fused) {
  LayerCase lc;
  lc.node = make_node(fused ? "kiln" : "", fused ? "FusedConv" : "Conv", fused ? 4 : 3);
  GB::set_int(lc.node, "group", group);
  GB::set_ints(lc.node, "strides", {stride, stride});
  GB::set_ints(lc.node, "dilations", {dil, dil});
  GB::set_ints(lc.node, "pads", pads);
  if (fused) set_string(lc.node, "activation", "Relu");
  lc.inputs = {random_tensor(x, seed), random_tensor({m, x[1] / group, k, k}, seed + 1), random_tensor({m}, seed + 2)};
  lc.constant = {false, true, true, false};
  if (fused) {
    LayerCase plain = lc;
    plain.node.op_type = "Conv", plain.node.domain = "", plain.node.opset = 17;
    plain.node.attrs.erase("activation");
    plain.node.inputs.resize(3);
    Tensor y = testing::reference_output(plain);
    lc.inputs.push_back(random_tensor(y.shape(), seed + 3));
  }
  return lc;
}

// conv_cudnn_nhwc_h<k> against the reference: random 2-D convs (every epilogue, groups, depthwise,
// strides, dilations, asymmetric and SAME pads) and fixed ones with 3, 5, 17 and 64 channels, in
// float32, float16 and bfloat16.
TEST(CudaCnnTactics, CudnnNhwcConvolution) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(79);
  for (DataType dt : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
    std::map<std::string, int> ran;
    double atol = 1e-4, rtol = 1e-4;
    tolerance(dt, &atol, &rtol);
    int cases = 0;
    for (int i = 0; i < 30; ++i) {
      LayerCase lc = conv_case(rng, 9600 + 10 * i, 2);
      if (testing::reference_outputs(lc).empty()) continue;
      ++cases;
      check(*gpu, in_dtype(as_nhwc(lc), dt), atol, rtol, ran);
    }
    struct Geo {
      int64_t c, m, group, k, stride, dil;
      Dims pads;
    };
    const Geo geos[] = {{3, 64, 1, 7, 2, 1, {3, 3, 3, 3}},   {5, 17, 1, 3, 1, 1, {1, 0, 2, 1}},
                        {17, 17, 17, 3, 2, 1, {1, 1, 1, 1}}, {64, 64, 64, 3, 1, 2, {2, 2, 2, 2}},
                        {64, 32, 4, 3, 1, 1, {1, 1, 1, 1}},  {64, 17, 1, 1, 2, 1, {0, 0, 0, 0}},
                        {17, 64, 1, 1, 1, 1, {0, 0, 0, 0}},  {64, 64, 1, 3, 2, 1, {1, 1, 0, 0}}};
    for (size_t i = 0; i < std::size(geos); ++i) {
      const Geo& q = geos[i];
      LayerCase lc = fixed_conv(9900 + 10 * i, {2, q.c, 13, 11}, q.m, q.group, q.k, q.stride, q.dil, q.pads, i % 2);
      ++cases;
      check(*gpu, in_dtype(as_nhwc(lc), dt), atol, rtol, ran);
    }
    // float32 NHWC without TF32 may find no FMA algorithm for a case (declined, not wrong).
    expect_ran(ran, "conv_cudnn_nhwc_h0", dt == DataType::kFloat32 ? cases / 2 : cases - 2);
  }
}

// The channels-last cases are the plain ones transposed: the NhwcConv / NhwcPool reference equals the
// plain reference's output transposed (no GPU needed; the GPU tests rest on it).
TEST(CudaCnnTactics, NhwcCasesAreThePlainOnesTransposed) {
  std::mt19937 rng(81);
  int checked = 0;
  for (int i = 0; i < 40; ++i) {
    LayerCase lc = i % 2 ? conv_case(rng, 9800 + 10 * i, 2) : pool_case(rng, 9800 + 10 * i, 2);
    std::vector<Tensor> want = testing::reference_outputs(lc);
    if (want.empty()) continue;
    std::vector<Tensor> got = testing::reference_outputs(as_nhwc(lc));
    ASSERT_EQ(got.size(), 1u) << lc.node.op_type;
    Tensor back = ops::nhwc_to_nchw(got[0]).value();
    std::string where;
    EXPECT_TRUE(testing::close_to(back, want[0], 0, 0, &where)) << lc.node.op_type << ": " << where;
    ++checked;
  }
  EXPECT_GE(checked, 30);
}

// pool_nhwc_cuda against the reference: the windowed cases Pooling runs, in 2-D, and global pools.
TEST(CudaCnnTactics, NhwcPooling) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(80);
  std::map<std::string, int> ran;
  int cases = 0;
  for (int i = 0; i < 60; ++i) {
    LayerCase lc;
    if (i % 6 == 5) {
      lc.node = make_node("", i % 12 == 5 ? "GlobalAveragePool" : "GlobalMaxPool", 1);
      lc.node.opset = 13;
      lc.inputs = {random_tensor({pick(rng, 1, 3), pick(rng, 1, 70), pick(rng, 1, 9), pick(rng, 1, 9)}, 9700 + i,
                                 DataType::kFloat32, -2, 2)};
      lc.constant = {false};
    } else {
      lc = pool_case(rng, 9700 + i, 2);
    }
    if (testing::reference_outputs(lc).empty()) continue;
    ++cases;
    DataType dt = i % 3 == 0 ? DataType::kFloat16 : i % 3 == 1 ? DataType::kBFloat16 : DataType::kFloat32;
    double atol = 1e-5, rtol = 1e-5;
    tolerance(dt, &atol, &rtol);
    check(*gpu, in_dtype(as_nhwc(lc), dt), atol, rtol, ran);
  }
  expect_ran(ran, "pool_nhwc_cuda", cases);
  EXPECT_GE(cases, 45);
}

// Sets every `stride`-th element of X (input 0) to NaN.
void sprinkle_nan(LayerCase& lc, int64_t stride) {
  for (int64_t k = stride / 2; k < lc.inputs[0].numel(); k += stride) lc.inputs[0].set_f64(k, std::nan(""));
}

// pool_nhwc_cuda's channel packs (16 bytes: 4 float32 or 8 float16/bfloat16 channels per thread when
// the channel count allows, one channel otherwise) against the reference: the windowed cases of
// pool_case (ceil_mode, pads, dilation 2, count_include_pad) with 3 to 40 channels, some inputs with
// NaN (MaxPool ignores it, AveragePool propagates it); then global pools of 1 to 72 channels over
// planes of 1 to 56 x 56 (GlobalMaxPool keeps NaN, as its reference does), in each dtype.
TEST(CudaCnnTactics, NhwcPoolingChannelPacks) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(83);
  const int64_t channels[] = {8, 16, 24, 4, 12, 3, 9, 40};
  const DataType dtypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16};
  std::map<std::string, int> ran;
  int cases = 0;
  for (int i = 0; i < 96; ++i) {
    LayerCase lc = pool_case(rng, 9950 + i, 2);
    Dims x = lc.inputs[0].shape();
    x[1] = channels[i % 8];
    lc.inputs[0] = random_tensor(x, 9950 + i, DataType::kFloat32, -2, 2);
    if (i % 5 == 0) sprinkle_nan(lc, 37);
    if (testing::reference_outputs(lc).empty()) continue;
    ++cases;
    const DataType dt = dtypes[(i / 8) % 3];
    double atol = 1e-5, rtol = 1e-5;
    tolerance(dt, &atol, &rtol);
    check(*gpu, in_dtype(as_nhwc(lc), dt), atol, rtol, ran);
  }
  EXPECT_GE(cases, 80);
  const int64_t global_channels[] = {1, 3, 8, 16, 24, 64, 72};
  const Dims planes[] = {{1, 1}, {7, 7}, {3, 17}, {56, 56}, {2, 9}, {14, 14}, {1, 40}};
  for (DataType dt : dtypes)
    for (size_t c = 0; c < std::size(global_channels); ++c)
      for (int max = 0; max < 2; ++max) {
        const Dims& hw = planes[(c + static_cast<size_t>(max)) % std::size(planes)];
        LayerCase lc;
        lc.node = make_node("", max ? "GlobalMaxPool" : "GlobalAveragePool", 1);
        lc.node.opset = 13;
        lc.inputs = {random_tensor({1 + static_cast<int64_t>(c) % 3, global_channels[c], hw[0], hw[1]},
                                   9990 + 10 * c + max, DataType::kFloat32, -2, 2)};
        lc.constant = {false};
        if (c % 3 == 1) sprinkle_nan(lc, 53);
        ++cases;
        double atol = 1e-5, rtol = 1e-5;
        tolerance(dt, &atol, &rtol);
        check(*gpu, in_dtype(as_nhwc(lc), dt), atol, rtol, ran);
      }
  expect_ran(ran, "pool_nhwc_cuda", cases);
}

// A 3x3 kiln.FusedConv (pads 1) of X [2, c, 9, 7] to m channels with activation `act` ("" for none;
// "GeluTanh" is Gelu with approximate tanh), a bias and a residual when asked.
LayerCase epilogue_conv(uint64_t seed, int64_t c, int64_t m, const std::string& act, bool bias, bool residual) {
  LayerCase lc;
  lc.node = make_node("kiln", "FusedConv", residual ? 4 : (bias ? 3 : 2));
  if (residual && !bias) lc.node.inputs[2] = "";
  GB::set_int(lc.node, "group", 1);
  GB::set_ints(lc.node, "strides", {1, 1});
  GB::set_ints(lc.node, "dilations", {1, 1});
  GB::set_ints(lc.node, "pads", {1, 1, 1, 1});
  if (act == "GeluTanh") {
    set_string(lc.node, "activation", "Gelu");
    set_string(lc.node, "activation_approximate", "tanh");
  } else if (!act.empty()) {
    set_string(lc.node, "activation", act);
  }
  if (act == "LeakyRelu") testing::set_float(lc.node, "activation_alpha", 0.1f);
  if (act == "HardSigmoid") testing::set_float(lc.node, "activation_alpha", 0.3f);
  if (act == "Clip") testing::set_float(lc.node, "activation_min", -0.5f);
  if (act == "Clip") testing::set_float(lc.node, "activation_max", 0.7f);
  testing::add_conv_inputs(lc, seed, {2, c, 9, 7}, {m, c, 3, 3}, bias, residual);
  return lc;
}

// The channels-last conv epilogue (conv_cudnn_nhwc_h<k>: kiln's kernel over [N*H*W, M], 16-byte packs
// when M is a multiple of 4 (float32) or 8 (float16/bfloat16), one element a thread otherwise) and the
// fused cuDNN call (conv_cudnn_nhwc_fused_h<k>, ReLU or none) against the reference: every activation,
// bias and residual on and off, 5 to 64 output channels, each dtype.
TEST(CudaCnnTactics, NhwcConvEpiloguePacks) {
  KILN_SKIP_WITHOUT_GPU();
  const std::string acts[] = {"",     "Relu",        "LeakyRelu", "Sigmoid", "Tanh",    "HardSwish",
                              "Clip", "HardSigmoid", "SiLU",      "Gelu",    "GeluTanh"};
  const int64_t ms[] = {8, 24, 64, 5, 12, 16, 3};
  for (DataType dt : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
    std::map<std::string, int> ran, declined;
    double atol = 1e-4, rtol = 1e-4;
    tolerance(dt, &atol, &rtol);
    int cases = 0;
    for (size_t a = 0; a < std::size(acts); ++a)
      for (int variant = 0; variant < 4; ++variant) {
        const bool bias = variant & 1, residual = variant & 2;
        const int64_t m = ms[(a * 4 + static_cast<size_t>(variant)) % std::size(ms)];
        const int64_t c = variant == 3 ? 3 : 8;
        LayerCase lc =
            epilogue_conv(10100 + 10 * (a * 4 + static_cast<size_t>(variant)), c, m, acts[a], bias, residual);
        ++cases;
        check(*gpu, in_dtype(as_nhwc(lc), dt), atol, rtol, ran, &declined);
      }
    expect_ran(ran, "conv_cudnn_nhwc_h0", dt == DataType::kFloat32 ? cases / 2 : cases - 2);
    std::string why;
    for (const auto& [k, v] : declined) why += k + " (" + std::to_string(v) + ")\n";
    std::cout << dtype_name(dt) << ": ran";
    for (const auto& [k, v] : ran) std::cout << " " << k << "=" << v;
    std::cout << "\ndeclined:\n" << why;
  }
}

// conv_cudnn_nhwc_fused_h<k> takes ResNet-50's float16 layers (a 3x3 and a 1x1 with bias and ReLU, a
// 1x1 with bias, residual and ReLU, a 1x1 projection with bias only, 64 and 256 channels): for each,
// at least one of h0..h3 prepares (cuDNN's fused call runs it) and matches the reference. A decline of
// every rank, which fails this test, leaves the layer to kiln's epilogue kernel: correct, but the
// fusion buys nothing. bfloat16 only prints what cuDNN says.
TEST(CudaCnnTactics, CudnnNhwcFusedTakesResNetLayers) {
  KILN_SKIP_WITHOUT_GPU();
  struct Layer {
    int64_t c, m, k;
    bool relu, residual;
  };
  const Layer layers[] = {
      {64, 64, 3, true, false}, {64, 256, 1, true, true}, {256, 64, 1, true, false}, {64, 256, 1, false, false}};
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16})
    for (size_t i = 0; i < std::size(layers); ++i) {
      const Layer& q = layers[i];
      LayerCase lc = fixed_conv(10300 + 10 * i, {2, q.c, 14, 14}, q.m, 1, q.k, 1, 1,
                                q.k == 3 ? Dims{1, 1, 1, 1} : Dims{0, 0, 0, 0}, q.residual);
      if (!q.residual) {
        lc.node.domain = "kiln", lc.node.op_type = "FusedConv", lc.node.opset = 1;
        if (q.relu) set_string(lc.node, "activation", "Relu");
      }
      LayerCase c = in_dtype(as_nhwc(lc), dt);
      std::vector<Tensor> want = testing::reference_outputs(c);
      ASSERT_FALSE(want.empty());
      double atol = 0, rtol = 0;
      tolerance(dt, &atol, &rtol);
      std::string whys;
      int took = 0;
      for (int k = 0; k < 4; ++k) {
        const backends::Tactic* t = backends::find_tactic("conv_cudnn_nhwc_fused_h" + std::to_string(k));
        ASSERT_NE(t, nullptr);
        auto got = testing::run_on_gpu(*gpu, *t, c, false, dt);
        if (!got.ok()) {
          whys += t->name() + ": " + got.status().message() + "\n";
          continue;
        }
        ++took;
        std::string where;
        EXPECT_TRUE(testing::close_to(got.value()[0], want[0], atol, rtol, &where))
            << t->name() << " " << dtype_name(dt) << " layer " << i << ": " << where;
      }
      if (dt == DataType::kFloat16) {
        EXPECT_GE(took, 1) << "layer " << i << ":\n" << whys;
      } else {
        std::cout << "bfloat16 layer " << i << ": " << took << " of h0..h3 took it\n" << whys;
      }
    }
}

// ---------------------------------------------------------------- whole engines

struct Net {
  GB b{17};
  uint64_t seed = 100;
  int id = 0;
  std::string fresh(const std::string& p) { return p + std::to_string(id++); }
  // Conv (no bias) -> BatchNormalization -> activation ("Relu", "Relu6" or ""); returns the output.
  std::string conv_bn(const std::string& x, int64_t c, int64_t m, int64_t k, int64_t stride, int64_t group,
                      const std::string& act) {
    std::string w = fresh("w"), y = fresh("c"), bn = fresh("bn");
    b.init(w, random_tensor({m, c / group, k, k}, seed++, DataType::kFloat32, -0.4, 0.4));
    b.conv({x, w}, y, k / 2, stride, group);
    std::string s = fresh("s"), bb = fresh("b"), mean = fresh("m"), var = fresh("v");
    b.init(s, random_tensor({m}, seed++, DataType::kFloat32, 0.5, 1.5));
    b.init(bb, random_tensor({m}, seed++, DataType::kFloat32, -0.2, 0.2));
    b.init(mean, random_tensor({m}, seed++, DataType::kFloat32, -0.2, 0.2));
    b.init(var, random_tensor({m}, seed++, DataType::kFloat32, 0.5, 1.5));
    b.node("BatchNormalization", {y, s, bb, mean, var}, {bn});
    if (act.empty()) return bn;
    std::string out = fresh("a");
    if (act == "Relu") {
      b.node("Relu", {bn}, {out});
    } else {
      b.node("Clip", {bn, "zero", "six"}, {out});
    }
    return out;
  }
  // GlobalAveragePool -> Flatten -> Gemm -> Softmax into "logits".
  void head(const std::string& x, int64_t c, int64_t classes) {
    b.node("GlobalAveragePool", {x}, {"gap"});
    b.node("Flatten", {"gap"}, {"flat"});
    b.init("fc_w", random_tensor({classes, c}, seed++, DataType::kFloat32, -0.3, 0.3));
    b.init("fc_b", random_tensor({classes}, seed++));
    b.gemm_t({"flat", "fc_w", "fc_b"}, "fc");
    b.node("Softmax", {"fc"}, {"logits"});
  }
};

// Stem conv 7x7/2 + MaxPool 3x3/2 (pads 1), two bottleneck blocks (one downsampling with a projection
// shortcut), an AveragePool with ceil_mode, the classifier head: x [2, 3, 37, 41].
ir::Model resnet_like_model() {
  Net n;
  n.b.input("x", {2, 3, 37, 41}).output("logits");
  std::string y = n.conv_bn("x", 3, 16, 7, 2, 1, "Relu");
  ir::Node& mp = n.b.node("MaxPool", {y}, {"pool"});
  GB::set_ints(mp, "kernel_shape", {3, 3}), GB::set_ints(mp, "strides", {2, 2}), GB::set_ints(mp, "pads", {1, 1, 1, 1});
  std::string in = "pool";
  int64_t c = 16;
  for (int blk = 0; blk < 2; ++blk) {
    int64_t stride = blk == 1 ? 2 : 1, mid = 8, out = 32;
    std::string a = n.conv_bn(in, c, mid, 1, 1, 1, "Relu");
    std::string bb = n.conv_bn(a, mid, mid, 3, stride, 1, "Relu");
    std::string cc = n.conv_bn(bb, mid, out, 1, 1, 1, "");
    std::string shortcut = c != out || stride != 1 ? n.conv_bn(in, c, out, 1, stride, 1, "") : in;
    std::string sum = n.fresh("sum"), r = n.fresh("r");
    n.b.node("Add", {cc, shortcut}, {sum});
    n.b.node("Relu", {sum}, {r});
    in = r, c = out;
  }
  ir::Node& ap = n.b.node("AveragePool", {in}, {"avg"});
  GB::set_ints(ap, "kernel_shape", {2, 2}), GB::set_ints(ap, "strides", {2, 2}), GB::set_int(ap, "ceil_mode", 1);
  n.head("avg", c, 10);
  return n.b.finish();
}
std::string resnet_like_onnx() { return onnx_import::serialize_model(resnet_like_model()).value(); }

// MobileNetV2-like: stem 3x3/2, inverted residual blocks (1x1 expand + ReLU6, depthwise 3x3 + ReLU6,
// 1x1 project; a residual Add where the shape allows), the classifier head: x [2, 3, 33, 35].
std::string mobilenet_like_onnx() {
  Net n;
  n.b.input("x", {2, 3, 33, 35}).output("logits");
  n.b.init("zero", Tensor::scalar<float>(DataType::kFloat32, 0.f));
  n.b.init("six", Tensor::scalar<float>(DataType::kFloat32, 6.f));
  std::string in = n.conv_bn("x", 3, 8, 3, 2, 1, "Relu6");
  int64_t c = 8;
  const int64_t outs[] = {8, 12, 12}, strides[] = {1, 2, 1};
  for (int blk = 0; blk < 3; ++blk) {
    int64_t e = c * 3, out = outs[blk];
    std::string a = n.conv_bn(in, c, e, 1, 1, 1, "Relu6");
    std::string d = n.conv_bn(a, e, e, 3, strides[blk], e, "Relu6");
    std::string p = n.conv_bn(d, e, out, 1, 1, 1, "");
    if (strides[blk] == 1 && c == out) {
      std::string sum = n.fresh("sum");
      n.b.node("Add", {in, p}, {sum});
      p = sum;
    }
    in = p, c = out;
  }
  std::string last = n.conv_bn(in, c, 24, 1, 1, 1, "Relu6");
  n.head(last, 24, 7);
  return onnx_import::serialize_model(n.b.finish()).value();
}

// Builds `onnx` for cuda:0 with --strict-tactics (a layer left on a reference kernel fails the build),
// checks that no layer runs on the host and that the outputs match the CPU engine's, steady state too.
void expect_all_on_gpu(const std::string& onnx, const Dims& x_shape) {
  std::vector<std::string> warnings;
  BuilderConfig cfg;
  cfg.device = {DeviceKind::kCUDA, 0};
  cfg.strict_tactics = true;
  cfg.warn = [&warnings](const std::string& w) { warnings.push_back(w); };
  auto gpu_engine = Builder(cfg).build_from_memory(onnx);
  for (const auto& w : warnings) EXPECT_EQ(w.find("on the host"), std::string::npos) << w;
  int convs = 0, pools = 0;
  for (const auto& l : gpu_engine->impl().layers) {
    if (l.kernel == "reference") {
      EXPECT_TRUE(l.op_type == "Flatten" || l.op_type == "Reshape") << l.name << " (" << l.op_type << ") on the host";
      continue;
    }
    EXPECT_TRUE(l.kernel.find("cuda") != std::string::npos || l.kernel.find("cublaslt") != std::string::npos ||
                l.kernel.find("cudnn") != std::string::npos)
        << l.name << ": " << l.kernel;
    convs += l.kernel.rfind("conv_cudnn", 0) == 0;
    pools += l.kernel == "pool_cuda" || l.kernel == "global_pool_cuda";
  }
  EXPECT_GE(convs, 8);
  EXPECT_GE(pools, 1);
  BuilderConfig cpu_cfg;
  cpu_cfg.warn = [](const std::string&) {};
  auto cpu_engine = Builder(cpu_cfg).build_from_memory(onnx);
  Tensor x = random_tensor(x_shape, 44);
  auto want = testing::run_logits(*cpu_engine, x);
  auto ctx = gpu_engine->create_context();
  for (int run = 0; run < 3; ++run) {
    ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
    ctx->run();
    HostTensor y = ctx->output("logits");
    testing::expect_close(std::vector<float>(y.as<float>(), y.as<float>() + y.numel()), want);
  }
}

// The test networks themselves are valid models: they build and run on the CPU (no GPU needed).
TEST(CudaCnnEngine, TheTestNetworksRunOnTheCpu) {
  BuilderConfig cfg;
  cfg.warn = [](const std::string&) {};
  for (const auto& [onnx, shape] : {std::pair<std::string, Dims>{resnet_like_onnx(), {2, 3, 37, 41}},
                                    std::pair<std::string, Dims>{mobilenet_like_onnx(), {2, 3, 33, 35}}}) {
    auto e = Builder(cfg).build_from_memory(onnx);
    std::vector<float> y = testing::run_logits(*e, random_tensor(shape, 45));
    ASSERT_EQ(y.size() % 2, 0u);
    float sum = 0;
    for (size_t i = 0; i < y.size() / 2; ++i) sum += y[i];
    EXPECT_NEAR(sum, 1.f, 1e-4);
  }
}

// The pass pipeline for a CUDA float16 target on the ResNet-like network (no GPU needed): channels-last
// from the first conv to the global pool, one Transpose in and a Reshape out, the 1x1 unit-stride convs
// as matrix products; the optimized graph computes what the ONNX one does (reference interpreter).
TEST(CudaCnnEngine, ResNetLikePipelineGoesChannelsLastForCudaFp16) {
  ir::Model before = resnet_like_model();
  ir::Model after = testing::clone(before);
  Target t;
  t.device = {DeviceKind::kCUDA, 0};
  t.reduced_float = true;
  t.channels_last = true;  // what target_for resolves for a CUDA --fp16 build
  auto stats = passes::optimize(after, {}, t);
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  const ir::Graph& g = *after.graph;
  int nhwc_convs = 0, matmuls = 0, pools = 0, transposes = 0, plain_convs = 0;
  for (const auto& n : g.nodes) {
    nhwc_convs += n.op_type == "NhwcConv";
    matmuls += n.op_type == "FusedMatMul";
    pools += n.op_type == "NhwcPool";
    transposes += n.op_type == "Transpose";
    plain_convs += n.op_type == "Conv" || n.op_type == "FusedConv";
  }
  EXPECT_EQ(plain_convs, 0);
  EXPECT_EQ(nhwc_convs, 4);  // the stem, two 3x3s, the strided projection
  EXPECT_EQ(matmuls, 5);     // the unit-stride 1x1 convs
  EXPECT_EQ(pools, 3);
  EXPECT_EQ(transposes, 1);
  EXPECT_LT(testing::max_abs_diff(before, after), 1e-5);  // softmax probabilities
}

TEST(CudaCnnEngine, ResNetLikeRunsEveryLayerOnTheGpu) {
  KILN_SKIP_WITHOUT_GPU();
  expect_all_on_gpu(resnet_like_onnx(), {2, 3, 37, 41});
}

TEST(CudaCnnEngine, MobileNetLikeRunsEveryLayerOnTheGpu) {
  KILN_SKIP_WITHOUT_GPU();
  expect_all_on_gpu(mobilenet_like_onnx(), {2, 3, 33, 35});
}

// The ResNet-like network built --fp16 / --bf16 for cuda:0 with --strict-tactics: the layout pass
// keeps it channels-last (cuDNN NHWC convs, 1x1 convs on cuBLASLt, NHWC pools, one Transpose in and
// none out: the pooled [N, 1, 1, C] leaves as a Reshape), and the class probabilities match the
// float32 CPU engine's within the reduced format's rounding.
TEST(CudaCnnEngine, ResNetLikeRunsChannelsLastInReducedPrecision) {
  KILN_SKIP_WITHOUT_GPU();
  const std::string onnx = resnet_like_onnx();
  BuilderConfig cpu_cfg;
  cpu_cfg.warn = [](const std::string&) {};
  Tensor x = random_tensor({2, 3, 37, 41}, 46);
  auto want = testing::run_logits(*Builder(cpu_cfg).build_from_memory(onnx), x);
  for (Precision prec : {Precision::kFP16, Precision::kBF16}) {
    BuilderConfig cfg;
    cfg.device = {DeviceKind::kCUDA, 0};
    cfg.precision = prec;
    cfg.strict_tactics = true;
    cfg.warn = [](const std::string&) {};
    auto engine = Builder(cfg).build_from_memory(onnx);
    int nhwc_convs = 0, matmuls = 0, pools = 0, transposes = 0;
    for (const auto& l : engine->impl().layers) {
      nhwc_convs += l.kernel.rfind("conv_cudnn_nhwc", 0) == 0;
      matmuls += l.kernel.rfind("matmul_cublaslt", 0) == 0;
      pools += l.kernel == "pool_nhwc_cuda";
      transposes += l.op_type == "Transpose";
      EXPECT_NE(l.kernel.rfind("conv_cudnn_h", 0), 0u) << l.name << " runs NCHW";
    }
    EXPECT_GE(nhwc_convs, 4) << engine->inspect_json();  // the stem, the 3x3s, the strided projection
    EXPECT_GE(matmuls, 5) << engine->inspect_json();     // the unit-stride 1x1 convs and the classifier
    EXPECT_EQ(pools, 3) << engine->inspect_json();       // MaxPool, AveragePool, GlobalAveragePool
    EXPECT_EQ(transposes, 1) << engine->inspect_json();
    auto ctx = engine->create_context();
    for (int run = 0; run < 2; ++run) {
      ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
      ctx->run();
      HostTensor y = ctx->output("logits");
      ASSERT_EQ(y.numel(), static_cast<int64_t>(want.size()));
      // Probabilities in [0, 1] after ~10 layers of rounding: a few percent for bfloat16.
      const double tol = prec == Precision::kFP16 ? 1e-2 : 4e-2;
      for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(y.as<float>()[i], want[i], tol) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace kiln
