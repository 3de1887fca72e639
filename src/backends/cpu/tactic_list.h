// The CPU backend's contribution to the tactic registry (backends/registry.h).
#pragma once

#include <string>
#include <vector>

#include "backends/tactic.h"

namespace kiln::backends::cpu {

// Every CPU tactic, per op, in priority order (tactic_list.cc).
const std::vector<const Tactic*>& tactic_list();
// The CPU kernel libraries with their run-time versions ("oneDNN 2.6.3"; "" without oneDNN).
std::string library_versions();
// The blocked layout's block that the CPU's blocked kernels want on a target with `isa`: 16 floats
// with AVX-512, 8 with AVX2; 0 (plain NCHW) without either or without oneDNN (whose kernels are the point).
int64_t preferred_layout_block(IsaSet isa);

}  // namespace kiln::backends::cpu
