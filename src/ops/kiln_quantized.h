// kiln's internal quantized layers, made by src/passes/fold_qdq_conv.cc from QuantizeLinear /
// DequantizeLinear patterns (the Q/DQ format of ONNX Runtime's quantize_static and PyTorch's
// exporter): kiln.QConv (convolution, or a Gemm as a 1x1 convolution on [N, C]) and kiln.QPool
// (MaxPool / AveragePool / GlobalAveragePool). Their scales and zero points are attributes, so the
// backends (CPU now, CUDA later) read one description. Their reference kernels (kiln_quantized.cc)
// define the results; the fast kernels match them to one unit of the output's quantization step.
//
// kiln.QConv: inputs x (uint8/int8), w (int8 [M, C/group, k...], zero point 0), optional bias (int32
// [M], in units of x_scale * w_scale[m]), optional residual (the output's shape, uint8/int8). Real
// value of the output before quantization:
//   v = (sum (x - x_zero_point) * w + bias) * x_scale * w_scales[m]
//   v = inner_scale * (saturate(round_half_even(v / inner_scale) + inner_zero_point) - inner_zero_point)
//                                       (with inner_scale: the conv's own Q, kept when a residual is folded)
//       + residual_scale * (residual - residual_zero_point)           (when the residual is present)
//   v = activation(v)                                                  ("", "Relu" or "Clip")
//   y = saturate(round_half_even(v / y_scale) + y_zero_point)          (y_type: uint8 or int8)
// channels_last 1: x, residual and y are [N, spatial..., C] (w stays [M, C/group, k...]); a rank-2 x
// [N, C] is a Gemm's A (a 1x1 convolution, W [M, C, 1, 1]).
//
// kiln.QuantizeChannelsLast: QuantizeLinear (per-tensor y_scale, y_zero_point, y_type) of a float32
// [N, C, spatial...] x written as [N, spatial..., C]: the entry of the channels-last INT8 region in one pass.
//
// kiln.QPool: input x (uint8/int8), attribute mode (MaxPool, AveragePool, GlobalAveragePool) and the
// pool's window attributes; y = saturate(round_half_even(pool(x_scale * (x - x_zero_point)) / y_scale)
// + y_zero_point). MaxPool with equal scales and zero points is the max of the integers (exact).
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"
#include "ir/graph.h"

namespace kiln::ops {

struct QuantizedLayerParams {
  float x_scale = 1, y_scale = 1, residual_scale = 1, inner_scale = 0;
  int64_t x_zero_point = 0, y_zero_point = 0, residual_zero_point = 0, inner_zero_point = 0;
  DataType inner_type = DataType::kUInt8;  // with inner_scale > 0: the conv's own quantization
  std::vector<float> w_scales;             // kiln.QConv: one per output channel, or one for all
  DataType y_type = DataType::kUInt8;
  std::string activation;  // "", "Relu" or "Clip" (kiln.QConv)
  float activation_min = 0, activation_max = 0;
  bool channels_last = false;
  std::string mode;  // kiln.QPool

  float w_scale(int64_t m) const { return w_scales.size() == 1 ? w_scales[0] : w_scales[static_cast<size_t>(m)]; }
  // The saturation range of y_type.
  int64_t y_min() const { return y_type == DataType::kInt8 ? -128 : 0; }
  int64_t y_max() const { return y_type == DataType::kInt8 ? 127 : 255; }
  bool has_inner() const { return inner_scale > 0; }
  int64_t inner_min() const { return inner_type == DataType::kInt8 ? -128 : 0; }
  int64_t inner_max() const { return inner_type == DataType::kInt8 ? 127 : 255; }
};

// Reads the attributes of a kiln.QConv / kiln.QPool node (unset ones keep the defaults above).
QuantizedLayerParams quantized_layer_params(const ir::Node& n);

// Whether `n` is one of kiln's quantized layers (they compute in int8 whatever the build's precision).
bool is_kiln_quantized_layer(const ir::Node& n);
// QuantizeLinear's rounding of x / scale (float division, ties to even, saturated to [lo, hi]).
inline float quantize_value(float x, float scale, float zero_point, float lo, float hi) {
  float q = x / scale;
  q = q == q ? q : 0.f;  // NaN -> 0
  // Clamped to +-512 (beyond the saturation either way): adding and subtracting 1.5 * 2^23 then rounds
  // in the default rounding mode (ties to even) without a call.
  q = q > 512.f ? 512.f : q < -512.f ? -512.f : q;
  q = (q + 12582912.f) - 12582912.f + zero_point;
  return q > hi ? hi : q < lo ? lo : q;
}

// [N, C, spatial...] <-> [N, spatial..., C]
Dims to_channels_last(const Dims& nchw);
Dims to_channels_first(const Dims& nhwc);

}  // namespace kiln::ops
