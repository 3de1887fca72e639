#include "engine/device_session.h"

#include <cstring>

namespace kiln::engine {

using Copy = backends::DeviceRuntime::Copy;

Result<std::unique_ptr<DeviceSession>> DeviceSession::open(const Target& built_for, const TargetInfo& built_on) {
  if (built_for.device.kind == DeviceKind::kCPU) return std::unique_ptr<DeviceSession>();
  KILN_RETURN_IF_ERROR(check_device(built_for, built_on));
  const backends::DeviceRuntime* rt = backends::device_runtime(built_for.device.kind);
  std::unique_ptr<DeviceSession> s(new DeviceSession(*rt, built_for.device));
  KILN_ASSIGN_OR_RETURN(s->stream_, rt->create_stream(built_for.device.index));
  return s;
}

Result<std::shared_ptr<uint8_t[]>> DeviceSession::allocate_arena(size_t bytes) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<uint8_t[]> a, rt_.allocate(device_.index, bytes));
  KILN_RETURN_IF_ERROR(rt_.fill(a.get(), 0, bytes, stream()));
  return a;
}

Status DeviceSession::reserve_staging(size_t bytes) {
  if (bytes <= staging_bytes_) return Status::Ok();
  KILN_ASSIGN_OR_RETURN(staging_, rt_.allocate_pinned(bytes));
  staging_bytes_ = bytes;
  return Status::Ok();
}

Status DeviceSession::stage_inputs(const std::map<std::string, ops::Value>& host,
                                   std::map<std::string, ops::Value>& device) {
  for (auto it = device.begin(); it != device.end();) it = host.count(it->first) ? std::next(it) : device.erase(it);
  size_t total = 0;
  for (const auto& [name, v] : host) {
    if (!v.is_tensor()) return Unsupported("input '", name, "' is not a tensor: a GPU engine takes tensors only");
    if (v.tensor.location().host()) total += (v.tensor.nbytes() + 255) / 256 * 256;
  }
  KILN_RETURN_IF_ERROR(reserve_staging(total));
  size_t at = 0;
  for (const auto& [name, v] : host) {
    const Tensor& t = v.tensor;
    if (!t.location().host()) {
      if (t.location() != location())
        return InvalidArgument("input '", name, "' lives in ", t.location().str(), " memory; this engine runs on ",
                               device_name(device_));
      device[name] = v;
      continue;
    }
    ops::Value& d = device[name];
    if (!d.is_tensor() || d.tensor.dtype() != t.dtype() || d.tensor.shape() != t.shape() ||
        d.tensor.location().host()) {
      KILN_ASSIGN_OR_RETURN(Tensor fresh, backends::device_tensor(rt_, device_.index, t.dtype(), t.shape()));
      d = ops::Value(std::move(fresh));
    }
    if (t.nbytes()) {
      std::memcpy(staging_.get() + at, t.raw(), t.nbytes());
      KILN_RETURN_IF_ERROR(rt_.copy(d.tensor.raw(), staging_.get() + at, t.nbytes(), Copy::kHostToDevice, stream()));
    }
    at += (t.nbytes() + 255) / 256 * 256;
  }
  return Status::Ok();
}

Status DeviceSession::fetch_outputs(std::vector<ops::Value>& outputs, const std::vector<bool>& keep) {
  auto fetched = [&](size_t o) {
    const ops::Value& v = outputs[o];
    return v.is_tensor() && !v.tensor.location().host() && !(o < keep.size() && keep[o]);
  };
  size_t total = 0;
  for (size_t o = 0; o < outputs.size(); ++o)
    if (fetched(o)) total += (outputs[o].tensor.nbytes() + 255) / 256 * 256;
  // Queued copies may still read the inputs' staging: reused once the run is done.
  KILN_RETURN_IF_ERROR(rt_.synchronize(stream()));
  KILN_RETURN_IF_ERROR(reserve_staging(total));
  size_t at = 0;
  for (size_t o = 0; o < outputs.size(); ++o) {
    const ops::Value& v = outputs[o];
    if (!fetched(o) || !v.tensor.nbytes()) continue;
    KILN_RETURN_IF_ERROR(
        rt_.copy(staging_.get() + at, v.tensor.raw(), v.tensor.nbytes(), Copy::kDeviceToHost, stream()));
    at += (v.tensor.nbytes() + 255) / 256 * 256;
  }
  KILN_RETURN_IF_ERROR(rt_.synchronize(stream()));
  host_outputs_.resize(outputs.size());
  at = 0;
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (!fetched(o)) continue;
    ops::Value& v = outputs[o];
    Tensor& h = host_outputs_[o];
    if (!h.defined() || h.dtype() != v.tensor.dtype() || h.shape() != v.tensor.shape() || h.raw() == nullptr)
      h = Tensor::uninitialized(v.tensor.dtype(), v.tensor.shape());
    if (v.tensor.nbytes()) std::memcpy(h.raw(), staging_.get() + at, v.tensor.nbytes());
    at += (v.tensor.nbytes() + 255) / 256 * 256;
    v.tensor = h;
  }
  return Status::Ok();
}

}  // namespace kiln::engine
