// The CUDA backend's CNN tactic groups (cudnn_conv.cc, cuda_cnn_tactics.cc), listed in tactic_list()
// after the cuBLASLt and elementwise ones.
#pragma once

#include <string>
#include <vector>

#include "backends/tactic.h"

namespace kiln::backends::cuda {

// cuDNN convolution (legacy cudnnConvolutionForward): Conv and kiln.FusedConv of 1 to 3 spatial dims,
// grouped/depthwise, strided, dilated, any pads (asymmetric ones through a padded copy), NCHW, float32
// / float16 / bfloat16 data with float32 accumulation. One tactic per rank of cuDNN's heuristic
// (conv_cudnn_h0 .. h7: every forward algorithm it offers, the tuner times them); the epilogue (bias,
// residual, activation) fused by cuDNN for float32 ReLU/identity, else kiln's kernel after it.
std::vector<const Tactic*> cudnn_conv_tactics();
// kiln's own CNN kernels: MaxPool/AveragePool (ceil_mode, pads, dilations, count_include_pad),
// GlobalAveragePool/GlobalMaxPool and ReduceMean/ReduceMax over trailing axes, Split.
std::vector<const Tactic*> cnn_kernel_tactics();
// The INT8 CNN layers (cuda_int8_tactics.cc): kiln.QConv on cuDNN's INT8 convolution with kiln's
// requantization epilogue, or kiln's direct kernel; kiln.QPool, kiln.QuantizeChannelsLast,
// per-tensor QuantizeLinear / DequantizeLinear, kiln.QMatMul.
std::vector<const Tactic*> int8_tactics();
// The calling thread's cuDNN handle on the current device (a cudnnHandle_t; made on first use).
Result<void*> cudnn_thread_handle();
// "cuDNN 9.14.0" (the loaded library's version).
std::string cudnn_version();

}  // namespace kiln::backends::cuda
