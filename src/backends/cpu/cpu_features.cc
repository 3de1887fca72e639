#include "backends/cpu/cpu_features.h"

namespace kiln::backends::cpu {

Isa cpu_isa(IsaSet target) {
  IsaSet have = host_isa() & target;
  if ((have & kIsaAvx512) && (have & kIsaAvx2)) return Isa::kAvx512;
  if (have & kIsaAvx2) return Isa::kAvx2;
  return Isa::kScalar;
}

IsaSet isa_set_of(Isa path) {
  switch (path) {
    case Isa::kAvx512: return kIsaAvx2 | kIsaAvx512;
    case Isa::kAvx2: return kIsaAvx2;
    case Isa::kScalar: break;
  }
  return kIsaPortable;
}

}  // namespace kiln::backends::cpu
