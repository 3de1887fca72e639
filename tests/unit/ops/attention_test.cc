// Attention and its relatives: RotaryEmbedding, SwiGLU, CausalConvWithState, LinearAttention,
// FlexAttention.
#include <cmath>

#include "arnn_test_util.h"

namespace kiln::ops {
namespace {

using namespace arnn_testing;

TEST(Attention, TwoKeysByHand) {
  // scores = [1, 0] / sqrt(2); y = p0 * V0 + p1 * V1.
  auto res = run(make_node("Attention", 23, 3, 1),
                 {f32({1, 1, 1, 2}, {1, 0}), f32({1, 1, 2, 2}, {1, 0, 0, 1}), f32({1, 1, 2, 2}, {1, 2, 3, 4})});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  double p0 = 1.0 / (1.0 + std::exp(-1.0 / std::sqrt(2.0)));
  expect_values(res.value()[0].tensor, {3 - 2 * p0, 4 - 2 * p0});
  EXPECT_EQ(res.value()[0].tensor.shape(), (Dims{1, 1, 1, 2}));
}

TEST(Attention, NegativeCausalOffsetGivesZeroRows) {
  // nonpad_kv_seqlen = 1 with 2 queries: offset -1, so query 0 sees no key and its row is zero.
  auto n = make_node("Attention", 24, 7, 4, {{"is_causal", attr_i(1)}, {"qk_matmul_output_mode", attr_i(3)}});
  n.outputs[1].clear();
  n.outputs[2].clear();
  auto res = run(n, {f32({1, 1, 2, 1}, {1, 1}), f32({1, 1, 2, 1}, {1, 1}), f32({1, 1, 2, 1}, {5, 7}), Tensor(),
                     Tensor(), Tensor(), i64({1}, {1})});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  expect_values(res.value()[0].tensor, {0, 5});
  expect_values(res.value()[3].tensor, {0, 0, 1, 0});
}

TEST(Attention, BoolMaskAndPastCache) {
  // The mask hides key 1; past holds key 0, so present has both keys.
  Tensor mask(DataType::kBool, {1, 2});
  mask.data<bool>()[0] = true;
  mask.data<bool>()[1] = false;
  auto res =
      run(make_node("Attention", 23, 6, 3), {f32({1, 1, 1, 1}, {1}), f32({1, 1, 1, 1}, {2}), f32({1, 1, 1, 1}, {9}),
                                             mask, f32({1, 1, 1, 1}, {3}), f32({1, 1, 1, 1}, {4})});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  expect_values(res.value()[0].tensor, {4});
  expect_values(res.value()[1].tensor, {3, 2});
  expect_values(res.value()[2].tensor, {4, 9});
}

TEST(Attention, InfersPackedGqaShapes) {
  auto n = make_node("Attention", 23, 3, 4, {{"q_num_heads", attr_i(4)}, {"kv_num_heads", attr_i(2)}});
  Dim b = Dim::symbol("batch"), s = Dim::symbol("seq"), t = Dim::symbol("kv");
  auto out = infer(n, {tinfo(DataType::kFloat32, {b, s, 8}), tinfo(DataType::kFloat32, {b, t, 4}),
                       tinfo(DataType::kFloat32, {b, t, 6})});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out.value()[0].shape.str(), "[batch,seq,12]");
  EXPECT_EQ(out.value()[1].shape.str(), "[batch,2,kv,2]");
  EXPECT_EQ(out.value()[2].shape.str(), "[batch,2,kv,3]");
  EXPECT_EQ(out.value()[3].shape.str(), "[batch,4,seq,kv]");
}

TEST(Attention, RejectsBadHeadCounts) {
  auto res = run(make_node("Attention", 23, 3, 1),
                 {f32({1, 3, 1, 1}, {1, 1, 1}), f32({1, 2, 1, 1}, {1, 1}), f32({1, 2, 1, 1}, {1, 1})});
  ASSERT_FALSE(res.ok());
  EXPECT_NE(res.status().message().find("multiple"), std::string::npos) << res.status().message();
  auto missing = infer(make_node("Attention", 23, 3, 1),
                       {tinfo(DataType::kFloat32, {1, 2, 4}), tinfo(DataType::kFloat32, {1, 2, 4}),
                        tinfo(DataType::kFloat32, {1, 2, 4})});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("q_num_heads"), std::string::npos);
}

TEST(RotaryEmbedding, HalvesAndInterleaved) {
  Tensor x = f32({1, 1, 1, 4}, {1, 2, 3, 4});
  Tensor cos = f32({1, 2}, {0, 1}), sin = f32({1, 2}, {1, 0});
  Tensor pos = i64({1, 1}, {0});
  auto halves = run(make_node("RotaryEmbedding", 23, 4, 1), {x, cos, sin, pos});
  ASSERT_TRUE(halves.ok()) << halves.status().to_string();
  expect_values(halves.value()[0].tensor, {-3, 2, 1, 4});
  auto inter = run(make_node("RotaryEmbedding", 23, 4, 1, {{"interleaved", attr_i(1)}}), {x, cos, sin, pos});
  ASSERT_TRUE(inter.ok()) << inter.status().to_string();
  expect_values(inter.value()[0].tensor, {-2, 1, 3, 4});
}

TEST(RotaryEmbedding, RejectsOutOfRangePosition) {
  auto res = run(make_node("RotaryEmbedding", 23, 4, 1),
                 {f32({1, 1, 1, 4}, {1, 2, 3, 4}), f32({1, 2}, {0, 1}), f32({1, 2}, {1, 0}), i64({1, 1}, {5})});
  ASSERT_FALSE(res.ok());
  EXPECT_NE(res.status().message().find("position id 5"), std::string::npos) << res.status().message();
}

TEST(SwiGLU, GatesBySwish) {
  auto res = run(make_node("SwiGLU", 28, 2, 1), {f32({2}, {0, 1}), f32({2}, {2, 3})});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  expect_values(res.value()[0].tensor, {0, 3.0 / (1.0 + std::exp(-1.0))});
  auto bad = run(make_node("SwiGLU", 28, 2, 1), {f32({2}, {0, 1}), f32({1}, {2})});
  EXPECT_FALSE(bad.ok());
}

TEST(CausalConvWithState, DepthwiseWithCarry) {
  auto res = run(make_node("CausalConvWithState", 27, 3, 2),
                 {f32({1, 1, 3}, {1, 2, 3}), f32({1, 1, 2}, {10, 1}), f32({1}, {0.5f})});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  expect_values(res.value()[0].tensor, {1.5, 12.5, 23.5});
  expect_values(res.value()[1].tensor, {3});
  auto bad = run(make_node("CausalConvWithState", 27, 2, 2), {f32({1, 1, 3}, {1, 2, 3}), f32({2, 1, 2}, {1, 1, 1, 1})});
  EXPECT_FALSE(bad.ok());
}

TEST(LinearAttention, LinearAndDeltaRules) {
  std::map<std::string, ir::Attribute> a = {
      {"q_num_heads", attr_i(1)}, {"kv_num_heads", attr_i(1)}, {"scale", attr_f(1)}, {"update_rule", attr_s("linear")}};
  Tensor q = f32({1, 2, 1}, {1, 1}), k = f32({1, 2, 1}, {1, 2}), v = f32({1, 2, 1}, {3, 4});
  auto lin = run(make_node("LinearAttention", 27, 3, 2, a), {q, k, v});
  ASSERT_TRUE(lin.ok()) << lin.status().to_string();
  expect_values(lin.value()[0].tensor, {3, 11});
  expect_values(lin.value()[1].tensor, {11});
  a["update_rule"] = attr_s("delta");
  auto delta = run(make_node("LinearAttention", 27, 6, 2, a), {q, k, v, Tensor(), Tensor(), f32({1, 2, 1}, {1, 1})});
  ASSERT_TRUE(delta.ok()) << delta.status().to_string();
  expect_values(delta.value()[0].tensor, {3, -1});
  auto no_beta = run(make_node("LinearAttention", 27, 3, 2, a), {q, k, v});
  ASSERT_FALSE(no_beta.ok());
  EXPECT_NE(no_beta.status().message().find("beta"), std::string::npos);
}

TEST(FlexAttention, PlainSoftmaxAttention) {
  auto res = run(make_node("FlexAttention", 1, 3, 1, {}, "ai.onnx.preview"),
                 {f32({1, 1, 1, 2}, {1, 0}), f32({1, 1, 2, 2}, {1, 0, 0, 1}), f32({1, 1, 2, 2}, {1, 2, 3, 4})});
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  double p0 = 1.0 / (1.0 + std::exp(-1.0 / std::sqrt(2.0)));
  expect_values(res.value()[0].tensor, {3 - 2 * p0, 4 - 2 * p0});
}

}  // namespace
}  // namespace kiln::ops
