// oneDNN 2-D convolution tactics for Conv and kiln.FusedConv (bias, residual sum, activation as
// post-ops). Two variants: activations in plain NCHW (no reorders around the layer), and oneDNN's
// preferred blocked activation layout with reorders around the layer (until a layout pass keeps
// tensors blocked between layers). Weights are reordered once, at prepare time.
#if defined(KILN_HAVE_ONEDNN)
#include <algorithm>
#include <cstring>

#include "backends/cpu/kiln_tactics.h"
#include "backends/cpu/onednn_common.h"
#include "backends/cpu/onednn_geometry.h"
#include "backends/cpu/onednn_tactics.h"

namespace kiln::backends::cpu::onednn {

// Conv's attributes resolved for concrete input shapes; an error string when not expressible.
std::string resolve_conv(const ir::Node& node, const Dims& x, const Dims& wt, ConvGeometry& g) {
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.m = wt[0], g.kh = wt[2], g.kw = wt[3];
  g.group = node.attr_int("group", 1);
  if (g.group <= 0 || g.c % g.group != 0 || g.m % g.group != 0 || wt[1] * g.group != g.c)
    return "channels do not match the groups";
  auto ks = node.attr_ints("kernel_shape");
  if (!ks.empty() && (ks.size() != 2 || ks[0] != g.kh || ks[1] != g.kw)) return "kernel_shape disagrees with W";
  auto st = node.attr_ints("strides", {1, 1});
  auto dl = node.attr_ints("dilations", {1, 1});
  auto pads = node.attr_ints("pads", {0, 0, 0, 0});
  if (st.size() != 2 || dl.size() != 2 || pads.size() != 4) return "strides/dilations/pads are not 2-D";
  g.sh = st[0], g.sw = st[1], g.dh = dl[0], g.dw = dl[1];
  if (g.sh <= 0 || g.sw <= 0 || g.dh <= 0 || g.dw <= 0) return "non-positive stride or dilation";
  for (int64_t p : pads)
    if (p < 0) return "negative pads";
  std::string ap = node.attr_string("auto_pad", "NOTSET");
  auto same = [&](int64_t in, int64_t k, int64_t s, int64_t d, bool upper, int64_t& b, int64_t& e) {
    int64_t out = (in + s - 1) / s;
    int64_t total = std::max<int64_t>(0, (out - 1) * s + (k - 1) * d + 1 - in);
    b = upper ? total / 2 : total - total / 2;
    e = total - b;
  };
  if (ap == "NOTSET") {
    g.pt = pads[0], g.pl = pads[1], g.pb = pads[2], g.pr = pads[3];
  } else if (ap == "VALID") {
    g.pt = g.pl = g.pb = g.pr = 0;
  } else if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    bool up = ap == "SAME_UPPER";
    same(g.h, g.kh, g.sh, g.dh, up, g.pt, g.pb);
    same(g.w, g.kw, g.sw, g.dw, up, g.pl, g.pr);
  } else {
    return "auto_pad " + ap;
  }
  int64_t eh = (g.kh - 1) * g.dh + 1, ew = (g.kw - 1) * g.dw + 1;
  if (g.h + g.pt + g.pb < eh || g.w + g.pl + g.pr < ew) return "kernel larger than the padded input";
  // Output rows made of padding only: oneDNN 2.6's brgconv crashes on them (seen with a 1x3 kernel,
  // pads 2, stride 3, sum post-op); no real model pads that much, the reference kernel takes them.
  if (std::max(g.pt, g.pb) >= eh || std::max(g.pl, g.pr) >= ew) return "a pad as large as the kernel";
  g.oh = (g.h + g.pt + g.pb - eh) / g.sh + 1;
  g.ow = (g.w + g.pl + g.pr - ew) / g.sw + 1;
  if (g.n <= 0 || g.c <= 0 || g.h <= 0 || g.w <= 0 || g.m <= 0) return "empty tensors";
  return "";
}

namespace {

class PreparedConv : public PreparedLayer {
 public:
  ConvGeometry g;
  bool has_bias = false, has_residual = false;
  memory::desc user_src, user_dst;  // plain NCHW
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  memory weights, bias;
  std::string name;
  // Made once: activations to/from oneDNN's chosen layout (empty when it kept plain NCHW).
  dnnl::reorder src_in, residual_in, dst_out;

  static void run_reorder(const dnnl::reorder& r, const memory::desc& from, const void* src, const memory::desc& to,
                          void* dst) {
    auto& eng = cpu_engine();
    memory a(from, eng, const_cast<void*>(src)), b(to, eng, dst);
    r.execute(thread_stream(), {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}});
    thread_stream().wait();
  }

  std::vector<Dims> output_shapes() const override { return {{g.n, g.m, g.oh, g.ow}}; }

  Status run(const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) const override {
    return guarded(name, [&]() -> Status {
      auto& eng = cpu_engine();
      const memory::desc src_md = pd.src_desc(), dst_md = pd.dst_desc();
      void* src = const_cast<void*>(in[0]->raw());
      if (src_md != user_src) {
        void* tmp = thread_buffer(0, src_md.get_size());
        run_reorder(src_in, user_src, src, src_md, tmp);
        src = tmp;
      }
      bool dst_plain = dst_md == user_dst;
      void* dst = dst_plain ? out[0]->raw() : thread_buffer(1, dst_md.get_size());
      if (has_residual && dst_plain) std::memcpy(dst, in[3]->raw(), dst_md.get_size());
      if (has_residual && !dst_plain) run_reorder(residual_in, user_dst, in[3]->raw(), dst_md, dst);
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src_md, eng, src)},
                                           {DNNL_ARG_WEIGHTS, weights},
                                           {DNNL_ARG_DST, memory(dst_md, eng, dst)}};
      if (has_bias) args.emplace(DNNL_ARG_BIAS, bias);
      execute(prim, pd.scratchpad_desc(), std::move(args));
      if (!dst_plain) run_reorder(dst_out, dst_md, dst, user_dst, out[0]->raw());
      return Status::Ok();
    });
  }
};

class OnednnConv : public Tactic {
 public:
  explicit OnednnConv(bool blocked) : blocked_(blocked) {}
  std::string name() const override { return blocked_ ? "conv2d_onednn_blocked" : "conv2d_onednn_nchw"; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "Conv"}, {"kiln", "FusedConv"}};
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = conv2d_layer_unsupported(sig); !e.empty()) return e;
    bool fused = sig.domain() == "kiln";
    const Dims& w = sig.inputs[1].shape;
    if (fused && !activation_supported(*sig.node)) return "activation has no oneDNN eltwise";
    if (sig.inputs[0].known()) {
      ConvGeometry g;
      if (auto e = resolve_conv(*sig.node, sig.inputs[0].shape, w, g); !e.empty()) return e;
      if (auto e = residual_unsupported(sig, {g.n, g.m, g.oh, g.ow}); !e.empty()) return e;
    }
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedConv>();
    p->name = name();
    ConvGeometry& g = p->g;
    resolve_conv(*sig.node, sig.inputs[0].shape, sig.inputs[1].shape, g);
    p->has_bias = sig.has_input(2);
    p->has_residual = sig.has_input(3);
    Status st = guarded(name(), [&]() -> Status {
      auto& eng = cpu_engine();
      p->user_src = memory::desc({g.n, g.c, g.h, g.w}, dt::f32, tag::nchw);
      p->user_dst = memory::desc({g.n, g.m, g.oh, g.ow}, dt::f32, tag::nchw);
      const ConvDescs cd(g);
      memory::desc src_md = blocked_ ? memory::desc(p->user_src.dims(), dt::f32, tag::any) : p->user_src;
      memory::desc dst_md = blocked_ ? memory::desc(p->user_dst.dims(), dt::f32, tag::any) : p->user_dst;
      dnnl::post_ops po;
      if (p->has_residual) po.append_sum(1.f);
      append_activation(*sig.node, po);
      dnnl::primitive_attr attr;
      attr.set_post_ops(po);
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      auto d = cd.desc(dnnl::algorithm::convolution_direct, src_md, dst_md, p->has_bias);
      p->pd = dnnl::convolution_forward::primitive_desc(d, attr, eng);
      // The plain variant must not hide a reorder: oneDNN may still pick a layout for "any" only.
      p->prim = dnnl::convolution_forward(p->pd);
      if (p->pd.src_desc() != p->user_src)
        p->src_in = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->user_src, eng, p->pd.src_desc()));
      if (p->pd.dst_desc() != p->user_dst) {
        p->dst_out = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->pd.dst_desc(), eng, p->user_dst));
        if (p->has_residual)
          p->residual_in = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->user_dst, eng, p->pd.dst_desc()));
      }
      cd.load_constants(sig, p->pd, p->has_bias, &p->weights, &p->bias);
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  bool blocked_;
};

}  // namespace

const Tactic* conv2d_onednn_blocked() {
  static const OnednnConv t(true);
  return &t;
}
const Tactic* conv2d_onednn_nchw() {
  static const OnednnConv t(false);
  return &t;
}

}  // namespace kiln::backends::cpu::onednn
#endif  // KILN_HAVE_ONEDNN
