// Tensor shape / data movement / indexing ops: symbolic inference through shape sub-graphs, exact
// values on edge cases (negative steps, negative pads, uneven splits, reductions), error paths.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "ops/common.h"
#include "ops/interpreter.h"
#include "ops/registry.h"
#include "ops/shape_inference.h"

namespace kiln::ops {
namespace {

ir::Attribute ints_attr(std::vector<int64_t> v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kInts;
  a.ints = std::move(v);
  return a;
}
ir::Attribute int_attr(int64_t v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kInt;
  a.i = v;
  return a;
}
ir::Attribute str_attr(std::string s) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kString;
  a.s = std::move(s);
  return a;
}

ir::Node make_node(const std::string& op, std::vector<std::string> ins, std::vector<std::string> outs, int opset = 18,
                   std::map<std::string, ir::Attribute> attrs = {}) {
  ir::Node n;
  n.name = op + "_node";
  n.op_type = op;
  n.opset = opset;
  n.inputs = std::move(ins);
  n.outputs = std::move(outs);
  n.attrs = std::move(attrs);
  return n;
}

Tensor i64(std::vector<int64_t> v) {
  return Tensor::from_vector<int64_t>(DataType::kInt64, {static_cast<int64_t>(v.size())}, v);
}
Tensor i64(std::vector<int64_t> v, Dims shape) { return Tensor::from_vector<int64_t>(DataType::kInt64, shape, v); }
Tensor scalar(int64_t v) { return Tensor::scalar<int64_t>(DataType::kInt64, v); }
Tensor f32(std::vector<float> v, Dims shape) { return Tensor::from_vector<float>(DataType::kFloat32, shape, v); }
Tensor iota_f32(Dims shape) {
  Tensor t(DataType::kFloat32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i);
  return t;
}

// Runs one node's kernel on the given inputs (an undefined tensor is a missing optional input).
Result<std::vector<Value>> run(const ir::Node& n, const std::vector<Tensor>& ins) {
  const OpSchema* s = OpRegistry::get().find("", n.op_type, n.opset);
  if (!s) return NotFound("no schema for ", n.op_type);
  std::vector<Value> vals;
  for (const auto& t : ins) vals.push_back(t.defined() ? Value(t) : Value());
  std::vector<const Value*> ptrs;
  for (auto& v : vals) ptrs.push_back(v.is_none() ? nullptr : &v);
  return run_node(n, *s, ptrs, nullptr);
}

Tensor run1(const ir::Node& n, const std::vector<Tensor>& ins) {
  auto r = run(n, ins);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return Tensor();
  return r.value()[0].tensor;
}

std::vector<double> values(const Tensor& t) { return to_f64_vector(t); }

SymShape sym(std::vector<Dim> d) { return SymShape(std::move(d)); }

// A graph whose inputs have the given types; nodes added by the test; infer_shapes runs on it.
struct G {
  ir::Graph g;
  G() { g.opset_imports[""] = 18; }
  void input(const std::string& name, DataType dt, SymShape s) {
    g.inputs.push_back({name, ir::TypeInfo::tensor(dt, std::move(s))});
  }
  void init(const std::string& name, Tensor t) { g.initializers[name] = std::move(t); }
  void add(ir::Node n) { g.nodes.push_back(std::move(n)); }
  Status infer() { return infer_shapes(g); }
  std::string shape(const std::string& v) { return g.value_types.at(v).shape.str(); }
};

// ---------------------------------------------------------------- inference through shape sub-graphs

TEST(TensorInfer, ShapeGatherConcatReshapeKeepsSymbolicBatch) {
  G t;
  t.input("x", DataType::kFloat32, sym({Dim::symbol("N"), 3, 4, 5}));
  t.init("zero", scalar(0));
  t.init("minus1", i64({-1}));
  t.add(make_node("Shape", {"x"}, {"s"}));
  t.add(make_node("Gather", {"s", "zero"}, {"n"}));
  t.add(make_node("Unsqueeze", {"n", "axes"}, {"nu"}, 13));
  t.init("axes", i64({0}));
  t.add(make_node("Concat", {"nu", "minus1"}, {"target"}, 18, {{"axis", int_attr(0)}}));
  t.add(make_node("Reshape", {"x", "target"}, {"y"}));
  ASSERT_TRUE(t.infer().ok());
  EXPECT_EQ(t.shape("s"), "[4]");
  EXPECT_EQ(t.shape("n"), "[]");
  EXPECT_EQ(t.shape("target"), "[2]");
  EXPECT_EQ(t.shape("y"), "[N,60]");
}

TEST(TensorInfer, ReshapeZeroAndMinusOne) {
  G t;
  t.input("x", DataType::kFloat32, sym({Dim::symbol("B"), Dim::symbol("S"), 8, 4}));
  t.init("s1", i64({0, 0, -1}));
  t.init("s2", i64({-1, 32}));
  t.init("s3", i64({0, -1, 16}));
  t.add(make_node("Reshape", {"x", "s1"}, {"y1"}));
  t.add(make_node("Reshape", {"x", "s2"}, {"y2"}));
  t.add(make_node("Reshape", {"x", "s3"}, {"y3"}));
  ASSERT_TRUE(t.infer().ok());
  EXPECT_EQ(t.shape("y1"), "[B,S,32]");
  EXPECT_EQ(t.g.value_types.at("y2").shape.rank(), 2u);  // -1 = B*S: not a single symbol
  EXPECT_FALSE(t.g.value_types.at("y2").shape.dims[0].known());
  EXPECT_EQ(t.g.value_types.at("y2").shape.dims[1].value, 32);
  EXPECT_EQ(t.g.value_types.at("y3").shape.dims[0].str(), "B");
  EXPECT_FALSE(t.g.value_types.at("y3").shape.dims[1].known());  // S*2: unknown, not a wrong number
}

TEST(TensorInfer, ReshapeRejectsIndivisibleStaticShape) {
  G t;
  t.input("x", DataType::kFloat32, sym({2, 3}));
  t.init("s", i64({4, -1}));
  t.add(make_node("Reshape", {"x", "s"}, {"y"}));
  Status st = t.infer();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("Reshape"), std::string::npos) << st.message();
}

TEST(TensorInfer, ExpandAndConstantOfShapeFollowShapeValues) {
  G t;
  t.input("x", DataType::kFloat32, sym({1, 4}));
  t.input("z", DataType::kFloat32, sym({Dim::symbol("N"), 4}));
  t.add(make_node("Shape", {"z"}, {"zs"}));
  t.add(make_node("Expand", {"x", "zs"}, {"e"}));
  ir::Attribute v;
  v.type = ir::Attribute::Type::kTensor;
  v.t = i64({7});
  t.add(make_node("ConstantOfShape", {"zs"}, {"c"}, 18, {{"value", v}}));
  ASSERT_TRUE(t.infer().ok());
  EXPECT_EQ(t.shape("e"), "[N,4]");
  EXPECT_EQ(t.shape("c"), "[N,4]");
  EXPECT_EQ(t.g.value_types.at("c").elem, DataType::kInt64);
}

TEST(TensorInfer, KnownPartOfAShapeBecomesAConstant) {
  // The known tail of a Shape is a constant, so ConstantOfShape downstream resolves exactly.
  G t;
  t.input("x", DataType::kFloat32, sym({Dim::symbol("N"), 3, 4, 5}));
  t.init("st", i64({1}));
  t.init("en", i64({std::numeric_limits<int64_t>::max()}));
  t.add(make_node("Shape", {"x"}, {"s"}));
  t.add(make_node("Slice", {"s", "st", "en"}, {"tail"}));
  t.add(make_node("ConstantOfShape", {"tail"}, {"c"}));
  t.add(make_node("Slice", {"x", "st", "en"}, {"xs"}));
  ASSERT_TRUE(t.infer().ok());
  EXPECT_EQ(t.shape("tail"), "[3]");
  EXPECT_EQ(t.shape("c"), "[3,4,5]");
  // Slices axis 0 from 1: N-1, unknown (a fresh symbol, never N).
  EXPECT_FALSE(t.g.value_types.at("xs").shape.dims[0].known());
}

TEST(TensorInfer, SliceWholeSymbolicAxisKeepsSymbol) {
  G t;
  t.input("x", DataType::kFloat32, sym({Dim::symbol("N"), 10}));
  t.init("st", i64({0, 2}));
  t.init("en", i64({std::numeric_limits<int64_t>::max(), -1}));
  t.add(make_node("Slice", {"x", "st", "en"}, {"y"}));
  ASSERT_TRUE(t.infer().ok());
  EXPECT_EQ(t.shape("y"), "[N,7]");
}

TEST(TensorInfer, SqueezeUnsqueezeTransposeConcatSplit) {
  G t;
  t.input("x", DataType::kFloat32, sym({Dim::symbol("N"), 1, 6}));
  t.input("w", DataType::kFloat32, sym({Dim::symbol("N"), 1, 2}));
  t.init("ax1", i64({1}));
  t.init("ax", i64({3, 0}));
  t.add(make_node("Squeeze", {"x", "ax1"}, {"sq"}));
  t.add(make_node("Unsqueeze", {"x", "ax"}, {"us"}));
  t.add(make_node("Transpose", {"x"}, {"tr"}, 18, {{"perm", ints_attr({2, 0, 1})}}));
  t.add(make_node("Concat", {"x", "w"}, {"cc"}, 18, {{"axis", int_attr(-1)}}));
  t.add(make_node("Split", {"x"}, {"p0", "p1", "p2", "p3"}, 18, {{"axis", int_attr(2)}, {"num_outputs", int_attr(4)}}));
  ASSERT_TRUE(t.infer().ok());
  EXPECT_EQ(t.shape("sq"), "[N,6]");
  EXPECT_EQ(t.shape("us"), "[1,N,1,1,6]");
  EXPECT_EQ(t.shape("tr"), "[6,N,1]");
  EXPECT_EQ(t.shape("cc"), "[N,1,8]");
  EXPECT_EQ(t.shape("p0"), "[N,1,2]");
  EXPECT_EQ(t.shape("p3"), "[N,1,0]");
}

TEST(TensorInfer, ErrorsNameTheProblem) {
  {
    G t;
    t.input("x", DataType::kFloat32, sym({2, 3}));
    t.init("ax", i64({1}));
    t.add(make_node("Squeeze", {"x", "ax"}, {"y"}));
    Status st = t.infer();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("its size is 3"), std::string::npos) << st.message();
  }
  {
    G t;
    t.input("x", DataType::kFloat32, sym({2, 3}));
    t.add(make_node("Transpose", {"x"}, {"y"}, 18, {{"perm", ints_attr({0, 0})}}));
    Status st = t.infer();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("not a permutation"), std::string::npos) << st.message();
  }
  {
    G t;
    t.input("a", DataType::kFloat32, sym({2, 3}));
    t.input("b", DataType::kFloat32, sym({4, 3}));
    t.add(make_node("Concat", {"a", "b"}, {"y"}, 18, {{"axis", int_attr(1)}}));
    Status st = t.infer();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("disagree on dim 0"), std::string::npos) << st.message();
  }
}

// ---------------------------------------------------------------- kernels: exact values

TEST(TensorKernel, SliceNegativeStepsAndClamping) {
  Tensor x = iota_f32({2, 5});
  // axis 1 from the end backwards with step -2; axis 0 clamped start.
  Tensor y = run1(make_node("Slice", {"x", "s", "e", "a", "st"}, {"y"}),
                  {x, i64({-1, 100}), i64({std::numeric_limits<int64_t>::min(), -100}), i64({1, 0}), i64({-2, -1})});
  EXPECT_EQ(y.shape(), (Dims{2, 3}));
  EXPECT_EQ(values(y), (std::vector<double>{9, 7, 5, 4, 2, 0}));
  // Legacy attribute form (opset 1).
  Tensor z = run1(make_node("Slice", {"x"}, {"y"}, 1,
                            {{"starts", ints_attr({1})}, {"ends", ints_attr({3})}, {"axes", ints_attr({1})}}),
                  {x});
  EXPECT_EQ(z.shape(), (Dims{2, 2}));
  EXPECT_EQ(values(z), (std::vector<double>{1, 2, 6, 7}));
}

TEST(TensorKernel, PadModesWithNegativePads) {
  Tensor x = f32({1, 2, 3, 4}, {4});
  auto pad = [&](const std::string& mode, std::vector<int64_t> pads) {
    return values(run1(make_node("Pad", {"x", "p"}, {"y"}, 19, {{"mode", str_attr(mode)}}), {x, i64(pads)}));
  };
  EXPECT_EQ(pad("constant", {2, -1}), (std::vector<double>{0, 0, 1, 2, 3}));
  EXPECT_EQ(pad("edge", {2, 1}), (std::vector<double>{1, 1, 1, 2, 3, 4, 4}));
  EXPECT_EQ(pad("reflect", {3, 2}), (std::vector<double>{4, 3, 2, 1, 2, 3, 4, 3, 2}));
  EXPECT_EQ(pad("wrap", {2, 1}), (std::vector<double>{3, 4, 1, 2, 3, 4, 1}));
  // Crop first (drop the 1), then wrap around what is left: [2,3,4].
  EXPECT_EQ(pad("wrap", {-1, 2}), (std::vector<double>{2, 3, 4, 2, 3}));
  // Pad-2 attribute form with a value.
  ir::Attribute v;
  v.type = ir::Attribute::Type::kFloat;
  v.f = 9;
  Tensor y = run1(make_node("Pad", {"x"}, {"y"}, 2, {{"pads", ints_attr({1, 0})}, {"value", v}}), {x});
  EXPECT_EQ(values(y), (std::vector<double>{9, 1, 2, 3, 4}));
  // Cropping more than the axis holds is an error, not a crash.
  auto r = run(make_node("Pad", {"x", "p"}, {"y"}, 19), {x, i64({-5, 2})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("crop more than"), std::string::npos) << r.status().message();
}

TEST(TensorKernel, SplitUnevenAndExplicit) {
  Tensor x = iota_f32({7});
  auto r = run(make_node("Split", {"x"}, {"a", "b", "c"}, 18, {{"num_outputs", int_attr(3)}}), {x});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value()[0].tensor.shape(), (Dims{3}));
  EXPECT_EQ(r.value()[2].tensor.shape(), (Dims{1}));
  EXPECT_EQ(values(r.value()[2].tensor), (std::vector<double>{6}));
  auto r2 = run(make_node("Split", {"x", "s"}, {"a", "b"}, 13), {x, i64({2, 5})});
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(values(r2.value()[1].tensor), (std::vector<double>{2, 3, 4, 5, 6}));
  auto bad = run(make_node("Split", {"x", "s"}, {"a", "b"}, 13), {x, i64({2, 4})});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sums to 6"), std::string::npos) << bad.status().message();
}

TEST(TensorKernel, GatherNDWithBatchDimsAndScatterNDReduction) {
  Tensor data = iota_f32({2, 2, 2});
  Tensor y =
      run1(make_node("GatherND", {"d", "i"}, {"y"}, 13, {{"batch_dims", int_attr(1)}}), {data, i64({1, 0}, {2, 1})});
  EXPECT_EQ(y.shape(), (Dims{2, 2}));
  EXPECT_EQ(values(y), (std::vector<double>{2, 3, 4, 5}));
  Tensor s = run1(make_node("ScatterND", {"d", "i", "u"}, {"y"}, 18, {{"reduction", str_attr("add")}}),
                  {f32({1, 1, 1, 1}, {4}), i64({1, 1, 3}, {3, 1}), f32({5, 6, 7}, {3})});
  EXPECT_EQ(values(s), (std::vector<double>{1, 12, 1, 8}));
  auto bad = run(make_node("ScatterND", {"d", "i", "u"}, {"y"}), {f32({1, 1}, {2}), i64({2}, {1, 1}), f32({5}, {1})});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("out of range"), std::string::npos) << bad.status().message();
}

TEST(TensorKernel, ScatterElementsReductionsOnInts) {
  Tensor data = Tensor::from_vector<int32_t>(DataType::kInt32, {3}, {std::numeric_limits<int32_t>::max(), 5, 5});
  Tensor upd = Tensor::from_vector<int32_t>(DataType::kInt32, {2}, {1, 3});
  Tensor y = run1(make_node("ScatterElements", {"d", "i", "u"}, {"y"}, 18, {{"reduction", str_attr("add")}}),
                  {data, i64({0, -1}), upd});
  EXPECT_EQ(y.get_i64(0), std::numeric_limits<int32_t>::min());  // wraps, no UB
  EXPECT_EQ(y.get_i64(2), 8);
  Tensor m = run1(make_node("ScatterElements", {"d", "i", "u"}, {"y"}, 18, {{"reduction", str_attr("min")}}),
                  {data, i64({1, 1}), upd});
  EXPECT_EQ(m.get_i64(1), 1);
}

// The no-reduction path walks the index positions as an odometer: every axis, indices smaller than
// data in the other dims, negative indices, 1-, 2-, 4- and 8-byte elements, against a direct
// computation from the definition.
TEST(TensorKernel, ScatterElementsMatchesTheDefinition) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t rank = 1 + trial % 4;
    const int64_t axis = trial % rank;
    Dims dshape, ishape;
    for (int64_t k = 0; k < rank; ++k) {
      dshape.push_back(1 + static_cast<int64_t>(rng() % 5));
      ishape.push_back(k == axis ? 1 + static_cast<int64_t>(rng() % 6) : 1 + static_cast<int64_t>(rng() % dshape[k]));
    }
    const DataType dts[] = {DataType::kFloat32, DataType::kInt64, DataType::kUInt8, DataType::kFloat16};
    const DataType dt = dts[trial % 4];
    Tensor data(dt, dshape), upd(dt, ishape), ind(DataType::kInt64, ishape);
    for (int64_t i = 0; i < data.numel(); ++i) data.set_f64(i, static_cast<double>(i % 50));
    for (int64_t i = 0; i < upd.numel(); ++i) upd.set_f64(i, static_cast<double>(100 + i % 100));
    const int64_t dim = dshape[static_cast<size_t>(axis)];
    for (int64_t i = 0; i < ind.numel(); ++i)
      ind.data<int64_t>()[i] = static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * dim)) - dim;
    ir::Node n = make_node("ScatterElements", {"d", "i", "u"}, {"y"}, 18);
    ir::Attribute a;
    a.type = ir::Attribute::Type::kInt;
    a.i = axis;
    n.attrs["axis"] = a;
    Tensor y = run1(n, {data, ind, upd});
    Tensor want = data.clone();
    Dims istr = strides_of(ishape), dstr = strides_of(dshape);
    for (int64_t j = 0; j < ind.numel(); ++j) {
      int64_t off = 0;
      for (int64_t k = 0; k < rank; ++k) {
        int64_t p = (j / istr[static_cast<size_t>(k)]) % ishape[static_cast<size_t>(k)];
        if (k == axis) p = ind.data<int64_t>()[j] < 0 ? ind.data<int64_t>()[j] + dim : ind.data<int64_t>()[j];
        off += p * dstr[static_cast<size_t>(k)];
      }
      want.set_f64(off, upd.get_f64(j));
    }
    ASSERT_EQ(values(y), values(want)) << "trial " << trial << " data " << data.describe() << " indices "
                                       << ind.describe() << " axis " << axis;
  }
}

// TopK selects with nth_element on (value, index) pairs and NonZero from flat positions: both against
// the definitions (stable sort by value, ties by index, NaN largest; row-major coordinates) on random
// shapes and axes, with many ties and NaNs.
TEST(TensorKernel, TopKAndNonZeroMatchTheDefinition) {
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t rank = 1 + trial % 3;
    Dims shape;
    for (int64_t d = 0; d < rank; ++d) shape.push_back(1 + static_cast<int64_t>(rng() % 9));
    Tensor x(DataType::kFloat32, shape);
    for (int64_t i = 0; i < x.numel(); ++i)
      x.data<float>()[i] = rng() % 7 == 0 ? NAN : static_cast<float>(static_cast<int64_t>(rng() % 5) - 2);
    const int64_t axis = trial % rank;
    const int64_t len = shape[static_cast<size_t>(axis)], k = static_cast<int64_t>(rng() % (len + 1));
    const bool largest = trial % 2 == 0;
    ir::Node n = make_node("TopK", {"x", "k"}, {"v", "i"}, 11);
    ir::Attribute a;
    a.type = ir::Attribute::Type::kInt;
    a.i = axis;
    n.attrs["axis"] = a;
    a.i = largest ? 1 : 0;
    n.attrs["largest"] = a;
    auto r = run(n, {x, i64({k})});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const Tensor& idx = r.value()[1].tensor;
    Dims str = strides_of(shape);
    const int64_t inner = str[static_cast<size_t>(axis)], outer = x.numel() / (len * inner);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        std::vector<int64_t> order(static_cast<size_t>(len));
        std::iota(order.begin(), order.end(), 0);
        auto val = [&](int64_t j) { return x.data<float>()[(o * len + j) * inner + in]; };
        std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
          float a1 = val(p), b1 = val(q);
          if (std::isnan(a1) || std::isnan(b1)) return !std::isnan(b1) ? largest : (!std::isnan(a1) ? !largest : false);
          return largest ? a1 > b1 : a1 < b1;
        });
        for (int64_t j = 0; j < k; ++j)
          ASSERT_EQ(idx.data<int64_t>()[(o * k + j) * inner + in], order[static_cast<size_t>(j)])
              << "trial " << trial << " " << x.describe() << " axis " << axis << " k " << k;
      }
    // NonZero of the same tensor (NaN counts as nonzero) and of its bool mask.
    std::vector<int64_t> want;
    for (int64_t d = 0; d < rank; ++d)
      for (int64_t i = 0; i < x.numel(); ++i)
        if (x.data<float>()[i] != 0) want.push_back(i / str[static_cast<size_t>(d)] % shape[static_cast<size_t>(d)]);
    Tensor nz = run1(make_node("NonZero", {"x"}, {"y"}, 13), {x});
    EXPECT_EQ(std::vector<int64_t>(nz.data<int64_t>(), nz.data<int64_t>() + nz.numel()), want);
    Tensor mask = x.cast(DataType::kBool).value();
    Tensor nzb = run1(make_node("NonZero", {"x"}, {"y"}, 13), {mask});
    EXPECT_EQ(std::vector<int64_t>(nzb.data<int64_t>(), nzb.data<int64_t>() + nzb.numel()), want);
  }
}

TEST(TensorKernel, UniqueSortedWithAxis) {
  Tensor x = f32({1, 0, 1, 0, 0, 1}, {3, 2});  // rows [1,0], [1,0], [0,1]
  auto r = run(make_node("Unique", {"x"}, {"y", "idx", "inv", "cnt"}, 11, {{"axis", int_attr(0)}}), {x});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values(r.value()[0].tensor), (std::vector<double>{0, 1, 1, 0}));
  EXPECT_EQ(values(r.value()[1].tensor), (std::vector<double>{2, 0}));
  EXPECT_EQ(values(r.value()[2].tensor), (std::vector<double>{1, 1, 0}));
  EXPECT_EQ(values(r.value()[3].tensor), (std::vector<double>{1, 2}));
}

TEST(TensorKernel, TriluTileRangeOneHot) {
  Tensor x = iota_f32({3, 3});
  EXPECT_EQ(values(run1(make_node("Trilu", {"x", "k"}, {"y"}, 14, {{"upper", int_attr(0)}}), {x, scalar(-1)})),
            (std::vector<double>{0, 0, 0, 3, 0, 0, 6, 7, 0}));
  EXPECT_EQ(values(run1(make_node("Tile", {"x", "r"}, {"y"}), {f32({1, 2}, {2}), i64({2})})),
            (std::vector<double>{1, 2, 1, 2}));
  Tensor rg = run1(make_node("Range", {"a", "b", "c"}, {"y"}),
                   {scalar(std::numeric_limits<int64_t>::max() - 2), scalar(std::numeric_limits<int64_t>::min()),
                    scalar(std::numeric_limits<int64_t>::min())});
  EXPECT_EQ(rg.shape(), (Dims{2}));  // huge values: counted in 128 bits
  Tensor oh = run1(make_node("OneHot", {"i", "d", "v"}, {"y"}, 11), {i64({-1, 5}), scalar(3), f32({0, 1}, {2})});
  EXPECT_EQ(values(oh), (std::vector<double>{0, 0, 1, 0, 0, 0}));
}

TEST(TensorKernel, DepthToSpaceRoundTrip) {
  Tensor x = iota_f32({1, 8, 2, 3});
  for (const char* mode : {"DCR", "CRD"}) {
    Tensor d =
        run1(make_node("DepthToSpace", {"x"}, {"y"}, 13, {{"blocksize", int_attr(2)}, {"mode", str_attr(mode)}}), {x});
    EXPECT_EQ(d.shape(), (Dims{1, 2, 4, 6}));
    if (std::string(mode) == "DCR") {
      Tensor back = run1(make_node("SpaceToDepth", {"d"}, {"y"}, 13, {{"blocksize", int_attr(2)}}), {d});
      EXPECT_EQ(values(back), values(x));
    }
  }
}

// ---------------------------------------------------------------- kernels: errors, not crashes

TEST(TensorKernel, HostileShapesAreErrors) {
  auto expect_error = [](Result<std::vector<Value>> r, const std::string& what) {
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  };
  int64_t big = int64_t{1} << 40;
  expect_error(run(make_node("ConstantOfShape", {"s"}, {"y"}), {i64({big, big})}), "too large");
  expect_error(run(make_node("ConstantOfShape", {"s"}, {"y"}), {i64({-3})}), "negative");
  expect_error(run(make_node("Expand", {"x", "s"}, {"y"}), {f32({1, 2}, {2}), i64({3})}), "cannot expand");
  expect_error(run(make_node("Tile", {"x", "r"}, {"y"}), {f32({1, 2}, {2}), i64({big})}), "too large");
  expect_error(run(make_node("Reshape", {"x", "s"}, {"y"}), {f32({1, 2}, {2}), i64({3})}), "cannot reshape");
  expect_error(run(make_node("Reshape", {"x", "s"}, {"y"}), {f32({1, 2}, {2}), i64({-1, -1})}), "more than one -1");
  expect_error(run(make_node("Gather", {"x", "i"}, {"y"}), {f32({1, 2}, {2}), i64({2})}), "out of range");
  expect_error(run(make_node("Range", {"a", "b", "c"}, {"y"}), {scalar(0), scalar(5), scalar(0)}), "delta is 0");
  expect_error(run(make_node("Slice", {"x", "s", "e", "a", "st"}, {"y"}),
                   {f32({1, 2}, {2}), i64({0}), i64({1}), i64({0}), i64({0})}),
               "step is 0");
  expect_error(run(make_node("Unsqueeze", {"x", "a"}, {"y"}, 13), {f32({1, 2}, {2}), i64({1, 1})}), "repeated");
  expect_error(run(make_node("Flatten", {"x"}, {"y"}, 13, {{"axis", int_attr(5)}}), {f32({1, 2}, {2})}),
               "out of range");
}

}  // namespace
}  // namespace kiln::ops
