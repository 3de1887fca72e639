// fold_weight_dequantize: a constant weight's DequantizeLinear that no INT8 pattern took (here a
// classifier Gemm over 1M weight elements, more than fold_constants folds) becomes a float
// initializer, so the Gemm reads a constant weight; the values are unchanged.
#include "ir/attribute_builders.h"
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

TEST(FoldWeightDequantize, FoldsALargeConstantWeightAndKeepsTheValues) {
  // Weights [1000, 1025] (1.03M elements, per-row scales along axis 0) read by Gemm(transB=1).
  Tensor w(DataType::kInt8, {1000, 1025});
  std::mt19937 rng(7);
  for (int64_t i = 0; i < w.numel(); ++i) w.set_f64(i, static_cast<double>(static_cast<int>(rng() % 255) - 127));
  GraphBuilder b(13);
  b.input("x", {2, 1025}).output("y");
  b.init("w", w).init("w_scale", random_tensor({1000}, 3, DataType::kFloat32, 0.001, 0.01));
  b.init("w_zp", Tensor(DataType::kInt8, {1000}));
  b.node("DequantizeLinear", {"w", "w_scale", "w_zp"}, {"w_f"}).attrs["axis"] = ir::attr_int(0);
  b.node("Gemm", {"x", "w_f"}, {"y"}).attrs["transB"] = ir::attr_int(1);
  // An activation's DequantizeLinear (input not constant) stays.
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fold_weight_dequantize, &changed);
  EXPECT_EQ(changed, 1);
  EXPECT_EQ(count_op(*after.graph, "DequantizeLinear"), 0);
  ASSERT_TRUE(after.graph->initializers.count("w_f"));
  EXPECT_EQ(after.graph->initializers.at("w_f").dtype(), DataType::kFloat32);
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(FoldWeightDequantize, LeavesAnActivationsDequantizeLinear) {
  GraphBuilder b(13);
  b.input("x", {4, 3}, DataType::kUInt8).output("y");
  b.init("s", scalar_f(0.5f)).init("zp", Tensor::scalar<uint8_t>(DataType::kUInt8, 128));
  b.node("DequantizeLinear", {"x", "s", "zp"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fold_weight_dequantize, &changed);
  EXPECT_EQ(changed, 0);
  EXPECT_EQ(count_op(*after.graph, "DequantizeLinear"), 1);
}

}  // namespace
}  // namespace kiln
