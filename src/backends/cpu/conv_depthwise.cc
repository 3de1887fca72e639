#include "backends/cpu/conv_depthwise.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "backends/cpu/gemm_kernels.h"
#include "backends/cpu/simd_vec.h"
#include "core/parallel.h"

namespace kiln::backends::cpu {
namespace {

#define KILN_ISA_BODY "backends/cpu/conv_depthwise_body.inc"
#include "backends/cpu/isa_paths.inc"
#undef KILN_ISA_BODY

}  // namespace

void depthwise_conv(Isa isa, const DepthwiseConv& p, const float* x, const float* residual, float* y) {
  switch (isa) {
    case Isa::kAvx512: return isa_avx512::run(p, x, residual, y);
    case Isa::kAvx2: return isa_avx2::run(p, x, residual, y);
    case Isa::kScalar: return isa_scalar::run(p, x, residual, y);
  }
}

}  // namespace kiln::backends::cpu
