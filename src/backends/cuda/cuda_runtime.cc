// The CUDA backend's DeviceRuntime: cudart for memory, streams and copies; the device's identity
// (name, compute capability, driver, runtime, cuBLASLt and cuDNN versions) for the engine file.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <mutex>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_timing.h"
#include "backends/cuda/cudnn_tactics.h"

namespace kiln::backends::cuda {

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Internal("CUDA: ", what, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

std::string cublaslt_version() {
  size_t v = cublasLtGetVersion();  // MAJOR * 10000 + MINOR * 100 + PATCH
  return "cuBLASLt " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

Result<void*> cublaslt_handle() {
  static std::once_flag once;
  static cublasLtHandle_t handle = nullptr;
  static cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  std::call_once(once, [] { status = cublasLtCreate(&handle); });
  if (status != CUBLAS_STATUS_SUCCESS)
    return Internal("cuBLASLt: cublasLtCreate failed: ", cublasLtGetStatusName(status));
  return static_cast<void*>(handle);
}

namespace {

std::string version_str(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

class CudaRuntime final : public DeviceRuntime {
 public:
  DeviceKind kind() const override { return DeviceKind::kCUDA; }

  std::string why_unavailable(int index) const override {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
      return std::string("no usable CUDA device: cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" +
             cudaGetErrorString(e) + ")";
    if (n == 0) return "no CUDA device on this machine";
    if (index < 0 || index >= n)
      return "cuda:" + std::to_string(index) + ": this machine has " + std::to_string(n) + " CUDA device(s)";
    return "";
  }

  std::map<std::string, std::string> identity(int index) const override {
    std::map<std::string, std::string> id;
    if (!why_unavailable(index).empty()) return id;
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, index) != cudaSuccess) return id;
    int driver = 0, rt = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&rt);
    id["name"] = p.name;
    id["compute_capability"] = std::to_string(p.major) + "." + std::to_string(p.minor);
    id["memory_mib"] = std::to_string(p.totalGlobalMem >> 20);
    id["driver"] = version_str(driver);
    id["runtime"] = version_str(rt);
    id["cublaslt"] = cublaslt_version();
    id["cudnn"] = cudnn_version();
    return id;
  }

  std::string incompatibility(const std::map<std::string, std::string>& built, int index) const override {
    if (std::string why = why_unavailable(index); !why.empty()) return why;
    std::map<std::string, std::string> here = identity(index);
    std::string diff;
    // The kernels were chosen and the cuBLASLt/cuDNN algorithms picked for this GPU model and library: another
    // one may not run them (compute capability) or run them slowly (model, library version).
    for (const char* k : {"name", "compute_capability", "cublaslt", "cudnn"}) {
      auto b = built.find(k);
      if (b == built.end()) continue;
      if (here[k] != b->second)
        diff += std::string(diff.empty() ? "" : "; ") + k + " '" + b->second + "' at build, '" + here[k] + "' here";
    }
    return diff;
  }

  Result<std::shared_ptr<uint8_t[]>> allocate(int index, size_t bytes) const override {
    KILN_CUDA_RETURN_IF_ERROR(cudaSetDevice(index));
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 256));
    if (e != cudaSuccess)
      return OutOfRange("cudaMalloc of ", bytes, " bytes on cuda:", index, " failed: ", cudaGetErrorString(e));
    return std::shared_ptr<uint8_t[]>(static_cast<uint8_t*>(p), [](uint8_t* q) { cudaFree(q); });
  }

  Result<std::shared_ptr<uint8_t[]>> allocate_pinned(size_t bytes) const override {
    void* p = nullptr;
    cudaError_t e = cudaMallocHost(&p, std::max<size_t>(bytes, 256));
    if (e != cudaSuccess) return OutOfRange("cudaMallocHost of ", bytes, " bytes failed: ", cudaGetErrorString(e));
    return std::shared_ptr<uint8_t[]>(static_cast<uint8_t*>(p), [](uint8_t* q) { cudaFreeHost(q); });
  }

  Result<std::shared_ptr<void>> create_stream(int index) const override {
    KILN_CUDA_RETURN_IF_ERROR(cudaSetDevice(index));
    cudaStream_t s = nullptr;
    KILN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return std::shared_ptr<void>(s, [](void* q) { cudaStreamDestroy(static_cast<cudaStream_t>(q)); });
  }

  Status copy(void* dst, const void* src, size_t bytes, Copy kind, void* stream) const override {
    if (!bytes) return Status::Ok();
    cudaMemcpyKind k = kind == Copy::kHostToDevice   ? cudaMemcpyHostToDevice
                       : kind == Copy::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                     : cudaMemcpyDeviceToDevice;
    return cuda_status(cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream)), "cudaMemcpyAsync");
  }

  Status fill(void* dst, int byte, size_t bytes, void* stream) const override {
    if (!bytes) return Status::Ok();
    return cuda_status(cudaMemsetAsync(dst, byte, bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
  }

  Status synchronize(void* stream) const override {
    KILN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    return cuda_status(cudaGetLastError(), "a kernel launch");
  }

  Result<double> time_ms(const std::function<Status()>& run, void* stream) const override {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    cudaEvent_t begin = nullptr, end = nullptr;
    KILN_CUDA_RETURN_IF_ERROR(cudaEventCreate(&begin));
    struct Events {
      cudaEvent_t& a;
      cudaEvent_t& b;
      ~Events() {
        if (a) cudaEventDestroy(a);
        if (b) cudaEventDestroy(b);
      }
    } owner{begin, end};
    KILN_CUDA_RETURN_IF_ERROR(cudaEventCreate(&end));
    // The GPU waits 50 us first: the layer's launches (cuDNN's and cuBLASLt's host work included) are
    // queued by the time it reaches `begin`, so the events time the GPU's work, what a CUDA graph replays,
    // not the host's launch latency (which made the picks of small layers drift from build to build).
    KILN_CUDA_RETURN_IF_ERROR(launch_delay(50000, s));
    KILN_CUDA_RETURN_IF_ERROR(cudaEventRecord(begin, s));
    KILN_RETURN_IF_ERROR(run());
    KILN_CUDA_RETURN_IF_ERROR(cudaEventRecord(end, s));
    KILN_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(end));
    KILN_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    float ms = 0;
    KILN_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, begin, end));
    return static_cast<double>(ms);
  }

  Status begin_capture(void* stream) const override {
    // Thread-local: other contexts' threads keep launching (and synchronizing) as they like.
    return cuda_status(cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal),
                       "cudaStreamBeginCapture");
  }

  Result<std::shared_ptr<void>> end_capture(void* stream) const override {
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph);
    (void)cudaGetLastError();  // an invalidated capture leaves its error behind: reported here
    if (e != cudaSuccess || !graph) {
      if (graph) cudaGraphDestroy(graph);
      return Unsupported(
          "the capture failed: ", cudaGetErrorString(e == cudaSuccess ? cudaErrorStreamCaptureInvalidated : e),
          " (a layer synchronizes or copies through pageable host memory)");
    }
    cudaGraphExec_t exec = nullptr;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    KILN_CUDA_RETURN_IF_ERROR(e);
    return std::shared_ptr<void>(exec, [](void* x) { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(x)); });
  }

  Status launch_graph(void* graph, void* stream) const override {
    return cuda_status(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), static_cast<cudaStream_t>(stream)),
                       "cudaGraphLaunch");
  }

  Result<MemoryLocation> locate(const void* p) const override {
    cudaPointerAttributes a{};
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // a pointer the driver does not know is host memory
      return MemoryLocation{};
    }
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged)
      return MemoryLocation{MemoryLocation::Kind::kCuda, a.device};
    return MemoryLocation{};
  }

  Result<std::shared_ptr<void>> create_event(int index) const override {
    KILN_CUDA_RETURN_IF_ERROR(cudaSetDevice(index));
    cudaEvent_t ev = nullptr;
    KILN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    return std::shared_ptr<void>(ev, [](void* x) { cudaEventDestroy(static_cast<cudaEvent_t>(x)); });
  }

  Status order_after(void* waiter, void* producer, void* event) const override {
    if (waiter == producer) return Status::Ok();  // one stream runs in order
    auto ev = static_cast<cudaEvent_t>(event);
    KILN_RETURN_IF_ERROR(cuda_status(cudaEventRecord(ev, static_cast<cudaStream_t>(producer)), "cudaEventRecord"));
    return cuda_status(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), ev, 0), "cudaStreamWaitEvent");
  }
};

}  // namespace

const DeviceRuntime& runtime() {
  static const CudaRuntime rt;
  return rt;
}

Status DeviceConstants::upload(const LayerSignature& sig) {
  consts_.assign(sig.inputs.size(), Tensor());
  host_.assign(sig.inputs.size(), nullptr);
  int index = sig.device.index;
  for (size_t i = 0; i < sig.inputs.size(); ++i) {
    const Tensor* c = sig.inputs[i].constant;
    if (!c || !c->defined()) continue;
    host_[i] = c;
    KILN_ASSIGN_OR_RETURN(consts_[i], to_device(runtime(), index, *c, nullptr));
  }
  return runtime().synchronize(nullptr);
}

}  // namespace kiln::backends::cuda
