// The whole pipeline on a small BERT-style encoder layer written out as torch exports it at
// opset 13: every fusion finds its pattern, and the result computes the same numbers.
#include "engine/target.h"
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

constexpr int64_t kB = 2, kS = 5, kH = 2, kD = 4, kHid = kH * kD, kFfn = 16;

void linear(GraphBuilder& b, const std::string& x, const std::string& y, int64_t in, int64_t out, uint64_t seed) {
  b.init(y + "_w", random_tensor({in, out}, seed, DataType::kFloat32, -0.5, 0.5));
  b.init(y + "_b", random_tensor({out}, seed + 1, DataType::kFloat32, -0.1, 0.1));
  b.node("MatMul", {x, y + "_w"}, {y + "_mm"});
  b.node("Add", {y + "_mm", y + "_b"}, {y});
}

void layer_norm(GraphBuilder& b, const std::string& x, const std::string& y) {
  auto& m1 = b.node("ReduceMean", {x}, {y + "_mean"});
  GraphBuilder::set_ints(m1, "axes", {-1});
  b.node("Sub", {x, y + "_mean"}, {y + "_d"});
  b.node("Pow", {y + "_d", "two"}, {y + "_sq"});
  auto& m2 = b.node("ReduceMean", {y + "_sq"}, {y + "_var"});
  GraphBuilder::set_ints(m2, "axes", {-1});
  b.node("Add", {y + "_var", "eps"}, {y + "_ve"});
  b.node("Sqrt", {y + "_ve"}, {y + "_sd"});
  b.node("Div", {y + "_d", y + "_sd"}, {y + "_n"});
  b.init(y + "_gamma", random_tensor({kHid}, 40, DataType::kFloat32, 0.5, 1.5));
  b.init(y + "_beta", random_tensor({kHid}, 41));
  b.node("Mul", {y + "_n", y + "_gamma"}, {y + "_g"});
  b.node("Add", {y + "_g", y + "_beta"}, {y});
}

void heads(GraphBuilder& b, const std::string& x, const std::string& y, std::vector<int64_t> perm) {
  b.node("Reshape", {x, "heads_shape"}, {y + "_r"});
  GraphBuilder::set_ints(b.node("Transpose", {y + "_r"}, {y}), "perm", std::move(perm));
}

ir::Model bert_style_encoder_layer() {
  GraphBuilder b(13);
  b.input("x", {kB, kS, kHid}).input("mask", {kB, 1, 1, kS}).output("y");
  b.init("two", scalar_f(2.0f)).init("eps", scalar_f(1e-5f)).init("scale", scalar_f(2.0f));
  b.init("heads_shape", i64s({kB, kS, kH, kD})).init("merge_shape", i64s({kB, kS, kHid}));
  b.init("sqrt2", scalar_f(1.41421356f)).init("one", scalar_f(1.0f)).init("half", scalar_f(0.5f));
  linear(b, "x", "q", kHid, kHid, 1);
  linear(b, "x", "k", kHid, kHid, 3);
  linear(b, "x", "v", kHid, kHid, 5);
  heads(b, "q", "qh", {0, 2, 1, 3});
  heads(b, "k", "kh", {0, 2, 1, 3});
  heads(b, "v", "vh", {0, 2, 1, 3});
  GraphBuilder::set_ints(b.node("Transpose", {"kh"}, {"kt"}), "perm", {0, 1, 3, 2});
  b.node("MatMul", {"qh", "kt"}, {"scores"});
  b.node("Div", {"scores", "scale"}, {"scaled"});
  b.node("Add", {"scaled", "mask"}, {"masked"});
  GraphBuilder::set_int(b.node("Softmax", {"masked"}, {"probs"}), "axis", -1);
  b.node("MatMul", {"probs", "vh"}, {"ctx"});
  GraphBuilder::set_ints(b.node("Transpose", {"ctx"}, {"ctx_t"}), "perm", {0, 2, 1, 3});
  b.node("Reshape", {"ctx_t", "merge_shape"}, {"ctx_m"});
  linear(b, "ctx_m", "attn_out", kHid, kHid, 7);
  b.node("Add", {"x", "attn_out"}, {"res1"});
  layer_norm(b, "res1", "ln1");
  linear(b, "ln1", "ff1", kHid, kFfn, 9);
  b.node("Div", {"ff1", "sqrt2"}, {"g_div"});
  b.node("Erf", {"g_div"}, {"g_erf"});
  b.node("Add", {"g_erf", "one"}, {"g_add"});
  b.node("Mul", {"ff1", "g_add"}, {"g_mul"});
  b.node("Mul", {"g_mul", "half"}, {"gelu"});
  linear(b, "gelu", "ff2", kFfn, kHid, 11);
  b.node("Add", {"ln1", "ff2"}, {"res2"});
  layer_norm(b, "res2", "y");
  return b.finish();
}

TEST(FusionPipeline, BertStyleEncoderLayer) {
  ir::Model before = bert_style_encoder_layer();
  ir::Model after = clone(before);
  auto stats = passes::optimize(after, {}, engine::host_target());
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  const ir::Graph& g = *after.graph;
  EXPECT_EQ(count_kiln(g, "MultiHeadAttention"), 1);  // reads the heads from the merged Q/K/V projection
  EXPECT_EQ(count_kiln(g, "LayerNormalization"), 2);
  EXPECT_EQ(count_kiln(g, "FusedMatMul"), 4);  // merged Q/K/V, output projection, FFN 1 and 2
  EXPECT_EQ(count_op(g, "Split"), 0);
  EXPECT_EQ(count_op(g, "Transpose"), 0);
  EXPECT_EQ(count_op(g, "Erf"), 0);
  EXPECT_EQ(count_op(g, "Softmax"), 0);
  EXPECT_EQ(count_op(g, "ReduceMean"), 0);
  int gelu_layers = 0, residual_layers = 0;
  for (const auto& n : g.nodes) {
    gelu_layers += n.attr_string("activation", "") == "Gelu";
    residual_layers += n.op_type == "FusedMatMul" && n.has_input(3);
  }
  EXPECT_EQ(gelu_layers, 1);
  EXPECT_EQ(residual_layers, 2);
  EXPECT_LT(g.nodes.size(), 20u);
  EXPECT_LT(max_abs_diff(before, after), 1e-5);
}

// For a CUDA target the attention fusions run too (the CUDA backend has kiln.Attention and
// MultiHeadAttention tactics): one MultiHeadAttention reading the merged Q/K/V projection, no head
// Transposes, no Split, no Softmax; fuse_elementwise stays CPU-only.
TEST(FusionPipeline, BertStyleEncoderLayerForCudaFusesAttention) {
  ir::Model before = bert_style_encoder_layer();
  ir::Model after = clone(before);
  Target cuda = engine::host_target();
  cuda.device = {DeviceKind::kCUDA, 0};
  auto stats = passes::optimize(after, {}, cuda);
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  const ir::Graph& g = *after.graph;
  EXPECT_EQ(count_kiln(g, "MultiHeadAttention"), 1);
  EXPECT_EQ(count_kiln(g, "FusedMatMul"), 4);  // merged Q/K/V, output projection, FFN 1 and 2
  EXPECT_EQ(count_kiln(g, "FusedElementwise"), 0);
  EXPECT_EQ(count_op(g, "Split"), 0);
  EXPECT_EQ(count_op(g, "Transpose"), 0);
  EXPECT_EQ(count_op(g, "Softmax"), 0);
  const ir::Node* mha = find_op(g, "MultiHeadAttention");
  ASSERT_NE(mha, nullptr);
  EXPECT_EQ(mha->attr_int("num_heads", 0), kH);
  EXPECT_FALSE(mha->has_input(1));  // packed: reads the merged projection
  EXPECT_LT(max_abs_diff(before, after), 1e-5);
}

}  // namespace
}  // namespace kiln
