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

}  // namespace kiln::ops
