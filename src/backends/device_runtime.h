// The memory and stream services of an accelerator, as the engine and the tuner need them: device
// buffers (the context's arena, staged inputs and outputs), pinned host staging, a stream per
// execution context, copies and synchronization. A backend for a device kind implements it
// (backends/cuda/cuda_runtime.cc); the engine reaches it through device_runtime() and includes no
// device headers, so CPU-only builds compile the same engine code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "core/status.h"
#include "core/target.h"
#include "core/tensor.h"

namespace kiln::backends {

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual DeviceKind kind() const = 0;
  // Why device `index` cannot be used here ("no CUDA driver", "cuda:3: the machine has 1 device");
  // "" when it can.
  virtual std::string why_unavailable(int index) const = 0;
  // What identifies the device and its software for an engine built on it: "name", "compute_capability",
  // "driver", "runtime", plus the backend's libraries ("cublaslt"). Empty when unavailable.
  virtual std::map<std::string, std::string> identity(int index) const = 0;
  // Why an engine whose kernels were chosen on `built` cannot run on device `index`, naming every
  // field that differs; "" when it can.
  virtual std::string incompatibility(const std::map<std::string, std::string>& built, int index) const = 0;

  // Device memory of `bytes` (at least 256-byte aligned) on device `index`, freed with the last copy.
  virtual Result<std::shared_ptr<uint8_t[]>> allocate(int index, size_t bytes) const = 0;
  // Page-locked host memory (fast, asynchronous copies), freed with the last copy.
  virtual Result<std::shared_ptr<uint8_t[]>> allocate_pinned(size_t bytes) const = 0;
  // A stream of its own on device `index` (opaque: cudaStream_t for CUDA), destroyed with the last copy.
  virtual Result<std::shared_ptr<void>> create_stream(int index) const = 0;

  enum class Copy { kHostToDevice, kDeviceToHost, kDeviceToDevice };
  // Queued on `stream` (nullptr: the default stream); host memory that is not pinned makes it synchronous.
  virtual Status copy(void* dst, const void* src, size_t bytes, Copy kind, void* stream) const = 0;
  virtual Status fill(void* dst, int byte, size_t bytes, void* stream) const = 0;
  // Waits until the work queued on `stream` is done; the first error of that work, naming it.
  virtual Status synchronize(void* stream) const = 0;
  // Runs `run` (which queues its work on `stream`) between two events recorded on `stream` and waits
  // for the second: the device time of the queued work in milliseconds (the tuner's timer).
  virtual Result<double> time_ms(const std::function<Status()>& run, void* stream) const = 0;
  // Graphs (CUDA graphs): between begin_capture and end_capture the work queued on `stream` is recorded,
  // not run; end_capture instantiates it into an executable graph (destroyed with the last copy), which
  // launch_graph replays on a stream with the pointers it was captured with. A capture that fails (a
  // synchronization or a pageable copy inside it) ends with the error. Unsupported where the backend
  // has no graphs.
  virtual Status begin_capture(void* stream) const {
    (void)stream;
    return Unsupported("this device runtime has no graphs");
  }
  virtual Result<std::shared_ptr<void>> end_capture(void* stream) const {
    (void)stream;
    return Unsupported("this device runtime has no graphs");
  }
  virtual Status launch_graph(void* graph, void* stream) const {
    (void)graph, (void)stream;
    return Unsupported("this device runtime has no graphs");
  }
  // Where the bytes at `p` live: {kCuda, device} for device (or managed) memory, host otherwise (pageable,
  // pinned or unknown to the driver): how the C++ API checks a pointer given as device memory.
  virtual Result<MemoryLocation> locate(const void* p) const {
    (void)p;
    return Unsupported("this device runtime cannot locate pointers");
  }
  // An event on device `index` for order_after (cudaEvent_t for CUDA, without timing), destroyed with
  // the last copy.
  virtual Result<std::shared_ptr<void>> create_event(int index) const {
    (void)index;
    return Unsupported("this device runtime has no events");
  }
  // Makes the work queued on `waiter` from now on wait (on the device: the host goes on) for the work
  // queued on `producer` so far, through `event` (recorded on `producer`). nullptr is the default stream.
  virtual Status order_after(void* waiter, void* producer, void* event) const {
    (void)waiter, (void)producer, (void)event;
    return Unsupported("this device runtime has no events");
  }
};

// What identifies device `index` of `rt` and its software in timing-cache keys: its identity()
// (model, compute capability, driver, runtime, libraries) as one word, "" when unavailable. Memoized.
std::string identity_key(const DeviceRuntime& rt, int index);

// The runtime of `kind` when this build has a backend for it (nullptr for the CPU, and for CUDA in a
// build without -DKILN_CUDA).
const DeviceRuntime* device_runtime(DeviceKind kind);

// A copy of host tensor `t` in device memory of `rt` (device `index`), queued on `stream`; the
// tensor's location says where it lives. Undefined tensors stay undefined.
Result<Tensor> to_device(const DeviceRuntime& rt, int index, const Tensor& t, void* stream);
// An uninitialized device tensor of this dtype and shape.
Result<Tensor> device_tensor(const DeviceRuntime& rt, int index, DataType dtype, const Dims& shape);
// A host copy of device tensor `t` (synchronizes `stream` first).
Result<Tensor> to_host(const DeviceRuntime& rt, const Tensor& t, void* stream);

}  // namespace kiln::backends
