// Row kernels (Softmax, LayerNormalization) and data movement (strided copies for
// Transpose/Slice/Concat/Expand, Gather). The row kernels are templated on the storage type and reduce
// in float32: rows of at most 1024 contiguous elements take one warp each, held in registers (loaded
// once, in packs of up to 4 elements where aligned); longer or strided rows take a block per row.
#include <math.h>

#include "backends/cuda/cuda_float_types.cuh"
#include "backends/cuda/cuda_index.h"
#include "backends/cuda/cuda_kernels.h"

namespace kiln::backends::cuda {
static_assert(kIndexMaxRank == kMaxRank, "cuda_index.h and cuda_kernels.h agree on the rank");

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

template <bool kMax>
__device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  return v;
}

constexpr int kWarpRowsPerBlock = 4;

// A row of n <= 32 * PER elements in registers: lane l holds packs (j * 32 + l) of V elements, j < PER / V;
// elements past n are left `fill` and flagged off in `valid`.
template <typename T, int PER, int V>
__device__ __forceinline__ void load_row(const T* __restrict__ r, int n, int lane, float fill, float* v) {
#pragma unroll
  for (int j = 0; j < PER / V; ++j) {
    const int e = (j * 32 + lane) * V;
    if (e < n) {
      const Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(r + e);
#pragma unroll
      for (int k = 0; k < V; ++k) v[j * V + k] = to_f32(p.v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) v[j * V + k] = fill;
    }
  }
}

template <typename T, int PER, int V>
__device__ __forceinline__ void store_row(T* __restrict__ r, int n, int lane, const float* v) {
#pragma unroll
  for (int j = 0; j < PER / V; ++j) {
    const int e = (j * 32 + lane) * V;
    if (e < n) {
      Pack<T, V> p;
#pragma unroll
      for (int k = 0; k < V; ++k) p.v[k] = to_storage<T>(v[j * V + k]);
      *reinterpret_cast<Pack<T, V>*>(r + e) = p;
    }
  }
}

// Softmax / LogSoftmax of `rows` contiguous rows of n elements, one warp per row (n % V == 0).
template <typename T, int PER, int V>
__global__ void softmax_warp_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int n, bool log) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpRowsPerBlock) + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp: rows are warp-uniform
  float v[PER];
  load_row<T, PER, V>(x + row * n, n, lane, -INFINITY, v);
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < PER; ++k) m = fmaxf(m, v[k]);
  m = warp_reduce<true>(m);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < PER / V; ++j)
    if ((j * 32 + lane) * V < n) {
#pragma unroll
      for (int k = 0; k < V; ++k) sum += expf(v[j * V + k] - m);
    }
  sum = warp_reduce<false>(sum);
  if (log) {
    const float ls = logf(sum);
#pragma unroll
    for (int k = 0; k < PER; ++k) v[k] = v[k] - m - ls;
  } else {
    const float inv = 1.f / sum;
#pragma unroll
    for (int k = 0; k < PER; ++k) v[k] = expf(v[k] - m) * inv;
  }
  store_row<T, PER, V>(y + row * n, n, lane, v);
}

// LayerNormalization of contiguous rows of n elements, one warp per row, two passes over the registers.
template <typename T, int PER, int V>
__global__ void layer_norm_warp_kernel(const T* __restrict__ x, const T* __restrict__ scale, const T* __restrict__ bias,
                                       T* __restrict__ y, int64_t rows, int n, float epsilon) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpRowsPerBlock) + threadIdx.x / 32;
  if (row >= rows) return;
  float v[PER];
  load_row<T, PER, V>(x + row * n, n, lane, 0.f, v);
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < PER; ++k) sum += v[k];
  const float mean = warp_reduce<false>(sum) / static_cast<float>(n);
  float sq = 0.f;
#pragma unroll
  for (int j = 0; j < PER / V; ++j)
    if ((j * 32 + lane) * V < n) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float c = v[j * V + k] - mean;
        sq += c * c;
      }
    }
  const float inv = rsqrtf(warp_reduce<false>(sq) / static_cast<float>(n) + epsilon);
  float sc[PER], bi[PER];
  if (scale) load_row<T, PER, V>(scale, n, lane, 1.f, sc);
  if (bias) load_row<T, PER, V>(bias, n, lane, 0.f, bi);
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    float r = (v[k] - mean) * inv;
    if (scale) r *= sc[k];
    if (bias) r += bi[k];
    v[k] = r;
  }
  store_row<T, PER, V>(y + row * n, n, lane, v);
}

constexpr int64_t kWarpRowMax = 1024;

// The warp kernels' shape for rows of n <= kWarpRowMax: PER the power of two >= n / 32, V the widest of
// 4, 2, 1 that divides n and PER and aligns every (non-null) pointer.
int warp_per(int64_t n) {
  int per = 1;
  while (per * 32 < n) per *= 2;
  return per;
}
int warp_vec(int64_t n, int per, size_t elem, const void* const* ptrs, int count) {
  for (int v = 4; v > 1; v /= 2) {
    bool ok = v <= per && n % v == 0;
    for (int i = 0; i < count && ok; ++i)
      ok = !ptrs[i] || reinterpret_cast<uintptr_t>(ptrs[i]) % (static_cast<size_t>(v) * elem) == 0;
    if (ok) return v;
  }
  return 1;
}

// Runs LAUNCH(PER, V) for the instantiation of (per, vec).
#define KILN_WARP_DISPATCH(per, vec, LAUNCH) \
  switch ((per)*8 + (vec)) {                 \
    case 1 * 8 + 1: LAUNCH(1, 1); break;     \
    case 2 * 8 + 1: LAUNCH(2, 1); break;     \
    case 2 * 8 + 2: LAUNCH(2, 2); break;     \
    case 4 * 8 + 1: LAUNCH(4, 1); break;     \
    case 4 * 8 + 2: LAUNCH(4, 2); break;     \
    case 4 * 8 + 4: LAUNCH(4, 4); break;     \
    case 8 * 8 + 1: LAUNCH(8, 1); break;     \
    case 8 * 8 + 2: LAUNCH(8, 2); break;     \
    case 8 * 8 + 4: LAUNCH(8, 4); break;     \
    case 16 * 8 + 1: LAUNCH(16, 1); break;   \
    case 16 * 8 + 2: LAUNCH(16, 2); break;   \
    case 16 * 8 + 4: LAUNCH(16, 4); break;   \
    case 32 * 8 + 1: LAUNCH(32, 1); break;   \
    case 32 * 8 + 2: LAUNCH(32, 2); break;   \
    case 32 * 8 + 4: LAUNCH(32, 4); break;   \
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

// The copy through the 32-bit index space (cuda_index.h); U may be a pack of elements (uint4: 16 bytes).
template <typename U>
__global__ void strided_copy32_kernel(const U* __restrict__ in, U* __restrict__ out, uint32_t n, Index32<2> p) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t off[2];
    offsets32<2>(i, p, off);
    out[off[1]] = in[off[0]];
  }
}

constexpr int kTile = 32, kTileRows = 8;

// A copy that swaps the input's contiguous axis (I elements, output stride out_si) with the output's
// (J elements, input stride in_sj), through 32x32 tiles in shared memory: both sides coalesced. The
// other axes are `batch` (offsets of nb tiles' origins), walked by blockIdx.z.
template <typename U>
__global__ void transpose_tile_kernel(const U* __restrict__ in, U* __restrict__ out, uint32_t I, uint32_t J,
                                      uint32_t in_sj, uint32_t out_si, Index32<2> batch, uint32_t nb) {
  __shared__ U tile[kTile][kTile + 1];
  const uint32_t i0 = blockIdx.y * kTile, j0 = blockIdx.x * kTile;
  for (uint32_t b = blockIdx.z; b < nb; b += gridDim.z) {
    uint32_t off[2];
    offsets32<2>(b, batch, off);
    for (uint32_t r = threadIdx.y; r < kTile; r += kTileRows) {
      const uint32_t i = i0 + threadIdx.x, j = j0 + r;
      if (i < I && j < J) tile[r][threadIdx.x] = in[off[0] + i + j * in_sj];
    }
    __syncthreads();
    for (uint32_t r = threadIdx.y; r < kTile; r += kTileRows) {
      const uint32_t i = i0 + r, j = j0 + threadIdx.x;
      if (i < I && j < J) out[off[1] + i * out_si + j] = tile[threadIdx.x][r];
    }
    __syncthreads();
  }
}

// The same swap when the output's contiguous axis is short (J <= kNarrow) and its rows are contiguous
// (out_si == J): a 32x32 tile would be mostly empty. Thread e of batch blockIdx.y writes output element
// e = i * J + j (consecutive threads, consecutive addresses) from input i + j * in_sj (J planes, each
// read at consecutive i).
constexpr uint32_t kNarrow = 16;
template <typename U>
__global__ void transpose_narrow_kernel(const U* __restrict__ in, U* __restrict__ out, uint32_t n, FastDiv by_j,
                                        uint32_t J, uint32_t in_sj, Index32<2> batch, uint32_t nb) {
  for (uint32_t b = blockIdx.y; b < nb; b += gridDim.y) {
    uint32_t off[2];
    offsets32<2>(b, batch, off);
    for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
      const uint32_t i = by_j.div(e), j = e - i * J;
      out[off[1] + e] = in[off[0] + i + j * in_sj];
    }
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
    auto px = static_cast<const T*>(x);
    auto py = static_cast<T*>(y);
    if (inner == 1 && axis <= kWarpRowMax) {
      const int per = warp_per(axis), n = static_cast<int>(axis);
      const void* ptrs[2] = {x, y};
      const int vec = warp_vec(axis, per, sizeof(T), ptrs, 2);
      const unsigned blocks = static_cast<unsigned>((outer + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock);
#define KILN_SOFTMAX(P, V) softmax_warp_kernel<T, P, V><<<blocks, kWarpRowsPerBlock * 32, 0, s>>>(px, py, outer, n, log)
      KILN_WARP_DISPATCH(per, vec, KILN_SOFTMAX)
#undef KILN_SOFTMAX
    } else {
      softmax_kernel<T><<<static_cast<unsigned>(outer * inner), kRowThreads, 0, s>>>(px, py, axis, inner, log);
    }
  });
}

cudaError_t launch_layer_norm(const void* x, const void* scale, const void* bias, void* y, int64_t rows, int64_t d,
                              float epsilon, FloatType t, cudaStream_t s) {
  if (rows * d == 0) return cudaSuccess;
  return dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    auto px = static_cast<const T*>(x);
    auto psc = static_cast<const T*>(scale);
    auto pb = static_cast<const T*>(bias);
    auto py = static_cast<T*>(y);
    if (d <= kWarpRowMax) {
      const int per = warp_per(d), n = static_cast<int>(d);
      const void* ptrs[4] = {x, scale, bias, y};
      const int vec = warp_vec(d, per, sizeof(T), ptrs, 4);
      const unsigned blocks = static_cast<unsigned>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock);
#define KILN_LAYER_NORM(P, V) \
  layer_norm_warp_kernel<T, P, V><<<blocks, kWarpRowsPerBlock * 32, 0, s>>>(px, psc, pb, py, rows, n, epsilon)
      KILN_WARP_DISPATCH(per, vec, KILN_LAYER_NORM)
#undef KILN_LAYER_NORM
    } else {
      layer_norm_kernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(px, psc, pb, py, d, epsilon);
    }
  });
}

namespace {

template <typename U>
cudaError_t copy32_as(const void* in, void* out, const Index32<2>& ix, int64_t n, cudaStream_t s) {
  strided_copy32_kernel<U>
      <<<blocks_for(n), 256, 0, s>>>(static_cast<const U*>(in), static_cast<U*>(out), static_cast<uint32_t>(n), ix);
  return cudaGetLastError();
}

template <typename U>
cudaError_t transpose_as(const void* in, void* out, uint32_t I, uint32_t J, uint32_t in_sj, uint32_t out_si,
                         const Index32<2>& batch, uint32_t nb, cudaStream_t s) {
  if (J <= kNarrow && out_si == J) {
    const uint32_t n = I * J;  // below 2^31: the whole space fits Index32
    dim3 grid(static_cast<unsigned>(blocks_for(n)), nb < 65535 ? nb : 65535);
    transpose_narrow_kernel<U>
        <<<grid, 256, 0, s>>>(static_cast<const U*>(in), static_cast<U*>(out), n, FastDiv(J), J, in_sj, batch, nb);
    return cudaGetLastError();
  }
  dim3 grid((J + kTile - 1) / kTile, (I + kTile - 1) / kTile, nb < 65535 ? nb : 65535);
  transpose_tile_kernel<U><<<grid, dim3(kTile, kTileRows), 0, s>>>(static_cast<const U*>(in), static_cast<U*>(out), I,
                                                                   J, in_sj, out_si, batch, nb);
  return cudaGetLastError();
}

// The tiled transpose where the output's contiguous (last) axis differs from the input's; false when the
// collapsed copy has no such pair (or too large for it).
bool try_transpose(const char* in, char* out, int64_t e, const Collapsed<2>& c, cudaError_t* err, cudaStream_t s) {
  const int last = c.rank - 1;
  if (c.rank < 2 || c.strides[1][last] != 1 || c.strides[0][last] == 1) return false;
  int ki = -1;
  for (int k = 0; k < last; ++k)
    if (c.strides[0][k] == 1) ki = k;
  if (ki < 0 || c.dims[ki] > int64_t{65535} * kTile) return false;
  Collapsed<2> batch;
  for (int k = 0; k < last; ++k) {
    if (k == ki) continue;
    batch.dims[batch.rank] = c.dims[k];
    batch.strides[0][batch.rank] = c.strides[0][k];
    batch.strides[1][batch.rank] = c.strides[1][k];
    ++batch.rank;
  }
  Index32<2> whole, bix;
  if (!to_index32(c, &whole) || !to_index32(batch, &bix)) return false;
  int64_t nb = 1;
  for (int k = 0; k < batch.rank; ++k) nb *= batch.dims[k];
  const uint32_t I = static_cast<uint32_t>(c.dims[ki]), J = static_cast<uint32_t>(c.dims[last]);
  const uint32_t in_sj = static_cast<uint32_t>(c.strides[0][last]), out_si = static_cast<uint32_t>(c.strides[1][ki]);
  const uint32_t nbu = static_cast<uint32_t>(nb);
  switch (e) {
    case 1: *err = transpose_as<uint8_t>(in, out, I, J, in_sj, out_si, bix, nbu, s); return true;
    case 2: *err = transpose_as<uint16_t>(in, out, I, J, in_sj, out_si, bix, nbu, s); return true;
    case 4: *err = transpose_as<uint32_t>(in, out, I, J, in_sj, out_si, bix, nbu, s); return true;
    case 8: *err = transpose_as<uint64_t>(in, out, I, J, in_sj, out_si, bix, nbu, s); return true;
  }
  return false;
}

// The widest unit (16, 8, 4, 2 bytes, at least e) that packs the innermost axis when both sides walk it
// contiguously, every other stride and both bases aligned to it: c rescaled in place; else e.
int64_t widen(const char* in, char* out, int64_t e, Collapsed<2>* c) {
  const int last = c->rank - 1;
  if (c->rank < 1 || c->strides[0][last] != 1 || c->strides[1][last] != 1) return e;
  for (int64_t w = 16; w > e; w /= 2) {
    if (w % e) continue;
    const int64_t v = w / e;
    bool ok =
        c->dims[last] % v == 0 && reinterpret_cast<uintptr_t>(in) % w == 0 && reinterpret_cast<uintptr_t>(out) % w == 0;
    for (int k = 0; k < last && ok; ++k) ok = c->strides[0][k] % v == 0 && c->strides[1][k] % v == 0;
    if (!ok) continue;
    c->dims[last] /= v;
    for (int k = 0; k < last; ++k) {
      c->strides[0][k] /= v;
      c->strides[1][k] /= v;
    }
    return w;
  }
  return e;
}

}  // namespace

cudaError_t launch_strided_copy(const void* in, void* out, int64_t elem_size, const StridedCopy& p, cudaStream_t s) {
  int64_t n = 1;
  for (int k = 0; k < p.rank; ++k) n *= p.dims[k];
  if (n == 0) return cudaSuccess;
  if (elem_size == 1 || elem_size == 2 || elem_size == 4 || elem_size == 8) {
    const char* base_in = static_cast<const char*>(in) + p.in_offset * elem_size;
    char* base_out = static_cast<char*>(out) + p.out_offset * elem_size;
    const int64_t* strides[2] = {p.in_strides, p.out_strides};
    Collapsed<2> c = collapse<2>(p.rank, p.dims, strides);
    cudaError_t err = cudaSuccess;
    if (try_transpose(base_in, base_out, elem_size, c, &err, s)) return err;
    const int64_t w = widen(base_in, base_out, elem_size, &c);
    Index32<2> ix;
    if (to_index32(c, &ix)) {
      const int64_t units = n * elem_size / w;
      switch (w) {
        case 1: return copy32_as<uint8_t>(base_in, base_out, ix, units, s);
        case 2: return copy32_as<uint16_t>(base_in, base_out, ix, units, s);
        case 4: return copy32_as<uint32_t>(base_in, base_out, ix, units, s);
        case 8: return copy32_as<uint64_t>(base_in, base_out, ix, units, s);
        case 16: return copy32_as<uint4>(base_in, base_out, ix, units, s);
      }
    }
  }
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
