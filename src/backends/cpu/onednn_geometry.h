// Conv and pooling attributes resolved for concrete input shapes (auto_pad, defaults), shared by
// the plain (onednn_conv.cc, onednn_pool.cc) and the channel-blocked (onednn_nchwc_*.cc) tactics.
#pragma once

#include <string>
#include <vector>

#include "backends/tactic.h"

namespace kiln::backends::cpu::onednn {

struct ConvGeometry {
  int64_t n, c, h, w, m, kh, kw, group, oh, ow;
  int64_t sh, sw, dh, dw, pt, pl, pb, pr;
};
// x: [N, C, H, W], wt: [M, C/group, kH, kW]. Empty when oneDNN can take it, else why not.
std::string resolve_conv(const ir::Node& node, const Dims& x, const Dims& wt, ConvGeometry& g);

// A window over 1 to 3 spatial dims as oneDNN takes it: per dim the input and output extents,
// the kernel, stride, dilation (ONNX's: 1 = dense) and the padding before and after.
struct WindowNd {
  Dims in, out, kernel, strides, dilations, pad_l, pad_r;
  size_t rank() const { return in.size(); }
};

// Conv (transpose false: x [N, C, spatial...], wt [M, C/group, k...]) or ConvTranspose (true: wt
// [C, M/group, k...]) of 1 to 3 spatial dims, resolved by the reference kernel's own window code
// (ops/conv_util.h), so the output shape always matches it. Empty when oneDNN can take it, else why not.
struct ConvNdGeometry {
  int64_t n = 0, c = 0, m = 0, group = 1;
  bool transpose = false;
  WindowNd w;
};
std::string resolve_conv_nd(const ir::Node& node, bool transpose, const Dims& x, const Dims& wt, ConvNdGeometry& g);

// Pooling of 1 to 3 spatial dims. ceil_mode becomes a longer right padding (the windows past the
// declared padding, which ONNX never counts: max ignores padding, the excluding average counts
// input taps only, the including one is rescaled where a window reaches past the declared padding).
struct PoolGeometry {
  int64_t n = 0, c = 0;
  bool max = false, include_pad = false;  // the average's divisor counts the padding
  WindowNd w;
  // An average counting the declared padding with ceil_mode windows past it: per dim and output
  // position, the factor from oneDNN's divisor (the whole kernel) to ONNX's (the taps inside the
  // input and its declared padding). Empty otherwise.
  std::vector<std::vector<float>> rescale;
};
bool is_global_pool(const std::string& op);
bool is_max_pool(const std::string& op);
// Pool `op` (MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool) of ONNX opset `opset` with
// the attributes of `node` on x [N, C, spatial...].
std::string resolve_pool(const ir::Node& node, const std::string& op, int opset, const Dims& x, PoolGeometry& g);

}  // namespace kiln::backends::cpu::onednn
