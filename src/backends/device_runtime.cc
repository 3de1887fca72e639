#include "backends/device_runtime.h"

#include <algorithm>
#include <mutex>

#include "core/tensor.h"

namespace kiln::backends {

Result<Tensor> device_tensor(const DeviceRuntime& rt, int index, DataType dtype, const Dims& shape) {
  if (dtype == DataType::kString) return Unsupported("string tensors cannot live in device memory");
  size_t bytes = static_cast<size_t>(dims_numel(shape)) * dtype_size(dtype);
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<uint8_t[]> buf, rt.allocate(index, bytes));
  MemoryLocation where{MemoryLocation::Kind::kCuda, index};
  return Tensor::alias(dtype, shape, std::move(buf), 0, where);
}

Result<Tensor> to_device(const DeviceRuntime& rt, int index, const Tensor& t, void* stream) {
  if (!t.defined()) return Tensor();
  KILN_ASSIGN_OR_RETURN(Tensor d, device_tensor(rt, index, t.dtype(), t.shape()));
  if (t.nbytes())
    KILN_RETURN_IF_ERROR(rt.copy(d.raw(), t.raw(), t.nbytes(), DeviceRuntime::Copy::kHostToDevice, stream));
  return d;
}

Result<Tensor> to_host(const DeviceRuntime& rt, const Tensor& t, void* stream) {
  if (!t.defined()) return Tensor();
  if (t.location().host()) return t;
  Tensor h = Tensor::uninitialized(t.dtype(), t.shape());
  if (t.nbytes())
    KILN_RETURN_IF_ERROR(rt.copy(h.raw(), t.raw(), t.nbytes(), DeviceRuntime::Copy::kDeviceToHost, stream));
  KILN_RETURN_IF_ERROR(rt.synchronize(stream));
  return h;
}

std::string identity_key(const DeviceRuntime& rt, int index) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::string> memo;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = memo.try_emplace({static_cast<int>(rt.kind()), index});
  if (!fresh) return it->second;
  std::string key;
  // Not the memory size: timings do not depend on it.
  for (const auto& [field, value] : rt.identity(index))
    if (field != "memory_mib") key += (key.empty() ? "" : "|") + field + "=" + value;
  std::replace(key.begin(), key.end(), ' ', '_');  // keys are read as space-separated words
  it->second = key;
  return key;
}

}  // namespace kiln::backends
