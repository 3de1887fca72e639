// Q/DQ insertion (quant/qdq_insert.h): the pattern ONNX Runtime's quantize_static writes, checked
// node by node, and the quantized graph's outputs against the FP32 graph's on the reference interpreter.
#include "quant/qdq_insert.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "../expect_status.h"
#include "../graph_builder.h"
#include "ir/rewrite.h"

namespace kiln::quant {
namespace {

using testing::GraphBuilder;

// x -> Conv(+bias) -> Relu -> MaxPool -> Conv -> Add(with the pool) -> Relu -> GlobalAveragePool ->
// Flatten -> Gemm(transB) -> logits: resnet's block in small, odd sizes.
ir::Model small_net(int opset = 17) {
  GraphBuilder b(opset);
  b.input("x", {2, 3, 9, 7});
  b.init("w1", testing::random_tensor({5, 3, 3, 3}, 1)).init("b1", testing::random_tensor({5}, 2));
  b.init("w2", testing::random_tensor({5, 5, 3, 3}, 3, DataType::kFloat32, -0.5, 0.5));
  b.init("wf", testing::random_tensor({4, 5}, 4)).init("bf", testing::random_tensor({4}, 5));
  b.conv({"x", "w1", "b1"}, "c1", 1);
  b.node("Relu", {"c1"}, {"r1"});
  ir::Node& mp = b.node("MaxPool", {"r1"}, {"p1"});
  GraphBuilder::set_ints(mp, "kernel_shape", {2, 2});
  b.conv({"p1", "w2"}, "c2", 1).name = "conv2";
  b.node("Add", {"c2", "p1"}, {"a2"});
  b.node("Relu", {"a2"}, {"r2"});
  b.node("GlobalAveragePool", {"r2"}, {"g"});
  b.node("Flatten", {"g"}, {"f"});
  b.gemm_t({"f", "wf", "bf"}, "logits");
  b.output("logits");
  return b.finish();
}

// Per-tensor min/max of every value on the reference interpreter: what minmax calibration measures.
std::map<std::string, Range> observed_ranges(const ir::Model& m, const std::vector<std::string>& names) {
  std::map<std::string, Range> r;
  ops::Interpreter interp(m.graph);
  auto in = testing::random_inputs(*m.graph, 11);
  std::map<std::string, TensorStats> st;
  for (const auto& [name, v] : in) st[name].add_range(v.tensor.data<float>(), v.tensor.numel());
  interp.on_node = [&](const ir::Node& n, const std::vector<ops::Value>& outs) {
    for (size_t i = 0; i < outs.size(); ++i)
      st[n.outputs[i]].add_range(outs[i].tensor.data<float>(), outs[i].tensor.numel());
  };
  EXPECT_TRUE(interp.run(in).ok());
  for (const auto& n : names) r[n] = calibrated_range(st.at(n), Calibrator::kMinMax, 0);
  return r;
}

const ir::Node* producer(const ir::Graph& g, const std::string& v) {
  for (const auto& n : g.nodes)
    for (const auto& o : n.outputs)
      if (o == v) return &n;
  return nullptr;
}

TEST(QdqInsert, PlanObservesWhatQuantizedNodesRead) {
  ir::Model m = small_net();
  QdqPlan p = plan_qdq(*m.graph, nullptr).value();
  // Conv, MaxPool, Conv, Add, GlobalAveragePool, Flatten, Gemm; Relus absorbed (both feed only quantized nodes).
  EXPECT_EQ(p.nodes.size(), 7u);
  EXPECT_EQ(p.absorbed.size(), 2u);
  // Measured: the input, the Relu outputs, conv2's output; the pool and flatten outputs take their input's.
  EXPECT_EQ(p.observe, (std::vector<std::string>{"x", "r1", "c2", "r2", "g"}));
  EXPECT_EQ(p.same_scale_as.at("p1"), "r1");
  EXPECT_EQ(p.same_scale_as.at("f"), "g");
}

TEST(QdqInsert, OrtPatternAndCloseToFp32) {
  ir::Model fp32 = small_net();
  ir::Model q = testing::clone(fp32);
  QdqPlan p = plan_qdq(*q.graph, nullptr).value();
  auto ranges = observed_ranges(fp32, p.observe);
  QdqResult r = insert_qdq(*q.graph, p, ranges).value();
  ir::Graph& g = *q.graph;
  ASSERT_TRUE(ops::infer_shapes(g).ok());
  EXPECT_EQ(testing::count_op(g, "Relu"), 0);
  EXPECT_EQ(r.removed_activations, 2);
  EXPECT_EQ(r.weights, 3);
  EXPECT_EQ(r.biases, 2);
  // One Q per quantized activation read (x, r1, p1, c2, r2, g, f), a DQ for each and per weight and bias.
  EXPECT_EQ(testing::count_op(g, "QuantizeLinear"), 7);
  EXPECT_EQ(testing::count_op(g, "DequantizeLinear"), 7 + 3 + 2);
  // Conv1: DQ(x), DQ(w per axis 0, int8, zp 0), DQ(bias int32, scale s_x * s_w), output r1 (its Relu's).
  const ir::Node* c1 = producer(g, "r1");
  ASSERT_NE(c1, nullptr);
  EXPECT_EQ(c1->op_type, "Conv");
  const ir::Node* dqx = producer(g, c1->inputs[0]);
  ASSERT_EQ(dqx->op_type, "DequantizeLinear");
  EXPECT_EQ(producer(g, dqx->inputs[0])->op_type, "QuantizeLinear");
  EXPECT_EQ(g.initializers.at(dqx->inputs[2]).dtype(), DataType::kUInt8);
  const ir::Node* dqw = producer(g, c1->inputs[1]);
  ASSERT_EQ(dqw->op_type, "DequantizeLinear");
  EXPECT_EQ(dqw->attr_int("axis", -1), 0);
  const Tensor& wq = g.initializers.at(dqw->inputs[0]);
  EXPECT_EQ(wq.dtype(), DataType::kInt8);
  EXPECT_EQ(g.initializers.at(dqw->inputs[1]).shape(), (Dims{5}));
  int absmax = 0;
  for (int64_t i = 0; i < wq.numel(); ++i) absmax = std::max(absmax, std::abs(static_cast<int>(wq.data<int8_t>()[i])));
  EXPECT_EQ(absmax, 127);  // symmetric: each channel's largest weight at the end of the range
  const ir::Node* dqb = producer(g, c1->inputs[2]);
  ASSERT_EQ(dqb->op_type, "DequantizeLinear");
  EXPECT_EQ(g.initializers.at(dqb->inputs[0]).dtype(), DataType::kInt32);
  const float sx = g.initializers.at(dqx->inputs[1]).data<float>()[0];
  EXPECT_FLOAT_EQ(g.initializers.at(dqb->inputs[1]).data<float>()[2],
                  sx * g.initializers.at(dqw->inputs[1]).data<float>()[2]);
  // After the removed Relu, the zero point is 0 (the Q clamps where the Relu did).
  const ir::Node* qr1 = nullptr;
  for (const auto& n : g.nodes)
    if (n.op_type == "QuantizeLinear" && n.inputs[0] == "r1") qr1 = &n;
  ASSERT_NE(qr1, nullptr);
  EXPECT_EQ(g.initializers.at(qr1->inputs[2]).data<uint8_t>()[0], 0);
  // MaxPool's output is requantized with its input's scale and zero point (the same initializers).
  for (const auto& n : g.nodes)
    if (n.op_type == "QuantizeLinear" && n.inputs[0] == "p1") EXPECT_EQ(n.inputs[1], qr1->inputs[1]);
  // Gemm with transB: weight per axis 0; its output (the graph output) stays FP32.
  const ir::Node* gemm = producer(g, "logits");
  ASSERT_EQ(gemm->op_type, "Gemm");
  EXPECT_EQ(producer(g, gemm->inputs[1])->attr_int("axis", -1), 0);
  // The original weights are gone; the model still names its output.
  EXPECT_EQ(g.initializers.count("w1"), 0u);
  EXPECT_EQ(g.outputs[0].name, "logits");
  // Numbers: close to FP32 (8 bits over these ranges), but not equal (quantization happened).
  double d = testing::max_abs_diff(fp32, q, 11);
  EXPECT_GT(d, 0);
  EXPECT_LT(d, 0.1);
}

TEST(QdqInsert, ExcludedNodesStayFp32) {
  ir::Model q = small_net();
  QdqPlan p = plan_qdq(*q.graph, [](const ir::Node& n) { return n.name == "conv2"; }).value();
  EXPECT_EQ(p.excluded, (std::vector<std::string>{"conv2"}));
  auto ranges = observed_ranges(small_net(), p.observe);
  insert_qdq(*q.graph, p, ranges).value();
  const ir::Node* c2 = producer(*q.graph, "c2");
  ASSERT_NE(c2, nullptr);
  EXPECT_EQ(c2->inputs[1], "w2");  // the FP32 weight
  EXPECT_TRUE(q.graph->initializers.count("w2"));
  // Its input is the quantized MaxPool's output leaving the INT8 region (through its DQ); the Add it
  // feeds has no quantized conv input left, so it stays FP32 too (it reads conv2's float output and
  // the pool's DQ, and its output gets no Q).
  EXPECT_TRUE(p.exits.count("p1"));
  const ir::Node* dq = producer(*q.graph, c2->inputs[0]);
  ASSERT_NE(dq, nullptr);
  EXPECT_EQ(dq->op_type, "DequantizeLinear");
  const ir::Node* add = producer(*q.graph, "a2");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->inputs[0], "c2");
  EXPECT_EQ(add->inputs[1], c2->inputs[0]);
  EXPECT_EQ(std::count(p.observe.begin(), p.observe.end(), "a2"), 0);
}

TEST(QdqInsert, ClipWithANegativeFloorIsNotAbsorbed) {
  GraphBuilder b;
  b.input("x", {1, 2, 5, 5}).init("w", testing::random_tensor({3, 2, 1, 1}, 7));
  b.init("lo", Tensor::scalar<float>(DataType::kFloat32, -1.f))
      .init("hi", Tensor::scalar<float>(DataType::kFloat32, 1.f));
  b.init("w2", testing::random_tensor({3, 3, 1, 1}, 8));
  b.conv({"x", "w"}, "c");
  b.node("Clip", {"c", "lo", "hi"}, {"k"});
  b.conv({"k", "w2"}, "c2");
  b.node("Sigmoid", {"c2"}, {"y"});
  b.output("y");
  ir::Model m = b.finish();
  QdqPlan p = plan_qdq(*m.graph, nullptr).value();
  EXPECT_TRUE(p.absorbed.empty());
  // c: the first conv's output, which the (FP32) Clip reads through a DQ; k: the second conv's input;
  // c2: its output, which the Sigmoid reads through a DQ.
  EXPECT_EQ(p.observe, (std::vector<std::string>{"x", "c", "k", "c2"}));
  EXPECT_EQ(p.exits, (std::set<std::string>{"c", "c2"}));
}

// Weights and biases round half to even, as numpy's round in ONNX Runtime's quantizer (std::round's ties
// away from zero moved 124 of mobilenet_v2_fmnist's 2.2M weights off ONNX Runtime's).
TEST(QdqInsert, WeightsAndBiasesRoundHalfToEven) {
  GraphBuilder b;
  b.input("x", {1, 1, 3, 4});
  // One output channel whose largest |w| is 127: scale exactly 1, so each w / scale is w, ties included.
  Tensor w(DataType::kFloat32, {1, 1, 2, 3});
  const float wv[] = {127.f, 2.5f, -2.5f, 0.5f, 1.5f, -3.5f};
  std::copy(wv, wv + 6, w.data<float>());
  Tensor bias(DataType::kFloat32, {1});
  bias.data<float>()[0] = 4.5f;  // input scale 1 (range [0, 255]) times weight scale 1: 4.5 steps
  b.init("w", std::move(w)).init("b", std::move(bias));
  b.conv({"x", "w", "b"}, "c");
  b.node("Sigmoid", {"c"}, {"y"});
  b.output("y");
  ir::Model m = b.finish();
  QdqPlan p = plan_qdq(*m.graph, nullptr).value();
  std::map<std::string, Range> ranges;
  for (const auto& v : p.observe) ranges[v] = {0, 255};
  insert_qdq(*m.graph, p, ranges).value();
  const ir::Node* c = producer(*m.graph, "c");
  ASSERT_NE(c, nullptr);
  const ir::Node* dqw = producer(*m.graph, c->inputs[1]);
  const ir::Node* dqb = producer(*m.graph, c->inputs[2]);
  ASSERT_TRUE(dqw && dqb);
  ASSERT_EQ(m.graph->initializers.at(dqw->inputs[1]).data<float>()[0], 1.f);
  const Tensor& wq = m.graph->initializers.at(dqw->inputs[0]);
  std::vector<int> got(wq.data<int8_t>(), wq.data<int8_t>() + wq.numel());
  EXPECT_EQ(got, (std::vector<int>{127, 2, -2, 0, 2, -4}));  // ties away would give 3, -3, 1, 2, -4
  ASSERT_EQ(m.graph->initializers.at(dqb->inputs[1]).data<float>()[0], 1.f);
  EXPECT_EQ(m.graph->initializers.at(dqb->inputs[0]).data<int32_t>()[0], 4);  // not 5
}

TEST(QdqInsert, NeedsOpset13AndEveryRange) {
  ir::Model m = small_net(12);
  QdqPlan p = plan_qdq(*m.graph, nullptr).value();
  testing::expect_error(insert_qdq(*m.graph, p, observed_ranges(small_net(12), p.observe)).status(),
                        ErrorCode::kUnsupported, "opset 13");
  ir::Model m2 = small_net();
  QdqPlan p2 = plan_qdq(*m2.graph, nullptr).value();
  testing::expect_error(insert_qdq(*m2.graph, p2, {}).status(), ErrorCode::kInvalidArgument,
                        "no calibrated range for activation 'x'");
}

}  // namespace
}  // namespace kiln::quant
