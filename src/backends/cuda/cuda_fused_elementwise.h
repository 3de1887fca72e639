// kiln.FusedElementwise on CUDA: the fused tree as a small op program that one kernel interprets per
// output element in registers (cuda_elementwise.cu), each input read through its broadcast strides.
// Float32, float16 or bfloat16 storage (every input and the output in it), float32 arithmetic: each
// step rounds nothing, the output is rounded once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/cuda_kernels.h"

namespace kiln::backends::cuda {

constexpr int kFusedMaxInputs = 8, kFusedMaxSteps = 16;

// One step: unary (b < 0) or binary. Operands are slots: 0 .. inputs-1 the inputs, inputs + k step k's
// result; step k writes slot inputs + k, the last step's slot is the output.
struct FusedStep {
  bool binary = false;
  UnaryParams unary;
  BinaryOp bop = BinaryOp::kAdd;
  int a = 0, b = -1;
};

struct FusedProgram {
  int num_inputs = 0, num_steps = 0;
  FusedStep steps[kFusedMaxSteps];
  // The output dims and each input's strides over them (0 where it broadcasts).
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[kFusedMaxInputs][kMaxRank] = {};
};

// y[i] = the program's output at element i of the output (n elements); inputs[j] in slot j.
cudaError_t launch_fused_elementwise(const void* const* inputs, void* y, int64_t n, const FusedProgram& p, FloatType t,
                                     cudaStream_t s);

}  // namespace kiln::backends::cuda
