// Channel-blocked activations (oneDNN's nChw16c / nChw8c, ONNX Runtime's NCHWc): a tensor
// [N, C, H, W] stored as [N, ceil(C/B), H, W, B], channel c at block c / B, lane c % B, the lanes
// past C zero. The kiln-domain ops of kiln_layout.cc move values into and out of this layout and
// compute on it; src/passes/layout_blocked.cc places them.
#pragma once

#include "core/tensor.h"

namespace kiln::ops {

// [N, C, H, W] -> [N, ceil(C/B), H, W, B], padding lanes zero. Any fixed-size dtype.
Result<Tensor> to_channel_blocked(const Tensor& x, int64_t block);
// [N, Cb, H, W, B] -> [N, channels, H, W] (channels <= Cb * B; the padding lanes are dropped).
Result<Tensor> from_channel_blocked(const Tensor& y, int64_t channels);

// Channels-last activations (the CUDA backend's NHWC convolutions, passes/layout_nhwc.cc): [N, C, H, W]
// stored as [N, H, W, C]. Any fixed-size dtype.
Result<Tensor> nchw_to_nhwc(const Tensor& x);  // [N, C, H, W] -> [N, H, W, C]
Result<Tensor> nhwc_to_nchw(const Tensor& y);  // [N, H, W, C] -> [N, C, H, W]

}  // namespace kiln::ops
