// cuda_timing.h's delay kernel.
#include "backends/cuda/cuda_timing.h"

namespace kiln::backends::cuda {
namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void delay_kernel(uint64_t ns) {
  const uint64_t start = global_ns();
  while (global_ns() - start < ns) __nanosleep(500);
}

}  // namespace

cudaError_t launch_delay(uint64_t ns, cudaStream_t s) {
  delay_kernel<<<1, 1, 0, s>>>(ns);
  return cudaGetLastError();
}

}  // namespace kiln::backends::cuda
