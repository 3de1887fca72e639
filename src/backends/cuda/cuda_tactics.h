// The CUDA backend's tactic groups, in priority order in tactic_list() (cuda_tactic_list.cc).
#pragma once

#include <vector>

#include "backends/tactic.h"

namespace kiln::backends::cuda {

// cuBLASLt MatMul/Gemm/kiln.FusedMatMul/kiln.FusedGemm: one tactic per rank of cuBLASLt's heuristic
// (matmul_cublaslt_h0 .. h3, the tuner times them), and TF32 variants when the build allows TF32.
std::vector<const Tactic*> matmul_tactics();
// kiln's own kernels: elementwise, softmax, layer norm, data movement (cuda_tactics.cc).
std::vector<const Tactic*> own_kernel_tactics();
// Where, comparisons, Pad, Tile, Resize, Reduce* (cuda_more_tactics.cc).
std::vector<const Tactic*> more_kernel_tactics();
// kiln.Attention / kiln.MultiHeadAttention: cuBLASLt products around a fused mask + softmax kernel
// (cuda_attention_tactics.cc).
std::vector<const Tactic*> attention_tactics();
// The same ops as one fused kernel, float16/bfloat16, head sizes 32/64/128 (cuda_flash_attention_tactics.cc).
std::vector<const Tactic*> flash_attention_tactics();

}  // namespace kiln::backends::cuda
