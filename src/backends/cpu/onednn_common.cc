#if defined(KILN_HAVE_ONEDNN)
#include "backends/cpu/onednn_common.h"

#include "backends/cpu/kiln_tactics.h"

#include <cfloat>
#include <cstring>
#include <memory>

namespace kiln::backends::cpu::onednn {

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream s(cpu_engine());
  return s;
}

dnnl::memory::dims to_dnnl(const Dims& d) { return dnnl::memory::dims(d.begin(), d.end()); }

std::string check_f32(const LayerSignature& sig) { return float32_cpu_layer(sig); }

std::string conv_plain_x(const LayerSignature& sig, int64_t c, Dims* x) {
  if (!sig.has_input(0)) return "no X";
  const Dims& s = sig.inputs[0].shape;
  const int64_t b = sig.node->attr_int("block", 0);
  if (s.size() == 4) {
    *x = s;
    return "";
  }
  if (s.size() != 5 || s[4] != b || (s[1] >= 0 && s[1] != channel_blocks(c, b)))
    return "X is neither plain 4-D nor " + std::to_string(c) + " channels blocked by " + std::to_string(b);
  *x = {s[0], c, s[2], s[3]};
  return "";
}

namespace {
// activation name -> (algorithm, alpha, beta); false when unknown.
bool activation_alg(const ir::Node& n, dnnl::algorithm& alg, float& alpha, float& beta) {
  using A = dnnl::algorithm;
  std::string act = n.attr_string("activation", "");
  alpha = 0.f, beta = 0.f;
  if (act == "Relu") return alg = A::eltwise_relu, true;
  if (act == "LeakyRelu") return alg = A::eltwise_relu, alpha = n.attr_float("activation_alpha", 0.01f), true;
  if (act == "Sigmoid") return alg = A::eltwise_logistic, true;
  if (act == "Tanh") return alg = A::eltwise_tanh, true;
  if (act == "HardSwish") return alg = A::eltwise_hardswish, true;
  if (act == "SiLU") return alg = A::eltwise_swish, alpha = 1.f, true;
  if (act == "Gelu") {
    std::string approx = n.attr_string("activation_approximate", "none");
    if (approx == "none") return alg = A::eltwise_gelu_erf, true;
    if (approx == "tanh") return alg = A::eltwise_gelu_tanh, true;
    return false;
  }
  if (act == "Clip") {
    alpha = n.attr("activation_min") ? n.attr_float("activation_min", 0) : -FLT_MAX;
    beta = n.attr("activation_max") ? n.attr_float("activation_max", 0) : FLT_MAX;
    // ONNX Clip with min > max gives max everywhere; keep that case on the reference kernel.
    return alpha <= beta && (alg = A::eltwise_clip_v2, true);
  }
  return false;
}
}  // namespace

bool activation_supported(const ir::Node& n) {
  const std::string act = n.attr_string("activation", "");
  if (act.empty() || act == "HardSigmoid") return true;  // two post-ops, see append_activation
  dnnl::algorithm alg;
  float a, b;
  return activation_alg(n, alg, a, b);
}

bool append_activation(const ir::Node& n, dnnl::post_ops& po) {
  const std::string act = n.attr_string("activation", "");
  if (act.empty()) return true;
  if (act == "HardSigmoid") {  // oneDNN 2.6 has no hardsigmoid: clip(alpha x + beta, 0, 1)
    po.append_eltwise(1.f, dnnl::algorithm::eltwise_linear, n.attr_float("activation_alpha", 0.2f),
                      n.attr_float("activation_beta", 0.5f));
    po.append_eltwise(1.f, dnnl::algorithm::eltwise_clip_v2, 0.f, 1.f);
    return true;
  }
  dnnl::algorithm alg;
  float a, b;
  if (!activation_alg(n, alg, a, b)) return false;
  po.append_eltwise(1.f, alg, a, b);
  return true;
}

void execute(const dnnl::primitive& p, const dnnl::memory::desc& scratchpad_md, void* scratchpad,
             std::unordered_map<int, dnnl::memory> args) {
  if (scratchpad_md.get_size())
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(scratchpad_md, cpu_engine(), scratchpad));
  p.execute(thread_stream(), args);
  thread_stream().wait();
}

void reorder_into(const dnnl::memory::desc& src_md, const void* src, const dnnl::memory::desc& dst_md, void* dst) {
  if (src_md == dst_md) {
    std::memcpy(dst, src, src_md.get_size());
    return;
  }
  dnnl::memory s(src_md, cpu_engine(), const_cast<void*>(src));
  dnnl::memory d(dst_md, cpu_engine(), dst);
  dnnl::reorder(s, d).execute(thread_stream(), s, d);
  thread_stream().wait();
}

std::string check_bf16_compute(const LayerSignature& sig, DataType inputs) {
  if (sig.device.kind != DeviceKind::kCPU) return "not a CPU layer";
  if (sig.compute != DataType::kBFloat16)
    return std::string("computes in ") + dtype_name(sig.compute) + ", not bfloat16";
  for (size_t i = 0; i < sig.inputs.size(); ++i)
    if (sig.inputs[i].present && sig.inputs[i].dtype != inputs)
      return "input #" + std::to_string(i) + " is " + std::string(dtype_name(sig.inputs[i].dtype)) + ", not " +
             dtype_name(inputs);
  return "";
}

Status execute_src_dst(const std::string& tactic, const RunContext& ctx, const dnnl::primitive& p,
                       const memory::desc& scratchpad_md, const memory::desc& src_md, const void* src,
                       const memory::desc& dst_md, void* dst) {
  return guarded(tactic, [&]() -> Status {
    auto& eng = cpu_engine();
    WorkspaceSlicer ws(ctx);
    void* scratch = ws.take(scratchpad_md.get_size());
    execute(p, scratchpad_md, scratch,
            {{DNNL_ARG_SRC, memory(src_md, eng, const_cast<void*>(src))}, {DNNL_ARG_DST, memory(dst_md, eng, dst)}});
    return Status::Ok();
  });
}

bool is_matmul_op(const LayerSignature& s) {
  if (s.domain().empty()) return s.op() == "MatMul" || s.op() == "Gemm";
  return s.domain() == "kiln" && (s.op() == "FusedMatMul" || s.op() == "FusedGemm");
}

std::string check_bf16_matmul(const LayerSignature& sig, DataType inputs) {
  if (!is_matmul_op(sig)) return "not a MatMul/Gemm";
  if (auto e = check_bf16_compute(sig, inputs); !e.empty()) return e;
  if (!sig.has_input(0) || !sig.has_input(1)) return "missing A or B";
  if (sig.domain() == "kiln" && !activation_supported(*sig.node)) return "activation has no oneDNN eltwise";
  if (sig.inputs[0].shape.size() < 2 || sig.inputs[1].shape.size() < 2) return "1-D operands";
  if (!sig.inputs[1].constant || sig.inputs[1].shape.size() != 2) return "B is not a 2-D constant";
  return "";
}

Status check_not_reference(const std::string& tactic, const char* impl) {
  if (std::string(impl).rfind("ref", 0) == 0)
    return Unsupported(tactic, ": oneDNN has only its reference kernel (", impl, ") for these shapes in bf16");
  return Status::Ok();
}

ConvDescs::ConvDescs(const ConvGeometry& g)
    : user_w(g.group == 1 ? memory::desc({g.m, g.c, g.kh, g.kw}, dt::f32, tag::oihw)
                          : memory::desc({g.group, g.m / g.group, g.c / g.group, g.kh, g.kw}, dt::f32, tag::goihw)),
      any_w(user_w.dims(), dt::f32, tag::any),
      bias({g.m}, dt::f32, tag::x),
      strides{g.sh, g.sw},
      dil{g.dh - 1, g.dw - 1},
      pl{g.pt, g.pl},
      pr{g.pb, g.pr} {}

dnnl::convolution_forward::desc ConvDescs::desc(dnnl::algorithm alg, const memory::desc& src, const memory::desc& dst,
                                                bool has_bias) const {
  const auto prop = dnnl::prop_kind::forward_inference;
  return has_bias ? dnnl::convolution_forward::desc(prop, alg, src, any_w, bias, dst, strides, dil, pl, pr)
                  : dnnl::convolution_forward::desc(prop, alg, src, any_w, dst, strides, dil, pl, pr);
}

void ConvDescs::load_constants(const LayerSignature& sig, const dnnl::convolution_forward::primitive_desc& pd,
                               bool has_bias, memory* weights, memory* bias_mem) const {
  auto& eng = cpu_engine();
  *weights = memory(pd.weights_desc(), eng);
  reorder_into(user_w, sig.inputs[1].constant->raw(), pd.weights_desc(), weights->get_data_handle());
  if (has_bias) {
    *bias_mem = memory(bias, eng);
    std::memcpy(bias_mem->get_data_handle(), sig.inputs[2].constant->raw(), bias.get_size());
  }
}

Status matmul_bias(const Tensor& c, bool gemm, float beta, int64_t m, int64_t n, std::vector<float>* bias,
                   std::vector<float>* prefill) {
  const float* cv = c.data<float>();
  const Dims& cs = c.shape();
  if (!gemm) {
    bias->assign(cv, cv + n);
    return Status::Ok();
  }
  if (c.numel() == n && !cs.empty() && cs.back() == n) {
    bias->assign(cv, cv + n);
    for (float& v : *bias) v *= beta;
    return Status::Ok();
  }
  // Unidirectional broadcasting: C's dims are 1 or equal to [m, n]'s.
  const int64_t cr = cs.size() == 2 ? cs[0] : 1, cc = cs.empty() ? 1 : cs.back();
  if ((cr != 1 && cr != m) || (cc != 1 && cc != n)) return Unsupported("C does not broadcast to [M, N]");
  prefill->resize(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) (*prefill)[i * n + j] = beta * cv[(cr == 1 ? 0 : i) * cc + (cc == 1 ? 0 : j)];
  return Status::Ok();
}

void fill_accumulator(float* dst, size_t n, const std::vector<float>& prefill, const float* residual) {
  if (!prefill.empty()) {
    std::memcpy(dst, prefill.data(), n * sizeof(float));
    if (residual)
      for (size_t i = 0; i < n; ++i) dst[i] += residual[i];
  } else if (residual) {
    std::memcpy(dst, residual, n * sizeof(float));
  }
}

}  // namespace kiln::backends::cpu::onednn
#endif  // KILN_HAVE_ONEDNN
