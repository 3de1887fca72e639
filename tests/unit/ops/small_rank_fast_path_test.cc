// The allocation-free paths of the Reduce*, binary elementwise and Slice reference kernels (rank <= 8,
// tests/noalloc) give the general kernels' values: the same data at rank 9 (leading 1-dims) takes the
// general path, and both results are compared element by element.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "ops/elementwise_util.h"
#include "ops/interpreter.h"
#include "ops/registry.h"

namespace kiln::ops {
namespace {

ir::Node node(const std::string& op, int opset, int n_in) {
  ir::Node n;
  n.name = "n";
  n.op_type = op;
  n.opset = opset;
  for (int i = 0; i < n_in; ++i) n.inputs.push_back("i" + std::to_string(i));
  n.outputs.push_back("o");
  return n;
}
void set_int(ir::Node& n, const std::string& name, int64_t v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kInt;
  a.i = v;
  n.attrs[name] = a;
}

Tensor run1(const ir::Node& n, const std::vector<Tensor>& inputs) {
  const OpSchema* s = OpRegistry::get().find("", n.op_type, n.opset);
  EXPECT_NE(s, nullptr);
  std::vector<Value> vals(inputs.begin(), inputs.end());
  std::vector<const Value*> ptrs;
  for (size_t i = 0; i < vals.size(); ++i) ptrs.push_back(inputs[i].defined() ? &vals[i] : nullptr);
  auto r = run_node(n, *s, ptrs, nullptr);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value()[0].tensor : Tensor();
}

// `t` with `extra` leading 1-dims.
Tensor lifted(const Tensor& t, size_t extra) {
  Dims d(extra, 1);
  d.insert(d.end(), t.shape().begin(), t.shape().end());
  return t.reshaped(d);
}

Tensor random_of(DataType dt, const Dims& shape, uint32_t seed) {
  Tensor t(dt, shape);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(-50, 50);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_f64(i, dt == DataType::kFloat32 ? u(rng) * 0.37 : u(rng));
  return t;
}

void expect_same_bytes(const Tensor& fast, const Tensor& general, const std::string& what) {
  ASSERT_EQ(fast.dtype(), general.dtype()) << what;
  ASSERT_EQ(fast.numel(), general.numel()) << what;
  ASSERT_EQ(std::memcmp(fast.raw(), general.raw(), fast.nbytes()), 0) << what;
}

Tensor i64(std::vector<int64_t> v) {
  return Tensor::from_vector<int64_t>(DataType::kInt64, {static_cast<int64_t>(v.size())}, v);
}

TEST(SmallRankFastPath, ReductionsMatchTheGeneralKernel) {
  for (const char* op : {"ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd"})
    for (DataType dt : {DataType::kInt64, DataType::kInt32, DataType::kFloat32})
      for (int keep : {0, 1})
        for (std::vector<int64_t> axes : {std::vector<int64_t>{1}, {-1, 0}, {}, {0, 1, 2}}) {
          Tensor x = random_of(dt, {2, 3, 4}, 7);
          if (dt == DataType::kFloat32) x.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
          const int opset = std::string(op) == "ReduceSum" ? 13 : 18;
          ir::Node n = node(op, opset, axes.empty() ? 1 : 2);
          set_int(n, "keepdims", keep);
          std::vector<int64_t> lifted_axes;
          for (int64_t a : axes) lifted_axes.push_back(a < 0 ? a : a + 6);
          Tensor fast = run1(n, axes.empty() ? std::vector<Tensor>{x} : std::vector<Tensor>{x, i64(axes)});
          Tensor general = run1(n, axes.empty() ? std::vector<Tensor>{lifted(x, 6)}
                                                : std::vector<Tensor>{lifted(x, 6), i64(lifted_axes)});
          const std::string what =
              std::string(op) + " " + dtype_name(dt) + " keepdims " + std::to_string(keep) + " axes " + dims_str(axes);
          expect_same_bytes(fast, general, what);
          if (axes.empty() && !keep) {
            EXPECT_EQ(fast.rank(), 0) << what;  // all axes, no keepdims: a scalar
          }
          if (keep) {
            EXPECT_EQ(lifted(fast, 6).shape(), general.shape()) << what;
          }
        }
}

TEST(SmallRankFastPath, IntegerSumWrapsAndFloatMaxKeepsTheFirstNaN) {
  ir::Node sum = node("ReduceSum", 13, 1);
  set_int(sum, "keepdims", 0);
  Tensor big = Tensor::from_vector<int32_t>(DataType::kInt32, {2}, {std::numeric_limits<int32_t>::max(), 1});
  EXPECT_EQ(run1(sum, {big}).data<int32_t>()[0], std::numeric_limits<int32_t>::min());
  ir::Node max = node("ReduceMax", 18, 1);
  Tensor x = Tensor::from_vector<float>(DataType::kFloat32, {3}, {1, std::nanf(""), 5});
  EXPECT_TRUE(std::isnan(run1(max, {x}).data<float>()[0]));
}

TEST(SmallRankFastPath, BinaryElementwiseMatchesTheGeneralKernel) {
  for (const char* op : {"Add", "Sub", "Mul", "Div"})
    for (DataType dt : {DataType::kInt64, DataType::kFloat32}) {
      Tensor a = random_of(dt, {2, 1, 4}, 3), b = random_of(dt, {3, 1}, 5);
      for (int64_t i = 0; i < b.numel(); ++i)
        if (b.get_f64(i) == 0) b.set_f64(i, 2);  // no division by zero
      ir::Node n = node(op, 14, 2);
      Tensor fast = run1(n, {a, b});
      EXPECT_EQ(fast.shape(), (Dims{2, 3, 4})) << op;
      expect_same_bytes(fast, run1(n, {lifted(a, 6), lifted(b, 7)}), std::string(op) + " " + dtype_name(dt));
    }
  // Shapes that do not broadcast still fail with the general kernel's error.
  const OpSchema* s = OpRegistry::get().find("", "Add", 14);
  Value a(random_of(DataType::kInt64, {2, 3}, 1)), b(random_of(DataType::kInt64, {4}, 2));
  EXPECT_FALSE(run_node(node("Add", 14, 2), *s, {&a, &b}, nullptr).ok());
}

TEST(SmallRankFastPath, SmallBroadcastStrides) {
  Tensor a(DataType::kFloat32, {2, 1, 4}), b(DataType::kFloat32, {3, 1}), c(DataType::kFloat32, {5});
  SmallBroadcast sb;
  ASSERT_TRUE(small_broadcast({&a, &b}, sb));
  EXPECT_EQ(sb.rank, 3u);
  EXPECT_EQ(std::vector<int64_t>(sb.out, sb.out + 3), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(std::vector<int64_t>(sb.stride[0], sb.stride[0] + 3), (std::vector<int64_t>{4, 0, 1}));
  EXPECT_EQ(std::vector<int64_t>(sb.stride[1], sb.stride[1] + 3), (std::vector<int64_t>{0, 1, 0}));
  std::vector<int64_t> seen;
  sb.for_each([&](int64_t i, const int64_t* off) {
    if (i == 23) seen = {off[0], off[1]};
  });
  EXPECT_EQ(seen, (std::vector<int64_t>{7, 2}));  // [1, 2, 3]: a's element 4 + 3, b's row 2
  EXPECT_FALSE(small_broadcast({&a, &c}, sb)) << "4 and 5 do not broadcast";
  Tensor deep(DataType::kFloat32, Dims(9, 1));
  EXPECT_FALSE(small_broadcast({&deep, &a}, sb)) << "rank 9 takes the general path";
}

TEST(SmallRankFastPath, SliceMatchesTheGeneralKernel) {
  Tensor x = random_of(DataType::kInt64, {4, 5, 6}, 11);
  struct Case {
    std::vector<int64_t> starts, ends, axes, steps;
  };
  for (const Case& c : {Case{{1}, {3}, {}, {}}, Case{{-1, 0}, {-100, 5}, {2, 0}, {-2, 2}},
                        Case{{0, 1, 2}, {4, 5, 6}, {0, 1, 2}, {3, 1, 2}}, Case{{2}, {2}, {1}, {1}}}) {
    ir::Node n = node("Slice", 13, c.axes.empty() ? 3 : 5);
    std::vector<int64_t> lifted_axes;
    for (int64_t a : c.axes) lifted_axes.push_back(a < 0 ? a : a + 6);
    std::vector<Tensor> fast_in{x, i64(c.starts), i64(c.ends)}, general_in{lifted(x, 6), i64(c.starts), i64(c.ends)};
    if (!c.axes.empty()) {  // (without axes, 0..n-1: the lifted tensor would slice its leading 1-dims)
      fast_in.push_back(i64(c.axes)), fast_in.push_back(i64(c.steps));
      general_in.push_back(i64(lifted_axes)), general_in.push_back(i64(c.steps));
    }
    Tensor fast = run1(n, fast_in);
    if (c.axes.empty()) {
      EXPECT_EQ(fast.shape(), (Dims{2, 5, 6}));
      for (int64_t i = 0; i < fast.numel(); ++i) ASSERT_EQ(fast.data<int64_t>()[i], x.data<int64_t>()[30 + i]);
      continue;
    }
    Tensor general = run1(n, general_in);
    EXPECT_EQ(lifted(fast, 6).shape(), general.shape()) << dims_str(c.starts);
    expect_same_bytes(fast, general, "Slice starts " + dims_str(c.starts));
  }
}

}  // namespace
}  // namespace kiln::ops
