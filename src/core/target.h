// What an engine is built for: the device, the instruction set its kernels may use, the blocked
// layout's block and the precision it computes in. The builder makes one from BuilderConfig (and
// this machine); the passes and the tactics' signatures read it instead of the build machine or the
// environment, and the engine file records it (a later CUDA target adds a device kind, not a type).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "kiln/device.h"

namespace kiln {

// Device and DeviceKind are the public API's (std only).
std::string device_name(const Device& d);  // "cpu", "cuda:0"
// "cpu", "cuda" (device 0) or "cuda:N": false for anything else.
bool parse_device(const std::string& name, Device* out);

// CPU instruction-set features, as a set of bits: what a tactic's kernels need (TacticInfo::isa)
// and what a target offers (Target::isa). The empty set is portable C++.
using IsaSet = uint32_t;
enum IsaFeature : IsaSet {
  kIsaAvx2 = 1u << 0,        // AVX2 + FMA
  kIsaAvx512 = 1u << 1,      // AVX-512 F, BW, DQ, VL
  kIsaAvx512Vnni = 1u << 2,  // AVX-512 VNNI (int8 dot products)
  kIsaAvx512Bf16 = 1u << 3,  // AVX-512 BF16
  kIsaAmx = 1u << 4,         // AMX tiles with int8 and bf16
};
inline constexpr IsaSet kIsaPortable = 0;
inline constexpr IsaSet kIsaAll = kIsaAvx2 | kIsaAvx512 | kIsaAvx512Vnni | kIsaAvx512Bf16 | kIsaAmx;

// "avx2 avx512", or "portable" for the empty set.
std::string isa_names(IsaSet s);
// A level named on the command line (--isa): "portable", "avx2", "avx512", "avx512_vnni",
// "avx512_bf16", "amx"; each includes the levels before it. False for an unknown name.
bool parse_isa_level(const std::string& name, IsaSet* out);
// One feature by its name in isa_names ("avx512_vnni"); false for an unknown name.
bool parse_isa_feature(const std::string& name, IsaSet* out);
const char* isa_level_names();  // "portable, avx2, avx512, avx512_vnni, avx512_bf16, amx" (for errors)
// The features of the CPU this process runs on.
IsaSet host_isa();

struct Target {
  Device device;
  IsaSet isa = kIsaPortable;  // what the kernels may use (CPU): the machine's, or less (--isa)
  // Channels per block of the blocked conv layout (passes/layout_blocked.cc): 16 for AVX-512's 16
  // floats, 8 for AVX2's, 0 for plain NCHW.
  int64_t layout_block = 0;
  DataType precision = DataType::kFloat32;  // what the layers compute in
  bool tf32 = false;  // float32 matrix products may use TF32 tensor cores (CUDA only: BuilderConfig::tf32)
  // CUDA float16/bfloat16 matrix products keep GELU (erf) exact instead of cuBLASLt's tanh-form
  // epilogue (BuilderConfig::exact_gelu).
  bool exact_gelu = false;
  // The build allows float16 or bfloat16 layers (--fp16, --bf16, --best): the CUDA channels-last
  // layout pass (passes/layout_nhwc.cc) runs for those.
  bool reduced_float = false;
  // CUDA: the channels-last layout pass runs (BuilderConfig::channels_last; by default reduced_float).
  bool channels_last = false;
  bool operator==(const Target&) const = default;
};
// "cpu avx2 avx512, layout block 16, float32".
std::string target_description(const Target& t);

}  // namespace kiln
