// Row kernels (Softmax, LayerNormalization: one block per row, block reductions) and data movement
// (strided copies for Transpose/Slice/Concat/Expand, Gather). The row kernels are templated on the
// storage type and reduce in float32.
#include <math.h>

#include "backends/cuda/cuda_float_types.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace kiln::backends::cuda {
namespace {

constexpr int kRowThreads = 256;

// Sum (or max) over the block; every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  int warps = (blockDim.x + 31) / 32;
  v = lane < warps ? shared[lane] : (kMax ? -INFINITY : 0.f);
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  __syncthreads();  // shared is reused by the next reduction
  return v;
}

template <typename T>
__global__ void softmax_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t axis, int64_t inner, bool log) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x, o = row / inner, i = row % inner;
  const T* xr = x + o * axis * inner + i;
  T* yr = y + o * axis * inner + i;
  float m = -INFINITY;
  for (int64_t k = threadIdx.x; k < axis; k += blockDim.x) m = fmaxf(m, to_f32(xr[k * inner]));
  m = block_reduce<true>(m, shared);
  float sum = 0.f;
  for (int64_t k = threadIdx.x; k < axis; k += blockDim.x) sum += expf(to_f32(xr[k * inner]) - m);
  sum = block_reduce<false>(sum, shared);
  if (log) {
    float ls = logf(sum);
    for (int64_t k = threadIdx.x; k < axis; k += blockDim.x)
      yr[k * inner] = to_storage<T>(to_f32(xr[k * inner]) - m - ls);
  } else {
    float inv = 1.f / sum;
    for (int64_t k = threadIdx.x; k < axis; k += blockDim.x)
      yr[k * inner] = to_storage<T>(expf(to_f32(xr[k * inner]) - m) * inv);
  }
}

template <typename T>
__global__ void layer_norm_kernel(const T* __restrict__ x, const T* __restrict__ scale, const T* __restrict__ bias,
                                  T* __restrict__ y, int64_t d, float epsilon) {
  __shared__ float shared[32];
  const T* xr = x + blockIdx.x * d;
  T* yr = y + blockIdx.x * d;
  float sum = 0.f;
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) sum += to_f32(xr[k]);
  const float mean = block_reduce<false>(sum, shared) / static_cast<float>(d);
  float sq = 0.f;
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
    float c = to_f32(xr[k]) - mean;
    sq += c * c;
  }
  const float inv = rsqrtf(block_reduce<false>(sq, shared) / static_cast<float>(d) + epsilon);
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
    float v = (to_f32(xr[k]) - mean) * inv;
    if (scale) v *= to_f32(scale[k]);
    if (bias) v += to_f32(bias[k]);
    yr[k] = to_storage<T>(v);
  }
}

template <typename T>
__global__ void strided_copy_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n, StridedCopy p) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i, src = p.in_offset, dst = p.out_offset;
    for (int k = p.rank - 1; k >= 0; --k) {
      int64_t c = rest % p.dims[k];
      rest /= p.dims[k];
      src += c * p.in_strides[k];
      dst += c * p.out_strides[k];
    }
    out[dst] = in[src];
  }
}

template <typename T, typename I>
__global__ void gather_kernel(const T* __restrict__ data, const I* __restrict__ idx, T* __restrict__ out, int64_t n,
                              int64_t axis, int64_t count, int64_t inner) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t in = i % inner, j = i / inner % count, o = i / inner / count;
    int64_t k = static_cast<int64_t>(idx[j]);
    if (k < 0) k += axis;
    out[i] = k >= 0 && k < axis ? data[(o * axis + k) * inner + in] : T{};
  }
}

int blocks_for(int64_t n) {
  int64_t b = (n + 255) / 256;
  return static_cast<int>(b < 65535 * 8 ? b : 65535 * 8);
}

template <typename T>
cudaError_t copy_as(const void* in, void* out, const StridedCopy& p, int64_t n, cudaStream_t s) {
  strided_copy_kernel<T><<<blocks_for(n), 256, 0, s>>>(static_cast<const T*>(in), static_cast<T*>(out), n, p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t gather_as(const void* data, const void* idx, bool idx64, void* out, int64_t n, int64_t axis, int64_t count,
                      int64_t inner, cudaStream_t s) {
  if (idx64)
    gather_kernel<T, int64_t><<<blocks_for(n), 256, 0, s>>>(
        static_cast<const T*>(data), static_cast<const int64_t*>(idx), static_cast<T*>(out), n, axis, count, inner);
  else
    gather_kernel<T, int32_t><<<blocks_for(n), 256, 0, s>>>(
        static_cast<const T*>(data), static_cast<const int32_t*>(idx), static_cast<T*>(out), n, axis, count, inner);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_softmax(const void* x, void* y, int64_t outer, int64_t axis, int64_t inner, bool log, FloatType t,
                           cudaStream_t s) {
  if (outer * axis * inner == 0) return cudaSuccess;
  return dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    softmax_kernel<T><<<static_cast<unsigned>(outer * inner), kRowThreads, 0, s>>>(
        static_cast<const T*>(x), static_cast<T*>(y), axis, inner, log);
  });
}

cudaError_t launch_layer_norm(const void* x, const void* scale, const void* bias, void* y, int64_t rows, int64_t d,
                              float epsilon, FloatType t, cudaStream_t s) {
  if (rows * d == 0) return cudaSuccess;
  return dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    layer_norm_kernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(scale), static_cast<const T*>(bias), static_cast<T*>(y), d,
        epsilon);
  });
}

cudaError_t launch_strided_copy(const void* in, void* out, int64_t elem_size, const StridedCopy& p, cudaStream_t s) {
  int64_t n = 1;
  for (int k = 0; k < p.rank; ++k) n *= p.dims[k];
  if (n == 0) return cudaSuccess;
  switch (elem_size) {
    case 1: return copy_as<uint8_t>(in, out, p, n, s);
    case 2: return copy_as<uint16_t>(in, out, p, n, s);
    case 4: return copy_as<uint32_t>(in, out, p, n, s);
    case 8: return copy_as<uint64_t>(in, out, p, n, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_gather(const void* data, const void* indices, bool indices64, void* out, int64_t elem_size,
                          int64_t outer, int64_t axis, int64_t count, int64_t inner, cudaStream_t s) {
  int64_t n = outer * count * inner;
  if (n == 0) return cudaSuccess;
  switch (elem_size) {
    case 1: return gather_as<uint8_t>(data, indices, indices64, out, n, axis, count, inner, s);
    case 2: return gather_as<uint16_t>(data, indices, indices64, out, n, axis, count, inner, s);
    case 4: return gather_as<uint32_t>(data, indices, indices64, out, n, axis, count, inner, s);
    case 8: return gather_as<uint64_t>(data, indices, indices64, out, n, axis, count, inner, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kiln::backends::cuda
