// The INT8 linear-layer tactics (int8_matmul_onednn.cc; oneDNN builds only: KILN_HAVE_ONEDNN).
#pragma once

#include "backends/tactic.h"

namespace kiln::backends::cpu::onednn {

const Tactic* matmul_integer_onednn_u8s8s32();  // ONNX MatMulInteger, uint8 A x constant int8 B
const Tactic* qlinear_matmul_onednn_u8s8s32();  // ONNX QLinearMatMul, the same operands, requantized out
const Tactic* dyn_q_matmul_onednn_u8s8s32();    // kiln.DynQMatMul
const Tactic* q_matmul_onednn_u8s8s32();        // kiln.QMatMul (X's scale and zero point fixed)

}  // namespace kiln::backends::cpu::onednn
