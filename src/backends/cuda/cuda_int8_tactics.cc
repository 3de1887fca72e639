// The CUDA backend's INT8 CNN tactics: kiln.QConv, kiln.QPool, kiln.QuantizeChannelsLast, per-tensor
// QuantizeLinear / DequantizeLinear and kiln.QMatMul (the layers fold_qdq_conv / fold_qdq_linear and
// INT8 calibration make), so an INT8 CNN runs on the GPU from its float input to its float logits.
//  - qconv_cudnn_int8_nhwc: cuDNN's INT8 convolution (x and w int8 NHWC/KRSC, int32 accumulation,
//    float output: exact integers below 2^24) and kiln's requantization epilogue over [N*OH*OW, M].
//    uint8 activations and zero points are exact without widening: x - 128 (uint8) or x (int8) is
//    int8, the padding border is written explicitly with the zero point's value (so a pad tap
//    contributes (zp - shift) * w like every other tap's shift), and the per-channel constant
//    (zp - shift) * sum(w[m]) is subtracted in the epilogue together with the bias. That copy is
//    skipped (x read in place, cuDNN's own zero pads) for int8 x with zero point 0, symmetric pads
//    and C a multiple of 4. cuDNN's INT8 channel rule (multiples of 4): C is padded with zero
//    weights in the same copy, M must be one; group 1. The configuration is run once at prepare
//    time, so a configuration cuDNN cannot run is declined there, never at run time.
//  - qconv_cuda_direct: kiln's direct kernel (one thread per output, dp4a over 4 channels when C/g is
//    a multiple of 4), any group, stride, dilation, pads, uint8/int8, channels-last or not, and the
//    Gemm form [N, C]: the complete fallback, slower.
// Both requantize in double exactly as the reference does (cuda_int8_kernels.h).
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_int8_kernels.h"
#include "backends/cuda/cudnn_tactics.h"
#include "core/shape.h"
#include "ops/conv_util.h"
#include "ops/kiln_quantized.h"

namespace kiln::backends::cuda {
namespace {

bool is_8bit(DataType t) { return t == DataType::kInt8 || t == DataType::kUInt8; }

TacticInfo cuda_int8() {
  return {DeviceKind::kCUDA,
          kIsaPortable,
          DataType::kInt8,
          {DataType::kUInt8, DataType::kInt8},
          {DataType::kUInt8, DataType::kInt8}};
}
TacticInfo cuda_convert() { return {DeviceKind::kCUDA, kIsaPortable, DataType::kUndefined, {}, {}}; }

Status cudnn_ok(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return Status::Ok();
  return Unsupported("cuDNN: ", what, ": ", cudnnGetErrorString(s));
}
#define KILN_CUDNN_INT8_RETURN_IF_ERROR(call) KILN_RETURN_IF_ERROR(cudnn_ok((call), #call))

// ---------------------------------------------------------------- kiln.QConv

// A kiln.QConv's geometry and requantization parameters, read once for both tactics.
struct QConvPlan {
  ops::QuantizedLayerParams q;
  QConvGeometry g;
  Dims out_shape;
  bool gemm = false, has_bias = false, has_residual = false;
  DataType x_type = DataType::kUInt8, residual_type = DataType::kUInt8;
  int64_t pad_end_h = 0, pad_end_w = 0;
};

std::string qconv_common_reason(const LayerSignature& sig) {
  if (!sig.has_input(0) || !sig.has_input(1)) return "no x or w";
  const TensorSig& x = sig.inputs[0];
  const TensorSig& w = sig.inputs[1];
  if (!is_8bit(x.dtype)) return std::string("x is ") + dtype_name(x.dtype);
  if (!w.constant || w.dtype != DataType::kInt8 || w.shape.size() != 4)
    return "w is not a constant int8 [M, C/g, kh, kw]";
  if (!x.known()) return "x's shape is not known";
  if (x.shape.size() != 2 && x.shape.size() != 4) return "not a 2-D convolution or a Gemm";
  if (sig.has_input(2) && (!sig.inputs[2].constant || sig.inputs[2].dtype != DataType::kInt32))
    return "the bias is not an int32 constant";
  if (sig.has_input(3) && !is_8bit(sig.inputs[3].dtype)) return "the residual is not 8-bit";
  const auto q = ops::quantized_layer_params(*sig.node);
  if (!is_8bit(q.y_type)) return "y_type is not 8-bit";
  if (q.activation != "" && q.activation != "Relu" && q.activation != "Clip")
    return "activation '" + q.activation + "' has no kernel";
  return "";
}

Result<QConvPlan> plan_qconv(const LayerSignature& sig) {
  QConvPlan p;
  const ir::Node& node = *sig.node;
  p.q = ops::quantized_layer_params(node);
  const Dims& xg = sig.inputs[0].shape;
  const Dims& wd = sig.inputs[1].shape;
  p.gemm = xg.size() == 2;
  p.x_type = sig.inputs[0].dtype;
  QConvGeometry& g = p.g;
  g.group = p.gemm ? 1 : node.attr_int("group", 1);
  if (p.gemm) {
    g.n = xg[0], g.c = xg[1], g.m = wd[0], g.channels_last = true;
    if (wd[1] != g.c || wd[2] != 1 || wd[3] != 1) return Unsupported("a Gemm's w is not [M, C, 1, 1]");
    p.out_shape = {g.n, g.m};
  } else {
    g.channels_last = p.q.channels_last;
    const Dims x = g.channels_last ? ops::to_channels_first(xg) : xg;
    KILN_ASSIGN_OR_RETURN(ops::WindowGeometry win, ops::resolve_window(node, x, &wd));
    if (win.rank() != 2) return Unsupported("not a 2-D convolution");
    g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3], g.m = wd[0];
    g.kh = win.kernel[0], g.kw = win.kernel[1], g.sh = win.strides[0], g.sw = win.strides[1];
    g.dh = win.dilations[0], g.dw = win.dilations[1], g.ph = win.pad_begin[0], g.pw = win.pad_begin[1];
    g.oh = win.out[0], g.ow = win.out[1];
    p.pad_end_h = win.pad_end[0], p.pad_end_w = win.pad_end[1];
    if (g.group <= 0 || g.c != wd[1] * g.group || g.m % g.group != 0)
      return Unsupported("x ", dims_str(xg), " and w ", dims_str(wd), " do not fit group ", g.group);
    if (wd[2] != g.kh || wd[3] != g.kw) return Unsupported("kernel_shape differs from w's");
    p.out_shape = g.channels_last ? Dims{g.n, g.oh, g.ow, g.m} : Dims{g.n, g.m, g.oh, g.ow};
  }
  if (dims_numel(p.out_shape) == 0 || g.n * g.c * g.h * g.w == 0) return Unsupported("empty tensors");
  if (p.q.w_scales.size() != 1 && static_cast<int64_t>(p.q.w_scales.size()) != g.m)
    return Unsupported("w_scales has ", p.q.w_scales.size(), " values for ", g.m, " output channels");
  // The int32 accumulator: |x - zp| <= 255, |w| <= 128 per tap.
  if (g.c / g.group * g.kh * g.kw > 60000) return Unsupported("more than 60000 taps (the int32 sum could overflow)");
  p.has_bias = sig.has_input(2);
  if (p.has_bias && sig.inputs[2].constant->numel() != g.m)
    return Unsupported("the bias has ", sig.inputs[2].constant->numel(), " values, not ", g.m);
  p.has_residual = node.inputs.size() > 3 && sig.has_input(3);
  if (p.has_residual) {
    p.residual_type = sig.inputs[3].dtype;
    if (sig.inputs[3].shape != p.out_shape)
      return Unsupported("the residual ", dims_str(sig.inputs[3].shape), " is not y's shape ", dims_str(p.out_shape));
  }
  return p;
}

// The device epilogue's parameters; `comp` (per channel, added to the accumulator) and the scales are
// uploaded into *scale_dev / *comp_dev.
Result<QEpilogue> make_epilogue(const QConvPlan& p, const std::vector<int64_t>& comp, int dev, Tensor* scale_dev,
                                Tensor* comp_dev) {
  const auto& q = p.q;
  Tensor scale(DataType::kFloat64, {p.g.m});
  for (int64_t m = 0; m < p.g.m; ++m)
    scale.data<double>()[m] = static_cast<double>(q.x_scale) * static_cast<double>(q.w_scale(m));
  KILN_ASSIGN_OR_RETURN(*scale_dev, to_device(runtime(), dev, scale, nullptr));
  QEpilogue e;
  e.scale = scale_dev->data<double>();
  bool any = false;
  Tensor c(DataType::kInt32, {p.g.m});
  for (int64_t m = 0; m < p.g.m; ++m) {
    const int64_t v = comp[static_cast<size_t>(m)];
    if (v > std::numeric_limits<int32_t>::max() || v < std::numeric_limits<int32_t>::min())
      return Unsupported("channel ", m, "'s bias and zero point term ", v, " exceeds int32");
    c.data<int32_t>()[m] = static_cast<int32_t>(v);
    any |= v != 0;
  }
  if (any) {
    KILN_ASSIGN_OR_RETURN(*comp_dev, to_device(runtime(), dev, c, nullptr));
    e.comp = comp_dev->data<int32_t>();
  }
  if (q.has_inner()) {
    e.inner_scale = q.inner_scale, e.inner_zp = static_cast<double>(q.inner_zero_point);
    e.inner_lo = static_cast<double>(q.inner_min()), e.inner_hi = static_cast<double>(q.inner_max());
  }
  e.residual_scale = q.residual_scale, e.residual_zp = static_cast<double>(q.residual_zero_point);
  e.residual_signed = p.residual_type == DataType::kInt8;
  if (q.activation == "Relu") e.act = QAct::kRelu;
  if (q.activation == "Clip") e.act = QAct::kClip;
  e.act_lo = q.activation_min, e.act_hi = q.activation_max;
  e.y_scale = q.y_scale, e.y_zp = static_cast<double>(q.y_zero_point);
  e.y_lo = static_cast<double>(q.y_min()), e.y_hi = static_cast<double>(q.y_max());
  e.y_signed = q.y_type == DataType::kInt8;
  return e;
}

std::vector<int64_t> bias_of(const LayerSignature& sig, int64_t m) {
  std::vector<int64_t> b(static_cast<size_t>(m), 0);
  if (sig.has_input(2))
    for (int64_t k = 0; k < m; ++k) b[static_cast<size_t>(k)] = sig.inputs[2].constant->get_i64(k);
  return b;
}

class PreparedQConvDirect : public PreparedLayer {
 public:
  QConvPlan p;
  QEpilogue e;
  Tensor weight, scale, comp;  // on the device
  std::vector<Dims> output_shapes() const override { return {p.out_shape}; }
  std::vector<DataType> output_dtypes() const override { return {p.q.y_type}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    const void* r = p.has_residual ? in[3]->raw() : nullptr;
    return cuda_status(
        launch_qconv_direct(in[0]->raw(), p.x_type == DataType::kInt8, static_cast<int32_t>(p.q.x_zero_point),
                            weight.data<int8_t>(), r, out[0]->raw(), p.g, e, stream_of(ctx)),
        "qconv_cuda_direct");
  }
};

class QConvDirectCuda : public Tactic {
 public:
  std::string name() const override { return "qconv_cuda_direct"; }
  TacticInfo info() const override { return cuda_int8(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "QConv"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override { return qconv_common_reason(sig); }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto l = std::make_unique<PreparedQConvDirect>();
    KILN_ASSIGN_OR_RETURN(l->p, plan_qconv(sig));
    const QConvGeometry& g = l->p.g;
    const int dev = sig.device.index;
    // The weight as the kernel reads it: [tap, C/g, M] bytes, or [tap, C/g/4, M] words of 4 channels.
    const int64_t cpg = g.c / g.group, taps = g.kh * g.kw, cpg4 = cpg / 4;
    const bool vec = g.channels_last && cpg % 4 == 0 && g.c % 4 == 0;
    const Tensor& w = *sig.inputs[1].constant;
    Tensor wt(DataType::kInt8, {taps * cpg * g.m});
    int8_t* dst = wt.data<int8_t>();
    for (int64_t m = 0; m < g.m; ++m)
      for (int64_t c = 0; c < cpg; ++c)
        for (int64_t t = 0; t < taps; ++t) {
          const int8_t v = static_cast<int8_t>(w.get_i64((m * cpg + c) * taps + t));
          const int64_t at = vec ? ((t * cpg4 + c / 4) * g.m + m) * 4 + c % 4 : (t * cpg + c) * g.m + m;
          dst[at] = v;
        }
    KILN_ASSIGN_OR_RETURN(l->weight, to_device(runtime(), dev, wt, nullptr));
    KILN_ASSIGN_OR_RETURN(l->e, make_epilogue(l->p, bias_of(sig, g.m), dev, &l->scale, &l->comp));
    KILN_RETURN_IF_ERROR(runtime().synchronize(nullptr));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

// cuDNN's INT8 convolution + kiln's epilogue.
class PreparedQConvCudnn : public PreparedLayer {
 public:
  ~PreparedQConvCudnn() override {
    if (x_desc) cudnnDestroyTensorDescriptor(x_desc);
    if (y_desc) cudnnDestroyTensorDescriptor(y_desc);
    if (w_desc) cudnnDestroyFilterDescriptor(w_desc);
    if (conv_desc) cudnnDestroyConvolutionDescriptor(conv_desc);
  }
  QConvPlan p;
  QEpilogue e;
  Tensor weight, scale, comp;
  cudnnTensorDescriptor_t x_desc = nullptr, y_desc = nullptr;
  cudnnFilterDescriptor_t w_desc = nullptr;
  cudnnConvolutionDescriptor_t conv_desc = nullptr;
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  size_t cudnn_ws = 0;
  // The input copy: x - shift with the zero point's value in the border (when x is uint8, or the
  // pads are asymmetric or carry a non-zero value).
  bool copy = false;
  int32_t shift = 0;
  int8_t fill = 0;
  int64_t padded_h = 0, padded_w = 0, padded_c = 0;
  size_t copy_bytes = 0, acc_bytes = 0;

  std::vector<Dims> output_shapes() const override { return {p.out_shape}; }
  std::vector<DataType> output_dtypes() const override { return {p.q.y_type}; }
  size_t workspace_bytes(int) const override {
    return workspace_piece(cudnn_ws) + workspace_piece(copy_bytes) + workspace_piece(acc_bytes);
  }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return run_on(stream_of(ctx), ctx.workspace, ctx.workspace_bytes, in[0]->raw(),
                  p.has_residual ? in[3]->raw() : nullptr, out[0]->raw());
  }
  Status run_on(cudaStream_t s, void* workspace, size_t workspace_size, const void* x, const void* residual,
                void* y) const {
    RunContext ctx;
    ctx.workspace = workspace, ctx.workspace_bytes = workspace_size;
    WorkspaceSlicer ws(ctx);
    void* conv_ws = ws.take(cudnn_ws);
    const QConvGeometry& g = p.g;
    if (copy) {
      int8_t* padded = static_cast<int8_t*>(ws.take(copy_bytes));
      KILN_CUDA_RETURN_IF_ERROR(launch_int8_pad_shift(x, padded, shift, fill, g.n, g.h, g.w, g.c, g.ph, g.pw, padded_h,
                                                      padded_w, padded_c, s));
      x = padded;
    }
    float* acc = static_cast<float*>(ws.take(acc_bytes));
    KILN_ASSIGN_OR_RETURN(void* hv, cudnn_thread_handle());
    cudnnHandle_t h = static_cast<cudnnHandle_t>(hv);
    KILN_CUDNN_INT8_RETURN_IF_ERROR(cudnnSetStream(h, s));
    const float one = 1.f, zero = 0.f;
    KILN_CUDNN_INT8_RETURN_IF_ERROR(cudnnConvolutionForward(h, &one, x_desc, x, w_desc, weight.raw(), conv_desc, algo,
                                                            conv_ws, cudnn_ws, &zero, y_desc, acc));
    return cuda_status(launch_qepilogue(acc, false, residual, y, g.n * g.oh * g.ow, g.m, e, s),
                       "qconv_cudnn_int8_nhwc epilogue");
  }
};

class QConvCudnnCuda : public Tactic {
 public:
  std::string name() const override { return "qconv_cudnn_int8_nhwc"; }
  TacticInfo info() const override { return cuda_int8(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "QConv"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = qconv_common_reason(sig); !e.empty()) return e;
    const auto q = ops::quantized_layer_params(*sig.node);
    const Dims& x = sig.inputs[0].shape;
    if (x.size() != 4 || !q.channels_last) return "not a channels-last 2-D convolution (the Gemm form goes direct)";
    if (sig.node->attr_int("group", 1) != 1) return "grouped (cuDNN's INT8 convolution takes group 1)";
    const Dims& w = sig.inputs[1].shape;
    if (w[0] % 4 != 0) return "M " + std::to_string(w[0]) + " is not a multiple of 4 (cuDNN INT8)";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto l = std::make_unique<PreparedQConvCudnn>();
    KILN_ASSIGN_OR_RETURN(l->p, plan_qconv(sig));
    const QConvGeometry& g = l->p.g;
    const int dev = sig.device.index;
    l->shift = l->p.x_type == DataType::kUInt8 ? 128 : 0;
    const int64_t fill = l->p.q.x_zero_point - l->shift;
    if (fill < -128 || fill > 127)
      return Unsupported(name(), ": the zero point ", l->p.q.x_zero_point, " is out of range");
    l->fill = static_cast<int8_t>(fill);
    const bool pads = g.ph || g.pw || l->p.pad_end_h || l->p.pad_end_w;
    const bool symmetric = g.ph == l->p.pad_end_h && g.pw == l->p.pad_end_w;
    const int64_t c4 = (g.c + 3) / 4 * 4;  // cuDNN's INT8 channels: a multiple of 4 (zero weights pad C)
    l->copy = l->shift != 0 || c4 != g.c || (pads && (fill != 0 || !symmetric));
    l->padded_c = c4;
    if (l->copy) {
      l->padded_h = g.h + g.ph + l->p.pad_end_h, l->padded_w = g.w + g.pw + l->p.pad_end_w;
      l->copy_bytes = static_cast<size_t>(g.n * l->padded_h * l->padded_w * c4);
    }
    l->acc_bytes = static_cast<size_t>(g.n * g.oh * g.ow * g.m) * sizeof(float);
    const int64_t xh = l->copy ? l->padded_h : g.h, xw = l->copy ? l->padded_w : g.w;
    for (int64_t v : {g.n, c4, xh, xw, g.m, g.oh, g.ow})
      if (v > INT32_MAX) return Unsupported(name(), ": a dim above 2^31 (cuDNN takes int)");
    if (g.n * xh * xw * c4 > INT32_MAX || g.n * g.oh * g.ow * g.m > INT32_MAX)
      return Unsupported(name(), ": a tensor of 2^31 elements or more");

    // The weight KRSC and its per-channel sums (the zero point term).
    const Tensor& w = *sig.inputs[1].constant;
    const int64_t taps = g.kh * g.kw;
    Tensor wt(DataType::kInt8, {g.m, g.kh, g.kw, c4});
    std::fill(wt.data<int8_t>(), wt.data<int8_t>() + wt.numel(), int8_t{0});
    std::vector<int64_t> comp = bias_of(sig, g.m);
    for (int64_t m = 0; m < g.m; ++m) {
      int64_t sum = 0;
      for (int64_t c = 0; c < g.c; ++c)
        for (int64_t t = 0; t < taps; ++t) {
          const int64_t v = w.get_i64((m * g.c + c) * taps + t);
          wt.data<int8_t>()[(m * taps + t) * c4 + c] = static_cast<int8_t>(v);
          sum += v;
        }
      comp[static_cast<size_t>(m)] -= fill * sum;
    }
    KILN_ASSIGN_OR_RETURN(l->weight, to_device(runtime(), dev, wt, nullptr));
    KILN_ASSIGN_OR_RETURN(l->e, make_epilogue(l->p, comp, dev, &l->scale, &l->comp));

    const int ci = static_cast<int>(c4), mi = static_cast<int>(g.m);
    KILN_CUDNN_INT8_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&l->x_desc));
    KILN_CUDNN_INT8_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&l->y_desc));
    KILN_CUDNN_INT8_RETURN_IF_ERROR(cudnnCreateFilterDescriptor(&l->w_desc));
    KILN_CUDNN_INT8_RETURN_IF_ERROR(cudnnCreateConvolutionDescriptor(&l->conv_desc));
    KILN_CUDNN_INT8_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(l->x_desc, CUDNN_TENSOR_NHWC, CUDNN_DATA_INT8,
                                                               static_cast<int>(g.n), ci, static_cast<int>(xh),
                                                               static_cast<int>(xw)));
    KILN_CUDNN_INT8_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(l->y_desc, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT,
                                                               static_cast<int>(g.n), mi, static_cast<int>(g.oh),
                                                               static_cast<int>(g.ow)));
    KILN_CUDNN_INT8_RETURN_IF_ERROR(cudnnSetFilter4dDescriptor(l->w_desc, CUDNN_DATA_INT8, CUDNN_TENSOR_NHWC, mi, ci,
                                                               static_cast<int>(g.kh), static_cast<int>(g.kw)));
    const int pad_h = l->copy ? 0 : static_cast<int>(g.ph), pad_w = l->copy ? 0 : static_cast<int>(g.pw);
    KILN_CUDNN_INT8_RETURN_IF_ERROR(cudnnSetConvolution2dDescriptor(
        l->conv_desc, pad_h, pad_w, static_cast<int>(g.sh), static_cast<int>(g.sw), static_cast<int>(g.dh),
        static_cast<int>(g.dw), CUDNN_CROSS_CORRELATION, CUDNN_DATA_INT32));
    int on = 0, oc = 0, ohh = 0, oww = 0;
    KILN_CUDNN_INT8_RETURN_IF_ERROR(
        cudnnGetConvolution2dForwardOutputDim(l->conv_desc, l->x_desc, l->w_desc, &on, &oc, &ohh, &oww));
    if (on != g.n || oc != g.m || ohh != g.oh || oww != g.ow)
      return Internal(sig.node->where(), ": cuDNN's output [", on, ", ", oc, ", ", ohh, ", ", oww, "] is not kiln's ",
                      dims_str(l->p.out_shape), " (a kiln bug)");

    // The algorithms cuDNN offers for this configuration, tried in its order: the first that runs on
    // this device (a trial run on scratch buffers) is kept, so a configuration cuDNN cannot run is
    // declined here.
    KILN_ASSIGN_OR_RETURN(void* hv, cudnn_thread_handle());
    cudnnHandle_t h = static_cast<cudnnHandle_t>(hv);
    const Dims& xs = sig.inputs[0].shape;
    KILN_ASSIGN_OR_RETURN(Tensor x_trial, device_tensor(runtime(), dev, sig.inputs[0].dtype, xs));
    KILN_ASSIGN_OR_RETURN(Tensor y_trial, device_tensor(runtime(), dev, l->p.q.y_type, l->p.out_shape));
    Tensor r_trial;
    if (l->p.has_residual) {
      KILN_ASSIGN_OR_RETURN(r_trial, device_tensor(runtime(), dev, l->p.residual_type, l->p.out_shape));
      KILN_RETURN_IF_ERROR(runtime().fill(r_trial.raw(), 0, r_trial.nbytes(), nullptr));
    }
    KILN_RETURN_IF_ERROR(runtime().fill(x_trial.raw(), 0, x_trial.nbytes(), nullptr));
    std::string failures;
    bool found = false;
    // INT8 tensor cores (IMMA) first, then cuDNN's default math; int32 accumulation is exact either way.
    for (cudnnMathType_t math : {CUDNN_TENSOR_OP_MATH, CUDNN_DEFAULT_MATH}) {
      if (found) break;
      if (cudnnSetConvolutionMathType(l->conv_desc, math) != CUDNN_STATUS_SUCCESS) continue;
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT * 2];
      int returned = 0;
      if (cudnnGetConvolutionForwardAlgorithm_v7(h, l->x_desc, l->w_desc, l->conv_desc, l->y_desc,
                                                 CUDNN_CONVOLUTION_FWD_ALGO_COUNT * 2, &returned,
                                                 perf) != CUDNN_STATUS_SUCCESS)
        returned = 0;  // no ranking: the implicit precomputed GEMM alone is tried
      std::vector<cudnnConvolutionFwdAlgo_t> algos;
      for (int i = 0; i < returned; ++i)
        if (perf[i].status == CUDNN_STATUS_SUCCESS &&
            std::find(algos.begin(), algos.end(), perf[i].algo) == algos.end())
          algos.push_back(perf[i].algo);
      if (std::find(algos.begin(), algos.end(), CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) == algos.end())
        algos.push_back(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
      for (cudnnConvolutionFwdAlgo_t a : algos) {
        size_t bytes = 0;
        cudnnStatus_t st =
            cudnnGetConvolutionForwardWorkspaceSize(h, l->x_desc, l->w_desc, l->conv_desc, l->y_desc, a, &bytes);
        if (st != CUDNN_STATUS_SUCCESS || bytes > (size_t{1} << 30)) {
          failures += " algo " + std::to_string(static_cast<int>(a)) + ": " + cudnnGetErrorString(st) + ";";
          continue;
        }
        l->algo = a, l->cudnn_ws = bytes;
        Tensor ws;
        const size_t total = l->workspace_bytes(1);
        if (total) {
          KILN_ASSIGN_OR_RETURN(ws, device_tensor(runtime(), dev, DataType::kUInt8, {static_cast<int64_t>(total)}));
        }
        Status run = l->run_on(nullptr, total ? ws.raw() : nullptr, total, x_trial.raw(),
                               l->p.has_residual ? r_trial.raw() : nullptr, y_trial.raw());
        if (run.ok()) run = cuda_status(cudaStreamSynchronize(nullptr), "the trial run");
        if (run.ok()) {
          found = true;
          break;
        }
        (void)cudaGetLastError();  // a launch error is not sticky; clear it for the next try
        failures += " algo " + std::to_string(static_cast<int>(a)) + " math " + std::to_string(static_cast<int>(math)) +
                    ": " + run.message() + ";";
      }
    }
    if (!found) return Unsupported(name(), ": cuDNN runs no INT8 algorithm for ", sig.node->where(), ":", failures);
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

// ---------------------------------------------------------------- kiln.QPool

class PreparedQPoolCuda : public PreparedLayer {
 public:
  QPoolParams p;
  DataType y_type = DataType::kUInt8;
  std::vector<Dims> output_shapes() const override { return {{p.n, p.oh, p.ow, p.c}}; }
  std::vector<DataType> output_dtypes() const override { return {y_type}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return cuda_status(launch_qpool(in[0]->raw(), out[0]->raw(), p, stream_of(ctx)), "qpool_cuda_nhwc");
  }
};

class QPoolCuda : public Tactic {
 public:
  std::string name() const override { return "qpool_cuda_nhwc"; }
  TacticInfo info() const override { return cuda_int8(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "QPool"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (!sig.has_input(0) || !is_8bit(sig.inputs[0].dtype)) return "x is not 8-bit";
    const auto q = ops::quantized_layer_params(*sig.node);
    if (!q.channels_last || sig.inputs[0].shape.size() != 4 || !sig.inputs[0].known())
      return "x is not channels-last [N, H, W, C] of known shape";
    if (q.mode != "MaxPool" && q.mode != "AveragePool" && q.mode != "GlobalAveragePool")
      return "mode '" + q.mode + "' has no kernel";
    if (!is_8bit(q.y_type)) return "y_type is not 8-bit";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto l = std::make_unique<PreparedQPoolCuda>();
    const auto q = ops::quantized_layer_params(*sig.node);
    const Dims& x = sig.inputs[0].shape;
    QPoolParams& p = l->p;
    p.n = x[0], p.h = x[1], p.w = x[2], p.c = x[3];
    p.kh = p.h, p.kw = p.w;
    if (q.mode != "GlobalAveragePool") {
      KILN_ASSIGN_OR_RETURN(ops::WindowGeometry win, ops::resolve_window(*sig.node, ops::to_channels_first(x), nullptr,
                                                                         ops::window_options(q.mode, 19)));
      if (win.rank() != 2) return Unsupported(name(), ": not a 2-D pool");
      p.kh = win.kernel[0], p.kw = win.kernel[1], p.sh = win.strides[0], p.sw = win.strides[1];
      p.dh = win.dilations[0], p.dw = win.dilations[1], p.ph = win.pad_begin[0], p.pw = win.pad_begin[1];
      p.oh = win.out[0], p.ow = win.out[1];
      const bool padded = win.pad_begin[0] || win.pad_begin[1] || win.pad_end[0] || win.pad_end[1];
      if (q.mode == "AveragePool" && padded && sig.node->attr_int("count_include_pad", 0))
        return Unsupported(name(), ": AveragePool with count_include_pad and pads (the reference declines it too)");
    }
    p.max = q.mode == "MaxPool";
    p.x_signed = sig.inputs[0].dtype == DataType::kInt8;
    p.y_signed = q.y_type == DataType::kInt8;
    p.x_zp = static_cast<int32_t>(q.x_zero_point);
    p.x_scale = q.x_scale, p.y_scale = q.y_scale, p.y_zp = static_cast<double>(q.y_zero_point);
    p.y_lo = static_cast<double>(q.y_min()), p.y_hi = static_cast<double>(q.y_max());
    l->y_type = q.y_type;
    if (p.n * p.oh * p.ow * p.c == 0) return Unsupported(name(), ": empty tensors");
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

// ---------------------------------------------------------------- Q / DQ

class PreparedQuantizeCuda : public PreparedLayer {
 public:
  bool quantize = true, channels_last = false;
  DataType q_type = DataType::kUInt8;
  float scale = 1;
  int64_t zero_point = 0, n = 1, c = 1, inner = 1;
  Dims shape;
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {quantize ? q_type : DataType::kFloat32}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    const bool is_signed = q_type == DataType::kInt8;
    if (quantize)
      return cuda_status(launch_quantize(in[0]->data<float>(), out[0]->raw(), is_signed, scale,
                                         static_cast<float>(zero_point), n, c, inner, channels_last, stream_of(ctx)),
                         "quantize_cuda");
    return cuda_status(launch_dequantize(in[0]->raw(), is_signed, out[0]->data<float>(), scale,
                                         static_cast<int32_t>(zero_point), n * c * inner, stream_of(ctx)),
                       "dequantize_cuda");
  }
};

class QuantizeLinearCuda : public Tactic {
 public:
  std::string name() const override { return "quantize_linear_cuda"; }
  TacticInfo info() const override { return cuda_convert(); }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "QuantizeLinear"}, {"", "DequantizeLinear"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    const bool quantize = sig.op() == "QuantizeLinear";
    if (!sig.has_input(0) || !sig.inputs[0].known()) return "x's shape is not known";
    if (!sig.has_input(1) || !sig.inputs[1].constant || sig.inputs[1].constant->numel() != 1 ||
        sig.inputs[1].dtype != DataType::kFloat32)
      return "scale is not a float32 scalar constant (per-axis quantization has no CUDA kernel)";
    if (sig.has_input(2) && (!sig.inputs[2].constant || sig.inputs[2].constant->numel() != 1))
      return "zero point is not a scalar constant";
    if (sig.node->attr_int("block_size", 0) != 0) return "blocked quantization";
    const DataType out = sig.outputs.empty() ? DataType::kUndefined : sig.outputs[0].dtype;
    const DataType q = quantize ? out : sig.inputs[0].dtype;
    if (!is_8bit(q)) return "not 8-bit";
    if ((quantize ? sig.inputs[0].dtype : out) != DataType::kFloat32) return "the float side is not float32";
    if (quantize && (sig.node->attr_int("saturate", 1) != 1 || sig.node->attr_int("precision", 0) != 0))
      return "saturate / precision attributes";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto l = std::make_unique<PreparedQuantizeCuda>();
    l->quantize = sig.op() == "QuantizeLinear";
    l->q_type = l->quantize ? sig.outputs[0].dtype : sig.inputs[0].dtype;
    l->scale = static_cast<float>(sig.inputs[1].constant->get_f64(0));
    l->zero_point = sig.has_input(2) ? sig.inputs[2].constant->get_i64(0) : 0;
    l->shape = sig.inputs[0].shape;
    l->inner = dims_numel(l->shape);
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

class QuantizeChannelsLastCuda : public Tactic {
 public:
  std::string name() const override { return "quantize_channels_last_cuda"; }
  TacticInfo info() const override { return cuda_convert(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "QuantizeChannelsLast"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (!sig.has_input(0) || sig.inputs[0].dtype != DataType::kFloat32 || sig.inputs[0].shape.size() < 3 ||
        !sig.inputs[0].known())
      return "x is not float32 [N, C, spatial...] of known shape";
    if (!is_8bit(ops::quantized_layer_params(*sig.node).y_type)) return "y_type is not 8-bit";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto l = std::make_unique<PreparedQuantizeCuda>();
    const auto q = ops::quantized_layer_params(*sig.node);
    const Dims& x = sig.inputs[0].shape;
    l->quantize = true, l->channels_last = true;
    l->q_type = q.y_type, l->scale = q.y_scale, l->zero_point = q.y_zero_point;
    l->n = x[0], l->c = x[1], l->inner = dims_numel(x) / std::max<int64_t>(1, x[0] * x[1]);
    l->shape = ops::to_channels_last(x);
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

// ---------------------------------------------------------------- kiln.QMatMul

bool scalar_or_columns(const TensorSig& t, int64_t n) {
  return t.constant && (t.constant->numel() == 1 || (t.shape.size() == 1 && t.shape[0] == n));
}

class PreparedQMatMulCuda : public PreparedLayer {
 public:
  QMatMulParams p;
  Dims out_shape;
  bool has_residual = false;
  Tensor b, b_zp, scale, bias;  // on the device
  std::vector<Dims> output_shapes() const override { return {out_shape}; }
  std::vector<DataType> output_dtypes() const override { return {DataType::kFloat32}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return cuda_status(
        launch_qmatmul(in[0]->raw(), b.raw(), b_zp.defined() ? b_zp.data<int32_t>() : nullptr, scale.data<float>(),
                       bias.defined() ? bias.data<float>() : nullptr, has_residual ? in[5]->data<float>() : nullptr,
                       out[0]->data<float>(), p, stream_of(ctx)),
        "q_matmul_cuda");
  }
};

class QMatMulCuda : public Tactic {
 public:
  std::string name() const override { return "q_matmul_cuda"; }
  TacticInfo info() const override {
    return {
        DeviceKind::kCUDA, kIsaPortable, DataType::kInt8, {DataType::kFloat32, DataType::kUInt8}, {DataType::kFloat32}};
  }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "QMatMul"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (!sig.has_input(0) || !sig.has_input(1)) return "missing X or B";
    const TensorSig& a = sig.inputs[0];
    const TensorSig& b = sig.inputs[1];
    if (a.dtype != DataType::kFloat32 && a.dtype != DataType::kUInt8) return "X is not float32 or uint8";
    if (a.shape.size() < 2 || !a.known()) return "X has rank < 2 or an unknown shape";
    if (!b.constant || b.shape.size() != 2 || !is_8bit(b.dtype)) return "B is not a 2-D 8-bit constant";
    if (a.shape.back() != b.shape[0]) return "X's last dim is not B's rows";
    const int64_t n = b.shape[1];
    if (sig.has_input(2) && !scalar_or_columns(sig.inputs[2], n))
      return "B's zero point is not a constant scalar or [N]";
    if (!sig.has_input(3) || !scalar_or_columns(sig.inputs[3], n) || sig.inputs[3].dtype != DataType::kFloat32)
      return "BScale is not a float32 constant scalar or [N]";
    if (b.shape[0] > 33000) return "K over 33000 (the int32 accumulator could overflow)";
    if (sig.has_input(4) &&
        (!sig.inputs[4].constant || sig.inputs[4].dtype != DataType::kFloat32 || sig.inputs[4].constant->numel() != n))
      return "Bias is not a float32 constant [N]";
    if (sig.has_input(5)) {
      Dims want = a.shape;
      want.back() = n;
      if (sig.inputs[5].dtype != DataType::kFloat32 || sig.inputs[5].shape != want)
        return "Residual is not float32 of the output's shape";
    }
    const std::string act = sig.node->attr_string("activation", "");
    if (act != "" && act != "Relu") return "activation '" + act + "' has no kernel";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto l = std::make_unique<PreparedQMatMulCuda>();
    const Dims& a = sig.inputs[0].shape;
    const Tensor& b = *sig.inputs[1].constant;
    const int dev = sig.device.index;
    QMatMulParams& p = l->p;
    p.k = b.shape()[0], p.n = b.shape()[1], p.rows = dims_numel(a) / p.k;
    p.x_float = sig.inputs[0].dtype == DataType::kFloat32;
    p.b_signed = b.dtype() == DataType::kInt8;
    p.relu = sig.node->attr_string("activation", "") == "Relu";
    p.x_scale = sig.node->attr_float("x_scale", 1.f);
    p.x_zp = static_cast<int32_t>(sig.node->attr_int("x_zero_point", 0));
    l->out_shape = a;
    l->out_shape.back() = p.n;
    KILN_ASSIGN_OR_RETURN(l->b, to_device(runtime(), dev, b, nullptr));
    if (sig.has_input(2)) {
      const Tensor& z = *sig.inputs[2].constant;
      Tensor zp(DataType::kInt32, {p.n});
      bool any = false;
      for (int64_t j = 0; j < p.n; ++j) {
        zp.data<int32_t>()[j] = static_cast<int32_t>(z.get_i64(z.numel() == 1 ? 0 : j));
        any |= zp.data<int32_t>()[j] != 0;
      }
      if (any) {
        KILN_ASSIGN_OR_RETURN(l->b_zp, to_device(runtime(), dev, zp, nullptr));
      }
    }
    // x_scale * BScale in float, the reference's Mul.
    const Tensor& bs = *sig.inputs[3].constant;
    Tensor scale(DataType::kFloat32, {p.n});
    for (int64_t j = 0; j < p.n; ++j)
      scale.data<float>()[j] = p.x_scale * static_cast<float>(bs.get_f64(bs.numel() == 1 ? 0 : j));
    KILN_ASSIGN_OR_RETURN(l->scale, to_device(runtime(), dev, scale, nullptr));
    if (sig.has_input(4)) {
      KILN_ASSIGN_OR_RETURN(l->bias, to_device(runtime(), dev, *sig.inputs[4].constant, nullptr));
    }
    l->has_residual = sig.has_input(5);
    KILN_RETURN_IF_ERROR(runtime().synchronize(nullptr));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

}  // namespace

std::vector<const Tactic*> int8_tactics() {
  static const QConvCudnnCuda cudnn;
  static const QConvDirectCuda direct;
  static const QPoolCuda pool;
  static const QuantizeLinearCuda quantize;
  static const QuantizeChannelsLastCuda quantize_cl;
  static const QMatMulCuda matmul;
  return {&cudnn, &direct, &pool, &quantize, &quantize_cl, &matmul};
}

}  // namespace kiln::backends::cuda
