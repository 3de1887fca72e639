// kiln.QConv (ops/kiln_quantized.h) through oneDNN's int8 convolution: u8/s8 activations
// channels-last (nhwc: what oneDNN's VNNI kernels read without reorders), s8 weights reordered once
// into oneDNN's layout at prepare time, the int32 bias, per-channel output scales
// x_scale * w_scale[m] / y_scale, the residual as a sum post-op (scale residual_scale / y_scale, its
// zero point), ReLU / Clip as an eltwise post-op, and the source and destination zero points (oneDNN
// computes the u8 x s8 zero-point compensation, padding included, from the weights once). A rank-2
// x (a Gemm) runs as a 1x1 convolution on [N, C, 1, 1].
//
// Rounding: oneDNN scales the int32 accumulator in float and rounds to nearest even (a round post-op
// before the destination zero point, as QuantizeLinear and ONNX Runtime's requantization), as the
// reference does in double; the two differ only where float's rounding of the scale product moves a
// value across a half-way point: at most one unit of the output (tests/unit/backends/int8_tactic_test.cc).
#if defined(KILN_HAVE_ONEDNN)
#include <cstring>
#include <thread>

#include "backends/cpu/onednn_common.h"
#include "backends/cpu/onednn_int8_tactics.h"
#include "core/parallel.h"
#include "ops/conv_util.h"
#include "ops/kiln_quantized.h"

namespace kiln::backends::cpu::onednn {

namespace {

dt dnnl_type(DataType t) { return t == DataType::kInt8 ? dt::s8 : dt::u8; }

bool in_parallel_region() {
#if defined(_OPENMP)
  return omp_in_parallel();
#else
  return false;
#endif
}

class PreparedQConv : public PreparedLayer {
 public:
  std::string name;
  Dims y_shape;
  DataType y_type = DataType::kUInt8;
  bool has_bias = false, has_residual = false, src_zp = false, dst_zp = false;
  memory::desc src_md, dst_md, scratch_md;
  dnnl::primitive prim;
  memory weights, bias, src_zp_mem, dst_zp_mem;

  std::vector<Dims> output_shapes() const override { return {y_shape}; }
  std::vector<DataType> output_dtypes() const override { return {y_type}; }
  size_t workspace_bytes(int) const override { return workspace_piece(scratch_md.get_size()); }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return guarded(name, [&]() -> Status {
      auto& eng = cpu_engine();
      WorkspaceSlicer ws(ctx);
      void* scratch = ws.take(scratch_md.get_size());
      void* dst = out[0]->raw();
      if (has_residual) std::memcpy(dst, in[3]->raw(), dst_md.get_size());
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src_md, eng, const_cast<void*>(in[0]->raw()))},
                                           {DNNL_ARG_WEIGHTS, weights},
                                           {DNNL_ARG_DST, memory(dst_md, eng, dst)}};
      if (has_bias) args.emplace(DNNL_ARG_BIAS, bias);
      if (src_zp) args.emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, src_zp_mem);
      if (dst_zp) args.emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, dst_zp_mem);
      execute(prim, scratch_md, scratch, std::move(args));
      return Status::Ok();
    });
  }
};

// skip_amx: the same primitive with oneDNN's next implementation after its AMX ones (VNNI): on a CPU
// with AMX, oneDNN always picks AMX, whose per-call tile set-up outweighs its speed on small layers
// (mobilenet_v2's INT8 file at batch 1: 2.55 ms with AMX everywhere, 1.64 ms with
// ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI), so the tuner times both per layer.
class OnednnQConv : public Tactic {
 public:
  explicit OnednnQConv(bool skip_amx = false) : skip_amx_(skip_amx) {}
  std::string name() const override { return skip_amx_ ? "conv2d_onednn_int8_nhwc_vnni" : "conv2d_onednn_int8_nhwc"; }
  TacticInfo info() const override {
    TacticInfo t = TacticInfo::cpu_int8();
    if (skip_amx_) t.isa = kIsaAmx;  // a candidate only where there is AMX to skip
    return t;
  }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "QConv"}}; }

  std::string why_unsupported(const LayerSignature& sig) const override {
    const auto p = ops::quantized_layer_params(*sig.node);
    if (!sig.has_input(0) || !sig.has_input(1) || !sig.inputs[1].constant) return "w is not a constant";
    const size_t rank = sig.inputs[0].shape.size();
    if (rank != 2 && !(rank == 4 && p.channels_last)) return "x is neither [N, C] nor channels-last [N, H, W, C]";
    if (sig.inputs[1].shape.size() != 4) return "w is not 4-D";
    if (sig.has_input(2) && (!sig.inputs[2].constant || sig.inputs[2].dtype != DataType::kInt32))
      return "bias is not an int32 constant";
    if (sig.has_input(3) && sig.inputs[3].dtype != DataType::kUInt8 && sig.inputs[3].dtype != DataType::kInt8)
      return "residual is not 8-bit";
    // oneDNN 2.6's grouped int8 kernel (jit_int8) got round + clip + linear + sum + clip wrong by tens of
    // units (int8_tactic_test); fold_qdq_conv never makes it (no Clip after a folded residual Add).
    if (p.has_inner() && p.activation == "Clip") return "a Clip activation after the inner quantization";
    if (sig.node->attr_string("auto_pad", "NOTSET") != "NOTSET" && !sig.node->attr_string("auto_pad", "").empty())
      return "auto_pad (the folding pass keeps explicit pads)";
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    const auto q = ops::quantized_layer_params(*sig.node);
    const Dims& xs = sig.inputs[0].shape;
    const Dims& wd = sig.inputs[1].shape;
    const bool gemm = xs.size() == 2;
    const Dims x_nchw = gemm ? Dims{xs[0], xs[1], 1, 1} : ops::to_channels_first(xs);
    ConvGeometry g;
    if (gemm) {
      g.n = x_nchw[0], g.c = x_nchw[1], g.h = g.w = 1, g.m = wd[0], g.kh = g.kw = 1, g.group = 1;
      g.sh = g.sw = g.dh = g.dw = 1, g.pt = g.pl = g.pb = g.pr = 0, g.oh = g.ow = 1;
      if (wd[1] != g.c || wd[2] != 1 || wd[3] != 1) return Unsupported(name(), ": w does not match x");
    } else {
      if (auto e = resolve_conv(*sig.node, x_nchw, wd, g); !e.empty()) return Unsupported(name(), ": ", e);
    }
    auto p = std::make_unique<PreparedQConv>();
    p->name = name();
    p->y_type = q.y_type;
    p->y_shape = gemm ? Dims{g.n, g.m} : ops::to_channels_last(Dims{g.n, g.m, g.oh, g.ow});
    p->has_bias = sig.has_input(2);
    p->has_residual = sig.has_input(3);
    p->src_zp = q.x_zero_point != 0;
    p->dst_zp = q.y_zero_point != 0;
    auto create = [&]() -> Status {
      auto& eng = cpu_engine();
      const memory::desc src({g.n, g.c, g.h, g.w}, dnnl_type(sig.inputs[0].dtype), tag::nhwc);
      const memory::desc dst({g.n, g.m, g.oh, g.ow}, dnnl_type(q.y_type), tag::nhwc);
      ConvDescs d(g);
      const memory::desc any_w(d.user_w.dims(), dt::s8, tag::any);
      const memory::desc bias_md({g.m}, dt::s32, tag::x);
      dnnl::primitive_attr attr;
      std::vector<float> scales(static_cast<size_t>(g.m));
      // With the conv's own quantization (a folded residual): scaled to its units, rounded (to nearest
      // even, as oneDNN's round), saturated, then scaled to the output's units.
      const float first = q.has_inner() ? q.inner_scale : q.y_scale;
      for (int64_t m = 0; m < g.m; ++m) scales[static_cast<size_t>(m)] = q.x_scale * q.w_scale(m) / first;
      attr.set_output_scales(1 << 1, scales);
      dnnl::post_ops po;
      if (q.has_inner()) {
        po.append_eltwise(1.f, dnnl::algorithm::eltwise_round, 0.f, 0.f);
        // clip_v2 (clip's forward), not clip: oneDNN 2.6's jit kernels gave a second eltwise_clip of one
        // chain (a Clip activation after the sum) this one's bounds (int8_tactic_test).
        po.append_eltwise(1.f, dnnl::algorithm::eltwise_clip_v2, static_cast<float>(q.inner_min() - q.inner_zero_point),
                          static_cast<float>(q.inner_max() - q.inner_zero_point));
        po.append_eltwise(1.f, dnnl::algorithm::eltwise_linear, q.inner_scale / q.y_scale, 0.f);
      }
      if (p->has_residual) {
        const dt rt = dnnl_type(sig.inputs[3].dtype);
        po.append_sum(q.residual_scale / q.y_scale, static_cast<int32_t>(q.residual_zero_point), rt);
      }
      if (q.activation == "Relu") po.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
      if (q.activation == "Clip")
        po.append_eltwise(1.f, dnnl::algorithm::eltwise_clip, q.activation_min / q.y_scale,
                          q.activation_max / q.y_scale);
      // QuantizeLinear rounds, then adds the zero point; oneDNN adds the destination zero point in float
      // before its final rounding: round(v + zp), which differs at half-way points when zp is odd, and
      // where v + zp loses v's last bits in float (13.500001 + 127 = 140.5 -> 140, not 141). Rounding
      // first makes v + zp an exact integer (mobilenet_v2_fmnist's Q/DQ file: 2 of the 24,576 outputs of
      // features.2's projection differed from ONNX Runtime's, 26 of its 40 logits by the end).
      if (p->dst_zp) po.append_eltwise(1.f, dnnl::algorithm::eltwise_round, 0.f, 0.f);
      attr.set_post_ops(po);
      if (p->src_zp) attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
      if (p->dst_zp) attr.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      auto desc =
          p->has_bias
              ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                                src, any_w, bias_md, dst, d.strides, d.dil, d.pl, d.pr)
              : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                                src, any_w, dst, d.strides, d.dil, d.pl, d.pr);
      dnnl::convolution_forward::primitive_desc pd(desc, attr, eng);
      if (skip_amx_) {
        bool amx = false;
        for (const char* impl = pd.impl_info_str(); std::strstr(impl, "amx"); impl = pd.impl_info_str()) {
          amx = true;
          if (!pd.next_impl()) return Unsupported(name(), ": oneDNN has only AMX kernels for this layer");
        }
        if (!amx) return Unsupported(name(), ": oneDNN picks no AMX kernel here (the plain tactic is the same)");
        if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0)
          return Unsupported(name(), ": oneDNN's only other kernel is its reference one");
      }
      p->prim = dnnl::convolution_forward(pd);
      p->src_md = pd.src_desc(), p->dst_md = pd.dst_desc(), p->scratch_md = pd.scratchpad_desc();
      if (p->src_md != src || p->dst_md != dst) return Internal("oneDNN changed the nhwc activation layout");
      const memory::desc user_w = g.group == 1 ? memory::desc(d.user_w.dims(), dt::s8, tag::oihw)
                                               : memory::desc(d.user_w.dims(), dt::s8, tag::goihw);
      p->weights = memory(pd.weights_desc(), eng);
      reorder_into(user_w, sig.inputs[1].constant->raw(), pd.weights_desc(), p->weights.get_data_handle());
      if (p->has_bias) {
        p->bias = memory(bias_md, eng);
        std::memcpy(p->bias.get_data_handle(), sig.inputs[2].constant->raw(), bias_md.get_size());
      }
      auto zp_mem = [&](int64_t v) {
        memory m(memory::desc({1}, dt::s32, tag::x), eng);
        *static_cast<int32_t*>(m.get_data_handle()) = static_cast<int32_t>(v);
        return m;
      };
      if (p->src_zp) p->src_zp_mem = zp_mem(q.x_zero_point);
      if (p->dst_zp) p->dst_zp_mem = zp_mem(q.y_zero_point);
      return Status::Ok();
    };
    // The builder prepares layers inside a parallel region (engine/tactics.cc, prepare_all), where
    // oneDNN sizes the int8 kernels' thread partition and per-thread scratch for one thread, though
    // they run on all: seen as wrong results at 2 threads. The primitive is made outside any parallel
    // region, for the thread count of the run.
    Status st;
    if (in_parallel_region()) {
      const int threads = max_threads();
      std::thread maker([&] {
        set_num_threads(threads);
        st = guarded(name(), create);
      });
      maker.join();
    } else {
      st = guarded(name(), create);
    }
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  bool skip_amx_;
};

// kiln.QPool MaxPool with the output's scale, zero point and type equal to the input's (what
// quantize_static writes): the max of the integers, oneDNN's u8/s8 max pooling on nhwc.
class PreparedQMaxPool : public PreparedLayer {
 public:
  Dims y_shape;
  DataType y_type = DataType::kUInt8;
  memory::desc src_md, dst_md, scratch_md;
  dnnl::pooling_v2_forward prim;

  std::vector<Dims> output_shapes() const override { return {y_shape}; }
  std::vector<DataType> output_dtypes() const override { return {y_type}; }
  size_t workspace_bytes(int) const override { return workspace_piece(scratch_md.get_size()); }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return execute_src_dst("pool2d_onednn_int8_nhwc", ctx, prim, scratch_md, src_md, in[0]->raw(), dst_md,
                           out[0]->raw());
  }
};

class OnednnQMaxPool : public Tactic {
 public:
  std::string name() const override { return "pool2d_onednn_int8_nhwc"; }
  TacticInfo info() const override { return TacticInfo::cpu_int8(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "QPool"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    const auto q = ops::quantized_layer_params(*sig.node);
    if (q.mode != "MaxPool") return "not a MaxPool";
    if (!q.channels_last || sig.inputs[0].shape.size() != 4) return "x is not channels-last [N, H, W, C]";
    if (q.x_scale != q.y_scale || q.x_zero_point != q.y_zero_point || sig.inputs[0].dtype != q.y_type)
      return "the output is quantized differently from the input (a requantizing max)";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    const auto q = ops::quantized_layer_params(*sig.node);
    const Dims& x = sig.inputs[0].shape;
    auto win = ops::resolve_window(*sig.node, ops::to_channels_first(x), nullptr, ops::window_options("MaxPool", 19));
    if (!win.ok()) return Unsupported(name(), ": ", win.status().message());
    if (win->rank() != 2) return Unsupported(name(), ": not a 2-D pool");
    auto p = std::make_unique<PreparedQMaxPool>();
    p->y_type = q.y_type;
    p->y_shape = {x[0], win->out[0], win->out[1], x[3]};
    Status st = guarded(name(), [&]() -> Status {
      const dt t = dnnl_type(q.y_type);
      p->src_md = memory::desc({x[0], x[3], x[1], x[2]}, t, tag::nhwc);
      p->dst_md = memory::desc({x[0], x[3], win->out[0], win->out[1]}, t, tag::nhwc);
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      memory::dims dil;
      for (int64_t d : win->dilations) dil.push_back(d - 1);
      dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::pooling_max, p->src_md,
                                       p->dst_md, to_dnnl(win->strides), to_dnnl(win->kernel), dil,
                                       to_dnnl(win->pad_begin), to_dnnl(win->pad_end));
      dnnl::pooling_v2_forward::primitive_desc pd(d, attr, cpu_engine());
      p->prim = dnnl::pooling_v2_forward(pd);
      p->scratch_md = pd.scratchpad_desc();
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

}  // namespace

const Tactic* pool2d_onednn_int8_nhwc() {
  static const OnednnQMaxPool t;
  return &t;
}

const Tactic* conv2d_onednn_int8_nhwc() {
  static const OnednnQConv t;
  return &t;
}
const Tactic* conv2d_onednn_int8_nhwc_vnni() {
  static const OnednnQConv t(true);
  return &t;
}

}  // namespace kiln::backends::cpu::onednn
#endif  // KILN_HAVE_ONEDNN
