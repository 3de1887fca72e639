#include "engine/target.h"

#include <fstream>
#include <thread>

namespace kiln::engine {

TargetInfo detect_host() {
  TargetInfo t;
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0 && t.cpu_model.empty()) {
      size_t c = line.find(':');
      if (c != std::string::npos) t.cpu_model = line.substr(c + 2);
    }
  }
  __builtin_cpu_init();
#define KILN_ISA(name) \
  if (__builtin_cpu_supports(name)) t.isa.push_back(name);
  KILN_ISA("sse4.2")
  KILN_ISA("avx")
  KILN_ISA("avx2")
  KILN_ISA("fma")
  KILN_ISA("avx512f")
  KILN_ISA("avx512bw")
  KILN_ISA("avx512vl")
  KILN_ISA("avx512vnni")
  KILN_ISA("avx512bf16")
#undef KILN_ISA
  t.cores = static_cast<int>(std::thread::hardware_concurrency());
  return t;
}

Status check_runnable(const std::vector<std::string>& required, const TargetInfo& built_on, const TargetInfo& host) {
  std::string missing;
  for (const auto& r : required) {
    bool have = false;
    for (const auto& h : host.isa) have |= h == r;
    if (!have) missing += (missing.empty() ? "" : ", ") + r;
  }
  if (missing.empty()) return Status::Ok();
  return Unsupported("this engine was built for '", built_on.cpu_model,
                     "' and its kernels need CPU features this machine ('", host.cpu_model, "') lacks: ", missing,
                     " — rebuild the engine on this machine from the ONNX model with kiln build");
}

}  // namespace kiln::engine
