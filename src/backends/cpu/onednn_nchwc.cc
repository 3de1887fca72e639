// oneDNN tactics on channel-blocked activations (ops/kiln_layout.h: [N, Cb, H, W, B], which is
// oneDNN's nChw16c / nChw8c byte for byte), the layers src/passes/layout_blocked.cc makes:
//
//   conv2d_onednn_nchwc            kiln.BlockedConv, direct algorithm: blocked (or, for a first
//                                  layer, plain NCHW) X in, blocked Y out, no activation reorders;
//                                  group 1, depthwise, or groups of whole blocks (ResNeXt's later
//                                  stages, RegNet);
//                                  the residual is added by a binary post-op that reads it in place
//   conv2d_onednn_nchwc_winograd   the same with oneDNN's Winograd F(2x2,3x3) / F(4x4,3x3) kernels
//                                  for 3x3, stride 1 convs (group 1, channels multiples of 16, no
//                                  activation or ReLU: its only eltwise post-op): 2-3x
//                                  fewer multiplications; rounding error within the tactic test's
//                                  tolerance (measured against a double reference on resnet50's
//                                  3x3 layers: at most 1.2e-4 absolute on outputs up to 85)
//   conv2d_onednn_nchwc_single_thread  the direct algorithm on one thread, for layers of at most
//                                  64K output floats (squeeze-excite FCs, late 7x7 layers at
//                                  batch 1): timed against the threaded one, it wins where a
//                                  parallel region costs more than the split saves
//   conv2d_onednn_nchwc_kiln_act   the direct algorithm with the activation (SiLU, GELU, Tanh)
//                                  applied by kiln's vector code over the output after oneDNN's
//                                  conv: measured on efficientnet_b0 (one thread), oneDNN's
//                                  depthwise kernel with a swish post-op took 290 us on 32 x 112 x 112
//                                  where ORT's conv + separate SiLU take 126 us; timed against it
//   reorder_onednn_nchwc           kiln.ReorderToBlocked / kiln.ReorderFromBlocked
//
// Weights are reordered once, at prepare. oneDNN writes zeros into the padding lanes of blocked
// outputs (the blocked ops require it; the tactic test checks it with activations where f(0) != 0).
#if defined(KILN_HAVE_ONEDNN)
#include <cstring>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/gemm_kernels.h"
#include "backends/cpu/kernel_simd.h"
#include "backends/cpu/onednn_common.h"
#include "backends/cpu/onednn_geometry.h"
#include "backends/cpu/onednn_tactics.h"
#include "core/parallel.h"

namespace kiln::backends::cpu::onednn {
namespace {

std::string check_block(int64_t b) {
  return b == 8 || b == 16 ? "" : "block " + std::to_string(b) + " (oneDNN has nChw8c and nChw16c)";
}
tag blocked_tag(int64_t b) { return b == 16 ? tag::nChw16c : tag::nChw8c; }

// oneDNN's f32 Winograd kernels are AVX-512 (avx512_core) only.
bool has_winograd_isa() {
  static const bool yes = [] {
    auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    auto need = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
    return (isa & need) == need;
  }();
  return yes;
}

// The dims of a memory desc as the tensor stores them: [N, C, H, W] (plain) or [N, Cb, H, W, B].
Dims tensor_dims(const memory::desc& md, int64_t block) {
  auto d = md.dims();
  if (block <= 0) return Dims(d.begin(), d.end());
  return {d[0], channel_blocks(d[1], block), d[2], d[3], block};
}

class PreparedBlockedConv : public PreparedLayer {
 public:
  std::string name;
  ConvGeometry g;
  int64_t block = 0;
  bool has_bias = false, has_residual = false, residual_by_sum = false;
  memory::desc x_md;        // X as given: plain nchw or blocked
  memory::desc src_md;      // X as the primitive reads it
  memory::desc dst_md;      // blocked
  memory::desc scratch_md;  // queried once: run() makes no oneDNN queries
  bool reorder_src = false;
  int thread_cap = 1 << 20;  // 1: created and run on one thread
  Activation kiln_act;       // applied after the primitive (kind none: in its post-ops, or none)
  Isa isa = Isa::kScalar;
  size_t src_bytes = 0, dst_bytes = 0;
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  dnnl::reorder src_in;  // plain X -> the layout the primitive chose, when they differ
  memory weights, bias;

  std::vector<Dims> output_shapes() const override { return {tensor_dims(dst_md, block)}; }
  // X in the primitive's layout when it differs, the scratchpad.
  size_t workspace_bytes(int) const override {
    return workspace_piece(reorder_src ? src_bytes : 0) + workspace_piece(scratch_md.get_size());
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return guarded(name, [&]() -> Status {
      ThreadCapScope cap(thread_cap);
      auto& eng = cpu_engine();
      WorkspaceSlicer ws(ctx);
      void* src = const_cast<void*>(in[0]->raw());
      void* src_tmp = ws.take(reorder_src ? src_bytes : 0);
      void* scratch = ws.take(scratch_md.get_size());
      if (reorder_src) {
        void* tmp = src_tmp;
        memory a(x_md, eng, src), b(src_md, eng, tmp);
        src_in.execute(thread_stream(), {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}});
        src = tmp;
      }
      void* dst = out[0]->raw();
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src_md, eng, src)},
                                           {DNNL_ARG_WEIGHTS, weights},
                                           {DNNL_ARG_DST, memory(dst_md, eng, dst)}};
      if (has_bias) args.emplace(DNNL_ARG_BIAS, bias);
      if (has_residual) {
        void* r = const_cast<void*>(in[3]->raw());
        if (residual_by_sum) {  // copied over the output, in parallel like the rest of the layer
          auto* d = static_cast<uint8_t*>(dst);
          const auto* from = static_cast<const uint8_t*>(r);
          parallel_for(static_cast<int64_t>(dst_bytes), 1 << 16,
                       [&](int64_t b, int64_t e) { std::memcpy(d + b, from + b, static_cast<size_t>(e - b)); });
        } else {
          args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, memory(dst_md, eng, r));
        }
      }
      execute(prim, scratch_md, scratch, std::move(args));
      if (kiln_act.kind != ActKind::kNone) {  // f(0) = 0: the padding lanes stay zero
        float* y = static_cast<float*>(dst);
        parallel_for(static_cast<int64_t>(dst_bytes / sizeof(float)), 1 << 15,
                     [&](int64_t b, int64_t e) { activate_inplace(isa, y + b, e - b, kiln_act); });
      }
      return Status::Ok();
    });
  }
};

class OnednnBlockedConv : public Tactic {
 public:
  OnednnBlockedConv(bool winograd, bool single_thread, bool kiln_act = false)
      : winograd_(winograd), single_thread_(single_thread), kiln_act_(kiln_act) {}
  // oneDNN's f32 Winograd is AVX-512 only: a target without it declines the tactic up front.
  TacticInfo info() const override { return TacticInfo::cpu_f32(winograd_ ? kIsaAvx512 : kIsaPortable); }
  std::string name() const override {
    if (kiln_act_) return "conv2d_onednn_nchwc_kiln_act";
    return winograd_ ? "conv2d_onednn_nchwc_winograd"
                     : (single_thread_ ? "conv2d_onednn_nchwc_single_thread" : "conv2d_onednn_nchwc");
  }
  // 2: grouped convs whose groups are whole blocks.
  int revision() const override { return 2; }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "BlockedConv"}}; }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.domain() != "kiln" || sig.op() != "BlockedConv") return "not a kiln.BlockedConv";
    if (auto e = check_f32(sig); !e.empty()) return e;
    const int64_t b = sig.node->attr_int("block", 0);
    if (auto e = check_block(b); !e.empty()) return e;
    if (!sig.has_input(1) || !sig.inputs[1].constant || sig.inputs[1].shape.size() != 4)
      return "W is not a 4-D constant";
    const Dims& w = sig.inputs[1].shape;
    if (sig.has_input(2) && (!sig.inputs[2].constant || sig.inputs[2].constant->numel() != w[0]))
      return "B is not a constant of M elements";
    if (!activation_supported(*sig.node)) return "activation has no oneDNN eltwise";
    if (kiln_act_) {
      const std::string act = sig.node->attr_string("activation", "");
      if (act != "SiLU" && act != "Gelu" && act != "Tanh") return "kiln activation: not SiLU, Gelu or Tanh";
      Activation a;
      if (auto e = parse_activation(*sig.node, &a); !e.empty()) return "kiln activation: " + e;
    }
    const int64_t group = sig.node->attr_int("group", 1), c = w[1] * group;
    // Grouped: oneDNN's blocked kernels take groups of whole blocks (else its reference kernel).
    if (!(group == 1 || (group == c && group == w[0]) || ((c / group) % b == 0 && (w[0] / group) % b == 0)))
      return "grouped conv whose groups are not whole blocks of " + std::to_string(b) + " channels";
    Dims x;
    if (auto e = conv_plain_x(sig, c, &x); !e.empty()) return e;
    if (sig.has_input(3) && (sig.inputs[3].shape.size() != 5 || sig.inputs[3].shape[4] != b))
      return "the residual is not blocked";
    if (winograd_) {
      if (!has_winograd_isa()) return "Winograd: oneDNN has it for AVX-512 only";
      if (group != 1 || w[2] != 3 || w[3] != 3) return "Winograd: not a 3x3 group-1 conv";
      auto st = sig.node->attr_ints("strides", {1, 1}), dl = sig.node->attr_ints("dilations", {1, 1});
      if (st != std::vector<int64_t>{1, 1} || dl != std::vector<int64_t>{1, 1}) return "Winograd: stride or dilation";
      // oneDNN's Winograd kernels take whole blocks of 16 channels only.
      if (c % 16 != 0 || w[0] % 16 != 0 || b != 16) return "Winograd: channels not multiples of 16";
      if (x.size() != 4 || sig.inputs[0].shape.size() != 5) return "Winograd: X not blocked";
      // Its post-ops: sum and ReLU only (oneDNN 2.6); the residual goes in by sum.
      std::string act = sig.node->attr_string("activation", "");
      if (!act.empty() && act != "Relu") return "Winograd: activation " + act + " (it has ReLU only)";
    }
    if (single_thread_ && !sig.inputs[0].known()) return "one thread: the layer's size is not known";
    if (sig.inputs[0].known()) {
      ConvGeometry g;
      if (auto e = resolve_conv(*sig.node, x, w, g); !e.empty()) return e;
      if (single_thread_ && g.n * g.m * g.oh * g.ow > kSingleThreadMaxOutput)
        return "one thread: more than " + std::to_string(kSingleThreadMaxOutput) + " output floats";
      if (sig.has_input(3) && sig.inputs[3].known() &&
          sig.inputs[3].shape != Dims{g.n, channel_blocks(g.m, b), g.oh, g.ow, b})
        return "the residual is not the output's blocked shape";
    }
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedBlockedConv>();
    p->name = name();
    p->block = sig.node->attr_int("block", 0);
    ConvGeometry& g = p->g;
    const Dims& wdims = sig.inputs[1].shape;
    Dims x;
    conv_plain_x(sig, wdims[1] * sig.node->attr_int("group", 1), &x);
    resolve_conv(*sig.node, x, wdims, g);
    p->has_bias = sig.has_input(2);
    p->has_residual = sig.has_input(3);
    if (single_thread_) p->thread_cap = 1;
    // kiln_act: the primitive without the activation, which run() applies after it.
    ir::Node epilogue = *sig.node;
    if (kiln_act_) {
      parse_activation(*sig.node, &p->kiln_act);
      p->isa = backends::cpu::cpu_isa(sig.isa);
      for (auto it = epilogue.attrs.begin(); it != epilogue.attrs.end();)
        it = it->first.rfind("activation", 0) == 0 ? epilogue.attrs.erase(it) : std::next(it);
    }
    const bool plain_src = sig.inputs[0].shape.size() == 4;
    Status st = guarded(name(), [&]() -> Status {
      ThreadCapScope cap(p->thread_cap);  // oneDNN sizes its thread partition here
      auto& eng = cpu_engine();
      const tag bt = blocked_tag(p->block);
      p->x_md = memory::desc({g.n, g.c, g.h, g.w}, dt::f32, plain_src ? tag::nchw : bt);
      p->dst_md = memory::desc({g.n, g.m, g.oh, g.ow}, dt::f32, bt);
      const ConvDescs cd(g);
      auto alg = winograd_ ? dnnl::algorithm::convolution_winograd : dnnl::algorithm::convolution_direct;
      // The residual: a binary add post-op reading it where it lies; kernels without binary
      // post-ops (Winograd) take a sum post-op over a copy of it in the output instead.
      auto make_pd = [&](const memory::desc& src_md, bool by_sum) {
        auto d = cd.desc(alg, src_md, p->dst_md, p->has_bias);
        dnnl::post_ops po;
        if (p->has_residual && by_sum) po.append_sum(1.f);
        if (p->has_residual && !by_sum) po.append_binary(dnnl::algorithm::binary_add, p->dst_md);
        append_activation(epilogue, po);
        dnnl::primitive_attr attr;
        attr.set_post_ops(po);
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        return dnnl::convolution_forward::primitive_desc(d, attr, eng);
      };
      auto make_pd_any_residual = [&](const memory::desc& src_md) {
        try {
          p->residual_by_sum = false;
          return make_pd(src_md, false);
        } catch (const dnnl::error&) {
          if (!p->has_residual) throw;
          p->residual_by_sum = true;
          return make_pd(src_md, true);
        }
      };
      // A plain X: oneDNN's first-layer kernels read NCHW directly when it has few channels
      // ("any" lets it say so); when that finds only the reference implementation (e.g. dilated),
      // run() reorders X into the blocked layout instead.
      p->pd = make_pd_any_residual(plain_src ? memory::desc(p->x_md.dims(), dt::f32, tag::any) : p->x_md);
      if (plain_src && std::string(p->pd.impl_info_str()).rfind("ref", 0) == 0)
        p->pd = make_pd_any_residual(memory::desc(p->x_md.dims(), dt::f32, bt));
      p->prim = dnnl::convolution_forward(p->pd);
      p->src_md = p->pd.src_desc();
      p->scratch_md = p->pd.scratchpad_desc();
      p->src_bytes = p->src_md.get_size();
      p->dst_bytes = p->dst_md.get_size();
      p->reorder_src = p->src_md != p->x_md;
      if (p->reorder_src) p->src_in = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->x_md, eng, p->pd.src_desc()));
      cd.load_constants(sig, p->pd, p->has_bias, &p->weights, &p->bias);
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  static constexpr int64_t kSingleThreadMaxOutput = int64_t{1} << 16;
  bool winograd_, single_thread_, kiln_act_;
};

// ---- kiln.ReorderToBlocked / kiln.ReorderFromBlocked ----

class PreparedReorder : public PreparedLayer {
 public:
  std::string name;
  memory::desc from, to;
  int64_t out_block = 0;  // > 0: the output is blocked
  dnnl::reorder prim;

  std::vector<Dims> output_shapes() const override { return {tensor_dims(to, out_block)}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return guarded(name, [&]() -> Status {
      auto& eng = cpu_engine();
      memory a(from, eng, const_cast<void*>(in[0]->raw())), b(to, eng, out[0]->raw());
      prim.execute(thread_stream(), {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}});
      thread_stream().wait();
      return Status::Ok();
    });
  }
};

class OnednnReorder : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return "reorder_onednn_nchwc"; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"kiln", "ReorderToBlocked"}, {"kiln", "ReorderFromBlocked"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    bool to = sig.op() == "ReorderToBlocked";
    if (sig.domain() != "kiln" || (!to && sig.op() != "ReorderFromBlocked")) return "not a kiln reorder";
    if (auto e = check_f32(sig); !e.empty()) return e;
    const int64_t b = sig.node->attr_int("block", 0);
    if (auto e = check_block(b); !e.empty()) return e;
    if (!sig.has_input(0)) return "no input";
    const Dims& s = sig.inputs[0].shape;
    if (to && s.size() != 4) return "X is not 4-D";
    if (!to) {
      int64_t c = sig.node->attr_int("channels", -1);
      if (s.size() != 5 || s[4] != b || c < 0 || (s[1] >= 0 && s[1] != channel_blocks(c, b)))
        return "Y is not 'channels' channels blocked by 'block'";
    }
    for (int64_t d : s)
      if (d == 0) return "empty tensor";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedReorder>();
    p->name = name();
    const bool to = sig.op() == "ReorderToBlocked";
    const int64_t b = sig.node->attr_int("block", 0);
    const Dims& s = sig.inputs[0].shape;
    memory::dims dims{s[0], to ? s[1] : sig.node->attr_int("channels", 0), s[2], s[3]};
    Status st = guarded(name(), [&]() -> Status {
      memory::desc plain(dims, dt::f32, tag::nchw), blocked(dims, dt::f32, blocked_tag(b));
      p->from = to ? plain : blocked;
      p->to = to ? blocked : plain;
      p->out_block = to ? b : 0;
      p->prim = dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), p->from, cpu_engine(), p->to));
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

}  // namespace

const Tactic* conv2d_onednn_nchwc() {
  static const OnednnBlockedConv t(false, false);
  return &t;
}
const Tactic* conv2d_onednn_nchwc_winograd() {
  static const OnednnBlockedConv t(true, false);
  return &t;
}
const Tactic* conv2d_onednn_nchwc_single_thread() {
  static const OnednnBlockedConv t(false, true);
  return &t;
}
const Tactic* conv2d_onednn_nchwc_kiln_act() {
  static const OnednnBlockedConv t(false, false, true);
  return &t;
}
const Tactic* reorder_onednn_nchwc() {
  static const OnednnReorder t;
  return &t;
}

}  // namespace kiln::backends::cpu::onednn
#endif  // KILN_HAVE_ONEDNN
