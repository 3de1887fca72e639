// Tensor::cast and the small-float codecs, against ONNX's reference behaviour.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/tensor.h"

namespace kiln {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Cast, NaNSurvivesFloatToFloat) {
  Tensor t = Tensor::from_vector<float>(DataType::kFloat32, {2}, {kNaN, -kInf});
  for (DataType to : {DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    Tensor c = t.cast(to).value();
    EXPECT_TRUE(std::isnan(c.get_f64(0))) << dtype_name(to);
    EXPECT_EQ(c.get_f64(1), -std::numeric_limits<double>::infinity()) << dtype_name(to);
  }
  Tensor b = t.cast(DataType::kBool).value();
  EXPECT_EQ(b.data<uint8_t>()[0], 1);  // NaN is non-zero
  Tensor i = t.cast(DataType::kInt32).value();
  EXPECT_EQ(i.data<int32_t>()[0], 0);
}

TEST(Cast, Float8FnuzSaturatesInfinityToMax) {
  EXPECT_EQ(float_to_float8(kInf, DataType::kFloat8E4M3FNUZ, true), 0x7f);
  EXPECT_EQ(float_to_float8(-kInf, DataType::kFloat8E4M3FNUZ, true), 0xff);
  EXPECT_EQ(float_to_float8(kInf, DataType::kFloat8E5M2FNUZ, true), 0x7f);
  EXPECT_EQ(float_to_float8(kInf, DataType::kFloat8E4M3FNUZ, false), 0x80);  // NaN without saturate
  EXPECT_EQ(float8_to_float(0x7f, DataType::kFloat8E4M3FNUZ), 240.0f);
  EXPECT_EQ(float8_to_float(0x7f, DataType::kFloat8E5M2FNUZ), 57344.0f);
}

TEST(Cast, Float8E8M0RoundingModes) {
  // 3 = 1.5 * 2^1: up -> 2^2, down -> 2^1, nearest (half) -> 2^2.
  EXPECT_EQ(float_to_float8e8m0(3.0f, true, E8M0Rounding::kUp), 129);
  EXPECT_EQ(float_to_float8e8m0(3.0f, true, E8M0Rounding::kDown), 128);
  EXPECT_EQ(float_to_float8e8m0(3.0f, true, E8M0Rounding::kNearest), 129);
  EXPECT_EQ(float_to_float8e8m0(2.5f, true, E8M0Rounding::kNearest), 128);
  EXPECT_EQ(float_to_float8e8m0(4.0f, true, E8M0Rounding::kUp), 129);   // exact powers stay
  EXPECT_EQ(float_to_float8e8m0(-4.0f, true, E8M0Rounding::kUp), 129);  // magnitude only
  EXPECT_EQ(float_to_float8e8m0(kInf, true, E8M0Rounding::kUp), 0xff);
  EXPECT_EQ(float_to_float8e8m0(kNaN, true, E8M0Rounding::kUp), 0xff);
  float big = std::numeric_limits<float>::max();  // exponent 254 with a fraction
  EXPECT_EQ(float_to_float8e8m0(big, true, E8M0Rounding::kUp), 0xfe);
  EXPECT_EQ(float_to_float8e8m0(big, false, E8M0Rounding::kUp), 0xff);
  EXPECT_EQ(float_to_float8(3.0f, DataType::kFloat8E8M0, true), 129);  // default: up
  EXPECT_EQ(float8_to_float(129, DataType::kFloat8E8M0), 4.0f);
}

TEST(Cast, StringsRoundTrip) {
  Tensor f = Tensor::from_vector<float>(DataType::kFloat32, {4}, {0.1f, 1.0f, -kInf, 1e20f});
  Tensor s = f.cast(DataType::kString).value();
  EXPECT_EQ(s.strings()[0], "0.1");  // shortest form that reads back as the same float
  EXPECT_EQ(s.strings()[1], "1");
  EXPECT_EQ(s.strings()[2], "-INF");
  EXPECT_EQ(s.strings()[3], "1e+20");
  Tensor d = Tensor::from_vector<double>(DataType::kFloat64, {1}, {1.0 / 3});
  EXPECT_EQ(d.cast(DataType::kString).value().strings()[0], "0.3333333333333333");
  Tensor in(DataType::kString, {4});
  in.strings()[0] = "+INF";
  in.strings()[1] = "-inf";
  in.strings()[2] = "NaN";
  in.strings()[3] = "1e-5";
  Tensor back = in.cast(DataType::kFloat32).value();
  EXPECT_EQ(back.data<float>()[0], kInf);
  EXPECT_EQ(back.data<float>()[1], -kInf);
  EXPECT_TRUE(std::isnan(back.data<float>()[2]));
  EXPECT_EQ(back.data<float>()[3], 1e-5f);
  Tensor bad(DataType::kString, {1});
  bad.strings()[0] = "hello";
  EXPECT_FALSE(bad.cast(DataType::kFloat32).ok());
}

}  // namespace
}  // namespace kiln
