#include "backends/cpu/pool_kernels.h"

#include <cmath>
#include <vector>

#include "backends/cpu/gemm_kernels.h"
#include "backends/cpu/simd_vec.h"
#include "core/parallel.h"

namespace kiln::backends::cpu {
namespace {

#define KILN_ISA_BODY "backends/cpu/pool_body.inc"
#include "backends/cpu/isa_paths.inc"
#undef KILN_ISA_BODY

// Per output position along one axis: the taps inside the input (count_include_pad: inside the
// input and its declared padding), as the reference kernel counts them.
std::vector<int64_t> tap_counts(int64_t in, int64_t out, int64_t k, int64_t s, int64_t d, int64_t pad_begin,
                                int64_t pad_end, bool with_pad) {
  std::vector<int64_t> n(static_cast<size_t>(out));
  int64_t lo = with_pad ? -pad_begin : 0, hi = with_pad ? in + pad_end : in;
  for (int64_t o = 0; o < out; ++o)
    for (int64_t t = 0; t < k; ++t) {
      int64_t pos = o * s - pad_begin + t * d;
      n[o] += pos >= lo && pos < hi;
    }
  return n;
}

}  // namespace

std::vector<float> pool_reciprocals(const Pool2d& p) {
  std::vector<float> recip;
  if (!p.max && !p.global) {
    const PlaneGeometry& g = p.g;
    auto ch = tap_counts(g.h, g.oh, g.kh, g.sh, g.dh, g.pad_top, p.pad_bottom, p.count_include_pad);
    auto cw = tap_counts(g.w, g.ow, g.kw, g.sw, g.dw, g.pad_left, p.pad_right, p.count_include_pad);
    recip.resize(static_cast<size_t>(g.oh * g.ow));
    for (int64_t i = 0; i < g.oh; ++i)
      for (int64_t j = 0; j < g.ow; ++j) {
        int64_t count = ch[i] * cw[j];
        recip[i * g.ow + j] = count > 0 ? static_cast<float>(1.0 / static_cast<double>(count)) : 0.f;
      }
  }
  return recip;
}

void pool2d(Isa isa, const Pool2d& p, const float* recip, const float* x, float* y) {
  switch (isa) {
    case Isa::kAvx512: return isa_avx512::run(p, recip, x, y);
    case Isa::kAvx2: return isa_avx2::run(p, recip, x, y);
    case Isa::kScalar: return isa_scalar::run(p, recip, x, y);
  }
}

}  // namespace kiln::backends::cpu
