// RNN / GRU / LSTM.
#include "arnn_test_util.h"

namespace kiln::ops {
namespace {

using namespace arnn_testing;

TEST(Rnn, ReluIdentityCell) {
  auto n = make_node("RNN", 22, 3, 2, {{"hidden_size", attr_i(1)}, {"activations", attr_strings({"Relu"})}});
  auto res = run(n, {f32({3, 1, 1}, {-1, 2, 3}), f32({1, 1, 1}, {1}), f32({1, 1, 1}, {0})});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  expect_values(res.value()[0].tensor, {0, 2, 3});
  expect_values(res.value()[1].tensor, {3});
}

TEST(Rnn, ReverseWithSequenceLengths) {
  // Running sums backwards over each batch's valid steps; steps past a length stay zero.
  auto n = make_node(
      "RNN", 22, 5, 2,
      {{"hidden_size", attr_i(1)}, {"direction", attr_s("reverse")}, {"activations", attr_strings({"Relu"})}});
  Tensor lens = Tensor::from_vector<int32_t>(DataType::kInt32, {2}, {3, 1});
  auto res = run(n, {f32({3, 2, 1}, {1, 4, 2, 5, 3, 6}), f32({1, 1, 1}, {1}), f32({1, 1, 1}, {1}), Tensor(), lens});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  expect_values(res.value()[0].tensor, {6, 4, 5, 0, 3, 0});
  expect_values(res.value()[1].tensor, {6, 4});
}

TEST(Rnn, InfersLayoutOneShapes) {
  auto n = make_node("LSTM", 22, 3, 3,
                     {{"hidden_size", attr_i(5)}, {"layout", attr_i(1)}, {"direction", attr_s("bidirectional")}});
  Dim b = Dim::symbol("b"), s = Dim::symbol("s");
  auto out = infer(n, {tinfo(DataType::kFloat32, {b, s, 3}), tinfo(DataType::kFloat32, {2, 20, 3}),
                       tinfo(DataType::kFloat32, {2, 20, 5})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out.value()[0].shape.str(), "[b,s,2,5]");
  EXPECT_EQ(out.value()[1].shape.str(), "[b,2,5]");
  EXPECT_EQ(out.value()[2].shape.str(), "[b,2,5]");
}

TEST(Rnn, RejectsMismatchedWeights) {
  auto n = make_node("GRU", 22, 3, 2, {{"hidden_size", attr_i(2)}});
  auto res = run(n, {f32({1, 1, 1}, {1}), f32({1, 3, 1}, {1, 1, 1}), f32({1, 6, 2}, std::vector<float>(12, 0))});
  ASSERT_FALSE(res.ok());
  EXPECT_NE(res.status().message().find("W "), std::string::npos) << res.status().message();
  auto bad_dir = infer(make_node("RNN", 22, 3, 2, {{"direction", attr_s("sideways")}}), {});
  EXPECT_FALSE(bad_dir.ok());
}

TEST(Lstm, ZeroWeightsGiveHalfSigmoidGates) {
  // All gates sigmoid(0) = 0.5, candidate tanh(0) = 0: c = 0.5 * c0, h = 0.5 * tanh(c).
  auto n = make_node("LSTM", 22, 7, 3, {{"hidden_size", attr_i(1)}});
  auto res = run(n, {f32({1, 1, 1}, {7}), f32({1, 4, 1}, {0, 0, 0, 0}), f32({1, 4, 1}, {0, 0, 0, 0}), Tensor(),
                     Tensor(), f32({1, 1, 1}, {0}), f32({1, 1, 1}, {2})});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  expect_values(res.value()[2].tensor, {1});
  expect_values(res.value()[1].tensor, {0.5 * std::tanh(1.0)});
}

}  // namespace
}  // namespace kiln::ops
