// Every libFuzzer target in one binary: KILN_FUZZ_TARGET=onnx_import|engine|npy|tensor_pb|
// timing_cache|shapes picks which (one binary to copy to another machine instead of six).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define KILN_FUZZ_ALL
#include "fuzz_engine.cc"
#include "fuzz_npy.cc"
#include "fuzz_onnx_import.cc"
#include "fuzz_shapes.cc"
#include "fuzz_tensor_pb.cc"
#include "fuzz_timing_cache.cc"

namespace {
using Fn = int (*)(const uint8_t*, size_t);
Fn pick() {
  const char* t = std::getenv("KILN_FUZZ_TARGET");
  const struct {
    const char* name;
    Fn fn;
  } kTargets[] = {{"onnx_import", kiln_fuzz_onnx_import},
                  {"engine", kiln_fuzz_engine},
                  {"npy", kiln_fuzz_npy},
                  {"tensor_pb", kiln_fuzz_tensor_pb},
                  {"timing_cache", kiln_fuzz_timing_cache},
                  {"shapes", kiln_fuzz_shapes}};
  for (const auto& k : kTargets)
    if (t && std::strcmp(t, k.name) == 0) return k.fn;
  std::fprintf(stderr, "set KILN_FUZZ_TARGET to onnx_import, engine, npy, tensor_pb, timing_cache or shapes\n");
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Fn fn = pick();
  return fn(data, size);
}
