// Index arithmetic shared by kiln's elementwise and copy kernels: division by a dimension as a
// multiply-high and a shift (FastDiv, valid for 32-bit dividends below 2^31), and the collapse of a
// broadcast/strided index space (size-1 dims dropped, dims that every operand walks contiguously merged)
// so that the kernels decompose as few dims as possible. Host and device code; the host emulates the
// multiply-high, so the tests check the arithmetic on the CPU.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KILN_HD __host__ __device__ __forceinline__
#else
#define KILN_HD inline
#endif

namespace kiln::backends::cuda {

// cuda_kernels.h's kMaxRank (that header needs the CUDA toolkit; this one compiles without it for the tests).
constexpr int kIndexMaxRank = 8;

// q = n / d for 0 <= n < 2^31 and 1 <= d < 2^31 (Granlund-Montgomery round-up multiplier).
struct FastDiv {
  uint32_t d = 1, m = 0, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    if (d == 1) return;
    uint32_t l = 0;
    while ((uint64_t{1} << l) < d) ++l;  // ceil(log2 d)
    const uint32_t p = 31 + l;
    m = static_cast<uint32_t>(((uint64_t{1} << p) + d - 1) / d);
    s = p - 32;
  }
  KILN_HD uint32_t div(uint32_t n) const {
    if (d == 1) return n;
#ifdef __CUDA_ARCH__
    return __umulhi(n, m) >> s;
#else
    return static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> 32) >> s;
#endif
  }
};

// A collapsed index space of `rank` dims (outermost first) with the strides of kOps operands.
template <int kOps>
struct Collapsed {
  int rank = 0;
  int64_t dims[kIndexMaxRank] = {};
  int64_t strides[kOps][kIndexMaxRank] = {};
};

// Drops size-1 dims and merges dim k into k+1 where every operand has strides[k] == strides[k+1] * dims[k+1].
// An empty space (some dim 0) is left to the caller (it checks the element count first).
template <int kOps>
inline Collapsed<kOps> collapse(int rank, const int64_t* dims, const int64_t* const* strides) {
  Collapsed<kOps> c;
  for (int k = 0; k < rank; ++k) {
    if (dims[k] == 1) continue;
    bool merge = c.rank > 0;
    for (int j = 0; j < kOps && merge; ++j) merge = c.strides[j][c.rank - 1] == strides[j][k] * dims[k];
    if (merge) {
      // The previous (outer) dim is walked contiguously into this one: fold it in.
      c.dims[c.rank - 1] *= dims[k];
      for (int j = 0; j < kOps; ++j) c.strides[j][c.rank - 1] = strides[j][k];
    } else {
      c.dims[c.rank] = dims[k];
      for (int j = 0; j < kOps; ++j) c.strides[j][c.rank] = strides[j][k];
      ++c.rank;
    }
  }
  return c;
}

// The index space as 32-bit strides and divisors, when every offset fits (elements below 2^31).
template <int kOps>
struct Index32 {
  int rank = 0;
  FastDiv div[kIndexMaxRank];
  uint32_t dims[kIndexMaxRank] = {};
  uint32_t strides[kOps][kIndexMaxRank] = {};
};

// Fills *out from c when the space and every operand's extent stay below 2^31; false otherwise.
template <int kOps>
inline bool to_index32(const Collapsed<kOps>& c, Index32<kOps>* out) {
  const int64_t kLimit = int64_t{1} << 31;
  int64_t n = 1;
  for (int k = 0; k < c.rank; ++k) n *= c.dims[k];
  if (n >= kLimit) return false;
  for (int j = 0; j < kOps; ++j) {
    int64_t extent = 0;
    for (int k = 0; k < c.rank; ++k) {
      if (c.strides[j][k] < 0) return false;
      extent += (c.dims[k] - 1) * c.strides[j][k];
    }
    if (extent >= kLimit) return false;
  }
  out->rank = c.rank;
  for (int k = 0; k < c.rank; ++k) {
    out->dims[k] = static_cast<uint32_t>(c.dims[k]);
    out->div[k] = FastDiv(static_cast<uint32_t>(c.dims[k]));
    for (int j = 0; j < kOps; ++j) out->strides[j][k] = static_cast<uint32_t>(c.strides[j][k]);
  }
  return true;
}

#ifdef __CUDACC__
// The offsets in every operand of element i (below 2^31) of the space.
template <int kOps>
__device__ __forceinline__ void offsets32(uint32_t i, const Index32<kOps>& p, uint32_t* off) {
#pragma unroll
  for (int j = 0; j < kOps; ++j) off[j] = 0;
#pragma unroll
  for (int k = kIndexMaxRank - 1; k >= 0; --k) {
    if (k >= p.rank) continue;
    const uint32_t q = p.div[k].div(i);
    const uint32_t c = i - q * p.dims[k];
    i = q;
#pragma unroll
    for (int j = 0; j < kOps; ++j) off[j] += c * p.strides[j][k];
  }
}
#endif

}  // namespace kiln::backends::cuda
