/// kiln public C++ API: build an optimized engine from an ONNX model, save/load it, and run it.
///
///   kiln::BuilderConfig cfg;                       // FP32 on the CPU by default
///   auto engine = kiln::Builder(cfg).build_from_file("model.onnx");
///   engine->save("model.kiln");
///   auto ctx = engine->create_context();           // one per thread; many per engine
///   ctx->set_input("x", kiln::HostTensor::f32({1, 3, 224, 224}, data));
///   ctx->run();
///   kiln::HostTensor y = ctx->output("y");
///
/// Errors are thrown as kiln::Error with a category; messages name the node, the values and the fix.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/numerics.h"

namespace kiln {

/// Error categories; the CLI maps them to exit codes (see README).
enum class ErrorCategory {
  kInvalidArgument,
  kInvalidModel,
  kUnsupported,
  kNotFound,
  kIOError,
  kOutOfRange,
  kInternal,
  kDeadlineExceeded,  ///< a run passed its deadline (ExecutionContext::set_deadline)
};

/// The exception every public entry point throws.
class Error : public std::runtime_error {
 public:
  Error(ErrorCategory category, const std::string& message) : std::runtime_error(message), category_(category) {}
  ErrorCategory category() const { return category_; }

 private:
  ErrorCategory category_;
};

/// Element type codes follow ONNX's TensorProto.DataType (1 = float32, 7 = int64, ...).
using DataTypeCode = int32_t;
constexpr DataTypeCode kFloat32 = 1;
constexpr DataTypeCode kInt64 = 7;

/// Numerical precision a build may use (TensorRT's builder flags): FP32 is always allowed; kMixed
/// allows every precision (`kiln build --best`); each layer computes in the fastest allowed precision
/// that has a kernel for it (timed), unless a layer precision constrains it (engine/precision.h).
enum class Precision { kFP32, kFP16, kBF16, kINT8, kMixed };
/// How --layer-precisions are honoured: kObey fails the build naming a layer whose precision cannot
/// be met, kPrefer warns and falls back to the build's precisions, kNone ignores them (with a warning).
enum class PrecisionConstraints { kNone, kPrefer, kObey };
/// One --layer-precisions entry: layers whose name matches `pattern` (a glob: * and ?) compute in
/// `precision` (kFP32, kFP16, kBF16 or kINT8; not kMixed).
struct LayerPrecision {
  std::string pattern;
  Precision precision = Precision::kFP32;
};

/// A host tensor: dtype, shape and bytes (owned, or borrowed when `borrowed` is set).
struct HostTensor {
  DataTypeCode dtype = 0;
  std::vector<int64_t> shape;
  std::shared_ptr<const void> data;  // may alias caller memory (no-op deleter)
  size_t nbytes = 0;

  static HostTensor f32(std::vector<int64_t> shape, const float* values);
  /// Borrows caller memory: the caller keeps it alive until run() returns.
  static HostTensor borrow(DataTypeCode dtype, std::vector<int64_t> shape, const void* data, size_t nbytes);
  int64_t numel() const;
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data.get());
  }
};

/// A tensor in the caller's device memory (a CUDA engine's inputs and outputs, without a host round
/// trip): dtype, shape, the device pointer and its size, the device it lives on, and the CUDA stream
/// (cudaStream_t; nullptr: the legacy default stream) the caller produces it on (an input) or reads it
/// on (an output). The caller owns the memory and keeps it alive while the context uses it.
struct DeviceTensor {
  DataTypeCode dtype = 0;
  std::vector<int64_t> shape;
  void* data = nullptr;  ///< device memory (cudaMalloc'd or managed), 256-byte aligned as cudaMalloc gives it
  size_t nbytes = 0;
  Device device{DeviceKind::kCUDA, 0};
  void* stream = nullptr;
};

/// min/opt/max dims of one input; kernels are tuned at opt, any shape in [min, max] runs.
struct ShapeRange {
  std::vector<int64_t> min, opt, max;
};
/// One optimization profile: a shape range per dynamic input. An engine may hold several; at run time
/// the first profile whose ranges contain every given input shape is used (or the one forced with
/// ExecutionContext::set_profile). Inputs with fixed dims need no entry.
struct Profile {
  std::string name;  ///< defaults to "profile<i>" at build time
  std::map<std::string, ShapeRange> inputs;
  /// Planned activation bytes at the profile's min / opt / max shapes (filled by the builder).
  size_t memory_min = 0, memory_opt = 0, memory_max = 0;
};

struct BuilderConfig {
  Precision precision = Precision::kFP32;
  /// Precisions allowed besides `precision` (and FP32): flags combine, `--bf16 --int8` allows both.
  std::vector<Precision> extra_precisions;
  /// Per-layer precisions, first matching entry wins; honoured as `precision_constraints` says.
  std::vector<LayerPrecision> layer_precisions;
  PrecisionConstraints precision_constraints = PrecisionConstraints::kPrefer;
  /// Every layer computes in the dtype the graph gives its tensors; reduced precision only where the
  /// graph says so (no other precision may be allowed).
  bool strongly_typed = false;
  /// The device to build for: the CPU, or a CUDA device (a build with the CUDA backend, on a machine with
  /// that GPU: its kernels are timed there). Layers without a CUDA kernel run on the host, reported.
  Device device;
  /// CUDA: float32 matrix products may use TF32 tensor cores (10-bit mantissa inputs; `kiln build --tf32`).
  bool tf32 = false;
  /// CUDA, float16/bfloat16 layers: GELU (erf) keeps its erf form, computed by a pass of its own after a
  /// matrix product (`kiln build --exact-gelu`). By default such a layer uses cuBLASLt's fused GELU
  /// epilogue, which computes GELU's tanh form: at most 4.7e-4 from erf's absolute, below float16's own
  /// rounding for |y| >= 1 (the build counts these layers and records them).
  bool exact_gelu = false;
  /// The CPU instruction set kiln's own kernels may use: "" or "native" (this machine's), or a level
  /// that caps it: "portable", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx" (each includes the
  /// ones before it; asking for more than this machine has is an error). oneDNN's kernels pick their
  /// own. Recorded in the engine and in the timing cache's keys.
  std::string isa;
  /// Channels per block of the blocked conv layout (the layout_blocked pass): -1 (default) the vector
  /// width of the instruction set (16 with AVX-512, 8 with AVX2; 0 without either or without oneDNN),
  /// or 0 (plain NCHW), 8, 16. Recorded in the engine.
  int layout_block = -1;
  /// Keep convolution and pooling activations channels-last (NHWC) between layers (the layout_nhwc
  /// pass): -1 (default) for CUDA builds that allow float16 / bfloat16 (tensor cores are NHWC-native)
  /// and for CPU bfloat16 builds on a CPU with AMX (stored in bfloat16: oneDNN's AMX kernels take NHWC
  /// only), 0 never, 1 for every CUDA float build (on the CPU: the AMX bfloat16 path, an error without
  /// it). Recorded in the engine.
  int channels_last = -1;
  std::vector<Profile> profiles;  ///< one per optimization profile (dynamic inputs)
  /// Cap on one layer's workspace (its tactic's scratch, PreparedLayer::workspace_bytes) at every
  /// profile's max shapes, like TensorRT's workspace pool: a layer needing more fails the build with an
  /// error naming it (`kiln build --workspace`).
  size_t workspace_bytes = size_t{1} << 30;
  size_t activation_bytes = size_t{1} << 30;  ///< cap on planned activation memory per context
  std::vector<std::string> disabled_passes;   ///< pass names to skip (see `kiln inspect --passes`)
  /// Tactics the builder may choose (names as `kiln inspect` shows them); empty: all;
  /// {"reference"}: none, every layer runs its reference kernel.
  std::vector<std::string> tactics;
  /// Timing cache file: the auto-tuner's timings of tactics (per layer shape, thread count, machine and
  /// kiln version), reused by later builds of any model and shared safely by concurrent builds. A
  /// stale, foreign or corrupt file is ignored with a warning and moved aside when the build saves.
  /// Empty: no file (identical layers of one build still share their timings). Tuning happens at the
  /// current thread count (set_threads) and at the first profile's opt shapes.
  std::string timing_cache;
  /// No timing: every layer takes the first tactic, in the registry's priority order, that supports and
  /// prepares it (the timing cache is neither read nor written), so that each build of a model on one
  /// machine gets the same kernels and bit-identical outputs whatever the load. Kernels timed against
  /// each other round differently (Winograd vs direct, other blockings); INT8 calibration builds its
  /// FP32 engine this way so that its ranges are reproducible. Recorded in the engine's tuning record.
  bool deterministic_tactics = false;
  /// Fail the build (ErrorCategory::kUnsupported, naming every such layer with its reasons) instead of
  /// warning when a layer would run its reference kernel; shape work (see README) is exempt.
  bool strict_tactics = false;
  bool verbose = false;
  std::function<void(const std::string&)> log;  ///< progress lines; default prints to stderr when verbose
  /// Warnings (layers left on reference kernels, disturbed timings, a bad timing cache); default prints
  /// "kiln: warning: MESSAGE" on stderr.
  std::function<void(const std::string&)> warn;
  /// INT8 (precision kINT8) by post-training calibration: the FP32 engine runs the calibration batches,
  /// a calibrator turns each activation's statistics into a range, and the model gets ONNX
  /// QuantizeLinear/DequantizeLinear nodes in ONNX Runtime's quantize_static pattern (src/quant/
  /// qdq_insert.h): per-channel symmetric int8 weights, per-tensor asymmetric uint8 activations.
  /// A model that has Q/DQ nodes already is built as it is (explicit quantization) without data.
  /// calib_data: a directory of .npy/.npz files (each one batch; .npz entries named by input) or one
  /// .npz of stacked inputs (cut into batches of calib_batch_size along dim 0).
  std::string calib_data;
  int calib_batches = 0;              ///< use at most this many batches (0: all)
  int calib_batch_size = 32;          ///< rows per batch when calib_data is one stacked .npz
  std::string calibrator = "minmax";  ///< minmax, entropy (TensorRT's KL divergence), percentile, mse
  double calib_percentile = 99.99;    ///< the percentile calibrator's percentile of |x|
  /// Calibration cache: ranges written after calibrating and read back by later builds (no data needed),
  /// keyed by the model's hash, the calibrator and kiln's version; a stale, foreign or corrupt one is
  /// refused with a warning (then calibration data is needed, and the file is rewritten).
  std::string calib_cache;
  /// Nodes (ONNX names, or fnmatch globs such as "/layer4/*") left in FP32 by INT8 calibration: their
  /// inputs get no Q/DQ. The per-layer precision flags fill this.
  std::vector<std::string> int8_exclude;
  /// Automatic mixed precision (`kiln build --precision auto`, engine/auto_precision.h): each layer's
  /// precision chosen by measured sensitivity and timing, the fastest assignment whose outputs meet every
  /// `tolerances` entry ("OUTPUT:atol=A,rtol=R" or "OUTPUT:top1=Q") against the FP32 engine on held-back
  /// inputs: the calib_data batches after the first calib_batches (default: the first 3/4 calibrate).
  /// Candidates: the precisions `precision`/`extra_precisions` name besides FP32, else INT8 and BF16.
  bool auto_precision = false;
  std::vector<std::string> tolerances;
};

struct TensorDesc {
  std::string name;
  DataTypeCode dtype = 0;
  std::vector<int64_t> shape;          ///< -1 for dynamic dims
  std::vector<std::string> dim_names;  ///< symbol per dim ("batch"), empty when fixed
};

class ExecutionContext;
namespace detail {
struct EngineImpl;
struct ContextImpl;
}  // namespace detail

/// A built, immutable engine. Thread-safe: contexts created from it may run concurrently.
class Engine : public std::enable_shared_from_this<Engine> {
 public:
  static std::shared_ptr<Engine> load(const std::string& path);
  static std::shared_ptr<Engine> deserialize(const std::string& bytes);
  void save(const std::string& path) const;
  std::string serialize() const;

  std::vector<TensorDesc> inputs() const;
  std::vector<TensorDesc> outputs() const;
  /// The optimization profiles the engine was built with (empty: any shape the model allows).
  std::vector<Profile> profiles() const;
  std::unique_ptr<ExecutionContext> create_context() const;
  /// Layers, kernels, memory plan, pass counts and build target, as JSON.
  std::string inspect_json() const;

  explicit Engine(std::shared_ptr<detail::EngineImpl> impl);
  const detail::EngineImpl& impl() const { return *impl_; }

 private:
  std::shared_ptr<detail::EngineImpl> impl_;
};

class Builder {
 public:
  explicit Builder(BuilderConfig config = {});
  std::shared_ptr<Engine> build_from_file(const std::string& onnx_path) const;
  std::shared_ptr<Engine> build_from_memory(const std::string& onnx_bytes) const;

 private:
  BuilderConfig config_;
};

/// Per-run state: input bindings, activation memory, outputs. Not thread-safe; use one per thread.
class ExecutionContext {
 public:
  explicit ExecutionContext(std::shared_ptr<const Engine> engine);
  ~ExecutionContext();
  /// Binds an input; its shape selects the profile (see set_profile).
  void set_input(const std::string& name, HostTensor tensor);
  /// As set_input, without copying when the bytes are 64-byte aligned (otherwise copied): the context
  /// keeps `tensor.data` (its owner) until the input is bound again or the context is destroyed, and
  /// reads the bytes in every run() until then; the caller leaves them unchanged while a run is in flight.
  void set_input_shared(const std::string& name, HostTensor tensor);
  /// Device buffers (a CUDA engine only; a CPU engine, a host pointer, another device or a size that
  /// does not match dtype and shape throw kInvalidArgument, naming what is wrong). The synchronization
  /// contract, per run():
  ///  - an input bound with set_input_device is read in every run() until it is bound again: the
  ///    context's own stream waits (cudaStreamWaitEvent, the host does not block) for the work the caller
  ///    queued on `tensor.stream` before run() was called, then reads the buffer; the caller must not
  ///    overwrite it until run() returns.
  ///  - an output bound with set_output_device is written into the caller's buffer on the context's
  ///    stream (a device-to-device copy) and the caller's `tensor.stream` is made to wait for it; its
  ///    shape after the run must be `tensor.shape` (else run() throws, naming both). output() of such an
  ///    output throws; read the buffer on the device.
  ///  - run() returns when the context's work is done (it waits for its stream, so that errors surface
  ///    in run()): after it, every bound output buffer holds this run's result.
  /// Each context has a stream and device memory of its own: contexts on several threads run concurrently.
  void set_input_device(const std::string& name, const DeviceTensor& tensor);
  void set_output_device(const std::string& name, const DeviceTensor& tensor);
  /// Unbinds an output from its device buffer (output() reads it on the host again).
  void clear_output_device(const std::string& name);
  /// The last run's output `name` in the context's device memory (CUDA engines), without a copy: valid
  /// until the next run(), and ordered on the context's stream, which run() has waited for. `stream` is
  /// nullptr (the context's stream is internal). Throws for a CPU engine or before run().
  DeviceTensor output_device(const std::string& name) const;
  /// Device (CUDA) or host memory the context holds for activations and layer workspaces: the largest
  /// memory plan run so far. Plans follow the actual input shapes (not the profile's max): the first run
  /// of a larger shape grows it, later runs of any shape that fits allocate nothing.
  size_t arena_bytes() const;
  /// Declares an input's shape ahead of its data: checks it against the profiles now (throws with the
  /// ranges when it fits none) so that output_shape() answers before run().
  void set_input_shape(const std::string& name, std::vector<int64_t> dims);
  /// Forces profile `index` (throws when out of range); -1 (default) picks the first fitting profile.
  void set_profile(int index);
  /// The profile of the shapes given so far (set_input / set_input_shape), or of the last run;
  /// -1 when the engine has no profiles. Throws when the shapes fit no profile.
  int profile_index() const;
  /// An output's shape: after run() the actual one; before, as resolved from the input shapes given so
  /// far, with -1 for dims that depend on data (NonZero, NonMaxSuppression, Unique, TopK with a runtime k).
  std::vector<int64_t> output_shape(const std::string& name) const;
  void run();
  /// Every later run() stops with ErrorCategory::kDeadlineExceeded once this time has passed: checked
  /// between layers and between the iterations of Loop and Scan (a Loop with 10^18 trips is stoppable).
  /// The work of a single layer is not interrupted.
  void set_deadline(std::chrono::steady_clock::time_point deadline);
  void clear_deadline();
  /// The numerics guard (kiln/numerics.h): while enabled, every run() checks each layer's outputs
  /// (bodies included) for Inf/NaN, FP16 overflow and INT8 saturation, and numerics_report() says
  /// what the last run found. Such runs take the observing path (slower); off (the default) costs nothing.
  void set_numerics_check(const NumericsCheck& check);
  NumericsReport numerics_report() const;            ///< the last run's findings (empty when the check is off)
  HostTensor output(const std::string& name) const;  ///< valid until the next run()
  std::vector<std::string> output_names() const;
  /// Peak bytes of planned activation memory used by the last run.
  size_t activation_bytes() const;
  /// Internal state, for kiln's own tools (per-layer timing in kiln bench).
  detail::ContextImpl& impl() { return *impl_; }

 private:
  void bind_input(const std::string& name, HostTensor tensor, bool share);
  std::shared_ptr<const Engine> engine_;
  std::unique_ptr<detail::ContextImpl> impl_;
};

/// kiln's version string ("0.1.0").
const char* version();

// Threads for every kernel of this process (kiln's own and oneDNN's: one OpenMP team), taking
// effect for engines prepared and layers run afterwards. n <= 0 restores the machine's default
// (OMP_NUM_THREADS when set, else one per core). threads() reports the current count.
void set_threads(int n);
int threads();

}  // namespace kiln
