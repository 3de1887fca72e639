// The quantizer and the epilogue of the INT8 linear layers (see int8_matmul_kernels.h for what they
// compute and why it is bit-exact). Compiled with -ffp-contract=off (CMakeLists.txt).
#include "backends/cpu/int8_matmul_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "backends/cpu/gemm_kernels.h"
#include "core/parallel.h"
#include "ops/kiln_quantized.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace kiln::backends::cpu {
namespace {

constexpr int64_t kMaxChunks = 64;

// [min(x, 0), max(x, 0)] of x[0, n) as the reference's loop computes it (NaN ignored).
void range_scalar(const float* x, int64_t n, float* lo, float* hi) {
  float mx = 0.f, mn = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] > mx) mx = x[i];
    if (x[i] < mn) mn = x[i];
  }
  *lo = mn, *hi = mx;
}

void quantize_scalar(const float* x, int64_t n, float scale, float zp, uint8_t* q) {
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] / scale;
    float r = std::isnan(v) ? 0.0f : std::nearbyint(v) + zp;
    q[i] = static_cast<uint8_t>(std::min(255.0f, std::max(0.0f, r)));
  }
}

#if defined(__x86_64__)
// The AVX-512 paths (run only where cpu_isa() reports AVX-512; lambdas inside take the region's target).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")
// MAXPS/MINPS return the second operand when either is NaN or both are zeros: with the running value
// second, NaNs are skipped and -0 never replaces the initial +0, as in the scalar loop.
void range_avx512(const float* x, int64_t n, float* lo, float* hi) {
  __m512 mx = _mm512_setzero_ps(), mn = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    mx = _mm512_max_ps(v, mx);
    mn = _mm512_min_ps(v, mn);
  }
  if (i < n) {
    __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(k, x + i);
    mx = _mm512_mask_max_ps(mx, k, v, mx);
    mn = _mm512_mask_min_ps(mn, k, v, mn);
  }
  alignas(64) float a[16], b[16];
  _mm512_store_ps(a, mx);
  _mm512_store_ps(b, mn);
  float h = 0.f, l = 0.f;
  for (int j = 0; j < 16; ++j) {
    if (a[j] > h) h = a[j];
    if (b[j] < l) l = b[j];
  }
  *lo = l, *hi = h;
}

void quantize_avx512(const float* x, int64_t n, float scale, float zp, uint8_t* q) {
  const __m512 vs = _mm512_set1_ps(scale), vz = _mm512_set1_ps(zp), v0 = _mm512_setzero_ps(),
               v255 = _mm512_set1_ps(255.f);
  auto one = [&](__m512 v) {
    __m512 d = _mm512_div_ps(v, vs);
    __mmask16 ord = _mm512_cmp_ps_mask(d, d, _CMP_ORD_Q);
    __m512 r = _mm512_add_ps(_mm512_roundscale_ps(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
    r = _mm512_min_ps(_mm512_max_ps(r, v0), v255);
    r = _mm512_maskz_mov_ps(ord, r);
    return _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r));
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), one(_mm512_loadu_ps(x + i)));
  if (i < n) {
    __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm_mask_storeu_epi8(q + i, k, one(_mm512_maskz_loadu_ps(k, x + i)));
  }
}

// ops::quantize_value's steps: x / scale, NaN -> 0, clamped to +-512, rounded to nearest even, + zp, saturated.
void quantize_static_avx512(const float* x, int64_t n, float scale, float zp, uint8_t* q) {
  const __m512 vs = _mm512_set1_ps(scale), vz = _mm512_set1_ps(zp), v0 = _mm512_setzero_ps(),
               v255 = _mm512_set1_ps(255.f), vhi = _mm512_set1_ps(512.f), vlo = _mm512_set1_ps(-512.f);
  auto one = [&](__m512 v) {
    __m512 d = _mm512_div_ps(v, vs);
    d = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(d, d, _CMP_ORD_Q), d);
    d = _mm512_min_ps(_mm512_max_ps(d, vlo), vhi);
    __m512 r = _mm512_add_ps(_mm512_roundscale_ps(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
    r = _mm512_min_ps(_mm512_max_ps(r, v0), v255);
    return _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r));
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), one(_mm512_loadu_ps(x + i)));
  if (i < n) {
    __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm_mask_storeu_epi8(q + i, k, one(_mm512_maskz_loadu_ps(k, x + i)));
  }
}

void epilogue_row_avx512(const int32_t* acc, int64_t n, const Int8Epilogue& e, int32_t rs, int32_t* out_i, float* out_f,
                         const float* res) {
  const __m512i vrs = _mm512_set1_epi32(rs);
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 k = n - j >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
    __m512i t = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(k, acc + j), _mm512_maskz_loadu_epi32(k, e.comp + j));
    if (e.rowsum) t = _mm512_sub_epi32(t, _mm512_mullo_epi32(_mm512_maskz_loadu_epi32(k, e.b_zp + j), vrs));
    if (out_i) {
      _mm512_mask_storeu_epi32(out_i + j, k, t);
      continue;
    }
    __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(t), _mm512_maskz_loadu_ps(k, e.scale + j));
    if (e.bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(k, e.bias + j));
    if (res) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(k, res + j));
    _mm512_mask_storeu_ps(out_f + j, k, y);
  }
}
#pragma GCC pop_options
#endif

void epilogue_row_scalar(const int32_t* acc, int64_t n, const Int8Epilogue& e, int32_t rs, int32_t* out_i, float* out_f,
                         const float* res) {
  for (int64_t j = 0; j < n; ++j) {
    uint32_t t = static_cast<uint32_t>(acc[j]) - static_cast<uint32_t>(e.comp[j]);
    if (e.rowsum) t -= static_cast<uint32_t>(e.b_zp[j]) * static_cast<uint32_t>(rs);
    if (out_i) {
      out_i[j] = static_cast<int32_t>(t);
      continue;
    }
    float y = static_cast<float>(static_cast<int32_t>(t)) * e.scale[j];
    if (e.bias) y = y + e.bias[j];
    if (res) y = y + res[j];
    out_f[j] = y;
  }
}

void epilogue(Isa isa, const int32_t* acc, int64_t m, int64_t n, const Int8Epilogue& e, int32_t* out_i, float* out_f) {
  parallel_for(m, std::max<int64_t>(1, 8192 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      const int32_t rs = e.rowsum ? e.rowsum[i] : 0;
      int32_t* oi = out_i ? out_i + i * n : nullptr;
      float* of = out_f ? out_f + i * n : nullptr;
      const float* res = e.residual ? e.residual + i * n : nullptr;
#if defined(__x86_64__)
      if (isa == Isa::kAvx512)
        epilogue_row_avx512(acc + i * n, n, e, rs, oi, of, res);
      else
#endif
        epilogue_row_scalar(acc + i * n, n, e, rs, oi, of, res);
      if (of) activate_inplace(isa, of, n, e.act);
    }
  });
}

}  // namespace

void quantize_static_u8(Isa isa, const float* x, int64_t n, float scale, uint8_t zero_point, uint8_t* q) {
  const float zp = static_cast<float>(zero_point);
  parallel_for(n, 1 << 14, [=](int64_t b, int64_t e) {
#if defined(__x86_64__)
    if (isa == Isa::kAvx512) {
      quantize_static_avx512(x + b, e - b, scale, zp, q + b);
      return;
    }
#endif
    for (int64_t i = b; i < e; ++i) q[i] = static_cast<uint8_t>(ops::quantize_value(x[i], scale, zp, 0.f, 255.f));
  });
}

// One parallel region (the range, a barrier, the quantization, and the row sums after another barrier):
// every region wakes the team, which costs most on a busy machine.
Status quantize_dynamic_u8(Isa isa, const float* x, int64_t m, int64_t k, uint8_t* q, int32_t* rowsum, float* scale_out,
                           uint8_t* zp_out, const char* what) {
  const int64_t n = m * k;
  int64_t nt = 1;
#if defined(_OPENMP)
  if (!omp_in_parallel()) nt = std::min<int64_t>({max_threads(), kMaxChunks, std::max<int64_t>(1, n / 16384)});
#endif
  std::array<float, kMaxChunks> lo{}, hi{};
  float scale = 1.f, zp = 0.f;
  bool inf = false;
  // team 1 runs without barriers: an orphaned barrier would bind to an enclosing parallel region.
  auto body = [&](int64_t t, int64_t team) {
    const int64_t i0 = n * t / team, i1 = n * (t + 1) / team;
#if defined(__x86_64__)
    if (isa == Isa::kAvx512)
      range_avx512(x + i0, i1 - i0, &lo[static_cast<size_t>(t)], &hi[static_cast<size_t>(t)]);
    else
#endif
      range_scalar(x + i0, i1 - i0, &lo[static_cast<size_t>(t)], &hi[static_cast<size_t>(t)]);
    if (team > 1) {
#pragma omp barrier
    }
    float maxx = 0.f, minx = 0.f;  // every thread combines the same partials in the same order
    for (int64_t c = 0; c < team; ++c) {
      if (hi[static_cast<size_t>(c)] > maxx) maxx = hi[static_cast<size_t>(c)];
      if (lo[static_cast<size_t>(c)] < minx) minx = lo[static_cast<size_t>(c)];
    }
    if (std::isinf(maxx) || std::isinf(minx)) {
      if (t == 0) inf = true;
      return;  // every thread returns here: no barrier below is reached
    }
    // The reference's arithmetic, step by step (src/ops/quantize.cc, DynamicQuantizeLinear).
    const float qmin = 0.0f, qmax = 255.0f;
    const float s = (maxx == minx ? 1.0f : (maxx - minx)) / (qmax - qmin);
    const float initial_zp = qmin - minx / s;
    const float z = std::nearbyint(std::min(qmax, std::max(qmin, initial_zp)));
    if (t == 0) scale = s, zp = z;
#if defined(__x86_64__)
    if (isa == Isa::kAvx512)
      quantize_avx512(x + i0, i1 - i0, s, z, q + i0);
    else
#endif
      quantize_scalar(x + i0, i1 - i0, s, z, q + i0);
    if (!rowsum) return;
    if (team > 1) {
#pragma omp barrier
    }
    for (int64_t i = m * t / team; i < m * (t + 1) / team; ++i) {
      int32_t sum = 0;
      for (int64_t p = 0; p < k; ++p) sum += q[i * k + p];
      rowsum[i] = sum;
    }
  };
#if defined(_OPENMP)
  if (nt > 1) {
#pragma omp parallel num_threads(static_cast <int>(nt))
    body(omp_get_thread_num(), omp_get_num_threads());
  } else {
    body(0, 1);
  }
#else
  body(0, 1);
#endif
  if (inf)
    return InvalidArgument(what, ": the activation contains infinite values; no finite quantization scale exists");
  *scale_out = scale;
  *zp_out = static_cast<uint8_t>(zp);
  return Status::Ok();
}

void row_sums_u8(const uint8_t* q, int64_t m, int64_t k, int32_t* rowsum) {
  parallel_for(m, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int32_t s = 0;
      for (int64_t p = 0; p < k; ++p) s += q[i * k + p];
      rowsum[i] = s;
    }
  });
}

void int8_epilogue_requantize(const int32_t* acc, int64_t m, int64_t n, const Int8Epilogue& e, const float* mult,
                              int32_t y_zp, bool out_signed, void* out) {
  const double lo = out_signed ? -128.0 : 0.0, hi = out_signed ? 127.0 : 255.0, yz = y_zp;
  parallel_for(m, std::max<int64_t>(1, 8192 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      const int32_t rs = e.rowsum ? e.rowsum[i] : 0;
      for (int64_t j = 0; j < n; ++j) {
        uint32_t t = static_cast<uint32_t>(acc[i * n + j]) - static_cast<uint32_t>(e.comp[j]);
        if (e.rowsum) t -= static_cast<uint32_t>(e.b_zp[j]) * static_cast<uint32_t>(rs);
        double d = static_cast<double>(static_cast<int32_t>(t)) * static_cast<double>(mult[j]) + yz;
        double r = std::min(std::max(std::isnan(d) ? yz : std::nearbyint(d), lo), hi);
        if (out_signed)
          static_cast<int8_t*>(out)[i * n + j] = static_cast<int8_t>(r);
        else
          static_cast<uint8_t*>(out)[i * n + j] = static_cast<uint8_t>(r);
      }
    }
  });
}

void int8_epilogue_s32(Isa isa, const int32_t* acc, int64_t m, int64_t n, const Int8Epilogue& e, int32_t* out) {
  epilogue(isa, acc, m, n, e, out, nullptr);
}

void int8_epilogue_f32(Isa isa, const int32_t* acc, int64_t m, int64_t n, const Int8Epilogue& e, float* out) {
  epilogue(isa, acc, m, n, e, nullptr, out);
}

}  // namespace kiln::backends::cpu
