// One float vector interface over the three paths (AVX-512: 16 lanes, AVX2: 8, scalar: 1), so a
// kernel written once as a template over V (or over a `Vec` alias) runs on each: the plane kernels
// (depthwise convolution, pooling, Winograd) and the transformer kernels (xformer_kernels.inc).
// A kernel body using V's functions must itself be compiled for V's target: define it inside a
// `#pragma GCC target` region of the same target (see conv_depthwise.cc and xformer_kernels.cc,
// which include their bodies once per path).
//
// Semantics shared by all: lanes are float32. Masks select lanes [0, n): mask(n) with n clamped to
// [0, kLanes]; masked loads never touch the lanes left out (no fault past the end of a buffer) and
// give zero there (or `fill`); load_n/store_n(p, n) are the masked forms for the first n lanes.
// max(a, b)/min(a, b) return b when either is NaN (x86 maxps order): max(x, acc) keeps the
// accumulator where x is NaN, max(lo, x) keeps a NaN x. select(m, a, b) is m ? a : b for a
// comparison result m (type Cmp).
#pragma once

#include "backends/cpu/kernel_simd.h"

namespace kiln::backends::cpu {

struct Vec512 {
  using T = __m512;
  using Mask = __mmask16;
  using Cmp = __mmask16;
  static constexpr int kLanes = 16;
#define KILN_V KILN_TARGET_AVX512 static KILN_INLINE
  KILN_V T zero() { return _mm512_setzero_ps(); }
  KILN_V T set1(float x) { return _mm512_set1_ps(x); }
  KILN_V T load(const float* p) { return _mm512_loadu_ps(p); }
  KILN_V T broadcast(const float* p) { return _mm512_set1_ps(*p); }
  KILN_V void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  KILN_V void stream(float* p, T v) { _mm512_stream_ps(p, v); }  // non-temporal; p 64-byte aligned
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
  KILN_V T load_n(const float* p, int64_t n) { return maskload(p, mask(n)); }
  KILN_V T load_n(const float* p, int64_t n, float fill) { return load_range(p, 0, n, fill); }
  KILN_V void store_n(float* p, T v, int64_t n) { maskstore(p, mask(n), v); }
  KILN_V T add(T a, T b) { return _mm512_add_ps(a, b); }
  KILN_V T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  KILN_V T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  KILN_V T div(T a, T b) { return _mm512_div_ps(a, b); }
  KILN_V T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }    // a * b + c
  KILN_V T fnmadd(T a, T b, T c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b
  KILN_V T max(T a, T b) { return _mm512_max_ps(a, b); }
  KILN_V T min(T a, T b) { return _mm512_min_ps(a, b); }
  KILN_V T sqrt(T a) { return _mm512_sqrt_ps(a); }
  KILN_V T abs(T a) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff)));
  }
  KILN_V T neg(T a) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN)));
  }
  KILN_V T floor(T a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  KILN_V T ceil(T a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC); }
  KILN_V T round_even(T a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  KILN_V Cmp lt(T a, T b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  KILN_V Cmp gt(T a, T b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  KILN_V Cmp isnan(T a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  KILN_V T select(Cmp m, T a, T b) { return _mm512_mask_blend_ps(m, b, a); }
  // 2^n for integral n in [-126, 127] given as floats.
  KILN_V T pow2i(T n) {
    __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  KILN_V T activate(T v, const Activation& a) { return avx512::activate(v, a); }
  KILN_V T activate_cheap(T v, const Activation& a) { return avx512::activate_cheap(v, a); }
  KILN_V float reduce_add(T v) { return _mm512_reduce_add_ps(v); }
  KILN_V float reduce_max(T v) { return _mm512_reduce_max_ps(v); }
  // r[j][i] <- r[i][j] for a 16 x 16 block held in 16 registers.
  KILN_V void transpose(T* r) {
    T t[16], u[16];
    for (int i = 0; i < 16; i += 2)
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    for (int g = 0; g < 16; g += 4) {  // u[g + c], lane k: column 4k + c of rows g..g+3
      u[g] = _mm512_shuffle_ps(t[g], t[g + 2], 0x44);
      u[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], 0xEE);
      u[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0x44);
      u[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      T v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
      T w0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88), w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
      r[c] = _mm512_shuffle_f32x4(v0, w0, 0x88);
      r[4 + c] = _mm512_shuffle_f32x4(v1, w1, 0x88);
      r[8 + c] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
      r[12 + c] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
    }
  }
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
  using Cmp = __m256;
  static constexpr int kLanes = 8;
#define KILN_V KILN_TARGET_AVX2 static KILN_INLINE
  KILN_V T zero() { return _mm256_setzero_ps(); }
  KILN_V T set1(float x) { return _mm256_set1_ps(x); }
  KILN_V T load(const float* p) { return _mm256_loadu_ps(p); }
  KILN_V T broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  KILN_V void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  KILN_V void stream(float* p, T v) { _mm256_stream_ps(p, v); }  // non-temporal; p 32-byte aligned
  KILN_V Mask mask(int64_t n) { return avx2::tail_mask(static_cast<int>(n < 0 ? 0 : n > 8 ? 8 : n)); }
  KILN_V T maskload(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  KILN_V void maskstore(float* p, Mask m, T v) { _mm256_maskstore_ps(p, m, v); }
  KILN_V T load_range(const float* p, int64_t lo, int64_t hi, float fill) {
    __m256i m = _mm256_andnot_si256(mask(lo), mask(hi));
    return _mm256_blendv_ps(set1(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  KILN_V T load_n(const float* p, int64_t n) { return maskload(p, mask(n)); }
  KILN_V T load_n(const float* p, int64_t n, float fill) { return load_range(p, 0, n, fill); }
  KILN_V void store_n(float* p, T v, int64_t n) { maskstore(p, mask(n), v); }
  KILN_V T add(T a, T b) { return _mm256_add_ps(a, b); }
  KILN_V T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  KILN_V T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  KILN_V T div(T a, T b) { return _mm256_div_ps(a, b); }
  KILN_V T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  KILN_V T fnmadd(T a, T b, T c) { return _mm256_fnmadd_ps(a, b, c); }
  KILN_V T max(T a, T b) { return _mm256_max_ps(a, b); }
  KILN_V T min(T a, T b) { return _mm256_min_ps(a, b); }
  KILN_V T sqrt(T a) { return _mm256_sqrt_ps(a); }
  KILN_V T abs(T a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
  KILN_V T neg(T a) { return _mm256_xor_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))); }
  KILN_V T floor(T a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  KILN_V T ceil(T a) { return _mm256_round_ps(a, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC); }
  KILN_V T round_even(T a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  KILN_V Cmp lt(T a, T b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  KILN_V Cmp gt(T a, T b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  KILN_V Cmp isnan(T a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  KILN_V T select(Cmp m, T a, T b) { return _mm256_blendv_ps(b, a, m); }
  KILN_V T pow2i(T n) {
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  KILN_V T activate(T v, const Activation& a) { return avx2::activate(v, a); }
  KILN_V T activate_cheap(T v, const Activation& a) { return avx2::activate_cheap(v, a); }
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
  // r[j][i] <- r[i][j] for an 8 x 8 block held in 8 registers.
  KILN_V void transpose(T* r) {
    T t[8], u[8];
    for (int i = 0; i < 8; i += 2)
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    for (int g = 0; g < 8; g += 4) {  // u[g + c], lane k: column 4k + c of rows g..g+3
      u[g] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
      u[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xEE);
      u[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
      u[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
      r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
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
  using Cmp = bool;
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
  static T load_n(const float* p, int64_t n) { return maskload(p, mask(n)); }
  static T load_n(const float* p, int64_t n, float fill) { return n > 0 ? *p : fill; }
  static void store_n(float* p, T v, int64_t n) { maskstore(p, mask(n), v); }
  static T add(T a, T b) { return a + b; }
  static T sub(T a, T b) { return a - b; }
  static T mul(T a, T b) { return a * b; }
  static T div(T a, T b) { return a / b; }
  static T fmadd(T a, T b, T c) { return a * b + c; }
  static T fnmadd(T a, T b, T c) { return c - a * b; }
  static T max(T a, T b) { return a > b ? a : b; }
  static T min(T a, T b) { return a < b ? a : b; }
  static T sqrt(T a) { return std::sqrt(a); }
  static T abs(T a) { return std::fabs(a); }
  static T neg(T a) { return -a; }
  static T floor(T a) { return std::floor(a); }
  static T ceil(T a) { return std::ceil(a); }
  static T round_even(T a) { return std::nearbyint(a); }  // the default rounding mode: half to even
  static Cmp lt(T a, T b) { return a < b; }
  static Cmp gt(T a, T b) { return a > b; }
  static Cmp isnan(T a) { return a != a; }
  static T select(Cmp m, T a, T b) { return m ? a : b; }
  static T pow2i(T n) { return std::ldexp(1.f, static_cast<int>(n)); }
  static T activate(T v, const Activation& a) { return activate_scalar(v, a); }
  static float reduce_add(T v) { return v; }
  static float reduce_max(T v) { return v; }
  static void transpose(T*) {}
  static void deinterleave(const float* p, T* even, T* odd) { *even = p[0], *odd = p[1]; }
};

}  // namespace kiln::backends::cpu
