// One vector type per instruction set for the transformer kernels (xformer_kernels.inc), selected by
// KILN_VEC_BITS (512, 256 or 32 = scalar) before each inclusion. No include guard on purpose:
// xformer_kernels.cc includes it once per ISA, each time inside its own namespace and, for the
// vector ISAs, inside a `#pragma GCC target` region (the project is compiled without -march flags,
// so only those regions may use AVX2/AVX-512 instructions, and only once cpu_isa() said so).
//
// Semantics shared by the three: lanes are float32; load_n/store_n touch only the first n lanes
// (the others load as 0, or as `fill`; n <= 0 touches none); max(a, b)/min(a, b) return b when
// either is NaN (x86 maxps order), so max(lo, x) keeps a NaN x; select(m, a, b) is m ? a : b.

#if KILN_VEC_BITS == 512

struct Vec {
  using V = __m512;
  using M = __mmask16;
  static constexpr int W = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static M first(int64_t n) { return n <= 0 ? M(0) : n >= 16 ? M(0xFFFF) : M((1u << n) - 1u); }
  static V load_n(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static V load_n(const float* p, int64_t n, float fill) { return _mm512_mask_loadu_ps(set1(fill), first(n), p); }
  static void store_n(float* p, V v, int64_t n) { _mm512_mask_storeu_ps(p, first(n), v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }    // a * b + c
  static V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V sqrt(V a) { return _mm512_sqrt_ps(a); }
  static V abs(V a) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff)));
  }
  static V neg(V a) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN)));
  }
  static V floor(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  static V ceil(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC); }
  static V round_even(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static M lt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static M gt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static M isnan(V a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static V select(M m, V a, V b) { return _mm512_mask_blend_ps(m, b, a); }
  // 2^n for integral n in [-126, 127] given as floats.
  static V pow2i(V n) {
    __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  // r[j][i] <- r[i][j] for a 16 x 16 block held in 16 registers.
  static void transpose(V* r) {
    V t[16], u[16];
    for (int i = 0; i < 16; i += 2)
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    for (int g = 0; g < 16; g += 4) {  // u[g + c], lane k: column 4k + c of rows g..g+3
      u[g] = _mm512_shuffle_ps(t[g], t[g + 2], 0x44);
      u[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], 0xEE);
      u[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0x44);
      u[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      V v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
      V w0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88), w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
      r[c] = _mm512_shuffle_f32x4(v0, w0, 0x88);
      r[4 + c] = _mm512_shuffle_f32x4(v1, w1, 0x88);
      r[8 + c] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
      r[12 + c] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
    }
  }
  static float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
  static float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
};

#elif KILN_VEC_BITS == 256

struct Vec {
  using V = __m256;
  using M = __m256;
  static constexpr int W = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static __m256i first(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n < 8 ? n : 8)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V load_n(const float* p, int64_t n) { return _mm256_maskload_ps(p, first(n)); }
  static V load_n(const float* p, int64_t n, float fill) {
    __m256i m = first(n);
    return _mm256_blendv_ps(set1(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  static void store_n(float* p, V v, int64_t n) { _mm256_maskstore_ps(p, first(n), v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V sqrt(V a) { return _mm256_sqrt_ps(a); }
  static V abs(V a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
  static V neg(V a) { return _mm256_xor_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))); }
  static V floor(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  static V ceil(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC); }
  static V round_even(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static M lt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static M gt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static M isnan(V a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  static V select(M m, V a, V b) { return _mm256_blendv_ps(b, a, m); }
  static V pow2i(V n) {
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  // r[j][i] <- r[i][j] for an 8 x 8 block held in 8 registers.
  static void transpose(V* r) {
    V t[8], u[8];
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
  static float reduce_add(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(V v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

#else  // scalar

struct Vec {
  using V = float;
  using M = bool;
  static constexpr int W = 1;
  static V zero() { return 0.f; }
  static V set1(float x) { return x; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V load_n(const float* p, int64_t n) { return n > 0 ? *p : 0.f; }
  static V load_n(const float* p, int64_t n, float fill) { return n > 0 ? *p : fill; }
  static void store_n(float* p, V v, int64_t n) {
    if (n > 0) *p = v;
  }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V fmadd(V a, V b, V c) { return a * b + c; }
  static V fnmadd(V a, V b, V c) { return c - a * b; }
  static V max(V a, V b) { return a > b ? a : b; }
  static V min(V a, V b) { return a < b ? a : b; }
  static V sqrt(V a) { return std::sqrt(a); }
  static V abs(V a) { return std::fabs(a); }
  static V neg(V a) { return -a; }
  static V floor(V a) { return std::floor(a); }
  static V ceil(V a) { return std::ceil(a); }
  static V round_even(V a) { return std::nearbyint(a); }  // the default rounding mode: half to even
  static M lt(V a, V b) { return a < b; }
  static M gt(V a, V b) { return a > b; }
  static M isnan(V a) { return a != a; }
  static V select(M m, V a, V b) { return m ? a : b; }
  static V pow2i(V n) { return std::ldexp(1.f, static_cast<int>(n)); }
  static void transpose(V*) {}
  static float reduce_add(V v) { return v; }
  static float reduce_max(V v) { return v; }
};

#endif
