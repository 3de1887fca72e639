#include "engine/target.h"

#include <fstream>
#include <thread>

#include "backends/cpu/tactic_list.h"

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

Result<Target> target_for(const BuilderConfig& cfg) {
  Target t;
  if (cfg.device.kind != DeviceKind::kCPU)
    return Unsupported("device ", device_name(cfg.device), ": this kiln has no CUDA backend yet — build for the cpu");
  t.device = cfg.device;
  const IsaSet host = host_isa();
  t.isa = host;
  if (!cfg.isa.empty() && cfg.isa != "native") {
    IsaSet want;
    if (!parse_isa_level(cfg.isa, &want))
      return InvalidArgument("unknown --isa '", cfg.isa, "' (one of: native, ", isa_level_names(), ")");
    if (IsaSet missing = want & ~host)
      return Unsupported("--isa ", cfg.isa, " asks for ", isa_names(missing), ", which this machine lacks (it has ",
                         isa_names(host),
                         "): kernels are timed on the machine that builds — build on a machine "
                         "with those features, or ask for less");
    t.isa = want;
  }
  if (cfg.layout_block < 0) {
    t.layout_block = backends::cpu::preferred_layout_block(t.isa);
  } else {
    if (cfg.layout_block != 0 && cfg.layout_block != 8 && cfg.layout_block != 16)
      return InvalidArgument("--layout-block ", cfg.layout_block,
                             ": the blocked layout has 8 or 16 channels per "
                             "block (0: plain NCHW; auto: the instruction set's vector width)");
    if (cfg.layout_block != 0 && backends::cpu::preferred_layout_block(kIsaAll) == 0)
      return Unsupported("--layout-block ", cfg.layout_block,
                         ": this kiln has no blocked kernels (built without "
                         "oneDNN) — leave the option out or use 0");
    t.layout_block = cfg.layout_block;
  }
  // The layers' default compute precision: float32 whatever the flags allow. Which other precisions a
  // layer may use is resolved per layer (engine/precision.h) and recorded with the layer.
  t.precision = DataType::kFloat32;
  return t;
}

Target host_target() {
  auto t = target_for(BuilderConfig{});
  return t.ok() ? t.value() : Target{};
}

Status check_runnable(const std::vector<std::string>& required, const TargetInfo& built_on, const TargetInfo& host) {
  std::string missing;
  const std::string host_levels = " " + isa_names(host_isa()) + " ";  // kiln's names (avx512_bf16, amx)
  for (const auto& r : required) {
    bool have = host_levels.find(" " + r + " ") != std::string::npos;
    for (const auto& h : host.isa) have |= h == r;
    if (!have) missing += (missing.empty() ? "" : ", ") + r;
  }
  if (missing.empty()) return Status::Ok();
  return Unsupported("this engine was built for '", built_on.cpu_model,
                     "' and its kernels need CPU features this machine ('", host.cpu_model, "') lacks: ", missing,
                     " — rebuild the engine on this machine from the ONNX model with kiln build");
}

}  // namespace kiln::engine
