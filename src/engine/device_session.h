// What an execution context of a device engine (one built for CUDA) holds besides the CPU's: the
// device runtime, a stream of its own (every layer of the context runs on it, so contexts on other
// streams run concurrently), the arena in device memory, and the boundary copies: host inputs staged
// through pinned memory into device buffers before a run, device outputs back into host tensors after
// it. Device-generic: the backend is reached through backends::DeviceRuntime.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/device_runtime.h"
#include "core/target.h"
#include "engine/target.h"
#include "ops/value.h"

namespace kiln::engine {

class DeviceSession {
 public:
  // nullptr (and Ok) for a CPU engine; else a session on the engine's device, or why this machine
  // cannot run it (no backend, no GPU, another GPU model: check_device).
  static Result<std::unique_ptr<DeviceSession>> open(const Target& built_for, const TargetInfo& built_on);

  const backends::DeviceRuntime& runtime() const { return rt_; }
  Device device() const { return device_; }
  MemoryLocation location() const { return {MemoryLocation::Kind::kCuda, device_.index}; }
  void* stream() const { return stream_.get(); }

  // Device memory for the context's arena (zeroed).
  Result<std::shared_ptr<uint8_t[]>> allocate_arena(size_t bytes);
  // Device copies of the host tensors `host` in `device` (buffers reused while shapes and dtypes stay),
  // copied through pinned staging on the stream. A tensor already in this device's memory is used as it is.
  Status stage_inputs(const std::map<std::string, ops::Value>& host, std::map<std::string, ops::Value>& device);
  // Replaces every device tensor of `outputs` by a host copy (buffers reused while shapes stay), after
  // waiting for the stream: the run's errors surface here. Outputs marked in `keep` (when it has an
  // entry for them) stay on the device.
  Status fetch_outputs(std::vector<ops::Value>& outputs, const std::vector<bool>& keep = {});

 private:
  DeviceSession(const backends::DeviceRuntime& rt, Device d) : rt_(rt), device_(d) {}
  Status reserve_staging(size_t bytes);

  const backends::DeviceRuntime& rt_;
  Device device_;
  std::shared_ptr<void> stream_;
  std::shared_ptr<uint8_t[]> staging_;  // pinned
  size_t staging_bytes_ = 0;
  std::vector<Tensor> host_outputs_;
};

}  // namespace kiln::engine
