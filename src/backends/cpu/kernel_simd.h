// Shared pieces of kiln's own CPU kernels: the target attributes of the AVX-512 / AVX2 paths (the
// project is compiled without -march flags; cpu_isa() picks a path at run time), and the epilogue
// activation of kiln's fused layers (attribute "activation", see src/ops/kiln_fused.cc) in vector
// and scalar form.
//
// Vector exp/tanh/erf are polynomial approximations (a few float ulps for exp, sigmoid and tanh;
// erf to about 1.5e-7 absolute, Abramowitz & Stegun 7.1.26); the scalar path calls libm.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>

#include "ir/graph.h"

// GCC 12 warns inside its own AVX-512 intrinsics (_mm512_max_ps etc. start from
// _mm512_undefined_ps) once they are inlined: a false positive, silenced for the kernel files.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define KILN_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
#define KILN_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define KILN_INLINE inline __attribute__((always_inline))

namespace kiln::backends::cpu {

enum class ActKind { kNone, kRelu, kLeakyRelu, kSigmoid, kTanh, kHardSwish, kClip, kSiLU, kGeluErf, kGeluTanh };

struct Activation {
  ActKind kind = ActKind::kNone;
  float alpha = 0.f;                  // LeakyRelu
  float lo = -FLT_MAX, hi = FLT_MAX;  // Clip
};

// The epilogue activation of a kiln.Fused* node (none for ONNX ops); "" or why it is not supported.
inline std::string parse_activation(const ir::Node& n, Activation* a) {
  *a = Activation();
  if (n.domain != "kiln") return "";
  std::string act = n.attr_string("activation", "");
  if (act.empty()) return "";
  if (act == "Relu")
    a->kind = ActKind::kRelu;
  else if (act == "LeakyRelu")
    a->kind = ActKind::kLeakyRelu, a->alpha = n.attr_float("activation_alpha", 0.01f);
  else if (act == "Sigmoid")
    a->kind = ActKind::kSigmoid;
  else if (act == "Tanh")
    a->kind = ActKind::kTanh;
  else if (act == "HardSwish")
    a->kind = ActKind::kHardSwish;
  else if (act == "SiLU")
    a->kind = ActKind::kSiLU;
  else if (act == "Gelu") {
    std::string approx = n.attr_string("activation_approximate", "none");
    if (approx == "none")
      a->kind = ActKind::kGeluErf;
    else if (approx == "tanh")
      a->kind = ActKind::kGeluTanh;
    else
      return "Gelu approximation '" + approx + "'";
  } else if (act == "Clip") {
    a->kind = ActKind::kClip;
    if (n.attr("activation_min")) a->lo = n.attr_float("activation_min", 0.f);
    if (n.attr("activation_max")) a->hi = n.attr_float("activation_max", 0.f);
    // ONNX Clip with min > max gives max everywhere; the reference kernel keeps that case.
    if (a->lo > a->hi) return "Clip with min > max";
  } else {
    return "activation '" + act + "'";
  }
  return "";
}

// ---- scalar ----

inline float activate_scalar(float x, const Activation& a) {
  double v = x;
  switch (a.kind) {
    case ActKind::kNone: return x;
    case ActKind::kRelu: return x < 0.f ? 0.f : x;
    case ActKind::kLeakyRelu: return x < 0.f ? a.alpha * x : x;
    case ActKind::kSigmoid:
      return static_cast<float>(v >= 0 ? 1 / (1 + std::exp(-v)) : std::exp(v) / (1 + std::exp(v)));
    case ActKind::kTanh: return std::tanh(x);
    case ActKind::kHardSwish: return static_cast<float>(v * std::max(0.0, std::min(1.0, v / 6 + 0.5)));
    case ActKind::kClip: return std::min(std::max(x, a.lo), a.hi);
    case ActKind::kSiLU:
      return static_cast<float>(v >= 0 ? v / (1 + std::exp(-v)) : v * std::exp(v) / (1 + std::exp(v)));
    case ActKind::kGeluErf: return static_cast<float>(0.5 * v * (1 + std::erf(v / std::sqrt(2.0))));
    case ActKind::kGeluTanh:
      return static_cast<float>(0.5 * v * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v))));
  }
  return x;
}

// ---- AVX-512 ----

namespace avx512 {

KILN_TARGET_AVX512 KILN_INLINE __m512 exp(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-87.3f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// 1 / d: the 14-bit estimate and one Newton step (~1 ulp; a division is several times slower).
// Infinite d gives 0, d = 0 gives inf or NaN (callers keep d >= 1).
KILN_TARGET_AVX512 KILN_INLINE __m512 rcp(__m512 d) {
  __m512 r = _mm512_rcp14_ps(d);
  return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.f)), r);
}

// x / (1 + exp(-y)): sigmoid (x = 1), SiLU and the tanh form of GELU.
KILN_TARGET_AVX512 KILN_INLINE __m512 div_one_plus_exp_neg(__m512 x, __m512 y) {
  __m512 e = exp(_mm512_sub_ps(_mm512_setzero_ps(), y));
  return _mm512_mul_ps(x, rcp(_mm512_add_ps(_mm512_set1_ps(1.f), e)));
}

KILN_TARGET_AVX512 KILN_INLINE __m512 tanh(__m512 x) {
  __m512 ax = _mm512_abs_ps(x);
  // |x| >= 0.625: 1 - 2 / (exp(2|x|) + 1) with x's sign; below: an odd polynomial (cephes tanhf).
  __m512 e = exp(_mm512_add_ps(ax, ax));
  __m512 big = _mm512_fnmadd_ps(_mm512_set1_ps(2.f), rcp(_mm512_add_ps(e, _mm512_set1_ps(1.f))), _mm512_set1_ps(1.f));
  big = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(big),
                                            _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))));
  __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745E-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954E-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531E-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036E-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422E-1f));
  __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ), big, small);
}

// 0.5 x (1 + erf(x / sqrt 2)) with erf(z) = 1 - P(t) exp(-z^2), t = 1 / (1 + p z), z >= 0.
KILN_TARGET_AVX512 KILN_INLINE __m512 gelu_erf(__m512 x) {
  __m512 z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(0.70710678118654752f));
  __m512 t = rcp(_mm512_fmadd_ps(z, _mm512_set1_ps(0.3275911f), _mm512_set1_ps(1.f)));
  __m512 p = _mm512_set1_ps(1.061405429f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
  __m512 q = _mm512_mul_ps(_mm512_mul_ps(p, t), exp(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(z, z))));
  // x >= 0: 0.5 x (2 - q); x < 0: 0.5 x q  (erfc(|z|) = q, no cancellation on either side)
  __m512 f = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ),
                                  _mm512_sub_ps(_mm512_set1_ps(2.f), q), q);
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), f);
}

// Relu, LeakyRelu, Clip and HardSwish (identity for the others: callers check the kind).
KILN_TARGET_AVX512 KILN_INLINE __m512 activate_cheap(__m512 x, const Activation& a) {
  switch (a.kind) {
    case ActKind::kRelu: return _mm512_max_ps(_mm512_setzero_ps(), x);
    case ActKind::kLeakyRelu:
      return _mm512_mask_mul_ps(x, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), x, _mm512_set1_ps(a.alpha));
    case ActKind::kClip: return _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(a.lo)), _mm512_set1_ps(a.hi));
    case ActKind::kHardSwish: {
      __m512 g = _mm512_fmadd_ps(x, _mm512_set1_ps(1.f / 6.f), _mm512_set1_ps(0.5f));
      return _mm512_mul_ps(x, _mm512_min_ps(_mm512_max_ps(g, _mm512_setzero_ps()), _mm512_set1_ps(1.f)));
    }
    default: return x;
  }
}

KILN_TARGET_AVX512 KILN_INLINE __m512 activate(__m512 x, const Activation& a) {
  switch (a.kind) {
    case ActKind::kNone: return x;
    case ActKind::kRelu: return _mm512_max_ps(_mm512_setzero_ps(), x);
    case ActKind::kLeakyRelu:
      return _mm512_mask_mul_ps(x, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), x, _mm512_set1_ps(a.alpha));
    case ActKind::kSigmoid: return div_one_plus_exp_neg(_mm512_set1_ps(1.f), x);
    case ActKind::kTanh: return tanh(x);
    case ActKind::kHardSwish: {
      __m512 g = _mm512_fmadd_ps(x, _mm512_set1_ps(1.f / 6.f), _mm512_set1_ps(0.5f));
      g = _mm512_min_ps(_mm512_max_ps(g, _mm512_setzero_ps()), _mm512_set1_ps(1.f));
      return _mm512_mul_ps(x, g);
    }
    case ActKind::kClip: return _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(a.lo)), _mm512_set1_ps(a.hi));
    case ActKind::kSiLU: return div_one_plus_exp_neg(x, x);
    case ActKind::kGeluErf: return gelu_erf(x);
    case ActKind::kGeluTanh: {
      // 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3)
      __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
      __m512 u = _mm512_mul_ps(_mm512_fmadd_ps(x3, _mm512_set1_ps(0.044715f), x), _mm512_set1_ps(1.5957691216057308f));
      return div_one_plus_exp_neg(x, u);
    }
  }
  return x;
}

}  // namespace avx512

// ---- AVX2 ----

namespace avx2 {

KILN_TARGET_AVX2 KILN_INLINE __m256 exp(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.3f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  // 2^n via the exponent bits; n in [-126, 127] after the clamp (2^n * p stays normal or tiny).
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

KILN_TARGET_AVX2 KILN_INLINE __m256 div_one_plus_exp_neg(__m256 x, __m256 y) {
  __m256 e = exp(_mm256_sub_ps(_mm256_setzero_ps(), y));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.f), e));
}

KILN_TARGET_AVX2 KILN_INLINE __m256 abs(__m256 x) {
  return _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MAX)));
}

KILN_TARGET_AVX2 KILN_INLINE __m256 tanh(__m256 x) {
  __m256 ax = abs(x);
  __m256 e = exp(_mm256_add_ps(ax, ax));
  __m256 big =
      _mm256_sub_ps(_mm256_set1_ps(1.f), _mm256_div_ps(_mm256_set1_ps(2.f), _mm256_add_ps(e, _mm256_set1_ps(1.f))));
  big = _mm256_or_ps(big, _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))));
  __m256 z = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(-5.70498872745E-3f);
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954E-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531E-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036E-1f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422E-1f));
  __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
  return _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
}

KILN_TARGET_AVX2 KILN_INLINE __m256 gelu_erf(__m256 x) {
  __m256 z = _mm256_mul_ps(abs(x), _mm256_set1_ps(0.70710678118654752f));
  __m256 t = _mm256_div_ps(_mm256_set1_ps(1.f), _mm256_fmadd_ps(z, _mm256_set1_ps(0.3275911f), _mm256_set1_ps(1.f)));
  __m256 p = _mm256_set1_ps(1.061405429f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
  __m256 q = _mm256_mul_ps(_mm256_mul_ps(p, t), exp(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(z, z))));
  __m256 f =
      _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(2.f), q), q, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), f);
}

KILN_TARGET_AVX2 KILN_INLINE __m256 activate_cheap(__m256 x, const Activation& a) {
  switch (a.kind) {
    case ActKind::kRelu: return _mm256_max_ps(_mm256_setzero_ps(), x);
    case ActKind::kLeakyRelu:
      return _mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(a.alpha)),
                              _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
    case ActKind::kClip: return _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(a.lo)), _mm256_set1_ps(a.hi));
    case ActKind::kHardSwish: {
      __m256 g = _mm256_fmadd_ps(x, _mm256_set1_ps(1.f / 6.f), _mm256_set1_ps(0.5f));
      return _mm256_mul_ps(x, _mm256_min_ps(_mm256_max_ps(g, _mm256_setzero_ps()), _mm256_set1_ps(1.f)));
    }
    default: return x;
  }
}

KILN_TARGET_AVX2 KILN_INLINE __m256 activate(__m256 x, const Activation& a) {
  switch (a.kind) {
    case ActKind::kNone: return x;
    case ActKind::kRelu: return _mm256_max_ps(_mm256_setzero_ps(), x);
    case ActKind::kLeakyRelu:
      return _mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(a.alpha)),
                              _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
    case ActKind::kSigmoid: return div_one_plus_exp_neg(_mm256_set1_ps(1.f), x);
    case ActKind::kTanh: return tanh(x);
    case ActKind::kHardSwish: {
      __m256 g = _mm256_fmadd_ps(x, _mm256_set1_ps(1.f / 6.f), _mm256_set1_ps(0.5f));
      g = _mm256_min_ps(_mm256_max_ps(g, _mm256_setzero_ps()), _mm256_set1_ps(1.f));
      return _mm256_mul_ps(x, g);
    }
    case ActKind::kClip: return _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(a.lo)), _mm256_set1_ps(a.hi));
    case ActKind::kSiLU: return div_one_plus_exp_neg(x, x);
    case ActKind::kGeluErf: return gelu_erf(x);
    case ActKind::kGeluTanh: {
      __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
      __m256 u = _mm256_mul_ps(_mm256_fmadd_ps(x3, _mm256_set1_ps(0.044715f), x), _mm256_set1_ps(1.5957691216057308f));
      return div_one_plus_exp_neg(x, u);
    }
  }
  return x;
}

// Lanes [0, n) of 8 set (n in [0, 8]), for maskload/maskstore.
KILN_TARGET_AVX2 KILN_INLINE __m256i tail_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

}  // namespace avx2

}  // namespace kiln::backends::cpu
