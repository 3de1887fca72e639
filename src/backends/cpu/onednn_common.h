// Shared pieces of the oneDNN tactics: the engine, per-thread streams, the epilogue (bias,
// residual, activation) of kiln's fused layers as oneDNN post-ops.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cpu/onednn_geometry.h"
#include "backends/tactic.h"
#include "core/library_scope.h"

namespace kiln::backends::cpu::onednn {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

dnnl::engine& cpu_engine();
dnnl::stream& thread_stream();  // one per thread: contexts may run concurrently

// The layer's activation (attribute "activation" of kiln.Fused*), appended as an eltwise post-op.
// Returns false when oneDNN has no matching eltwise (the tactic is then unsupported).
bool append_activation(const ir::Node& n, dnnl::post_ops& po);
bool activation_supported(const ir::Node& n);

dnnl::memory::dims to_dnnl(const Dims& d);

// "" if every present input is float32 and the compute precision is float32.
std::string check_f32(const LayerSignature& sig);

// "" when the layer is a CPU layer computing in bfloat16 whose present inputs are all `inputs`
// (float32 for the tactics converting their input, bfloat16 for those on bf16 storage), else why not.
std::string check_bf16_compute(const LayerSignature& sig, DataType inputs);

// MatMul, Gemm, kiln.FusedMatMul or kiln.FusedGemm.
bool is_matmul_op(const LayerSignature& sig);
// "" when the layer is such a matrix product computing in bfloat16 with inputs of dtype `inputs`, A and
// a 2-D constant B, and an activation oneDNN has; else why not (the BF16 matmul tactics' common checks).
std::string check_bf16_matmul(const LayerSignature& sig, DataType inputs);

// Unsupported naming `tactic` when oneDNN picked its reference implementation `impl` ("ref..."),
// far slower than the FP32 kernels for the reduced precisions: such a primitive is declined.
Status check_not_reference(const std::string& tactic, const char* impl);

// Blocks of b channels that hold c channels.
inline int64_t channel_blocks(int64_t c, int64_t b) { return (c + b - 1) / b; }
// A blocked conv's X as the conv sees it, [N, C, H, W] (C from the weights; dims may be -1): plain 4-D,
// or blocked [N, C/b, H, W, b] by the node's "block" holding C channels. "" or why not.
std::string conv_plain_x(const LayerSignature& sig, int64_t c, Dims* x);

// Runs `f` turning oneDNN's exceptions into a Status naming the tactic. `f` calls oneDNN's API, whose
// memory objects and argument maps are small heap objects made per call (oneDNN 2.x's execute
// builds its own argument map too): the scope marks them as the library's (core/library_scope.h).
template <typename F>
Status guarded(const std::string& tactic, F&& f) {
  LibraryCallScope library;
  try {
    return f();
  } catch (const dnnl::error& e) {
    return Internal("tactic ", tactic, ": oneDNN error: ", e.what());
  } catch (const std::bad_alloc&) {
    return OutOfRange("tactic ", tactic, ": out of memory");
  }
}

}  // namespace kiln::backends::cpu::onednn

namespace kiln::backends::cpu::onednn {

// Runs a primitive with a user-managed scratchpad (dnnl::scratchpad_mode::user: primitives are
// shared between threads, so oneDNN's own per-primitive scratchpad would race) at `scratchpad`, a
// piece of the layer's workspace of scratchpad_md.get_size() bytes (nullptr when that is 0).
void execute(const dnnl::primitive& p, const dnnl::memory::desc& scratchpad_md, void* scratchpad,
             std::unordered_map<int, dnnl::memory> args);

// A one-input, one-output primitive (pooling, reorder) run on `src` into `dst` with its scratchpad
// from the layer's workspace (the first piece), exceptions as a Status naming `tactic`.
Status execute_src_dst(const std::string& tactic, const RunContext& ctx, const dnnl::primitive& p,
                       const dnnl::memory::desc& scratchpad_md, const dnnl::memory::desc& src_md, const void* src,
                       const dnnl::memory::desc& dst_md, void* dst);

// Copies `src` (plain, user layout) into memory of layout `dst_md` at `dst` (reorder when they differ).
void reorder_into(const dnnl::memory::desc& src_md, const void* src, const dnnl::memory::desc& dst_md, void* dst);

// A matmul's third input as oneDNN's matmul takes it. Gemm (gemm true): beta * C as a per-column bias
// when C is one ([n] or [1, n]), else beta * C broadcast to a row-major [m, n] prefill that the sum
// post-op adds (Unsupported when C does not broadcast to [m, n]). A fused MatMul's bias: as is.
Status matmul_bias(const Tensor& c, bool gemm, float beta, int64_t m, int64_t n, std::vector<float>* bias,
                   std::vector<float>* prefill);

// What a matmul with a sum post-op accumulates onto, written into its n-float output first: the
// prefill plus the residual, the prefill or the residual alone (either may be absent), or nothing.
void fill_accumulator(float* dst, size_t n, const std::vector<float>& prefill, const float* residual);

// A 2-D convolution's oneDNN descriptors from its geometry: the user weights (oihw, goihw when
// grouped) and the same dims in any layout, the bias (M floats), strides, dilations and pads.
struct ConvDescs {
  explicit ConvDescs(const ConvGeometry& g);
  memory::desc user_w, any_w, bias;
  memory::dims strides, dil, pl, pr;
  // The forward-inference convolution of `alg` from src to dst, with the bias when `has_bias`.
  dnnl::convolution_forward::desc desc(dnnl::algorithm alg, const memory::desc& src, const memory::desc& dst,
                                       bool has_bias) const;
  // The layer's weights (input 1) reordered into pd's layout, and its bias (input 2) when
  // `has_bias`.
  void load_constants(const LayerSignature& sig, const dnnl::convolution_forward::primitive_desc& pd, bool has_bias,
                      memory* weights, memory* bias_mem) const;
};

}  // namespace kiln::backends::cpu::onednn
