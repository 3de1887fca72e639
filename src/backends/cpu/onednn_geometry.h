// Conv and pooling attributes resolved for concrete input shapes (auto_pad, defaults), shared by
// the plain (onednn_conv.cc, onednn_pool.cc) and the channel-blocked (onednn_nchwc_*.cc) tactics.
#pragma once

#include <string>

#include "backends/tactic.h"

namespace kiln::backends::cpu::onednn {

struct ConvGeometry {
  int64_t n, c, h, w, m, kh, kw, group, oh, ow;
  int64_t sh, sw, dh, dw, pt, pl, pb, pr;
};
// x: [N, C, H, W], wt: [M, C/group, kH, kW]. Empty when oneDNN can take it, else why not.
std::string resolve_conv(const ir::Node& node, const Dims& x, const Dims& wt, ConvGeometry& g);

struct PoolGeometry {
  int64_t n, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, oh, ow;
};
bool is_global_pool(const std::string& op);
bool is_max_pool(const std::string& op);
// Pool `op` (MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool) with the attributes of `node`
// on x [N, C, H, W].
std::string resolve_pool(const ir::Node& node, const std::string& op, const Dims& x, PoolGeometry& g);

}  // namespace kiln::backends::cpu::onednn
