#include "backends/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace kiln::backends::cpu {

namespace {
Isa hardware_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma"))
    return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kScalar;
}
}  // namespace

Isa cpu_isa() {
  static const Isa hw = hardware_isa();
  Isa want = hw;
  if (const char* env = std::getenv("KILN_ISA"); env && *env) {
    if (std::strcmp(env, "scalar") == 0) want = Isa::kScalar;
    if (std::strcmp(env, "avx2") == 0) want = Isa::kAvx2;
  }
  return want < hw ? want : hw;
}

}  // namespace kiln::backends::cpu
