// Random layers of the long-tail ops for the tactic test (tactic_test.cc): Resize in every mode,
// coordinate transform and input form (odd sizes, up and down, leading axes resized too, which the
// tactic must decline). Header-only, like layer_case.h.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "layer_case.h"

namespace kiln::testing {

inline Tensor i64_tensor(const std::vector<int64_t>& v) {
  Tensor t(DataType::kInt64, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.data<int64_t>()[i] = v[i];
  return t;
}

inline Tensor f32_tensor(const std::vector<float>& v) {
  Tensor t(DataType::kFloat32, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = v[i];
  return t;
}

inline LayerCase resize_case(std::mt19937& rng, uint64_t seed) {
  const int64_t rank = pick(rng, 1, 4);
  Dims x(static_cast<size_t>(rank));
  for (int64_t d = 0; d < rank; ++d) x[static_cast<size_t>(d)] = d + 2 >= rank ? pick(rng, 1, 13) : pick(rng, 1, 4);
  const bool upsample = rng() % 10 == 0;
  static const int kOpsets[] = {11, 13, 18, 19};
  LayerCase lc;
  lc.node = make_node("", upsample ? "Upsample" : "Resize", upsample ? 2 : 4);
  ir::Node& n = lc.node;
  n.opset = upsample ? 9 : kOpsets[rng() % 4];
  static const char* kModes[] = {"nearest", "linear", "cubic"};
  std::string mode = kModes[rng() % (upsample ? 2 : 3)];
  set_string(n, "mode", mode);
  static const char* kCoords[] = {"half_pixel", "pytorch_half_pixel",   "align_corners",      "asymmetric",
                                  "half_pixel", "tf_half_pixel_for_nn", "tf_crop_and_resize", "half_pixel_symmetric"};
  std::string coord = kCoords[rng() % (n.opset >= 19 ? 8 : 7)];
  static const char* kNearest[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  if (!upsample) {
    set_string(n, "coordinate_transformation_mode", coord);
    if (mode == "nearest") set_string(n, "nearest_mode", kNearest[rng() % 4]);
    if (mode == "cubic" && rng() % 2) set_float(n, "cubic_coeff_a", -0.5f);
    if (mode != "nearest" && rng() % 4 == 0) GraphBuilder::set_int(n, "exclude_outside", 1);
    if (n.opset >= 18 && mode != "nearest" && rng() % 4 == 0) GraphBuilder::set_int(n, "antialias", 1);
    if (coord == "tf_crop_and_resize" && rng() % 2) set_float(n, "extrapolation_value", -7.f);
  }
  // The resized axes: the last two (or fewer) in most cases, sometimes a leading one too.
  std::vector<bool> resized(static_cast<size_t>(rank), false);
  for (int64_t d = std::max<int64_t>(0, rank - 2); d < rank; ++d) resized[static_cast<size_t>(d)] = rng() % 4 != 0;
  if (rank > 2 && rng() % 6 == 0) resized[0] = true;
  bool use_sizes = !upsample && rng() % 2;
  std::vector<float> scales;
  std::vector<int64_t> sizes;
  static const float kScales[] = {0.5f, 0.75f, 1.f, 1.5f, 2.f, 3.f, 8.f / 3.f, 0.4f};
  for (int64_t d = 0; d < rank; ++d) {
    int64_t in = x[static_cast<size_t>(d)];
    if (!resized[static_cast<size_t>(d)]) {
      scales.push_back(1.f), sizes.push_back(in);
      continue;
    }
    scales.push_back(kScales[rng() % 8]);
    sizes.push_back(pick(rng, 1, 2 * in + 3));
  }
  lc.inputs = {random_tensor(x, seed, DataType::kFloat32, -2, 2)};
  lc.constant = {false};
  if (upsample) {
    lc.inputs.push_back(f32_tensor(scales));
    lc.constant.push_back(true);
    return lc;
  }
  // roi: used by tf_crop_and_resize only (starts / ends per axis)
  if (coord == "tf_crop_and_resize") {
    std::vector<float> roi(static_cast<size_t>(2 * rank));
    for (int64_t d = 0; d < rank; ++d) {
      bool r = resized[static_cast<size_t>(d)];
      roi[static_cast<size_t>(d)] = r ? static_cast<float>(pick(rng, 0, 4)) / 10.f : 0.f;
      roi[static_cast<size_t>(rank + d)] = r ? static_cast<float>(pick(rng, 6, 12)) / 10.f : 1.f;
    }
    lc.inputs.push_back(f32_tensor(roi));
  } else {
    lc.inputs.push_back(Tensor());
    n.inputs[1] = "";
  }
  if (use_sizes) {
    lc.inputs.push_back(Tensor());
    n.inputs[2] = "";
    lc.inputs.push_back(i64_tensor(sizes));
  } else {
    lc.inputs.push_back(f32_tensor(scales));
    lc.inputs.push_back(Tensor());
    n.inputs.pop_back();
    lc.inputs.pop_back();
  }
  lc.constant.resize(lc.inputs.size(), true);
  return lc;
}

// A tensor of small integers in [lo, hi] (ties for the comparisons; 0 / 1 for bool), a few NaN
// and infinities among float values when `specials`.
inline Tensor small_ints(const Dims& d, DataType dt, std::mt19937& rng, int lo, int hi, bool specials = false) {
  Tensor t(dt, d);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = static_cast<double>(pick(rng, lo, hi)) / (dt == DataType::kFloat32 ? 2.0 : 1.0);
    if (specials && rng() % 16 == 0) v = rng() % 3 == 0 ? NAN : rng() % 2 ? INFINITY : -INFINITY;
    t.set_f64(i, v);
  }
  return t;
}

// `out` with a random suffix kept, each kept dim 1 at random (a numpy-broadcastable shape).
inline Dims broadcast_of(std::mt19937& rng, const Dims& out) {
  if (rng() % 4 == 0) return rng() % 2 ? Dims{} : Dims{1};
  Dims d(out.begin() + static_cast<int64_t>(rng() % (out.size() + 1)), out.end());
  for (auto& x : d)
    if (rng() % 3 == 0) x = 1;
  return d;
}

inline Dims random_shape(std::mt19937& rng, int64_t max_rank, int64_t hi) {
  Dims d(static_cast<size_t>(pick(rng, 0, max_rank)));
  for (auto& x : d) x = rng() % 6 == 0 ? pick(rng, 30, 300) : pick(rng, 1, hi);
  return d;
}

// Where, comparisons, logical ops, IsNaN / IsInf over broadcast shapes and several dtypes; integer
// arithmetic (int64 / int32 Add, Sub, Mul, Div, Max, Min: values wrapping at the dtype's ends, negative
// quotients truncated, no zero divisor).
inline LayerCase logic_case(std::mt19937& rng, uint64_t seed) {
  (void)seed;
  static const char* kOps[] = {"Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And",
                               "Or",    "Xor",   "Not",  "IsNaN",   "IsInf",       "Where",          "Less"};
  static const char* kArith[] = {"Add", "Sub", "Mul", "Div", "Max", "Min"};
  std::string op = kOps[rng() % 14];
  if (rng() % 3 == 0) op = kArith[rng() % 6];
  Dims out = random_shape(rng, 4, 7);
  LayerCase lc;
  auto operand = [&](DataType dt, bool full) {
    Dims d = full ? out : broadcast_of(rng, out);
    return dt == DataType::kBool ? small_ints(d, dt, rng, 0, 1)
                                 : small_ints(d, dt, rng, -3, 3, dt == DataType::kFloat32);
  };
  static const DataType kCmp[] = {DataType::kFloat32, DataType::kInt64, DataType::kInt32, DataType::kBool,
                                  DataType::kFloat64};
  static const DataType kAny[] = {DataType::kFloat32, DataType::kInt64, DataType::kInt32, DataType::kBool,
                                  DataType::kFloat64, DataType::kUInt8, DataType::kInt16};
  const int full = static_cast<int>(rng() % 3);  // the input that carries the output's shape
  if (std::find(std::begin(kArith), std::end(kArith), op) != std::end(kArith)) {
    DataType dt = rng() % 2 ? DataType::kInt64 : DataType::kInt32;
    auto ints = [&](bool is_full, bool divisor) {
      Tensor t = operand(dt, is_full);
      for (int64_t i = 0; i < t.numel(); ++i) {
        double v = t.get_f64(i);
        if (rng() % 8 == 0) v = dt == DataType::kInt64 ? 9.0e18 * (rng() % 2 ? 1 : -1) : 2.1e9 * (rng() % 2 ? 1 : -1);
        if (divisor && v == 0) v = rng() % 2 ? 1 : -1;
        t.set_f64(i, v);
      }
      return t;
    };
    lc.inputs = {ints(full != 1, false), ints(full == 1, op == "Div")};
  } else if (op == "Where") {
    DataType dt = kAny[rng() % 7];
    lc.inputs = {operand(DataType::kBool, full == 0), operand(dt, full == 1), operand(dt, full == 2)};
  } else if (op == "Not" || op == "IsNaN" || op == "IsInf") {
    lc.inputs = {operand(op == "Not" ? DataType::kBool : DataType::kFloat32, true)};
  } else {
    bool logical = op == "And" || op == "Or" || op == "Xor";
    DataType dt = logical ? DataType::kBool : kCmp[rng() % 5];
    lc.inputs = {operand(dt, full != 1), operand(dt, full == 1)};
  }
  lc.node = make_node("", op, lc.inputs.size());
  if (op == "Where") lc.node.opset = 16;
  if (op == "IsInf") {
    lc.node.opset = 10;
    if (rng() % 3 == 0) GraphBuilder::set_int(lc.node, rng() % 2 ? "detect_negative" : "detect_positive", 0);
  }
  lc.constant.assign(lc.inputs.size(), false);
  for (size_t i = 0; i < lc.inputs.size(); ++i) lc.constant[i] = rng() % 4 == 0;
  return lc;
}

// Transpose, Slice, Split, Expand, Tile, Pad and Concat over several dtypes: every perm, negative
// and out-of-range slice bounds, negative steps, uneven splits, broadcasting expands, pads that
// crop, every pad mode, concatenation along every axis.
inline LayerCase movement_case(std::mt19937& rng, uint64_t seed) {
  static const char* kOps[] = {"Transpose", "Slice",     "Split", "Expand", "Tile",    "Pad",
                               "Concat",    "Transpose", "Pad",   "Gather", "Dropout", "Identity"};
  std::string op = kOps[rng() % 12];
  static const DataType kTypes[] = {DataType::kFloat32, DataType::kInt64, DataType::kBool, DataType::kFloat32,
                                    DataType::kInt32,   DataType::kUInt8, DataType::kInt16};
  DataType dt = kTypes[rng() % 7];
  const int64_t rank = pick(rng, op == "Transpose" || op == "Split" || op == "Concat" || op == "Gather" ? 1 : 0, 5);
  Dims x(static_cast<size_t>(rank));
  for (auto& d : x) d = rng() % 8 == 0 ? pick(rng, 17, 70) : pick(rng, 1, 6);
  auto values = [&](const Dims& d) {
    return dt == DataType::kBool ? small_ints(d, dt, rng, 0, 1) : small_ints(d, dt, rng, -100, 100);
  };
  LayerCase lc;
  lc.inputs = {values(x)};
  lc.constant = {false};
  auto add_ints = [&](const std::vector<int64_t>& v) {
    lc.inputs.push_back(i64_tensor(v));
    lc.constant.push_back(true);
  };
  int opset = 17;
  if (op == "Transpose") {
    std::vector<int64_t> perm(static_cast<size_t>(rank));
    for (int64_t i = 0; i < rank; ++i) perm[static_cast<size_t>(i)] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    lc.node = make_node("", op, 1);
    if (rng() % 5) GraphBuilder::set_ints(lc.node, "perm", perm);
  } else if (op == "Slice") {
    std::vector<int64_t> starts, ends, axes, steps;
    for (int64_t a = 0; a < rank; ++a) {
      if (rng() % 3 == 0) continue;
      int64_t d = x[static_cast<size_t>(a)];
      starts.push_back(pick(rng, -d - 2, d + 2));
      ends.push_back(rng() % 6 == 0 ? (rng() % 2 ? INT64_MAX : INT64_MIN) : pick(rng, -d - 2, d + 2));
      axes.push_back(rng() % 2 ? a : a - rank);
      steps.push_back(rng() % 3 == 0 ? -pick(rng, 1, 3) : pick(rng, 1, 3));
    }
    bool with_axes = !axes.empty() && rng() % 4 != 0, with_steps = with_axes && rng() % 3 != 0;
    if (!with_axes) {  // axes 0..n-1 in order
      for (size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<int64_t>(i);
      starts.resize(std::min<size_t>(starts.size(), static_cast<size_t>(rank)));
      ends.resize(starts.size());
    }
    add_ints(starts);
    add_ints(ends);
    if (with_axes) add_ints(axes);
    if (with_steps) add_ints(steps);
    lc.node = make_node("", op, lc.inputs.size());
  } else if (op == "Split") {
    int64_t axis = pick(rng, -rank, rank - 1), d = x[static_cast<size_t>(axis < 0 ? axis + rank : axis)];
    int64_t n = pick(rng, 1, 4);
    lc.node = make_node("", op, 1);
    GraphBuilder::set_int(lc.node, "axis", axis);
    if (rng() % 2) {  // explicit sizes
      std::vector<int64_t> sizes(static_cast<size_t>(n), 0);
      for (int64_t i = 0; i < d; ++i) sizes[rng() % static_cast<size_t>(n)]++;
      add_ints(sizes);
      lc.node = make_node("", op, 2);
      GraphBuilder::set_int(lc.node, "axis", axis);
    } else {
      opset = 18;
      GraphBuilder::set_int(lc.node, "num_outputs", n);
    }
    lc.node.outputs.clear();
    for (int64_t i = 0; i < n; ++i) lc.node.outputs.push_back("y" + std::to_string(i));
  } else if (op == "Expand") {
    Dims target;
    int64_t extra = pick(rng, 0, 2);
    for (int64_t i = 0; i < extra; ++i) target.push_back(pick(rng, 1, 3));
    for (int64_t d : x) target.push_back(d == 1 ? pick(rng, 1, 5) : (rng() % 4 == 0 ? 1 : d));
    add_ints(target);
    lc.node = make_node("", op, 2);
  } else if (op == "Tile") {
    std::vector<int64_t> reps;
    for (int64_t i = 0; i < rank; ++i) reps.push_back(pick(rng, 0, 3) == 0 && rng() % 3 ? 1 : pick(rng, 0, 3));
    add_ints(reps);
    lc.node = make_node("", op, 2);
  } else if (op == "Pad") {
    static const char* kModes[] = {"constant", "reflect", "edge", "wrap", "constant"};
    std::string mode = kModes[rng() % 5];
    opset = mode == "wrap" || rng() % 3 == 0 ? 19 : 13;
    std::vector<int64_t> pads(static_cast<size_t>(2 * rank));
    for (int64_t a = 0; a < rank; ++a) {
      int64_t d = x[static_cast<size_t>(a)];
      for (int side = 0; side < 2; ++side) {
        int64_t v = rng() % 3 == 0 ? 0 : pick(rng, mode == "reflect" ? 0 : -std::min<int64_t>(d / 2, 2), 3);
        if (mode == "reflect") v = std::min(v, d - 1);
        pads[static_cast<size_t>(side * rank + a)] = v;
      }
    }
    add_ints(pads);
    bool value = mode == "constant" && rng() % 2;
    if (value) {
      lc.inputs.push_back(small_ints({}, dt, rng, 1, 9));
      lc.constant.push_back(rng() % 2 == 0);
    }
    lc.node = make_node("", op, lc.inputs.size());
    set_string(lc.node, "mode", mode);
  } else if (op == "Gather") {  // indices of any shape (a scalar too), negative ones, constant or not
    int64_t axis = pick(rng, -rank, rank - 1), d = x[static_cast<size_t>(axis < 0 ? axis + rank : axis)];
    Dims ind = random_shape(rng, 2, 5);
    DataType it = rng() % 3 ? DataType::kInt64 : DataType::kInt32;
    lc.inputs.push_back(small_ints(ind, it, rng, static_cast<int>(-d), static_cast<int>(d - 1)));
    lc.constant.push_back(rng() % 2 == 0);
    lc.node = make_node("", op, 2);
    GraphBuilder::set_int(lc.node, "axis", axis);
  } else if (op == "Dropout" || op == "Identity") {
    lc.node = make_node("", op, 1);
    if (op == "Dropout" && rng() % 2) {  // opset 12+: inference, or training with ratio 0 (the identity)
      opset = 13;
      bool training = rng() % 2;
      lc.inputs.push_back(Tensor::scalar<float>(DataType::kFloat32, training ? 0.f : 0.3f));
      lc.inputs.push_back(Tensor(DataType::kBool, {}));
      lc.inputs.back().set_f64(0, training ? 1 : 0);
      lc.constant.insert(lc.constant.end(), {true, true});
      lc.node = make_node("", op, 3);
    }
    if (op == "Dropout" && rng() % 2) lc.node.outputs.push_back("mask");
  } else {  // Concat
    int64_t axis = pick(rng, -rank, rank - 1), a = axis < 0 ? axis + rank : axis;
    int64_t n = pick(rng, 1, 4);
    for (int64_t i = 1; i < n; ++i) {
      Dims d = x;
      d[static_cast<size_t>(a)] = pick(rng, 0, 5);
      lc.inputs.push_back(values(d));
      lc.constant.push_back(rng() % 4 == 0);
    }
    lc.node = make_node("", op, lc.inputs.size());
    GraphBuilder::set_int(lc.node, "axis", axis);
  }
  lc.node.opset = opset;
  return lc;
}

// Cast / CastLike between the numeric dtypes: out-of-range floats (clamped), NaN, fractions
// (truncated), negative integers into unsigned ones (wrapped).
inline LayerCase cast_case(std::mt19937& rng, uint64_t seed) {
  static const DataType kTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kInt64, DataType::kInt32,
                                    DataType::kInt16,   DataType::kInt8,    DataType::kUInt8, DataType::kBool};
  DataType from = kTypes[rng() % 8], to = kTypes[rng() % 8];
  Dims x = random_shape(rng, 3, 9);
  LayerCase lc;
  Tensor t(from, x);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v =
        static_cast<double>(pick(rng, -400, 400)) / (from == DataType::kFloat32 || from == DataType::kFloat64 ? 4 : 1);
    if (from == DataType::kBool) v = static_cast<double>(rng() % 2);
    if ((from == DataType::kFloat32 || from == DataType::kFloat64) && rng() % 20 == 0)
      v = rng() % 3 == 0 ? NAN : (rng() % 2 ? 1e30 : -1e30);
    if (from == DataType::kInt64 && rng() % 20 == 0) v = 9.007199254740993e15 * (rng() % 2 ? 1 : -1);  // > 2^53
    t.set_f64(i, v);
  }
  lc.inputs = {t};
  lc.constant = {false};
  if (rng() % 4 == 0) {
    lc.node = make_node("", "CastLike", 2);
    lc.inputs.push_back(Tensor(to, {1}));
    lc.constant.push_back(true);
  } else {
    lc.node = make_node("", "Cast", 1);
    GraphBuilder::set_int(lc.node, "to", static_cast<int64_t>(to));
  }
  return lc;
}

// The reductions along random axes (attribute or input, negative, none = all, keepdims or not),
// long rows and long columns; a few NaN and infinities for Max / Min / LogSumExp.
inline LayerCase reduce_case(std::mt19937& rng, uint64_t seed) {
  static const char* kOps[] = {"ReduceSum",    "ReduceMean",      "ReduceMax",  "ReduceMin",
                               "ReduceProd",   "ReduceSumSquare", "ReduceL1",   "ReduceL2",
                               "ReduceLogSum", "ReduceLogSumExp", "ReduceMean", "ReduceMean"};
  std::string op = kOps[rng() % 12];
  const int64_t rank = pick(rng, 1, 4);
  Dims x(static_cast<size_t>(rank));
  for (auto& d : x) d = rng() % 6 == 0 ? pick(rng, 30, 700) : pick(rng, 1, 9);
  if (op == "ReduceProd")
    for (auto& d : x) d = std::min<int64_t>(d, 8);
  std::vector<int64_t> axes;
  for (int64_t a = 0; a < rank; ++a)
    if (rng() % 2) axes.push_back(rng() % 2 ? a : a - rank);
  if (axes.size() > 1 && rng() % 2) std::swap(axes[0], axes[1]);
  LayerCase lc;
  bool positive = op == "ReduceLogSum";
  Tensor t = random_tensor(x, seed, DataType::kFloat32, positive ? 0.1 : -2, 2);
  bool specials = (op == "ReduceMax" || op == "ReduceMin" || op == "ReduceLogSumExp") && rng() % 3 == 0;
  for (int64_t i = 0; specials && i < t.numel(); ++i)
    if (rng() % 23 == 0) t.data<float>()[i] = rng() % 3 == 0 ? NAN : (rng() % 2 ? INFINITY : -INFINITY);
  lc.inputs = {t};
  lc.constant = {false};
  bool as_input = rng() % 2;
  if (as_input && (!axes.empty() || rng() % 2)) {
    lc.inputs.push_back(i64_tensor(axes));
    lc.constant.push_back(true);
  }
  lc.node = make_node("", op, lc.inputs.size());
  lc.node.opset = as_input ? 18 : (op == "ReduceSum" ? 11 : 13);
  if (!as_input && !axes.empty()) GraphBuilder::set_ints(lc.node, "axes", axes);
  if (rng() % 3 == 0) GraphBuilder::set_int(lc.node, "keepdims", 0);
  return lc;
}

// GroupNormalization (opset 18: scale / bias per group, 21: per channel) and InstanceNormalization
// over 2-D to 5-D X, odd channel counts and spatial sizes.
inline LayerCase group_norm_case(std::mt19937& rng, uint64_t seed) {
  bool instance = rng() % 2;
  int64_t groups = pick(rng, 1, 6), cpg = pick(rng, 1, 5), c = groups * cpg;
  Dims x = {pick(rng, 1, 3), c};
  int64_t extra = pick(rng, 0, 3);
  for (int64_t i = 0; i < extra; ++i) x.push_back(rng() % 5 == 0 ? pick(rng, 20, 90) : pick(rng, 1, 9));
  LayerCase lc;
  lc.node = make_node("", instance ? "InstanceNormalization" : "GroupNormalization", 3);
  int64_t nparam = c;
  if (!instance) {
    lc.node.opset = rng() % 2 ? 18 : 21;
    GraphBuilder::set_int(lc.node, "num_groups", groups);
    if (lc.node.opset == 18) nparam = groups;
  }
  if (rng() % 2) set_float(lc.node, "epsilon", 1e-3f);
  lc.inputs = {random_tensor(x, seed, DataType::kFloat32, -3, 5), random_tensor({nparam}, seed + 1),
               random_tensor({nparam}, seed + 2)};
  lc.constant = {false, rng() % 6 != 0, true};
  return lc;
}

// kiln.ChannelShuffle: 1-3 inputs of rank 2-5 (odd channel counts, one input may have none), 1-4
// groups dividing their channels, 1-3 outputs splitting them; any element size.
inline LayerCase channel_shuffle_case(std::mt19937& rng) {
  static const DataType kTypes[] = {DataType::kFloat32, DataType::kInt64, DataType::kUInt8, DataType::kInt16};
  const DataType dt = kTypes[rng() % 4];
  const int64_t rank = pick(rng, 2, 5), groups = pick(rng, 1, 4);
  Dims x(static_cast<size_t>(rank));
  for (auto& d : x) d = pick(rng, 1, 7);
  const int64_t inputs = pick(rng, 1, 3);
  std::vector<int64_t> channels(static_cast<size_t>(inputs));
  int64_t c = 0;
  for (auto& k : channels) c += k = pick(rng, 0, 9);
  const int64_t more = c == 0 ? groups : (groups - c % groups) % groups;  // groups divide the total
  channels.back() += more;
  c += more;
  LayerCase lc;
  for (int64_t k : channels) {
    Dims d = x;
    d[1] = k;
    lc.inputs.push_back(small_ints(d, dt, rng, 0, 100));
    lc.constant.push_back(false);
  }
  lc.node = make_node("kiln", "ChannelShuffle", lc.inputs.size());
  GraphBuilder::set_int(lc.node, "groups", groups);
  const int64_t outputs = pick(rng, 1, 3);
  std::vector<int64_t> split(static_cast<size_t>(outputs), 0);
  for (int64_t i = 0; i < c; ++i) split[rng() % split.size()]++;
  GraphBuilder::set_ints(lc.node, "split", split);
  lc.node.outputs.clear();
  for (int64_t i = 0; i < outputs; ++i) lc.node.outputs.push_back("y" + std::to_string(i));
  return lc;
}

inline LayerCase longtail_case(std::mt19937& rng, uint64_t seed, int which) {
  switch (which % 6) {
    case 5: return group_norm_case(rng, seed);
    case 4: return reduce_case(rng, seed);
    case 3: return cast_case(rng, seed);
    case 1: return logic_case(rng, seed);
    case 2: return movement_case(rng, seed);
    default: return resize_case(rng, seed);
  }
}

}  // namespace kiln::testing
