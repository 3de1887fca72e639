// Elementwise family: exact values, legacy (opset < 7) forms, error paths and shape inference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops/interpreter.h"
#include "ops/registry.h"

namespace kiln::ops {
namespace {

ir::Attribute int_attr(int64_t v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kInt;
  a.i = v;
  return a;
}
ir::Attribute float_attr(float v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kFloat;
  a.f = v;
  return a;
}
ir::Attribute string_attr(const std::string& v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kString;
  a.s = v;
  return a;
}

ir::Node make_node(const std::string& op, int opset, size_t n_inputs, std::map<std::string, ir::Attribute> attrs = {}) {
  ir::Node n;
  n.name = "n";
  n.op_type = op;
  n.opset = opset;
  for (size_t i = 0; i < n_inputs; ++i) n.inputs.push_back("in" + std::to_string(i));
  n.outputs = {"out"};
  n.attrs = std::move(attrs);
  return n;
}

// Runs the node's reference kernel; an empty (undefined) tensor marks a missing optional input.
Result<Tensor> run(const ir::Node& n, const std::vector<Tensor>& inputs) {
  const OpSchema* s = OpRegistry::get().find("", n.op_type, n.opset);
  if (!s) return NotFound("no schema for ", n.op_type, " opset ", n.opset);
  std::vector<Value> vals;
  for (const Tensor& t : inputs) vals.push_back(t.defined() ? Value(t) : Value());
  std::vector<const Value*> ptrs;
  for (const Value& v : vals) ptrs.push_back(v.is_none() ? nullptr : &v);
  auto r = run_node(n, *s, ptrs, nullptr);
  if (!r.ok()) return r.status();
  return r.value()[0].tensor;
}

Result<ir::TypeInfo> infer(const ir::Node& n, const std::vector<ir::TypeInfo>& inputs) {
  const OpSchema* s = OpRegistry::get().find("", n.op_type, n.opset);
  if (!s) return NotFound("no schema");
  InferContext ctx(n);
  for (const auto& t : inputs) ctx.inputs.push_back(&t);
  ctx.constants.assign(inputs.size(), nullptr);
  ctx.outputs.resize(1);
  KILN_RETURN_IF_ERROR(s->infer(ctx));
  return ctx.outputs[0];
}

Tensor f32(Dims shape, std::vector<float> v) { return Tensor::from_vector<float>(DataType::kFloat32, shape, v); }
Tensor i64(Dims shape, std::vector<int64_t> v) { return Tensor::from_vector<int64_t>(DataType::kInt64, shape, v); }

template <typename T>
std::vector<T> values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

SymShape sym(std::vector<Dim> d) { return SymShape(std::move(d)); }

TEST(Binary, AddBroadcastsAndIntegersWrap) {
  Tensor r = run(make_node("Add", 14, 2), {f32({2, 2}, {1, 2, 3, 4}), f32({2}, {10, 20})}).value();
  EXPECT_EQ(r.shape(), (Dims{2, 2}));
  EXPECT_EQ(values<float>(r), (std::vector<float>{11, 22, 13, 24}));
  Tensor a = Tensor::from_vector<int8_t>(DataType::kInt8, {1}, {127});
  Tensor w = run(make_node("Add", 14, 2), {a, a}).value();
  EXPECT_EQ(w.data<int8_t>()[0], -2);
  Tensor u = Tensor::from_vector<uint16_t>(DataType::kUInt16, {1}, {65535});
  EXPECT_EQ(run(make_node("Mul", 14, 2), {u, u}).value().data<uint16_t>()[0], 1);
}

TEST(Binary, DtypeMismatchAndBadShapesFail) {
  auto r = run(make_node("Add", 14, 2), {f32({2}, {1, 2}), i64({2}, {1, 2})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dtype"), std::string::npos);
  auto b = run(make_node("Sub", 14, 2), {f32({2}, {1, 2}), f32({3}, {1, 2, 3})});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("cannot be broadcast"), std::string::npos);
}

TEST(Binary, IntegerDivisionByZeroIsAnError) {
  auto r = run(make_node("Div", 14, 2), {i64({1}, {5}), i64({1}, {0})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("division by zero"), std::string::npos);
  Tensor t = run(make_node("Div", 14, 2), {i64({2}, {-7, INT64_MIN}), i64({2}, {2, -1})}).value();
  EXPECT_EQ(values<int64_t>(t), (std::vector<int64_t>{-3, INT64_MIN}));  // truncates; overflow wraps
}

TEST(Binary, LegacyBroadcastUsesAxis) {
  // Opset 6: B [2] placed on A's axis 0 -> each row gets its own value.
  auto n = make_node("Add", 6, 2, {{"broadcast", int_attr(1)}, {"axis", int_attr(0)}});
  Tensor r = run(n, {f32({2, 3}, {0, 0, 0, 0, 0, 0}), f32({2}, {1, 2})}).value();
  EXPECT_EQ(values<float>(r), (std::vector<float>{1, 1, 1, 2, 2, 2}));
  // Default axis: trailing dims, like numpy.
  auto d = make_node("Mul", 6, 2, {{"broadcast", int_attr(1)}});
  EXPECT_EQ(values<float>(run(d, {f32({2, 2}, {1, 2, 3, 4}), f32({2}, {10, 100})}).value()),
            (std::vector<float>{10, 200, 30, 400}));
  // Without broadcast=1 the shapes must match.
  auto s = run(make_node("Add", 6, 2), {f32({2, 2}, {1, 2, 3, 4}), f32({2}, {1, 2})});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("broadcast"), std::string::npos);
  // B that does not fit at the axis.
  auto bad = run(n, {f32({2, 3}, {0, 0, 0, 0, 0, 0}), f32({3}, {1, 2, 3})});
  EXPECT_FALSE(bad.ok());
  // Inference follows the same rule.
  auto t = infer(n, {ir::TypeInfo::tensor(DataType::kFloat32, sym({Dim::symbol("N"), 3})),
                     ir::TypeInfo::tensor(DataType::kFloat32, sym({Dim::symbol("N")}))});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->shape.str(), "[N,3]");
}

TEST(Binary, ModSignFollowsDivisorUnlessFmod) {
  Tensor a = i64({4}, {-4, 4, -4, INT64_MIN}), b = i64({4}, {3, -3, -3, -1});
  EXPECT_EQ(values<int64_t>(run(make_node("Mod", 13, 2), {a, b}).value()), (std::vector<int64_t>{2, -2, -1, 0}));
  auto f = make_node("Mod", 13, 2, {{"fmod", int_attr(1)}});
  EXPECT_EQ(values<int64_t>(run(f, {a, b}).value()), (std::vector<int64_t>{-1, 1, -1, 0}));
  Tensor r = run(f, {f32({2}, {-4.5f, 4.5f}), f32({2}, {2, -2})}).value();
  EXPECT_EQ(values<float>(r), (std::vector<float>{-0.5f, 0.5f}));
  EXPECT_FALSE(run(make_node("Mod", 13, 2), {i64({1}, {1}), i64({1}, {0})}).ok());
}

TEST(Binary, PowMixesDtypes) {
  Tensor r = run(make_node("Pow", 15, 2), {f32({3}, {2, 3, 4}), i64({3}, {3, 2, -1})}).value();
  EXPECT_EQ(r.dtype(), DataType::kFloat32);
  EXPECT_EQ(values<float>(r), (std::vector<float>{8, 9, 0.25f}));
  Tensor i = run(make_node("Pow", 15, 2), {i64({3}, {2, -1, 5}), i64({3}, {10, -3, -2})}).value();
  EXPECT_EQ(values<int64_t>(i), (std::vector<int64_t>{1024, -1, 0}));
  Tensor m = run(make_node("Pow", 15, 2), {i64({1}, {2}), f32({1}, {0.5f})}).value();
  EXPECT_EQ(m.dtype(), DataType::kInt64);
  EXPECT_EQ(m.data<int64_t>()[0], 1);  // sqrt(2) truncated
  auto t = infer(make_node("Pow", 15, 2), {ir::TypeInfo::tensor(DataType::kInt32, sym({4})),
                                           ir::TypeInfo::tensor(DataType::kFloat32, sym({1}))});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->elem, DataType::kInt32);
}

TEST(Logic, BitShiftAndBitwise) {
  Tensor x = Tensor::from_vector<uint8_t>(DataType::kUInt8, {3}, {1, 0x80, 0xff});
  Tensor s = Tensor::from_vector<uint8_t>(DataType::kUInt8, {3}, {3, 1, 8});
  auto left = make_node("BitShift", 11, 2, {{"direction", string_attr("LEFT")}});
  EXPECT_EQ(values<uint8_t>(run(left, {x, s}).value()), (std::vector<uint8_t>{8, 0, 0}));
  auto right = make_node("BitShift", 11, 2, {{"direction", string_attr("RIGHT")}});
  EXPECT_EQ(values<uint8_t>(run(right, {x, s}).value()), (std::vector<uint8_t>{0, 0x40, 0}));
  auto bad = run(make_node("BitShift", 11, 2, {{"direction", string_attr("UP")}}), {x, s});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("direction"), std::string::npos);
  Tensor n = run(make_node("BitwiseNot", 18, 1), {i64({1}, {0})}).value();
  EXPECT_EQ(n.data<int64_t>()[0], -1);
}

TEST(Logic, EqualOnStringsAndWhereBroadcasts) {
  Tensor a(DataType::kString, {2}), b(DataType::kString, {});
  a.strings()[0] = "x";
  a.strings()[1] = "y";
  b.strings()[0] = "y";
  Tensor e = run(make_node("Equal", 19, 2), {a, b}).value();
  EXPECT_EQ(e.dtype(), DataType::kBool);
  EXPECT_EQ(values<bool>(e), (std::vector<bool>{false, true}));
  Tensor c = Tensor::from_vector<bool>(DataType::kBool, {2, 1}, {true, false});
  Tensor w = run(make_node("Where", 16, 3), {c, a, b}).value();
  EXPECT_EQ(w.shape(), (Dims{2, 2}));
  EXPECT_EQ(w.strings()[0], "x");
  EXPECT_EQ(w.strings()[1], "y");
  EXPECT_EQ(w.strings()[2], "y");
  auto t = infer(make_node("Where", 16, 3),
                 {ir::TypeInfo::tensor(DataType::kBool, sym({Dim::symbol("B"), 1})),
                  ir::TypeInfo::tensor(DataType::kString, sym({2})), ir::TypeInfo::tensor(DataType::kString, sym({}))});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->elem, DataType::kString);
  EXPECT_EQ(t->shape.str(), "[B,2]");
}

TEST(Variadic, MaxPropagatesNaNAndMeanAverages) {
  float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor m = run(make_node("Max", 13, 3), {f32({2}, {1, nan}), f32({1}, {3}), f32({2}, {2, 0})}).value();
  EXPECT_EQ(m.data<float>()[0], 3);
  EXPECT_TRUE(std::isnan(m.data<float>()[1]));
  Tensor mean = run(make_node("Mean", 13, 2), {f32({2}, {1, 2}), f32({2}, {3, 5})}).value();
  EXPECT_EQ(values<float>(mean), (std::vector<float>{2, 3.5f}));
  auto bad = infer(make_node("Sum", 13, 2), {ir::TypeInfo::tensor(DataType::kFloat32, sym({2, 3})),
                                             ir::TypeInfo::tensor(DataType::kFloat32, sym({4}))});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cannot be broadcast"), std::string::npos);
}

TEST(Unary, RoundHalfToEvenAndIntegerAbsWraps) {
  Tensor r = run(make_node("Round", 22, 1), {f32({5}, {2.5f, -2.5f, 1.5f, 0.4f, -0.6f})}).value();
  EXPECT_EQ(values<float>(r), (std::vector<float>{2, -2, 2, 0, -1}));
  Tensor a = Tensor::from_vector<int8_t>(DataType::kInt8, {2}, {-128, -5});
  EXPECT_EQ(values<int8_t>(run(make_node("Abs", 13, 1), {a}).value()), (std::vector<int8_t>{-128, 5}));
  EXPECT_EQ(values<int8_t>(run(make_node("Neg", 13, 1), {a}).value()), (std::vector<int8_t>{-128, 5}));
  auto sin_int = run(make_node("Sin", 22, 1), {i64({1}, {1})});
  EXPECT_FALSE(sin_int.ok());
  EXPECT_EQ(sin_int.status().code(), ErrorCode::kUnsupported);
}

TEST(Unary, IsInfDetectsBySign) {
  float inf = std::numeric_limits<float>::infinity();
  Tensor x = f32({3}, {inf, -inf, 1});
  auto pos = make_node("IsInf", 20, 1, {{"detect_negative", int_attr(0)}});
  EXPECT_EQ(values<bool>(run(pos, {x}).value()), (std::vector<bool>{true, false, false}));
  EXPECT_EQ(values<bool>(run(make_node("IsInf", 20, 1), {x}).value()), (std::vector<bool>{true, true, false}));
}

TEST(Activation, GeluAndPReluAndClip) {
  Tensor g = run(make_node("Gelu", 20, 1), {f32({1}, {1})}).value();
  EXPECT_NEAR(g.data<float>()[0], 0.8413447f, 1e-6);
  auto bad = run(make_node("Gelu", 20, 1, {{"approximate", string_attr("fast")}}), {f32({1}, {1})});
  EXPECT_FALSE(bad.ok());
  // Legacy PRelu: a 1-D slope is per channel (axis 1).
  Tensor x = f32({1, 2, 2}, {-1, -1, -1, 2});
  Tensor p = run(make_node("PRelu", 6, 2), {x, f32({2}, {0.5f, 0.25f})}).value();
  EXPECT_EQ(values<float>(p), (std::vector<float>{-0.5f, -0.5f, -0.25f, 2}));
  // Opset 16: numpy-style, slope [2] broadcasts over the last axis; [3] cannot.
  Tensor q = run(make_node("PRelu", 16, 2), {x, f32({2}, {0.5f, 0.25f})}).value();
  EXPECT_EQ(values<float>(q), (std::vector<float>{-0.5f, -0.25f, -0.5f, 2}));
  EXPECT_FALSE(run(make_node("PRelu", 16, 2), {x, f32({3}, {1, 1, 1})}).ok());
  // Clip: attributes before opset 11, inputs after; min > max gives max.
  auto c6 = make_node("Clip", 6, 1, {{"min", float_attr(-1)}, {"max", float_attr(1)}});
  EXPECT_EQ(values<float>(run(c6, {f32({3}, {-5, 0.5f, 5})}).value()), (std::vector<float>{-1, 0.5f, 1}));
  Tensor lo = Tensor::scalar<float>(DataType::kFloat32, 2), hi = Tensor::scalar<float>(DataType::kFloat32, 1);
  EXPECT_EQ(values<float>(run(make_node("Clip", 13, 3), {f32({2}, {0, 5}), lo, hi}).value()),
            (std::vector<float>{1, 1}));
  Tensor imax = Tensor::scalar<int64_t>(DataType::kInt64, 3);
  EXPECT_EQ(values<int64_t>(run(make_node("Clip", 13, 3), {i64({2}, {-9, 9}), Tensor(), imax}).value()),
            (std::vector<int64_t>{-9, 3}));
  EXPECT_FALSE(run(make_node("Clip", 13, 2), {i64({1}, {1}), f32({}, {1})}).ok());
}

TEST(CastOp, ToAttributeFormsAndBitCast) {
  auto legacy = make_node("Cast", 1, 1, {{"to", string_attr("INT32")}});
  Tensor c = run(legacy, {f32({2}, {1.9f, -1.9f})}).value();
  EXPECT_EQ(c.dtype(), DataType::kInt32);
  EXPECT_EQ(values<int32_t>(c), (std::vector<int32_t>{1, -1}));
  auto bad = run(make_node("Cast", 13, 1, {{"to", int_attr(999)}}), {f32({1}, {1})});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("999"), std::string::npos);
  auto e8 = make_node("Cast", 25, 1,
                      {{"to", int_attr(static_cast<int>(DataType::kFloat8E8M0))}, {"round_mode", string_attr("down")}});
  Tensor e = run(e8, {f32({2}, {3.0f, 0.75f})}).value();
  EXPECT_EQ(values<uint8_t>(e), (std::vector<uint8_t>{128, 126}));  // 2^1, 2^-1
  auto bc = make_node("BitCast", 26, 1, {{"to", int_attr(static_cast<int>(DataType::kInt32))}});
  EXPECT_EQ(run(bc, {f32({1}, {1.0f})}).value().data<int32_t>()[0], 0x3f800000);
  auto size = run(bc, {i64({1}, {1})});
  ASSERT_FALSE(size.ok());
  EXPECT_NE(size.status().message().find("sizes differ"), std::string::npos);
  auto t = infer(make_node("CastLike", 25, 2), {ir::TypeInfo::tensor(DataType::kFloat32, sym({Dim::symbol("N")})),
                                                ir::TypeInfo::tensor(DataType::kFloat16, sym({}))});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->elem, DataType::kFloat16);
  EXPECT_EQ(t->shape.str(), "[N]");
}

}  // namespace
}  // namespace kiln::ops
