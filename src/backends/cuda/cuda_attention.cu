// kiln.Attention's fused mask + softmax kernel (cuda_attention.h): one warp per row, float32 math.
#include <cmath>

#include "backends/cuda/cuda_attention.h"
#include "backends/cuda/cuda_float_types.cuh"

namespace kiln::backends::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;

template <typename T>
__global__ void attention_softmax_kernel(const float* __restrict__ scores, const T* __restrict__ mask,
                                         T* __restrict__ probs, int64_t rows, AttentionSoftmaxParams p) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + static_cast<int64_t>(threadIdx.x >> 5);
  if (row >= rows) return;  // the whole warp: the shuffles below see all 32 lanes
  const int64_t n = p.cols;
  const float* sr = scores + row * p.ld;
  T* pr = probs + row * p.ld;
  const T* mr = nullptr;
  if (mask) {
    mr = mask + attention_mask_problem_offset(p, row / p.rows_per_problem) +
         (row % p.rows_per_problem) * p.mask_row_stride;
  }
  const int64_t mcs = p.mask_col_stride;
  float m = -INFINITY;
  for (int64_t j = lane; j < n; j += 32) m = fmaxf(m, sr[j] + (mr ? to_f32(mr[j * mcs]) : 0.f));
  m = attention_warp_max(m);
  float sum = 0.f;
  for (int64_t j = lane; j < n; j += 32) sum += expf(sr[j] + (mr ? to_f32(mr[j * mcs]) : 0.f) - m);
  sum = attention_warp_sum(sum);
  const float inv = 1.f / sum;
  for (int64_t j = lane; j < n; j += 32)
    pr[j] = to_storage<T>(expf(sr[j] + (mr ? to_f32(mr[j * mcs]) : 0.f) - m) * inv);
}

}  // namespace

cudaError_t launch_attention_softmax(const float* scores, const void* mask, void* probs, int64_t rows,
                                     const AttentionSoftmaxParams& p, FloatType t, cudaStream_t s) {
  if (rows <= 0 || p.cols <= 0) return cudaSuccess;
  if (p.ld < p.cols) return cudaErrorInvalidValue;
  if (p.rows_per_problem <= 0 || p.batch_rank < 0 || p.batch_rank > kAttentionMaxBatchRank)
    return cudaErrorInvalidValue;
  for (int k = 0; k < p.batch_rank; ++k)
    if (p.batch_dims[k] <= 0) return cudaErrorInvalidValue;
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  return dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    attention_softmax_kernel<T><<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, s>>>(
        scores, static_cast<const T*>(mask), static_cast<T*>(probs), rows, p);
  });
}

}  // namespace kiln::backends::cuda
