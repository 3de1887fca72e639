// oneDNN convolution tactics over 1, 2 or 3 spatial dims, for Conv and kiln.FusedConv (bias,
// residual sum, activation as post-ops), and ConvTranspose through oneDNN's deconvolution (groups,
// dilations, pads, output_padding, output_shape). Two variants each: activations in plain
// ncw / nchw / ncdhw (no reorders around the layer), and oneDNN's preferred blocked activation
// layout with reorders around the layer (layers the layout pass leaves plain). Weights are
// reordered once, at prepare time. The window is resolved by the reference kernel's own code
// (ops/conv_util.h), so the output shape always matches it.
#if defined(KILN_HAVE_ONEDNN)
#include <algorithm>
#include <cstring>

#include "backends/cpu/kiln_tactics.h"
#include "backends/cpu/onednn_common.h"
#include "backends/cpu/onednn_geometry.h"
#include "backends/cpu/onednn_tactics.h"
#include "ops/conv_util.h"

namespace kiln::backends::cpu::onednn {

// Conv's attributes resolved for concrete input shapes; an error string when not expressible.
std::string resolve_conv(const ir::Node& node, const Dims& x, const Dims& wt, ConvGeometry& g) {
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.m = wt[0], g.kh = wt[2], g.kw = wt[3];
  g.group = node.attr_int("group", 1);
  if (g.group <= 0 || g.c % g.group != 0 || g.m % g.group != 0 || wt[1] * g.group != g.c)
    return "channels do not match the groups";
  auto win = ops::resolve_window(node, x, &wt);
  if (!win.ok()) return win.status().message();
  g.sh = win->strides[0], g.sw = win->strides[1], g.dh = win->dilations[0], g.dw = win->dilations[1];
  g.pt = win->pad_begin[0], g.pl = win->pad_begin[1], g.pb = win->pad_end[0], g.pr = win->pad_end[1];
  const int64_t eh = win->extent(0), ew = win->extent(1);
  // Output rows made of padding only: oneDNN 2.6's brgconv crashes on them (seen with a 1x3 kernel,
  // pads 2, stride 3, sum post-op); no real model pads that much, the reference kernel takes them.
  if (std::max(g.pt, g.pb) >= eh || std::max(g.pl, g.pr) >= ew) return "a pad as large as the kernel";
  g.oh = win->out[0], g.ow = win->out[1];
  if (g.n <= 0 || g.c <= 0 || g.h <= 0 || g.w <= 0 || g.m <= 0) return "empty tensors";
  return "";
}

std::string resolve_conv_nd(const ir::Node& node, bool transpose, const Dims& x, const Dims& wt, ConvNdGeometry& g) {
  if (x.size() < 3 || x.size() > 5 || wt.size() != x.size()) return "not a 1-D, 2-D or 3-D convolution";
  const size_t rank = x.size() - 2;
  g = ConvNdGeometry();
  g.transpose = transpose;
  g.n = x[0], g.c = x[1];
  g.group = node.attr_int("group", 1);
  if (g.group <= 0 || g.c % g.group != 0) return "channels do not match the groups";
  if (transpose) {
    if (wt[0] != g.c) return "W's dim 0 is not X's channels";
    g.m = wt[1] * g.group;
  } else {
    if (wt[1] * g.group != g.c || wt[0] % g.group != 0) return "channels do not match the groups";
    g.m = wt[0];
  }
  for (int64_t d : x)
    if (d <= 0) return "empty tensors";
  if (g.m <= 0) return "empty tensors";
  WindowNd& w = g.w;
  w.in.assign(x.begin() + 2, x.end());
  ops::WindowOptions opts;
  opts.transpose = transpose;
  auto win = ops::resolve_window(node, x, &wt, opts);
  if (!win.ok()) return win.status().message();
  for (size_t d = 0; d < rank; ++d) {
    const int64_t ext = win->extent(d), o = win->out[d], pb = win->pad_begin[d], pe = win->pad_end[d];
    // ConvTranspose: oneDNN's deconvolution writes (in - 1) * stride + extent - pads; output_padding
    // (or an output_shape) past that is a negative end pad (bias-only positions there), which oneDNN
    // 2.6 takes down to -(stride - 1) (ONNX's usual output_padding < stride).
    if (transpose && pe <= -win->strides[d])
      return "output_padding / output_shape a stride past the last input's reach";
    if (o <= 0) return "empty output";
    // Output positions made of padding only: oneDNN 2.6's brgconv crashes on them (seen with a 1x3
    // kernel, pads 2, stride 3, sum post-op); no real model pads that much, the reference takes them.
    if (std::max(pb, pe) >= ext) return "a pad as large as the kernel";
    w.out.push_back(o), w.kernel.push_back(win->kernel[d]), w.strides.push_back(win->strides[d]);
    w.dilations.push_back(win->dilations[d]), w.pad_l.push_back(pb), w.pad_r.push_back(pe);
  }
  return "";
}

namespace {

tag plain_tag(size_t rank) { return rank == 1 ? tag::ncw : rank == 2 ? tag::nchw : tag::ncdhw; }

// The ONNX weights as oneDNN sees them: Conv [M, C/G, k...] is oneDNN's (g)oi*; ConvTranspose
// [C, M/G, k...] is oneDNN's (g)io* (output channels before input channels in its dims).
memory::desc user_weights(const ConvNdGeometry& g) {
  int64_t kp = 1;
  for (int64_t k : g.w.kernel) kp *= k;
  const int64_t mg = g.m / g.group, cg = g.c / g.group;
  memory::dims dims, strides;
  if (g.group > 1) dims.push_back(g.group), strides.push_back(mg * cg * kp);
  dims.push_back(mg), dims.push_back(cg);
  if (g.transpose)
    strides.push_back(kp), strides.push_back(mg * kp);
  else
    strides.push_back(cg * kp), strides.push_back(kp);
  int64_t s = kp;
  for (int64_t k : g.w.kernel) dims.push_back(k), strides.push_back(s /= k);
  return memory::desc(dims, dt::f32, strides);
}

class PreparedConv : public PreparedLayer {
 public:
  ConvNdGeometry g;
  bool has_bias = false, has_residual = false;
  memory::desc user_src, user_dst;  // plain
  memory::desc src_md, dst_md, scratch_md;
  dnnl::primitive prim;
  memory weights, bias;
  std::string name;
  // Made once: activations to/from oneDNN's chosen layout (empty when it kept the plain one).
  dnnl::reorder src_in, residual_in, dst_out;

  static void run_reorder(const dnnl::reorder& r, const memory::desc& from, const void* src, const memory::desc& to,
                          void* dst) {
    auto& eng = cpu_engine();
    memory a(from, eng, const_cast<void*>(src)), b(to, eng, dst);
    r.execute(thread_stream(), {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}});
    thread_stream().wait();
  }

  std::vector<Dims> output_shapes() const override {
    Dims y{g.n, g.m};
    y.insert(y.end(), g.w.out.begin(), g.w.out.end());
    return {y};
  }
  // X in oneDNN's layout (when it differs from the plain one), Y likewise, the scratchpad.
  size_t workspace_bytes(int) const override {
    return workspace_piece(src_md != user_src ? src_md.get_size() : 0) +
           workspace_piece(dst_md != user_dst ? dst_md.get_size() : 0) + workspace_piece(scratch_md.get_size());
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return guarded(name, [&]() -> Status {
      auto& eng = cpu_engine();
      WorkspaceSlicer ws(ctx);
      void* src = const_cast<void*>(in[0]->raw());
      void* src_tmp = ws.take(src_md != user_src ? src_md.get_size() : 0);
      bool dst_plain = dst_md == user_dst;
      void* dst_tmp = ws.take(dst_plain ? 0 : dst_md.get_size());
      void* scratch = ws.take(scratch_md.get_size());
      if (src_tmp) {
        run_reorder(src_in, user_src, src, src_md, src_tmp);
        src = src_tmp;
      }
      void* dst = dst_plain ? out[0]->raw() : dst_tmp;
      if (has_residual && dst_plain) std::memcpy(dst, in[3]->raw(), dst_md.get_size());
      if (has_residual && !dst_plain) run_reorder(residual_in, user_dst, in[3]->raw(), dst_md, dst);
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src_md, eng, src)},
                                           {DNNL_ARG_WEIGHTS, weights},
                                           {DNNL_ARG_DST, memory(dst_md, eng, dst)}};
      if (has_bias) args.emplace(DNNL_ARG_BIAS, bias);
      execute(prim, scratch_md, scratch, std::move(args));
      if (!dst_plain) run_reorder(dst_out, dst_md, dst, user_dst, out[0]->raw());
      return Status::Ok();
    });
  }
};

// Conv / kiln.FusedConv (transpose false) or ConvTranspose (true) over `rank` spatial dims
// (ConvTranspose: any of 1 to 3, rank 0).
class OnednnConv : public Tactic {
 public:
  OnednnConv(bool blocked, size_t rank, bool transpose) : blocked_(blocked), rank_(rank), transpose_(transpose) {}
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override {
    if (transpose_) return blocked_ ? "convtranspose_onednn_blocked" : "convtranspose_onednn_plain";
    static const char* kPlain[] = {"", "conv1d_onednn_ncw", "", "conv3d_onednn_ncdhw"};  // no 2-D: tactic_list.cc
    return blocked_ ? "conv" + std::to_string(rank_) + "d_onednn_blocked" : kPlain[rank_];
  }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    if (transpose_) return {{"", "ConvTranspose"}};
    return {{"", "Conv"}, {"kiln", "FusedConv"}};
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (transpose_) {
      if (auto e = transpose_layer_unsupported(sig); !e.empty()) return e;
    } else {
      if (auto e = conv_layer_unsupported(sig, rank_); !e.empty()) return e;
      if (sig.domain() == "kiln" && !activation_supported(*sig.node)) return "activation has no oneDNN eltwise";
    }
    if (sig.inputs[0].known()) {
      ConvNdGeometry g;
      if (auto e = resolve_conv_nd(*sig.node, transpose_, sig.inputs[0].shape, sig.inputs[1].shape, g); !e.empty())
        return e;
      if (transpose_ && sig.has_input(2) && sig.inputs[2].constant->numel() != g.m)
        return "B is not a constant of M elements";
      Dims y{g.n, g.m};
      y.insert(y.end(), g.w.out.begin(), g.w.out.end());
      if (auto e = residual_unsupported(sig, y); !e.empty()) return e;
    }
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedConv>();
    p->name = name();
    ConvNdGeometry& g = p->g;
    resolve_conv_nd(*sig.node, transpose_, sig.inputs[0].shape, sig.inputs[1].shape, g);
    p->has_bias = sig.has_input(2);
    p->has_residual = sig.has_input(3);
    Status st = guarded(name(), [&]() -> Status {
      auto& eng = cpu_engine();
      const tag plain = plain_tag(g.w.rank());
      memory::dims src{g.n, g.c}, dst{g.n, g.m}, dil;
      src.insert(src.end(), g.w.in.begin(), g.w.in.end());
      dst.insert(dst.end(), g.w.out.begin(), g.w.out.end());
      for (int64_t d : g.w.dilations) dil.push_back(d - 1);  // oneDNN's: 0 = dense
      p->user_src = memory::desc(src, dt::f32, plain);
      p->user_dst = memory::desc(dst, dt::f32, plain);
      const memory::desc user_w = user_weights(g), any_w(user_w.dims(), dt::f32, tag::any);
      const memory::desc bias_md({g.m}, dt::f32, tag::x);
      memory::desc src_md = blocked_ ? memory::desc(src, dt::f32, tag::any) : p->user_src;
      memory::desc dst_md = blocked_ ? memory::desc(dst, dt::f32, tag::any) : p->user_dst;
      dnnl::post_ops po;
      if (p->has_residual) po.append_sum(1.f);
      append_activation(*sig.node, po);
      dnnl::primitive_attr attr;
      attr.set_post_ops(po);
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      const auto prop = dnnl::prop_kind::forward_inference;
      const memory::dims strides = to_dnnl(g.w.strides), pl = to_dnnl(g.w.pad_l), pr = to_dnnl(g.w.pad_r);
      memory::desc weights_md;
      if (transpose_) {
        const auto alg = dnnl::algorithm::deconvolution_direct;
        auto d =
            p->has_bias
                ? dnnl::deconvolution_forward::desc(prop, alg, src_md, any_w, bias_md, dst_md, strides, dil, pl, pr)
                : dnnl::deconvolution_forward::desc(prop, alg, src_md, any_w, dst_md, strides, dil, pl, pr);
        dnnl::deconvolution_forward::primitive_desc pd(d, attr, eng);
        p->prim = dnnl::deconvolution_forward(pd);
        p->src_md = pd.src_desc(), p->dst_md = pd.dst_desc(), weights_md = pd.weights_desc();
        p->scratch_md = pd.scratchpad_desc();
      } else {
        const auto alg = dnnl::algorithm::convolution_direct;
        auto d = p->has_bias
                     ? dnnl::convolution_forward::desc(prop, alg, src_md, any_w, bias_md, dst_md, strides, dil, pl, pr)
                     : dnnl::convolution_forward::desc(prop, alg, src_md, any_w, dst_md, strides, dil, pl, pr);
        dnnl::convolution_forward::primitive_desc pd(d, attr, eng);
        p->prim = dnnl::convolution_forward(pd);
        p->src_md = pd.src_desc(), p->dst_md = pd.dst_desc(), weights_md = pd.weights_desc();
        p->scratch_md = pd.scratchpad_desc();
      }
      // The plain variant must not hide a reorder: oneDNN may still pick a layout for "any" only.
      if (p->src_md != p->user_src)
        p->src_in = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->user_src, eng, p->src_md));
      if (p->dst_md != p->user_dst) {
        p->dst_out = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->dst_md, eng, p->user_dst));
        if (p->has_residual)
          p->residual_in = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->user_dst, eng, p->dst_md));
      }
      p->weights = memory(weights_md, eng);
      reorder_into(user_w, sig.inputs[1].constant->raw(), weights_md, p->weights.get_data_handle());
      if (p->has_bias) {
        p->bias = memory(bias_md, eng);
        std::memcpy(p->bias.get_data_handle(), sig.inputs[2].constant->raw(), bias_md.get_size());
      }
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  // ConvTranspose's checks before the shapes are known: float32, X of 1 to 3 spatial dims, W a
  // constant of X's rank, B a constant.
  static std::string transpose_layer_unsupported(const LayerSignature& sig) {
    if (!sig.domain().empty() || sig.op() != "ConvTranspose") return "not a ConvTranspose";
    if (auto e = float32_cpu_layer(sig); !e.empty()) return e;
    if (!sig.has_input(0) || sig.inputs[0].shape.size() < 3 || sig.inputs[0].shape.size() > 5)
      return "not a 1-D, 2-D or 3-D ConvTranspose (X must be 3-D to 5-D)";
    if (!sig.has_input(1) || !sig.inputs[1].constant || sig.inputs[1].shape.size() != sig.inputs[0].shape.size())
      return "W is not a constant of X's rank";
    if (sig.has_input(2) && !sig.inputs[2].constant) return "B is not a constant";
    return "";
  }
  bool blocked_;
  size_t rank_;  // spatial dims (Conv)
  bool transpose_;
};

}  // namespace

const Tactic* conv2d_onednn_blocked() {
  static const OnednnConv t(true, 2, false);
  return &t;
}
const Tactic* conv1d_onednn_blocked() {
  static const OnednnConv t(true, 1, false);
  return &t;
}
const Tactic* conv1d_onednn_ncw() {
  static const OnednnConv t(false, 1, false);
  return &t;
}
const Tactic* conv3d_onednn_blocked() {
  static const OnednnConv t(true, 3, false);
  return &t;
}
const Tactic* conv3d_onednn_ncdhw() {
  static const OnednnConv t(false, 3, false);
  return &t;
}
const Tactic* convtranspose_onednn_blocked() {
  static const OnednnConv t(true, 0, true);
  return &t;
}
const Tactic* convtranspose_onednn_plain() {
  static const OnednnConv t(false, 0, true);
  return &t;
}

}  // namespace kiln::backends::cpu::onednn
#endif  // KILN_HAVE_ONEDNN
