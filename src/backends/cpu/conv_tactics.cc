// kiln's own convolution tactics on NCHW activations, for Conv and kiln.FusedConv (bias, residual,
// activation fused into the store):
//   conv2d_kiln_1x1        1x1 kernel, no padding, one group: per image the GEMM
//                          Y[M, HW] = W[M, C] · X[C, HW] (W packed once, X read in place, or
//                          its sampled pixels gathered first when strided).
//   conv2d_kiln_depthwise  group == C == M (one filter per channel), any kernel, stride, pads and
//                          dilation (conv_depthwise.h).
// The window (kernel_shape, strides, pads, auto_pad, dilations) is resolved by the reference
// kernel's own code (ops/conv_util.h), so the output shape always matches it.
#include <cstdlib>
#include <vector>

#include "core/parallel.h"

#include "backends/cpu/conv_depthwise.h"
#include "backends/cpu/gemm_kernels.h"
#include "backends/cpu/kiln_tactics.h"
#include "backends/cpu/test_hooks.h"
#include "ops/conv_util.h"

namespace kiln::backends::cpu {

KernelTestHooks& kernel_test_hooks() {
  static KernelTestHooks hooks;
  return hooks;
}

namespace {

struct ConvGeometry {
  int64_t n, c, h, w, m, kh, kw, group, oh, ow;
  int64_t sh, sw, dh, dw, pt, pl, pb, pr;
};

// Conv's attributes for concrete input shapes; "" or why not.
std::string resolve(const ir::Node& node, const Dims& x, const Dims& wt, ConvGeometry& g) {
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.m = wt[0], g.kh = wt[2], g.kw = wt[3];
  g.group = node.attr_int("group", 1);
  if (g.group <= 0 || g.c % g.group != 0 || g.m % g.group != 0 || wt[1] * g.group != g.c)
    return "channels do not match the groups";
  auto win = ops::resolve_window(node, x, &wt);
  if (!win.ok()) return win.status().message();
  g.oh = win->out[0], g.ow = win->out[1];
  g.pt = win->pad_begin[0], g.pl = win->pad_begin[1], g.pb = win->pad_end[0], g.pr = win->pad_end[1];
  g.sh = win->strides[0], g.sw = win->strides[1], g.dh = win->dilations[0], g.dw = win->dilations[1];
  if (g.n <= 0 || g.c <= 0 || g.h <= 0 || g.w <= 0 || g.m <= 0 || g.oh <= 0 || g.ow <= 0) return "empty tensors";
  return "";
}

enum class Kind { k1x1, kDepthwise };

// Outputs above this size are written with non-temporal stores (half of a 32 MiB L3); tests lower
// it through kernel_test_hooks().
int64_t stream_threshold() {
  int64_t hook = kernel_test_hooks().stream_bytes;
  return hook >= 0 ? hook : int64_t{16} << 20;
}

class PreparedConv : public PreparedLayer {
 public:
  Kind kind = Kind::k1x1;
  Isa isa = Isa::kScalar;
  ConvGeometry g{};
  bool has_residual = false;
  std::vector<float> bias, weights;
  // 1x1: per image Y[M, HW] = W · X (packed_w), or, when HW fills the register tiles' columns
  // poorly (7x7, 14x14), Y^T[HW, M] = X^T · W^T (packed_wt) into a scratch transposed back with
  // the epilogue.
  bool transposed = false;
  int64_t stream_bytes = 0;
  PackedA packed_w;
  PackedB packed_wt;
  Activation act;

  std::vector<Dims> output_shapes() const override { return {{g.n, g.m, g.oh, g.ow}}; }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    const float* x = in[0]->data<float>();
    const float* res = has_residual ? in[3]->data<float>() : nullptr;
    float* y = out[0]->data<float>();
    if (kind == Kind::kDepthwise) {
      DepthwiseConv p;
      p.batch = g.n, p.channels = g.c;
      p.g = {g.h, g.w, g.oh, g.ow, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.pt, g.pl};
      p.weights = weights.data();
      p.bias = bias.empty() ? nullptr : bias.data();
      p.act = act;
      depthwise_conv(isa, p, x, res, y);
      return Status::Ok();
    }
    // Strided: each image's sampled pixels first, gathered into [C, OH * OW].
    const int64_t hw = g.oh * g.ow, in_hw = g.h * g.w;
    const bool strided = g.sh != 1 || g.sw != 1;
    // An output much larger than the last-level cache goes to memory anyway: stream it there.
    const bool stream_output = g.n * g.m * hw * static_cast<int64_t>(sizeof(float)) > stream_bytes;
    float* sampled = strided ? thread_scratch(3, static_cast<size_t>(g.c * hw)) : nullptr;
    float* t = transposed ? thread_scratch(2, static_cast<size_t>(hw * g.m)) : nullptr;
    for (int64_t i = 0; i < g.n; ++i) {
      const float* xi = x + i * g.c * in_hw;
      if (strided) {
        parallel_for(g.c, 16, [&](int64_t begin, int64_t end) {
          for (int64_t c = begin; c < end; ++c)
            for (int64_t oh = 0; oh < g.oh; ++oh) {
              const float* src = xi + c * in_hw + oh * g.sh * g.w;
              float* dst = sampled + c * hw + oh * g.ow;
              for (int64_t ow = 0; ow < g.ow; ++ow) dst[ow] = src[ow * g.sw];
            }
        });
        xi = sampled;
      }
      GemmArgs a;
      if (transposed) {
        a.m = hw, a.n = g.m, a.k = g.c;
        a.a = xi, a.rsa = 1, a.csa = hw;
        a.packed_b = &packed_wt;
        a.c = t, a.ldc = g.m;
        gemm(isa, a);
        transpose_epilogue(isa, t, hw, g.m, g.m, y + i * g.m * hw, hw, bias.empty() ? nullptr : bias.data(),
                           res ? res + i * g.m * hw : nullptr, hw, act);
        continue;
      }
      a.m = g.m, a.n = hw, a.k = g.c;
      a.packed_a = &packed_w;
      a.b = xi, a.ldb = hw;
      a.c = y + i * g.m * hw, a.ldc = hw;
      a.epi.row_bias = bias.empty() ? nullptr : bias.data();
      if (res) a.epi.residual = res + i * g.m * hw, a.epi.ld_residual = hw;
      a.epi.act = act;
      a.epi.stream = stream_output;
      gemm(isa, a);
    }
    return Status::Ok();
  }
};

class KilnConv : public Tactic {
 public:
  explicit KilnConv(Kind kind) : kind_(kind) {}
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return kind_ == Kind::k1x1 ? "conv2d_kiln_1x1" : "conv2d_kiln_depthwise"; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "Conv"}, {"kiln", "FusedConv"}};
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = conv2d_layer_unsupported(sig); !e.empty()) return e;
    const Dims& w = sig.inputs[1].shape;
    Activation act;
    if (auto e = parse_activation(*sig.node, &act); !e.empty()) return e;
    int64_t group = sig.node->attr_int("group", 1);
    if (kind_ == Kind::k1x1) {
      if (w[2] != 1 || w[3] != 1) return "not a 1x1 kernel";
      if (group != 1) return "grouped";
    } else if (group != w[0] || w[1] != 1) {
      return "not depthwise (group == C == M)";
    }
    if (sig.inputs[0].known()) {
      ConvGeometry g;
      if (auto e = resolve(*sig.node, sig.inputs[0].shape, w, g); !e.empty()) return e;
      if (kind_ == Kind::k1x1 && (g.pt || g.pl || g.pb || g.pr)) return "padded";
      if (kind_ == Kind::kDepthwise && g.c != g.m) return "not depthwise (group == C == M)";
      if (auto e = residual_unsupported(sig, {g.n, g.m, g.oh, g.ow}); !e.empty()) return e;
    }
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedConv>();
    p->kind = kind_;
    p->isa = cpu_isa(sig.isa);
    resolve(*sig.node, sig.inputs[0].shape, sig.inputs[1].shape, p->g);
    parse_activation(*sig.node, &p->act);
    p->has_residual = sig.has_input(3);
    if (auto e = residual_unsupported(sig, {p->g.n, p->g.m, p->g.oh, p->g.ow}); !e.empty())
      return Unsupported(name(), ": ", e);
    if (sig.has_input(2)) {
      const Tensor& b = *sig.inputs[2].constant;
      p->bias.assign(b.data<float>(), b.data<float>() + b.numel());
    }
    const Tensor& w = *sig.inputs[1].constant;
    if (kind_ == Kind::k1x1) {
      p->stream_bytes = stream_threshold();
      const int64_t hw = p->g.oh * p->g.ow, nr = gemm_tile(p->isa).nr;
      // The columns the tiles of the direct form compute, per useful one.
      const double waste = static_cast<double>((hw + nr - 1) / nr * nr) / static_cast<double>(hw);
      p->transposed = waste > 1.12 && p->g.m >= nr;
      if (int hook = kernel_test_hooks().conv1x1_transposed; hook >= 0) p->transposed = hook == 1;
      if (p->transposed)
        p->packed_wt = pack_b(p->isa, w.data<float>(), p->g.c, p->g.m, 1, p->g.c, 1.f);
      else
        p->packed_w = pack_a(p->isa, w.data<float>(), p->g.m, p->g.c, p->g.c, 1, 1.f);
    } else
      p->weights.assign(w.data<float>(), w.data<float>() + w.numel());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  Kind kind_;
};

}  // namespace

const Tactic* conv2d_kiln_1x1() {
  static const KilnConv t(Kind::k1x1);
  return &t;
}
const Tactic* conv2d_kiln_depthwise() {
  static const KilnConv t(Kind::kDepthwise);
  return &t;
}

}  // namespace kiln::backends::cpu
