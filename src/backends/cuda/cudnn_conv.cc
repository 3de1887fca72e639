// cuDNN convolution tactics. cuDNN's legacy API takes symmetric pads only: asymmetric ones (SAME_*
// with an even window, explicit pads) pad a copy of X in the workspace and convolve it unpadded.
// The epilogue: float32 layers whose activation is ReLU (or none, with the implicit precomputed GEMM
// algorithm, the one cuDNN fuses an identity with) run cudnnConvolutionBiasActivationForward, bias
// and residual fused; the others run kiln's epilogue kernel after the convolution.
// kiln.NhwcConv (passes/layout_nhwc.cc): the same tactics on channels-last X, residual and Y (cuDNN's
// NHWC tensor descriptors, the filter reordered to KRSC at prepare): cuDNN's tensor-core kernels read
// and write that layout directly, without the NCHW<->NHWC conversions around an NCHW call. Its
// epilogue runs kiln's kernel over [N*H*W, M] (conv_cudnn_nhwc_h<k>); for float16/bfloat16 layers
// whose epilogue is a bias, a residual and ReLU or nothing, conv_cudnn_nhwc_fused_h<k> runs
// cudnnConvolutionBiasActivationForward instead (bias in X's dtype, as cuDNN's half and bfloat16
// configurations take it), the tuner timing both. cuDNN only tells whether it takes a configuration of
// the fused call when it runs it, so prepare runs it once on scratch buffers: a layer cuDNN declines
// fails to prepare (the unfused tactics serve it) instead of failing at run time.
// Float32 computes in plain FMA unless the build allows TF32; float16/bfloat16 data use tensor
// cores with float32 accumulation. Constant weights are converted to X's dtype (and the bias to
// float32) at prepare time and copied to the device.
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>

#include "backends/cuda/cuda_cnn_kernels.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cudnn_tactics.h"
#include "core/shape.h"
#include "ops/common.h"
#include "ops/conv_util.h"
#include "ops/kiln_layout.h"

namespace kiln::backends::cuda {

std::string cudnn_version() {
  size_t v = cudnnGetVersion();  // MAJOR * 10000 + MINOR * 100 + PATCH
  return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

namespace {

Status cudnn_status(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return Status::Ok();
  return Internal("cuDNN: ", what, " failed: ", cudnnGetErrorString(s));
}
#define KILN_CUDNN_RETURN_IF_ERROR(call) KILN_RETURN_IF_ERROR(cudnn_status((call), #call))

// cuDNN handles are not safe to share between threads that set different streams: one per thread
// and device, made on the thread's first use (prepare or its first run) and kept for the process.
Result<cudnnHandle_t> thread_handle() {
  thread_local std::map<int, cudnnHandle_t> handles;
  int dev = 0;
  KILN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  auto it = handles.find(dev);
  if (it != handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  KILN_CUDNN_RETURN_IF_ERROR(cudnnCreate(&h));
  handles[dev] = h;
  return h;
}

bool cnn_dtype(DataType t, CnnDtype* c, cudnnDataType_t* d) {
  switch (t) {
    case DataType::kFloat32: *c = CnnDtype::kFloat32, *d = CUDNN_DATA_FLOAT; return true;
    case DataType::kFloat16: *c = CnnDtype::kFloat16, *d = CUDNN_DATA_HALF; return true;
    case DataType::kBFloat16: *c = CnnDtype::kBFloat16, *d = CUDNN_DATA_BFLOAT16; return true;
    default: return false;
  }
}

bool float_dtype(DataType t) { return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBFloat16; }

// The epilogue of a kiln.FusedConv (none for Conv); false for an activation the kernel lacks.
bool epilogue_of(const ir::Node& n, Epilogue* e) {
  std::string act = n.attr_string("activation", "");
  *e = {};
  if (act.empty()) return true;
  if (act == "Relu")
    e->act = EpilogueAct::kRelu;
  else if (act == "LeakyRelu")
    e->act = EpilogueAct::kLeakyRelu, e->alpha = n.attr_float("activation_alpha", 0.01f);
  else if (act == "Sigmoid")
    e->act = EpilogueAct::kSigmoid;
  else if (act == "Tanh")
    e->act = EpilogueAct::kTanh;
  else if (act == "HardSwish")
    e->act = EpilogueAct::kHardSwish;
  else if (act == "HardSigmoid")
    e->act = EpilogueAct::kHardSigmoid, e->alpha = n.attr_float("activation_alpha", 0.2f),
    e->beta = n.attr_float("activation_beta", 0.5f);
  else if (act == "Clip")
    e->act = EpilogueAct::kClip, e->alpha = n.attr_float("activation_min", -INFINITY),
    e->beta = n.attr_float("activation_max", INFINITY);
  else if (act == "SiLU")
    e->act = EpilogueAct::kSilu;
  else if (act == "Gelu")
    e->act = n.attr_string("activation_approximate", "none") == "tanh" ? EpilogueAct::kGeluTanh : EpilogueAct::kGelu;
  else
    return false;
  return true;
}

std::vector<int> ints(const Dims& d) { return std::vector<int>(d.begin(), d.end()); }

// Algorithms needing more scratch are left out: kiln build's default --workspace (1 GiB), which one of
// them would exceed, failing the build, if it won the timing (FFT algorithms can at large batches).
constexpr size_t kMaxWorkspace = size_t{1} << 30;

class PreparedConv : public PreparedLayer {
 public:
  ~PreparedConv() override {
    if (x_desc) cudnnDestroyTensorDescriptor(x_desc);
    if (y_desc) cudnnDestroyTensorDescriptor(y_desc);
    if (w_desc) cudnnDestroyFilterDescriptor(w_desc);
    if (conv_desc) cudnnDestroyConvolutionDescriptor(conv_desc);
    if (bias_desc) cudnnDestroyTensorDescriptor(bias_desc);
    if (act_desc) cudnnDestroyActivationDescriptor(act_desc);
  }
  Dims out_shape;
  DataType dtype = DataType::kFloat32;
  CnnDtype cnn = CnnDtype::kFloat32;
  cudnnTensorDescriptor_t x_desc = nullptr, y_desc = nullptr;
  cudnnFilterDescriptor_t w_desc = nullptr;
  cudnnConvolutionDescriptor_t conv_desc = nullptr;
  // cudnnConvolutionBiasActivationForward: bias [1, M, 1...] (zeros when the layer has none), ReLU or
  // identity, the residual as z.
  bool fused = false;
  cudnnTensorDescriptor_t bias_desc = nullptr;
  cudnnActivationDescriptor_t act_desc = nullptr;
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  size_t cudnn_ws = 0;
  // Asymmetric pads: X is copied into a zeroed padded buffer of pad_bytes first.
  bool explicit_pad = false;
  size_t pad_bytes = 0;
  StridedCopy pad_copy;
  bool has_bias = false, has_residual = false;
  Epilogue epilogue;
  int64_t batch = 0, channels = 0, inner = 0;
  Tensor weight, bias;     // on the device; bias float32
  DeviceConstants consts;  // a non-constant W

  std::vector<Dims> output_shapes() const override { return {out_shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  size_t workspace_bytes(int) const override { return workspace_piece(cudnn_ws) + workspace_piece(pad_bytes); }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    cudaStream_t s = stream_of(ctx);
    WorkspaceSlicer ws(ctx);
    void* conv_ws = ws.take(cudnn_ws);
    const void* x = in[0]->raw();
    if (explicit_pad) {
      void* padded = ws.take(pad_bytes);
      KILN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(padded, 0, pad_bytes, s));
      KILN_CUDA_RETURN_IF_ERROR(launch_strided_copy(x, padded, static_cast<int64_t>(dtype_size(dtype)), pad_copy, s));
      x = padded;
    }
    KILN_ASSIGN_OR_RETURN(cudnnHandle_t h, thread_handle());
    KILN_CUDNN_RETURN_IF_ERROR(cudnnSetStream(h, s));
    const void* w = weight.defined() ? weight.raw() : consts.data(1, in);
    const float one = 1.f, zero = 0.f;
    if (fused) {
      // Without a residual z is y itself, scaled by 0 (cuDNN allows z to alias y).
      const void* z = has_residual ? in[3]->raw() : out[0]->raw();
      KILN_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBiasActivationForward(
          h, &one, x_desc, x, w_desc, w, conv_desc, algo, conv_ws, cudnn_ws, has_residual ? &one : &zero, y_desc, z,
          bias_desc, bias.raw(), act_desc, y_desc, out[0]->raw()));
      return Status::Ok();
    }
    KILN_CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(h, &one, x_desc, x, w_desc, w, conv_desc, algo, conv_ws,
                                                       cudnn_ws, &zero, y_desc, out[0]->raw()));
    if (has_bias || has_residual || epilogue.act != EpilogueAct::kNone) {
      const float* b = has_bias ? bias.data<float>() : nullptr;
      const void* r = has_residual ? in[3]->raw() : nullptr;
      KILN_CUDA_RETURN_IF_ERROR(launch_conv_epilogue(out[0]->raw(), cnn, b, r, batch, channels, inner, epilogue, s));
    }
    return Status::Ok();
  }
};

class CudnnConv : public Tactic {
 public:
  CudnnConv(int rank, bool nhwc, bool fuse = false) : rank_(rank), nhwc_(nhwc), fuse_(fuse) {}
  std::string name() const override {
    return std::string(fuse_   ? "conv_cudnn_nhwc_fused_h"
                       : nhwc_ ? "conv_cudnn_nhwc_h"
                               : "conv_cudnn_h") +
           std::to_string(rank_);
  }
  int revision() const override { return 2; }  // 2: kiln's epilogue kernel in 32-bit indices and 16-byte packs
  // Float data of any of the three dtypes; the precision is checked in why_unsupported (float32
  // accumulation serves a float32, float16 or bfloat16 layer).
  TacticInfo info() const override {
    return {DeviceKind::kCUDA,
            kIsaPortable,
            DataType::kUndefined,
            {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16},
            {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16},
            /*any_float_compute=*/true};
  }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    if (nhwc_) return {{"kiln", "NhwcConv"}};
    return {{"", "Conv"}, {"kiln", "FusedConv"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (!sig.has_input(0) || !sig.has_input(1)) return "no X or W";
    const DataType xt = sig.inputs[0].dtype;
    if (!float_dtype(xt)) return std::string("X is ") + dtype_name(xt);
    if (!float_dtype(sig.compute)) return std::string("computes in ") + dtype_name(sig.compute);
    if (xt == DataType::kFloat32 && sig.compute != DataType::kFloat32)
      return "float32 data computed in " + std::string(dtype_name(sig.compute));
    if (!sig.outputs.empty() && sig.outputs[0].dtype != DataType::kUndefined && sig.outputs[0].dtype != xt)
      return "Y's dtype differs from X's";
    const TensorSig& w = sig.inputs[1];
    if (!float_dtype(w.dtype) || (!w.constant && w.dtype != xt)) return "W is neither X's dtype nor a float constant";
    if (sig.has_input(2) && (!sig.inputs[2].constant || !float_dtype(sig.inputs[2].dtype)))
      return "B is not a float constant";
    if (sig.has_input(3) && sig.inputs[3].dtype != xt) return "the residual's dtype differs from X's";
    const size_t rank = sig.inputs[0].shape.size();
    if (rank < 3 || rank > 5) return "not 1 to 3 spatial dims";
    if (w.shape.size() != rank || !w.known()) return "W's shape is not known or not X's rank";
    if (nhwc_ && (rank != 4 || !w.constant)) return "channels-last takes a 2-D conv with a constant W";
    Epilogue e;
    if (!epilogue_of(*sig.node, &e)) return "activation " + sig.node->attr_string("activation", "") + " has no kernel";
    if (fuse_) {
      if (xt == DataType::kFloat32) return "float32 data (the fused NHWC call is for float16/bfloat16)";
      if (e.act != EpilogueAct::kNone && e.act != EpilogueAct::kRelu)
        return "activation " + sig.node->attr_string("activation", "") + " is not ReLU (cuDNN fuses ReLU or none)";
      if (e.act == EpilogueAct::kNone && !sig.has_input(2) && !(sig.node->inputs.size() > 3 && sig.has_input(3)))
        return "nothing to fuse (no bias, residual or activation)";
    }
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    const ir::Node& node = *sig.node;
    const Dims& xg = sig.inputs[0].shape;  // as given: NHWC for NhwcConv
    const Dims& wd = sig.inputs[1].shape;
    if (nhwc_ && xg.size() != 4) return Unsupported("channels-last X ", dims_str(xg), " is not 4-D");
    const Dims x = nhwc_ ? Dims{xg[0], xg[3], xg[1], xg[2]} : xg;  // NCHW geometry
    KILN_ASSIGN_OR_RETURN(ops::WindowGeometry g, ops::resolve_window(node, x, &wd));
    const int64_t group = node.attr_int("group", 1);
    if (group <= 0 || x[1] != wd[1] * group || wd[0] % group != 0)
      return InvalidArgument(node.where(), ": X ", dims_str(x), " and W ", dims_str(wd), " do not fit group ", group);
    auto l = std::make_unique<PreparedConv>();
    l->dtype = sig.inputs[0].dtype;
    cudnnDataType_t data_type;
    cnn_dtype(l->dtype, &l->cnn, &data_type);
    l->out_shape = {x[0], wd[0]};
    for (int64_t o : g.out) l->out_shape.push_back(o);
    l->batch = x[0], l->channels = wd[0], l->inner = dims_numel(g.out);
    if (nhwc_) {
      l->out_shape = {x[0], g.out[0], g.out[1], wd[0]};
      l->batch = x[0] * dims_numel(g.out), l->inner = 1;  // the epilogue over [N*H*W, M]
    }
    epilogue_of(node, &l->epilogue);
    l->has_bias = sig.has_input(2);
    l->has_residual = node.inputs.size() > 3 && sig.has_input(3);
    if (l->has_residual && sig.inputs[3].shape != l->out_shape)
      return Unsupported("the residual ", dims_str(sig.inputs[3].shape), " is not Y's shape ", dims_str(l->out_shape));
    if (dims_numel(l->out_shape) == 0 || dims_numel(x) == 0) return Unsupported("empty tensors");

    // cuDNN's geometry: at least 2 spatial dims (a 1-D conv gets a leading unit dim), symmetric pads.
    Dims in_sp(x.begin() + 2, x.end()), k_sp(wd.begin() + 2, wd.end());
    Dims pads = g.pad_begin, strides = g.strides, dil = g.dilations;
    for (size_t d = 0; d < g.rank(); ++d) l->explicit_pad |= g.pad_begin[d] != g.pad_end[d];
    if (l->explicit_pad) {
      Dims padded = in_sp;
      for (size_t d = 0; d < g.rank(); ++d) padded[d] += g.pad_begin[d] + g.pad_end[d], pads[d] = 0;
      Dims full = {x[0], x[1]};
      full.insert(full.end(), padded.begin(), padded.end());
      // The copy in the stored layout (channels-last: spatial dim d is stored dim d + 1).
      const Dims stored_full = nhwc_ ? Dims{full[0], full[2], full[3], full[1]} : full;
      Dims src = ops::strides_of(xg), dst = ops::strides_of(stored_full);
      StridedCopy& c = l->pad_copy;
      c.rank = static_cast<int>(xg.size());
      for (size_t k = 0; k < xg.size(); ++k) c.dims[k] = xg[k], c.in_strides[k] = src[k], c.out_strides[k] = dst[k];
      for (size_t d = 0; d < g.rank(); ++d) c.out_offset += g.pad_begin[d] * dst[d + (nhwc_ ? 1 : 2)];
      l->pad_bytes = static_cast<size_t>(dims_numel(full)) * dtype_size(l->dtype);
      in_sp = padded;
    }
    if (g.rank() == 1) {
      in_sp.insert(in_sp.begin(), 1), k_sp.insert(k_sp.begin(), 1);
      pads.insert(pads.begin(), 0), strides.insert(strides.begin(), 1), dil.insert(dil.begin(), 1);
    }
    Dims xs = {x[0], x[1]}, ws = {wd[0], wd[1]}, ys = {x[0], wd[0]};
    xs.insert(xs.end(), in_sp.begin(), in_sp.end());
    ws.insert(ws.end(), k_sp.begin(), k_sp.end());
    ys.insert(ys.end(), g.out.begin(), g.out.end());
    if (g.rank() == 1) ys.insert(ys.begin() + 2, 1);
    for (const Dims* d : {&xs, &ws, &ys, &pads, &strides, &dil})
      for (int64_t v : *d)
        if (v > INT32_MAX) return Unsupported("a dim above 2^31 (cuDNN takes int)");
    if (dims_numel(xs) > INT32_MAX || dims_numel(ys) > INT32_MAX)
      return Unsupported("a tensor of 2^31 elements or more");

    const int nd = static_cast<int>(xs.size());
    KILN_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&l->x_desc));
    KILN_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&l->y_desc));
    KILN_CUDNN_RETURN_IF_ERROR(cudnnCreateFilterDescriptor(&l->w_desc));
    KILN_CUDNN_RETURN_IF_ERROR(cudnnCreateConvolutionDescriptor(&l->conv_desc));
    std::vector<int> xi = ints(xs), yi = ints(ys), wi = ints(ws), xst = ints(ops::strides_of(xs)),
                     yst = ints(ops::strides_of(ys));
    if (nhwc_) {
      KILN_CUDNN_RETURN_IF_ERROR(
          cudnnSetTensor4dDescriptor(l->x_desc, CUDNN_TENSOR_NHWC, data_type, xi[0], xi[1], xi[2], xi[3]));
      KILN_CUDNN_RETURN_IF_ERROR(
          cudnnSetTensor4dDescriptor(l->y_desc, CUDNN_TENSOR_NHWC, data_type, yi[0], yi[1], yi[2], yi[3]));
      KILN_CUDNN_RETURN_IF_ERROR(
          cudnnSetFilter4dDescriptor(l->w_desc, data_type, CUDNN_TENSOR_NHWC, wi[0], wi[1], wi[2], wi[3]));
    } else {
      KILN_CUDNN_RETURN_IF_ERROR(cudnnSetTensorNdDescriptor(l->x_desc, data_type, nd, xi.data(), xst.data()));
      KILN_CUDNN_RETURN_IF_ERROR(cudnnSetTensorNdDescriptor(l->y_desc, data_type, nd, yi.data(), yst.data()));
      KILN_CUDNN_RETURN_IF_ERROR(cudnnSetFilterNdDescriptor(l->w_desc, data_type, CUDNN_TENSOR_NCHW, nd, wi.data()));
    }
    std::vector<int> pi = ints(pads), si = ints(strides), di = ints(dil);
    KILN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionNdDescriptor(l->conv_desc, nd - 2, pi.data(), si.data(), di.data(),
                                                               CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    KILN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionGroupCount(l->conv_desc, static_cast<int>(group)));
    const bool strict_fp32 = l->dtype == DataType::kFloat32 && !sig.tf32;
    const cudnnMathType_t math = l->dtype != DataType::kFloat32 ? CUDNN_TENSOR_OP_MATH
                                 : strict_fp32                  ? CUDNN_FMA_MATH
                                                                : CUDNN_DEFAULT_MATH;
    KILN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(l->conv_desc, math));
    std::vector<int> got(static_cast<size_t>(nd));
    KILN_CUDNN_RETURN_IF_ERROR(
        cudnnGetConvolutionNdForwardOutputDim(l->conv_desc, l->x_desc, l->w_desc, nd, got.data()));
    if (got != yi)
      return Internal(node.where(), ": cuDNN's output ", dims_str(Dims(got.begin(), got.end())), " is not kiln's ",
                      dims_str(ys), " (a kiln bug)");

    KILN_ASSIGN_OR_RETURN(cudnnHandle_t h, thread_handle());
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT * 2];
    int returned = 0;
    KILN_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionForwardAlgorithm_v7(
        h, l->x_desc, l->w_desc, l->conv_desc, l->y_desc, CUDNN_CONVOLUTION_FWD_ALGO_COUNT * 2, &returned, perf));
    // The heuristic's ranked algorithms that run here, each once, in the build's math mode.
    std::vector<cudnnConvolutionFwdAlgo_t> algos;
    for (int i = 0; i < returned; ++i) {
      const auto& p = perf[i];
      if (p.status != CUDNN_STATUS_SUCCESS) continue;
      if (strict_fp32 && (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
        continue;
      if (std::find(algos.begin(), algos.end(), p.algo) != algos.end()) continue;
      size_t bytes = 0;
      if (cudnnGetConvolutionForwardWorkspaceSize(h, l->x_desc, l->w_desc, l->conv_desc, l->y_desc, p.algo, &bytes) !=
              CUDNN_STATUS_SUCCESS ||
          bytes > kMaxWorkspace)
        continue;
      algos.push_back(p.algo);
    }
    if (static_cast<int>(algos.size()) <= rank_)
      return Unsupported("cuDNN's heuristic offers ", algos.size(), " algorithm(s) for ", node.where(), ", not rank ",
                         rank_);
    l->algo = algos[static_cast<size_t>(rank_)];
    KILN_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionForwardWorkspaceSize(h, l->x_desc, l->w_desc, l->conv_desc, l->y_desc,
                                                                       l->algo, &l->cudnn_ws));

    const int dev = sig.device.index;
    if (const Tensor* w = sig.inputs[1].constant) {
      Tensor wt = *w;
      if (wt.dtype() != l->dtype) {
        KILN_ASSIGN_OR_RETURN(wt, w->cast(l->dtype));
      }
      if (nhwc_) {
        KILN_ASSIGN_OR_RETURN(wt, ops::nchw_to_nhwc(wt));  // [M, C/g, kH, kW] -> KRSC
      }
      KILN_ASSIGN_OR_RETURN(l->weight, to_device(runtime(), dev, wt, nullptr));
    } else {
      KILN_RETURN_IF_ERROR(l->consts.upload(sig));
    }
    l->fused = !nhwc_ && l->dtype == DataType::kFloat32 &&
               (l->epilogue.act == EpilogueAct::kRelu ||
                (l->epilogue.act == EpilogueAct::kNone && (l->has_bias || l->has_residual) &&
                 l->algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM));
    if (fuse_) {
      // cuDNN fuses an identity activation with the implicit precomputed GEMM algorithm only.
      if (l->epilogue.act == EpilogueAct::kNone && l->algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
        return Unsupported("cuDNN fuses no activation with algorithm ", static_cast<int>(l->algo),
                           " (only with IMPLICIT_PRECOMP_GEMM)");
      l->fused = true;
    }
    if (l->fused) {
      Dims bs(xs.size(), 1);
      bs[1] = wd[0];
      std::vector<int> bi = ints(bs), bst = ints(ops::strides_of(bs));
      KILN_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&l->bias_desc));
      // [1, M, 1, 1]: the same bytes in either layout.
      KILN_CUDNN_RETURN_IF_ERROR(
          cudnnSetTensorNdDescriptor(l->bias_desc, fuse_ ? data_type : CUDNN_DATA_FLOAT, nd, bi.data(), bst.data()));
      KILN_CUDNN_RETURN_IF_ERROR(cudnnCreateActivationDescriptor(&l->act_desc));
      KILN_CUDNN_RETURN_IF_ERROR(cudnnSetActivationDescriptor(
          l->act_desc, l->epilogue.act == EpilogueAct::kRelu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
          CUDNN_PROPAGATE_NAN, 0.0));
    }
    // The bias on the device: float32 (zeros for a fused layer without one), rounded to X's dtype for
    // the fused NHWC call.
    if (l->has_bias || l->fused) {
      Tensor b(DataType::kFloat32, {wd[0]});
      if (l->has_bias) {
        b = *sig.inputs[2].constant;
        if (b.numel() != wd[0]) return InvalidArgument(node.where(), ": B has ", b.numel(), " elements, not ", wd[0]);
        if (b.dtype() != DataType::kFloat32) {
          KILN_ASSIGN_OR_RETURN(b, b.cast(DataType::kFloat32));
        }
      } else {
        for (int64_t k = 0; k < wd[0]; ++k) b.data<float>()[k] = 0.f;
      }
      if (fuse_) {
        KILN_ASSIGN_OR_RETURN(b, b.cast(l->dtype));
      }
      KILN_ASSIGN_OR_RETURN(l->bias, to_device(runtime(), dev, b, nullptr));
    }
    KILN_RETURN_IF_ERROR(runtime().synchronize(nullptr));
    if (fuse_) KILN_RETURN_IF_ERROR(try_fused(*l, h, xs, dev));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }

 private:
  // One fused call on scratch buffers with the layer's descriptors, weights and bias: a status error (a
  // configuration cuDNN's fused call does not take) declines the layer here. X is zeros, so Y must be
  // act(bias), finite. Without a residual run() passes z = Y scaled by 0: Y starts as NaN here, so a
  // kernel that reads z anyway (0 * NaN) shows, and is declined too (Y's old contents would leak).
  static Status try_fused(const PreparedConv& l, cudnnHandle_t h, const Dims& xs, int dev) {
    const DeviceRuntime& rt = runtime();
    KILN_ASSIGN_OR_RETURN(Tensor x, device_tensor(rt, dev, l.dtype, xs));
    KILN_ASSIGN_OR_RETURN(Tensor y, device_tensor(rt, dev, l.dtype, l.out_shape));
    KILN_ASSIGN_OR_RETURN(Tensor z, device_tensor(rt, dev, l.dtype, l.out_shape));
    Tensor ws;
    if (l.cudnn_ws) {
      KILN_ASSIGN_OR_RETURN(ws, device_tensor(rt, dev, DataType::kUInt8, {static_cast<int64_t>(l.cudnn_ws)}));
    }
    KILN_RETURN_IF_ERROR(rt.fill(x.raw(), 0, x.nbytes(), nullptr));
    KILN_RETURN_IF_ERROR(rt.fill(y.raw(), 0xFF, y.nbytes(), nullptr));  // NaN in every float dtype
    KILN_RETURN_IF_ERROR(rt.fill(z.raw(), 0, z.nbytes(), nullptr));
    KILN_CUDNN_RETURN_IF_ERROR(cudnnSetStream(h, nullptr));
    const float one = 1.f, zero = 0.f;
    const cudnnStatus_t st = cudnnConvolutionBiasActivationForward(
        h, &one, l.x_desc, x.raw(), l.w_desc, l.weight.raw(), l.conv_desc, l.algo, ws.defined() ? ws.raw() : nullptr,
        l.cudnn_ws, l.has_residual ? &one : &zero, l.y_desc, l.has_residual ? z.raw() : y.raw(), l.bias_desc,
        l.bias.raw(), l.act_desc, l.y_desc, y.raw());
    KILN_RETURN_IF_ERROR(rt.synchronize(nullptr));
    if (st != CUDNN_STATUS_SUCCESS)
      return Unsupported("cuDNN declines the fused convolution (cudnnConvolutionBiasActivationForward: ",
                         cudnnGetErrorString(st), "); the unfused tactics serve the layer");
    KILN_ASSIGN_OR_RETURN(Tensor host, to_host(rt, y, nullptr));
    // Every element up to 2^20 of them, else evenly spread (a kernel that reads z reads it all).
    const int64_t step = std::max<int64_t>(1, host.numel() >> 20);
    for (int64_t i = 0; i < host.numel(); i += step)
      if (!std::isfinite(host.get_f64(i)))
        return Unsupported(
            "cuDNN declines the fused convolution (element ", i, " of act(bias) is ", host.get_f64(i),
            ": its kernel reads z scaled by 0, or the bias overflows the dtype); the unfused tactics serve the layer");
    return Status::Ok();
  }

  int rank_;
  bool nhwc_;
  bool fuse_;
};

}  // namespace

Result<void*> cudnn_thread_handle() {
  KILN_ASSIGN_OR_RETURN(cudnnHandle_t h, thread_handle());
  return static_cast<void*>(h);
}

std::vector<const Tactic*> cudnn_conv_tactics() {
  static const CudnnConv h0(0, false), h1(1, false), h2(2, false), h3(3, false), h4(4, false), h5(5, false),
      h6(6, false), h7(7, false);
  static const CudnnConv n0(0, true), n1(1, true), n2(2, true), n3(3, true), n4(4, true), n5(5, true), n6(6, true),
      n7(7, true);
  // After the unfused ones: a build that takes the first tactic that prepares keeps kiln's epilogue.
  static const CudnnConv f0(0, true, true), f1(1, true, true), f2(2, true, true), f3(3, true, true);
  return {&h0, &h1, &h2, &h3, &h4, &h5, &h6, &h7, &n0, &n1, &n2, &n3, &n4, &n5, &n6, &n7, &f0, &f1, &f2, &f3};
}

}  // namespace kiln::backends::cuda
