// The instruction set kiln's own CPU kernels run with, chosen at run time (the project is compiled
// without -march flags). KILN_ISA=avx512|avx2|scalar caps it (tests force each path; asking for
// more than the CPU has gives what the CPU has).
#pragma once

namespace kiln::backends::cpu {

enum class Isa { kScalar, kAvx2, kAvx512 };

// The best ISA of this CPU, capped by KILN_ISA (read on every call: tests switch it between
// prepare() calls; kernels read it once, when they are prepared).
Isa cpu_isa();

}  // namespace kiln::backends::cpu
