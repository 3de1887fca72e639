// kiln's own CUDA kernels of the INT8 CNN layers (cuda_int8_kernels.cu): kiln.QConv (a direct
// convolution with int32 accumulation and the requantization epilogue fused, and the epilogue alone
// after cuDNN's INT8 convolution), kiln.QPool, kiln.QuantizeChannelsLast, per-tensor QuantizeLinear /
// DequantizeLinear and kiln.QMatMul. Each follows its reference kernel's arithmetic step by step
// (ops/kiln_quantized.cc, ops/quantize.cc, ops/dyn_quant_matmul.cc): integer sums, then the
// requantization in double with round-half-even and saturation, so results are bit-exact with the
// reference (the tests allow the CPU tactics' contract: one unit of the output's step).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kiln::backends::cuda {

// The requantization of a kiln.QConv's int32 accumulator (ops/kiln_quantized.h), all on the device:
//   v = (acc + comp[m]) * scale[m]            (scale[m] = double(x_scale) * double(w_scale[m]), exact)
//   v = inner_scale * (sat(rint(v / inner_scale) + inner_zp) - inner_zp)     (has_inner)
//   v += residual_scale * (r - residual_zp)                                    (residual)
//   v = act(v); y = sat(rint(v / y_scale) + y_zp)
enum class QAct : int { kNone, kRelu, kClip };
struct QEpilogue {
  const double* scale = nullptr;  // [M] on the device
  const int32_t* comp = nullptr;  // [M] on the device: bias (+ the cuDNN path's zero point compensation); may be null
  double inner_scale = 0, inner_zp = 0, inner_lo = 0, inner_hi = 0;  // inner_scale > 0: has_inner
  double residual_scale = 1, residual_zp = 0;
  QAct act = QAct::kNone;
  double act_lo = 0, act_hi = 0;
  double y_scale = 1, y_zp = 0, y_lo = 0, y_hi = 255;
  bool y_signed = false, residual_signed = false;
};

// A 2-D kiln.QConv's geometry (a Gemm: h = w = kh = kw = 1). channels_last: x [N, H, W, C], y and the
// residual [N, OH, OW, M]; else [N, C, H, W] and [N, M, OH, OW]. The weight is KRSC, [M, kh, kw, C/g].
struct QConvGeometry {
  int64_t n = 1, c = 1, h = 1, w = 1, m = 1, oh = 1, ow = 1;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, ph = 0, pw = 0, group = 1;
  bool channels_last = true;
};

// The direct convolution: y = requant(sum over the window of (x - x_zp) * w), pad taps contributing 0.
cudaError_t launch_qconv_direct(const void* x, bool x_signed, int32_t x_zp, const int8_t* w, const void* residual,
                                void* y, const QConvGeometry& g, const QEpilogue& e, cudaStream_t s);

// The epilogue alone over [rows, M] channels-last: acc float (cuDNN's INT8_EXT output, exact integers)
// or int32 (`acc_int`).
cudaError_t launch_qepilogue(const void* acc, bool acc_int, const void* residual, void* y, int64_t rows, int64_t m,
                             const QEpilogue& e, cudaStream_t s);

// cuDNN's INT8 input: out[n, h + ph, w + pw, c] = x - shift (x int8 or uint8 NHWC, shift 128 for uint8,
// 0 for int8) inside, `fill` in the padding border, into [N, out_h, out_w, out_c] (out_c >= c: the
// channels from c on are 0, for weights padded with zeros to a multiple of 4 channels).
cudaError_t launch_int8_pad_shift(const void* x, int8_t* out, int32_t shift, int8_t fill, int64_t n, int64_t h,
                                  int64_t w, int64_t c, int64_t ph, int64_t pw, int64_t out_h, int64_t out_w,
                                  int64_t out_c, cudaStream_t s);

// kiln.QPool on channels-last [N, H, W, C] -> [N, OH, OW, C] (max: of the centered integers; avg: their
// sum over the taps inside / count), then y = sat(rint(v / y_scale) + y_zp).
struct QPoolParams {
  int64_t n = 1, h = 1, w = 1, c = 1, oh = 1, ow = 1, kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, ph = 0, pw = 0;
  bool max = false, x_signed = false, y_signed = false;
  int32_t x_zp = 0;
  double x_scale = 1, y_scale = 1, y_zp = 0, y_lo = 0, y_hi = 255;
};
cudaError_t launch_qpool(const void* x, void* y, const QPoolParams& p, cudaStream_t s);

// QuantizeLinear of float32 values (float division, NaN to 0, ties to even, + zp, saturated) into
// 8 bits; channels_last: x [N, C, inner] written as [N, inner, C] (kiln.QuantizeChannelsLast).
cudaError_t launch_quantize(const float* x, void* y, bool y_signed, float scale, float zp, int64_t n, int64_t c,
                            int64_t inner, bool channels_last, cudaStream_t s);
// DequantizeLinear: y = float(int32(x) - zp) * scale.
cudaError_t launch_dequantize(const void* x, bool x_signed, float* y, float scale, int32_t zp, int64_t count,
                              cudaStream_t s);

// kiln.QMatMul: y[r, j] = act(float(sum_k (q[r, k] - x_zp) * (b[k, j] - b_zp[j])) * scale[j] + bias[j]
// + residual[r, j]) with q = x (uint8) or QuantizeLinear(x, x_scale, x_zp) (float32 x); scale[j] =
// x_scale * BScale[j] in float, as the reference multiplies. b_zp, bias, residual may be null.
struct QMatMulParams {
  int64_t rows = 0, k = 0, n = 0;
  bool x_float = false, b_signed = true, relu = false;
  float x_scale = 1;
  int32_t x_zp = 0;
};
cudaError_t launch_qmatmul(const void* x, const void* b, const int32_t* b_zp, const float* scale, const float* bias,
                           const float* residual, float* y, const QMatMulParams& p, cudaStream_t s);

}  // namespace kiln::backends::cuda
