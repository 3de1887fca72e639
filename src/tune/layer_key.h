// The identity of a layer for the timing cache: everything that decides which kernels can run it and
// how fast, and nothing else (not the node's name, not its provenance, not the weights' values).
//
//   domain, op type, opset; every attribute but "kiln.sources" (subgraph bodies and tensors by a
//   content hash); per input: present or not, dtype, concrete dims, constant or not (small constants,
//   which act as parameters — axes, shapes, pads, scalars — by a content hash as well); the device
//   (for a GPU also its model, compute capability, driver, CUDA runtime, cuBLASLt and cuDNN versions:
//   backends::identity_key), the instruction set the target lets kernels use (--isa) and the compute
//   precision.
//
// The thread count, the machine and the kiln version complete the key in the cache (timing_cache.h).
#pragma once

#include <cstdint>
#include <string>

#include "backends/tactic.h"
#include "ir/graph.h"

namespace kiln::tune {

// A stable, readable text, e.g.
//   "Conv/13{group=1;kernel_shape=[3,3];pads=[1,1,1,1];strides=[1,1]}(float32[1,64,56,56],
//    float32[64,64,3,3]const,float32[64]const)@cpu[avx2+avx512]:float32"
std::string layer_key(const backends::LayerSignature& sig);

// FNV-1a, 64 bits: content hashes inside keys (not cryptographic; a collision costs a wrong timing).
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull);
std::string hex64(uint64_t v);

}  // namespace kiln::tune
