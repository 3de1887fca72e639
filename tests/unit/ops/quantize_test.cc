// QuantizeLinear / DequantizeLinear granularities and types, DynamicQuantizeLinear,
// QLinearMatMul: exact values, shape inference, error paths.
#include "cf_test_util.h"

namespace kiln::ops {
namespace {

using namespace cftest;  // NOLINT

Tensor u8(std::vector<uint8_t> v, Dims shape) { return Tensor::from_vector<uint8_t>(DataType::kUInt8, shape, v); }
Tensor typed(DataType dt, std::vector<int64_t> v, Dims shape) {
  Tensor t(dt, shape);
  for (size_t i = 0; i < v.size(); ++i) t.set_i64(static_cast<int64_t>(i), v[i]);
  return t;
}

TEST(QuantizeLinear, PerTensorRoundsHalfToEvenAndSaturates) {
  Tensor y = run1(make_node("QuantizeLinear", {"x", "s", "z"}, {"y"}),
                  {f32({0, 2, 3, 5, -1000, 1000}), Tensor::scalar<float>(DataType::kFloat32, 2), u8({10}, {})});
  EXPECT_EQ(y.dtype(), DataType::kUInt8);
  // 1 -> 11, 1.5 -> 2 -> 12, 2.5 -> 2 -> 12 (ties to even), saturation at 0 and 255.
  EXPECT_EQ(values(y), (std::vector<double>{10, 11, 12, 12, 0, 255}));
}

TEST(QuantizeLinear, DefaultTypeIsUint8AndOutputDtypeSelectsOthers) {
  Tensor s = Tensor::scalar<float>(DataType::kFloat32, 1);
  EXPECT_EQ(run1(make_node("QuantizeLinear", {"x", "s"}, {"y"}), {f32({300}), s}).dtype(), DataType::kUInt8);
  Tensor y = run1(make_node("QuantizeLinear", {"x", "s"}, {"y"}, 21,
                            {{"output_dtype", int_attr(static_cast<int64_t>(DataType::kInt4))}}),
                  {f32({-20, -8, 7, 20}), s});
  EXPECT_EQ(y.dtype(), DataType::kInt4);
  EXPECT_EQ(values(y), (std::vector<double>{-8, -8, 7, 7}));
  auto bad = run(make_node("QuantizeLinear", {"x", "s", "z"}, {"y"}, 21,
                           {{"output_dtype", int_attr(static_cast<int64_t>(DataType::kInt8))}}),
                 {f32({1}), s, u8({0}, {})});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status().message(), "disagrees")) << bad.status().to_string();
}

TEST(QuantizeLinear, PerAxisAndBlocked) {
  // Per axis 1 of [2, 2]: column scales 1 and 10.
  Tensor y = run1(make_node("QuantizeLinear", {"x", "s"}, {"y"}, 21, {{"axis", int_attr(1)}}),
                  {f32({10, 100, 20, 200}, {2, 2}), f32({1, 10})});
  EXPECT_EQ(values(y), (std::vector<double>{10, 10, 20, 20}));
  // Blocks of 2 along axis 1 of [1, 5] (the last block is partial): scales 1, 2, 4.
  Tensor b =
      run1(make_node("QuantizeLinear", {"x", "s"}, {"y"}, 21, {{"axis", int_attr(1)}, {"block_size", int_attr(2)}}),
           {f32({8, 8, 8, 8, 8}, {1, 5}), f32({1, 2, 4}, {1, 3})});
  EXPECT_EQ(values(b), (std::vector<double>{8, 8, 4, 4, 2}));
}

TEST(QuantizeLinear, BadScaleShapesAreErrors) {
  auto r = run(make_node("QuantizeLinear", {"x", "s"}, {"y"}, 21, {{"axis", int_attr(0)}}),
               {f32({1, 2, 3, 4}, {2, 2}), f32({1, 2, 3})});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "per-axis scale must be 1-D of length 2")) << r.status().to_string();
  r = run(make_node("QuantizeLinear", {"x", "s"}, {"y"}, 21, {{"axis", int_attr(1)}, {"block_size", int_attr(2)}}),
          {f32({1, 2, 3, 4}, {2, 2}), f32({1, 2}, {2, 1})});
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  r = run(make_node("QuantizeLinear", {"x", "s"}, {"y"}, 21, {{"axis", int_attr(1)}, {"block_size", int_attr(1)}}),
          {f32({1, 2, 3, 4}, {2, 2}), f32({1, 2}, {2, 1})});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "blocked quantization")) << r.status().to_string();
  r = run(make_node("QuantizeLinear", {"x", "s"}, {"y"}, 21, {{"axis", int_attr(5)}}), {f32({1, 2}), f32({1, 2})});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "axis 5")) << r.status().to_string();
}

TEST(QuantizeLinear, Float8SaturateAttribute) {
  Tensor s = Tensor::scalar<float>(DataType::kFloat32, 1);
  Tensor zp(DataType::kFloat8E4M3FN, {});
  Tensor sat = run1(make_node("QuantizeLinear", {"x", "s", "z"}, {"y"}), {f32({1000, 1.5f}), s, zp});
  EXPECT_EQ(values(sat), (std::vector<double>{448, 1.5}));
  Tensor nosat =
      run1(make_node("QuantizeLinear", {"x", "s", "z"}, {"y"}, 21, {{"saturate", int_attr(0)}}), {f32({1000}), s, zp});
  EXPECT_TRUE(std::isnan(values(nosat)[0]));
}

TEST(DequantizeLinear, PerAxisAndOutputType) {
  Tensor x = typed(DataType::kInt8, {-128, 0, 127, 10}, {2, 2});
  Tensor y = run1(make_node("DequantizeLinear", {"x", "s", "z"}, {"y"}, 21, {{"axis", int_attr(0)}}),
                  {x, f32({0.5f, 2}), typed(DataType::kInt8, {0, 10}, {2})});
  EXPECT_EQ(y.dtype(), DataType::kFloat32);
  EXPECT_EQ(values(y), (std::vector<double>{-64, 0, 234, 0}));
  Tensor h = run1(make_node("DequantizeLinear", {"x", "s"}, {"y"}, 23,
                            {{"output_dtype", int_attr(static_cast<int64_t>(DataType::kFloat16))}}),
                  {typed(DataType::kUInt4, {15}, {1}), Tensor::scalar<float>(DataType::kFloat32, 0.5f)});
  EXPECT_EQ(h.dtype(), DataType::kFloat16);
  EXPECT_EQ(values(h), (std::vector<double>{7.5}));
  auto bad = run(make_node("DequantizeLinear", {"x", "s", "z"}, {"y"}), {x, f32({1}), u8({0}, {1})});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status().message(), "x_zero_point dtype")) << bad.status().to_string();
}

TEST(QuantizeInference, TypesAndShapes) {
  ir::Graph g;
  g.inputs = {{"x", ir::TypeInfo::tensor(DataType::kFloat32, SymShape({Dim::symbol("B"), 4}))},
              {"s", ir::TypeInfo::tensor(DataType::kFloat16, SymShape(std::vector<Dim>{}))},
              {"q", ir::TypeInfo::tensor(DataType::kInt8, SymShape({Dim::symbol("B"), 4}))}};
  g.nodes.push_back(make_node("QuantizeLinear", {"x", "s"}, {"y"}, 21,
                              {{"output_dtype", int_attr(static_cast<int64_t>(DataType::kInt16))}}));
  g.nodes.push_back(make_node("DequantizeLinear", {"q", "s"}, {"d"}, 21));
  g.nodes.push_back(make_node("DynamicQuantizeLinear", {"x"}, {"dq", "ds", "dz"}, 11));
  ASSERT_TRUE(infer_shapes(g).ok());
  EXPECT_EQ(g.value_types.at("y").str(), "int16[B,4]");
  EXPECT_EQ(g.value_types.at("d").str(), "float16[B,4]");
  EXPECT_EQ(g.value_types.at("dq").str(), "uint8[B,4]");
  EXPECT_EQ(g.value_types.at("ds").str(), "float32[]");
}

TEST(DynamicQuantizeLinear, ScaleAndZeroPointFromTheRange) {
  auto r = run(make_node("DynamicQuantizeLinear", {"x"}, {"y", "s", "z"}, 11), {f32({0, 2, -3, -2.5f, 3.34f, 4})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  float scale = r.value()[1].tensor.data<float>()[0];
  EXPECT_FLOAT_EQ(scale, 7.0f / 255.0f);
  EXPECT_EQ(values(r.value()[2].tensor), (std::vector<double>{109}));  // rint(3 / scale)
  EXPECT_EQ(values(r.value()[0].tensor), (std::vector<double>{109, 182, 0, 18, 231, 255}));
}

TEST(QLinearMatMul, PerRowAndPerColumnParameters) {
  // a [2,2] with per-row zero points, b [2,2] per-tensor; y = a_real @ b_real / y_scale.
  Tensor a = u8({11, 12, 23, 24}, {2, 2});
  Tensor b = u8({1, 0, 0, 1}, {2, 2});
  auto r = run(make_node("QLinearMatMul", {"a", "as", "az", "b", "bs", "bz", "ys", "yz"}, {"y"}, 21),
               {a, f32({1, 1}), u8({10, 20}, {2}), b, f32({2}), u8({0}, {1}), f32({1}), u8({0}, {1})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values(r.value()[0].tensor), (std::vector<double>{2, 4, 6, 8}));
  auto bad = run(make_node("QLinearMatMul", {"a", "as", "az", "b", "bs", "bz", "ys", "yz"}, {"y"}, 21),
                 {a, f32({1, 1, 1}), u8({0}, {1}), b, f32({2}), u8({0}, {1}), f32({1}), u8({0}, {1})});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status().message(), "a_scale")) << bad.status().to_string();
  auto mismatch =
      run(make_node("QLinearMatMul", {"a", "as", "az", "b", "bs", "bz", "ys", "yz"}, {"y"}, 21),
          {a, f32({1}), u8({0}, {1}), u8({1, 2, 3}, {3, 1}), f32({2}), u8({0}, {1}), f32({1}), u8({0}, {1})});
  ASSERT_FALSE(mismatch.ok());
  EXPECT_TRUE(contains(mismatch.status().message(), "inner dimensions")) << mismatch.status().to_string();
}

}  // namespace
}  // namespace kiln::ops
