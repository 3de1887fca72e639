// The CUDA tactics of cuda_more_tactics.cc (Where, comparisons and logic, Pad, Tile, Resize, Reduce*)
// against the reference kernels on random layers: odd sizes, ranks 1 to 5, broadcasting, every Pad
// mode, Resize's modes (nearest with each rounding, linear, cubic; half_pixel, asymmetric,
// align_corners, pytorch_half_pixel, tf_crop_and_resize with extrapolation; scales or sizes, up- and
// down-sampling), each Reduce op with and without keepdims. Run on the GPU (skipped without one); the
// declines (float16 data to the float32-only kernels, non-constant parameters, non-contiguous reduce
// axes) are checked in every CUDA build.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>

#include "../graph_builder.h"
#include "backends/registry.h"
#include "cuda_test_util.h"
#include "layer_case.h"

namespace kiln {
namespace {

using testing::LayerCase;
using testing::make_node;
using testing::pick;
using testing::random_tensor;
using testing::set_float;
using testing::set_string;
using GB = testing::GraphBuilder;

const backends::Tactic* tactic(const std::string& name) {
  const backends::Tactic* t = backends::find_tactic(name);
  EXPECT_NE(t, nullptr) << name;
  return t;
}

Tensor ints(const std::vector<int64_t>& v) {
  Tensor t(DataType::kInt64, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.set_i64(static_cast<int64_t>(i), v[i]);
  return t;
}

Tensor floats(const std::vector<float>& v) {
  Tensor t(DataType::kFloat32, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.set_f64(static_cast<int64_t>(i), v[i]);
  return t;
}

// Small integers in [-3, 3] as `dt` (bool: about half true), so that comparisons see equal values.
Tensor small_values(const Dims& d, uint64_t seed, DataType dt) {
  std::mt19937_64 rng(seed);
  Tensor t(dt, d);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.set_f64(i, dt == DataType::kBool ? static_cast<double>(rng() % 2) : static_cast<double>(rng() % 7) - 3);
  return t;
}

// A random shape of `rank` dims in [1, hi], and a shape broadcasting to it (dims dropped or set to 1).
Dims random_dims(std::mt19937& rng, size_t rank, int64_t hi = 7) {
  Dims d;
  for (size_t i = 0; i < rank; ++i) d.push_back(pick(rng, 1, hi));
  return d;
}
Dims broadcasting(std::mt19937& rng, const Dims& d) {
  Dims b(d.begin() + static_cast<long>(rng() % (d.size() + 1)), d.end());
  for (int64_t& x : b)
    if (rng() % 3 == 0) x = 1;
  return b;
}

// The GPU, or (KILN_CUDA_CASES_ONLY=1 in a CUDA build without one) nullptr: then the tests only check that
// the reference and the tactic accept their cases (a check of the tests themselves).
#define KILN_GPU_OR_CASES()                                                                          \
  std::string gpu_why_;                                                                              \
  const backends::DeviceRuntime* gpu = ::kiln::testing::cuda_device(&gpu_why_);                      \
  if (!gpu && !(backends::device_runtime(DeviceKind::kCUDA) && std::getenv("KILN_CUDA_CASES_ONLY"))) \
  GTEST_SKIP() << "no GPU to run the CUDA tactics: " << gpu_why_

// Runs `name` on the case on the GPU and checks it against the reference (same dtype and shape).
void expect_matches(const backends::DeviceRuntime* rt, const std::string& name, const LayerCase& lc, double atol = 1e-5,
                    double rtol = 1e-5) {
  std::vector<Tensor> want = testing::reference_outputs(lc);
  ASSERT_FALSE(want.empty()) << "the reference rejects the case " << lc.node.op_type;
  std::string dims;
  for (const Tensor& x : lc.inputs) dims += (x.defined() ? x.describe() : std::string("-")) + " ";
  const backends::Tactic* t = tactic(name);
  ASSERT_NE(t, nullptr);
  if (!rt) {
    EXPECT_EQ(backends::why_declined(*t, testing::cuda_signature(lc)), "") << name << " on " << dims;
    return;
  }
  auto got = testing::run_on_gpu(*rt, *t, lc);
  ASSERT_TRUE(got.ok()) << name << " on " << lc.node.op_type << " " << dims << ": " << got.status().message();
  ASSERT_GE(got.value().size(), 1u);
  std::string where;
  EXPECT_TRUE(testing::close_to(got.value()[0], want[0], atol, rtol, &where))
      << name << " on " << lc.node.op_type << " " << dims << ": " << where;
}

TEST(CudaMoreTactics, WhereBroadcastsEveryElementSize) {
  KILN_GPU_OR_CASES();
  std::mt19937 rng(3);
  const DataType types[] = {DataType::kFloat32, DataType::kInt64, DataType::kBool, DataType::kFloat16,
                            DataType::kInt32};
  for (int i = 0; i < 40; ++i) {
    Dims out = random_dims(rng, static_cast<size_t>(pick(rng, 1, 5)));
    DataType dt = types[i % 5];
    LayerCase lc;
    lc.node = make_node("", "Where", 3);
    lc.inputs = {small_values(broadcasting(rng, out), 100 + i, DataType::kBool),
                 small_values(i % 2 ? out : broadcasting(rng, out), 200 + i, dt),
                 small_values(broadcasting(rng, out), 300 + i, dt)};
    lc.constant = {false, false, i % 3 == 0};
    expect_matches(gpu, "where_cuda", lc, 0, 0);
  }
}

TEST(CudaMoreTactics, ComparisonsAndLogic) {
  KILN_GPU_OR_CASES();
  std::mt19937 rng(5);
  const char* cmp[] = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"};
  const char* logic[] = {"And", "Or", "Xor", "Not"};
  const DataType types[] = {DataType::kFloat32, DataType::kInt64, DataType::kInt32};
  for (int i = 0; i < 45; ++i) {
    bool is_logic = i % 3 == 2;
    std::string op = is_logic ? logic[i % 4] : cmp[i % 5];
    DataType dt = is_logic ? DataType::kBool : types[i % 3];
    if (op == "Equal" && i % 2) dt = DataType::kBool;
    Dims a = random_dims(rng, static_cast<size_t>(pick(rng, 1, 4)));
    LayerCase lc;
    lc.node = make_node("", op, op == "Not" ? 1 : 2);
    lc.inputs = {small_values(a, 400 + i, dt)};
    lc.constant = {false};
    if (op != "Not") lc.inputs.push_back(small_values(broadcasting(rng, a), 500 + i, dt)), lc.constant.push_back(i % 2);
    expect_matches(gpu, "compare_cuda", lc, 0, 0);
  }
}

TEST(CudaMoreTactics, IntegerArithmetic) {
  KILN_GPU_OR_CASES();
  std::mt19937 rng(17);
  const char* ops[] = {"Add", "Sub", "Mul", "Div", "Mod", "Min", "Max", "Abs", "Neg", "Mod"};
  for (int i = 0; i < 40; ++i) {
    std::string op = ops[i % 10];
    DataType dt = i % 2 ? DataType::kInt64 : DataType::kInt32;
    bool unary = op == "Abs" || op == "Neg", divides = op == "Div" || op == "Mod";
    Dims a = random_dims(rng, static_cast<size_t>(pick(rng, 1, 4)));
    LayerCase lc;
    lc.node = make_node("", op, unary ? 1 : 2);
    if (i % 10 == 9) GB::set_int(lc.node, "fmod", 1);
    lc.inputs = {small_values(a, 1000 + i, dt)};
    lc.constant = {false};
    if (!unary) {
      Tensor b = small_values(broadcasting(rng, a), 1100 + i, dt);
      for (int64_t k = 0; k < b.numel(); ++k)
        if (divides && b.get_i64(k) == 0) b.set_f64(k, 2);
      lc.inputs.push_back(b), lc.constant.push_back(divides || i % 3 == 0);
    }
    expect_matches(gpu, "int_arith_cuda", lc, 0, 0);
  }
}

TEST(CudaMoreTactics, PadEveryMode) {
  KILN_GPU_OR_CASES();
  std::mt19937 rng(7);
  const char* modes[] = {"constant", "reflect", "edge", "wrap"};
  for (int i = 0; i < 40; ++i) {
    std::string mode = modes[i % 4];
    Dims x = random_dims(rng, static_cast<size_t>(pick(rng, 1, 4)), 9);
    std::vector<int64_t> begin, end;
    for (int64_t d : x) {
      int64_t hi = mode == "reflect" ? d - 1 : 3, lo = mode == "constant" && d > 1 ? -1 : 0;
      begin.push_back(pick(rng, lo, std::max<int64_t>(hi, 0))), end.push_back(pick(rng, lo, std::max<int64_t>(hi, 0)));
    }
    std::vector<int64_t> pads = begin;
    pads.insert(pads.end(), end.begin(), end.end());
    DataType dt = i % 5 == 4 ? DataType::kInt64 : DataType::kFloat32;
    LayerCase lc;
    lc.node = make_node("", "Pad", mode == "constant" ? 3 : 2);
    lc.node.opset = 19;
    set_string(lc.node, "mode", mode);
    lc.inputs = {dt == DataType::kFloat32 ? random_tensor(x, 600 + i) : small_values(x, 600 + i, dt), ints(pads)};
    lc.constant = {false, true};
    if (mode == "constant") {
      Tensor v(dt, {});
      v.set_f64(0, 2.5);
      lc.inputs.push_back(v), lc.constant.push_back(true);
    }
    if (testing::reference_outputs(lc).empty()) continue;  // pads the reference refuses
    expect_matches(gpu, "pad_cuda", lc, 0, 0);
  }
}

TEST(CudaMoreTactics, Tile) {
  KILN_GPU_OR_CASES();
  std::mt19937 rng(9);
  for (int i = 0; i < 20; ++i) {
    Dims x = random_dims(rng, static_cast<size_t>(pick(rng, 1, 4)), 6);
    std::vector<int64_t> rep;
    for (size_t k = 0; k < x.size(); ++k) rep.push_back(pick(rng, 1, 3));
    LayerCase lc;
    lc.node = make_node("", "Tile", 2);
    lc.inputs = {random_tensor(x, 700 + i), ints(rep)};
    lc.constant = {false, true};
    expect_matches(gpu, "tile_cuda", lc, 0, 0);
  }
}

// A random Resize of the trailing 1-3 dims of a 3-5-D X, with scales or sizes.
LayerCase resize_case(std::mt19937& rng, int i) {
  static const char* modes[] = {"nearest", "linear", "cubic"};
  static const char* coords[] = {"half_pixel",         "asymmetric",         "align_corners",
                                 "pytorch_half_pixel", "tf_crop_and_resize", "half_pixel_symmetric"};
  static const char* nearest[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  std::string mode = modes[i % 3], coord = coords[rng() % 6];
  size_t rank = static_cast<size_t>(pick(rng, 3, 5)), resized = mode == "cubic" ? 2 : rng() % 2 ? 2 : 1;
  if (mode == "nearest" && rank == 5 && rng() % 2) resized = 3;
  Dims x = random_dims(rng, rank, 4);
  for (size_t k = rank - resized; k < rank; ++k) x[k] = pick(rng, 2, 11);
  LayerCase lc;
  lc.node = make_node("", "Resize", 4);
  lc.node.opset = 19;
  set_string(lc.node, "mode", mode);
  set_string(lc.node, "coordinate_transformation_mode", coord);
  if (mode == "nearest") set_string(lc.node, "nearest_mode", nearest[rng() % 4]);
  if (mode == "cubic" && rng() % 2) set_float(lc.node, "cubic_coeff_a", -0.5f);
  if (coord == "tf_crop_and_resize") set_float(lc.node, "extrapolation_value", 7.f);
  if (mode != "nearest" && rng() % 3 == 0) GB::set_int(lc.node, "exclude_outside", 1);
  lc.inputs = {random_tensor(x, 800 + i), Tensor(), Tensor(), Tensor()};
  lc.constant = {false, true, true, true};
  if (coord == "tf_crop_and_resize") {
    std::vector<float> roi(2 * rank);
    for (size_t k = 0; k < rank; ++k) roi[k] = 0.f, roi[rank + k] = 1.f;
    for (size_t k = rank - resized; k < rank; ++k) roi[k] = -0.2f, roi[rank + k] = 1.1f;
    lc.inputs[1] = floats(roi);
  }
  if (rng() % 2) {
    std::vector<float> scales(rank, 1.f);
    const float choices[] = {0.5f, 0.75f, 1.5f, 2.f, 3.f, 1.25f};
    for (size_t k = rank - resized; k < rank; ++k) scales[k] = choices[rng() % 6];
    lc.inputs[2] = floats(scales);
  } else {
    std::vector<int64_t> sizes(x.begin(), x.end());
    for (size_t k = rank - resized; k < rank; ++k) sizes[k] = pick(rng, 1, 17);
    lc.inputs[3] = ints(sizes);
  }
  for (size_t k = 1; k < 4; ++k)
    if (!lc.inputs[k].defined()) lc.node.inputs[k] = "";
  return lc;
}

TEST(CudaMoreTactics, ResizeModesAndCoordinates) {
  KILN_GPU_OR_CASES();
  std::mt19937 rng(11);
  int ran = 0;
  for (int i = 0; i < 90; ++i) {
    LayerCase lc = resize_case(rng, i);
    if (testing::reference_outputs(lc).empty()) continue;  // a combination the reference refuses
    expect_matches(gpu, "resize_cuda", lc, 1e-5, 1e-4);
    ++ran;
  }
  EXPECT_GE(ran, 60);
}

TEST(CudaMoreTactics, ReduceOverContiguousAxes) {
  KILN_GPU_OR_CASES();
  std::mt19937 rng(13);
  const char* ops[] = {"ReduceSum",       "ReduceMean", "ReduceMax", "ReduceMin",       "ReduceProd",
                       "ReduceSumSquare", "ReduceL1",   "ReduceL2",  "ReduceLogSumExp", "ReduceLogSum"};
  for (int i = 0; i < 60; ++i) {
    std::string op = ops[i % 10];
    size_t rank = static_cast<size_t>(pick(rng, 1, 5));
    Dims x = random_dims(rng, rank, 9);
    if (i % 4 == 0) x[rng() % rank] = pick(rng, 33, 130);  // rows longer than a warp
    int64_t a = pick(rng, 0, static_cast<int64_t>(rank) - 1), b = pick(rng, a, static_cast<int64_t>(rank) - 1);
    std::vector<int64_t> axes;
    for (int64_t k = a; k <= b; ++k) axes.push_back(rng() % 2 ? k - static_cast<int64_t>(rank) : k);
    bool all = rng() % 8 == 0;
    LayerCase lc;
    lc.node = make_node("", op, all ? 1 : 2);
    lc.node.opset = 18;
    GB::set_int(lc.node, "keepdims", rng() % 2);
    lc.inputs = {random_tensor(x, 900 + i, DataType::kFloat32, op == "ReduceLogSum" ? 0.1 : -1, 1)};
    lc.constant = {false};
    if (!all) lc.inputs.push_back(ints(axes)), lc.constant.push_back(true);
    expect_matches(gpu, "reduce_cuda", lc, 1e-5, op == "ReduceProd" ? 1e-4 : 1e-5);
  }
}

// Every CUDA build, GPU or not: the declines.
TEST(CudaMoreTactics, Declines) {
  if (!backends::device_runtime(DeviceKind::kCUDA)) GTEST_SKIP() << "built without the CUDA backend";
  auto why = [](const std::string& name, const LayerCase& lc) {
    return backends::why_declined(*tactic(name), testing::cuda_signature(lc));
  };
  LayerCase resize;
  resize.node = make_node("", "Resize", 3);
  resize.node.inputs[1] = "";
  resize.inputs = {random_tensor({1, 2, 5, 5}, 1, DataType::kFloat16), Tensor(), floats({1, 1, 2, 2})};
  resize.constant = {false, true, true};
  EXPECT_NE(why("resize_cuda", resize), "");  // float16 X: the float32 kernel declines
  resize.inputs[0] = random_tensor({1, 2, 5, 5}, 1);
  EXPECT_EQ(why("resize_cuda", resize), "");
  resize.constant[2] = false;  // scales computed at run time
  EXPECT_NE(why("resize_cuda", resize), "");

  LayerCase reduce;
  reduce.node = make_node("", "ReduceMean", 2);
  reduce.node.opset = 18;
  reduce.inputs = {random_tensor({2, 3, 4}, 2), ints({0, 2})};
  reduce.constant = {false, true};
  EXPECT_NE(why("reduce_cuda", reduce), "");  // axes 0 and 2: not contiguous
  reduce.inputs[1] = ints({1, 2});
  EXPECT_EQ(why("reduce_cuda", reduce), "");
  reduce.inputs[0] = random_tensor({2, 3, 4}, 2, DataType::kBFloat16);
  EXPECT_NE(why("reduce_cuda", reduce), "");

  LayerCase where;
  where.node = make_node("", "Where", 3);
  where.inputs = {small_values({4}, 3, DataType::kBool), random_tensor({4}, 4),
                  random_tensor({4}, 5, DataType::kInt64)};
  where.constant = {false, false, false};
  EXPECT_NE(why("where_cuda", where), "");  // X and Y differ in dtype

  LayerCase pad;
  pad.node = make_node("", "Pad", 2);
  pad.inputs = {random_tensor({3, 4}, 6), ints({0, 1, 0, 1})};
  pad.constant = {false, false};
  EXPECT_NE(why("pad_cuda", pad), "");  // pads at run time

  LayerCase div;
  div.node = make_node("", "Div", 2);
  div.inputs = {small_values({5}, 7, DataType::kInt64), ints({3})};
  div.constant = {false, true};
  EXPECT_EQ(why("int_arith_cuda", div), "");
  div.inputs[1] = ints({0});
  EXPECT_NE(why("int_arith_cuda", div), "");  // division by zero: the reference's error
  div.constant[1] = false;
  EXPECT_NE(why("int_arith_cuda", div), "");
}

}  // namespace
}  // namespace kiln
