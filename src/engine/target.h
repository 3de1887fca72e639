// The build target: what an engine was built for (kiln::Target, made from BuilderConfig and this
// machine), the machine it was built on (TargetInfo), and whether this machine can run it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/target.h"
#include "kiln/kiln.h"

namespace kiln::engine {

struct TargetInfo {
  std::string device = "cpu";    // "cpu" now; "cuda:<n>" later
  std::string cpu_model;         // from /proc/cpuinfo
  std::vector<std::string> isa;  // features this CPU has (avx2, avx512f, fma, ...)
  int cores = 0;
  // A GPU build: the device's identity (backends::DeviceRuntime::identity: name, compute capability,
  // driver, runtime, cuBLASLt), checked against the GPU that runs it (check_device).
  std::map<std::string, std::string> gpu;
};

TargetInfo detect_host();

// The target of a build: BuilderConfig's device ("cpu"; CUDA is refused until its backend exists),
// instruction set (cfg.isa caps this machine's: asking for features it lacks is an error, since the
// tuner times kernels here), layout block (-1: what the CPU backend prefers for that instruction set)
// and precision. Errors name the option and the valid values.
Result<Target> target_for(const BuilderConfig& cfg);
// This machine's default target: what target_for(BuilderConfig{}) gives.
Target host_target();

// Ok when this machine has the device an engine built for `built_for` on a machine `built_on` runs
// on (CPU engines: always), with the same GPU model, compute capability and cuBLASLt; else an error
// saying what differs.
Status check_device(const Target& built_for, const TargetInfo& built_on);

// Ok when `host` can run kernels needing `required` features; the error lists what is missing.
Status check_runnable(const std::vector<std::string>& required, const TargetInfo& built_on, const TargetInfo& host);

}  // namespace kiln::engine
