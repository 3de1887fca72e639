// kiln's own CPU tactics (vectorized kernels of this directory, AVX-512 / AVX2 / scalar chosen at
// prepare time by cpu_isa()). Compiled whether or not oneDNN is found.
#pragma once

#include <string>

#include "backends/tactic.h"
#include "core/status.h"

namespace kiln::backends::cpu {

// MatMul / Gemm / kiln.FusedMatMul / kiln.FusedGemm with a 2-D constant B (packed once).
const Tactic* gemm_kiln_packed();
// Conv / kiln.FusedConv, 1x1 kernel, any stride, no padding, one group: a GEMM per image.
const Tactic* conv2d_kiln_1x1();
// Conv / kiln.FusedConv, depthwise (group == C == M), any kernel, stride, pads, dilation 1.
const Tactic* conv2d_kiln_depthwise();
// MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool on 4-D NCHW.
const Tactic* pool2d_kiln_nchw();
// Resize / Upsample on float32 X resizing its last two axes at most: every mode and coordinate transform.
const Tactic* resize_kiln();
// Where (any 1/2/4/8-byte dtype), comparisons, And/Or/Xor/Not, IsNaN/IsInf with broadcasting.
const Tactic* logic_kiln();
// Cast / CastLike between float32/float64/int64/int32/int16/int8/uint8/bool.
const Tactic* cast_kiln();
// ReduceSum/Mean/Max/Min/Prod/SumSquare/L1/L2/LogSum/LogSumExp on float32, the reduced axes one block.
const Tactic* reduce_kiln();
// Transpose / Slice / Split / Expand / Tile / Pad (every mode) / Concat / Gather as copies of contiguous runs.
const Tactic* movement_kiln();
// Detection post-processing (detection_tactic.cc, index_tactic.cc), the reference kernels' exact results:
// NonMaxSuppression and RoiAlign on float32; TopK on float32; GatherND; NonZero; ScatterElements with
// every reduction; ConstantOfShape and Expand with a shape computed at run time. NonMaxSuppression,
// NonZero, ConstantOfShape, Expand and TopK with a computed K allocate their outputs once they know
// the shape (engine/executor.h).
const Tactic* nms_kiln();
const Tactic* roi_align_kiln();
const Tactic* topk_kiln();
const Tactic* gather_nd_kiln();
const Tactic* nonzero_kiln();
const Tactic* scatter_elements_kiln();
const Tactic* fill_kiln();

// Concat of 5-D channel-blocked values along axis 1 (the Concat layout_blocked keeps blocked).
const Tactic* concat_blocked_kiln();
// Mul of a 5-D channel-blocked map [N, Cb, H, W, B] by a [N, Cb, 1, 1, B] scale (squeeze-excite).
const Tactic* scale_channels_blocked_kiln();

// "" when the layer is a float32 CPU layer (every present input float32, computing in float32).
std::string float32_cpu_layer(const LayerSignature& sig);
// The checks every 2-D Conv / kiln.FusedConv tactic shares: a float32 CPU layer, X 4-D, W a 4-D
// constant, B a constant of M elements, the residual 4-D. Empty: those hold; else why not.
std::string conv2d_layer_unsupported(const LayerSignature& sig);
// The same for a convolution over `spatial` dims (X, W and the residual of rank spatial + 2).
std::string conv_layer_unsupported(const LayerSignature& sig, size_t spatial);
// Empty when the layer has no residual (input 3 of kiln's fused layers), its shape is not known yet,
// or it is the output's shape `out`; else why not (tactics do not broadcast it).
std::string residual_unsupported(const LayerSignature& sig, const Dims& out);

// Gemm or kiln.FusedGemm (else MatMul or kiln.FusedMatMul).
bool is_gemm_layer(const LayerSignature& sig);
// The operand checks every MatMul / Gemm tactic shares once A and B are known: Gemm's A 2-D and C
// (if any) a constant of rank 2 at most; a fused MatMul's bias a constant of N elements along the
// last axis. Empty: those hold; else why not.
std::string gemm_bias_unsupported(const LayerSignature& sig);
// A MatMul / Gemm layer's geometry: Gemm's transA, transB, alpha and beta (MatMul: none, 1 and 1),
// M (A's leading dims flattened for MatMul), K, N and the output shape.
struct GemmGeometry {
  bool gemm = false, trans_a = false, trans_b = false;
  float alpha = 1.f, beta = 1.f;
  int64_t m = 0, k = 0, n = 0;
  Dims out_shape;
};
// B is [K, N] ([N, K] under transB), or with `batched_b` B's last two dims are [K, N]. Unsupported,
// naming `tactic`, when the inner dims differ, an operand is empty or the residual (input 3) is not
// the output's shape.
Result<GemmGeometry> gemm_geometry(const LayerSignature& sig, const std::string& tactic, bool batched_b = false);

}  // namespace kiln::backends::cpu
