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

// probs[r, j] = softmax_j(scores[r, j] + mask(r, j)) for `rows` rows (mask: null for none, in the
// storage type `t` like probs). A row whose every entry is -inf gives NaN, as the reference's
// Softmax does; NaN propagates to its row.
cudaError_t launch_attention_softmax(const float* scores, const void* mask, void* probs, int64_t rows,
                                     const AttentionSoftmaxParams& p, FloatType t, cudaStream_t s);

}  // namespace kiln::backends::cuda
