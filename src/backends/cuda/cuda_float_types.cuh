// Device-side helpers of the kernels templated on a float storage type (float, __half, __nv_bfloat16):
// loads widen to float32, stores round to nearest even once, and FloatType picks the instantiation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/cuda_kernels.h"

namespace kiln::backends::cuda {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T to_storage(float v);
template <>
__device__ __forceinline__ float to_storage<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half to_storage<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 to_storage<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Vectorized access: kPackBytes-byte loads and stores of V elements (a Pack) where pointers allow.
constexpr int kPackBytes = 16;
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % kPackBytes == 0; }

// Calls launch(T{}) for the storage type of `t` and returns the launch's error.
template <typename Launch>
cudaError_t dispatch_float(FloatType t, Launch&& launch) {
  switch (t) {
    case FloatType::kF32: launch(float{}); break;
    case FloatType::kF16: launch(__half{}); break;
    case FloatType::kBF16: launch(__nv_bfloat16{}); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace kiln::backends::cuda
