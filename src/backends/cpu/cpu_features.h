// The instruction-set path kiln's own CPU kernels run (the project is compiled without -march
// flags): the best of this CPU's within what the target offers (LayerSignature::isa, from --isa),
// chosen when a layer is prepared. Tests prepare a kernel once per path by setting the signature's isa.
#pragma once

#include "core/target.h"

namespace kiln::backends::cpu {

enum class Isa { kScalar, kAvx2, kAvx512 };

// The best path that both this CPU and `target` (a signature's isa) have.
Isa cpu_isa(IsaSet target);
// The isa of a signature that makes cpu_isa() pick `path` (capped by the CPU).
IsaSet isa_set_of(Isa path);

}  // namespace kiln::backends::cpu
