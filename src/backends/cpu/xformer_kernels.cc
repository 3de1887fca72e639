// Compiles xformer_kernels.inc three times: AVX-512 and AVX2 inside `#pragma GCC target` regions
// (their code only runs once cpu_isa() reports the ISA), and portable C++. Every header is included
// above the regions so that library templates keep the default target (one definition each).
#include "backends/cpu/xformer_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "backends/cpu/simd_vec.h"

// GCC 12 warns inside its own AVX-512 intrinsics (_mm512_max_ps etc. start from
// _mm512_undefined_ps) once they are inlined: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kiln::backends::cpu::xf {

float* thread_scratch(int slot, size_t floats) {
  struct Buffer {
    std::unique_ptr<float[], decltype(&std::free)> data{nullptr, &std::free};
    size_t size = 0;
  };
  thread_local Buffer buffers[4];
  Buffer& b = buffers[slot];
  if (b.size < floats) {
    size_t n = std::max<size_t>(floats, 16);
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    b.data.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    b.size = b.data ? n : 0;
  }
  return b.data.get();
}

}  // namespace kiln::backends::cpu::xf

#if defined(__x86_64__) || defined(__i386__)
#define KILN_XF_X86 1

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")
namespace kiln::backends::cpu::xf::avx512 {
constexpr Isa kIsa = Isa::kAvx512;
#define KILN_VEC_BITS 512
using Vec = Vec512;
#include "backends/cpu/xformer_kernels.inc"
#undef KILN_VEC_BITS
}  // namespace kiln::backends::cpu::xf::avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace kiln::backends::cpu::xf::avx2 {
constexpr Isa kIsa = Isa::kAvx2;
#define KILN_VEC_BITS 256
using Vec = Vec256;
#include "backends/cpu/xformer_kernels.inc"
#undef KILN_VEC_BITS
}  // namespace kiln::backends::cpu::xf::avx2
#pragma GCC pop_options
#endif

namespace kiln::backends::cpu::xf::scalar {
constexpr Isa kIsa = Isa::kScalar;
#define KILN_VEC_BITS 32
using Vec = Vec1;
#include "backends/cpu/xformer_kernels.inc"
#undef KILN_VEC_BITS
}  // namespace kiln::backends::cpu::xf::scalar

namespace kiln::backends::cpu::xf {

const Kernels& kernels(Isa isa) {
#if defined(KILN_XF_X86)
  if (isa == Isa::kAvx512) return avx512::table;
  if (isa == Isa::kAvx2) return avx2::table;
#endif
  return scalar::table;
}

}  // namespace kiln::backends::cpu::xf
