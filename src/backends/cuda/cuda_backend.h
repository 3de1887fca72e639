// The CUDA backend's entry points for the registry (backends/registry.cc), free of CUDA headers: its
// DeviceRuntime, its tactic list and the libraries behind it.
#pragma once

#include <string>
#include <vector>

#include "backends/device_runtime.h"
#include "backends/tactic.h"

namespace kiln::backends::cuda {

const DeviceRuntime& runtime();
const std::vector<const Tactic*>& tactic_list();
std::string library_versions();  // "CUDA runtime 13.0 + cuBLASLt 13.1.0"

}  // namespace kiln::backends::cuda
