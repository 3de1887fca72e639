// The CNN kernels of cuda_cnn_kernels.h. Loads widen to float, stores round once.
// Epilogue and channels-last pooling: 32-bit indices (FastDiv) when every offset is below 2^31 (a
// 64-bit kernel otherwise), and 16-byte packs over channels when the channels are the innermost dim,
// their count a multiple of the pack and the pointers aligned (one thread per pack; scalar otherwise).
// Channels-last global pooling: a block per (image, 32 packs), its threads splitting the plane, a
// shared-memory reduction at the end. NCHW pooling: one thread per output element, one warp per plane
// (global pooling).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include <algorithm>
#include <type_traits>

#include "backends/cuda/cuda_cnn_kernels.h"
#include "backends/cuda/cuda_float_types.cuh"
#include "backends/cuda/cuda_index.h"

namespace kiln::backends::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kIndex32Limit = int64_t{1} << 31;  // FastDiv's dividends, 32-bit offsets

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

// The epilogue of 2^31 elements or more.
template <typename T>
__global__ void conv_epilogue64_kernel(T* __restrict__ y, const float* __restrict__ bias, const T* __restrict__ res,
                                       int64_t n, int64_t channels, int64_t inner, Epilogue e) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = load(y, i);
    if (bias) v += bias[(i / inner) % channels];
    if (res) v += load(res, i);
    store(y, i, activate(v, e));
  }
}

// n < 2^31 elements, one per thread: the channel is (i / inner) % channels.
template <typename T>
__global__ void conv_epilogue32_kernel(T* __restrict__ y, const float* __restrict__ bias, const T* __restrict__ res,
                                       uint32_t n, uint32_t channels, FastDiv by_inner, FastDiv by_channels,
                                       Epilogue e) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float v = to_f32(y[i]);
    if (bias) {
      const uint32_t a = by_inner.div(i);
      v += bias[a - by_channels.div(a) * channels];
    }
    if (res) v += to_f32(res[i]);
    y[i] = to_storage<T>(activate(v, e));
  }
}

// Channels innermost (inner == 1), V channels (16 bytes) per thread: `packs` = n / V packs, the pack's
// first channel (i % (channels / V)) * V. y, res and bias 16-byte aligned, channels % V == 0.
template <typename T, int V>
__global__ void conv_epilogue_pack_kernel(T* __restrict__ y, const float* __restrict__ bias, const T* __restrict__ res,
                                          uint32_t packs, uint32_t channel_packs, FastDiv by_channel_packs,
                                          Epilogue e) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < packs; i += gridDim.x * blockDim.x) {
    Pack<T, V> yv = reinterpret_cast<const Pack<T, V>*>(y)[i], rv;
    if (res) rv = reinterpret_cast<const Pack<T, V>*>(res)[i];
    float b[V];
    if (bias) {
      const uint32_t c = (i - by_channel_packs.div(i) * channel_packs) * V;
#pragma unroll
      for (int k = 0; k < V; k += 4) {
        const float4 q = *reinterpret_cast<const float4*>(bias + c + k);
        b[k] = q.x, b[k + 1] = q.y, b[k + 2] = q.z, b[k + 3] = q.w;
      }
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float v = to_f32(yv.v[k]);
      if (bias) v += b[k];
      if (res) v += to_f32(rv.v[k]);
      yv.v[k] = to_storage<T>(activate(v, e));
    }
    reinterpret_cast<Pack<T, V>*>(y)[i] = yv;
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

// Channels-last of 2^31 elements or more: output i is [batch, o0, o1, o2, channel], channel fastest.
template <typename T>
__global__ void pool_nhwc64_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, PoolWindow w,
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

// PoolWindow in 32 bits (every extent, offset and window position below 2^31) with the divisors of the
// output's dims.
struct PoolWindow32 {
  int in[3], out[3], kernel[3], stride[3], dilation[3], pad_begin[3], pad_end[3];
  FastDiv by_out[3];
  bool max, include_pad;
};

// Taps [lo, hi) of a window starting at `start` (dilation d, kernel k) that land in [0, b): taps_in
// without a division when d == 1.
__device__ __forceinline__ void taps32(int start, int d, int k, int b, int* lo, int* hi) {
  int l, h;
  if (d == 1) {
    l = -start, h = b - start;
  } else {
    l = start >= 0 ? 0 : (d - 1 - start) / d;
    const int p = b - start;
    h = p > 0 ? (p + d - 1) / d : 0;
  }
  l = l < 0 ? 0 : (l > k ? k : l);
  h = h < l ? l : (h > k ? k : h);
  *lo = l, *hi = h;
}

// Channels-last windowed pooling, V consecutive channels (a Pack) per thread: pack i of the output is
// [batch, o0, o1, o2, channel pack], so consecutive threads read and write consecutive packs. The taps
// are visited in pool_window's order (the same sums).
template <typename T, int V>
__global__ void pool_nhwc32_kernel(const T* __restrict__ x, T* __restrict__ y, uint32_t packs, uint32_t channel_packs,
                                   FastDiv by_channel_packs, PoolWindow32 w) {
  using P = Pack<T, V>;
  const uint32_t channels = channel_packs * V;
  const uint32_t in_plane = static_cast<uint32_t>(w.in[0]) * w.in[1] * w.in[2];
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < packs; i += gridDim.x * blockDim.x) {
    uint32_t rest = by_channel_packs.div(i);
    const uint32_t cp = i - rest * channel_packs;
    int o[3];
#pragma unroll
    for (int d = 2; d >= 0; --d) {
      const uint32_t q = w.by_out[d].div(rest);
      o[d] = static_cast<int>(rest - q * static_cast<uint32_t>(w.out[d]));
      rest = q;
    }
    const T* xp = x + rest * in_plane * channels + cp * V;  // rest: the batch
    int start[3], lo[3], hi[3], count = 1;                  // count <= in_plane
    float padded = 1.f;
#pragma unroll
    for (int d = 0; d < 3; ++d) {
      start[d] = o[d] * w.stride[d] - w.pad_begin[d];
      taps32(start[d], w.dilation[d], w.kernel[d], w.in[d], &lo[d], &hi[d]);
      int pl, ph;
      taps32(o[d] * w.stride[d], w.dilation[d], w.kernel[d], w.in[d] + w.pad_begin[d] + w.pad_end[d], &pl, &ph);
      count *= hi[d] - lo[d], padded *= static_cast<float>(ph - pl);
    }
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = w.max ? -INFINITY : 0.f;
    for (int a = lo[0]; a < hi[0]; ++a) {
      const uint32_t r0 = static_cast<uint32_t>(start[0] + a * w.dilation[0]) * w.in[1];
      for (int b = lo[1]; b < hi[1]; ++b) {
        const uint32_t r1 = (r0 + static_cast<uint32_t>(start[1] + b * w.dilation[1])) * w.in[2];
        for (int c = lo[2]; c < hi[2]; ++c) {
          const uint32_t px = r1 + static_cast<uint32_t>(start[2] + c * w.dilation[2]);
          const P v = *reinterpret_cast<const P*>(xp + px * channels);
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float f = to_f32(v.v[k]);
            if (w.max) {
              if (f > acc[k]) acc[k] = f;  // NaN never compares greater: ignored, like the reference
            } else {
              acc[k] += f;
            }
          }
        }
      }
    }
    P out;
    const float div = w.include_pad ? padded : static_cast<float>(count);
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = to_storage<T>(w.max ? acc[k] : (div > 0.f ? acc[k] / div : 0.f));
    reinterpret_cast<P*>(y)[i] = out;
  }
}

// The max of acc and v: NaN ignored (windowed MaxPool) or, when nan_wins, kept (GlobalMaxPool's reference).
__device__ __forceinline__ float max_of(float acc, float v, bool nan_wins) {
  return (v > acc || (nan_wins && isnan(v))) ? v : acc;
}

// Channels-last global pooling of [N, plane, channels = channel_packs * V]: block (x, y) of blockDim.x
// packs x blockDim.y (a power of 2) rows reduces images blockIdx.y, blockIdx.y + gridDim.y, ..., packs
// blockIdx.x * blockDim.x on: thread (tx, ty) walks rows ty, ty + blockDim.y, ... (each row's packs
// coalesced), then a tree over ty in shared memory (blockDim.x * blockDim.y * V floats).
template <typename T, int V>
__global__ void global_pool_nhwc_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t images, int64_t plane,
                                        uint32_t channel_packs, bool max, bool nan_wins) {
  using P = Pack<T, V>;
  extern __shared__ float part[];
  const uint32_t cp = blockIdx.x * blockDim.x + threadIdx.x;
  const bool live = cp < channel_packs;
  const int64_t channels = static_cast<int64_t>(channel_packs) * V;
  for (int64_t img = blockIdx.y; img < images; img += gridDim.y) {
    const T* xp = x + img * plane * channels + static_cast<int64_t>(cp) * V;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = max ? -INFINITY : 0.f;
    if (live) {
      for (int64_t r = threadIdx.y; r < plane; r += blockDim.y) {
        const P v = *reinterpret_cast<const P*>(xp + r * channels);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float f = to_f32(v.v[k]);
          acc[k] = max ? max_of(acc[k], f, nan_wins) : acc[k] + f;
        }
      }
    }
    float* mine = part + (threadIdx.y * blockDim.x + threadIdx.x) * V;
#pragma unroll
    for (int k = 0; k < V; ++k) mine[k] = acc[k];
    __syncthreads();
    for (unsigned half = blockDim.y / 2; half > 0; half /= 2) {
      if (threadIdx.y < half) {
        const float* other = mine + half * blockDim.x * V;
#pragma unroll
        for (int k = 0; k < V; ++k) mine[k] = max ? max_of(mine[k], other[k], nan_wins) : mine[k] + other[k];
      }
      __syncthreads();
    }
    if (threadIdx.y == 0 && live) {
      P out;
      const float div = static_cast<float>(plane);
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = to_storage<T>(max ? mine[k] : (plane > 0 ? mine[k] / div : 0.f));
      *reinterpret_cast<P*>(y + img * channels + static_cast<int64_t>(cp) * V) = out;
    }
    __syncthreads();  // part is rewritten for the next image
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
    T* py = static_cast<T*>(y);
    const T* pr = static_cast<const T*>(residual);
    constexpr int V = kPackBytes / sizeof(T);
    if (n >= kIndex32Limit) {
      conv_epilogue64_kernel<T><<<grid_for(n), kThreads, 0, s>>>(py, bias, pr, n, channels, inner, e);
    } else if (inner == 1 && channels % V == 0 && aligned16(y) && (!residual || aligned16(residual)) &&
               (!bias || aligned16(bias))) {
      const int64_t packs = n / V;
      conv_epilogue_pack_kernel<T, V><<<grid_for(packs), kThreads, 0, s>>>(
          py, bias, pr, static_cast<uint32_t>(packs), static_cast<uint32_t>(channels / V),
          FastDiv(static_cast<uint32_t>(channels / V)), e);
    } else {
      conv_epilogue32_kernel<T><<<grid_for(n), kThreads, 0, s>>>(
          py, bias, pr, static_cast<uint32_t>(n), static_cast<uint32_t>(channels),
          FastDiv(static_cast<uint32_t>(inner)), FastDiv(static_cast<uint32_t>(channels)), e);
    }
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
  const int64_t in_elems = w.planes * w.in[0] * w.in[1] * w.in[2] * channels;
  bool global = true, fits32 = n < kIndex32Limit && in_elems < kIndex32Limit;
  for (int d = 0; d < 3; ++d) {
    global = global && w.out[d] == 1 && w.kernel[d] == w.in[d] && w.pad_begin[d] == 0 && w.pad_end[d] == 0 &&
             w.dilation[d] == 1;
    // Every window position and tap offset of the 32-bit kernel in int.
    const int64_t reach = std::max(w.in[d] + w.pad_begin[d] + w.pad_end[d],
                                   std::max(w.out[d] * w.stride[d], (w.kernel[d] - 1) * w.dilation[d] + 1));
    fits32 =
        fits32 && reach + w.pad_begin[d] + w.stride[d] + w.dilation[d] < kIndex32Limit && w.kernel[d] < kIndex32Limit;
  }
  return by_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kPackBytes / sizeof(T);
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    const bool packed = channels % V == 0 && aligned16(x) && aligned16(y);
    if (global && channels < kIndex32Limit) {
      const int64_t plane = w.in[0] * w.in[1] * w.in[2];
      auto launch = [&](auto pack) {
        constexpr int W = decltype(pack)::value;
        const int64_t cps = channels / W;
        unsigned bx = 1;
        while (bx < 32 && bx < cps) bx *= 2;
        const dim3 block(bx, kThreads / bx),
            grid(static_cast<unsigned>((cps + bx - 1) / bx), static_cast<unsigned>(std::min<int64_t>(w.planes, 65535)));
        global_pool_nhwc_kernel<T, W><<<grid, block, kThreads * W * sizeof(float), s>>>(
            px, py, w.planes, plane, static_cast<uint32_t>(cps), w.max, w.nan_wins);
      };
      if (packed)
        launch(std::integral_constant<int, V>{});
      else
        launch(std::integral_constant<int, 1>{});
    } else if (fits32) {
      PoolWindow32 q;
      for (int d = 0; d < 3; ++d) {
        q.in[d] = static_cast<int>(w.in[d]), q.out[d] = static_cast<int>(w.out[d]);
        q.kernel[d] = static_cast<int>(w.kernel[d]), q.stride[d] = static_cast<int>(w.stride[d]);
        q.dilation[d] = static_cast<int>(w.dilation[d]);
        q.pad_begin[d] = static_cast<int>(w.pad_begin[d]), q.pad_end[d] = static_cast<int>(w.pad_end[d]);
        q.by_out[d] = FastDiv(static_cast<uint32_t>(w.out[d]));
      }
      q.max = w.max, q.include_pad = w.include_pad;
      auto launch = [&](auto pack) {
        constexpr int W = decltype(pack)::value;
        const int64_t packs = n / W, cps = channels / W;
        pool_nhwc32_kernel<T, W><<<grid_for(packs), kThreads, 0, s>>>(
            px, py, static_cast<uint32_t>(packs), static_cast<uint32_t>(cps), FastDiv(static_cast<uint32_t>(cps)), q);
      };
      if (packed)
        launch(std::integral_constant<int, V>{});
      else
        launch(std::integral_constant<int, 1>{});
    } else {
      pool_nhwc64_kernel<T><<<grid_for(n), kThreads, 0, s>>>(px, py, n, w, channels);
    }
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
