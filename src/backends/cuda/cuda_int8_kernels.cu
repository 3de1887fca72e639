// The INT8 kernels of cuda_int8_kernels.h. One thread per output element, grid-stride loops. The
// requantization runs in double with explicitly rounded operations (__dmul_rn, __dadd_rn, IEEE
// division and rint: ties to even), so no multiply-add is contracted into an FMA that the reference's
// host arithmetic does not do: the results are the reference's bit for bit.
#include <math.h>

#include "backends/cuda/cuda_int8_kernels.h"

namespace kiln::backends::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 8 ? (b < 1 ? 1 : b) : 65535 * 8);
}

__device__ __forceinline__ int32_t load8(const void* p, int64_t i, bool is_signed) {
  return is_signed ? static_cast<int32_t>(static_cast<const int8_t*>(p)[i])
                   : static_cast<int32_t>(static_cast<const uint8_t*>(p)[i]);
}
__device__ __forceinline__ void store8(void* p, int64_t i, double q, bool is_signed) {
  if (is_signed)
    static_cast<int8_t*>(p)[i] = static_cast<int8_t>(static_cast<int32_t>(q));
  else
    static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int32_t>(q));
}

// rint(v / scale) + zp saturated to [lo, hi]; NaN gives zp's saturation of 0 (the reference's q = 0).
__device__ __forceinline__ double quantize_d(double v, double scale, double zp, double lo, double hi) {
  double q = __ddiv_rn(v, scale);
  if (isnan(q)) q = 0;
  q = __dadd_rn(rint(q), zp);
  return fmin(hi, fmax(lo, q));
}

// The reference's steps after the accumulator (kiln_quantized.cc qconv_kernel).
__device__ __forceinline__ double requantize_acc(int64_t acc, int64_t m, const void* residual, int64_t at,
                                                 const QEpilogue& e) {
  double v = __dmul_rn(static_cast<double>(acc), e.scale[m]);
  if (e.inner_scale > 0) {
    const double q = quantize_d(v, e.inner_scale, e.inner_zp, e.inner_lo, e.inner_hi);
    v = __dmul_rn(e.inner_scale, __dadd_rn(q, -e.inner_zp));
  }
  if (residual) {
    const double r = static_cast<double>(load8(residual, at, e.residual_signed));
    v = __dadd_rn(v, __dmul_rn(e.residual_scale, __dadd_rn(r, -e.residual_zp)));
  }
  if (e.act == QAct::kRelu) v = fmax(v, 0.0);
  if (e.act == QAct::kClip) v = fmin(e.act_hi, fmax(e.act_lo, v));
  return quantize_d(v, e.y_scale, e.y_zp, e.y_lo, e.y_hi);
}

__device__ __forceinline__ int32_t dp4a_x(uint32_t x, int32_t w, int32_t acc, bool x_signed) {
  if (x_signed) return __dp4a(static_cast<int32_t>(x), w, acc);
  int32_t d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(x), "r"(w), "r"(acc));
  return d;
}

// w: vec ? int32 words [kh*kw, C/g/4, M] (4 channels each) : bytes [kh*kw, C/g, M], so consecutive
// threads (consecutive m) read consecutive weights.
__global__ void qconv_direct_kernel(const void* __restrict__ x, bool x_signed, int32_t x_zp,
                                    const int8_t* __restrict__ w, const void* __restrict__ residual,
                                    void* __restrict__ y, QConvGeometry g, QEpilogue e, bool vec, bool vec_loads) {
  const int64_t total = g.n * g.oh * g.ow * g.m;
  const int64_t cpg = g.c / g.group, mpg = g.m / g.group, cpg4 = cpg / 4;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t m, ox, oy, b;
    if (g.channels_last) {
      m = i % g.m;
      const int64_t pix = i / g.m;
      ox = pix % g.ow, oy = (pix / g.ow) % g.oh, b = pix / (g.ow * g.oh);
    } else {
      ox = i % g.ow, oy = (i / g.ow) % g.oh, m = (i / (g.ow * g.oh)) % g.m, b = i / (g.ow * g.oh * g.m);
    }
    const int64_t c0 = (m / mpg) * cpg;
    int32_t acc = 0, wsum = 0;
    for (int64_t a = 0; a < g.kh; ++a) {
      const int64_t iy = oy * g.sh + a * g.dh - g.ph;
      if (iy < 0 || iy >= g.h) continue;
      for (int64_t t = 0; t < g.kw; ++t) {
        const int64_t ix = ox * g.sw + t * g.dw - g.pw;
        if (ix < 0 || ix >= g.w) continue;
        const int64_t tap = a * g.kw + t;
        if (vec_loads) {  // channels-last, C/g and C multiples of 4, x 4-byte aligned
          const uint32_t* px = reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(x) +
                                                                 ((b * g.h + iy) * g.w + ix) * g.c + c0);
          const int32_t* pw = reinterpret_cast<const int32_t*>(w) + tap * cpg4 * g.m + m;
          for (int64_t k = 0; k < cpg4; ++k) {
            const int32_t wv = __ldg(pw + k * g.m);
            acc = dp4a_x(__ldg(px + k), wv, acc, x_signed);
            wsum = __dp4a(wv, 0x01010101, wsum);
          }
        } else {
          for (int64_t k = 0; k < cpg; ++k) {
            const int64_t xi = g.channels_last ? ((b * g.h + iy) * g.w + ix) * g.c + c0 + k
                                               : ((b * g.c + c0 + k) * g.h + iy) * g.w + ix;
            const int64_t wi = vec ? ((tap * cpg4 + (k >> 2)) * g.m + m) * 4 + (k & 3) : (tap * cpg + k) * g.m + m;
            const int32_t wv = w[wi];
            acc += load8(x, xi, x_signed) * wv;
            wsum += wv;
          }
        }
      }
    }
    const int64_t total_acc =
        static_cast<int64_t>(acc) - static_cast<int64_t>(x_zp) * wsum + (e.comp ? static_cast<int64_t>(e.comp[m]) : 0);
    store8(y, i, requantize_acc(total_acc, m, residual, i, e), e.y_signed);
  }
}

__global__ void qepilogue_kernel(const void* __restrict__ acc, bool acc_int, const void* __restrict__ residual,
                                 void* __restrict__ y, int64_t rows, int64_t m_count, QEpilogue e) {
  const int64_t total = rows * m_count;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i % m_count;
    int64_t a = acc_int ? static_cast<int64_t>(static_cast<const int32_t*>(acc)[i])
                        : __float2ll_rn(static_cast<const float*>(acc)[i]);
    if (e.comp) a += e.comp[m];
    store8(y, i, requantize_acc(a, m, residual, i, e), e.y_signed);
  }
}

// Four channels per thread (M a multiple of 4, 16-byte aligned float acc, 4-byte aligned y and
// residual): one float4 load and one 4-byte store.
__global__ void qepilogue4_kernel(const float4* __restrict__ acc, const void* __restrict__ residual,
                                  uint32_t* __restrict__ y, int64_t rows, int64_t m_count, QEpilogue e) {
  const int64_t m4 = m_count / 4, total = rows * m4;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = (i % m4) * 4, at = i * 4;
    const float4 a = acc[i];
    const float v[4] = {a.x, a.y, a.z, a.w};
    uint32_t out = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      int64_t q = __float2ll_rn(v[k]);
      if (e.comp) q += e.comp[m + k];
      const int32_t b = static_cast<int32_t>(requantize_acc(q, m + k, residual, at + k, e));
      out |= (static_cast<uint32_t>(b) & 0xFFu) << (8 * k);
    }
    y[i] = out;
  }
}

__global__ void int8_pad_shift_kernel(const void* __restrict__ x, int8_t* __restrict__ out, int32_t shift, int8_t fill,
                                      int64_t n, int64_t h, int64_t w, int64_t c, int64_t ph, int64_t pw, int64_t out_h,
                                      int64_t out_w, int64_t out_c) {
  const int64_t total = n * out_h * out_w * out_c;
  const bool is_signed = shift == 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ch = i % out_c, pix = i / out_c;
    const int64_t ox = pix % out_w, oy = (pix / out_w) % out_h, b = pix / (out_w * out_h);
    const int64_t iy = oy - ph, ix = ox - pw;
    int8_t v = fill;
    if (ch >= c)
      v = 0;  // a padding channel (its weights are 0)
    else if (iy >= 0 && iy < h && ix >= 0 && ix < w)
      v = static_cast<int8_t>(load8(x, ((b * h + iy) * w + ix) * c + ch, is_signed) - shift);
    out[i] = v;
  }
}

__global__ void qpool_kernel(const void* __restrict__ x, void* __restrict__ y, QPoolParams p) {
  const int64_t total = p.n * p.oh * p.ow * p.c;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ch = i % p.c, pix = i / p.c;
    const int64_t ox = pix % p.ow, oy = (pix / p.ow) % p.oh, b = pix / (p.ow * p.oh);
    int64_t best = INT64_MIN, sum = 0, count = 0;
    for (int64_t a = 0; a < p.kh; ++a) {
      const int64_t iy = oy * p.sh + a * p.dh - p.ph;
      if (iy < 0 || iy >= p.h) continue;
      for (int64_t t = 0; t < p.kw; ++t) {
        const int64_t ix = ox * p.sw + t * p.dw - p.pw;
        if (ix < 0 || ix >= p.w) continue;
        const int64_t v = load8(x, ((b * p.h + iy) * p.w + ix) * p.c + ch, p.x_signed) - p.x_zp;
        best = v > best ? v : best;
        sum += v, ++count;
      }
    }
    double v = 0;
    if (count) {
      v = p.max ? __dmul_rn(static_cast<double>(best), p.x_scale)
                : __ddiv_rn(__dmul_rn(static_cast<double>(sum), p.x_scale), static_cast<double>(count));
    }
    store8(y, i, quantize_d(v, p.y_scale, p.y_zp, p.y_lo, p.y_hi), p.y_signed);
  }
}

__global__ void quantize_kernel(const float* __restrict__ x, void* __restrict__ y, bool y_signed, float scale, float zp,
                                int64_t n, int64_t c, int64_t inner, bool channels_last) {
  const int64_t total = n * c * inner;
  const float lo = y_signed ? -128.f : 0.f, hi = y_signed ? 127.f : 255.f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t src = i;
    if (channels_last) {  // i walks the output [N, inner, C]
      const int64_t ch = i % c, p = (i / c) % inner, b = i / (c * inner);
      src = (b * c + ch) * inner + p;
    }
    float q = __fdiv_rn(x[src], scale);
    q = q == q ? q : 0.f;
    q = q > 512.f ? 512.f : q < -512.f ? -512.f : q;  // beyond the saturation either way
    q = __fadd_rn(rintf(q), zp);
    q = q > hi ? hi : q < lo ? lo : q;
    store8(y, i, static_cast<double>(q), y_signed);
  }
}

__global__ void dequantize_kernel(const void* __restrict__ x, bool x_signed, float* __restrict__ y, float scale,
                                  int32_t zp, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __fmul_rn(static_cast<float>(load8(x, i, x_signed) - zp), scale);
}

// One thread per output; consecutive threads on consecutive columns j (B's rows read coalesced).
__global__ void qmatmul_kernel(const void* __restrict__ x, const void* __restrict__ b, const int32_t* __restrict__ b_zp,
                               const float* __restrict__ scale, const float* __restrict__ bias,
                               const float* __restrict__ residual, float* __restrict__ y, QMatMulParams p) {
  const int64_t total = p.rows * p.n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i % p.n, r = i / p.n;
    const int32_t bz = b_zp ? b_zp[j] : 0;
    int32_t acc = 0;
    for (int64_t k = 0; k < p.k; ++k) {
      int32_t q;
      if (p.x_float) {
        float f = __fdiv_rn(static_cast<const float*>(x)[r * p.k + k], p.x_scale);
        f = f == f ? f : 0.f;
        f = f > 512.f ? 512.f : f < -512.f ? -512.f : f;
        f = __fadd_rn(rintf(f), static_cast<float>(p.x_zp));
        q = static_cast<int32_t>(f > 255.f ? 255.f : f < 0.f ? 0.f : f);
      } else {
        q = static_cast<const uint8_t*>(x)[r * p.k + k];
      }
      acc += (q - p.x_zp) * (load8(b, k * p.n + j, p.b_signed) - bz);
    }
    float v = __fmul_rn(static_cast<float>(acc), scale[j]);
    if (bias) v = __fadd_rn(v, bias[j]);
    if (residual) v = __fadd_rn(v, residual[i]);
    if (p.relu) v = v > 0.f ? v : (v == v ? 0.f : v);
    y[i] = v;
  }
}

}  // namespace

cudaError_t launch_qconv_direct(const void* x, bool x_signed, int32_t x_zp, const int8_t* w, const void* residual,
                                void* y, const QConvGeometry& g, const QEpilogue& e, cudaStream_t s) {
  const int64_t total = g.n * g.oh * g.ow * g.m;
  const int64_t cpg = g.c / g.group;
  const bool vec = g.channels_last && cpg % 4 == 0 && g.c % 4 == 0;
  const bool vec_loads = vec && reinterpret_cast<uintptr_t>(x) % 4 == 0;
  qconv_direct_kernel<<<blocks_for(total), kThreads, 0, s>>>(x, x_signed, x_zp, w, residual, y, g, e, vec, vec_loads);
  return cudaGetLastError();
}

cudaError_t launch_qepilogue(const void* acc, bool acc_int, const void* residual, void* y, int64_t rows, int64_t m,
                             const QEpilogue& e, cudaStream_t s) {
  const bool aligned = reinterpret_cast<uintptr_t>(acc) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 4 == 0;
  if (!acc_int && m % 4 == 0 && aligned) {
    qepilogue4_kernel<<<blocks_for(rows * m / 4), kThreads, 0, s>>>(static_cast<const float4*>(acc), residual,
                                                                    static_cast<uint32_t*>(y), rows, m, e);
    return cudaGetLastError();
  }
  qepilogue_kernel<<<blocks_for(rows * m), kThreads, 0, s>>>(acc, acc_int, residual, y, rows, m, e);
  return cudaGetLastError();
}

cudaError_t launch_int8_pad_shift(const void* x, int8_t* out, int32_t shift, int8_t fill, int64_t n, int64_t h,
                                  int64_t w, int64_t c, int64_t ph, int64_t pw, int64_t out_h, int64_t out_w,
                                  int64_t out_c, cudaStream_t s) {
  int8_pad_shift_kernel<<<blocks_for(n * out_h * out_w * out_c), kThreads, 0, s>>>(x, out, shift, fill, n, h, w, c, ph,
                                                                                   pw, out_h, out_w, out_c);
  return cudaGetLastError();
}

cudaError_t launch_qpool(const void* x, void* y, const QPoolParams& p, cudaStream_t s) {
  qpool_kernel<<<blocks_for(p.n * p.oh * p.ow * p.c), kThreads, 0, s>>>(x, y, p);
  return cudaGetLastError();
}

cudaError_t launch_quantize(const float* x, void* y, bool y_signed, float scale, float zp, int64_t n, int64_t c,
                            int64_t inner, bool channels_last, cudaStream_t s) {
  quantize_kernel<<<blocks_for(n * c * inner), kThreads, 0, s>>>(x, y, y_signed, scale, zp, n, c, inner, channels_last);
  return cudaGetLastError();
}

cudaError_t launch_dequantize(const void* x, bool x_signed, float* y, float scale, int32_t zp, int64_t count,
                              cudaStream_t s) {
  dequantize_kernel<<<blocks_for(count), kThreads, 0, s>>>(x, x_signed, y, scale, zp, count);
  return cudaGetLastError();
}

cudaError_t launch_qmatmul(const void* x, const void* b, const int32_t* b_zp, const float* scale, const float* bias,
                           const float* residual, float* y, const QMatMulParams& p, cudaStream_t s) {
  qmatmul_kernel<<<blocks_for(p.rows * p.n), kThreads, 0, s>>>(x, b, b_zp, scale, bias, residual, y, p);
  return cudaGetLastError();
}

}  // namespace kiln::backends::cuda
