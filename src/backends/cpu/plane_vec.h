// One float vector interface over the three paths (AVX-512: 16 lanes, AVX2: 8, scalar: 1) for the
// plane kernels (depthwise convolution, pooling), so a kernel written once as a template over V runs
// on each. A kernel body using V's functions must
// itself be compiled for V's target: define it inside a `#pragma GCC target` region of the same
// target (see conv_depthwise.cc, which includes its body once per path).
//
// Masks select lanes [0, n): mask(n) with n clamped to [0, kLanes]; masked loads never touch the
// lanes left out (no fault past the end of a buffer) and give zero there.
#pragma once

#include "backends/cpu/kernel_simd.h"

namespace kiln::backends::cpu {

struct Vec512 {
  using T = __m512;
  using Mask = __mmask16;
  static constexpr int kLanes = 16;
#define KILN_V KILN_TARGET_AVX512 static KILN_INLINE
  KILN_V T zero() { return _mm512_setzero_ps(); }
  KILN_V T set1(float x) { return _mm512_set1_ps(x); }
  KILN_V T load(const float* p) { return _mm512_loadu_ps(p); }
  KILN_V void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  KILN_V Mask mask(int64_t n) {
    return n >= 16 ? static_cast<Mask>(0xFFFF) : n <= 0 ? static_cast<Mask>(0) : static_cast<Mask>((1u << n) - 1);
  }
  KILN_V T maskload(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  KILN_V void maskstore(float* p, Mask m, T v) { _mm512_mask_storeu_ps(p, m, v); }
  // p[lo, hi) of the vector at p, `fill` elsewhere (nothing outside is read): a vector straddling
  // the edges of a row.
  KILN_V T load_range(const float* p, int64_t lo, int64_t hi, float fill) {
    return _mm512_mask_loadu_ps(set1(fill), static_cast<Mask>(mask(hi) & ~mask(lo)), p);
  }
  KILN_V T add(T a, T b) { return _mm512_add_ps(a, b); }
  KILN_V T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  KILN_V T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  // max(a, b) that keeps a where b is NaN (pooling ignores NaN like the reference kernel)
  KILN_V T max(T a, T b) { return _mm512_max_ps(b, a); }
  KILN_V T activate(T v, const Activation& a) { return avx512::activate(v, a); }
  KILN_V float reduce_add(T v) { return _mm512_reduce_add_ps(v); }
  KILN_V float reduce_max(T v) { return _mm512_reduce_max_ps(v); }
  // Lanes [O, 16) of cur then [0, O) of next (0 < O < 16): the vector O floats further along.
  template <int O>
  KILN_V T shift(T cur, T next) {
    return _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(next), _mm512_castps_si512(cur), O));
  }
  // (a, b) = 2 * kLanes consecutive floats -> their even and odd elements
  KILN_V void deinterleave(T a, T b, T* even, T* odd) {
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    *even = _mm512_permutex2var_ps(a, ie, b);
    *odd = _mm512_permutex2var_ps(a, io, b);
  }
  KILN_V void deinterleave(const float* p, T* even, T* odd) { deinterleave(load(p), load(p + 16), even, odd); }
#undef KILN_V
};

struct Vec256 {
  using T = __m256;
  using Mask = __m256i;
  static constexpr int kLanes = 8;
#define KILN_V KILN_TARGET_AVX2 static KILN_INLINE
  KILN_V T zero() { return _mm256_setzero_ps(); }
  KILN_V T set1(float x) { return _mm256_set1_ps(x); }
  KILN_V T load(const float* p) { return _mm256_loadu_ps(p); }
  KILN_V void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  KILN_V Mask mask(int64_t n) { return avx2::tail_mask(static_cast<int>(n < 0 ? 0 : n > 8 ? 8 : n)); }
  KILN_V T maskload(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  KILN_V void maskstore(float* p, Mask m, T v) { _mm256_maskstore_ps(p, m, v); }
  KILN_V T load_range(const float* p, int64_t lo, int64_t hi, float fill) {
    __m256i m = _mm256_andnot_si256(mask(lo), mask(hi));
    return _mm256_blendv_ps(set1(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  KILN_V T add(T a, T b) { return _mm256_add_ps(a, b); }
  KILN_V T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  KILN_V T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  KILN_V T max(T a, T b) { return _mm256_max_ps(b, a); }
  KILN_V T activate(T v, const Activation& a) { return avx2::activate(v, a); }
  KILN_V float reduce_add(T v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  KILN_V float reduce_max(T v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  template <int O>
  KILN_V T shift(T cur, T next) {
    if constexpr (O == 4) return _mm256_permute2f128_ps(cur, next, 0x21);
    const __m256i mid = _mm256_castps_si256(_mm256_permute2f128_ps(cur, next, 0x21));  // cur hi | next lo
    if constexpr (O < 4)
      return _mm256_castsi256_ps(_mm256_alignr_epi8(mid, _mm256_castps_si256(cur), 4 * O));
    else
      return _mm256_castsi256_ps(_mm256_alignr_epi8(_mm256_castps_si256(next), mid, 4 * (O - 4)));
  }
  KILN_V void deinterleave(const float* p, T* even, T* odd) { deinterleave(load(p), load(p + 8), even, odd); }
  KILN_V void deinterleave(T a, T b, T* even, T* odd) {
    // per 128-bit lane: a0 a2 b0 b2 | a4 a6 b4 b6, then the 64-bit quarters reordered
    *even = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), 0xD8));
    *odd = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), 0xD8));
  }
#undef KILN_V
};

// 8 lanes with AVX-512VL masks (the narrow vector of the AVX-512 path): vmaskmovps stores are slow
// on AMD, k-masked ones are not.
struct Vec256VL : Vec256 {
  using Mask = __mmask8;
#define KILN_V KILN_TARGET_AVX512 static KILN_INLINE
  KILN_V Mask mask(int64_t n) {
    return n >= 8 ? static_cast<Mask>(0xFF) : n <= 0 ? static_cast<Mask>(0) : static_cast<Mask>((1u << n) - 1);
  }
  KILN_V T maskload(const float* p, Mask m) { return _mm256_maskz_loadu_ps(m, p); }
  KILN_V void maskstore(float* p, Mask m, T v) { _mm256_mask_storeu_ps(p, m, v); }
  KILN_V T load_range(const float* p, int64_t lo, int64_t hi, float fill) {
    return _mm256_mask_loadu_ps(set1(fill), static_cast<Mask>(mask(hi) & ~mask(lo)), p);
  }
#undef KILN_V
};

struct Vec1 {
  using T = float;
  using Mask = bool;
  static constexpr int kLanes = 1;
  static T zero() { return 0.f; }
  static T set1(float x) { return x; }
  static T load(const float* p) { return *p; }
  static void store(float* p, T v) { *p = v; }
  static Mask mask(int64_t n) { return n > 0; }
  static T maskload(const float* p, Mask m) { return m ? *p : 0.f; }
  static void maskstore(float* p, Mask m, T v) {
    if (m) *p = v;
  }
  static T add(T a, T b) { return a + b; }
  static T mul(T a, T b) { return a * b; }
  static T fma(T a, T b, T c) { return a * b + c; }
  static T max(T a, T b) { return b > a ? b : a; }
  static T activate(T v, const Activation& a) { return activate_scalar(v, a); }
  static float reduce_add(T v) { return v; }
  static float reduce_max(T v) { return v; }
  static void deinterleave(const float* p, T* even, T* odd) { *even = p[0], *odd = p[1]; }
};

}  // namespace kiln::backends::cpu
