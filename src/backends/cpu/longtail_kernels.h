// Vectorized kernels of the long-tail tactics (resize_tactic.cc, softmax on a strided axis in
// norm_softmax_tactic.cc): one body (longtail_kernels.inc) compiled for AVX-512,
// AVX2 and portable C++ (longtail_kernels.cc, through isa_paths.inc); lt::kernels(isa) hands out the
// table of one path. Float32; outputs never overlap inputs.
#pragma once

#include <cstdint>

#include "backends/cpu/cpu_features.h"

namespace kiln::backends::cpu::lt {

struct Kernels {
  Isa isa;
  // dst[0, len) = sum over t < n of w[t] * rows[t][0, len) (the first product alone when n == 1).
  void (*blend_rows)(const float* const* rows, const float* w, int64_t n, float* dst, int64_t len);
  // Softmax / LogSoftmax of x viewed as [outer, axis, inner] along the middle axis, for the columns
  // [c0, c0 + nc) of the outer index o.
  void (*softmax_cols)(const float* x, float* y, int64_t o, int64_t axis, int64_t inner, int64_t c0, int64_t nc,
                       bool log);
};

const Kernels& kernels(Isa isa);

}  // namespace kiln::backends::cpu::lt
