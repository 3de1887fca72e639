// Compiles longtail_kernels.inc once per CPU path (see isa_paths.inc). Headers first, so that library
// templates keep the default target.
#include "backends/cpu/longtail_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/cpu/simd_vec.h"

// GCC 12 warns inside its own AVX-512 intrinsics once they are inlined: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kiln::backends::cpu::lt {
#define KILN_ISA_BODY "backends/cpu/longtail_kernels.inc"
#include "backends/cpu/isa_paths.inc"
#undef KILN_ISA_BODY

const Kernels& kernels(Isa isa) {
#if defined(__x86_64__) || defined(__i386__)
  if (isa == Isa::kAvx512) return isa_avx512::table;
  if (isa == Isa::kAvx2) return isa_avx2::table;
#endif
  return isa_scalar::table;
}

}  // namespace kiln::backends::cpu::lt
