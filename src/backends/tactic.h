// Tactics: fast implementations of one (possibly fused) layer, chosen per layer by the engine
// builder. The reference kernels of src/ops stay the ground truth; a tactic declares the layers
// it supports (op, attributes, dtypes, shapes, device) and prepares itself once per shape
// (weights reordered/packed), after which its PreparedLayer writes into caller-given outputs.
//
// Dtype, device and precision are in every signature: the CUDA backend and reduced precision add
// tactics, not new interfaces (the dtype contract: the end of this file). A tactic declares as data
// (TacticInfo) the device, the instruction set and the dtypes it takes; the registry
// (backends/registry.h) declines, with the reason, a tactic whose TacticInfo does not fit the layer's
// signature before why_unsupported() is asked.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/target.h"
#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln::backends {

using kiln::Device;  // core/target.h
using kiln::device_name;
using kiln::DeviceKind;

// One input or output of a layer as the builder/runtime knows it. Dims of -1 are not known yet
// (dynamic dims at build time); at prepare time every dim is known.
struct TensorSig {
  bool present = false;  // false: an optional input left empty
  DataType dtype = DataType::kUndefined;
  Dims shape;                        // -1 for an unknown dim
  const Tensor* constant = nullptr;  // its value when it is an initializer (weights)
  bool known() const {
    for (int64_t d : shape)
      if (d < 0) return false;
    return true;
  }
};

// What a tactic is asked about: the node (op, domain, attributes), its inputs and outputs (dtypes,
// shapes), the device and the precision the layer runs in, and the instruction set the target offers.
// engine::signature_of fills them from the graph and the build's Target.
struct LayerSignature {
  const ir::Node* node = nullptr;
  std::vector<TensorSig> inputs;
  std::vector<TensorSig> outputs;  // dtypes as inferred; shapes may be unknown (-1) even at prepare time
  Device device;
  DataType compute = DataType::kFloat32;  // the precision the layer computes in
  // The CPU features the target offers (Target::isa): kernels that pick their path at prepare time
  // (cpu_isa) use no more than these and this machine have. Default: this machine's.
  IsaSet isa = host_isa();
  // Float32 matrix products may use TF32 tensor cores (CUDA; kiln build --tf32, Target::tf32).
  bool tf32 = false;
  // CUDA float16/bfloat16 products keep GELU (erf) exact, unfused (kiln build --exact-gelu, Target::exact_gelu).
  bool exact_gelu = false;

  const std::string& op() const { return node->op_type; }
  const std::string& domain() const { return node->domain; }
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i].present; }
  bool fully_known() const {
    for (const auto& t : inputs)
      if (t.present && !t.known()) return false;
    return true;
  }
};

// What a layer's run is given besides its tensors: where it runs, on what stream, with how many
// threads, and its workspace. The execution context makes one per layer; the workspace is a slice of
// the context's memory-planned arena (one region shared by the layers, which run one at a time), so
// a steady-state run allocates nothing (tests/unit/engine/no_alloc_test.cc).
struct RunContext {
  Device device;
  void* stream = nullptr;  // opaque: null on the CPU; the CUDA backend's cudaStream_t
  int threads = 1;         // the thread budget of the run (kiln::max_threads() on the CPU)
  void* workspace = nullptr;
  size_t workspace_bytes = 0;  // at least the layer's workspace_bytes(); 64-byte aligned
};

// A tactic bound to concrete shapes and weights. run() is const and may be called from several
// threads at once (each execution context runs on its own thread): all mutable state of a run lives
// in its outputs and its workspace.
class PreparedLayer {
 public:
  virtual ~PreparedLayer() = default;
  // Shapes of the outputs for the prepared input shapes (the runtime allocates them).
  virtual std::vector<Dims> output_shapes() const = 0;
  virtual std::vector<DataType> output_dtypes() const {
    return std::vector<DataType>(output_shapes().size(), DataType::kFloat32);
  }
  // Scratch bytes run() needs for the prepared shapes at `threads` threads (per-thread scratch counts
  // `threads` times): the memory planner reserves them and run() gets them as ctx.workspace. Its
  // contents are undefined at every run (not zeroed, not kept between runs).
  virtual size_t workspace_bytes(int threads) const {
    (void)threads;
    return 0;
  }
  // Computes the outputs into `outputs` (allocated by the caller with output_shapes(), dtype of the
  // signature) using only ctx.workspace as scratch: no heap allocation. `inputs` has one entry per
  // node input, nullptr for missing optional ones; all live on ctx.device.
  virtual Status run(const RunContext& ctx, const std::vector<const Tensor*>& inputs,
                     const std::vector<Tensor*>& outputs) const = 0;
  // run() outside an execution context (tests, the auto-tuner's timing): allocates a workspace of
  // workspace_bytes(kiln::max_threads()) filled with a NaN pattern (a tactic that reads scratch it did
  // not write shows up in the results), then runs on the host.
  Status run_standalone(const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs) const;
  // The constant memory run() reads (its packed weights), so that the auto-tuner can time the layer
  // with it out of the caches, as a network run finds weights that do not stay cached (tune/tuner.h);
  // empty: not reported.
  virtual std::vector<std::pair<const void*, size_t>> constant_memory() const { return {}; }
};

// What a tactic needs, as data: the registry checks it against the signature (device, precision,
// dtypes) and the target (instruction set) before why_unsupported() is asked, and says which part
// does not fit ("needs avx512_bf16; the target has avx2").
struct TacticInfo {
  DeviceKind device = DeviceKind::kCPU;  // where its kernels run (the signature's device index is used)
  // The CPU features its kernels need. Portable: none, also for kernels that pick an AVX2/AVX-512 path
  // at prepare time within what the target offers (cpu_isa), and for oneDNN (which picks its own).
  IsaSet isa = kIsaPortable;
  // The precision it computes in; kUndefined: none (it moves, compares or converts data), any build.
  DataType compute = DataType::kFloat32;
  std::vector<DataType> inputs;   // dtypes its first (data) input may have; empty: any
  std::vector<DataType> outputs;  // dtypes its first output may have; empty: any
  // With compute kUndefined: it computes in whichever float precision the layer has (float32, float16
  // or bfloat16 data, float32 accumulation), such as cuDNN's convolution; a layer it takes computes
  // (storage dtypes give it the build's reduced precision), unlike data movement.
  bool any_float_compute = false;

  // Whether a layer run by it computes (rather than moves, compares or converts data).
  bool computes() const { return compute != DataType::kUndefined || any_float_compute; }

  // The usual CPU tactic: float32 in, float32 out, computing in float32, portable or `isa`.
  static TacticInfo cpu_f32(IsaSet isa = kIsaPortable) {
    return {DeviceKind::kCPU, isa, DataType::kFloat32, {DataType::kFloat32}, {DataType::kFloat32}};
  }
  // A CPU tactic that takes any dtype (why_unsupported says which) in any precision: data movement,
  // comparisons, casts.
  static TacticInfo cpu_any_dtype() { return {DeviceKind::kCPU, kIsaPortable, DataType::kUndefined, {}, {}}; }
  // A CPU tactic of the 8-bit quantized layers (kiln.QConv, kiln.QPool): uint8 or int8 in and out,
  // computing in int8.
  static TacticInfo cpu_int8() {
    return {DeviceKind::kCPU,
            kIsaPortable,
            DataType::kInt8,
            {DataType::kUInt8, DataType::kInt8},
            {DataType::kUInt8, DataType::kInt8}};
  }
};

// Workspace pieces are 64-byte aligned: workspace_bytes() sums workspace_piece(n) of each piece and
// run() takes them back in the same order with a WorkspaceSlicer.
constexpr size_t workspace_piece(size_t bytes) { return (bytes + 63) / 64 * 64; }
class WorkspaceSlicer {
 public:
  explicit WorkspaceSlicer(const RunContext& ctx)
      : next_(static_cast<uint8_t*>(ctx.workspace)), left_(ctx.workspace ? ctx.workspace_bytes : 0) {}
  // The next `bytes` (nullptr for 0). The runtime gives every layer at least its workspace_bytes(),
  // so running out is a bug of the tactic's workspace_bytes(): checked.
  void* take(size_t bytes) {
    if (bytes == 0) return nullptr;
    size_t n = workspace_piece(bytes);
    KILN_CHECK(n <= left_);
    void* p = next_;
    next_ += n, left_ -= n;
    return p;
  }

 private:
  uint8_t* next_;
  size_t left_;
};

// Fills `bytes` of workspace with the pattern run_standalone uses (0xFF bytes: float NaN).
void poison_workspace(void* p, size_t bytes);

class Tactic {
 public:
  virtual ~Tactic() = default;
  virtual std::string name() const = 0;  // unique, stable (the engine file stores it)
  // What it needs (device, instruction set, precision, dtypes), checked by the registry before
  // why_unsupported() is asked (backends/registry.h: why_declined).
  virtual TacticInfo info() const = 0;
  // The (domain, op_type) pairs it implements, e.g. {"", "Conv"}, {"kiln", "FusedConv"}.
  virtual std::vector<std::pair<std::string, std::string>> ops() const = 0;
  // Cheap check on the signature (dims may be unknown). Empty: supported; else why not.
  virtual std::string why_unsupported(const LayerSignature& sig) const = 0;
  // why_unsupported() alone; backends::why_declined checks info() first.
  bool supports(const LayerSignature& sig) const { return why_unsupported(sig).empty(); }
  // Binds concrete input shapes and the constant inputs (weights); the signature's shapes are all
  // known. May still fail (e.g. the library has no implementation for these shapes).
  virtual Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const = 0;
  // The revision of the kernels behind this tactic: bump it whenever they change in a way that can
  // change their speed or what they accept (a new micro-kernel, blocking, a shape they now take).
  // The timing cache keys every entry on it: an entry written at another revision is ignored and
  // the tactic timed again (tune/timing_cache.h), like a TensorRT tactic whose kernel changed.
  virtual int revision() const { return 1; }
};

// The registry of every backend's tactics (all_tactics, find_tactic, candidate_tactics) is
// backends/registry.h.

}  // namespace kiln::backends

// The dtype contract. A tactic reads its inputs in the dtypes its LayerSignature gives
// (sig.inputs[i].dtype, constants included: TensorSig::constant holds a tensor of that dtype), writes
// its outputs in the dtypes its PreparedLayer::output_dtypes() reports, and computes in sig.compute
// (TacticInfo::compute; kUndefined for kernels that only move, compare or convert data, which take
// their dtypes from the signature). Who chooses the storage dtypes:
//   - device engines (CUDA): the builder (engine/storage_dtypes.h) stores a reduced-precision layer's
//     float activations and weights in its precision, so an FP16 tactic sees float16 inputs and writes
//     float16 outputs (TacticInfo::inputs/outputs {kFloat16}), accumulating as it documents (kiln's
//     CUDA kernels and cuBLASLt: float32); the Cast layers the builder inserts convert where layers of
//     different precisions meet, and engine inputs and outputs keep the model's dtypes;
//   - CPU engines: storage stays float32 and a reduced-precision tactic converts its input itself
//     (the BF16 oneDNN tactics: TacticInfo::inputs {kFloat32}, compute kBFloat16).
// A tactic checks every input it reads against its dtypes in why_unsupported(), not only the first
// one the registry checks (TacticInfo::inputs), and declines the others with the reason.
