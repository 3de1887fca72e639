// The CNN kernels of cuda_cnn_kernels.h: one thread per output element (epilogue, windowed pooling),
// one warp per plane (global pooling). Loads widen to float, stores round once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "backends/cuda/cuda_cnn_kernels.h"

namespace kiln::backends::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__device__ __forceinline__ float activate(float v, const Epilogue& e) {
  switch (e.act) {
    case EpilogueAct::kNone: return v;
    case EpilogueAct::kRelu: return v > 0.f ? v : 0.f;
    case EpilogueAct::kLeakyRelu: return v >= 0.f ? v : e.alpha * v;
    case EpilogueAct::kSigmoid: return sigmoid(v);
    case EpilogueAct::kTanh: return tanhf(v);
    case EpilogueAct::kHardSwish: return v * fminf(fmaxf(v / 6.f + 0.5f, 0.f), 1.f);
    case EpilogueAct::kHardSigmoid: return fminf(fmaxf(e.alpha * v + e.beta, 0.f), 1.f);
    case EpilogueAct::kClip: return fminf(fmaxf(v, e.alpha), e.beta);
    case EpilogueAct::kSilu: return v * sigmoid(v);
    case EpilogueAct::kGelu: return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    case EpilogueAct::kGeluTanh: return 0.5f * v * (1.f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
  }
  return v;
}

template <typename T>
__global__ void conv_epilogue_kernel(T* __restrict__ y, const float* __restrict__ bias, const T* __restrict__ res,
                                     int64_t n, int64_t channels, int64_t inner, Epilogue e) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = load(y, i);
    if (bias) v += bias[(i / inner) % channels];
    if (res) v += load(res, i);
    store(y, i, activate(v, e));
  }
}

// Taps [lo, hi) of a window starting at `start` (dilation d, kernel k) that land in [a, b).
__device__ __forceinline__ void taps_in(int64_t start, int64_t d, int64_t k, int64_t a, int64_t b, int64_t* lo,
                                        int64_t* hi) {
  // start + t * d >= a  <=>  t >= ceil((a - start) / d)
  auto cdiv = [](int64_t p, int64_t q) { return p >= 0 ? (p + q - 1) / q : -((-p) / q); };
  int64_t l = cdiv(a - start, d), h = cdiv(b - start, d);
  l = l < 0 ? 0 : (l > k ? k : l);
  h = h < l ? l : (h > k ? k : h);
  *lo = l, *hi = h;
}

// The pooled value of one output position o[3] (per dim as PoolWindow says) whose window's first
// element would be at xp: consecutive elements of a row are `step` apart (1 for NCHW planes, C for
// channels-last).
template <typename T>
__device__ float pool_window(const T* __restrict__ xp, int64_t step, const int64_t o[3], const PoolWindow& w) {
  int64_t start[3], lo[3], hi[3];
  float padded = 1.f;
  for (int d = 0; d < 3; ++d) {
    start[d] = o[d] * w.stride[d] - w.pad_begin[d];
    taps_in(start[d], w.dilation[d], w.kernel[d], 0, w.in[d], &lo[d], &hi[d]);
    int64_t pl, ph;
    taps_in(start[d], w.dilation[d], w.kernel[d], -w.pad_begin[d], w.in[d] + w.pad_end[d], &pl, &ph);
    padded *= static_cast<float>(ph - pl);
  }
  float acc = w.max ? -INFINITY : 0.f;
  int64_t count = 0;
  for (int64_t a = lo[0]; a < hi[0]; ++a) {
    const int64_t r0 = (start[0] + a * w.dilation[0]) * w.in[1];
    for (int64_t b = lo[1]; b < hi[1]; ++b) {
      const int64_t r1 = (r0 + start[1] + b * w.dilation[1]) * w.in[2];
      for (int64_t c = lo[2]; c < hi[2]; ++c) {
        float v = load(xp, (r1 + start[2] + c * w.dilation[2]) * step);
        if (w.max) {
          if (v > acc) acc = v;  // NaN never compares greater: ignored, like the reference
        } else {
          acc += v;
        }
        ++count;
      }
    }
  }
  if (!w.max) {
    float div = w.include_pad ? padded : static_cast<float>(count);
    acc = div > 0.f ? acc / div : 0.f;
  }
  return acc;
}

template <typename T>
__global__ void pool_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, PoolWindow w) {
  const int64_t out_plane = w.out[0] * w.out[1] * w.out[2], in_plane = w.in[0] * w.in[1] * w.in[2];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t plane = i / out_plane;
    int64_t rest = i % out_plane, o[3];
    o[2] = rest % w.out[2], rest /= w.out[2];
    o[1] = rest % w.out[1], o[0] = rest / w.out[1];
    store(y, i, pool_window(x + plane * in_plane, 1, o, w));
  }
}

// Channels-last: output i is [batch, o0, o1, o2, channel], channel fastest (coalesced).
template <typename T>
__global__ void pool_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, PoolWindow w,
                                 int64_t channels) {
  const int64_t in_plane = w.in[0] * w.in[1] * w.in[2];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ch = i % channels;
    int64_t rest = i / channels, o[3];
    o[2] = rest % w.out[2], rest /= w.out[2];
    o[1] = rest % w.out[1], rest /= w.out[1];
    o[0] = rest % w.out[0];
    const int64_t batch = rest / w.out[0];
    store(y, i, pool_window(x + batch * in_plane * channels + ch, channels, o, w));
  }
}

// One warp per plane; `warps` planes per block.
template <typename T>
__global__ void global_pool_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t planes, int64_t inner,
                                   bool max) {
  const int64_t plane = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (plane >= planes) return;
  const T* xp = x + plane * inner;
  float acc = max ? -INFINITY : 0.f;
  for (int64_t k = lane; k < inner; k += 32) {
    float v = load(xp, k);
    acc = max ? fmaxf(acc, v) : acc + v;
  }
  for (int off = 16; off > 0; off >>= 1) {
    float o = __shfl_xor_sync(0xffffffffu, acc, off);
    acc = max ? fmaxf(acc, o) : acc + o;
  }
  if (lane == 0) store(y, plane, max ? acc : acc / static_cast<float>(inner));
}

unsigned grid_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

template <typename Fn>
cudaError_t by_dtype(CnnDtype dtype, Fn&& fn) {
  switch (dtype) {
    case CnnDtype::kFloat32: fn(float{}); break;
    case CnnDtype::kFloat16: fn(__half{}); break;
    case CnnDtype::kBFloat16: fn(__nv_bfloat16{}); break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_conv_epilogue(void* y, CnnDtype dtype, const float* bias, const void* residual, int64_t batch,
                                 int64_t channels, int64_t inner, Epilogue e, cudaStream_t s) {
  const int64_t n = batch * channels * inner;
  if (n == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    conv_epilogue_kernel<T><<<grid_for(n), kThreads, 0, s>>>(static_cast<T*>(y), bias, static_cast<const T*>(residual),
                                                             n, channels, inner, e);
  });
}

cudaError_t launch_pool(const void* x, void* y, CnnDtype dtype, const PoolWindow& w, cudaStream_t s) {
  const int64_t n = w.planes * w.out[0] * w.out[1] * w.out[2];
  if (n == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    pool_kernel<T><<<grid_for(n), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), n, w);
  });
}

cudaError_t launch_pool_nhwc(const void* x, void* y, CnnDtype dtype, const PoolWindow& w, int64_t channels,
                             cudaStream_t s) {
  const int64_t n = w.planes * w.out[0] * w.out[1] * w.out[2] * channels;
  if (n == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    pool_nhwc_kernel<T><<<grid_for(n), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), n, w, channels);
  });
}

cudaError_t launch_global_pool(const void* x, void* y, CnnDtype dtype, int64_t planes, int64_t inner, bool max,
                               cudaStream_t s) {
  if (planes == 0) return cudaSuccess;
  constexpr int kWarps = kThreads / 32;
  const int64_t blocks = (planes + kWarps - 1) / kWarps;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  return by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    global_pool_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(static_cast<const T*>(x),
                                                                             static_cast<T*>(y), planes, inner, max);
  });
}

}  // namespace kiln::backends::cuda
