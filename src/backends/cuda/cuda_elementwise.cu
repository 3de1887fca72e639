// Elementwise kernels: unary activations and math, binary ops with numpy broadcasting, Cast. The
// float kernels are templated on the storage type (float, __half, __nv_bfloat16) and compute in
// float32: each element is loaded, widened, computed and rounded once on the store. Where the pointers
// are 16-byte aligned, a thread moves 16 bytes at a time (Pack); broadcasts walk the collapsed index
// space with 32-bit FastDiv decompositions (cuda_index.h), the 64-bit kernel kept for 2^31 elements up.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "backends/cuda/cuda_float_types.cuh"
#include "backends/cuda/cuda_fused_elementwise.h"
#include "backends/cuda/cuda_index.h"
#include "backends/cuda/cuda_kernels.h"

namespace kiln::backends::cuda {
static_assert(kIndexMaxRank == kMaxRank, "cuda_index.h and cuda_kernels.h agree on the rank");

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

// V elements per thread through 16-byte loads: x and y aligned, n / V packs, the tail element-wise.
template <typename T, int V>
__global__ void unary_vec_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, UnaryParams p) {
  const int64_t packs = n / V, tail = n - packs * V;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = first; i < packs; i += step) {
    Pack<T, V> v = reinterpret_cast<const Pack<T, V>*>(x)[i];
#pragma unroll
    for (int k = 0; k < V; ++k) v.v[k] = to_storage<T>(unary(to_f32(v.v[k]), p));
    reinterpret_cast<Pack<T, V>*>(y)[i] = v;
  }
  if (first < tail) y[packs * V + first] = to_storage<T>(unary(to_f32(x[packs * V + first]), p));
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

template <typename T, int V>
__global__ void binary_same_vec_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, int64_t n,
                                       BinaryOp op) {
  const int64_t packs = n / V, tail = n - packs * V;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = first; i < packs; i += step) {
    const Pack<T, V> va = reinterpret_cast<const Pack<T, V>*>(a)[i];
    const Pack<T, V> vb = reinterpret_cast<const Pack<T, V>*>(b)[i];
    Pack<T, V> vy;
#pragma unroll
    for (int k = 0; k < V; ++k) vy.v[k] = to_storage<T>(binary(to_f32(va.v[k]), to_f32(vb.v[k]), op));
    reinterpret_cast<Pack<T, V>*>(y)[i] = vy;
  }
  if (first < tail) {
    const int64_t e = packs * V + first;
    y[e] = to_storage<T>(binary(to_f32(a[e]), to_f32(b[e]), op));
  }
}

// V consecutive output elements of the innermost (collapsed) dim per thread, `packs` of them; an operand
// with vec[j] loads them as one Pack (its innermost stride 1, offsets multiples of V, aligned), the
// other one element (innermost stride 0).
template <typename T, int V>
__global__ void binary_index32_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
                                      uint32_t packs, BinaryOp op, Index32<2> p, bool a_vec, bool b_vec) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < packs; i += gridDim.x * blockDim.x) {
    uint32_t off[2];
    offsets32<2>(i, p, off);
    Pack<T, V> va, vb, vy;
    if (V == 1 || a_vec) {
      va = *reinterpret_cast<const Pack<T, V>*>(a + off[0]);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) va.v[k] = a[off[0]];
    }
    if (V == 1 || b_vec) {
      vb = *reinterpret_cast<const Pack<T, V>*>(b + off[1]);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) vb.v[k] = b[off[1]];
    }
#pragma unroll
    for (int k = 0; k < V; ++k) vy.v[k] = to_storage<T>(binary(to_f32(va.v[k]), to_f32(vb.v[k]), op));
    reinterpret_cast<Pack<T, V>*>(y)[i] = vy;
  }
}

struct FusedInputs {
  const void* in[kFusedMaxInputs];
};

// The op program of kiln.FusedElementwise per output element, its slots in registers (32-bit index
// space when k32, else 64-bit divisions).
template <typename T, bool k32>
__global__ void fused_elementwise_kernel(FusedInputs ins, T* __restrict__ y, int64_t n, FusedProgram p,
                                         Index32<kFusedMaxInputs> ix) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[kFusedMaxInputs];
    if (k32) {
      uint32_t o32[kFusedMaxInputs];
      offsets32<kFusedMaxInputs>(static_cast<uint32_t>(i), ix, o32);
#pragma unroll
      for (int j = 0; j < kFusedMaxInputs; ++j) off[j] = o32[j];
    } else {
#pragma unroll
      for (int j = 0; j < kFusedMaxInputs; ++j) off[j] = 0;
      int64_t rest = i;
      for (int k = p.rank - 1; k >= 0; --k) {
        const int64_t c = rest % p.dims[k];
        rest /= p.dims[k];
#pragma unroll
        for (int j = 0; j < kFusedMaxInputs; ++j) off[j] += c * p.strides[j][k];
      }
    }
    float v[kFusedMaxInputs + kFusedMaxSteps];
    for (int j = 0; j < p.num_inputs; ++j) v[j] = to_f32(static_cast<const T*>(ins.in[j])[off[j]]);
    for (int k = 0; k < p.num_steps; ++k) {
      const FusedStep& st = p.steps[k];
      v[p.num_inputs + k] = st.binary ? binary(v[st.a], v[st.b], st.bop) : unary(v[st.a], st.unary);
    }
    y[i] = to_storage<T>(v[p.num_inputs + p.num_steps - 1]);
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
    constexpr int V = kPackBytes / sizeof(T);
    auto px = static_cast<const T*>(x);
    auto py = static_cast<T*>(y);
    if (aligned16(px) && aligned16(py))
      unary_vec_kernel<T, V><<<blocks_for((n + V - 1) / V), kThreads, 0, s>>>(px, py, n, p);
    else
      unary_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(px, py, n, p);
  });
}

namespace {

// The broadcast through the 32-bit index space: packs of V along the innermost dim where it divides by
// V and every operand that walks it (stride 1) is aligned with strides multiple of V; else V = 1.
template <typename T>
bool launch_binary_index32(const T* a, const T* b, T* y, BinaryOp op, const BroadcastParams& p, cudaStream_t s) {
  const int64_t* strides[2] = {p.a_strides, p.b_strides};
  Collapsed<2> c = collapse<2>(p.rank, p.dims, strides);
  Index32<2> ix;
  if (!to_index32(c, &ix)) return false;
  constexpr int V = kPackBytes / sizeof(T);
  bool vec = c.rank > 0 && c.dims[c.rank - 1] % V == 0 && aligned16(y);
  const T* ptr[2] = {a, b};
  bool op_vec[2] = {false, false};
  for (int j = 0; j < 2 && vec; ++j) {
    const int64_t inner = c.strides[j][c.rank - 1];
    if (inner == 0) continue;
    vec = inner == 1 && aligned16(ptr[j]);
    for (int k = 0; k < c.rank && vec; ++k) vec = c.strides[j][k] % V == 0 || k == c.rank - 1;
    op_vec[j] = true;
  }
  int64_t n = 1;
  for (int k = 0; k < c.rank; ++k) n *= c.dims[k];
  if (vec) {
    ix.dims[c.rank - 1] /= V;
    ix.div[c.rank - 1] = FastDiv(ix.dims[c.rank - 1]);
    for (int j = 0; j < 2; ++j) ix.strides[j][c.rank - 1] *= V;
    const uint32_t packs = static_cast<uint32_t>(n / V);
    binary_index32_kernel<T, V><<<blocks_for(packs), kThreads, 0, s>>>(a, b, y, packs, op, ix, op_vec[0], op_vec[1]);
  } else {
    binary_index32_kernel<T, 1>
        <<<blocks_for(n), kThreads, 0, s>>>(a, b, y, static_cast<uint32_t>(n), op, ix, false, false);
  }
  return true;
}

}  // namespace

cudaError_t launch_binary(const void* a, const void* b, void* y, int64_t n, BinaryOp op, const BroadcastParams& p,
                          FloatType t, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  return dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kPackBytes / sizeof(T);
    auto pa = static_cast<const T*>(a), pb = static_cast<const T*>(b);
    auto py = static_cast<T*>(y);
    if (p.same_shape) {
      if (aligned16(pa) && aligned16(pb) && aligned16(py))
        binary_same_vec_kernel<T, V><<<blocks_for((n + V - 1) / V), kThreads, 0, s>>>(pa, pb, py, n, op);
      else
        binary_same_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(pa, pb, py, n, op);
    } else if (!launch_binary_index32(pa, pb, py, op, p, s)) {
      binary_broadcast_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(pa, pb, py, n, op, p);
    }
  });
}

cudaError_t launch_fused_elementwise(const void* const* inputs, void* y, int64_t n, const FusedProgram& p, FloatType t,
                                     cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (p.num_inputs < 1 || p.num_inputs > kFusedMaxInputs || p.num_steps < 1 || p.num_steps > kFusedMaxSteps ||
      p.rank < 0 || p.rank > kMaxRank)
    return cudaErrorInvalidValue;
  for (int k = 0; k < p.num_steps; ++k) {
    const FusedStep& st = p.steps[k];
    const int limit = p.num_inputs + k;  // a step reads inputs and earlier steps only
    if (st.a < 0 || st.a >= limit || (st.binary && (st.b < 0 || st.b >= limit))) return cudaErrorInvalidValue;
  }
  FusedInputs ins = {};
  for (int j = 0; j < p.num_inputs; ++j) ins.in[j] = inputs[j];
  const int64_t* strides[kFusedMaxInputs];
  for (int j = 0; j < kFusedMaxInputs; ++j) strides[j] = p.strides[j];
  Index32<kFusedMaxInputs> ix;
  const bool k32 = to_index32(collapse<kFusedMaxInputs>(p.rank, p.dims, strides), &ix);
  return dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    if (k32)
      fused_elementwise_kernel<T, true><<<blocks_for(n), kThreads, 0, s>>>(ins, static_cast<T*>(y), n, p, ix);
    else
      fused_elementwise_kernel<T, false><<<blocks_for(n), kThreads, 0, s>>>(ins, static_cast<T*>(y), n, p, ix);
  });
}

}  // namespace kiln::backends::cuda
