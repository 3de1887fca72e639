#include "engine/target.h"

#include <fstream>
#include <thread>

#include "backends/cpu/tactic_list.h"
#include "backends/device_runtime.h"

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
  t.device = cfg.device;
  if (cfg.device.kind != DeviceKind::kCPU) {
    // Kernels are timed on the device that builds: it must be here.
    const backends::DeviceRuntime* rt = backends::device_runtime(cfg.device.kind);
    if (!rt)
      return Unsupported("device ", device_name(cfg.device),
                         ": this kiln was built without the CUDA backend (configure with -DKILN_CUDA=ON on a machine "
                         "with the CUDA toolkit) — build for the cpu");
    if (std::string why = rt->why_unavailable(cfg.device.index); !why.empty())
      return Unsupported("device ", device_name(cfg.device), ": ", why,
                         " — build on the machine with the GPU (kernels are timed there), or for the cpu");
  } else if (cfg.tf32) {
    return InvalidArgument("--tf32 applies to CUDA builds (TF32 is a tensor-core format): build with --device cuda");
  }
  t.tf32 = cfg.tf32;
  t.exact_gelu = cfg.exact_gelu;
  for (Precision p : cfg.extra_precisions) t.reduced_float |= p == Precision::kFP16 || p == Precision::kBF16;
  t.reduced_float |=
      cfg.precision == Precision::kFP16 || cfg.precision == Precision::kBF16 || cfg.precision == Precision::kMixed;
  if (cfg.channels_last < -1 || cfg.channels_last > 1)
    return InvalidArgument("channels_last ", cfg.channels_last, ": -1 (auto), 0 or 1");
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
  if (cfg.device.kind == DeviceKind::kCUDA) {
    t.channels_last = cfg.channels_last == 1 || (cfg.channels_last == -1 && t.reduced_float);
  } else {
    // CPU: channels-last bfloat16 storage is the AMX path (backends/cpu/onednn_nhwc_bf16.cc): oneDNN runs
    // its AMX kernels on nhwc only, and without AMX its blocked-layout kernels are the fast ones.
    // (--bf16 only: --best's per-layer choice between INT8, BF16 and FP32 keeps the blocked layout.)
    bool bf16 = cfg.precision == Precision::kBF16;
    for (Precision p : cfg.extra_precisions) bf16 |= p == Precision::kBF16;
    const bool amx = (t.isa & kIsaAmx) != 0 && backends::cpu::preferred_layout_block(kIsaAll) != 0;
    if (cfg.channels_last == 1 && !(amx && bf16))
      return InvalidArgument(
          "--channels-last on: on the CPU it is the AMX bfloat16 path, for --bf16 (or --best) "
          "builds on a CPU with AMX",
          amx ? "" : " (this target has none: its layout is --layout-block)");
    t.channels_last = amx && bf16 && cfg.channels_last != 0;
  }
  if (cfg.device.kind != DeviceKind::kCPU) {
    // The blocked layout is the CPU kernels' (and its ops have no CUDA kernels): plain NCHW on a GPU.
    if (cfg.layout_block > 0)
      return InvalidArgument("--layout-block ", cfg.layout_block,
                             ": the blocked layout is for CPU builds — leave it out");
    t.layout_block = 0;
  } else if (cfg.layout_block < 0) {
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

Status check_device(const Target& built_for, const TargetInfo& built_on) {
  if (built_for.device.kind == DeviceKind::kCPU) return Status::Ok();
  const backends::DeviceRuntime* rt = backends::device_runtime(built_for.device.kind);
  if (!rt)
    return Unsupported("this engine was built for ", device_name(built_for.device), " (",
                       built_on.gpu.count("name") ? built_on.gpu.at("name") : "a GPU",
                       ") and this kiln has no CUDA backend — use a kiln configured with -DKILN_CUDA=ON");
  if (std::string why = rt->incompatibility(built_on.gpu, built_for.device.index); !why.empty())
    return Unsupported("this engine was built for ", device_name(built_for.device), " and cannot run here: ", why,
                       " — rebuild the engine on this GPU from the ONNX model with kiln build --device ",
                       device_name(built_for.device));
  return Status::Ok();
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
