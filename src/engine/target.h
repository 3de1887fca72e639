// The build target: what an engine was built for, and whether this machine can run it.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace kiln::engine {

struct TargetInfo {
  std::string device = "cpu";    // "cpu" now; "cuda:<n>" later
  std::string cpu_model;         // from /proc/cpuinfo
  std::vector<std::string> isa;  // features this CPU has (avx2, avx512f, fma, ...)
  int cores = 0;
};

TargetInfo detect_host();

// Ok when `host` can run kernels needing `required` features; the error lists what is missing.
Status check_runnable(const std::vector<std::string>& required, const TargetInfo& built_on, const TargetInfo& host);

}  // namespace kiln::engine
