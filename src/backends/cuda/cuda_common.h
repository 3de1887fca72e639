// Pieces every CUDA tactic shares: errors as Status, the backend's DeviceRuntime, a cuBLASLt handle
// per device, and device copies of a layer's constant inputs (weights) made at prepare time.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/device_runtime.h"
#include "backends/tactic.h"

namespace kiln::backends::cuda {

// Ok for cudaSuccess, else an error naming `what` and CUDA's message.
Status cuda_status(cudaError_t e, const char* what);
#define KILN_CUDA_RETURN_IF_ERROR(call) KILN_RETURN_IF_ERROR(::kiln::backends::cuda::cuda_status((call), #call))

// "cuBLASLt 13.1.0" (the loaded library's version); "" when it cannot be loaded.
std::string cublaslt_version();
// The process's cuBLASLt handle (created on first use; cuBLASLt handles are thread-safe).
Result<void*> cublaslt_handle();

inline cudaStream_t stream_of(const RunContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

// The layer's inputs as a run sees them: constant inputs (initializers) were copied to the device at
// prepare time, so the host tensors the executor passes for them are never read; the others are
// the run's device tensors.
class DeviceConstants {
 public:
  Status upload(const LayerSignature& sig);  // copies every constant input (synchronously)
  const void* data(size_t i, const std::vector<const Tensor*>& inputs) const {
    if (i < consts_.size() && consts_[i].defined()) return consts_[i].raw();
    return i < inputs.size() && inputs[i] ? inputs[i]->raw() : nullptr;
  }
  const Tensor* host(size_t i) const { return i < host_.size() ? host_[i] : nullptr; }

 private:
  std::vector<Tensor> consts_;
  std::vector<const Tensor*> host_;
};

}  // namespace kiln::backends::cuda
