// kiln's CUDA kernels for the layers of the suite's transformers, segmentation and detection models that
// the first kernels left on the host (cuda_more_kernels.cu, tactics in cuda_more_tactics.cc): Where and
// the comparisons, index-map gathers (Pad, Tile, nearest Resize), weighted Resize (linear, cubic),
// reductions over a contiguous group of axes. The tactics compute every table at prepare time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/cuda_kernels.h"

namespace kiln::backends::cuda {

// Up to three inputs broadcast to `dims`: strides in elements per input (0 where it broadcasts).
struct Broadcast3 {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[3][kMaxRank] = {};
};

// y = cond ? a : b; cond is bool (one byte), a/b/y have elements of `elem_size` bytes (1, 2, 4, 8).
cudaError_t launch_where(const void* cond, const void* a, const void* b, void* y, int64_t elem_size, int64_t n,
                         const Broadcast3& p, cudaStream_t s);

// Comparisons and logic with a bool (one byte) result: a and b of `type` (logic ops: bool).
enum class CompareOp : int { kEqual, kLess, kLessOrEqual, kGreater, kGreaterOrEqual, kAnd, kOr, kXor, kNot };
enum class CompareType : int { kFloat32, kInt32, kInt64, kBool };
cudaError_t launch_compare(const void* a, const void* b, void* y, CompareType type, CompareOp op, int64_t n,
                           const Broadcast3& p, cudaStream_t s);

// out[o] = in[sum_k maps[k][o_k] * in_strides[k]] over the output dims, or `fill` (its first
// elem_size bytes) where some maps[k][o_k] < 0. maps: one int64 table per axis, concatenated
// (map_offsets[k] is axis k's first entry). Pad, Tile, nearest Resize.
struct AxisGather {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t in_strides[kMaxRank] = {};
  int64_t map_offsets[kMaxRank] = {};
  uint64_t fill = 0;
};
cudaError_t launch_axis_gather(const void* in, void* out, int64_t elem_size, const int64_t* maps, int64_t n,
                               const AxisGather& p, cudaStream_t s);

// Float32 y[o] = sum over the taps of every axis of prod_k weight_k * x[sum_k index_k * in_strides[k]],
// axis k having taps[k] taps per output coordinate at table offset tap_offsets[k] + o_k * taps[k]
// (index, weight); where extrapolate[offset_k + o_k] (one byte per output coordinate of each axis,
// offsets as map_offsets) of any axis, y[o] = extrapolation. Linear and cubic Resize.
struct WeightedResize {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t in_strides[kMaxRank] = {};
  int64_t taps[kMaxRank] = {};
  int64_t tap_offsets[kMaxRank] = {};
  int64_t coord_offsets[kMaxRank] = {};
  float extrapolation = 0.f;
  bool any_extrapolate = false;
};
cudaError_t launch_weighted_resize(const float* x, float* y, const int64_t* index, const float* weight,
                                   const unsigned char* extrapolate, int64_t n, const WeightedResize& p,
                                   cudaStream_t s);

// Integer (int32 / int64) arithmetic with broadcasting, wrapping like the reference: Add, Sub, Mul, Div
// (truncating), Mod (fmod: the dividend's sign, else the divisor's), Min, Max; Abs and Neg read a only.
// The tactic admits Div/Mod only with a constant divisor free of zeros.
enum class IntOp : int { kAdd, kSub, kMul, kDiv, kMod, kFmod, kMin, kMax, kAbs, kNeg };
cudaError_t launch_int_arith(const void* a, const void* b, void* y, bool is64, IntOp op, int64_t n, const Broadcast3& p,
                             cudaStream_t s);

// Float32 reductions of [outer, r, inner] over the middle axis: sum, mean, max, min, prod, sum of squares,
// L1, L2, log-sum, log-sum-exp (ONNX Reduce*).
enum class ReduceOp : int { kSum, kMean, kMax, kMin, kProd, kSumSquare, kL1, kL2, kLogSum, kLogSumExp };
cudaError_t launch_reduce(const float* x, float* y, int64_t outer, int64_t r, int64_t inner, ReduceOp op,
                          cudaStream_t s);

}  // namespace kiln::backends::cuda
