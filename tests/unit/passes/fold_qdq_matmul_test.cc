// fold_qdq_matmul / fold_qdq_matmul_epilogue / fold_qdq_linear: ONNX Runtime's dynamic-quantization
// chain becomes kiln.DynQMatMul, the static Q/DQ form kiln.QMatMul or QLinearMatMul; and the reference interpreter
// gives the same values before and after (exactly: the fused reference runs the same ONNX kernels in the same order).
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

// fold_qdq_linear: the static Q/DQ form of a linear layer with a float output (kiln's calibrator writes
// it around every projection of a transformer) -> kiln.QMatMul. The reference interpreter gives the
// same values before and after up to float rounding: the Q/DQ graph sums the dequantized products in
// float, the layer sums the integers exactly and scales once. Random odd shapes; every weight form.
struct StaticLinear {
  int64_t k, n;
  bool per_column, zero_point, bias;
};

void static_linear(GraphBuilder& b, const std::string& dq_x, const std::string& p, const StaticLinear& l, uint64_t seed,
                   const std::string& out) {
  b.init(p + "_w", int8_weights({l.k, l.n}, seed));
  b.init(p + "_ws", l.per_column ? random_tensor({l.n}, seed + 1, DataType::kFloat32, 0.001, 0.02) : scalar_f(0.01f));
  std::vector<std::string> dq = {p + "_w", p + "_ws"};
  if (l.zero_point) {
    b.init(p + "_wz", l.per_column ? int8_weights({l.n}, seed + 2) : Tensor::scalar<int8_t>(DataType::kInt8, -3));
    dq.push_back(p + "_wz");
  }
  b.node("DequantizeLinear", dq, {p + "_wf"}).attrs["axis"] = ir::attr_int(1);
  if (!l.bias) {
    b.node("MatMul", {dq_x, p + "_wf"}, {out});
    return;
  }
  b.init(p + "_b", random_tensor({l.n}, seed + 3));
  b.node("MatMul", {dq_x, p + "_wf"}, {p + "_m"});
  b.node("Add", {p + "_m", p + "_b"}, {out});
}

// The float rounding of a K-term dot product of these magnitudes (|x| <= 1, |w| <= 128 * 0.02).
double rounding_bound(int64_t k) { return 4e-7 * static_cast<double>(k) * 2.56 * 4; }

TEST(FoldQdqLinear, FoldsStaticLinearLayersWithFloatOutputs) {
  std::mt19937 rng(21);
  static const int64_t kDims[] = {1, 3, 7, 16, 17, 33, 64, 129};
  for (int iter = 0; iter < 24; ++iter) {
    StaticLinear l{kDims[rng() % 8], kDims[rng() % 8], rng() % 2 == 0, rng() % 3 == 0, rng() % 4 != 0};
    const int64_t rows = kDims[rng() % 8];
    GraphBuilder b(14);
    b.input("xf", {2, rows, l.k}).output("y");
    b.init("xs", scalar_f(0.0078f)).init("xz", Tensor::scalar<uint8_t>(DataType::kUInt8, static_cast<uint8_t>(rng())));
    b.node("QuantizeLinear", {"xf", "xs", "xz"}, {"xq"});
    b.node("DequantizeLinear", {"xq", "xs", "xz"}, {"x"});
    static_linear(b, "x", "l", l, 40 + static_cast<uint64_t>(iter), "y");
    ir::Model before = b.finish();
    int changed = 0;
    ir::Model after = apply_pass(before, passes::fold_qdq_linear, &changed);
    EXPECT_EQ(changed, 1) << iter;
    ASSERT_EQ(count_kiln(*after.graph, "QMatMul"), 1) << iter;
    // The layer read by it alone: the layer quantizes the float input itself.
    EXPECT_EQ(count_op(*after.graph, "QuantizeLinear"), 0) << iter;
    EXPECT_EQ(count_op(*after.graph, "DequantizeLinear"), 0) << iter;
    EXPECT_EQ(count_op(*after.graph, "MatMul") + count_op(*after.graph, "Add"), 0) << iter;
    EXPECT_EQ(find_op(*after.graph, "QMatMul")->inputs[0], "xf");
    double d = max_abs_diff(before, after, 5 + static_cast<uint64_t>(iter));
    EXPECT_LE(d, rounding_bound(l.k)) << iter << ": k " << l.k << " n " << l.n;
  }
}

TEST(FoldQdqLinear, SharedQuantizerStaysOnceAndEpilogueFolds) {
  // x -> Q -> DQ read by two projections (Q/K/V): the QuantizeLinear stays, both layers read its uint8
  // output; then the first one's residual Add and GELU fold into it, the second's Relu.
  GraphBuilder b(20);  // ONNX Gelu
  b.input("xf", {3, 17}).input("r", {3, 9}).output("y1").output("y2");
  b.init("xs", scalar_f(0.0078f)).init("xz", Tensor::scalar<uint8_t>(DataType::kUInt8, 120));
  b.node("QuantizeLinear", {"xf", "xs", "xz"}, {"xq"});
  b.node("DequantizeLinear", {"xq", "xs", "xz"}, {"x"});
  static_linear(b, "x", "a", {17, 9, true, false, true}, 3, "h1");
  static_linear(b, "x", "b", {17, 5, false, false, true}, 7, "h2");
  b.node("Add", {"h1", "r"}, {"s1"});
  b.node("Gelu", {"s1"}, {"y1"});
  b.node("Relu", {"h2"}, {"y2"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fold_qdq_linear, &changed);
  EXPECT_EQ(changed, 2);
  EXPECT_EQ(count_kiln(*after.graph, "QMatMul"), 2);
  EXPECT_EQ(count_op(*after.graph, "QuantizeLinear"), 1);
  EXPECT_EQ(count_op(*after.graph, "DequantizeLinear"), 0);
  for (const auto& n : after.graph->nodes)
    if (n.op_type == "QMatMul") EXPECT_EQ(n.inputs[0], "xq");
  EXPECT_LE(max_abs_diff(before, after), rounding_bound(17));
  ir::Model fused = apply_pass(after, passes::fold_qdq_matmul_epilogue, &changed);
  EXPECT_EQ(changed, 3);  // residual, GELU, Relu
  EXPECT_EQ(count_op(*fused.graph, "Add") + count_op(*fused.graph, "Gelu") + count_op(*fused.graph, "Relu"), 0);
  EXPECT_LE(max_abs_diff(before, fused), rounding_bound(17) + 1e-6);
}

TEST(FoldQdqLinear, FoldsTheCalibratedClassifierGemm) {
  // The inserter's classifier: Gemm(transB) with a per-row int8 weight and an int32 bias in units of
  // x_scale * w_scale, writing the (float) logits.
  for (int64_t k : {5, 64, 129}) {
    const int64_t n = 11;
    GraphBuilder b(14);
    b.input("xf", {2, k}).output("logits");
    b.init("xs", scalar_f(0.0078f)).init("xz", Tensor::scalar<uint8_t>(DataType::kUInt8, 128));
    b.init("w", int8_weights({n, k}, 9)).init("ws", random_tensor({n}, 3, DataType::kFloat32, 0.001, 0.02));
    b.init("wz", Tensor::from_vector<int8_t>(DataType::kInt8, {n}, std::vector<int8_t>(n, 0)));
    Tensor bq(DataType::kInt32, {n}), bs(DataType::kFloat32, {n});
    const Tensor ws = random_tensor({n}, 3, DataType::kFloat32, 0.001, 0.02);
    for (int64_t i = 0; i < n; ++i) bq.data<int32_t>()[i] = static_cast<int32_t>(i * 977 - 5000);
    for (int64_t i = 0; i < n; ++i) bs.data<float>()[i] = 0.0078f * ws.data<float>()[i];
    b.init("bq", bq).init("bs", bs).init(
        "bz", Tensor::from_vector<int32_t>(DataType::kInt32, {n}, std::vector<int32_t>(n, 0)));
    b.node("QuantizeLinear", {"xf", "xs", "xz"}, {"xq"});
    b.node("DequantizeLinear", {"xq", "xs", "xz"}, {"x"});
    b.node("DequantizeLinear", {"w", "ws", "wz"}, {"wf"}).attrs["axis"] = ir::attr_int(0);
    b.node("DequantizeLinear", {"bq", "bs", "bz"}, {"bf"}).attrs["axis"] = ir::attr_int(0);
    b.node("Gemm", {"x", "wf", "bf"}, {"logits"}).attrs["transB"] = ir::attr_int(1);
    ir::Model before = b.finish();
    int changed = 0;
    ir::Model after = apply_pass(before, passes::fold_qdq_linear, &changed);
    EXPECT_EQ(changed, 1);
    EXPECT_EQ(count_kiln(*after.graph, "QMatMul"), 1);
    EXPECT_EQ(count_op(*after.graph, "Gemm") + count_op(*after.graph, "DequantizeLinear"), 0);
    EXPECT_LE(max_abs_diff(before, after), rounding_bound(k) + 1e-6) << k;
  }
}

TEST(FoldQdqLinear, LeavesQuantizedOutputsAndActivationProducts) {
  // A product read by a QuantizeLinear alone becomes QLinearMatMul (8-bit out), not a float layer;
  // an activation x activation product and a float-weight MatMul stay.
  GraphBuilder b(14);
  b.input("xf", {4, 7}).input("bq", {7, 3}, DataType::kUInt8).output("y").output("p").output("f");
  b.init("s", scalar_f(0.01f)).init("z", Tensor::scalar<uint8_t>(DataType::kUInt8, 3));
  b.init("w", int8_weights({7, 3}, 4)).init("ws", scalar_f(0.004f)).init("wfl", random_tensor({7, 3}, 8));
  b.node("QuantizeLinear", {"xf", "s", "z"}, {"xq"});
  b.node("DequantizeLinear", {"xq", "s", "z"}, {"x"});
  b.node("DequantizeLinear", {"w", "ws"}, {"wf"});
  b.node("MatMul", {"x", "wf"}, {"m"});
  b.node("QuantizeLinear", {"m", "s", "z"}, {"mq"});
  b.node("DequantizeLinear", {"mq", "s", "z"}, {"y"});
  b.node("DequantizeLinear", {"bq", "s", "z"}, {"bf"});
  b.node("MatMul", {"x", "bf"}, {"p"});
  b.node("MatMul", {"x", "wfl"}, {"f"});
  ir::Model m = b.finish();
  EXPECT_EQ(passes::fold_qdq_linear(*m.graph).value(), 1);
  EXPECT_EQ(count_op(*m.graph, "QLinearMatMul"), 1);
  EXPECT_EQ(count_kiln(*m.graph, "QMatMul"), 0);
  EXPECT_EQ(count_op(*m.graph, "MatMul"), 2);
}

}  // namespace
}  // namespace kiln
