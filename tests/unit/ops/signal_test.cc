// DFT, STFT, windows, MelWeightMatrix.
#include "arnn_test_util.h"

namespace kiln::ops {
namespace {

using namespace arnn_testing;

TEST(Dft, ForwardOnesidedInverse) {
  Tensor x = f32({1, 4, 1}, {1, 2, 3, 4});
  auto full = run(make_node("DFT", 17, 1, 1), {x});
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  expect_values(full.value()[0].tensor, {10, 0, -2, 2, -2, 0, -2, -2});
  auto half = run(make_node("DFT", 17, 1, 1, {{"onesided", attr_i(1)}}), {x});
  ASSERT_TRUE(half.ok());
  EXPECT_EQ(half.value()[0].tensor.shape(), (Dims{1, 3, 2}));
  auto back = run(make_node("DFT", 17, 1, 1, {{"inverse", attr_i(1)}}), {full.value()[0].tensor});
  ASSERT_TRUE(back.ok());
  expect_values(back.value()[0].tensor, {1, 0, 2, 0, 3, 0, 4, 0});
  auto irfft =
      run(make_node("DFT", 17, 1, 1, {{"inverse", attr_i(1)}, {"onesided", attr_i(1)}}), {half.value()[0].tensor});
  ASSERT_TRUE(irfft.ok());
  EXPECT_EQ(irfft.value()[0].tensor.shape(), (Dims{1, 4, 1}));
  expect_values(irfft.value()[0].tensor, {1, 2, 3, 4});
}

TEST(Dft, Opset20AxisInputAndErrors) {
  Tensor x = f32({2, 1}, {1, 1});
  auto res = run(make_node("DFT", 20, 3, 1), {f32({1, 2, 1}, {1, 1}), Tensor(), i64({}, {1})});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  expect_values(res.value()[0].tensor, {2, 0, 0, 0});
  auto bad = run(make_node("DFT", 20, 3, 1), {f32({1, 2, 1}, {1, 1}), Tensor(), i64({}, {-1})});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("axis -1"), std::string::npos) << bad.status().message();
  auto out = infer(make_node("DFT", 17, 1, 1, {{"onesided", attr_i(1)}}),
                   {tinfo(DataType::kFloat32, {Dim::symbol("b"), 10, 1})});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out.value()[0].shape.str(), "[b,6,2]");
}

TEST(Stft, FramesAndBins) {
  std::vector<float> sig(16);
  for (size_t i = 0; i < sig.size(); ++i) sig[i] = static_cast<float>(i % 4);
  auto res = run(make_node("STFT", 17, 4, 1), {f32({1, 16, 1}, sig), i64({}, {4}), Tensor(), i64({}, {8})});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res.value()[0].tensor.shape(), (Dims{1, 3, 5, 2}));
  EXPECT_NEAR(res.value()[0].tensor.get_f64(0), 12, 1e-5);  // DC of frame 0: 2 * (0+1+2+3)
  auto bad = run(make_node("STFT", 17, 2, 1), {f32({1, 16, 1}, sig), i64({}, {0})});
  EXPECT_FALSE(bad.ok());
}

TEST(Windows, HannHamming) {
  auto hann = run(make_node("HannWindow", 17, 1, 1), {i64({}, {4})});
  ASSERT_TRUE(hann.ok());
  expect_values(hann.value()[0].tensor, {0, 0.5, 1, 0.5});
  auto sym = run(make_node("HannWindow", 17, 1, 1, {{"periodic", attr_i(0)}}), {i64({}, {5})});
  ASSERT_TRUE(sym.ok());
  expect_values(sym.value()[0].tensor, {0, 0.5, 1, 0.5, 0});
  auto ham = run(make_node("HammingWindow", 17, 1, 1, {{"output_datatype", attr_i(11)}}), {i64({}, {2})});
  ASSERT_TRUE(ham.ok());
  EXPECT_EQ(ham.value()[0].tensor.dtype(), DataType::kFloat64);
  expect_values(ham.value()[0].tensor, {4.0 / 46.0, 1.0}, 1e-12);
  EXPECT_FALSE(run(make_node("BlackmanWindow", 17, 1, 1), {i64({}, {-3})}).ok());
}

TEST(MelWeightMatrix, ShapeAndTriangles) {
  auto res = run(make_node("MelWeightMatrix", 17, 5, 1),
                 {i64({}, {8}), i64({}, {16}), i64({}, {8192}), f32({}, {0}), f32({}, {4096})});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  const Tensor& t = res.value()[0].tensor;
  EXPECT_EQ(t.shape(), (Dims{9, 8}));
  for (int64_t c = 0; c < 8; ++c) {
    double mx = 0;
    for (int64_t r = 0; r < 9; ++r) mx = std::max(mx, t.get_f64(r * 8 + c));
    EXPECT_LE(mx, 1.0);
  }
  EXPECT_FALSE(run(make_node("MelWeightMatrix", 17, 5, 1),
                   {i64({}, {8}), i64({}, {16}), i64({}, {8192}), f32({}, {100}), f32({}, {10})})
                   .ok());
}

}  // namespace
}  // namespace kiln::ops
