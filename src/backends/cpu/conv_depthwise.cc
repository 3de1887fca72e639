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

namespace dw_avx512 {
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")
using V = Vec512;
using VN = Vec256VL;
#include "backends/cpu/conv_depthwise_body.inc"
#pragma GCC pop_options
}  // namespace dw_avx512

namespace dw_avx2 {
#pragma GCC push_options
#pragma GCC target("avx2,fma")
using V = Vec256;
using VN = Vec256;
#include "backends/cpu/conv_depthwise_body.inc"
#pragma GCC pop_options
}  // namespace dw_avx2

namespace dw_scalar {
using V = Vec1;
using VN = Vec1;
#include "backends/cpu/conv_depthwise_body.inc"
}  // namespace dw_scalar

}  // namespace

void depthwise_conv(Isa isa, const DepthwiseConv& p, const float* x, const float* residual, float* y) {
  switch (isa) {
    case Isa::kAvx512: return dw_avx512::run(p, x, residual, y);
    case Isa::kAvx2: return dw_avx2::run(p, x, residual, y);
    case Isa::kScalar: return dw_scalar::run(p, x, residual, y);
  }
}

}  // namespace kiln::backends::cpu
