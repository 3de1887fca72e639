// kiln's INT8 tactics for the quantized CNN layers that src/passes/fold_qdq_conv.cc makes
// (kiln.QConv, kiln.QPool) and the QuantizeLinear / DequantizeLinear at their boundaries.
#pragma once

#include "backends/tactic.h"

namespace kiln::backends::cpu {

namespace onednn {
// kiln.QConv through oneDNN's u8/s8 x s8 convolution, channels-last (onednn_int8_conv.cc).
const Tactic* conv2d_onednn_int8_nhwc();
// The same without AMX kernels (VNNI), timed against it where the CPU has AMX.
const Tactic* conv2d_onednn_int8_nhwc_vnni();
// kiln.QPool MaxPool on the integers (equal input and output quantization), oneDNN's pooling.
const Tactic* pool2d_onednn_int8_nhwc();
}  // namespace onednn

// kiln.QPool on channels-last 8-bit values (int8_pool_quant.cc).
const Tactic* pool2d_kiln_int8_nhwc();
// Per-tensor QuantizeLinear (float32 -> uint8/int8) and DequantizeLinear (uint8/int8 -> float32).
const Tactic* quantize_linear_kiln();
// kiln.QuantizeChannelsLast: the input's QuantizeLinear and the Transpose into the channels-last region.
const Tactic* quantize_channels_last_kiln();

}  // namespace kiln::backends::cpu
