// Helpers shared by the attention, recurrent and signal op files: symbolic dim arithmetic for
// shape inference, and reading float tensors as double vectors (whatever their float dtype).
#pragma once

#include <cmath>
#include <limits>
#include <vector>

#include "ops/common.h"

namespace kiln::ops::arnn {

// Dim arithmetic that stays unknown unless every operand is known (never guesses).
inline Dim dim_add(const Dim& a, const Dim& b) {
  if (a.known() && b.known()) return dim_plus(a, b.value);
  if (a.known() && a.value == 0) return b;
  if (b.known() && b.value == 0) return a;
  return Dim();
}
inline Dim dim_mul(const Dim& a, const Dim& b) {
  if (a.known() && b.known()) return dim_times(a, b.value);
  if (a.known() && a.value == 1) return b;
  if (b.known() && b.value == 1) return a;
  return Dim();
}
// a / b when it divides exactly; unknown otherwise (the kernel reports the bad division).
inline Dim dim_div(const Dim& a, int64_t b) {
  if (b == 1) return a;
  if (a.known() && b > 0 && a.value % b == 0) return Dim(a.value / b);
  return Dim();
}
// Dim i of a shape, unknown when the rank is unknown or too small.
inline Dim dim_at(const SymShape& s, size_t i) { return s.rank_known && i < s.rank() ? s.dims[i] : Dim(); }
// The more informative of two dims that must be equal.
inline Dim dim_merge(const Dim& a, const Dim& b) {
  if (a.known()) return a;
  if (b.known()) return b;
  return a.param.empty() ? b : a;
}

// True for the float dtypes these kernels accept.
inline bool is_float_dtype(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kFloat16 || t == DataType::kBFloat16;
}

// All elements as double (any float or integer dtype).
inline std::vector<double> as_f64(const Tensor& t) { return to_f64_vector(t); }

// A tensor of dtype `dt` holding `v` (rounded once from double to the target precision).
inline Tensor from_f64(const std::vector<double>& v, const Dims& shape, DataType dt) {
  DataType compute = dt == DataType::kFloat64 ? DataType::kFloat64 : DataType::kFloat32;
  Tensor t(compute, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_f64(i, v[static_cast<size_t>(i)]);
  return downcast_float(t, dt);
}

// Rounds a double to the precision of dtype `dt` (float32/16/bf16; double unchanged).
inline double round_to(double x, DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return static_cast<double>(static_cast<float>(x));
    case DataType::kFloat16: return static_cast<double>(half_to_float(float_to_half(static_cast<float>(x))));
    case DataType::kBFloat16: return static_cast<double>(bfloat16_to_float(float_to_bfloat16(static_cast<float>(x))));
    default: return x;
  }
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace kiln::ops::arnn
