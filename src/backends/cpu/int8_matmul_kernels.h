// kiln's own pieces of the INT8 linear layers (int8_matmul_onednn.cc): the run-time quantization of
// a float activation as ONNX's DynamicQuantizeLinear defines it, and the epilogue that turns the
// u8 x s8 -> s32 product into MatMulInteger's int32 or the dequantized float32 output. Both equal
// the reference kernels (src/ops/quantize.cc, matmul.cc) bit for bit: the quantizer divides and
// rounds half to even as the reference does; the epilogue's integer zero-point compensation is
// modular int32 arithmetic (the reference's int64 sum truncated), its float steps are one rounded
// multiply and then one rounded add each (the file is compiled with -ffp-contract=off: no fused
// multiply-adds), except for the activation (GELU's vector erf is an approximation).
#pragma once

#include <cstdint>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernel_simd.h"
#include "core/status.h"

namespace kiln::backends::cpu {

// DynamicQuantizeLinear of x[0, m * k): the range [min(x, 0), max(x, 0)] mapped to [0, 255], scale
// (max - min) / 255 (1/255 for an all-zero x), zero point round(-min / scale); q = sat(round(x / scale)
// + zp), NaN -> 0; with `rowsum`, also the sums of q's rows of k. Fails (naming `what`) on infinite
// values, as the reference does. Runs on the thread team.
Status quantize_dynamic_u8(Isa isa, const float* x, int64_t m, int64_t k, uint8_t* q, int32_t* rowsum, float* scale,
                           uint8_t* zero_point, const char* what);

// QuantizeLinear of x[0, n) to uint8 with a fixed scale and zero point, as the reference computes it
// (ops::quantize_value: float division, ties to even, NaN -> the zero point, saturated). Runs on the
// thread team.
void quantize_static_u8(Isa isa, const float* x, int64_t n, float scale, uint8_t zero_point, uint8_t* q);

// rowsum[i] = sum of q[i * k + p] over p < k (the zero-point term of a non-zero weight zero point).
void row_sums_u8(const uint8_t* q, int64_t m, int64_t k, int32_t* rowsum);

// The layer's epilogue on the raw product acc[i * n + j] = sum_p a[i][p] * b[p][j], computed
// A - a_zp and B - b_zp[j]: t = acc - comp[j] - b_zp[j] * rowsum[i] (int32, wrapping), with
// comp[j] = a_zp * colsum[j] - k * a_zp * b_zp[j] given; rowsum null when every b_zp is 0.
struct Int8Epilogue {
  const int32_t* comp = nullptr;  // [n]
  const int32_t* b_zp = nullptr;  // [n] (null with rowsum)
  const int32_t* rowsum = nullptr;
  // Float output: y = float(t) * scale[j] (+ bias[j]) (+ residual[i * n + j]), then the activation.
  const float* scale = nullptr;  // [n]
  const float* bias = nullptr;   // [n] or null
  const float* residual = nullptr;
  Activation act;
};
// Requantized output (QLinearMatMul): out = sat(round(double(t) * mult[j] + y_zp)) into [lo, hi], in
// double as the reference computes it. `out` is uint8 or int8 (signed). Runs on the thread team.
void int8_epilogue_requantize(const int32_t* acc, int64_t m, int64_t n, const Int8Epilogue& e, const float* mult,
                              int32_t y_zp, bool out_signed, void* out);
// int32 output (MatMulInteger): out[i * n + j] = t. Runs on the thread team.
void int8_epilogue_s32(Isa isa, const int32_t* acc, int64_t m, int64_t n, const Int8Epilogue& e, int32_t* out);
// float32 output (kiln.DynQMatMul). Runs on the thread team.
void int8_epilogue_f32(Isa isa, const int32_t* acc, int64_t m, int64_t n, const Int8Epilogue& e, float* out);

}  // namespace kiln::backends::cpu
