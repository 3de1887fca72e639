// Convolution, pooling and image/detection ops: exact values, shape inference on symbolic shapes,
// and error paths (bad attributes and inputs give a Status naming the problem, never a crash).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>

#include "ops/interpreter.h"
#include "ops/registry.h"

namespace kiln::ops {
namespace {

ir::Attribute ints_attr(std::vector<int64_t> v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kInts;
  a.ints = std::move(v);
  return a;
}
ir::Attribute int_attr(int64_t v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kInt;
  a.i = v;
  return a;
}
ir::Attribute float_attr(float v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kFloat;
  a.f = v;
  return a;
}
ir::Attribute string_attr(const std::string& v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kString;
  a.s = v;
  return a;
}

ir::Node make_node(const std::string& op, int opset, size_t n_inputs, std::map<std::string, ir::Attribute> attrs = {},
                   size_t n_outputs = 1) {
  ir::Node n;
  n.name = "n";
  n.op_type = op;
  n.opset = opset;
  for (size_t i = 0; i < n_inputs; ++i) n.inputs.push_back("in" + std::to_string(i));
  for (size_t i = 0; i < n_outputs; ++i) n.outputs.push_back("out" + std::to_string(i));
  n.attrs = std::move(attrs);
  return n;
}

// Runs the reference kernel; an undefined tensor marks a missing optional input.
Result<std::vector<Tensor>> run_all(const ir::Node& n, const std::vector<Tensor>& inputs) {
  const OpSchema* s = OpRegistry::get().find("", n.op_type, n.opset);
  if (!s) return NotFound("no schema for ", n.op_type, " opset ", n.opset);
  std::vector<Value> vals;
  for (const Tensor& t : inputs) vals.push_back(t.defined() ? Value(t) : Value());
  std::vector<const Value*> ptrs;
  for (const Value& v : vals) ptrs.push_back(v.is_none() ? nullptr : &v);
  auto r = run_node(n, *s, ptrs, nullptr);
  if (!r.ok()) return r.status();
  std::vector<Tensor> out;
  for (const Value& v : r.value()) out.push_back(v.tensor);
  return out;
}

Result<Tensor> run(const ir::Node& n, const std::vector<Tensor>& inputs) {
  auto r = run_all(n, inputs);
  if (!r.ok()) return r.status();
  return r.value()[0];
}

// Infers output types; `constants` gives build-time values of some inputs (nullptr otherwise).
Result<std::vector<ir::TypeInfo>> infer_all(const ir::Node& n, const std::vector<ir::TypeInfo>& inputs,
                                            std::vector<const Tensor*> constants = {}) {
  const OpSchema* s = OpRegistry::get().find("", n.op_type, n.opset);
  if (!s) return NotFound("no schema");
  InferContext ctx(n);
  int counter = 0;
  ctx.symbol_counter = &counter;
  for (const auto& t : inputs) ctx.inputs.push_back(&t);
  constants.resize(inputs.size(), nullptr);
  ctx.constants = constants;
  ctx.outputs.resize(n.outputs.size());
  KILN_RETURN_IF_ERROR(s->infer(ctx));
  return ctx.outputs;
}

Result<ir::TypeInfo> infer(const ir::Node& n, const std::vector<ir::TypeInfo>& inputs,
                           std::vector<const Tensor*> constants = {}) {
  auto r = infer_all(n, inputs, std::move(constants));
  if (!r.ok()) return r.status();
  return r.value()[0];
}

Tensor f32(Dims shape, std::vector<float> v) { return Tensor::from_vector<float>(DataType::kFloat32, shape, v); }
Tensor i64(Dims shape, std::vector<int64_t> v) { return Tensor::from_vector<int64_t>(DataType::kInt64, shape, v); }
Tensor iota(Dims shape, float start = 0) {
  Tensor t(DataType::kFloat32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = start + static_cast<float>(i);
  return t;
}

template <typename T>
std::vector<T> values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

ir::TypeInfo tensor_type(DataType dt, std::vector<Dim> dims) { return ir::TypeInfo::tensor(dt, SymShape(dims)); }
ir::TypeInfo f32_type(std::vector<Dim> dims) { return tensor_type(DataType::kFloat32, std::move(dims)); }

// Straightforward 2-D convolution (one group) for cross-checking the optimized loop.
std::vector<float> naive_conv2d(const Tensor& x, const Tensor& w, int64_t group, Dims strides, Dims pads,
                                Dims dilations, Dims out) {
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), M = w.dim(0), kH = w.dim(2), kW = w.dim(3);
  const int64_t cg = C / group, mg = M / group;
  std::vector<float> y;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t oh = 0; oh < out[0]; ++oh)
        for (int64_t ow = 0; ow < out[1]; ++ow) {
          double acc = 0;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t i = 0; i < kH; ++i)
              for (int64_t j = 0; j < kW; ++j) {
                int64_t ih = oh * strides[0] - pads[0] + i * dilations[0];
                int64_t iw = ow * strides[1] - pads[1] + j * dilations[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                int64_t ci = (m / mg) * cg + c;
                acc += static_cast<double>(x.data<float>()[((n * C + ci) * H + ih) * W + iw]) *
                       w.data<float>()[((m * cg + c) * kH + i) * kW + j];
              }
          y.push_back(static_cast<float>(acc));
        }
  return y;
}

// ---------------------------------------------------------------- Conv

TEST(Conv, SimpleValuesWithPadsAndBias) {
  // 1x1x3x3 input, 1x1x2x2 kernel of ones, pads 1 -> 4x4 output of window sums.
  ir::Node n = make_node("Conv", 11, 3, {{"pads", ints_attr({1, 1, 1, 1})}});
  Tensor y = run(n, {iota({1, 1, 3, 3}, 1), f32({1, 1, 2, 2}, {1, 1, 1, 1}), f32({1}, {100})}).value();
  EXPECT_EQ(y.shape(), (Dims{1, 1, 4, 4}));
  EXPECT_EQ(values<float>(y),
            (std::vector<float>{101, 103, 105, 103, 105, 112, 116, 109, 111, 124, 128, 115, 107, 115, 117, 109}));
}

TEST(Conv, MatchesNaiveLoopAcrossGeometries) {
  struct Case {
    Dims x, w;
    int64_t group;
    Dims strides, pads, dilations;
  };
  std::vector<Case> cases = {
      {{2, 4, 7, 6}, {6, 2, 3, 2}, 2, {1, 1}, {0, 0, 0, 0}, {1, 1}},
      {{1, 3, 9, 8}, {4, 3, 3, 3}, 1, {2, 2}, {1, 2, 1, 0}, {1, 1}},
      {{1, 4, 8, 8}, {4, 1, 3, 3}, 4, {1, 2}, {1, 1, 1, 1}, {2, 1}},  // depthwise, dilated
      {{1, 4, 5, 5}, {8, 1, 3, 3}, 4, {1, 1}, {2, 2, 2, 2}, {1, 1}},  // depthwise multiplier, big pads
      {{1, 3, 6, 7}, {5, 3, 1, 1}, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}},  // 1x1: flattened rows
      {{1, 2, 3, 3}, {2, 2, 3, 3}, 1, {3, 3}, {0, 0, 0, 0}, {1, 1}},  // one output pixel
  };
  for (const Case& c : cases) {
    Tensor x = iota(c.x, -3), w(DataType::kFloat32, c.w);
    for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = static_cast<float>((i * 7) % 5) - 2.0f;
    ir::Node n = make_node("Conv", 11, 2,
                           {{"group", int_attr(c.group)},
                            {"strides", ints_attr(c.strides)},
                            {"pads", ints_attr(c.pads)},
                            {"dilations", ints_attr(c.dilations)}});
    Tensor y = run(n, {x, w}).value();
    Dims out = {y.dim(2), y.dim(3)};
    for (int d = 0; d < 2; ++d) {
      int64_t ext = (c.w[d + 2] - 1) * c.dilations[d] + 1;
      EXPECT_EQ(out[d], (c.x[d + 2] + c.pads[d] + c.pads[d + 2] - ext) / c.strides[d] + 1);
    }
    EXPECT_EQ(values<float>(y), naive_conv2d(x, w, c.group, c.strides, c.pads, c.dilations, out));
  }
}

TEST(Conv, OneDAndThreeD) {
  // 1-D: [1,1,5] * [1,1,3] of (1,0,-1), pads 1.
  Tensor y1 =
      run(make_node("Conv", 11, 2, {{"pads", ints_attr({1, 1})}}), {iota({1, 1, 5}), f32({1, 1, 3}, {1, 0, -1})})
          .value();
  EXPECT_EQ(values<float>(y1), (std::vector<float>{-1, -2, -2, -2, 3}));
  // 3-D: a 2x2x2 kernel of ones over a 3x3x3 iota sums each 2x2x2 cube.
  Tensor y3 =
      run(make_node("Conv", 11, 2), {iota({1, 1, 3, 3, 3}), f32({1, 1, 2, 2, 2}, {1, 1, 1, 1, 1, 1, 1, 1})}).value();
  EXPECT_EQ(y3.shape(), (Dims{1, 1, 2, 2, 2}));
  // cube at origin: 0+1+3+4+9+10+12+13 = 52; each step in w/h/d adds 8/24/72.
  EXPECT_EQ(values<float>(y3), (std::vector<float>{52, 60, 76, 84, 124, 132, 148, 156}));
}

TEST(Conv, AutoPadSameLowerAndUpper) {
  for (const char* mode : {"SAME_UPPER", "SAME_LOWER"}) {
    ir::Node n = make_node("Conv", 11, 2, {{"auto_pad", string_attr(mode)}, {"strides", ints_attr({2})}});
    // in 4, k 2, s 2: out 2, total pad 0 ; in 5, k 2, s 2: out 3, total pad 1.
    Tensor y = run(n, {iota({1, 1, 5}, 1), f32({1, 1, 2}, {1, 10})}).value();
    ASSERT_EQ(y.shape(), (Dims{1, 1, 3}));
    if (std::string(mode) == "SAME_UPPER")  // pad at the end: windows (1,2), (3,4), (5,0)
      EXPECT_EQ(values<float>(y), (std::vector<float>{21, 43, 5}));
    else  // pad at the start: (0,1), (2,3), (4,5)
      EXPECT_EQ(values<float>(y), (std::vector<float>{10, 32, 54}));
  }
}

TEST(Conv, InfersSymbolicShapes) {
  ir::Node n = make_node("Conv", 11, 2, {{"strides", ints_attr({2, 2})}, {"pads", ints_attr({3, 3, 3, 3})}});
  auto t = infer(n, {f32_type({Dim::symbol("N"), 3, 224, Dim::symbol("W")}), f32_type({64, 3, 7, 7})}).value();
  EXPECT_EQ(t.shape.str(), SymShape({Dim::symbol("N"), 64, 112, Dim()}).str());
  ir::Node same = make_node("Conv", 11, 2, {{"auto_pad", string_attr("SAME_UPPER")}, {"strides", ints_attr({3})}});
  EXPECT_EQ(infer(same, {f32_type({1, 2, 10}), f32_type({4, 2, 5})}).value().shape.str(), "[1,4,4]");
  // Unknown ranks stay unknown; W's rank gives the rank when X's is unknown.
  auto u = infer(n, {ir::TypeInfo::tensor(DataType::kFloat32), f32_type({8, 3, 3, 3})}).value();
  EXPECT_EQ(u.shape.rank(), 4u);
  EXPECT_EQ(u.shape.dims[1].value, 8);
}

TEST(Conv, ErrorsNameTheProblem) {
  ir::Node n = make_node("Conv", 11, 2);
  auto r = run(n, {iota({1, 3, 5, 5}), iota({2, 2, 3, 3})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("channels"), std::string::npos) << r.status().message();
  auto big = run(n, {iota({1, 1, 2, 2}), iota({1, 1, 3, 3})});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("kernel"), std::string::npos) << big.status().message();
  ir::Node bad_pad = make_node("Conv", 11, 2, {{"pads", ints_attr({1, 1})}});
  auto p = run(bad_pad, {iota({1, 1, 4, 4}), iota({1, 1, 3, 3})});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("pads"), std::string::npos);
  ir::Node bad_auto = make_node("Conv", 11, 2, {{"auto_pad", string_attr("SAME")}});
  EXPECT_FALSE(run(bad_auto, {iota({1, 1, 4, 4}), iota({1, 1, 3, 3})}).ok());
  ir::Node neg = make_node("Conv", 11, 2, {{"strides", ints_attr({0, 1})}});
  EXPECT_FALSE(run(neg, {iota({1, 1, 4, 4}), iota({1, 1, 3, 3})}).ok());
  EXPECT_FALSE(infer(n, {f32_type({1, 3, 5, 5}), f32_type({2, 2, 3, 3})}).ok());  // definite channel mismatch
  EXPECT_FALSE(run(n, {iota({4, 4}), iota({1, 1})}).ok());                        // rank < 3
}

TEST(Conv, Float16ComputesInFloat32) {
  Tensor x = iota({1, 1, 2, 2}).cast(DataType::kFloat16).value();
  Tensor w = f32({1, 1, 1, 1}, {0.5f}).cast(DataType::kFloat16).value();
  Tensor y = run(make_node("Conv", 11, 2), {x, w}).value();
  EXPECT_EQ(y.dtype(), DataType::kFloat16);
  EXPECT_EQ(y.get_f64(3), 1.5);
}

// ---------------------------------------------------------------- ConvTranspose / quantized

TEST(ConvTranspose, StridesOutputPaddingAndShape) {
  // x [1,1,2] = (1, 2), w [1,1,2] = (1, 10), stride 2: y = (1, 10, 2, 20); output_padding 1 adds a 0.
  ir::Node n = make_node("ConvTranspose", 11, 2, {{"strides", ints_attr({2})}, {"output_padding", ints_attr({1})}});
  Tensor y = run(n, {f32({1, 1, 2}, {1, 2}), f32({1, 1, 2}, {1, 10})}).value();
  EXPECT_EQ(values<float>(y), (std::vector<float>{1, 10, 2, 20, 0}));
  ir::Node os = make_node("ConvTranspose", 11, 2, {{"strides", ints_attr({2})}, {"output_shape", ints_attr({3})}});
  // full extent 4, output 3: total pad 1 goes to the start (NOTSET/SAME_LOWER rule).
  EXPECT_EQ(values<float>(run(os, {f32({1, 1, 2}, {1, 2}), f32({1, 1, 2}, {1, 10})}).value()),
            (std::vector<float>{10, 2, 20}));
  auto t = infer(n, {f32_type({Dim::symbol("B"), 1, 7}), f32_type({1, 3, 2})}).value();
  EXPECT_EQ(t.shape.str(), SymShape({Dim::symbol("B"), 3, 15}).str());
}

TEST(ConvInteger, ZeroPointsPerChannel) {
  Tensor x = Tensor::from_vector<uint8_t>(DataType::kUInt8, {1, 1, 2, 2}, {2, 3, 4, 5});
  Tensor w = Tensor::from_vector<uint8_t>(DataType::kUInt8, {2, 1, 1, 1}, {3, 7});
  Tensor xz = Tensor::from_vector<uint8_t>(DataType::kUInt8, {}, {1});
  Tensor wz = Tensor::from_vector<uint8_t>(DataType::kUInt8, {2}, {1, 5});
  Tensor y = run(make_node("ConvInteger", 10, 4), {x, w, xz, wz}).value();
  EXPECT_EQ(y.dtype(), DataType::kInt32);
  EXPECT_EQ(values<int32_t>(y), (std::vector<int32_t>{2, 4, 6, 8, 2, 4, 6, 8}));
}

TEST(QLinearConv, RequantizesWithRoundingHalfToEven) {
  Tensor x = Tensor::from_vector<uint8_t>(DataType::kUInt8, {1, 1, 1, 4}, {1, 3, 5, 7});
  Tensor w = Tensor::from_vector<uint8_t>(DataType::kUInt8, {1, 1, 1, 1}, {1});
  auto s = [](float v) { return f32({}, {v}); };
  Tensor zp = Tensor::from_vector<uint8_t>(DataType::kUInt8, {}, {0});
  // y = x * 1 * (1 * 1 / 2) + 0: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 3.5 -> 4.
  Tensor y = run(make_node("QLinearConv", 10, 8), {x, s(1), zp, w, s(1), zp, s(2), zp}).value();
  EXPECT_EQ(values<uint8_t>(y), (std::vector<uint8_t>{0, 2, 2, 4}));
}

// ---------------------------------------------------------------- Pooling

TEST(Pool, MaxPoolIndicesRowAndColumnMajor) {
  // 3x3 iota, kernel 2, stride 1: maxima at the bottom-right of each window.
  for (int64_t order : {0, 1}) {
    ir::Node n =
        make_node("MaxPool", 12, 1, {{"kernel_shape", ints_attr({2, 2})}, {"storage_order", int_attr(order)}}, 2);
    auto r = run_all(n, {iota({1, 1, 3, 3})}).value();
    EXPECT_EQ(values<float>(r[0]), (std::vector<float>{4, 5, 7, 8}));
    std::vector<int64_t> want = order == 0 ? std::vector<int64_t>{4, 5, 7, 8} : std::vector<int64_t>{4, 7, 5, 8};
    EXPECT_EQ(values<int64_t>(r[1]), want);
  }
}

TEST(Pool, AveragePoolCountIncludePadAndCeil) {
  std::map<std::string, ir::Attribute> a = {
      {"kernel_shape", ints_attr({2})}, {"pads", ints_attr({1, 1})}, {"strides", ints_attr({2})}};
  // x = (1, 2, 3): windows [pad,1], [2,3], [pad... out = floor((3+2-2)/2)+1 = 2 windows: [p,1], [2,3].
  Tensor excl = run(make_node("AveragePool", 11, 1, a), {f32({1, 1, 3}, {1, 2, 3})}).value();
  EXPECT_EQ(values<float>(excl), (std::vector<float>{1, 2.5f}));
  a["count_include_pad"] = int_attr(1);
  Tensor incl = run(make_node("AveragePool", 11, 1, a), {f32({1, 1, 3}, {1, 2, 3})}).value();
  EXPECT_EQ(values<float>(incl), (std::vector<float>{0.5f, 2.5f}));
  // ceil_mode: a last, partial window over [3] only (no padding at the end): in 3, k 2, s 2.
  std::map<std::string, ir::Attribute> c = {{"kernel_shape", ints_attr({2})},
                                            {"strides", ints_attr({2})},
                                            {"ceil_mode", int_attr(1)},
                                            {"count_include_pad", int_attr(1)}};
  Tensor ceil = run(make_node("AveragePool", 11, 1, c), {f32({1, 1, 3}, {1, 2, 3})}).value();
  EXPECT_EQ(values<float>(ceil), (std::vector<float>{1.5f, 3}));
}

TEST(Pool, LpPoolAndGlobals) {
  Tensor lp = run(make_node("LpPool", 11, 1, {{"kernel_shape", ints_attr({2})}, {"p", int_attr(2)}}),
                  {f32({1, 1, 3}, {3, 4, 0})})
                  .value();
  EXPECT_EQ(values<float>(lp), (std::vector<float>{5, 4}));
  // Opset 1 stores p as a float.
  Tensor lp1 = run(make_node("GlobalLpPool", 1, 1, {{"p", float_attr(1.0f)}}), {f32({1, 1, 3}, {-1, 2, -3})}).value();
  EXPECT_EQ(values<float>(lp1), (std::vector<float>{6}));
  Tensor avg = run(make_node("GlobalAveragePool", 1, 1), {iota({1, 2, 2, 2})}).value();
  EXPECT_EQ(avg.shape(), (Dims{1, 2, 1, 1}));
  EXPECT_EQ(values<float>(avg), (std::vector<float>{1.5f, 5.5f}));
  Tensor mx = run(make_node("GlobalMaxPool", 1, 1), {iota({1, 2, 2, 2})}).value();
  EXPECT_EQ(values<float>(mx), (std::vector<float>{3, 7}));
}

TEST(Pool, InferenceAndErrors) {
  ir::Node n =
      make_node("MaxPool", 12, 1,
                {{"kernel_shape", ints_attr({3, 3})}, {"strides", ints_attr({2, 2})}, {"ceil_mode", int_attr(1)}}, 2);
  auto t = infer_all(n, {f32_type({Dim::symbol("N"), 64, 112, 111})}).value();
  EXPECT_EQ(t[0].shape.str(), SymShape({Dim::symbol("N"), 64, 56, 55}).str());
  EXPECT_EQ(t[1].elem, DataType::kInt64);
  ir::Node no_kernel = make_node("AveragePool", 11, 1);
  auto r = run(no_kernel, {iota({1, 1, 4, 4})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("kernel_shape"), std::string::npos);
  ir::Node wrong_len = make_node("MaxPool", 12, 1, {{"kernel_shape", ints_attr({2, 2, 2})}});
  EXPECT_FALSE(run(wrong_len, {iota({1, 1, 4, 4})}).ok());
  EXPECT_FALSE(infer(wrong_len, {f32_type({1, 1, 4, 4})}).ok());
}

TEST(Pool, MaxUnpoolScattersAndRejectsBadIndices) {
  ir::Node n = make_node("MaxUnpool", 11, 2, {{"kernel_shape", ints_attr({2})}, {"strides", ints_attr({2})}});
  Tensor y = run(n, {f32({1, 1, 2}, {5, 6}), i64({1, 1, 2}, {1, 2})}).value();
  EXPECT_EQ(values<float>(y), (std::vector<float>{0, 5, 6, 0}));
  auto bad = run(n, {f32({1, 1, 2}, {5, 6}), i64({1, 1, 2}, {1, 9})});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("index 9"), std::string::npos) << bad.status().message();
}

// ---------------------------------------------------------------- Resize / Upsample

TEST(Resize, NearestLinearCubicValues) {
  ir::Node nearest = make_node("Resize", 13, 3, {{"mode", string_attr("nearest")}});
  Tensor x = f32({1, 1, 1, 2}, {1, 2});
  Tensor scales = f32({4}, {1, 1, 1, 2});
  EXPECT_EQ(values<float>(run(nearest, {x, Tensor(), scales}).value()), (std::vector<float>{1, 1, 2, 2}));
  ir::Node linear = make_node("Resize", 13, 3, {{"mode", string_attr("linear")}});
  // half_pixel: x_ori = (x + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25 (clamped at the edges).
  EXPECT_EQ(values<float>(run(linear, {x, Tensor(), scales}).value()), (std::vector<float>{1, 1.25f, 1.75f, 2}));
  ir::Node align =
      make_node("Resize", 13, 3,
                {{"mode", string_attr("linear")}, {"coordinate_transformation_mode", string_attr("align_corners")}});
  Tensor s3 = f32({4}, {1, 1, 1, 2});
  Tensor x3 = f32({1, 1, 1, 2}, {0, 3});
  EXPECT_EQ(values<float>(run(align, {x3, Tensor(), s3}).value()), (std::vector<float>{0, 1, 2, 3}));
  // Cubic on a linear ramp reproduces the ramp in the interior.
  ir::Node cubic = make_node(
      "Resize", 13, 3, {{"mode", string_attr("cubic")}, {"coordinate_transformation_mode", string_attr("asymmetric")}});
  Tensor ramp = f32({1, 1, 1, 8}, {0, 1, 2, 3, 4, 5, 6, 7});
  Tensor y = run(cubic, {ramp, Tensor(), f32({4}, {1, 1, 1, 2})}).value();
  EXPECT_NEAR(y.get_f64(5), 2.5, 1e-6);
  EXPECT_NEAR(y.get_f64(7), 3.5, 1e-6);
}

TEST(Resize, SizesAxesAndIntegerRounding) {
  ir::Node n = make_node("Resize", 18, 4, {{"mode", string_attr("linear")}, {"axes", ints_attr({-1})}});
  Tensor x = Tensor::from_vector<uint8_t>(DataType::kUInt8, {1, 2}, {10, 21});
  Tensor y = run(n, {x, Tensor(), Tensor(), i64({1}, {4})}).value();
  EXPECT_EQ(y.dtype(), DataType::kUInt8);
  // 10 + 11 * (0.25, 0.75) = 12.75, 18.25 -> 13, 18
  EXPECT_EQ(values<uint8_t>(y), (std::vector<uint8_t>{10, 13, 18, 21}));
  ir::Node both = make_node("Resize", 13, 4);
  EXPECT_FALSE(run(both, {iota({1, 2}), Tensor(), f32({2}, {1, 2}), i64({2}, {1, 4})}).ok());
  ir::Node bad_axes = make_node("Resize", 18, 4, {{"axes", ints_attr({5})}});
  EXPECT_FALSE(run(bad_axes, {iota({1, 2}), Tensor(), Tensor(), i64({1}, {4})}).ok());
  EXPECT_FALSE(run(make_node("Resize", 13, 3), {iota({1, 2}), Tensor(), f32({2}, {1, -2})}).ok());
}

TEST(Resize, NearestIsExactForInt64AndExtrapolates) {
  const int64_t big = (int64_t{1} << 60) + 1;  // not representable in a double
  Tensor y = run(make_node("Resize", 13, 3, {{"mode", string_attr("nearest")}}),
                 {i64({1, 2}, {big, -big}), Tensor(), f32({2}, {1, 2})})
                 .value();
  EXPECT_EQ(values<int64_t>(y), (std::vector<int64_t>{big, big, -big, -big}));
  // tf_crop_and_resize: an roi reaching outside the input yields extrapolation_value there.
  ir::Node crop = make_node("Resize", 13, 4,
                            {{"mode", string_attr("nearest")},
                             {"coordinate_transformation_mode", string_attr("tf_crop_and_resize")},
                             {"extrapolation_value", float_attr(-1.0f)}});
  Tensor c = run(crop, {f32({1, 3}, {1, 2, 3}), f32({4}, {0, 0, 1, 2}), Tensor(), i64({2}, {1, 3})}).value();
  // x_ori = 0, 2, 4 along the last axis: the last is outside [0, 2].
  EXPECT_EQ(values<float>(c), (std::vector<float>{1, 3, -1}));
}

TEST(Resize, InfersFromConstantScalesAndSizes) {
  Tensor scales = f32({4}, {1, 1, 2, 2});
  auto t = infer(make_node("Resize", 13, 3),
                 {f32_type({Dim::symbol("N"), 3, 10, Dim::symbol("W")}), ir::TypeInfo::tensor(DataType::kFloat32),
                  f32_type({4})},
                 {nullptr, nullptr, &scales})
               .value();
  EXPECT_EQ(t.shape.dims[0].param, "N");
  EXPECT_EQ(t.shape.dims[1].value, 3);
  EXPECT_EQ(t.shape.dims[2].value, 20);
  EXPECT_FALSE(t.shape.dims[3].known());
  // Data-dependent sizes: rank known, resized dims are fresh symbols.
  auto u =
      infer(make_node("Resize", 13, 4), {f32_type({1, 3, 10, 10}), ir::TypeInfo::tensor(DataType::kFloat32),
                                         ir::TypeInfo::tensor(DataType::kFloat32), tensor_type(DataType::kInt64, {4})})
          .value();
  EXPECT_EQ(u.shape.rank(), 4u);
  EXPECT_FALSE(u.shape.dims[2].known());
  Tensor sizes = i64({2}, {7, 9});
  auto v = infer(make_node("Resize", 18, 4, {{"axes", ints_attr({2, 3})}}),
                 {f32_type({1, 3, 10, 10}), ir::TypeInfo::tensor(DataType::kFloat32),
                  ir::TypeInfo::tensor(DataType::kFloat32), tensor_type(DataType::kInt64, {2})},
                 {nullptr, nullptr, nullptr, &sizes})
               .value();
  EXPECT_EQ(v.shape.str(), "[1,3,7,9]");
}

TEST(Upsample, AttributeAndInputScales) {
  ir::Node v7 = make_node("Upsample", 7, 1, {{"scales", ir::Attribute{}}});
  v7.attrs["scales"].type = ir::Attribute::Type::kFloats;
  v7.attrs["scales"].floats = {1, 1, 2};
  EXPECT_EQ(values<float>(run(v7, {f32({1, 1, 2}, {1, 2})}).value()), (std::vector<float>{1, 1, 2, 2}));
  ir::Node v9 = make_node("Upsample", 9, 2, {{"mode", string_attr("linear")}});
  // asymmetric linear: x_ori = x / 2 -> 0, 0.5, 1, 1.5 (clamped)
  EXPECT_EQ(values<float>(run(v9, {f32({1, 1, 2}, {1, 3}), f32({3}, {1, 1, 2})}).value()),
            (std::vector<float>{1, 2, 3, 3}));
}

// ---------------------------------------------------------------- GridSample / AffineGrid

TEST(GridSample, IdentityGridReproducesInput) {
  // AffineGrid with the identity theta gives pixel-center coordinates; sampling them is exact.
  Tensor theta = f32({1, 2, 3}, {1, 0, 0, 0, 1, 0});
  Tensor grid = run(make_node("AffineGrid", 20, 2), {theta, i64({4}, {1, 1, 3, 4})}).value();
  EXPECT_EQ(grid.shape(), (Dims{1, 3, 4, 2}));
  EXPECT_NEAR(grid.get_f64(0), -0.75, 1e-6);  // x of pixel (0, 0)
  EXPECT_NEAR(grid.get_f64(1), -2.0 / 3, 1e-6);
  Tensor x = iota({1, 1, 3, 4});
  for (const char* mode : {"linear", "nearest", "cubic"}) {
    Tensor y = run(make_node("GridSample", 20, 2, {{"mode", string_attr(mode)}}), {x, grid}).value();
    ASSERT_EQ(y.shape(), (Dims{1, 1, 3, 4}));
    for (int64_t i = 0; i < y.numel(); ++i) EXPECT_NEAR(y.get_f64(i), x.get_f64(i), 1e-5) << mode << " " << i;
  }
}

TEST(GridSample, PaddingModes) {
  Tensor x = f32({1, 1, 1, 2}, {1, 2});
  Tensor grid = f32({1, 1, 1, 2}, {3.0f, 0.0f});  // far right of the 2-pixel row
  auto sample = [&](const char* pad) {
    return run(make_node("GridSample", 16, 2, {{"padding_mode", string_attr(pad)}, {"align_corners", int_attr(1)}}),
               {x, grid})
        .value()
        .get_f64(0);
  };
  EXPECT_EQ(sample("zeros"), 0.0);
  EXPECT_EQ(sample("border"), 2.0);
  EXPECT_EQ(sample("reflection"), 1.0);  // 2 reflected about [0, 1] -> 0
  auto bad = run(make_node("GridSample", 16, 2), {x, f32({1, 1, 1, 3}, {0, 0, 0})});
  EXPECT_FALSE(bad.ok());
}

// ---------------------------------------------------------------- Detection

TEST(RoiAlign, AverageOfConstantIsConstantAndBadBatchIndexFails) {
  Tensor x(DataType::kFloat32, {1, 2, 4, 4});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = i < 16 ? 3.0f : 5.0f;
  ir::Node n = make_node("RoiAlign", 16, 3, {{"output_height", int_attr(2)}, {"output_width", int_attr(2)}});
  Tensor y = run(n, {x, f32({1, 4}, {1, 1, 3, 3}), i64({1}, {0})}).value();
  EXPECT_EQ(y.shape(), (Dims{1, 2, 2, 2}));
  for (int64_t i = 0; i < 8; ++i) EXPECT_NEAR(y.get_f64(i), i < 4 ? 3.0 : 5.0, 1e-6);
  auto bad = run(n, {x, f32({1, 4}, {1, 1, 3, 3}), i64({1}, {1})});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("batch index 1"), std::string::npos);
}

TEST(NonMaxSuppression, SuppressesOverlapsPerClass) {
  // Boxes [y1, x1, y2, x2]: 0 and 1 overlap heavily, 2 is apart.
  Tensor boxes = f32({1, 3, 4}, {0, 0, 1, 1, 0, 0.1f, 1, 1.1f, 5, 5, 6, 6});
  Tensor scores = f32({1, 1, 3}, {0.8f, 0.9f, 0.5f});
  ir::Node n = make_node("NonMaxSuppression", 11, 5);
  Tensor sel = run(n, {boxes, scores, i64({1}, {10}), f32({1}, {0.5f}), f32({1}, {0.0f})}).value();
  EXPECT_EQ(sel.shape(), (Dims{2, 3}));
  EXPECT_EQ(values<int64_t>(sel), (std::vector<int64_t>{0, 0, 1, 0, 0, 2}));
  // Missing max_output_boxes_per_class selects nothing.
  EXPECT_EQ(run(n, {boxes, scores}).value().shape(), (Dims{0, 3}));
  auto t = infer(n, {f32_type({1, 3, 4}), f32_type({1, 1, 3})}).value();
  EXPECT_EQ(t.elem, DataType::kInt64);
  EXPECT_EQ(t.shape.dims[1].value, 3);
  EXPECT_FALSE(t.shape.dims[0].known());
  EXPECT_FALSE(run(n, {boxes, f32({1, 1, 2}, {1, 2})}).ok());
}

// The kernel compares a candidate only with kept boxes near it on x: it must select exactly what
// comparing with every kept box selects. Random boxes (corner order swapped at random, center format,
// zero and huge widths) and torchvision's batched layout: one class per block of coordinates.
TEST(NonMaxSuppression, SameAsComparingWithEveryKeptBox) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  auto brute = [](const Tensor& boxes, const Tensor& scores, int64_t max_out, double iou, double smin, bool center) {
    std::vector<int64_t> sel;
    const int64_t B = boxes.dim(0), K = scores.dim(1), S = boxes.dim(1);
    auto box = [&](int64_t b, int64_t i) {
      double v[4];
      for (int j = 0; j < 4; ++j) v[j] = boxes.get_f64((b * S + i) * 4 + j);
      if (center) return std::array<double, 4>{v[0] - v[2] / 2, v[0] + v[2] / 2, v[1] - v[3] / 2, v[1] + v[3] / 2};
      return std::array<double, 4>{std::min(v[1], v[3]), std::max(v[1], v[3]), std::min(v[0], v[2]),
                                   std::max(v[0], v[2])};
    };
    auto sup = [&](const std::array<double, 4>& p, const std::array<double, 4>& q) {
      double ix = std::min(p[1], q[1]) - std::max(p[0], q[0]), iy = std::min(p[3], q[3]) - std::max(p[2], q[2]);
      if (!(ix > 0) || !(iy > 0)) return false;
      double inter = ix * iy, a1 = (p[1] - p[0]) * (p[3] - p[2]), a2 = (q[1] - q[0]) * (q[3] - q[2]);
      double uni = a1 + a2 - inter;
      if (!(a1 > 0) || !(a2 > 0) || !(uni > 0)) return false;
      return inter / uni > iou;
    };
    for (int64_t b = 0; b < B; ++b)
      for (int64_t k = 0; k < K; ++k) {
        std::vector<int64_t> order;
        for (int64_t i = 0; i < S; ++i)
          if (scores.get_f64((b * K + k) * S + i) > smin) order.push_back(i);
        std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
          return scores.get_f64((b * K + k) * S + p) > scores.get_f64((b * K + k) * S + q);
        });
        std::vector<std::array<double, 4>> kept;
        for (int64_t i : order) {
          if (static_cast<int64_t>(kept.size()) >= max_out) break;
          auto c = box(b, i);
          bool keep = true;
          for (const auto& q : kept) keep &= !sup(c, q);
          if (!keep) continue;
          kept.push_back(c);
          sel.insert(sel.end(), {b, k, i});
        }
      }
    return sel;
  };
  int selected_total = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const bool center = trial % 3 == 2, batched = trial % 2 == 0;
    const int64_t B = 1 + trial % 2, K = batched ? 1 : 1 + trial % 3, S = 37 + 53 * (trial % 5);
    const int64_t classes = 7;
    Tensor boxes(DataType::kFloat32, {B, S, 4}), scores(DataType::kFloat32, {B, K, S});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < S; ++i) {
        // batched: class c's boxes live in [c * 101, c * 101 + 100], as torchvision offsets them.
        double off = batched ? 101.0 * static_cast<double>(rng() % classes) : 0;
        double x = off + 90 * u(rng), y = off + 90 * u(rng);
        double w = trial == 5 ? 0 : (i % 17 == 0 ? 400 : 25 * u(rng)), h = 25 * u(rng);
        float* p = boxes.data<float>() + (b * S + i) * 4;
        if (center) {
          p[0] = static_cast<float>(x), p[1] = static_cast<float>(y), p[2] = static_cast<float>(w);
          p[3] = static_cast<float>(h);
        } else if (i % 2) {
          p[0] = static_cast<float>(y), p[1] = static_cast<float>(x), p[2] = static_cast<float>(y + h);
          p[3] = static_cast<float>(x + w);
        } else {  // corners in the other order
          p[0] = static_cast<float>(y + h), p[1] = static_cast<float>(x + w), p[2] = static_cast<float>(y);
          p[3] = static_cast<float>(x);
        }
      }
    for (int64_t i = 0; i < scores.numel(); ++i) scores.data<float>()[i] = static_cast<float>(u(rng));
    const int64_t max_out = trial % 4 == 3 ? 5 : 100000;
    const float iou = trial % 4 == 1 ? 0.0f : 0.5f, smin = trial % 3 == 1 ? 0.3f : 0.0f;
    ir::Node n = make_node("NonMaxSuppression", 11, 5, {{"center_point_box", int_attr(center ? 1 : 0)}});
    Tensor sel = run(n, {boxes, scores, i64({1}, {max_out}), f32({1}, {iou}), f32({1}, {smin})}).value();
    std::vector<int64_t> want = brute(boxes, scores, max_out, iou, smin, center);
    ASSERT_EQ(values<int64_t>(sel), want) << "trial " << trial;
    selected_total += static_cast<int>(want.size() / 3);
  }
  EXPECT_GT(selected_total, 200);  // the cases select boxes (and suppress others: iou 0.5 on overlaps)
}

TEST(DeformConv, ZeroOffsetsEqualConv) {
  Tensor x = iota({1, 2, 4, 4}), w(DataType::kFloat32, {3, 2, 2, 2});
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = static_cast<float>(i % 3) - 1;
  Tensor conv = run(make_node("Conv", 11, 2), {x, w}).value();
  Tensor offset(DataType::kFloat32, {1, 8, 3, 3});
  Tensor y = run(make_node("DeformConv", 19, 3), {x, w, offset}).value();
  EXPECT_EQ(values<float>(y), values<float>(conv));
  // A whole-pixel offset of +1 in x shifts the sampling window right.
  for (int64_t i = 0; i < offset.numel(); ++i) offset.data<float>()[i] = (i / 9) % 2 == 1 ? 1.0f : 0.0f;
  Tensor shifted = run(make_node("DeformConv", 19, 3), {x, w, offset}).value();
  EXPECT_EQ(shifted.get_f64(0), conv.get_f64(1));
  EXPECT_FALSE(run(make_node("DeformConv", 19, 3), {x, w, Tensor(DataType::kFloat32, {1, 8, 2, 2})}).ok());
}

TEST(CausalConvWithState, StreamingEqualsWholeSequence) {
  Tensor w = f32({1, 1, 3}, {1, 2, 3});
  ir::Node n = make_node("CausalConvWithState", 27, 4, {}, 2);
  auto whole = run_all(n, {f32({1, 1, 4}, {1, 2, 3, 4}), w, Tensor(), Tensor()}).value();
  // out[t] = x[t-2] + 2 x[t-1] + 3 x[t] with zeros before the start.
  EXPECT_EQ(values<float>(whole[0]), (std::vector<float>{3, 8, 14, 20}));
  EXPECT_EQ(values<float>(whole[1]), (std::vector<float>{3, 4}));
  auto first = run_all(n, {f32({1, 1, 2}, {1, 2}), w, Tensor(), Tensor()}).value();
  auto second = run_all(n, {f32({1, 1, 2}, {3, 4}), w, Tensor(), first[1]}).value();
  EXPECT_EQ(values<float>(second[0]), (std::vector<float>{14, 20}));
}

}  // namespace
}  // namespace kiln::ops
