// conv2d_onednn_nchwc_dw: kiln.BlockedConvDw (src/passes/layout_fuse_dw.cc) on oneDNN: the 1x1
// convolution with the depthwise 3x3 convolution as its post-op (dw_k3s1p1 / dw_k3s2p1), so the
// wide intermediate is computed a few rows at a time and consumed from cache. Measured on
// mobilenet_v2's first expansion (16 -> 96 channels, 112x112, depthwise stride 2) at batch 8:
// 7.0 ms as two layers, 4.6 ms fused; at batch 1, 0.50 vs 0.49 ms.
//
// When oneDNN has no fused kernel for a layer (an activation its post-op chain rejects, an output
// layout it would change), the tactic runs the two convolutions itself through a per-thread
// intermediate buffer: the layer never falls back to the reference kernel.
#if defined(KILN_HAVE_ONEDNN)
#include <cstring>

#include "backends/cpu/onednn_common.h"
#include "backends/cpu/onednn_geometry.h"
#include "backends/cpu/onednn_tactics.h"

namespace kiln::backends::cpu::onednn {
namespace {

// The attributes of one of the two convolutions as a node of its own (the depthwise one's are
// prefixed "dw.").
ir::Node part(const ir::Node& n, bool dw) {
  ir::Node p;
  p.name = n.name;
  p.op_type = "BlockedConv";
  p.domain = "kiln";
  p.opset = 1;
  for (const auto& [k, v] : n.attrs) {
    bool is_dw = k.rfind("dw.", 0) == 0;
    if (dw && is_dw) p.attrs[k.substr(3)] = v;
    if (!dw && !is_dw && k.rfind("kiln.", 0) != 0) p.attrs[k] = v;
  }
  return p;
}

class PreparedConvDw : public PreparedLayer {
 public:
  std::string name;
  int64_t block = 16;
  ConvGeometry g1, g2;  // the 1x1 and the depthwise convolution
  bool fused = false;
  memory::desc x_md, mid_md, y_md, scratch1, scratch2;
  size_t mid_bytes = 0;
  dnnl::convolution_forward prim1, prim2;  // fused: prim1 does both
  memory w1, b1, w2, b2;

  std::vector<Dims> output_shapes() const override { return {{g2.n, (g2.m + block - 1) / block, g2.oh, g2.ow, block}}; }
  // Unfused: the 1x1 convolution's output; then each primitive's scratchpad.
  size_t workspace_bytes(int) const override {
    return workspace_piece(fused ? 0 : mid_bytes) + workspace_piece(scratch1.get_size()) +
           workspace_piece(fused ? 0 : scratch2.get_size());
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return guarded(name, [&]() -> Status {
      auto& eng = cpu_engine();
      memory x(x_md, eng, const_cast<void*>(in[0]->raw())), y(y_md, eng, out[0]->raw());
      WorkspaceSlicer ws(ctx);
      void* mid_buf = ws.take(fused ? 0 : mid_bytes);
      void* s1 = ws.take(scratch1.get_size());
      void* s2 = ws.take(fused ? 0 : scratch2.get_size());
      if (fused) {
        execute(prim1, scratch1, s1,
                {{DNNL_ARG_SRC, x},
                 {DNNL_ARG_WEIGHTS, w1},
                 {DNNL_ARG_BIAS, b1},
                 {DNNL_ARG_DST, y},
                 {DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS, w2},
                 {DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS, b2}});
        return Status::Ok();
      }
      memory mid(mid_md, eng, mid_buf);
      execute(prim1, scratch1, s1,
              {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w1}, {DNNL_ARG_BIAS, b1}, {DNNL_ARG_DST, mid}});
      execute(prim2, scratch2, s2,
              {{DNNL_ARG_SRC, mid}, {DNNL_ARG_WEIGHTS, w2}, {DNNL_ARG_BIAS, b2}, {DNNL_ARG_DST, y}});
      return Status::Ok();
    });
  }
};

class OnednnConvDw : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return "conv2d_onednn_nchwc_dw"; }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "BlockedConvDw"}}; }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.domain() != "kiln" || sig.op() != "BlockedConvDw") return "not a kiln.BlockedConvDw";
    if (auto e = check_f32(sig); !e.empty()) return e;
    const ir::Node& n = *sig.node;
    const int64_t b = n.attr_int("block", 0);
    if (b != 8 && b != 16) return "block " + std::to_string(b);
    for (size_t i : {size_t{1}, size_t{3}})
      if (!sig.has_input(i) || !sig.inputs[i].constant || sig.inputs[i].shape.size() != 4)
        return "weights are not 4-D constants";
    const Dims &w1 = sig.inputs[1].shape, &w2 = sig.inputs[3].shape;
    if (w1[2] != 1 || w1[3] != 1 || w2[1] != 1 || w2[2] != 3 || w2[3] != 3 || w2[0] != w1[0])
      return "not a 1x1 conv into a 3x3 depthwise conv of its channels";
    for (size_t i : {size_t{2}, size_t{4}})
      if (sig.has_input(i) && (!sig.inputs[i].constant || sig.inputs[i].constant->numel() != w1[0]))
        return "a bias is not a constant of M elements";
    ir::Node p1 = part(n, false), p2 = part(n, true);
    if (p1.attr_int("group", 1) != 1 || p2.attr_int("group", 1) != w1[0]) return "groups";
    if (!activation_supported(p1) || !activation_supported(p2)) return "activation has no oneDNN eltwise";
    const Dims& x = sig.inputs[0].shape;
    if (x.size() != 5 || x[4] != b || (x[1] >= 0 && x[1] != (w1[1] + b - 1) / b))
      return "X is not " + std::to_string(w1[1]) + " channels blocked by " + std::to_string(b);
    if (sig.inputs[0].known()) {
      ConvGeometry g1, g2;
      if (auto e = resolve(sig, p1, p2, &g1, &g2); !e.empty()) return e;
    }
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedConvDw>();
    p->name = name();
    const ir::Node& n = *sig.node;
    p->block = n.attr_int("block", 16);
    ir::Node p1 = part(n, false), p2 = part(n, true);
    resolve(sig, p1, p2, &p->g1, &p->g2);
    const ConvGeometry &g1 = p->g1, &g2 = p->g2;
    Status st = guarded(name(), [&]() -> Status {
      auto& eng = cpu_engine();
      const tag bt = p->block == 16 ? tag::nChw16c : tag::nChw8c;
      p->x_md = memory::desc({g1.n, g1.c, g1.h, g1.w}, dt::f32, bt);
      p->mid_md = memory::desc({g1.n, g1.m, g1.oh, g1.ow}, dt::f32, bt);
      p->y_md = memory::desc({g2.n, g2.m, g2.oh, g2.ow}, dt::f32, bt);
      memory::desc w1_user({g1.m, g1.c, 1, 1}, dt::f32, tag::oihw), w1_any({g1.m, g1.c, 1, 1}, dt::f32, tag::any);
      memory::desc w2_user({g2.m, 1, 1, 3, 3}, dt::f32, tag::goihw), w2_any({g2.m, 1, 1, 3, 3}, dt::f32, tag::any);
      memory::desc bias_md({g1.m}, dt::f32, tag::x);
      auto desc1 =
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                          p->x_md, w1_any, bias_md, p->mid_md, {1, 1}, {0, 0}, {0, 0});
      auto attr_with = [](dnnl::post_ops po) {
        dnnl::primitive_attr a;
        a.set_post_ops(po);
        a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        return a;
      };
      // Fused: act1, the depthwise conv, act2 as post-ops of the 1x1 conv.
      try {
        dnnl::post_ops po;
        append_activation(p1, po);
        if (g2.sh == 1)
          po.append_dw_k3s1p1(dt::f32, dt::f32, dt::f32, 0, {});
        else
          po.append_dw_k3s2p1(dt::f32, dt::f32, dt::f32, 0, {});
        append_activation(p2, po);
        dnnl::convolution_forward::primitive_desc pd(desc1, attr_with(po), eng);
        std::string impl = pd.impl_info_str();
        if (pd.dst_desc() == p->y_md && impl.rfind("ref", 0) != 0) {
          p->prim1 = dnnl::convolution_forward(pd);
          p->scratch1 = pd.scratchpad_desc();
          p->w1 = memory(pd.weights_desc(), eng);
          reorder_into(w1_user, sig.inputs[1].constant->raw(), pd.weights_desc(), p->w1.get_data_handle());
          auto w2_md = pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS);
          p->w2 = memory(w2_md, eng);
          reorder_into(w2_user, sig.inputs[3].constant->raw(), w2_md, p->w2.get_data_handle());
          p->fused = true;
        }
      } catch (const dnnl::error&) {
        p->fused = false;
      }
      if (!p->fused) {  // two primitives through an intermediate buffer
        dnnl::post_ops po1, po2;
        append_activation(p1, po1);
        append_activation(p2, po2);
        dnnl::convolution_forward::primitive_desc pd1(desc1, attr_with(po1), eng);
        auto desc2 = dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                     dnnl::algorithm::convolution_direct, p->mid_md, w2_any, bias_md,
                                                     p->y_md, {g2.sh, g2.sw}, {0, 0}, {g2.pt, g2.pl}, {g2.pb, g2.pr});
        dnnl::convolution_forward::primitive_desc pd2(desc2, attr_with(po2), eng);
        p->prim1 = dnnl::convolution_forward(pd1);
        p->prim2 = dnnl::convolution_forward(pd2);
        p->scratch1 = pd1.scratchpad_desc();
        p->scratch2 = pd2.scratchpad_desc();
        p->mid_bytes = p->mid_md.get_size();
        p->w1 = memory(pd1.weights_desc(), eng);
        reorder_into(w1_user, sig.inputs[1].constant->raw(), pd1.weights_desc(), p->w1.get_data_handle());
        p->w2 = memory(pd2.weights_desc(), eng);
        reorder_into(w2_user, sig.inputs[3].constant->raw(), pd2.weights_desc(), p->w2.get_data_handle());
      }
      for (int k = 0; k < 2; ++k) {  // biases (zeros when absent)
        memory& m = k == 0 ? p->b1 : p->b2;
        m = memory(bias_md, eng);
        size_t in = k == 0 ? 2 : 4;
        if (sig.has_input(in))
          std::memcpy(m.get_data_handle(), sig.inputs[in].constant->raw(), static_cast<size_t>(g1.m) * 4);
        else
          std::memset(m.get_data_handle(), 0, static_cast<size_t>(g1.m) * 4);
      }
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  // Both convolutions' geometry at the signature's (known) shapes; "" or why not.
  static std::string resolve(const LayerSignature& sig, const ir::Node& p1, const ir::Node& p2, ConvGeometry* g1,
                             ConvGeometry* g2) {
    const Dims& xs = sig.inputs[0].shape;
    const Dims &w1 = sig.inputs[1].shape, &w2 = sig.inputs[3].shape;
    Dims x = {xs[0], w1[1], xs[2], xs[3]};
    if (auto e = resolve_conv(p1, x, w1, *g1); !e.empty()) return e;
    if (g1->sh != 1 || g1->sw != 1 || g1->pt || g1->pl || g1->pb || g1->pr || g1->dh != 1 || g1->dw != 1)
      return "the 1x1 conv is strided or padded";
    if (auto e = resolve_conv(p2, {g1->n, g1->m, g1->oh, g1->ow}, w2, *g2); !e.empty()) return e;
    if (g2->sh != g2->sw || (g2->sh != 1 && g2->sh != 2) || g2->pt != 1 || g2->pl != 1 || g2->pb != 1 || g2->pr != 1 ||
        g2->dh != 1 || g2->dw != 1)
      return "the depthwise conv is not 3x3 stride 1 or 2 with pads 1";
    return "";
  }
};

}  // namespace

const Tactic* conv2d_onednn_nchwc_dw() {
  static const OnednnConvDw t;
  return &t;
}

}  // namespace kiln::backends::cpu::onednn
#endif  // KILN_HAVE_ONEDNN
