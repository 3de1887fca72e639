// Reductions, softmax, normalization, linear algebra and losses: inference on symbolic shapes,
// error paths and exact values.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/interpreter.h"
#include "ops/registry.h"

namespace kiln::ops {
namespace {

struct NodeBuilder {
  ir::Node n;
  NodeBuilder(const std::string& op, int opset, int n_in, int n_out = 1) {
    n.name = "n";
    n.op_type = op;
    n.opset = opset;
    for (int i = 0; i < n_in; ++i) n.inputs.push_back("i" + std::to_string(i));
    for (int i = 0; i < n_out; ++i) n.outputs.push_back("o" + std::to_string(i));
  }
  NodeBuilder& i(const std::string& name, int64_t v) {
    ir::Attribute a;
    a.type = ir::Attribute::Type::kInt;
    a.i = v;
    n.attrs[name] = a;
    return *this;
  }
  NodeBuilder& f(const std::string& name, float v) {
    ir::Attribute a;
    a.type = ir::Attribute::Type::kFloat;
    a.f = v;
    n.attrs[name] = a;
    return *this;
  }
  NodeBuilder& ints(const std::string& name, std::vector<int64_t> v) {
    ir::Attribute a;
    a.type = ir::Attribute::Type::kInts;
    a.ints = std::move(v);
    n.attrs[name] = a;
    return *this;
  }
  NodeBuilder& s(const std::string& name, const std::string& v) {
    ir::Attribute a;
    a.type = ir::Attribute::Type::kString;
    a.s = v;
    n.attrs[name] = a;
    return *this;
  }
};

Result<std::vector<Value>> run(const ir::Node& n, const std::vector<Tensor>& inputs) {
  const OpSchema* s = OpRegistry::get().find("", n.op_type, n.opset);
  if (!s) return NotFound("no schema for ", n.op_type);
  std::vector<Value> vals(inputs.begin(), inputs.end());
  std::vector<const Value*> ptrs;
  for (size_t i = 0; i < vals.size(); ++i) ptrs.push_back(inputs[i].defined() ? &vals[i] : nullptr);
  return run_node(n, *s, ptrs, nullptr);
}

// Runs inference; `consts[i]` (may be null) is the build-time value of input i.
Result<std::vector<ir::TypeInfo>> infer(const ir::Node& n, const std::vector<ir::TypeInfo>& types,
                                        const std::vector<const Tensor*>& consts = {}) {
  const OpSchema* s = OpRegistry::get().find("", n.op_type, n.opset);
  if (!s) return NotFound("no schema for ", n.op_type);
  InferContext ctx(n);
  int counter = 0;
  ctx.symbol_counter = &counter;
  for (const auto& t : types) ctx.inputs.push_back(&t);
  for (size_t i = 0; i < types.size(); ++i) ctx.constants.push_back(i < consts.size() ? consts[i] : nullptr);
  ctx.outputs.resize(n.outputs.size());
  KILN_RETURN_IF_ERROR(s->infer(ctx));
  return ctx.outputs;
}

Tensor f32(Dims shape, std::vector<float> v) { return Tensor::from_vector<float>(DataType::kFloat32, shape, v); }
Tensor i64(Dims shape, std::vector<int64_t> v) { return Tensor::from_vector<int64_t>(DataType::kInt64, shape, v); }
ir::TypeInfo sym(DataType dt, std::vector<Dim> d) { return ir::TypeInfo::tensor(dt, SymShape(std::move(d))); }
std::vector<float> values(const Value& v) {
  Tensor t = v.tensor.cast(DataType::kFloat32).value();
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

// ---- reductions ----

TEST(Reduce, InfersSymbolicShapesWithConstantAxes) {
  auto n = NodeBuilder("ReduceSum", 13, 2).i("keepdims", 0).n;
  Tensor axes = i64({1}, {-2});
  auto out =
      infer(n, {sym(DataType::kFloat32, {Dim::symbol("batch"), 3, 4}), sym(DataType::kInt64, {1})}, {nullptr, &axes});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].str(), "float32[batch,4]");
}

TEST(Reduce, UnknownAxesKeepRankOnlyWithKeepdims) {
  auto n = NodeBuilder("ReduceMax", 18, 2).n;
  auto out = infer(n, {sym(DataType::kFloat32, {Dim::symbol("b"), 1, 4}), sym(DataType::kInt64, {1})});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].shape.rank(), 3u);
  EXPECT_EQ((*out)[0].shape.dims[1].value, 1);
  EXPECT_FALSE((*out)[0].shape.dims[2].known());
  n = NodeBuilder("ReduceMax", 18, 2).i("keepdims", 0).n;
  out = infer(n, {sym(DataType::kFloat32, {2, 3}), sym(DataType::kInt64, {1})});
  ASSERT_TRUE(out.ok());
  EXPECT_FALSE((*out)[0].shape.rank_known);
}

TEST(Reduce, AxesAttributeBeforeOpset18) {
  auto n = NodeBuilder("ReduceMean", 11, 1).ints("axes", {1}).n;
  auto r = run(n, {f32({2, 3}, {1, 2, 3, 4, 5, 6})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].tensor.shape(), (Dims{2, 1}));
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{2, 5}));
}

TEST(Reduce, NoAxesReducesAllUnlessNoop) {
  auto n = NodeBuilder("ReduceSum", 13, 1).i("keepdims", 0).n;
  auto r = run(n, {f32({2, 2}, {1, 2, 3, 4})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].tensor.rank(), 0);
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{10}));
  n = NodeBuilder("ReduceSum", 13, 2).i("noop_with_empty_axes", 1).n;
  r = run(n, {f32({2, 2}, {1, 2, 3, 4}), i64({0}, {})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{1, 2, 3, 4}));
}

TEST(Reduce, BadAndRepeatedAxesAreErrors) {
  auto n = NodeBuilder("ReduceL2", 18, 2).n;
  auto r = run(n, {f32({2, 2}, {1, 2, 3, 4}), i64({1}, {5})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("axis 5"), std::string::npos) << r.status().message();
  r = run(n, {f32({2, 2}, {1, 2, 3, 4}), i64({2}, {1, -1})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("repeated"), std::string::npos) << r.status().message();
  Tensor axes = i64({1}, {3});
  auto inf = infer(n, {sym(DataType::kFloat32, {2, 2}), sym(DataType::kInt64, {1})}, {nullptr, &axes});
  EXPECT_FALSE(inf.ok());
}

TEST(Reduce, EmptySetIdentities) {
  Tensor empty(DataType::kFloat32, {2, 0});
  auto one = [&](const char* op) {
    auto r = run(NodeBuilder(op, 18, 2).n, {empty, i64({1}, {1})});
    EXPECT_TRUE(r.ok()) << op;
    return values((*r)[0]);
  };
  EXPECT_EQ(one("ReduceProd"), (std::vector<float>{1, 1}));
  EXPECT_EQ(one("ReduceSum"), (std::vector<float>{0, 0}));
  EXPECT_TRUE(std::isinf(one("ReduceMax")[0]) && one("ReduceMax")[0] < 0);
  EXPECT_TRUE(std::isinf(one("ReduceLogSumExp")[0]));
}

TEST(Reduce, IntegerSumWrapsAndLogSumExpIsStable) {
  Tensor x = Tensor::from_vector<int32_t>(DataType::kInt32, {2}, {INT32_MAX, 1});
  auto r = run(NodeBuilder("ReduceSum", 13, 1).n, {x});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].tensor.data<int32_t>()[0], INT32_MIN);
  r = run(NodeBuilder("ReduceLogSumExp", 18, 1).n, {f32({2}, {1000, 1000})});
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(values((*r)[0])[0], 1000 + std::log(2.0), 1e-3);
}

TEST(ArgMax, SelectLastIndexAndKeepdims) {
  Tensor x = f32({2, 3}, {1, 3, 3, 5, 5, 0});
  auto r = run(NodeBuilder("ArgMax", 13, 1).i("axis", 1).n, {x});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].tensor.shape(), (Dims{2, 1}));
  EXPECT_EQ((*r)[0].tensor.data<int64_t>()[0], 1);
  EXPECT_EQ((*r)[0].tensor.data<int64_t>()[1], 0);
  r = run(NodeBuilder("ArgMin", 13, 1).i("axis", -1).i("keepdims", 0).i("select_last_index", 1).n,
          {f32({4}, {2, 1, 1, 3})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].tensor.rank(), 0);
  EXPECT_EQ((*r)[0].tensor.data<int64_t>()[0], 2);
  EXPECT_FALSE(run(NodeBuilder("ArgMax", 13, 1).i("axis", 2).n, {x}).ok());
}

// ---- softmax / scans / topk ----

TEST(Softmax, Opset11CoercesTo2DButOpset13UsesOneAxis) {
  Tensor x = f32({1, 2, 2}, {0, 0, 0, 0});
  auto old = run(NodeBuilder("Softmax", 11, 1).i("axis", 1).n, {x});
  auto now = run(NodeBuilder("Softmax", 13, 1).i("axis", 1).n, {x});
  ASSERT_TRUE(old.ok() && now.ok());
  EXPECT_FLOAT_EQ(values((*old)[0])[0], 0.25f);  // normalized over 2*2 elements
  EXPECT_FLOAT_EQ(values((*now)[0])[0], 0.5f);   // normalized over axis 1 only
  auto lsm = run(NodeBuilder("LogSoftmax", 13, 1).n, {f32({2}, {1000, 1000})});
  ASSERT_TRUE(lsm.ok());
  EXPECT_NEAR(values((*lsm)[0])[0], -std::log(2.0), 1e-6);
  auto hm = run(NodeBuilder("Hardmax", 13, 1).n, {f32({3}, {1, 4, 4})});
  ASSERT_TRUE(hm.ok());
  EXPECT_EQ(values((*hm)[0]), (std::vector<float>{0, 1, 0}));
}

TEST(CumSum, ExclusiveReverse) {
  Tensor axis = Tensor::scalar<int32_t>(DataType::kInt32, 0);
  auto r = run(NodeBuilder("CumSum", 14, 2).i("exclusive", 1).i("reverse", 1).n, {f32({4}, {1, 2, 3, 4}), axis});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{9, 7, 4, 0}));
  r = run(NodeBuilder("CumSum", 14, 2).n, {f32({4}, {1, 2, 3, 4}), Tensor::scalar<int32_t>(DataType::kInt32, 3)});
  EXPECT_FALSE(r.ok());
}

TEST(TopK, TiesGoToTheLowerIndex) {
  auto r = run(NodeBuilder("TopK", 11, 2, 2).n, {f32({5}, {1, 3, 3, 2, 3}), i64({1}, {3})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{3, 3, 3}));
  const int64_t* idx = (*r)[1].tensor.data<int64_t>();
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 2);
  EXPECT_EQ(idx[2], 4);
  r = run(NodeBuilder("TopK", 11, 2, 2).i("largest", 0).n, {f32({3}, {5, 1, 4}), i64({1}, {2})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{1, 4}));
  r = run(NodeBuilder("TopK", 11, 2, 2).n, {f32({3}, {5, 1, 4}), i64({1}, {4})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("k = 4"), std::string::npos);
  auto inf = infer(NodeBuilder("TopK", 11, 2, 2).n,
                   {sym(DataType::kFloat32, {Dim::symbol("n"), 7}), sym(DataType::kInt64, {1})});
  ASSERT_TRUE(inf.ok());
  EXPECT_EQ((*inf)[0].shape.dims[0].param, "n");
  EXPECT_FALSE((*inf)[0].shape.dims[1].known());
  EXPECT_EQ((*inf)[1].elem, DataType::kInt64);
}

// ---- linear algebra ----

TEST(MatMul, OneDimensionalPromotionAndBroadcast) {
  auto n = NodeBuilder("MatMul", 13, 2).n;
  auto inf = infer(n, {sym(DataType::kFloat32, {3}), sym(DataType::kFloat32, {Dim::symbol("b"), 3, 5})});
  ASSERT_TRUE(inf.ok());
  EXPECT_EQ((*inf)[0].str(), "float32[b,5]");
  EXPECT_FALSE(infer(n, {sym(DataType::kFloat32, {2, 4}), sym(DataType::kFloat32, {3, 5})}).ok());
  auto r = run(n, {f32({2}, {1, 2}), f32({2, 2, 1}, {1, 1, 2, 3})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].tensor.shape(), (Dims{2, 1}));
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{3, 8}));
  r = run(n, {f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({2, 3}, {1, 2, 3, 4, 5, 6})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("inner dimensions"), std::string::npos);
}

TEST(Gemm, TransposesAlphaBetaAndBroadcastBias) {
  auto n = NodeBuilder("Gemm", 13, 3).i("transA", 1).i("transB", 1).f("alpha", 2).f("beta", 0.5f).n;
  // A' = [[1,2],[3,4]] (given transposed), B' = identity (given transposed), C = [10, 20].
  auto r = run(n, {f32({2, 2}, {1, 3, 2, 4}), f32({2, 2}, {1, 0, 0, 1}), f32({2}, {10, 20})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{7, 14, 11, 18}));
  auto inf = infer(n, {sym(DataType::kFloat32, {4, Dim::symbol("m")}), sym(DataType::kFloat32, {6, 4})});
  ASSERT_TRUE(inf.ok());
  EXPECT_EQ((*inf)[0].str(), "float32[m,6]");
  r = run(NodeBuilder("Gemm", 13, 3).n, {f32({1, 2}, {1, 2}), f32({2, 2}, {1, 0, 0, 1}), f32({3}, {1, 2, 3})});
  EXPECT_FALSE(r.ok());
}

TEST(Einsum, MatmulTraceAndErrors) {
  auto r =
      run(NodeBuilder("Einsum", 12, 2).s("equation", "ij, jk").n, {f32({1, 2}, {1, 2}), f32({2, 2}, {1, 2, 3, 4})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{7, 10}));
  r = run(NodeBuilder("Einsum", 12, 1).s("equation", "ii->").n, {f32({2, 2}, {1, 2, 3, 4})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{5}));
  auto inf = infer(NodeBuilder("Einsum", 12, 1).s("equation", "...ij->...ji").n,
                   {sym(DataType::kFloat64, {Dim::symbol("b"), 2, 3})});
  ASSERT_TRUE(inf.ok());
  EXPECT_EQ((*inf)[0].str(), "float64[b,3,2]");
  // Size-1 dims broadcast, as in numpy; implicit output labels sort by character code.
  r = run(NodeBuilder("Einsum", 12, 2).s("equation", "ij,ij->ij").n, {f32({1, 2}, {1, 2}), f32({2, 2}, {1, 2, 3, 4})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{1, 4, 3, 8}));
  r = run(NodeBuilder("Einsum", 12, 1).s("equation", "bA").n, {f32({1, 2}, {1, 2})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].tensor.shape(), (Dims{2, 1}));
  EXPECT_FALSE(run(NodeBuilder("Einsum", 12, 2).s("equation", "i,i").n, {f32({2}, {1, 2}), f32({3}, {1, 2, 3})}).ok());
  EXPECT_FALSE(run(NodeBuilder("Einsum", 12, 1).s("equation", "ij->k").n, {f32({1, 1}, {1})}).ok());
  EXPECT_FALSE(run(NodeBuilder("Einsum", 12, 1).s("equation", "ijk").n, {f32({1, 1}, {1})}).ok());
}

TEST(Det, BatchedWithPivoting) {
  auto r = run(NodeBuilder("Det", 22, 1).n, {f32({2, 2, 2}, {0, 1, 1, 0, 2, 1, 1, 3})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{-1, 5}));
  EXPECT_FALSE(run(NodeBuilder("Det", 22, 1).n, {f32({2, 3}, {1, 2, 3, 4, 5, 6})}).ok());
}

TEST(MatMulInteger, ZeroPoints) {
  Tensor a = Tensor::from_vector<uint8_t>(DataType::kUInt8, {1, 2}, {3, 4});
  Tensor b = Tensor::from_vector<uint8_t>(DataType::kUInt8, {2, 1}, {5, 6});
  Tensor za = Tensor::from_vector<uint8_t>(DataType::kUInt8, {}, {1});
  auto r = run(NodeBuilder("MatMulInteger", 10, 3).n, {a, b, za});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)[0].tensor.dtype(), DataType::kInt32);
  EXPECT_EQ((*r)[0].tensor.data<int32_t>()[0], 2 * 5 + 3 * 6);
  // Per-row zero points of A (M values) and per-column of B (N values).
  Tensor a2 = Tensor::from_vector<int8_t>(DataType::kInt8, {2, 1}, {3, -4});
  Tensor b2 = Tensor::from_vector<int8_t>(DataType::kInt8, {1, 2}, {5, 6});
  Tensor za2 = Tensor::from_vector<int8_t>(DataType::kInt8, {2}, {1, -1});
  Tensor zb2 = Tensor::from_vector<int8_t>(DataType::kInt8, {2}, {0, 2});
  r = run(NodeBuilder("MatMulInteger", 10, 4).n, {a2, b2, za2, zb2});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const int32_t* y = (*r)[0].tensor.data<int32_t>();
  EXPECT_EQ(y[0], 2 * 5);
  EXPECT_EQ(y[3], -3 * 4);
  r = run(NodeBuilder("MatMulInteger", 10, 3).n,
          {a2, b2, Tensor::from_vector<int8_t>(DataType::kInt8, {3}, {1, 2, 3})});
  EXPECT_FALSE(r.ok());
}

// ---- normalization ----

TEST(LayerNorm, StatsOutputsFollowStashType) {
  auto n = NodeBuilder("LayerNormalization", 17, 2, 3).i("axis", 1).n;
  auto inf = infer(n, {sym(DataType::kFloat64, {Dim::symbol("b"), 2, 3}), sym(DataType::kFloat64, {2, 3})});
  ASSERT_TRUE(inf.ok());
  EXPECT_EQ((*inf)[1].str(), "float32[b,1,1]");
  auto r = run(n, {f32({1, 2}, {1, 3}), f32({2}, {1, 2})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::vector<float> y = values((*r)[0]);
  EXPECT_NEAR(y[0], -1, 1e-4);
  EXPECT_NEAR(y[1], 2, 1e-4);
  EXPECT_FLOAT_EQ(values((*r)[1])[0], 2);
  EXPECT_FALSE(run(n, {f32({1, 2}, {1, 3}), f32({3}, {1, 2, 3})}).ok());
}

TEST(BatchNorm, InferenceUsesRunningStats) {
  auto n = NodeBuilder("BatchNormalization", 15, 5).f("epsilon", 0).n;
  auto r = run(n, {f32({1, 2, 1}, {3, 5}), f32({2}, {1, 2}), f32({2}, {0, 1}), f32({2}, {1, 1}), f32({2}, {4, 16})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{1, 3}));  // (3-1)/2*1+0, (5-1)/4*2+1
  r = run(n, {f32({1, 2, 1}, {3, 5}), f32({3}, {1, 2, 3}), f32({2}, {0, 1}), f32({2}, {1, 1}), f32({2}, {4, 16})});
  EXPECT_FALSE(r.ok());
}

TEST(GroupNorm, GroupsMustDivideChannels) {
  auto n = NodeBuilder("GroupNormalization", 21, 3).i("num_groups", 2).n;
  auto r = run(n, {f32({1, 3, 1}, {1, 2, 3}), f32({3}, {1, 1, 1}), f32({3}, {0, 0, 0})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_groups 2"), std::string::npos);
  n = NodeBuilder("GroupNormalization", 21, 3).i("num_groups", 1).f("epsilon", 0).n;
  r = run(n, {f32({1, 2, 1}, {1, 3}), f32({2}, {1, 1}), f32({2}, {0, 0})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{-1, 1}));
}

TEST(Dropout, InferenceIsIdentityWithTrueMask) {
  auto r = run(NodeBuilder("Dropout", 13, 1, 2).n, {f32({3}, {1, 2, 3})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ((*r)[1].tensor.dtype(), DataType::kBool);
  EXPECT_TRUE((*r)[1].tensor.data<bool>()[2]);
}

TEST(Dropout, TrainingMatchesNumpysSeededGenerator) {
  // numpy: np.random.seed(0); np.random.uniform(0, 1, 8) >= 0.5 -> T T T T F T F T
  auto n = NodeBuilder("Dropout", 22, 3, 2).i("seed", 0).n;
  Tensor train = Tensor::from_vector<bool>(DataType::kBool, {}, {true});
  auto r = run(n, {f32({8}, {1, 1, 1, 1, 1, 1, 1, 1}), f32({}, {0.5f}), train});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{2, 2, 2, 2, 0, 2, 0, 2}));
  EXPECT_FALSE((*r)[1].tensor.data<bool>()[4]);
  EXPECT_FALSE(run(n, {f32({1}, {1}), f32({}, {1.5f}), train}).ok());
}

TEST(LpNormalization, ZeroSliceStaysZero) {
  auto r = run(NodeBuilder("LpNormalization", 22, 1).i("axis", 0).n, {f32({2, 2}, {3, 0, 4, 0})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{0.6f, 0, 0.8f, 0}));
}

TEST(LRN, NormalizesAcrossChannels) {
  auto r = run(NodeBuilder("LRN", 13, 1).i("size", 3).f("alpha", 3).f("beta", 1).f("bias", 1).n,
               {f32({1, 2, 1, 1}, {1, 1})});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{1.f / 3, 1.f / 3}));  // 1 / (1 + 3/3 * 2)
}

// ---- losses ----

TEST(NllLoss, IgnoreIndexAndOutOfRangeTargets) {
  auto n = NodeBuilder("NegativeLogLikelihoodLoss", 22, 2).i("ignore_index", -1).n;
  Tensor x = f32({2, 2}, {-1, -2, -3, -4});
  auto r = run(n, {x, i64({2}, {1, -1})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{2}));
  r = run(n, {x, i64({2}, {1, 2})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("target value 2"), std::string::npos);
  auto inf = infer(NodeBuilder("SoftmaxCrossEntropyLoss", 13, 2, 2).s("reduction", "none").n,
                   {sym(DataType::kFloat32, {Dim::symbol("n"), 5}), sym(DataType::kInt64, {Dim::symbol("n")})});
  ASSERT_TRUE(inf.ok());
  EXPECT_EQ((*inf)[0].str(), "float32[n]");
  EXPECT_EQ((*inf)[1].str(), "float32[n,5]");
}

}  // namespace
}  // namespace kiln::ops
