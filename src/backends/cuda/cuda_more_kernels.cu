// The kernels of cuda_more_kernels.h: one thread per output element (grid-stride), except the trailing
// reductions (one warp per row).
#include <math.h>

#include <type_traits>

#include "backends/cuda/cuda_more_kernels.h"

namespace kiln::backends::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

#define KILN_GRID_STRIDE(i, n)                                                           \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// The offsets of element i of the broadcast output in each of `count` inputs.
template <int kCount>
__device__ __forceinline__ void offsets3(int64_t i, const Broadcast3& p, int64_t* off) {
  for (int j = 0; j < kCount; ++j) off[j] = 0;
  for (int k = p.rank - 1; k >= 0; --k) {
    int64_t c = i % p.dims[k];
    i /= p.dims[k];
    for (int j = 0; j < kCount; ++j) off[j] += c * p.strides[j][k];
  }
}

template <typename T>
__global__ void where_kernel(const unsigned char* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b,
                             T* __restrict__ y, int64_t n, Broadcast3 p) {
  KILN_GRID_STRIDE(i, n) {
    int64_t off[3];
    offsets3<3>(i, p, off);
    y[i] = c[off[0]] ? a[off[1]] : b[off[2]];
  }
}

template <typename T>
__device__ __forceinline__ bool compare(T a, T b, CompareOp op) {
  switch (op) {
    case CompareOp::kEqual: return a == b;
    case CompareOp::kLess: return a < b;
    case CompareOp::kLessOrEqual: return a <= b;
    case CompareOp::kGreater: return a > b;
    case CompareOp::kGreaterOrEqual: return a >= b;
    case CompareOp::kAnd: return (a != T(0)) && (b != T(0));
    case CompareOp::kOr: return (a != T(0)) || (b != T(0));
    case CompareOp::kXor: return (a != T(0)) != (b != T(0));
    case CompareOp::kNot: return a == T(0);
  }
  return false;
}

template <typename T>
__global__ void compare_kernel(const T* __restrict__ a, const T* __restrict__ b, unsigned char* __restrict__ y,
                               int64_t n, CompareOp op, Broadcast3 p) {
  KILN_GRID_STRIDE(i, n) {
    int64_t off[2];
    offsets3<2>(i, p, off);
    y[i] = compare(a[off[0]], b ? b[off[1]] : T(0), op) ? 1 : 0;
  }
}

template <typename T>
__global__ void axis_gather_kernel(const T* __restrict__ in, T* __restrict__ out, const int64_t* __restrict__ maps,
                                   int64_t n, AxisGather p) {
  const T fill = *reinterpret_cast<const T*>(&p.fill);
  KILN_GRID_STRIDE(i, n) {
    int64_t rest = i, off = 0;
    bool filled = false;
    for (int k = p.rank - 1; k >= 0; --k) {
      int64_t c = rest % p.dims[k];
      rest /= p.dims[k];
      int64_t src = maps[p.map_offsets[k] + c];
      filled |= src < 0;
      off += src * p.in_strides[k];
    }
    out[i] = filled ? fill : in[off];
  }
}

__global__ void weighted_resize_kernel(const float* __restrict__ x, float* __restrict__ y,
                                       const int64_t* __restrict__ index, const float* __restrict__ weight,
                                       const unsigned char* __restrict__ extrapolate, int64_t n, WeightedResize p) {
  KILN_GRID_STRIDE(i, n) {
    int64_t coord[kMaxRank];
    int64_t rest = i, combos = 1;
    bool outside = false;
    for (int k = p.rank - 1; k >= 0; --k) {
      coord[k] = rest % p.dims[k];
      rest /= p.dims[k];
      combos *= p.taps[k];
      if (p.any_extrapolate) outside |= extrapolate[p.coord_offsets[k] + coord[k]] != 0;
    }
    if (outside) {
      y[i] = p.extrapolation;
      continue;
    }
    float acc = 0.f;
    for (int64_t c = 0; c < combos; ++c) {
      int64_t rc = c, off = 0;
      float w = 1.f;
      for (int k = p.rank - 1; k >= 0; --k) {
        int64_t t = rc % p.taps[k];
        rc /= p.taps[k];
        int64_t e = p.tap_offsets[k] + coord[k] * p.taps[k] + t;
        off += index[e] * p.in_strides[k];
        w *= weight[e];
      }
      acc += w * x[off];
    }
    y[i] = acc;
  }
}

template <typename T>
__device__ __forceinline__ T int_op(T a, T b, IntOp op) {
  using U = typename std::make_unsigned<T>::type;  // wrapping add / sub / mul
  switch (op) {
    case IntOp::kAdd: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    case IntOp::kSub: return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
    case IntOp::kMul: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    case IntOp::kDiv: return b == T(-1) ? static_cast<T>(U(0) - static_cast<U>(a)) : static_cast<T>(a / b);
    case IntOp::kMod:
    case IntOp::kFmod: {
      if (b == T(-1)) return 0;
      T r = static_cast<T>(a % b);
      if (op == IntOp::kMod && r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
      return r;
    }
    case IntOp::kMin: return a < b ? a : b;
    case IntOp::kMax: return a > b ? a : b;
    case IntOp::kAbs: return a < 0 ? static_cast<T>(U(0) - static_cast<U>(a)) : a;
    case IntOp::kNeg: return static_cast<T>(U(0) - static_cast<U>(a));
  }
  return 0;
}

template <typename T>
__global__ void int_arith_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, int64_t n,
                                 IntOp op, Broadcast3 p) {
  KILN_GRID_STRIDE(i, n) {
    int64_t off[2];
    offsets3<2>(i, p, off);
    y[i] = int_op(a[off[0]], b ? b[off[1]] : T(0), op);
  }
}

__device__ __forceinline__ float reduce_init(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return -INFINITY;
    case ReduceOp::kMin: return INFINITY;
    case ReduceOp::kProd: return 1.f;
    default: return 0.f;
  }
}

// Folds x into the accumulator (the log-sum-exp accumulator is the running sum of exp(x - max), the
// max kept apart).
__device__ __forceinline__ float reduce_step(float acc, float x, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return (x > acc || isnan(x)) ? x : acc;
    case ReduceOp::kMin: return (x < acc || isnan(x)) ? x : acc;
    case ReduceOp::kProd: return acc * x;
    case ReduceOp::kSumSquare:
    case ReduceOp::kL2: return acc + x * x;
    case ReduceOp::kL1: return acc + fabsf(x);
    default: return acc + x;
  }
}

__device__ __forceinline__ float reduce_combine(float a, float b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return (b > a || isnan(b)) ? b : a;
    case ReduceOp::kMin: return (b < a || isnan(b)) ? b : a;
    case ReduceOp::kProd: return a * b;
    default: return a + b;
  }
}

__device__ __forceinline__ float reduce_finish(float acc, float max, int64_t r, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMean: return acc / static_cast<float>(r);
    case ReduceOp::kL2: return sqrtf(acc);
    case ReduceOp::kLogSum: return logf(acc);
    case ReduceOp::kLogSumExp: return max + logf(acc);
    default: return acc;
  }
}

// One thread per (outer, inner) output: a strided walk over r (coalesced across inner).
__global__ void reduce_strided_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t r,
                                      int64_t inner, ReduceOp op) {
  KILN_GRID_STRIDE(i, outer * inner) {
    const float* xr = x + (i / inner) * r * inner + i % inner;
    float max = -INFINITY;
    if (op == ReduceOp::kLogSumExp)
      for (int64_t k = 0; k < r; ++k) max = fmaxf(max, xr[k * inner]);
    if (op == ReduceOp::kLogSumExp && isinf(max)) max = 0.f;
    float acc = reduce_init(op);
    for (int64_t k = 0; k < r; ++k)
      acc = op == ReduceOp::kLogSumExp ? acc + expf(xr[k * inner] - max) : reduce_step(acc, xr[k * inner], op);
    y[i] = reduce_finish(acc, max, r, op);
  }
}

__device__ __forceinline__ float warp_combine(float v, ReduceOp op) {
  for (int o = 16; o > 0; o >>= 1) v = reduce_combine(v, __shfl_xor_sync(0xffffffffu, v, o), op);
  return v;
}

// One warp per row of r contiguous elements (inner == 1).
__global__ void reduce_rows_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t r,
                                   ReduceOp op) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* xr = x + row * r;
  float max = -INFINITY;
  if (op == ReduceOp::kLogSumExp) {
    for (int64_t k = lane; k < r; k += 32) max = fmaxf(max, xr[k]);
    for (int o = 16; o > 0; o >>= 1) max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, o));
    if (isinf(max)) max = 0.f;
  }
  float acc = reduce_init(op);
  for (int64_t k = lane; k < r; k += 32)
    acc = op == ReduceOp::kLogSumExp ? acc + expf(xr[k] - max) : reduce_step(acc, xr[k], op);
  acc = warp_combine(acc, op == ReduceOp::kLogSumExp ? ReduceOp::kSum : op);
  if (lane == 0) y[row] = reduce_finish(acc, max, r, op);
}

}  // namespace

cudaError_t launch_where(const void* cond, const void* a, const void* b, void* y, int64_t elem_size, int64_t n,
                         const Broadcast3& p, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  auto c = static_cast<const unsigned char*>(cond);
  switch (elem_size) {
    case 1:
      where_kernel<<<blocks_for(n), kThreads, 0, s>>>(c, static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b),
                                                      static_cast<uint8_t*>(y), n, p);
      break;
    case 2:
      where_kernel<<<blocks_for(n), kThreads, 0, s>>>(c, static_cast<const uint16_t*>(a),
                                                      static_cast<const uint16_t*>(b), static_cast<uint16_t*>(y), n, p);
      break;
    case 4:
      where_kernel<<<blocks_for(n), kThreads, 0, s>>>(c, static_cast<const uint32_t*>(a),
                                                      static_cast<const uint32_t*>(b), static_cast<uint32_t*>(y), n, p);
      break;
    case 8:
      where_kernel<<<blocks_for(n), kThreads, 0, s>>>(c, static_cast<const uint64_t*>(a),
                                                      static_cast<const uint64_t*>(b), static_cast<uint64_t*>(y), n, p);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_compare(const void* a, const void* b, void* y, CompareType type, CompareOp op, int64_t n,
                           const Broadcast3& p, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  auto out = static_cast<unsigned char*>(y);
  switch (type) {
    case CompareType::kFloat32:
      compare_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const float*>(a), static_cast<const float*>(b), out,
                                                        n, op, p);
      break;
    case CompareType::kInt32:
      compare_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const int32_t*>(a), static_cast<const int32_t*>(b),
                                                        out, n, op, p);
      break;
    case CompareType::kInt64:
      compare_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const int64_t*>(a), static_cast<const int64_t*>(b),
                                                        out, n, op, p);
      break;
    case CompareType::kBool:
      compare_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const unsigned char*>(a),
                                                        static_cast<const unsigned char*>(b), out, n, op, p);
      break;
  }
  return cudaGetLastError();
}

cudaError_t launch_int_arith(const void* a, const void* b, void* y, bool is64, IntOp op, int64_t n, const Broadcast3& p,
                             cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (is64)
    int_arith_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const int64_t*>(a), static_cast<const int64_t*>(b),
                                                        static_cast<int64_t*>(y), n, op, p);
  else
    int_arith_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const int32_t*>(a), static_cast<const int32_t*>(b),
                                                        static_cast<int32_t*>(y), n, op, p);
  return cudaGetLastError();
}

cudaError_t launch_axis_gather(const void* in, void* out, int64_t elem_size, const int64_t* maps, int64_t n,
                               const AxisGather& p, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  switch (elem_size) {
    case 1:
      axis_gather_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out),
                                                            maps, n, p);
      break;
    case 2:
      axis_gather_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const uint16_t*>(in),
                                                            static_cast<uint16_t*>(out), maps, n, p);
      break;
    case 4:
      axis_gather_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const uint32_t*>(in),
                                                            static_cast<uint32_t*>(out), maps, n, p);
      break;
    case 8:
      axis_gather_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const uint64_t*>(in),
                                                            static_cast<uint64_t*>(out), maps, n, p);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_weighted_resize(const float* x, float* y, const int64_t* index, const float* weight,
                                   const unsigned char* extrapolate, int64_t n, const WeightedResize& p,
                                   cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  weighted_resize_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, index, weight, extrapolate, n, p);
  return cudaGetLastError();
}

cudaError_t launch_reduce(const float* x, float* y, int64_t outer, int64_t r, int64_t inner, ReduceOp op,
                          cudaStream_t s) {
  if (outer * inner == 0) return cudaSuccess;
  if (inner == 1 && r >= 32) {
    const int64_t rows_per_block = kThreads / 32;
    int64_t blocks = (outer + rows_per_block - 1) / rows_per_block;
    reduce_rows_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(x, y, outer, r, op);
  } else {
    reduce_strided_kernel<<<blocks_for(outer * inner), kThreads, 0, s>>>(x, y, outer, r, inner, op);
  }
  return cudaGetLastError();
}

}  // namespace kiln::backends::cuda
