// Compiles xformer_kernels.inc three times: AVX-512 and AVX2 inside `#pragma GCC target` regions
// (their code only runs once cpu_isa(sig.isa) reports the ISA), and portable C++. Every header is included
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

namespace kiln::backends::cpu::xf {
#define KILN_ISA_BODY "backends/cpu/xformer_kernels.inc"
#include "backends/cpu/isa_paths.inc"
#undef KILN_ISA_BODY
}  // namespace kiln::backends::cpu::xf

namespace kiln::backends::cpu::xf {

const Kernels& kernels(Isa isa) {
#if defined(__x86_64__) || defined(__i386__)
  if (isa == Isa::kAvx512) return isa_avx512::table;
  if (isa == Isa::kAvx2) return isa_avx2::table;
#endif
  return isa_scalar::table;
}

}  // namespace kiln::backends::cpu::xf
