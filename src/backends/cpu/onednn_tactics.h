// The oneDNN tactics (compiled only when CMake found oneDNN: KILN_HAVE_ONEDNN).
#pragma once

#include "backends/tactic.h"

namespace kiln::backends::cpu::onednn {

const Tactic* conv2d_onednn_blocked();
const Tactic* conv2d_onednn_nchw();
const Tactic* matmul_onednn_packed();
const Tactic* matmul_onednn_batched();
const Tactic* pool2d_onednn_nchw();
// Channel-blocked activations (kiln.BlockedConv / BlockedPool / ReorderToBlocked / ReorderFromBlocked).
const Tactic* conv2d_onednn_nchwc_winograd();
const Tactic* conv2d_onednn_nchwc();
const Tactic* pool2d_onednn_nchwc();
const Tactic* reorder_onednn_nchwc();
const Tactic* conv2d_onednn_nchwc_dw();  // kiln.BlockedConvDw

}  // namespace kiln::backends::cpu::onednn
