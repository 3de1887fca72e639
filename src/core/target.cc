#include "core/target.h"

namespace kiln {

std::string device_name(const Device& d) {
  return d.kind == DeviceKind::kCPU ? "cpu" : "cuda:" + std::to_string(d.index);
}

bool parse_device(const std::string& name, Device* out) {
  if (name == "cpu") return *out = Device{}, true;
  if (name == "cuda") return *out = Device{DeviceKind::kCUDA, 0}, true;
  if (name.rfind("cuda:", 0) != 0 || name.size() == 5 || name.size() > 8) return false;
  int index = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    index = index * 10 + (name[i] - '0');
  }
  *out = Device{DeviceKind::kCUDA, index};
  return true;
}

namespace {
struct IsaLevel {
  const char* name;
  IsaFeature feature;
};
constexpr IsaLevel kLevels[] = {{"avx2", kIsaAvx2},
                                {"avx512", kIsaAvx512},
                                {"avx512_vnni", kIsaAvx512Vnni},
                                {"avx512_bf16", kIsaAvx512Bf16},
                                {"amx", kIsaAmx}};
}  // namespace

std::string isa_names(IsaSet s) {
  std::string out;
  for (const IsaLevel& l : kLevels)
    if (s & l.feature) out += (out.empty() ? "" : " ") + std::string(l.name);
  return out.empty() ? "portable" : out;
}

bool parse_isa_level(const std::string& name, IsaSet* out) {
  IsaSet s = kIsaPortable;
  if (name == "portable") return *out = s, true;
  for (const IsaLevel& l : kLevels) {
    s |= l.feature;
    if (name == l.name) return *out = s, true;
  }
  return false;
}

bool parse_isa_feature(const std::string& name, IsaSet* out) {
  for (const IsaLevel& l : kLevels)
    if (name == l.name) return *out = l.feature, true;
  return false;
}

const char* isa_level_names() { return "portable, avx2, avx512, avx512_vnni, avx512_bf16, amx"; }

IsaSet host_isa() {
  static const IsaSet isa = [] {
    IsaSet s = kIsaPortable;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) s |= kIsaAvx2;
    if ((s & kIsaAvx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
      s |= kIsaAvx512;
    if ((s & kIsaAvx512) && __builtin_cpu_supports("avx512vnni")) s |= kIsaAvx512Vnni;
    if ((s & kIsaAvx512) && __builtin_cpu_supports("avx512bf16")) s |= kIsaAvx512Bf16;
#if defined(__GNUC__) && __GNUC__ >= 11
    if (__builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") && __builtin_cpu_supports("amx-bf16"))
      s |= kIsaAmx;
#endif
#endif
    return s;
  }();
  return isa;
}

std::string target_description(const Target& t) {
  std::string s = device_name(t.device);
  if (t.device.kind == DeviceKind::kCPU) s += " " + isa_names(t.isa);
  s += ", layout block " + std::to_string(t.layout_block) + ", " + dtype_name(t.precision);
  return s;
}

}  // namespace kiln
