// kiln's own tactics for the transformer path (kernels in xformer_kernels.{h,inc,cc}; AVX-512,
// AVX2 or portable C++ chosen by cpu_isa() when a layer is prepared). Compiled with or without
// oneDNN.
#pragma once

#include <string>

#include "backends/cpu/xformer_kernels.h"
#include "backends/tactic.h"

namespace kiln::backends::cpu {

// LayerNormalization (ONNX, kiln): any axis (the normalized block is contiguous), Scale/B of the
// block's size or scalars, Y only.
const Tactic* layer_norm_kiln();
// Softmax / LogSoftmax over a contiguous block (opset < 13: any axis) or, from opset 13, along any
// axis (an inner axis: vectorized across the columns after it).
const Tactic* softmax_kiln();
// GroupNormalization (per-group or per-channel scale / bias) and InstanceNormalization, constant
// scale and bias.
const Tactic* group_norm_kiln();
// kiln.Attention: scaled dot-product attention fused per (batch, head, query-row block).
const Tactic* attention_kiln_fused();
// kiln.FusedElementwise: the body compiled into a vectorized program at prepare time.
const Tactic* fused_elementwise_kiln();
// Gelu (ONNX 20, kiln): erf or tanh form.
const Tactic* gelu_kiln();
const Tactic* concat_elementwise_blocked_kiln();                // kiln.BlockedConcatElementwise
const Tactic* concat_elementwise_blocked_kiln_single_thread();  // ... on one thread (the tuner times both)

// "" when every present input is float32 and the layer computes in float32 on the CPU.
std::string xf_float32_layer(const LayerSignature& sig);
// Multidirectional (numpy) broadcast of two shapes; false when they do not broadcast.
bool xf_broadcast(const Dims& a, const Dims& b, Dims* out);
// The row structure of the broadcast of `in` (p's inner, outer_dims, in_strides, in_varies; see
// xf::EltProgram) and its shape `out`; "" or why not. Used by every broadcasting elementwise tactic.
// With `periodic`, a last dim group every input takes whole may merge into the row before it as a
// period of the inputs that broadcast along that one (in_varies 2); callers that read in_varies as
// contiguous-or-broadcast leave it off.
std::string xf_plan_rows(const std::vector<Dims>& in, xf::EltProgram* p, Dims* out, bool periodic = false);

}  // namespace kiln::backends::cpu
