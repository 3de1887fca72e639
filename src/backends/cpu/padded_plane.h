// A sliding window over one NCHW plane made branch-free: the input plane is copied into a buffer
// padded with a fill value (0 for convolutions and average pooling, -inf for max pooling) and split
// into `stride` column phases: phase q of a padded row holds padded columns q, q + s, q + 2s, ...
// Output column o then reads tap k at phase (k * dw) % s, index o + (k * dw) / s: for every stride,
// padding and dilation, each tap of a run of outputs is one run of contiguous loads.
//
// padded_plane.inc holds the copy (vectorized for stride 2), compiled once per vector path.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace kiln::backends::cpu {

struct PlaneGeometry {
  int64_t h = 0, w = 0, oh = 0, ow = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, pad_top = 0, pad_left = 0;
};

struct PlaneLayout {
  int64_t rows = 0;        // padded input rows the outputs read
  int64_t phase_len = 0;   // floats per column phase (a multiple of 16)
  int64_t row_stride = 0;  // sw * phase_len
  int64_t dw = 1, sw = 1;
  // Offset of tap k of a row. Kept in place for the first kTaps taps: the layout is made in every
  // run, which allocates nothing (tests/noalloc).
  static constexpr int64_t kTaps = 32;
  int64_t taps[kTaps] = {};
  int64_t tap(int64_t k) const { return k < kTaps ? taps[k] : tap_offset(k); }
  int64_t tap_offset(int64_t k) const { return (k * dw) % sw * phase_len + k * dw / sw; }
};

// Outputs are produced in blocks of `block_rows` x `block_cols` (reads may run past oh and ow up to
// the block; those rows and columns hold the fill value).
inline PlaneLayout plane_layout(const PlaneGeometry& g, int64_t block_cols, int64_t block_rows) {
  PlaneLayout pl;
  int64_t oh = (g.oh + block_rows - 1) / block_rows * block_rows;
  pl.rows = (oh - 1) * g.sh + (g.kh - 1) * g.dh + 1;
  int64_t len = (g.ow + block_cols - 1) / block_cols * block_cols + (g.kw - 1) * g.dw / g.sw + 1;
  pl.phase_len = (len + 15) / 16 * 16;
  pl.row_stride = g.sw * pl.phase_len;
  pl.dw = g.dw, pl.sw = g.sw;
  for (int64_t k = 0; k < std::min(g.kw, PlaneLayout::kTaps); ++k) pl.taps[k] = pl.tap_offset(k);
  return pl;
}

// dst[0, len) = input row src[0, w) shifted right by `pad`, `fill` elsewhere.
inline void padded_row(const float* src, int64_t w, int64_t pad, float* dst, int64_t len, float fill) {
  int64_t lead = std::min(pad, len), n = std::clamp<int64_t>(len - pad, 0, w);
  std::fill(dst, dst + lead, fill);
  std::memcpy(dst + lead, src, static_cast<size_t>(n) * sizeof(float));
  std::fill(dst + lead + n, dst + len, fill);
}

}  // namespace kiln::backends::cpu
