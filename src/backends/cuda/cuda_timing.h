// The tuner's CUDA timing (cuda_runtime.cc, DeviceRuntime::time_ms): a kernel that keeps the stream busy
// for a while, so that the work timed after it is queued before the GPU reaches the first event.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kiln::backends::cuda {

// One thread that returns after `ns` nanoseconds of the GPU's global timer.
cudaError_t launch_delay(uint64_t ns, cudaStream_t s);

}  // namespace kiln::backends::cuda
