// fold_qdq_conv: a small Q/DQ CNN in quantize_static's patterns (Conv+Relu, a residual Add, MaxPool,
// GlobalAveragePool, Flatten, the Gemm classifier) becomes kiln.QConv / kiln.QPool with 8-bit values
// between them, and computes what the Q/DQ graph computes (both run by the reference interpreter);
// patterns it cannot prove (a non-zero weight zero point) are left alone.
#include <gtest/gtest.h>

#include <random>

#include "ir/attribute_builders.h"
#include "pass_test_util.h"

namespace kiln {
namespace {

using testing::GraphBuilder;

Tensor ints(DataType t, Dims d, std::mt19937& rng, int64_t lo, int64_t hi) {
  Tensor x(t, std::move(d));
  for (int64_t i = 0; i < x.numel(); ++i) x.set_i64(i, lo + static_cast<int64_t>(rng() % (hi - lo + 1)));
  return x;
}
Tensor floats(Dims d, std::vector<float> v) { return Tensor::from_vector<float>(DataType::kFloat32, std::move(d), v); }
Tensor u8(int64_t v) { return Tensor::from_vector<uint8_t>(DataType::kUInt8, {}, {static_cast<uint8_t>(v)}); }

struct QdqCnn {
  GraphBuilder b;
  std::mt19937 rng{7};
  int counter = 0;
  bool constant_nodes = false;  // scales and zero points as Constant nodes (PyTorch's exporter)
  // Q then DQ of `v` with (scale, zero point): returns the DQ's output.
  std::string qdq(const std::string& v, float scale, int64_t zp) {
    const std::string k = std::to_string(counter++);
    if (constant_nodes) {
      b.node("Constant", {}, {"s" + k}).attrs["value"] = ir::attr_tensor(testing::scalar_f(scale));
      b.node("Constant", {}, {"z" + k}).attrs["value"] = ir::attr_tensor(u8(zp));
    } else {
      b.init("s" + k, testing::scalar_f(scale)).init("z" + k, u8(zp));
    }
    b.node("QuantizeLinear", {v, "s" + k, "z" + k}, {"q" + k});
    b.node("DequantizeLinear", {"q" + k, "s" + k, "z" + k}, {"dq" + k});
    return "dq" + k;
  }
  // DQ of int8 weights [m, rest...] with per-channel scales along `axis` and zero points `wzp`.
  std::string weights(const std::string& name, Dims d, int64_t axis, std::vector<float>* scales, int64_t wzp = 0) {
    const int64_t m = d[static_cast<size_t>(axis)];
    scales->clear();
    for (int64_t k = 0; k < m; ++k) scales->push_back(0.004f + 0.001f * static_cast<float>(k % 5));
    b.init(name + "_q", ints(DataType::kInt8, d, rng, -100, 100));
    b.init(name + "_s", floats({m}, *scales));
    b.init(name + "_z",
           Tensor::from_vector<int8_t>(DataType::kInt8, {m}, std::vector<int8_t>(m, static_cast<int8_t>(wzp))));
    ir::Node& n = b.node("DequantizeLinear", {name + "_q", name + "_s", name + "_z"}, {name});
    GraphBuilder::set_int(n, "axis", axis);
    return name;
  }
  // DQ of an int32 bias in units of xs * ws[m].
  std::string bias(const std::string& name, float xs, const std::vector<float>& ws) {
    std::vector<float> s;
    for (float w : ws) s.push_back(xs * w);
    const int64_t m = static_cast<int64_t>(ws.size());
    b.init(name + "_q", ints(DataType::kInt32, {m}, rng, -500, 500));
    b.init(name + "_s", floats({m}, s));
    b.init(name + "_z", Tensor::from_vector<int32_t>(DataType::kInt32, {m}, std::vector<int32_t>(m, 0)));
    ir::Node& n = b.node("DequantizeLinear", {name + "_q", name + "_s", name + "_z"}, {name});
    GraphBuilder::set_int(n, "axis", 0);
    return name;
  }

  ir::Model build(int64_t weight_zero_point) {
    b.input("x", {2, 3, 9, 11});
    const float xs = 1.f / 128;
    std::vector<float> w1s, w2s, w3s;
    std::string x = qdq("x", xs, 128);
    std::string w1 = weights("w1", {8, 3, 3, 3}, 0, &w1s, weight_zero_point);
    b.conv({x, w1, bias("b1", xs, w1s)}, "c1", 1);
    b.node("Relu", {"c1"}, {"r1"});
    const float s1 = 4.f / 255;
    std::string a1 = qdq("r1", s1, 0);
    std::string w2 = weights("w2", {8, 8, 1, 1}, 0, &w2s);
    b.conv({a1, w2, bias("b2", s1, w2s)}, "c2");
    std::string a2 = qdq("c2", 0.05f, 128);
    b.node("Add", {a2, a1}, {"sum"});
    std::string a3 = qdq("sum", 0.06f, 64);
    ir::Node& mp = b.node("MaxPool", {a3}, {"mp"});
    GraphBuilder::set_ints(mp, "kernel_shape", {2, 2});
    GraphBuilder::set_ints(mp, "strides", {2, 2});
    std::string a4 = qdq("mp", 0.06f, 64);
    b.node("GlobalAveragePool", {a4}, {"gap"});
    std::string a5 = qdq("gap", 0.03f, 100);
    b.node("Flatten", {a5}, {"flat"});
    std::string a6 = qdq("flat", 0.03f, 100);
    std::string w3 = weights("w3", {5, 8}, 0, &w3s);
    b.gemm_t({a6, w3, bias("b3", 0.03f, w3s)}, "logits_f");
    std::string y = qdq("logits_f", 0.02f, 128);
    b.node("Identity", {y}, {"y"});
    b.output("y");
    return b.finish();
  }
};

TEST(FoldQdqConv, FoldsAQuantizeStaticCnnAndKeepsItsResults) {
  QdqCnn net;
  ir::Model before = net.build(0);
  int changed = 0;
  ir::Model after = testing::apply_pass(before, passes::fold_qdq_conv, &changed);
  EXPECT_EQ(changed, 7);  // 3 convs (the Gemm one of them), the residual Add, 2 pools, Flatten
  const ir::Graph& g = *after.graph;
  EXPECT_EQ(testing::count_kiln(g, "QConv"), 3);
  EXPECT_EQ(testing::count_kiln(g, "QPool"), 2);
  for (const char* op : {"Conv", "Gemm", "Add", "MaxPool", "GlobalAveragePool", "Relu"})
    EXPECT_EQ(testing::count_op(g, op), 0) << op;
  // 8-bit values from the input's quantization (with the transpose into channels-last) to the output's DQ.
  EXPECT_EQ(testing::count_op(g, "QuantizeLinear"), 0);
  EXPECT_EQ(testing::count_kiln(g, "QuantizeChannelsLast"), 1);
  EXPECT_EQ(testing::count_op(g, "Transpose"), 0);
  EXPECT_EQ(testing::count_op(g, "DequantizeLinear"), 1);
  for (const auto& n : g.nodes) {
    if (n.op_type == "QPool") EXPECT_EQ(n.attr_int("channels_last", 0), 1) << n.name;
    if (n.op_type == "QConv" && n.inputs.size() == 4) EXPECT_EQ(n.attr_int("channels_last", 0), 1) << n.name;
  }
  // The residual fold skips the conv's own rounding: a few output steps (0.02) at most.
  for (uint64_t seed = 1; seed <= 3; ++seed) EXPECT_LE(testing::max_abs_diff(before, after, seed), 3 * 0.02 + 1e-6);
}

TEST(FoldQdqConv, ReadsScalesFromConstantNodes) {
  QdqCnn net;
  net.constant_nodes = true;
  ir::Model before = net.build(0);
  int changed = 0;
  ir::Model after = testing::apply_pass(before, passes::fold_qdq_conv, &changed);
  EXPECT_EQ(changed, 7);
  EXPECT_EQ(testing::count_kiln(*after.graph, "QConv"), 3);
  EXPECT_LE(testing::max_abs_diff(before, after), 3 * 0.02 + 1e-6);
}

TEST(FoldQdqConv, LeavesWeightsWithANonZeroZeroPoint) {
  QdqCnn net;
  ir::Model before = net.build(3);
  int changed = 0;
  ir::Model after = testing::apply_pass(before, passes::fold_qdq_conv, &changed);
  EXPECT_EQ(testing::count_op(*after.graph, "Conv"), 1);  // the first conv stays float
  EXPECT_LE(testing::max_abs_diff(before, after), 3 * 0.02 + 1e-6);
}

}  // namespace
}  // namespace kiln
