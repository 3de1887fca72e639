// The oneDNN tactics (compiled only when CMake found oneDNN: KILN_HAVE_ONEDNN).
#pragma once

#include "backends/tactic.h"

namespace kiln::backends::cpu::onednn {

const Tactic* conv2d_onednn_blocked();
// Conv / kiln.FusedConv over 1 and 3 spatial dims, ConvTranspose over 1 to 3 (onednn_conv.cc).
const Tactic* conv1d_onednn_blocked();
const Tactic* conv1d_onednn_ncw();
const Tactic* conv3d_onednn_blocked();
const Tactic* conv3d_onednn_ncdhw();
const Tactic* convtranspose_onednn_blocked();
const Tactic* convtranspose_onednn_plain();
const Tactic* matmul_onednn_packed();
const Tactic* matmul_onednn_batched();
const Tactic* pool1d_onednn_ncw();
const Tactic* pool2d_onednn_nchw();
const Tactic* pool3d_onednn_ncdhw();
// Channel-blocked activations (kiln.BlockedConv / BlockedPool / ReorderToBlocked / ReorderFromBlocked).
const Tactic* conv2d_onednn_nchwc_winograd();
const Tactic* conv2d_onednn_nchwc();
const Tactic* conv2d_onednn_nchwc_single_thread();  // small layers, timed against the threaded one
const Tactic* conv2d_onednn_nchwc_kiln_act();       // SiLU / GELU / Tanh by kiln after oneDNN's conv
const Tactic* pool2d_onednn_nchwc();
const Tactic* pool2d_onednn_nchwc_single_thread();  // small inputs, timed against the threaded one
const Tactic* reorder_onednn_nchwc();
const Tactic* conv2d_onednn_nchwc_dw();  // kiln.BlockedConvDw
// BF16 (AVX-512 BF16; onednn_bf16.cc): kiln.BlockedConv, and MatMul/Gemm with constant weights.
const Tactic* conv2d_onednn_nchwc_bf16();
const Tactic* matmul_onednn_bf16_packed();
// BF16 on channels-last bfloat16 storage (AMX targets: onednn_nhwc_bf16.cc)
const Tactic* conv2d_onednn_nhwc_bf16();
const Tactic* pool2d_onednn_nhwc_bf16();
const Tactic* matmul_onednn_bf16_io();
const Tactic* conv2d_onednn_nhwc();
const Tactic* pool2d_onednn_nhwc();

}  // namespace kiln::backends::cpu::onednn
