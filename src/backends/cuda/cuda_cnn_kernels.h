// kiln's own CUDA kernels for the CNN layers cuDNN's convolution leaves (cuda_cnn_kernels.cu): the
// convolution epilogue (bias, residual, activation), windowed and global pooling. Each takes float32,
// float16 or bfloat16 tensors (one dtype per launch, `dtype`) and accumulates in float32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kiln::backends::cuda {

enum class CnnDtype : int { kFloat32, kFloat16, kBFloat16 };

// kiln.FusedConv's epilogue activations (ops/kiln_fused.cc), in the reference's order after the
// residual add.
enum class EpilogueAct : int {
  kNone,
  kRelu,
  kLeakyRelu,  // alpha
  kSigmoid,
  kTanh,
  kHardSwish,
  kHardSigmoid,  // alpha, beta
  kClip,         // [alpha, beta]
  kSilu,
  kGelu,
  kGeluTanh,
};
struct Epilogue {
  EpilogueAct act = EpilogueAct::kNone;
  float alpha = 0, beta = 0;
};

// y[n, c, i] = act(y[n, c, i] + bias[c] + residual[n, c, i]) in place over [batch, channels, inner];
// bias (float32) and residual (y's dtype) may be null. 16-byte packs when inner == 1 (channels-last).
cudaError_t launch_conv_epilogue(void* y, CnnDtype dtype, const float* bias, const void* residual, int64_t batch,
                                 int64_t channels, int64_t inner, Epilogue e, cudaStream_t s);

// A pooling window over up to 3 spatial dims (fewer: leading dims of extent 1), per dim as
// ops::WindowGeometry resolves it: pad_end is the declared padding (the ceil_mode overhang is not
// padding: never counted).
struct PoolWindow {
  int64_t planes = 0;  // N * C
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, kernel[3] = {1, 1, 1}, stride[3] = {1, 1, 1}, dilation[3] = {1, 1, 1},
          pad_begin[3] = {0, 0, 0}, pad_end[3] = {0, 0, 0};
  bool max = false;
  bool include_pad = false;  // AveragePool count_include_pad
  // A NaN in the window is the max (GlobalMaxPool's reference); windowed MaxPool ignores NaN. Only the
  // channels-last global kernel (a window of the whole plane) reads it.
  bool nan_wins = false;
};
cudaError_t launch_pool(const void* x, void* y, CnnDtype dtype, const PoolWindow& w, cudaStream_t s);
// The same window over channels-last [N, in..., C] -> [N, out..., C] (kiln.NhwcPool), w.planes = N:
// one thread per output pack of 16 bytes (per channel when C does not divide into packs), consecutive
// threads on consecutive channels (coalesced); a window of the whole plane (global pooling) reduces
// each (image, channel pack) over the plane with a block of threads.
cudaError_t launch_pool_nhwc(const void* x, void* y, CnnDtype dtype, const PoolWindow& w, int64_t channels,
                             cudaStream_t s);

// GlobalAveragePool / GlobalMaxPool (and ReduceMean/ReduceMax over trailing axes): y[p] = mean or max
// of x[p, 0..inner).
cudaError_t launch_global_pool(const void* x, void* y, CnnDtype dtype, int64_t planes, int64_t inner, bool max,
                               cudaStream_t s);

}  // namespace kiln::backends::cuda
