// Random generators: seeded streams follow numpy's RandomState.
#include "arnn_test_util.h"

namespace kiln::ops {
namespace {

using namespace arnn_testing;

TEST(Random, SeededUniformMatchesNumpy) {
  // numpy.random.RandomState(5).rand(3)
  auto res = run(make_node("RandomUniform", 22, 0, 1, {{"shape", attr_ints({3})}, {"seed", attr_f(5)}}), {});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  expect_values(res.value()[0].tensor, {0.22199317, 0.87073231, 0.20671916}, 1e-7);
}

TEST(Random, SeededNormalMatchesNumpy) {
  // numpy.random.RandomState(3).randn(3)
  auto res = run(
      make_node("RandomNormal", 22, 0, 1, {{"shape", attr_ints({3})}, {"seed", attr_f(3)}, {"dtype", attr_i(11)}}), {});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res.value()[0].tensor.dtype(), DataType::kFloat64);
  expect_values(res.value()[0].tensor, {1.78862847, 0.43650985, 0.09649747}, 1e-8);
}

TEST(Random, LikeUsesInputShapeAndRange) {
  auto res = run(make_node("RandomUniformLike", 22, 1, 1, {{"low", attr_f(2)}, {"high", attr_f(3)}}),
                 {f32({4, 5}, std::vector<float>(20))});
  ASSERT_TRUE(res.ok());
  const Tensor& t = res.value()[0].tensor;
  EXPECT_EQ(t.shape(), (Dims{4, 5}));
  for (int64_t i = 0; i < t.numel(); ++i) {
    EXPECT_GE(t.get_f64(i), 2.0);
    EXPECT_LE(t.get_f64(i), 3.0);
  }
}

TEST(Random, BernoulliExtremesAndErrors) {
  auto res = run(make_node("Bernoulli", 22, 1, 1), {f32({4}, {0, 1, 0, 1})});
  ASSERT_TRUE(res.ok());
  expect_values(res.value()[0].tensor, {0, 1, 0, 1});
  EXPECT_FALSE(run(make_node("Bernoulli", 22, 1, 1), {f32({1}, {1.5f})}).ok());
  EXPECT_FALSE(run(make_node("RandomNormal", 22, 0, 1, {{"shape", attr_ints({2})}, {"seed", attr_f(-1)}}), {}).ok());
}

TEST(Random, MultinomialPicksTheOnlyLikelyClass) {
  float ninf = -std::numeric_limits<float>::infinity();
  auto res = run(make_node("Multinomial", 22, 1, 1, {{"sample_size", attr_i(5)}}), {f32({1, 3}, {ninf, 0, ninf})});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  const Tensor& t = res.value()[0].tensor;
  EXPECT_EQ(t.dtype(), DataType::kInt32);
  EXPECT_EQ(t.shape(), (Dims{1, 5}));
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(t.get_i64(i), 1);
}

}  // namespace
}  // namespace kiln::ops
