// Elementwise kernels: unary activations and math, binary ops with numpy broadcasting, Cast. The
// float kernels are templated on the storage type (float, __half, __nv_bfloat16) and compute in
// float32: each element is loaded, widened, computed and rounded once on the store.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "backends/cuda/cuda_float_types.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace kiln::backends::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 8 ? b : 65535 * 8);
}

__device__ __forceinline__ float unary(float x, UnaryParams p) {
  switch (p.op) {
    case UnaryOp::kIdentity: return x;
    case UnaryOp::kRelu: return x > 0.f ? x : 0.f;
    case UnaryOp::kSigmoid: return 1.f / (1.f + expf(-x));
    case UnaryOp::kTanh: return tanhf(x);
    case UnaryOp::kExp: return expf(x);
    case UnaryOp::kLog: return logf(x);
    case UnaryOp::kSqrt: return sqrtf(x);
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kAbs: return fabsf(x);
    case UnaryOp::kErf: return erff(x);
    case UnaryOp::kGelu: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case UnaryOp::kGeluTanh: {
      float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.f + tanhf(u));
    }
    case UnaryOp::kLeakyRelu: return x >= 0.f ? x : p.alpha * x;
    case UnaryOp::kClip: return fminf(fmaxf(x, p.alpha), p.beta);
    case UnaryOp::kHardSwish: return x * fminf(fmaxf(x / 6.f + 0.5f, 0.f), 1.f);
    case UnaryOp::kHardSigmoid: return fminf(fmaxf(p.alpha * x + p.beta, 0.f), 1.f);
    case UnaryOp::kSilu: return x / (1.f + expf(-x));
    case UnaryOp::kReciprocal: return 1.f / x;
    case UnaryOp::kFloor: return floorf(x);
    case UnaryOp::kCeil: return ceilf(x);
    case UnaryOp::kSoftplus: return x > 20.f ? x : log1pf(expf(x));
    case UnaryOp::kElu: return x >= 0.f ? x : p.alpha * (expf(x) - 1.f);
  }
  return x;
}

template <typename T>
__global__ void unary_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, UnaryParams p) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = to_storage<T>(unary(to_f32(x[i]), p));
}

__device__ __forceinline__ float binary(float a, float b, BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return a + b;
    case BinaryOp::kSub: return a - b;
    case BinaryOp::kMul: return a * b;
    case BinaryOp::kDiv: return a / b;
    case BinaryOp::kPow: return powf(a, b);
    case BinaryOp::kMax: return isnan(a) || isnan(b) ? nanf("") : fmaxf(a, b);
    case BinaryOp::kMin: return isnan(a) || isnan(b) ? nanf("") : fminf(a, b);
    case BinaryOp::kPRelu: return a < 0.f ? a * b : a;
  }
  return a;
}

template <typename T>
__global__ void binary_same_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, int64_t n,
                                   BinaryOp op) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = to_storage<T>(binary(to_f32(a[i]), to_f32(b[i]), op));
}

template <typename T>
__global__ void binary_broadcast_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, int64_t n,
                                        BinaryOp op, BroadcastParams p) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i, ia = 0, ib = 0;
    for (int k = p.rank - 1; k >= 0; --k) {
      int64_t c = rest % p.dims[k];
      rest /= p.dims[k];
      ia += c * p.a_strides[k];
      ib += c * p.b_strides[k];
    }
    y[i] = to_storage<T>(binary(to_f32(a[ia]), to_f32(b[ib]), op));
  }
}

template <typename To>
__device__ __forceinline__ To from_float(float v) {
  if (isnan(v)) return To(0);
  double t = trunc(static_cast<double>(v));
  const double lo = static_cast<double>(sizeof(To) == 8 ? INT64_MIN : INT32_MIN);
  const double hi = static_cast<double>(sizeof(To) == 8 ? INT64_MAX : INT32_MAX);
  if (t <= lo) return sizeof(To) == 8 ? static_cast<To>(INT64_MIN) : static_cast<To>(INT32_MIN);
  if (t >= hi) return sizeof(To) == 8 ? static_cast<To>(INT64_MAX) : static_cast<To>(INT32_MAX);
  return static_cast<To>(t);
}

template <typename T>
constexpr bool kReduced = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

template <typename From, typename To>
__global__ void cast_kernel(const From* __restrict__ x, To* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (kReduced<From> || kReduced<To>) {
      // Through float32: exact for float16/bfloat16 -> float32, one rounding (to nearest even) the
      // other way, as the reference's float_to_half / float_to_bfloat16. Integers and bool go through
      // float32 as well (the reference casts through double: identical for every float16/bfloat16 value).
      float v;
      if constexpr (kReduced<From>)
        v = to_f32(x[i]);
      else
        v = static_cast<float>(x[i]);
      if constexpr (kReduced<To>)
        y[i] = to_storage<To>(v);
      else if constexpr (std::is_same_v<To, uint8_t>)
        y[i] = v != 0.f ? 1 : 0;
      else if constexpr (std::is_same_v<To, float>)
        y[i] = v;
      else
        y[i] = from_float<To>(v);
    } else {
      From v = x[i];
      if constexpr (std::is_same_v<To, uint8_t>)
        y[i] = v != From(0) ? 1 : 0;
      else if constexpr (std::is_same_v<From, float> && !std::is_same_v<To, float>)
        y[i] = from_float<To>(v);
      else if constexpr (std::is_same_v<To, float>)
        y[i] = static_cast<float>(static_cast<double>(v));
      else
        y[i] = static_cast<To>(v);
    }
  }
}

template <typename From>
cudaError_t cast_from(const From* x, void* y, CastType to, int64_t n, cudaStream_t s) {
  switch (to) {
    case CastType::kFloat32: cast_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, static_cast<float*>(y), n); break;
    case CastType::kInt32: cast_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, static_cast<int32_t*>(y), n); break;
    case CastType::kInt64: cast_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, static_cast<int64_t*>(y), n); break;
    case CastType::kBool: cast_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, static_cast<uint8_t*>(y), n); break;
    case CastType::kFloat16: cast_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, static_cast<__half*>(y), n); break;
    case CastType::kBFloat16:
      cast_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, static_cast<__nv_bfloat16*>(y), n);
      break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_cast(const void* in, CastType from, void* out, CastType to, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  switch (from) {
    case CastType::kFloat32: return cast_from(static_cast<const float*>(in), out, to, n, s);
    case CastType::kInt32: return cast_from(static_cast<const int32_t*>(in), out, to, n, s);
    case CastType::kInt64: return cast_from(static_cast<const int64_t*>(in), out, to, n, s);
    case CastType::kBool: return cast_from(static_cast<const uint8_t*>(in), out, to, n, s);
    case CastType::kFloat16: return cast_from(static_cast<const __half*>(in), out, to, n, s);
    case CastType::kBFloat16: return cast_from(static_cast<const __nv_bfloat16*>(in), out, to, n, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_unary(const void* x, void* y, int64_t n, UnaryParams p, FloatType t, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  return dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    unary_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), n, p);
  });
}

cudaError_t launch_binary(const void* a, const void* b, void* y, int64_t n, BinaryOp op, const BroadcastParams& p,
                          FloatType t, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  return dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    auto pa = static_cast<const T*>(a), pb = static_cast<const T*>(b);
    if (p.same_shape)
      binary_same_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(pa, pb, static_cast<T*>(y), n, op);
    else
      binary_broadcast_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(pa, pb, static_cast<T*>(y), n, op, p);
  });
}

}  // namespace kiln::backends::cuda
