// kiln's own tactics on channel-blocked activations (ops/kiln_layout.h), beside oneDNN's
// (onednn_nchwc.cc). Compiled whether or not oneDNN is found.
#pragma once

#include "backends/tactic.h"

namespace kiln::backends::cpu {

// kiln.BlockedConv, block 16: Winograd F(4x4, 3x3), 3x3 stride 1, channels multiples of 16 (AVX-512).
const Tactic* conv2d_winograd_f4x3_nchw16c();

}  // namespace kiln::backends::cpu
