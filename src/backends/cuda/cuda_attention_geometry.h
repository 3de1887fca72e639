// The signature analysis shared by the CUDA attention tactics (cuda_attention_tactics.cc: cuBLASLt;
// cuda_flash_attention_tactics.cc: the fused kernel) for kiln.Attention / kiln.MultiHeadAttention:
// the problems (batch index b, head h), where each operand's matrix of a problem starts (the heads
// read in place, packed QKV), the output's shape, the dtype contract and the mask's broadcast strides.
#pragma once

#include <string>

#include "backends/cuda/cuda_attention.h"
#include "backends/tactic.h"
#include "core/shape.h"

namespace kiln::backends::cuda {

// One matrix operand of a problem (b, h): element (r, c) at base + b * sb + h * sh + r * ld + c.
struct AttentionOperand {
  int64_t base = 0, sb = 0, sh = 0, ld = 0;
};

struct AttentionGeometry {
  int64_t sq = 0, sk = 0, d = 0, dv = 0;
  int64_t nb = 1, nh = 1;  // problems: nb batch indices x nh heads (nh 1 for Attention)
  bool k_transposed = false;
  AttentionOperand q, k, v, y;
  Dims batch;  // the problems' dims, row-major (MultiHeadAttention: [lead..., heads])
  Dims out;
  std::string error;
};

// The geometry of a fully known signature; `error` says why it cannot run on CUDA ("" when it can).
AttentionGeometry attention_geometry(const LayerSignature& sig);

// Why a CUDA attention tactic of dtype `dt` cannot take `sig` ("" when it can): the inputs, their
// dtypes and (once the shapes are known) the geometry.
std::string attention_why_unsupported(const LayerSignature& sig, DataType dt);

// Whether a packed MultiHeadAttention (K and V read from Q's projection), so the K/V inputs are 0.
bool attention_packed(const LayerSignature& sig);

// The softmax parameters of the scores [batch..., sq, sk], rows `ld` apart: problems, rows, and the
// mask's (input 3) broadcast strides when it has one.
AttentionSoftmaxParams attention_softmax_params(const AttentionGeometry& g, const LayerSignature& sig, int64_t ld);

}  // namespace kiln::backends::cuda
