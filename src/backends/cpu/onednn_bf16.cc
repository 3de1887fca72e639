// BF16 tactics from oneDNN's AVX-512 BF16 kernels (vdpbf16ps: two bf16 products per fp32 lane and
// instruction, twice FP32's FMA rate), for the layers where kiln's time goes: convolutions on
// channel-blocked activations (kiln.BlockedConv: direct, 1x1, depthwise, grouped by whole blocks)
// and matrix products with constant weights (MatMul / Gemm / kiln.FusedMatMul / kiln.FusedGemm: the
// transformer projections and FFN).
//
//   conv2d_onednn_nchwc_bf16   kiln.BlockedConv
//   matmul_onednn_bf16_packed  a 2-D constant B (weights)
//
// The graph's tensors stay float32 between layers: each layer converts its activation input to bf16
// (oneDNN's reorder, parallel, into the layer's workspace), its weights are converted and packed
// once at prepare, and it accumulates and writes float32 with the epilogue (bias, residual,
// activation) fused as post-ops on the float32 result. So a BF16 layer's only extra memory pass is its
// input's conversion, fused into no neighbour; rounding happens once per operand, to bf16's 8
// significant bits (relative error <= 2^-8, round to nearest even), and the sums are float32.
// Depthwise convs over channel counts that are not whole blocks of 16, and grouped ones on a plain X,
// are declined: oneDNN 2.6 has only its reference BF16 kernel for them (FP32 keeps those layers).
//
// oneDNN 2.6's fpmath_mode::bf16 on f32 primitives was checked first: on this AMD Zen 4 it keeps the
// f32 kernels (brg:avx512_core, weights f32), so these tactics give oneDNN bf16 memory instead.
// They need AVX-512 BF16 (TacticInfo): oneDNN would emulate bf16 without it, slower than FP32; and a
// primitive for which oneDNN finds only its reference implementation is declined at prepare.
#if defined(KILN_HAVE_ONEDNN)
#include <cstring>

#include "backends/cpu/kiln_tactics.h"
#include "backends/cpu/onednn_common.h"
#include "backends/cpu/onednn_geometry.h"
#include "backends/cpu/onednn_tactics.h"
#include "core/parallel.h"

namespace kiln::backends::cpu::onednn {
namespace {

TacticInfo bf16_info() {
  return {DeviceKind::kCPU, kIsaAvx512Bf16, DataType::kBFloat16, {DataType::kFloat32}, {DataType::kFloat32}};
}

// The activation's conversion: float32 X (as given) -> bf16 in the primitive's layout.
struct ToBf16 {
  memory::desc from, to;
  dnnl::reorder prim;
  void make(const memory::desc& f32_md, const memory::desc& bf16_md) {
    from = f32_md, to = bf16_md;
    prim = dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), from, cpu_engine(), to));
  }
  size_t bytes() const { return to.get_size(); }
  void run(const void* x, void* out) const {
    auto& eng = cpu_engine();
    memory a(from, eng, const_cast<void*>(x)), b(to, eng, out);
    prim.execute(thread_stream(), {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}});
  }
};

// ---- kiln.BlockedConv ----

class PreparedBlockedConvBf16 : public PreparedLayer {
 public:
  std::string name;
  int64_t block = 0;
  Dims out_dims;
  bool has_bias = false, has_residual = false, residual_by_sum = false;
  memory::desc dst_md, scratch_md;
  size_t dst_bytes = 0;
  ToBf16 src;
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  memory weights, bias;

  std::vector<Dims> output_shapes() const override { return {out_dims}; }
  size_t workspace_bytes(int) const override {
    return workspace_piece(src.bytes()) + workspace_piece(scratch_md.get_size());
  }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return guarded(name, [&]() -> Status {
      auto& eng = cpu_engine();
      WorkspaceSlicer ws(ctx);
      void* x16 = ws.take(src.bytes());
      void* scratch = ws.take(scratch_md.get_size());
      src.run(in[0]->raw(), x16);
      void* dst = out[0]->raw();
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src.to, eng, x16)},
                                           {DNNL_ARG_WEIGHTS, weights},
                                           {DNNL_ARG_DST, memory(dst_md, eng, dst)}};
      if (has_bias) args.emplace(DNNL_ARG_BIAS, bias);
      if (has_residual) {
        void* r = const_cast<void*>(in[3]->raw());
        if (residual_by_sum) {
          auto* d = static_cast<uint8_t*>(dst);
          const auto* from = static_cast<const uint8_t*>(r);
          parallel_for(static_cast<int64_t>(dst_bytes), 1 << 16,
                       [&](int64_t b, int64_t e) { std::memcpy(d + b, from + b, static_cast<size_t>(e - b)); });
        } else {
          args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, memory(dst_md, eng, r));
        }
      }
      execute(prim, scratch_md, scratch, std::move(args));
      return Status::Ok();
    });
  }
};

class OnednnBlockedConvBf16 : public Tactic {
 public:
  TacticInfo info() const override { return bf16_info(); }
  std::string name() const override { return "conv2d_onednn_nchwc_bf16"; }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "BlockedConv"}}; }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.domain() != "kiln" || sig.op() != "BlockedConv") return "not a kiln.BlockedConv";
    if (auto e = check_bf16_compute(sig, DataType::kFloat32); !e.empty()) return e;
    const int64_t b = sig.node->attr_int("block", 0);
    if (b != 16) return "block " + std::to_string(b) + " (the BF16 kernels take nChw16c)";
    if (!sig.has_input(1) || !sig.inputs[1].constant || sig.inputs[1].shape.size() != 4)
      return "W is not a 4-D constant";
    const Dims& w = sig.inputs[1].shape;
    if (sig.has_input(2) && (!sig.inputs[2].constant || sig.inputs[2].constant->numel() != w[0]))
      return "B is not a constant of M elements";
    if (!activation_supported(*sig.node)) return "activation has no oneDNN eltwise";
    const int64_t group = sig.node->attr_int("group", 1), c = w[1] * group;
    if (!(group == 1 || (group == c && group == w[0]) || ((c / group) % b == 0 && (w[0] / group) % b == 0)))
      return "grouped conv whose groups are not whole blocks of " + std::to_string(b) + " channels";
    // Measured (bf16_tactic_test): oneDNN 2.6 has only its reference BF16 depthwise kernel for a channel
    // count that is not a multiple of 16, and for a plain NCHW X of a depthwise conv.
    if (group > 1 && group == c && c % 16 != 0)
      return "depthwise over " + std::to_string(c) + " channels, not a multiple of 16 (oneDNN has no BF16 kernel)";
    Dims x;
    if (auto e = conv_plain_x(sig, c, &x); !e.empty()) return e;
    if (group > 1 && sig.inputs[0].shape.size() == 4) return "depthwise or grouped with a plain NCHW X";
    if (sig.has_input(3) && (sig.inputs[3].shape.size() != 5 || sig.inputs[3].shape[4] != b))
      return "the residual is not blocked";
    if (sig.inputs[0].known()) {
      ConvGeometry g;
      if (auto e = resolve_conv(*sig.node, x, w, g); !e.empty()) return e;
      if (sig.has_input(3) && sig.inputs[3].known() &&
          sig.inputs[3].shape != Dims{g.n, channel_blocks(g.m, b), g.oh, g.ow, b})
        return "the residual is not the output's blocked shape";
    }
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedBlockedConvBf16>();
    p->name = name();
    p->block = sig.node->attr_int("block", 0);
    const Dims& wdims = sig.inputs[1].shape;
    Dims x;
    conv_plain_x(sig, wdims[1] * sig.node->attr_int("group", 1), &x);
    ConvGeometry g;
    resolve_conv(*sig.node, x, wdims, g);
    p->has_bias = sig.has_input(2);
    p->has_residual = sig.has_input(3);
    p->out_dims = {g.n, channel_blocks(g.m, p->block), g.oh, g.ow, p->block};
    const bool plain_src = sig.inputs[0].shape.size() == 4;
    Status st = guarded(name(), [&]() -> Status {
      auto& eng = cpu_engine();
      const memory::desc x_md({g.n, g.c, g.h, g.w}, dt::f32, plain_src ? tag::nchw : tag::nChw16c);
      p->dst_md = memory::desc({g.n, g.m, g.oh, g.ow}, dt::f32, tag::nChw16c);
      const ConvDescs cd(g);
      // bf16 source and weights in the layouts oneDNN's kernel wants; the bias and the output f32.
      const memory::desc src_any(x_md.dims(), dt::bf16, tag::any);
      const memory::desc w_any(cd.user_w.dims(), dt::bf16, tag::any);
      auto make_pd = [&](bool by_sum) {
        const auto prop = dnnl::prop_kind::forward_inference;
        const auto alg = dnnl::algorithm::convolution_direct;
        auto d = p->has_bias ? dnnl::convolution_forward::desc(prop, alg, src_any, w_any, cd.bias, p->dst_md,
                                                               cd.strides, cd.dil, cd.pl, cd.pr)
                             : dnnl::convolution_forward::desc(prop, alg, src_any, w_any, p->dst_md, cd.strides, cd.dil,
                                                               cd.pl, cd.pr);
        dnnl::post_ops po;
        if (p->has_residual && by_sum) po.append_sum(1.f);
        if (p->has_residual && !by_sum) po.append_binary(dnnl::algorithm::binary_add, p->dst_md);
        append_activation(*sig.node, po);
        dnnl::primitive_attr attr;
        attr.set_post_ops(po);
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        return dnnl::convolution_forward::primitive_desc(d, attr, eng);
      };
      try {
        p->pd = make_pd(false);
        if (p->has_residual && std::string(p->pd.impl_info_str()).rfind("ref", 0) == 0)
          throw dnnl::error(dnnl_unimplemented, "ref");
      } catch (const dnnl::error&) {
        if (!p->has_residual) throw;
        p->residual_by_sum = true;
        p->pd = make_pd(true);
      }
      KILN_RETURN_IF_ERROR(check_not_reference(name(), p->pd.impl_info_str()));
      p->prim = dnnl::convolution_forward(p->pd);
      p->scratch_md = p->pd.scratchpad_desc();
      p->dst_bytes = p->dst_md.get_size();
      p->src.make(x_md, p->pd.src_desc());
      cd.load_constants(sig, p->pd, p->has_bias, &p->weights, &p->bias);
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

// ---- MatMul / Gemm with constant 2-D weights ----

class PreparedMatmulBf16 : public PreparedLayer {
 public:
  std::string name;
  Dims out_shape;
  memory::desc dst_md, scratch_md;
  ToBf16 src;
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  memory weights, bias;
  bool has_bias = false, has_residual = false;
  std::vector<float> prefill;  // beta * C broadcast to the output (Gemm's C that is not per-column)

  std::vector<Dims> output_shapes() const override { return {out_shape}; }
  size_t workspace_bytes(int) const override {
    return workspace_piece(src.bytes()) + workspace_piece(scratch_md.get_size());
  }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return guarded(name, [&]() -> Status {
      auto& eng = cpu_engine();
      float* dst = out[0]->data<float>();
      size_t n = static_cast<size_t>(out[0]->numel());
      fill_accumulator(dst, n, prefill, has_residual ? in[3]->data<float>() : nullptr);
      WorkspaceSlicer ws(ctx);
      void* a16 = ws.take(src.bytes());
      void* scratch = ws.take(scratch_md.get_size());
      src.run(in[0]->raw(), a16);
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src.to, eng, a16)},
                                           {DNNL_ARG_WEIGHTS, weights},
                                           {DNNL_ARG_DST, memory(dst_md, eng, dst)}};
      if (has_bias) args.emplace(DNNL_ARG_BIAS, bias);
      execute(prim, scratch_md, scratch, std::move(args));
      return Status::Ok();
    });
  }
};

class OnednnMatmulBf16 : public Tactic {
 public:
  TacticInfo info() const override { return bf16_info(); }
  std::string name() const override { return "matmul_onednn_bf16_packed"; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "MatMul"}, {"", "Gemm"}, {"kiln", "FusedMatMul"}, {"kiln", "FusedGemm"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = check_bf16_matmul(sig, DataType::kFloat32); !e.empty()) return e;
    return gemm_bias_unsupported(sig);
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedMatmulBf16>();
    p->name = name();
    auto geo = gemm_geometry(sig, name());
    if (!geo.ok()) return geo.status();
    const GemmGeometry& g = geo.value();
    const int64_t m = g.m, n = g.n, k = g.k;
    p->out_shape = g.out_shape;
    p->has_residual = sig.has_input(3);
    Status st = guarded(name(), [&]() -> Status {
      auto& eng = cpu_engine();
      std::vector<float> bias_values;
      if (sig.has_input(2))
        KILN_RETURN_IF_ERROR(matmul_bias(*sig.inputs[2].constant, g.gemm, g.beta, m, n, &bias_values, &p->prefill));
      const memory::desc a_md({m, k}, dt::f32, g.trans_a ? tag::ba : tag::ab);
      const memory::desc a16_md({m, k}, dt::bf16, tag::ab);
      const memory::desc w_user({k, n}, dt::f32, g.trans_b ? tag::ba : tag::ab);
      p->dst_md = memory::desc({m, n}, dt::f32, tag::ab);
      memory::desc bias_md;
      if (!bias_values.empty()) {
        bias_md = memory::desc({1, n}, dt::f32, tag::ab);
        p->has_bias = true;
      }
      dnnl::post_ops po;
      if (p->has_residual || !p->prefill.empty()) po.append_sum(1.f);
      append_activation(*sig.node, po);
      dnnl::primitive_attr attr;
      attr.set_post_ops(po);
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      const memory::desc w_any({k, n}, dt::bf16, tag::any);
      auto d = p->has_bias ? dnnl::matmul::desc(a16_md, w_any, bias_md, p->dst_md)
                           : dnnl::matmul::desc(a16_md, w_any, p->dst_md);
      p->pd = dnnl::matmul::primitive_desc(d, attr, eng);
      KILN_RETURN_IF_ERROR(check_not_reference(name(), p->pd.impl_info_str()));
      p->prim = dnnl::matmul(p->pd);
      p->scratch_md = p->pd.scratchpad_desc();
      p->src.make(a_md, a16_md);
      const Tensor& w = *sig.inputs[1].constant;
      std::vector<float> scaled;
      const void* wsrc = w.raw();
      if (g.alpha != 1.f) {  // alpha folded into the weights before their rounding to bf16
        scaled.assign(w.data<float>(), w.data<float>() + w.numel());
        for (float& v : scaled) v *= g.alpha;
        wsrc = scaled.data();
      }
      p->weights = memory(p->pd.weights_desc(), eng);
      reorder_into(w_user, wsrc, p->pd.weights_desc(), p->weights.get_data_handle());
      if (p->has_bias) {
        p->bias = memory(bias_md, eng);
        std::memcpy(p->bias.get_data_handle(), bias_values.data(), bias_values.size() * 4);
      }
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

}  // namespace

const Tactic* conv2d_onednn_nchwc_bf16() {
  static const OnednnBlockedConvBf16 t;
  return &t;
}
const Tactic* matmul_onednn_bf16_packed() {
  static const OnednnMatmulBf16 t;
  return &t;
}

}  // namespace kiln::backends::cpu::onednn
#endif  // KILN_HAVE_ONEDNN
