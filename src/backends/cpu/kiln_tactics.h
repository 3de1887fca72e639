// kiln's own CPU tactics (vectorized kernels of this directory, AVX-512 / AVX2 / scalar chosen at
// prepare time by cpu_isa()). Compiled whether or not oneDNN is found.
#pragma once

#include <string>

#include "backends/tactic.h"

namespace kiln::backends::cpu {

// MatMul / Gemm / kiln.FusedMatMul / kiln.FusedGemm with a 2-D constant B (packed once).
const Tactic* gemm_kiln_packed();
// Conv / kiln.FusedConv, 1x1 kernel, any stride, no padding, one group: a GEMM per image.
const Tactic* conv2d_kiln_1x1();
// Conv / kiln.FusedConv, depthwise (group == C == M), any kernel, stride, pads, dilation 1.
const Tactic* conv2d_kiln_depthwise();
// MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool on 4-D NCHW.
const Tactic* pool2d_kiln_nchw();

// "" when the layer is a float32 CPU layer (every present input float32, computing in float32).
std::string float32_cpu_layer(const LayerSignature& sig);
// The checks every 2-D Conv / kiln.FusedConv tactic shares: a float32 CPU layer, X 4-D, W a 4-D
// constant, B a constant of M elements, the residual 4-D. Empty: those hold; else why not.
std::string conv2d_layer_unsupported(const LayerSignature& sig);

}  // namespace kiln::backends::cpu
