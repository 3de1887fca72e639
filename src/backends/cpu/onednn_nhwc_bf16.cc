// BF16 tactics on channels-last activations stored in bfloat16, for CPUs with AMX (the tile
// multiply units of Intel Xeon since Sapphire Rapids). oneDNN 2.6 runs its AMX kernels (brgconv,
// brgemm: avx512_core_amx) only on channels-last (nhwc) bfloat16 activations; on kiln's
// channel-blocked layout its bf16 convolutions use AVX-512 BF16 (jit:avx512_core_bf16), which on such
// a CPU is slower than FP32 (onednn_bf16.cc's tactics lose the tuner's timing there). So on a target
// with AMX, a bfloat16 build keeps conv/pool activations channels-last (passes/layout_nhwc.cc, as for
// CUDA) and stores them in bfloat16 between layers (engine/storage_dtypes.cc), and these tactics run
// the layers:
//
//   conv2d_onednn_nhwc_bf16   kiln.NhwcConv: X, Residual and Y bf16 [N, H, W, C]; W [M, C/group, kH, kW]
//                             and B bf16 constants (storage_dtypes' converted copies)
//   pool2d_onednn_nhwc_bf16   kiln.NhwcPool: X and Y bf16 [N, H, W, C]
//   conv2d_onednn_nhwc, pool2d_onednn_nhwc: the same in float32 (layers of such a graph that a layer
//                             precision keeps float32)
//   matmul_onednn_bf16_io     MatMul / Gemm / kiln.FusedMatMul / kiln.FusedGemm with A (and the
//                             residual) bf16, B a 2-D bf16 constant, Y bf16: layout_nhwc's 1x1 convs
//                             ([N, H, W, C] x [C, M]) and the classifier
//
// Each accumulates in float32 and rounds its output to bfloat16 once (oneDNN: bias, residual and
// activation applied to the float32 sums first). A primitive for which oneDNN finds only its
// reference implementation is declined at prepare.
#if defined(KILN_HAVE_ONEDNN)
#include <cstring>

#include "backends/cpu/kiln_tactics.h"
#include "backends/cpu/onednn_common.h"
#include "backends/cpu/onednn_geometry.h"
#include "backends/cpu/onednn_tactics.h"
#include "ops/conv_util.h"

namespace kiln::backends::cpu::onednn {
namespace {

TacticInfo nhwc_bf16_info() {
  return {DeviceKind::kCPU, kIsaAmx, DataType::kBFloat16, {DataType::kBFloat16}, {DataType::kBFloat16}};
}
// The conv and pool tactics come in float32 too, for layers of such a graph that a layer precision
// (or a missing bf16 kernel) keeps float32: channels-last, without AMX.
TacticInfo nhwc_info(DataType t) { return t == DataType::kBFloat16 ? nhwc_bf16_info() : TacticInfo::cpu_f32(); }
std::string check_nhwc_dtype(const LayerSignature& sig, DataType t) {
  return t == DataType::kBFloat16 ? check_bf16_compute(sig, t) : check_f32(sig);
}
dt dnnl_dtype(DataType t) { return t == DataType::kBFloat16 ? dt::bf16 : dt::f32; }

// A bfloat16 constant as float32 values (the bias oneDNN adds to the float32 sums).
std::vector<float> float_values(const Tensor& t) {
  Tensor f = t.cast(DataType::kFloat32).value();
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

// ---- kiln.NhwcConv ----

class PreparedNhwcConv : public PreparedLayer {
 public:
  std::string name;
  DataType dtype = DataType::kBFloat16;
  Dims out_dims;  // [N, OH, OW, M]
  bool has_bias = false, has_residual = false, residual_by_sum = false;
  memory::desc src_md, dst_md, scratch_md;
  size_t dst_bytes = 0;
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  memory weights, bias;

  std::vector<Dims> output_shapes() const override { return {out_dims}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  size_t workspace_bytes(int) const override { return workspace_piece(scratch_md.get_size()); }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return guarded(name, [&]() -> Status {
      auto& eng = cpu_engine();
      WorkspaceSlicer ws(ctx);
      void* scratch = ws.take(scratch_md.get_size());
      void* dst = out[0]->raw();
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src_md, eng, const_cast<void*>(in[0]->raw()))},
                                           {DNNL_ARG_WEIGHTS, weights},
                                           {DNNL_ARG_DST, memory(dst_md, eng, dst)}};
      if (has_bias) args.emplace(DNNL_ARG_BIAS, bias);
      if (has_residual) {
        void* r = const_cast<void*>(in[3]->raw());
        if (residual_by_sum)
          std::memcpy(dst, r, dst_bytes);
        else
          args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, memory(dst_md, eng, r));
      }
      execute(prim, scratch_md, scratch, std::move(args));
      return Status::Ok();
    });
  }
};

class OnednnNhwcConv : public Tactic {
 public:
  explicit OnednnNhwcConv(DataType t) : dtype_(t) {}
  TacticInfo info() const override { return nhwc_info(dtype_); }
  std::string name() const override {
    return dtype_ == DataType::kBFloat16 ? "conv2d_onednn_nhwc_bf16" : "conv2d_onednn_nhwc";
  }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "NhwcConv"}}; }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.domain() != "kiln" || sig.op() != "NhwcConv") return "not a kiln.NhwcConv";
    if (auto e = check_nhwc_dtype(sig, dtype_); !e.empty()) return e;
    if (!sig.has_input(0) || sig.inputs[0].shape.size() != 4) return "X is not 4-D channels-last";
    if (!sig.has_input(1) || !sig.inputs[1].constant || sig.inputs[1].shape.size() != 4)
      return "W is not a 4-D constant";
    const Dims& w = sig.inputs[1].shape;
    if (sig.has_input(2) && (!sig.inputs[2].constant || sig.inputs[2].constant->numel() != w[0]))
      return "B is not a constant of M elements";
    if (!activation_supported(*sig.node)) return "activation has no oneDNN eltwise";
    if (sig.inputs[0].known()) {
      ConvGeometry g;
      if (auto e = geometry(sig, &g); !e.empty()) return e;
      if (sig.has_input(3) && sig.inputs[3].known() && sig.inputs[3].shape != Dims{g.n, g.oh, g.ow, g.m})
        return "the residual is not the output's channels-last shape";
    }
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedNhwcConv>();
    p->name = name();
    p->dtype = dtype_;
    const dt t = dnnl_dtype(dtype_);
    ConvGeometry g;
    if (auto e = geometry(sig, &g); !e.empty()) return Unsupported(name(), ": ", e);
    p->has_bias = sig.has_input(2);
    p->has_residual = sig.has_input(3);
    p->out_dims = {g.n, g.oh, g.ow, g.m};
    Status st = guarded(name(), [&]() -> Status {
      auto& eng = cpu_engine();
      p->src_md = memory::desc({g.n, g.c, g.h, g.w}, t, tag::nhwc);
      p->dst_md = memory::desc({g.n, g.m, g.oh, g.ow}, t, tag::nhwc);
      const ConvDescs cd(g);
      const memory::desc w_any(cd.user_w.dims(), t, tag::any);
      auto make_pd = [&](bool by_sum) {
        const auto prop = dnnl::prop_kind::forward_inference;
        const auto alg = dnnl::algorithm::convolution_direct;
        auto d = p->has_bias ? dnnl::convolution_forward::desc(prop, alg, p->src_md, w_any, cd.bias, p->dst_md,
                                                               cd.strides, cd.dil, cd.pl, cd.pr)
                             : dnnl::convolution_forward::desc(prop, alg, p->src_md, w_any, p->dst_md, cd.strides,
                                                               cd.dil, cd.pl, cd.pr);
        dnnl::post_ops po;
        if (p->has_residual && by_sum) po.append_sum(1.f);
        if (p->has_residual && !by_sum) po.append_binary(dnnl::algorithm::binary_add, p->dst_md);
        append_activation(*sig.node, po);
        dnnl::primitive_attr attr;
        attr.set_post_ops(po);
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        return dnnl::convolution_forward::primitive_desc(d, attr, eng);
      };
      // The residual as a binary post-op where oneDNN has a fast kernel for it, else as a sum post-op
      // over the destination (the residual copied there first).
      bool binary_ok = true;
      try {
        p->pd = make_pd(false);
        binary_ok = std::string(p->pd.impl_info_str()).rfind("ref", 0) != 0;
      } catch (const dnnl::error&) {
        binary_ok = false;
      }
      if (!binary_ok) {
        if (!p->has_residual) throw dnnl::error(dnnl_unimplemented, "ref");
        p->residual_by_sum = true;
        p->pd = make_pd(true);
      }
      if (dtype_ == DataType::kBFloat16) KILN_RETURN_IF_ERROR(check_not_reference(name(), p->pd.impl_info_str()));
      p->prim = dnnl::convolution_forward(p->pd);
      p->scratch_md = p->pd.scratchpad_desc();
      p->dst_bytes = p->dst_md.get_size();
      const memory::desc user_w(cd.user_w.dims(), t, g.group == 1 ? tag::oihw : tag::goihw);
      p->weights = memory(p->pd.weights_desc(), eng);
      reorder_into(user_w, sig.inputs[1].constant->raw(), p->pd.weights_desc(), p->weights.get_data_handle());
      if (p->has_bias) {
        const std::vector<float> b = float_values(*sig.inputs[2].constant);
        p->bias = memory(cd.bias, eng);
        std::memcpy(p->bias.get_data_handle(), b.data(), b.size() * sizeof(float));
      }
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  // The conv's geometry over X's NCHW dims.
  static std::string geometry(const LayerSignature& sig, ConvGeometry* g) {
    const Dims& xl = sig.inputs[0].shape;
    const Dims x = {xl[0], xl[3], xl[1], xl[2]};
    const Dims& w = sig.inputs[1].shape;
    const int64_t group = sig.node->attr_int("group", 1);
    if (group <= 0 || x[1] != w[1] * group) return "X's channels are not W's times the groups";
    return resolve_conv(*sig.node, x, w, *g);
  }
  DataType dtype_;
};

// ---- kiln.NhwcPool ----

class PreparedNhwcPool : public PreparedLayer {
 public:
  std::string name;
  DataType dtype = DataType::kBFloat16;
  Dims out_dims;
  memory::desc src_md, dst_md, scratch_md;
  dnnl::pooling_v2_forward prim;

  std::vector<Dims> output_shapes() const override { return {out_dims}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  size_t workspace_bytes(int) const override { return workspace_piece(scratch_md.get_size()); }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return execute_src_dst(name, ctx, prim, scratch_md, src_md, in[0]->raw(), dst_md, out[0]->raw());
  }
};

class OnednnNhwcPool : public Tactic {
 public:
  explicit OnednnNhwcPool(DataType t) : dtype_(t) {}
  TacticInfo info() const override { return nhwc_info(dtype_); }
  std::string name() const override {
    return dtype_ == DataType::kBFloat16 ? "pool2d_onednn_nhwc_bf16" : "pool2d_onednn_nhwc";
  }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "NhwcPool"}}; }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.domain() != "kiln" || sig.op() != "NhwcPool") return "not a kiln.NhwcPool";
    if (auto e = check_nhwc_dtype(sig, dtype_); !e.empty()) return e;
    if (!sig.has_input(0) || sig.inputs[0].shape.size() != 4) return "X is not 4-D channels-last";
    if (sig.inputs[0].known()) {
      PoolGeometry g;
      if (auto e = geometry(sig, &g); !e.empty()) return e;
      if (!g.rescale.empty()) return "an average counting padding past the declared one (ceil_mode)";
    }
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedNhwcPool>();
    p->name = name();
    p->dtype = dtype_;
    const dt t = dnnl_dtype(dtype_);
    PoolGeometry g;
    if (auto e = geometry(sig, &g); !e.empty()) return Unsupported(name(), ": ", e);
    p->out_dims = {g.n, g.w.out[0], g.w.out[1], g.c};
    Status st = guarded(name(), [&]() -> Status {
      using A = dnnl::algorithm;
      A alg = g.max ? A::pooling_max : g.include_pad ? A::pooling_avg_include_padding : A::pooling_avg_exclude_padding;
      memory::dims dil;
      for (int64_t d : g.w.dilations) dil.push_back(d - 1);  // oneDNN's: 0 = dense
      p->src_md = memory::desc({g.n, g.c, g.w.in[0], g.w.in[1]}, t, tag::nhwc);
      p->dst_md = memory::desc({g.n, g.c, g.w.out[0], g.w.out[1]}, t, tag::nhwc);
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, p->src_md, p->dst_md,
                                       to_dnnl(g.w.strides), to_dnnl(g.w.kernel), dil, to_dnnl(g.w.pad_l),
                                       to_dnnl(g.w.pad_r));
      dnnl::pooling_v2_forward::primitive_desc pd(d, attr, cpu_engine());
      if (dtype_ == DataType::kBFloat16) KILN_RETURN_IF_ERROR(check_not_reference(name(), pd.impl_info_str()));
      p->prim = dnnl::pooling_v2_forward(pd);
      p->scratch_md = pd.scratchpad_desc();
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  static std::string geometry(const LayerSignature& sig, PoolGeometry* g) {
    const Dims& xl = sig.inputs[0].shape;
    const std::string op = sig.node->attr_string("pool", "");
    const int opset = static_cast<int>(sig.node->attr_int("pool_opset", 12));
    if (sig.node->outputs.size() > 1 && !sig.node->outputs[1].empty()) return "MaxPool's Indices output";
    return resolve_pool(*sig.node, op, opset, {xl[0], xl[3], xl[1], xl[2]}, *g);
  }
  DataType dtype_;
};

// ---- MatMul / Gemm: bf16 A, a 2-D bf16 constant B, bf16 Y ----

class PreparedMatmulBf16Io : public PreparedLayer {
 public:
  std::string name;
  Dims out_shape;
  memory::desc a_md, dst_md, scratch_md;
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  memory weights, bias;
  bool has_bias = false, has_residual = false;

  std::vector<Dims> output_shapes() const override { return {out_shape}; }
  std::vector<DataType> output_dtypes() const override { return {DataType::kBFloat16}; }
  size_t workspace_bytes(int) const override { return workspace_piece(scratch_md.get_size()); }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return guarded(name, [&]() -> Status {
      auto& eng = cpu_engine();
      WorkspaceSlicer ws(ctx);
      void* scratch = ws.take(scratch_md.get_size());
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(a_md, eng, const_cast<void*>(in[0]->raw()))},
                                           {DNNL_ARG_WEIGHTS, weights},
                                           {DNNL_ARG_DST, memory(dst_md, eng, out[0]->raw())}};
      if (has_bias) args.emplace(DNNL_ARG_BIAS, bias);
      if (has_residual)
        args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                     memory(dst_md, eng, const_cast<void*>(in[3]->raw())));
      execute(prim, scratch_md, scratch, std::move(args));
      return Status::Ok();
    });
  }
};

class OnednnMatmulBf16Io : public Tactic {
 public:
  TacticInfo info() const override { return nhwc_bf16_info(); }
  std::string name() const override { return "matmul_onednn_bf16_io"; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "MatMul"}, {"", "Gemm"}, {"kiln", "FusedMatMul"}, {"kiln", "FusedGemm"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = check_bf16_matmul(sig, DataType::kBFloat16); !e.empty()) return e;
    const Dims& b = sig.inputs[1].shape;
    if (is_gemm_layer(sig) && sig.node->attr_int("transA", 0)) return "Gemm with transA";
    // (alpha folded into bf16 weights would round them twice: such a layer keeps float32)
    if (is_gemm_layer(sig) && sig.node->attr_float("alpha", 1.f) != 1.f) return "Gemm with alpha != 1";
    if (sig.has_input(2)) {
      const Tensor* c = sig.inputs[2].constant;
      const int64_t n = is_gemm_layer(sig) && sig.node->attr_int("transB", 0) ? b[0] : b[1];
      if (!c || c->numel() != n || (!c->shape().empty() && c->shape().back() != n))
        return "the bias is not a constant of N elements";
    }
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedMatmulBf16Io>();
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
      if (sig.has_input(2)) {
        bias_values = float_values(*sig.inputs[2].constant);
        for (float& v : bias_values) v *= g.gemm ? g.beta : 1.f;
      }
      p->a_md = memory::desc({m, k}, dt::bf16, tag::ab);
      p->dst_md = memory::desc({m, n}, dt::bf16, tag::ab);
      memory::desc bias_md;
      if (!bias_values.empty()) {
        bias_md = memory::desc({1, n}, dt::f32, tag::ab);
        p->has_bias = true;
      }
      dnnl::post_ops po;
      if (p->has_residual) po.append_binary(dnnl::algorithm::binary_add, p->dst_md);
      append_activation(*sig.node, po);
      dnnl::primitive_attr attr;
      attr.set_post_ops(po);
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      const memory::desc w_any({k, n}, dt::bf16, tag::any);
      auto d = p->has_bias ? dnnl::matmul::desc(p->a_md, w_any, bias_md, p->dst_md)
                           : dnnl::matmul::desc(p->a_md, w_any, p->dst_md);
      p->pd = dnnl::matmul::primitive_desc(d, attr, eng);
      KILN_RETURN_IF_ERROR(check_not_reference(name(), p->pd.impl_info_str()));
      p->prim = dnnl::matmul(p->pd);
      p->scratch_md = p->pd.scratchpad_desc();
      // B as given (bf16, [K, N] or [N, K] under transB).
      const memory::desc w_user({k, n}, dt::bf16, g.trans_b ? tag::ba : tag::ab);
      p->weights = memory(p->pd.weights_desc(), eng);
      reorder_into(w_user, sig.inputs[1].constant->raw(), p->pd.weights_desc(), p->weights.get_data_handle());
      if (p->has_bias) {
        p->bias = memory(bias_md, eng);
        std::memcpy(p->bias.get_data_handle(), bias_values.data(), bias_values.size() * sizeof(float));
      }
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

}  // namespace

const Tactic* conv2d_onednn_nhwc_bf16() {
  static const OnednnNhwcConv t(DataType::kBFloat16);
  return &t;
}
const Tactic* pool2d_onednn_nhwc_bf16() {
  static const OnednnNhwcPool t(DataType::kBFloat16);
  return &t;
}
const Tactic* conv2d_onednn_nhwc() {
  static const OnednnNhwcConv t(DataType::kFloat32);
  return &t;
}
const Tactic* pool2d_onednn_nhwc() {
  static const OnednnNhwcPool t(DataType::kFloat32);
  return &t;
}
const Tactic* matmul_onednn_bf16_io() {
  static const OnednnMatmulBf16Io t;
  return &t;
}

}  // namespace kiln::backends::cpu::onednn
#endif  // KILN_HAVE_ONEDNN
