// Running one tactic on the GPU for the CUDA tests: the case's activations copied to cuda:0, its
// constants left on the host (CUDA tactics copy their weights at prepare time, as in an engine),
// outputs and a poisoned workspace in device memory, results copied back. Tests skip, saying why,
// when the build has no CUDA backend or the machine no GPU.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backends/device_runtime.h"
#include "backends/registry.h"
#include "layer_case.h"

namespace kiln::testing {

// The CUDA runtime when cuda:0 can run kernels; else nullptr with the reason in *why.
inline const backends::DeviceRuntime* cuda_device(std::string* why) {
  const backends::DeviceRuntime* rt = backends::device_runtime(DeviceKind::kCUDA);
  if (!rt) {
    *why = "built without the CUDA backend (-DKILN_CUDA=OFF or no CUDA toolkit)";
    return nullptr;
  }
  *why = rt->why_unavailable(0);
  return why->empty() ? rt : nullptr;
}

#define KILN_SKIP_WITHOUT_GPU()                                                 \
  std::string gpu_why_;                                                         \
  const backends::DeviceRuntime* gpu = ::kiln::testing::cuda_device(&gpu_why_); \
  if (!gpu) GTEST_SKIP() << "no GPU to run the CUDA tactics: " << gpu_why_;     \
  (void)gpu

// The case's signature on cuda:0, computing in `compute` (a reduced-precision tactic's).
inline backends::LayerSignature cuda_signature(const LayerCase& lc, bool tf32 = false,
                                               DataType compute = DataType::kFloat32, bool exact_gelu = false) {
  backends::LayerSignature sig = layer_signature(lc);
  sig.device = {DeviceKind::kCUDA, 0};
  sig.tf32 = tf32;
  sig.exact_gelu = exact_gelu;
  sig.compute = compute;
  return sig;
}

// Runs tactic `t` on the case on cuda:0: its outputs on the host, or the error (a decline says so).
// run_signature_on_gpu: with signature `sig` (the case's, with its compute precision
// and output dtypes set by the caller).
inline Result<std::vector<Tensor>> run_signature_on_gpu(const backends::DeviceRuntime& rt, const backends::Tactic& t,
                                                        const LayerCase& lc, const backends::LayerSignature& sig);

inline Result<std::vector<Tensor>> run_on_gpu(const backends::DeviceRuntime& rt, const backends::Tactic& t,
                                              const LayerCase& lc, bool tf32 = false,
                                              DataType compute = DataType::kFloat32, bool exact_gelu = false) {
  return run_signature_on_gpu(rt, t, lc, cuda_signature(lc, tf32, compute, exact_gelu));
}

inline Result<std::vector<Tensor>> run_signature_on_gpu(const backends::DeviceRuntime& rt, const backends::Tactic& t,
                                                        const LayerCase& lc, const backends::LayerSignature& sig) {
  if (std::string why = backends::why_declined(t, sig); !why.empty()) return Unsupported("declined: ", why);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<backends::PreparedLayer> p, t.prepare(sig));
  std::vector<Tensor> dev_in(lc.inputs.size());
  std::vector<const Tensor*> ins;
  for (size_t i = 0; i < lc.inputs.size(); ++i) {
    if (!lc.inputs[i].defined()) {
      ins.push_back(nullptr);
    } else if (lc.constant[i]) {
      ins.push_back(&lc.inputs[i]);
    } else {
      KILN_ASSIGN_OR_RETURN(dev_in[i], backends::to_device(rt, 0, lc.inputs[i], nullptr));
      ins.push_back(&dev_in[i]);
    }
  }
  std::vector<Dims> shapes = p->output_shapes();
  std::vector<DataType> dtypes = p->output_dtypes();
  std::vector<Tensor> outs(shapes.size());
  std::vector<Tensor*> out_ptrs;
  for (size_t o = 0; o < shapes.size(); ++o) {
    KILN_ASSIGN_OR_RETURN(outs[o], backends::device_tensor(rt, 0, dtypes[o], shapes[o]));
    KILN_RETURN_IF_ERROR(rt.fill(outs[o].raw(), 0xFF, outs[o].nbytes(), nullptr));  // NaN: unwritten shows
    out_ptrs.push_back(&outs[o]);
  }
  backends::RunContext ctx;
  ctx.device = sig.device;
  Tensor ws;
  if (size_t bytes = p->workspace_bytes(1)) {
    KILN_ASSIGN_OR_RETURN(ws, backends::device_tensor(rt, 0, DataType::kUInt8, {static_cast<int64_t>(bytes)}));
    KILN_RETURN_IF_ERROR(rt.fill(ws.raw(), 0xFF, bytes, nullptr));
    ctx.workspace = ws.raw(), ctx.workspace_bytes = bytes;
  }
  KILN_RETURN_IF_ERROR(p->run(ctx, ins, out_ptrs));
  KILN_RETURN_IF_ERROR(rt.synchronize(nullptr));
  std::vector<Tensor> host;
  for (const Tensor& o : outs) {
    KILN_ASSIGN_OR_RETURN(Tensor h, backends::to_host(rt, o, nullptr));
    host.push_back(std::move(h));
  }
  return host;
}

// Whether `got` matches the reference `want` within atol + rtol * |want| everywhere (NaN where the
// reference has NaN, the same infinity where it has one); the first mismatch in *where.
inline bool close_to(const Tensor& got, const Tensor& want, double atol, double rtol, std::string* where) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) {
    *where = "got " + got.describe() + ", want " + want.describe();
    return false;
  }
  for (int64_t i = 0; i < want.numel(); ++i) {
    double g = got.get_f64(i), w = want.get_f64(i);
    if (std::isnan(w) && std::isnan(g)) continue;
    if (g == w) continue;  // equal infinities (a max over a window of NaN and padding only)
    if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
      *where = "element " + std::to_string(i) + ": got " + std::to_string(g) + ", want " + std::to_string(w);
      return false;
    }
  }
  return true;
}

}  // namespace kiln::testing
