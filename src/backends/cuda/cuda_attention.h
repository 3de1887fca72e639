// The softmax between the two matrix products of kiln.Attention / kiln.MultiHeadAttention on CUDA
// (cuda_attention.cu; the tactics: cuda_attention_tactics.cc): float32 scores (already scaled) plus
// the broadcast additive mask, softmax over each row in float32, probabilities stored in the data's
// dtype for the second product.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/cuda_kernels.h"

namespace kiln::backends::cuda {

constexpr int kAttentionMaxBatchRank = 6;

// The scores are rows of `cols` floats `ld` apart (probs likewise), `rows_per_problem` rows per problem, problems in
// row-major order over `batch_dims`. The mask element of (problem, row i, column j) is at sum_k index_k *
// mask_strides[k] + i * mask_row_stride + j * mask_col_stride (strides 0 where the mask broadcasts).
struct AttentionSoftmaxParams {
  int64_t rows_per_problem = 1, cols = 1, ld = 1;
  int batch_rank = 0;
  int64_t batch_dims[kAttentionMaxBatchRank] = {};
  int64_t mask_strides[kAttentionMaxBatchRank] = {};
  int64_t mask_row_stride = 0, mask_col_stride = 0;
};

#ifdef __CUDACC__
// Warp-wide reductions (every lane of the warp takes part and gets the result).
__device__ __forceinline__ float attention_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float attention_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The mask's offset for problem `problem` (row-major over batch_dims): sum_k index_k * mask_strides[k].
__device__ __forceinline__ int64_t attention_mask_problem_offset(const AttentionSoftmaxParams& p, int64_t problem) {
  int64_t off = 0;
  for (int k = p.batch_rank - 1; k >= 0; --k) {
    off += (problem % p.batch_dims[k]) * p.mask_strides[k];
    problem /= p.batch_dims[k];
  }
  return off;
}
#endif

// probs[r, j] = softmax_j(scores[r, j] + mask(r, j)) for `rows` rows (mask: null for none, in the
// storage type `t` like probs). A row whose every entry is -inf gives NaN, as the reference's
// Softmax does; NaN propagates to its row.
cudaError_t launch_attention_softmax(const float* scores, const void* mask, void* probs, int64_t rows,
                                     const AttentionSoftmaxParams& p, FloatType t, cudaStream_t s);

// The fused kernel (cuda_flash_attention.cu): one operand of problem (b, h) has element (r, c) at
// base + b * sb + h * sh + r * row + c * col (K: r the key, c the head dim; the others: c contiguous).
struct FlashAttentionOperand {
  int64_t base = 0, sb = 0, sh = 0, row = 0, col = 1;
};
struct FlashAttentionParams {
  int64_t sq = 0, sk = 0, d = 0;  // Q and K's head size d is V's (and Y's)
  int64_t problems = 0, nh = 1;   // problem index b * nh + h
  float scale = 1.f;
  FlashAttentionOperand q, k, v, y;
  AttentionSoftmaxParams mask;  // rows_per_problem sq, cols sk; batch dims and the mask's strides
};

// Whether the fused kernel takes head size d (32, 64, 128) in dtype t (float16, bfloat16).
bool flash_attention_supports(FloatType t, int64_t d);
// Sets the kernel's shared memory limit once (call before launching, outside stream capture).
cudaError_t flash_attention_configure(FloatType t, int64_t d);
// Y = softmax(scale * Q K' + mask) V per problem, float32 scores, softmax and accumulation (online
// softmax over tiles of 64 keys), P rounded to the dtype for the product with V. mask: null for none.
// A row whose every score is -inf gives NaN like the reference's Softmax.
// mma: the register-resident form on mma.sync (attention_flash2_*), else the wmma form with the scores in
// shared memory (attention_fused_*).
cudaError_t launch_flash_attention(const void* q, const void* k, const void* v, const void* mask, void* y,
                                   const FlashAttentionParams& p, FloatType t, cudaStream_t s, bool mma = false);

}  // namespace kiln::backends::cuda
