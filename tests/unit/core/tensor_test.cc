#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kiln {
namespace {

TEST(Float16, RoundTripsExactValues) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f}) {
    EXPECT_EQ(half_to_float(float_to_half(f)), f) << f;
  }
  EXPECT_TRUE(std::isinf(half_to_float(float_to_half(70000.0f))));
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(NAN))));
}

TEST(Float16, RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(half_to_float(float_to_half(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  EXPECT_EQ(half_to_float(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11))), 1.0f + std::ldexp(1.0f, -9));
}

TEST(BFloat16, RoundTrip) {
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(1.5f)), 1.5f);
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(-3.0f)), -3.0f);
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(NAN))));
}

TEST(Float8, E4M3FNDecodesAndSaturates) {
  EXPECT_EQ(float8_to_float(0x7e, DataType::kFloat8E4M3FN), 448.0f);
  EXPECT_TRUE(std::isnan(float8_to_float(0x7f, DataType::kFloat8E4M3FN)));
  EXPECT_EQ(float_to_float8(1000.0f, DataType::kFloat8E4M3FN, true), 0x7e);
  EXPECT_EQ(float_to_float8(1000.0f, DataType::kFloat8E4M3FN, false), 0x7f);
  EXPECT_EQ(float8_to_float(float_to_float8(0.5f, DataType::kFloat8E5M2, true), DataType::kFloat8E5M2), 0.5f);
}

TEST(Tensor, CastSaturatesFloatToInt) {
  Tensor t = Tensor::from_vector<float>(DataType::kFloat32, {3}, {1e20f, -1e20f, 2.7f});
  Tensor i = t.cast(DataType::kInt32).value();
  EXPECT_EQ(i.data<int32_t>()[0], INT32_MAX);
  EXPECT_EQ(i.data<int32_t>()[1], INT32_MIN);
  EXPECT_EQ(i.data<int32_t>()[2], 2);
}

TEST(Tensor, ReshapeSharesStorage) {
  Tensor t(DataType::kFloat32, {2, 3});
  Tensor r = t.reshaped({6});
  r.data<float>()[4] = 7;
  EXPECT_EQ(t.data<float>()[4], 7);
  EXPECT_EQ(t.clone().data<float>()[4], 7);
}

TEST(Tensor, AssignViewSharesStorageAtTheNewShape) {
  Tensor src = Tensor::from_vector<float>(DataType::kFloat32, {2, 3}, {0, 1, 2, 3, 4, 5});
  Tensor v(DataType::kInt64, {4, 4, 4});  // another dtype and storage: both replaced
  const int64_t* dims = v.shape().data();
  const int64_t shape[] = {3, 2};
  v.assign_view(src, shape);
  EXPECT_EQ(v.dtype(), DataType::kFloat32);
  EXPECT_EQ(v.shape(), (Dims{3, 2}));
  EXPECT_EQ(v.raw(), src.raw());
  EXPECT_EQ(v.shape().data(), dims) << "the shape vector is reused, not reallocated";
  v.data<float>()[5] = 9;
  EXPECT_EQ(src.data<float>()[5], 9);
  // Its own shape, shortened: the span lies inside the vector it is copied into.
  Tensor self = Tensor::from_vector<float>(DataType::kFloat32, {6, 1}, {0, 1, 2, 3, 4, 5});
  self.assign_view(self, std::span<const int64_t>(self.shape().data(), 1));  // [6, 1] -> its prefix [6]
  EXPECT_EQ(self.shape(), (Dims{6}));
  Tensor tail = Tensor::from_vector<float>(DataType::kFloat32, {1, 6}, {0, 1, 2, 3, 4, 5});
  tail.assign_view(tail, std::span<const int64_t>(tail.shape().data() + 1, 1));  // [1, 6] -> its suffix [6]
  EXPECT_EQ(tail.shape(), (Dims{6}));
  EXPECT_EQ(tail.data<float>()[5], 5);
  EXPECT_DEATH(v.assign_view(src, Dims{4}), "") << "a view must keep the element count";
}

TEST(Tensor, RenewFromASpanReusesTheShapeVector) {
  Tensor t(DataType::kFloat32, {2, 3, 4});
  const int64_t* dims = t.shape().data();
  const int64_t shape[] = {5, 7};
  t.renew(DataType::kInt64, std::span<const int64_t>(shape));
  EXPECT_EQ(t.dtype(), DataType::kInt64);
  EXPECT_EQ(t.shape(), (Dims{5, 7}));
  EXPECT_EQ(t.shape().data(), dims);
  for (int64_t i = 0; i < 35; ++i) EXPECT_EQ(t.data<int64_t>()[i], 0) << "renewed tensors are zeroed";
  t.renew(DataType::kFloat32, std::span<const int64_t>(t.shape().data() + 1, 1));  // its own suffix: [7]
  EXPECT_EQ(t.shape(), (Dims{7}));
}

TEST(Tensor, RenewUninitializedReusesTheShapeVectorAndTakesFreshStorage) {
  Tensor t(DataType::kFloat32, {4, 4});
  Tensor keep = t;  // holds the old storage: the renewed tensor must not write into it
  keep.data<float>()[0] = 3;
  const int64_t* dims = t.shape().data();
  const int64_t shape[] = {2, 8};
  t.renew_uninitialized(DataType::kInt32, std::span<const int64_t>(shape));
  EXPECT_EQ(t.dtype(), DataType::kInt32);
  EXPECT_EQ(t.shape(), (Dims{2, 8}));
  EXPECT_EQ(t.shape().data(), dims);
  EXPECT_NE(t.raw(), keep.raw());
  for (int i = 0; i < 16; ++i) t.data<int32_t>()[i] = i;
  EXPECT_EQ(keep.data<float>()[0], 3);
  EXPECT_EQ(t.data<int32_t>()[15], 15);
}

}  // namespace
}  // namespace kiln
