#include "backends/registry.h"

#include <algorithm>

#include "backends/cpu/tactic_list.h"
#include "backends/device_runtime.h"
#ifdef KILN_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace kiln::backends {

namespace {
// One entry per backend compiled in, in priority order (its tactics, in its own order, follow the
// previous backend's). A CUDA backend adds {cuda::tactic_list, cuda::library_versions} here.
struct Backend {
  const std::vector<const Tactic*>& (*tactics)();
  std::string (*libraries)();
};
const Backend kBackends[] = {
    {cpu::tactic_list, cpu::library_versions},
#ifdef KILN_HAVE_CUDA
    {cuda::tactic_list, cuda::library_versions},
#endif
};
}  // namespace

const DeviceRuntime* device_runtime(DeviceKind kind) {
#ifdef KILN_HAVE_CUDA
  if (kind == DeviceKind::kCUDA) return &cuda::runtime();
#endif
  (void)kind;
  return nullptr;
}

namespace {
std::vector<const Tactic*>& tactic_registry() {
  static std::vector<const Tactic*> list = [] {
    std::vector<const Tactic*> v;
    for (const Backend& b : kBackends) v.insert(v.end(), b.tactics().begin(), b.tactics().end());
    return v;
  }();
  return list;
}
}  // namespace

const std::vector<const Tactic*>& all_tactics() { return tactic_registry(); }

void add_tactic(const Tactic* t) { tactic_registry().push_back(t); }

const Tactic* find_tactic(const std::string& name) {
  for (const Tactic* t : all_tactics())
    if (t->name() == name) return t;
  return nullptr;
}

std::string tactic_libraries() {
  std::string out;
  for (const Backend& b : kBackends)
    if (std::string l = b.libraries(); !l.empty()) out += (out.empty() ? "" : " + ") + l;
  return out;
}

bool implements(const Tactic& t, const LayerSignature& sig) {
  if (t.info().device != sig.device.kind) return false;
  auto ops = t.ops();
  return std::find(ops.begin(), ops.end(), std::make_pair(sig.domain(), sig.op())) != ops.end();
}

std::string info_mismatch(const TacticInfo& info, const LayerSignature& sig) {
  if (info.device != sig.device.kind) {
    Device d{info.device, sig.device.index};
    return "runs on " + device_name(d) + "; the layer is on " + device_name(sig.device);
  }
  if (IsaSet missing = info.isa & ~sig.isa)
    return "needs " + isa_names(missing) + "; the target has " + isa_names(sig.isa);
  if (info.compute != DataType::kUndefined && info.compute != sig.compute)
    return std::string("computes in ") + dtype_name(info.compute) + "; the layer computes in " +
           dtype_name(sig.compute);
  if (info.any_float_compute && !dtype_is_float(sig.compute))
    return std::string("computes in a float precision; the layer computes in ") + dtype_name(sig.compute);
  auto listed = [](const std::vector<DataType>& v, DataType d) {
    return v.empty() || d == DataType::kUndefined || std::find(v.begin(), v.end(), d) != v.end();
  };
  auto names = [](const std::vector<DataType>& v) {
    std::string s;
    for (DataType d : v) s += (s.empty() ? "" : "/") + std::string(dtype_name(d));
    return s;
  };
  if (sig.has_input(0) && !listed(info.inputs, sig.inputs[0].dtype))
    return "takes " + names(info.inputs) + " input 0; the layer's is " + dtype_name(sig.inputs[0].dtype);
  if (!sig.outputs.empty() && !listed(info.outputs, sig.outputs[0].dtype))
    return "makes " + names(info.outputs) + " output 0; the layer's is " + dtype_name(sig.outputs[0].dtype);
  return "";
}

std::string why_declined(const Tactic& t, const LayerSignature& sig) {
  if (std::string why = info_mismatch(t.info(), sig); !why.empty()) return why;
  return t.why_unsupported(sig);
}

std::vector<const Tactic*> candidate_tactics(const LayerSignature& sig) {
  std::vector<const Tactic*> out;
  for (const Tactic* t : all_tactics())
    if (implements(*t, sig) && why_declined(*t, sig).empty()) out.push_back(t);
  return out;
}

}  // namespace kiln::backends
