// kiln's own CUDA kernels (cuda_elementwise.cu, cuda_layers.cu), as plain launch functions: the
// tactics (cuda_tactics.cc) compute the parameters on the host at prepare time and launch on the run's
// stream. The float kernels take float32, float16 or bfloat16 storage (FloatType; both operands and
// the output in it) and compute in float32; the movement kernels copy elements of any size. Launches
// return the launch error (execution errors surface at the next synchronization).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kiln::backends::cuda {

constexpr int kMaxRank = 8;

// The storage type of a float kernel's tensors. Arithmetic is float32 whatever the storage.
enum class FloatType : int { kF32, kF16, kBF16 };

enum class UnaryOp : int {
  kIdentity,
  kRelu,
  kSigmoid,
  kTanh,
  kExp,
  kLog,
  kSqrt,
  kNeg,
  kAbs,
  kErf,
  kGelu,       // x * Phi(x) with erf
  kGeluTanh,   // the tanh approximation
  kLeakyRelu,  // alpha
  kClip,       // [alpha, beta]
  kHardSwish,
  kHardSigmoid,  // max(0, min(1, alpha * x + beta))
  kSilu,
  kReciprocal,
  kFloor,
  kCeil,
  kSoftplus,
  kElu,  // alpha
};
struct UnaryParams {
  UnaryOp op = UnaryOp::kIdentity;
  float alpha = 0, beta = 0;
};
cudaError_t launch_unary(const void* x, void* y, int64_t n, UnaryParams p, FloatType t, cudaStream_t s);
inline cudaError_t launch_unary(const float* x, float* y, int64_t n, UnaryParams p, cudaStream_t s) {
  return launch_unary(x, y, n, p, FloatType::kF32, s);
}

enum class BinaryOp : int { kAdd, kSub, kMul, kDiv, kPow, kMax, kMin, kPRelu };
// Output dims and, per input, its strides in elements over them (0 where the input broadcasts).
struct BroadcastParams {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t a_strides[kMaxRank] = {};
  int64_t b_strides[kMaxRank] = {};
  bool same_shape = false;  // both inputs have the output's shape: no index arithmetic
};
cudaError_t launch_binary(const void* a, const void* b, void* y, int64_t n, BinaryOp op, const BroadcastParams& p,
                          FloatType t, cudaStream_t s);
inline cudaError_t launch_binary(const float* a, const float* b, float* y, int64_t n, BinaryOp op,
                                 const BroadcastParams& p, cudaStream_t s) {
  return launch_binary(a, b, y, n, op, p, FloatType::kF32, s);
}

// Softmax / LogSoftmax over the middle axis of [outer, axis, inner].
cudaError_t launch_softmax(const void* x, void* y, int64_t outer, int64_t axis, int64_t inner, bool log, FloatType t,
                           cudaStream_t s);
// LayerNormalization of rows of `d` elements: y = (x - mean) / sqrt(var + eps) * scale + bias (scale,
// bias of `d` elements or null).
// scale and bias in the storage type of x.
cudaError_t launch_layer_norm(const void* x, const void* scale, const void* bias, void* y, int64_t rows, int64_t d,
                              float epsilon, FloatType t, cudaStream_t s);

// out[out_offset + sum_k i_k * out_strides[k]] = in[in_offset + sum_k i_k * in_strides[k]] for every
// index i of `dims` (offsets and strides in elements): Transpose, Slice, Concat, Expand, copies.
struct StridedCopy {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t in_strides[kMaxRank] = {};
  int64_t out_strides[kMaxRank] = {};
  int64_t in_offset = 0, out_offset = 0;
};
cudaError_t launch_strided_copy(const void* in, void* out, int64_t elem_size, const StridedCopy& p, cudaStream_t s);

// out[o, j, i] = data[o, idx[j] (negative: + axis), i] for data [outer, axis, inner], indices of
// `count` elements (int64 or int32); an index outside [-axis, axis) writes zeros (the tactic checks
// constant indices at prepare time).
cudaError_t launch_gather(const void* data, const void* indices, bool indices64, void* out, int64_t elem_size,
                          int64_t outer, int64_t axis, int64_t count, int64_t inner, cudaStream_t s);

// Cast between float32, float16, bfloat16, int32, int64 and bool (one byte) with the reference's rules:
// float to integer truncates toward zero and saturates (NaN gives 0), anything to bool is != 0,
// integers wrap, float32 to float16/bfloat16 rounds to nearest even (beyond 65504: inf).
enum class CastType : int { kFloat32, kInt32, kInt64, kBool, kFloat16, kBFloat16 };
cudaError_t launch_cast(const void* in, CastType from, void* out, CastType to, int64_t n, cudaStream_t s);

}  // namespace kiln::backends::cuda
