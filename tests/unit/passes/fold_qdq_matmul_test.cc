// fold_qdq_matmul / fold_qdq_matmul_epilogue: ONNX Runtime's dynamic-quantization chain becomes
// kiln.DynQMatMul, and the reference interpreter gives the same values before and after (exactly:
// the fused reference runs the same ONNX kernels in the same order).
#include "ir/attribute_builders.h"
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

Tensor int8_weights(Dims d, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  Tensor t(DataType::kInt8, std::move(d));
  for (int64_t i = 0; i < t.numel(); ++i) t.set_f64(i, static_cast<double>(static_cast<int>(rng() % 256) - 128));
  return t;
}

// quantize_dynamic's chain for one linear layer of x [2, 5, 7] with weight [7, n]:
// DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(Mul(scale, w_scale)) -> Add(bias).
void linear(GraphBuilder& b, const std::string& x, const std::string& p, int64_t n, bool bias, bool per_column_scale,
            const std::string& out) {
  b.init(p + "_w", int8_weights({7, n}, n)).init(p + "_wzp", Tensor::scalar<int8_t>(DataType::kInt8, 0));
  b.init(p + "_ws", per_column_scale ? random_tensor({n}, 5, DataType::kFloat32, 0.01, 0.02) : scalar_f(0.015f));
  b.node("DynamicQuantizeLinear", {x}, {p + "_q", p + "_s", p + "_z"});
  b.node("Mul", {p + "_s", p + "_ws"}, {p + "_ms"});
  b.node("MatMulInteger", {p + "_q", p + "_w", p + "_z", p + "_wzp"}, {p + "_acc"});
  b.node("Cast", {p + "_acc"}, {p + "_accf"}).attrs["to"] = ir::attr_int(1);
  if (!bias) {
    b.node("Mul", {p + "_accf", p + "_ms"}, {out});
    return;
  }
  b.init(p + "_b", random_tensor({n}, 9));
  b.node("Mul", {p + "_accf", p + "_ms"}, {p + "_y"});
  b.node("Add", {p + "_b", p + "_y"}, {out});
}

TEST(FoldQdqMatMul, FoldsTheDynamicQuantizationChainExactly) {
  GraphBuilder b(14);
  b.input("x", {2, 5, 7}).output("y").output("z");
  linear(b, "x", "l1", 7, true, false, "h");
  b.node("Relu", {"h"}, {"r"});
  linear(b, "r", "l2", 3, false, true, "z0");
  b.node("Add", {"x", "r"}, {"y"});
  b.node("Identity", {"z0"}, {"z"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fold_qdq_matmul, &changed);
  EXPECT_EQ(changed, 2);
  EXPECT_EQ(count_kiln(*after.graph, "DynQMatMul"), 2);
  EXPECT_EQ(count_op(*after.graph, "MatMulInteger"), 0);
  EXPECT_EQ(count_op(*after.graph, "Cast"), 0);
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
  ir::Model fused = apply_pass(after, passes::fold_qdq_matmul_epilogue, &changed);
  EXPECT_EQ(changed, 1);  // the Relu; its output r has two readers, so no residual
  const ir::Node* l1 = find_op(*fused.graph, "DynQMatMul");
  ASSERT_NE(l1, nullptr);
  EXPECT_EQ(l1->attr_string("activation", ""), "Relu");
  EXPECT_EQ(max_abs_diff(before, fused), 0.0);
}

TEST(FoldQdqMatMul, FoldsResidualThenActivation) {
  GraphBuilder b(14);
  b.input("x", {2, 5, 7}).input("r", {2, 5, 7}).output("y");
  linear(b, "x", "l1", 7, true, true, "h");
  b.node("Add", {"r", "h"}, {"hr"});
  b.node("Relu", {"hr"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fold_qdq_matmul, &changed);
  ASSERT_EQ(changed, 1);
  ir::Model fused = apply_pass(after, passes::fold_qdq_matmul_epilogue, &changed);
  EXPECT_EQ(changed, 2);
  ASSERT_EQ(count_kiln(*fused.graph, "DynQMatMul"), 1);
  EXPECT_EQ(count_op(*fused.graph, "Add"), 0);
  EXPECT_EQ(count_op(*fused.graph, "Relu"), 0);
  const ir::Node& n = *find_op(*fused.graph, "DynQMatMul");
  EXPECT_EQ(n.inputs.size(), 6u);
  EXPECT_EQ(n.inputs[5], "r");
  EXPECT_EQ(n.attr_string("activation", ""), "Relu");
  EXPECT_EQ(max_abs_diff(before, fused), 0.0);
}

TEST(FoldQdqMatMul, LeavesOtherIntegerProductsAlone) {
  GraphBuilder b(14);
  b.input("x", {5, 7}).input("w", {7, 4}, DataType::kInt8).output("y1").output("y2").output("acc3");
  b.init("wc", int8_weights({7, 4}, 3)).init("zero", Tensor::scalar<uint8_t>(DataType::kUInt8, 3));
  b.node("DynamicQuantizeLinear", {"x"}, {"q", "s", "z"});
  // B not a constant (an activation x activation product)
  b.node("MatMulInteger", {"q", "w", "z"}, {"acc1"});
  b.node("Cast", {"acc1"}, {"f1"}).attrs["to"] = ir::attr_int(1);
  b.node("Mul", {"f1", "s"}, {"y1"});
  // another zero point than the quantizer's
  b.node("MatMulInteger", {"q", "wc", "zero"}, {"acc2"});
  b.node("Cast", {"acc2"}, {"f2"}).attrs["to"] = ir::attr_int(1);
  b.node("Mul", {"f2", "s"}, {"y2"});
  // the integer product read as it is
  b.node("MatMulInteger", {"q", "wc", "z"}, {"acc3"});
  ir::Model m = b.finish();
  EXPECT_EQ(passes::fold_qdq_matmul(*m.graph).value(), 0);
  EXPECT_EQ(count_op(*m.graph, "MatMulInteger"), 3);
}

// quantize_static's form: Q(MatMul(DQ(x), DQ(W))) -> QLinearMatMul, per-tensor and per-column weight
// scales. The integer path sums exactly where the float MatMul rounds: outputs within one step.
TEST(FoldQdqMatMul, FoldsStaticQdqMatMulToQLinearMatMul) {
  for (bool per_column : {false, true}) {
    GraphBuilder b(14);
    b.input("xf", {2, 5, 7}).output("y");
    b.init("xs", scalar_f(0.01f)).init("xz", Tensor::scalar<uint8_t>(DataType::kUInt8, 128));
    b.init("w", int8_weights({7, 6}, 4));
    b.init("wz", per_column ? Tensor::from_vector<int8_t>(DataType::kInt8, {6}, std::vector<int8_t>(6, 0))
                            : Tensor::scalar<int8_t>(DataType::kInt8, 0));
    b.init("ws", per_column ? random_tensor({6}, 5, DataType::kFloat32, 0.001, 0.01) : scalar_f(0.004f));
    b.init("ys", scalar_f(0.02f)).init("yz", Tensor::scalar<uint8_t>(DataType::kUInt8, 120));
    b.node("QuantizeLinear", {"xf", "xs", "xz"}, {"xq"});
    b.node("DequantizeLinear", {"xq", "xs", "xz"}, {"x"});
    b.node("DequantizeLinear", {"w", "ws", "wz"}, {"wf"}).attrs["axis"] = ir::attr_int(1);
    b.node("MatMul", {"x", "wf"}, {"m"});
    b.node("QuantizeLinear", {"m", "ys", "yz"}, {"yq"});
    b.node("DequantizeLinear", {"yq", "ys", "yz"}, {"y"});
    ir::Model before = b.finish();
    int changed = 0;
    ir::Model after = apply_pass(before, passes::fold_qdq_matmul, &changed);
    EXPECT_EQ(changed, 1);
    EXPECT_EQ(count_op(*after.graph, "QLinearMatMul"), 1);
    EXPECT_EQ(count_op(*after.graph, "MatMul"), 0);
    EXPECT_LE(max_abs_diff(before, after), 0.02 * 1.001);  // at most one output step
  }
}

TEST(FoldQdqMatMul, LeavesActivationProductsAndFloatOutputsAlone) {
  GraphBuilder b(14);
  b.input("aq", {4, 7}, DataType::kUInt8).input("bq", {7, 3}, DataType::kUInt8).output("y").output("m2");
  b.init("s", scalar_f(0.01f)).init("z", Tensor::scalar<uint8_t>(DataType::kUInt8, 3));
  b.init("w", int8_weights({7, 3}, 4)).init("ws", scalar_f(0.004f));
  b.node("DequantizeLinear", {"aq", "s", "z"}, {"a"});
  b.node("DequantizeLinear", {"bq", "s", "z"}, {"bf"});
  b.node("MatMul", {"a", "bf"}, {"m"});  // activation x activation
  b.node("QuantizeLinear", {"m", "s", "z"}, {"y"});
  b.node("DequantizeLinear", {"w", "ws"}, {"wf"});
  b.node("MatMul", {"a", "wf"}, {"m2"});  // float output, no QuantizeLinear
  ir::Model m = b.finish();
  EXPECT_EQ(passes::fold_qdq_matmul(*m.graph).value(), 0);
  EXPECT_EQ(count_op(*m.graph, "MatMul"), 2);
}

}  // namespace
}  // namespace kiln
