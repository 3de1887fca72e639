// The index geometry of the data-movement ops as their reference kernels compute it (Pad in
// tensor_pad.cc, Slice and Split in tensor_layout.cc), shared with the CPU movement tactic
// (backends/cpu/movement_tactic.cc) so that both clamp, crop and split the same way.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace kiln::ops {

// Pads as [begin..., end...] for every dim of a rank-r input, from attributes (opset < 11) or
// inputs pads/axes (opset >= 11).
struct PadSpec {
  bool known = true;
  std::vector<int64_t> begin, end;
};
Result<PadSpec> expand_pads(const std::vector<int64_t>& pads, bool has_axes, const std::vector<int64_t>& axes_in,
                            int64_t r);
const char* pads_attr_name(int opset);  // the pads attribute before opset 11
// Size of one padded axis of size d with pads (b, e) (negative pads crop), or why it cannot be padded.
Result<int64_t> pad_axis_size(int64_t d, int64_t b, int64_t e, const std::string& mode);
// Source coordinate of each output coordinate along one padded axis (-1: the fill value).
Result<std::vector<int64_t>> pad_axis_map(int64_t d, int64_t b, int64_t e, const std::string& mode);

// kiln.ChannelShuffle (ops/kiln_channel_shuffle.cc): the input and its channel that each channel of
// the shuffled tensor reads. The inputs' channels (counts `channels`) are concatenated into C;
// shuffled channel c' = j * groups + g reads concatenated channel g * (C / groups) + j.
struct ShuffleSource {
  int input = 0;
  int64_t channel = 0;
};
Result<std::vector<ShuffleSource>> channel_shuffle_sources(const std::vector<int64_t>& channels, int64_t groups);
// kiln.ChannelShuffle's output channel counts: its `split` attribute (`has_split`), or all c channels in
// one output; checked against the output count and (c >= 0) the channel count.
Result<std::vector<int64_t>> channel_shuffle_split(bool has_split, const std::vector<int64_t>& split, size_t outputs,
                                                   int64_t c);

// Sizes of Split's n outputs along an axis of size dim (dim < 0: unknown, then only an explicit
// split gives sizes; others come back empty).
Result<std::vector<int64_t>> split_sizes(bool has_split, const std::vector<int64_t>& split, int64_t num_outputs,
                                         int64_t n, int64_t dim);

struct SliceAxis {
  int64_t start = 0, len = 0, step = 1;
};
// Clamps [start, end) with step for an axis of size dim, as ONNX Slice does.
Result<SliceAxis> slice_axis(int64_t dim, int64_t start, int64_t end, int64_t step);

struct SliceParams {
  std::vector<int64_t> starts, ends, axes, steps;
  bool has_axes = false, has_steps = false;
};
// Fills the default axes / steps and checks the lengths, axes and steps against rank.
Status check_slice_params(SliceParams& p, int64_t rank);

}  // namespace kiln::ops
