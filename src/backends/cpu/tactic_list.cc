// The variant list: every CPU tactic, per op. The auto-tuner (src/tune) times every supporting
// tactic of a layer and keeps the fastest (list order breaks ties and decides when shapes are unknown
// at build time); the tactic unit tests check each listed tactic against the reference kernel;
// bench/kiln_kernel_bench times them layer by layer. A new kernel is one line here; the registry
// (backends/registry.cc) puts this list after no other.
#include "backends/cpu/tactic_list.h"

#include "backends/cpu/kiln_tactics.h"
#include "backends/cpu/nchwc_tactics.h"
#include "backends/cpu/onednn_int8_tactics.h"
#include "backends/cpu/xformer_tactics.h"
#if defined(KILN_HAVE_ONEDNN)
#include <oneapi/dnnl/dnnl.h>

#include "backends/cpu/int8_matmul_tactics.h"
#include "backends/cpu/onednn_tactics.h"
#endif

namespace kiln::backends::cpu {

std::string library_versions() {
#if defined(KILN_HAVE_ONEDNN)
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
#else
  return "";
#endif
}

int64_t preferred_layout_block(IsaSet isa) {
#if defined(KILN_HAVE_ONEDNN)
  if (isa & kIsaAvx512) return 16;
  if (isa & kIsaAvx2) return 8;
#endif
  (void)isa;
  return 0;
}

const std::vector<const Tactic*>& tactic_list() {
  static const std::vector<const Tactic*> list = [] {
    std::vector<const Tactic*> v;
#if defined(KILN_HAVE_ONEDNN)
    namespace dnn = onednn;
    // Conv / kiln.FusedConv
    v.push_back(dnn::conv2d_onednn_blocked());
    // No oneDNN 2-D conv in plain NCHW: oneDNN has no direct kernel there and runs [im2col +] SGEMM
    // ("x64:gemm:jit"). That was 5-9x slower than conv2d_onednn_blocked on regnet_y_400mf's stem and
    // grouped convs (AMD EPYC, 2 threads: 1.15 against 0.18 ms), and where it won (a few 1x1 convs,
    // by up to 0.1 ms of regnet_y_400mf's 33 ms at batch 8) its SGEMM allocated its packing buffers
    // inside every run (72 KiB for the 208 -> 208 1x1 conv at 14x14; tests/noalloc).
    // conv2d_onednn_blocked and conv2d_kiln_1x1 take those layers.
    v.push_back(dnn::conv1d_onednn_blocked());
    v.push_back(dnn::conv1d_onednn_ncw());
    v.push_back(dnn::conv3d_onednn_blocked());
    v.push_back(dnn::conv3d_onednn_ncdhw());
    // ConvTranspose (oneDNN's deconvolution)
    v.push_back(dnn::convtranspose_onednn_blocked());
    v.push_back(dnn::convtranspose_onednn_plain());
    // MatMul / Gemm / kiln.FusedMatMul / kiln.FusedGemm
    v.push_back(dnn::matmul_onednn_packed());
    v.push_back(dnn::matmul_onednn_batched());
    // MatMulInteger / QLinearMatMul / kiln.DynQMatMul (INT8: u8 x s8 -> s32, kiln's quantizer and epilogue)
    v.push_back(dnn::matmul_integer_onednn_u8s8s32());
    v.push_back(dnn::qlinear_matmul_onednn_u8s8s32());
    v.push_back(dnn::dyn_q_matmul_onednn_u8s8s32());
    v.push_back(dnn::q_matmul_onednn_u8s8s32());
    // MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool
    v.push_back(dnn::pool1d_onednn_ncw());
    v.push_back(dnn::pool2d_onednn_nchw());
    v.push_back(dnn::pool3d_onednn_ncdhw());
    // kiln.BlockedConv (src/passes/layout_blocked.cc): Winograd first, where oneDNN has it (3x3,
    // stride 1, whole blocks of 16 channels, ReLU or no activation), measured 1.6-2.4x faster than
    // direct on resnet50's 3x3 layers at batch 1 and 8, one thread, run in network order.
    v.push_back(dnn::conv2d_onednn_nchwc_winograd());
    v.push_back(dnn::conv2d_onednn_nchwc());
    // ... and on one thread for small layers (a parallel region can cost more than it splits)
    v.push_back(dnn::conv2d_onednn_nchwc_single_thread());
    // ... and with an expensive activation applied by kiln's vector code after it (timed as well)
    v.push_back(dnn::conv2d_onednn_nchwc_kiln_act());
    // kiln.BlockedPool, kiln.ReorderToBlocked / ReorderFromBlocked
    v.push_back(dnn::pool2d_onednn_nchwc());
    v.push_back(dnn::pool2d_onednn_nchwc_single_thread());
    v.push_back(dnn::reorder_onednn_nchwc());
    // kiln.BlockedConvDw (src/passes/layout_fuse_dw.cc): 1x1 conv with the depthwise conv as post-op
    v.push_back(dnn::conv2d_onednn_nchwc_dw());
    // BF16 (computing in bfloat16: candidates only where the build allows it, engine/precision.h)
    v.push_back(dnn::conv2d_onednn_nchwc_bf16());
    v.push_back(dnn::matmul_onednn_bf16_packed());
    // ... on channels-last bfloat16 activations (AMX targets: layout_nhwc and bf16 storage on the CPU)
    v.push_back(dnn::conv2d_onednn_nhwc_bf16());
    v.push_back(dnn::pool2d_onednn_nhwc_bf16());
    v.push_back(dnn::matmul_onednn_bf16_io());
    v.push_back(dnn::conv2d_onednn_nhwc());
    v.push_back(dnn::pool2d_onednn_nhwc());
    // kiln.QConv (src/passes/fold_qdq_conv.cc): INT8 convolution / Gemm, channels-last
    v.push_back(dnn::conv2d_onednn_int8_nhwc());
    v.push_back(dnn::conv2d_onednn_int8_nhwc_vnni());
    v.push_back(dnn::pool2d_onednn_int8_nhwc());
#endif
    // kiln's own transformer kernels: LayerNormalization, Softmax / LogSoftmax, kiln.Attention,
    // kiln.FusedElementwise, Gelu
    v.push_back(layer_norm_kiln());
    v.push_back(softmax_kiln());
    v.push_back(group_norm_kiln());
    v.push_back(attention_kiln_fused());
    // Before the general elementwise kernel: the squeeze-excite channel scale on blocked values
    v.push_back(scale_channels_blocked_kiln());
    v.push_back(fused_elementwise_kiln());
    v.push_back(gelu_kiln());
    v.push_back(concat_elementwise_blocked_kiln());
    v.push_back(concat_elementwise_blocked_kiln_single_thread());
    // kiln's own GEMM, 1x1 and depthwise convolution, pooling (the auto-tuner times them against oneDNN's)
    v.push_back(gemm_kiln_packed());
    v.push_back(conv2d_kiln_1x1());
    v.push_back(conv2d_kiln_depthwise());
    v.push_back(pool2d_kiln_nchw());
    // Concat of channel-blocked values (the one layout_blocked keeps blocked)
    v.push_back(concat_blocked_kiln());
    // kiln.BlockedConv: kiln's own Winograd F(4x4, 3x3) (timed against oneDNN's Winograd and direct)
    v.push_back(conv2d_winograd_f4x3_nchw16c());
    // The long tail: Resize, Where / comparisons / logical ops, Cast, data movement, reductions
    v.push_back(resize_kiln());
    v.push_back(logic_kiln());
    v.push_back(cast_kiln());
    v.push_back(movement_kiln());
    v.push_back(reduce_kiln());
    // Detection post-processing: NMS, RoiAlign, TopK, GatherND, NonZero, ScatterElements, and
    // ConstantOfShape / Expand of run-time shapes (after movement_kiln, which takes constant shapes)
    v.push_back(nms_kiln());
    v.push_back(roi_align_kiln());
    v.push_back(topk_kiln());
    v.push_back(gather_nd_kiln());
    v.push_back(nonzero_kiln());
    v.push_back(scatter_elements_kiln());
    v.push_back(fill_kiln());
    // INT8 CNN layers (src/passes/fold_qdq_conv.cc): kiln.QPool, QuantizeLinear / DequantizeLinear
    v.push_back(pool2d_kiln_int8_nhwc());
    v.push_back(quantize_linear_kiln());
    v.push_back(quantize_channels_last_kiln());
    return v;
  }();
  return list;
}

}  // namespace kiln::backends::cpu
