// oneDNN 2-D pooling tactics for MaxPool (without the Indices output), AveragePool,
// GlobalAveragePool and GlobalMaxPool, on plain NCHW activations, and for kiln.BlockedPool (the same
// on channel-blocked activations, see ops/kiln_layout.h). ceil_mode stays on the reference
// kernel (ONNX's rule for the last window differs between opsets).
#if defined(KILN_HAVE_ONEDNN)
#include <algorithm>

#include "backends/cpu/onednn_common.h"
#include "backends/cpu/onednn_geometry.h"
#include "backends/cpu/onednn_tactics.h"

namespace kiln::backends::cpu::onednn {

bool is_global_pool(const std::string& op) { return op == "GlobalAveragePool" || op == "GlobalMaxPool"; }
bool is_max_pool(const std::string& op) { return op == "MaxPool" || op == "GlobalMaxPool"; }

std::string resolve_pool(const ir::Node& node, const std::string& op, const Dims& x, PoolGeometry& g) {
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  if (g.n <= 0 || g.c <= 0 || g.h <= 0 || g.w <= 0) return "empty tensors";
  if (is_global_pool(op)) {
    g.kh = g.h, g.kw = g.w, g.sh = g.sw = g.dh = g.dw = 1;
    g.pt = g.pl = g.pb = g.pr = 0;
    g.oh = g.ow = 1;
    return "";
  }
  auto ks = node.attr_ints("kernel_shape");
  if (ks.size() != 2) return "not a 2-D kernel";
  g.kh = ks[0], g.kw = ks[1];
  auto st = node.attr_ints("strides", {1, 1});
  auto dl = node.attr_ints("dilations", {1, 1});
  auto pads = node.attr_ints("pads", {0, 0, 0, 0});
  if (st.size() != 2 || dl.size() != 2 || pads.size() != 4) return "strides/dilations/pads are not 2-D";
  g.sh = st[0], g.sw = st[1], g.dh = dl[0], g.dw = dl[1];
  if (g.kh <= 0 || g.kw <= 0 || g.sh <= 0 || g.sw <= 0 || g.dh <= 0 || g.dw <= 0) return "non-positive sizes";
  // A dilated 1-wide window is the same window; oneDNN 2.6 rejects the dilation there.
  if (g.kh == 1) g.dh = 1;
  if (g.kw == 1) g.dw = 1;
  if (node.attr_int("ceil_mode", 0) != 0) return "ceil_mode";
  std::string ap = node.attr_string("auto_pad", "NOTSET");
  int64_t eh = (g.kh - 1) * g.dh + 1, ew = (g.kw - 1) * g.dw + 1;
  auto same = [](int64_t in, int64_t e, int64_t s, bool upper, int64_t& b, int64_t& en) {
    int64_t out = (in + s - 1) / s;
    int64_t total = std::max<int64_t>(0, (out - 1) * s + e - in);
    b = upper ? total / 2 : total - total / 2;
    en = total - b;
  };
  if (ap == "NOTSET") {
    g.pt = pads[0], g.pl = pads[1], g.pb = pads[2], g.pr = pads[3];
  } else if (ap == "VALID") {
    g.pt = g.pl = g.pb = g.pr = 0;
  } else if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    same(g.h, eh, g.sh, ap == "SAME_UPPER", g.pt, g.pb);
    same(g.w, ew, g.sw, ap == "SAME_UPPER", g.pl, g.pr);
  } else {
    return "auto_pad " + ap;
  }
  for (int64_t p : {g.pt, g.pl, g.pb, g.pr})
    if (p < 0) return "negative pads";
  if (std::max(g.pt, g.pb) >= eh || std::max(g.pl, g.pr) >= ew) return "a pad as large as the kernel";
  if (g.h + g.pt + g.pb < eh || g.w + g.pl + g.pr < ew) return "kernel larger than the padded input";
  g.oh = (g.h + g.pt + g.pb - eh) / g.sh + 1;
  g.ow = (g.w + g.pl + g.pr - ew) / g.sw + 1;
  return "";
}

namespace {

class PreparedPool : public PreparedLayer {
 public:
  std::string name;
  PoolGeometry g;
  int64_t block = 0;  // > 0: channel-blocked [N, C/block, H, W, block] in and out
  memory::desc src_md, dst_md, scratch_md;
  dnnl::pooling_v2_forward::primitive_desc pd;
  dnnl::pooling_v2_forward prim;

  std::vector<Dims> output_shapes() const override {
    if (block > 0) return {{g.n, g.c / block, g.oh, g.ow, block}};
    return {{g.n, g.c, g.oh, g.ow}};
  }
  Status run(const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) const override {
    return guarded(name, [&]() -> Status {
      auto& eng = cpu_engine();
      execute(prim, scratch_md,
              {{DNNL_ARG_SRC, memory(src_md, eng, const_cast<void*>(in[0]->raw()))},
               {DNNL_ARG_DST, memory(dst_md, eng, out[0]->raw())}});
      return Status::Ok();
    });
  }
};

// Plain: the ONNX pooling ops on NCHW. Blocked: kiln.BlockedPool on [N, Cb, H, W, B] (B = 8 or 16),
// pooled over all Cb * B channels (the zero padding lanes pool to zero, as the op requires).
class OnednnPool : public Tactic {
 public:
  explicit OnednnPool(bool blocked) : blocked_(blocked) {}
  std::string name() const override { return blocked_ ? "pool2d_onednn_nchwc" : "pool2d_onednn_nchw"; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    if (blocked_) return {{"kiln", "BlockedPool"}};
    return {{"", "MaxPool"}, {"", "AveragePool"}, {"", "GlobalAveragePool"}, {"", "GlobalMaxPool"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    const ir::Node& n = *sig.node;
    if (blocked_ ? sig.domain() != "kiln" || sig.op() != "BlockedPool" : !sig.domain().empty())
      return blocked_ ? "not a kiln.BlockedPool" : "not an ONNX pooling op";
    if (auto e = check_f32(sig); !e.empty()) return e;
    Dims x;
    if (auto e = plain_input(sig, &x); !e.empty()) return e;
    if (n.outputs.size() > 1 && !n.outputs[1].empty()) return "MaxPool's Indices output";
    if (sig.inputs[0].known()) {
      PoolGeometry g;
      return resolve_pool(n, op_of(sig), x, g);
    }
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedPool>();
    p->name = name();
    PoolGeometry& g = p->g;
    Dims x;
    plain_input(sig, &x);
    resolve_pool(*sig.node, op_of(sig), x, g);
    p->block = blocked_ ? sig.node->attr_int("block", 0) : 0;
    Status st = guarded(name(), [&]() -> Status {
      using A = dnnl::algorithm;
      A alg = is_max_pool(op_of(sig))                           ? A::pooling_max
              : sig.node->attr_int("count_include_pad", 0) != 0 ? A::pooling_avg_include_padding
                                                                : A::pooling_avg_exclude_padding;
      tag t = !blocked_ ? tag::nchw : p->block == 16 ? tag::nChw16c : tag::nChw8c;
      p->src_md = memory::desc({g.n, g.c, g.h, g.w}, dt::f32, t);
      p->dst_md = memory::desc({g.n, g.c, g.oh, g.ow}, dt::f32, t);
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, p->src_md, p->dst_md, {g.sh, g.sw},
                                       {g.kh, g.kw}, {g.dh - 1, g.dw - 1}, {g.pt, g.pl}, {g.pb, g.pr});
      p->pd = dnnl::pooling_v2_forward::primitive_desc(d, attr, cpu_engine());
      p->prim = dnnl::pooling_v2_forward(p->pd);
      p->scratch_md = p->pd.scratchpad_desc();
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  std::string op_of(const LayerSignature& sig) const { return blocked_ ? sig.node->attr_string("pool", "") : sig.op(); }
  // X as the pool sees it, [N, C, H, W] (blocked: C = Cb * B); dims may be -1.
  std::string plain_input(const LayerSignature& sig, Dims* x) const {
    if (!sig.has_input(0)) return "no X";
    const Dims& s = sig.inputs[0].shape;
    if (!blocked_) {
      if (s.size() != 4) return "not 2-D pooling (X must be 4-D)";
      *x = s;
      return "";
    }
    int64_t b = sig.node->attr_int("block", 0);
    if (b != 8 && b != 16) return "block " + std::to_string(b) + " (oneDNN has nChw8c and nChw16c)";
    if (s.size() != 5 || s[4] != b) return "X is not blocked by " + std::to_string(b);
    std::string op = op_of(sig);
    if (op != "MaxPool" && op != "AveragePool" && op != "GlobalAveragePool" && op != "GlobalMaxPool")
      return "pool '" + op + "'";
    *x = {s[0], s[1] < 0 ? -1 : s[1] * b, s[2], s[3]};
    return "";
  }
  bool blocked_;
};

}  // namespace

const Tactic* pool2d_onednn_nchw() {
  static const OnednnPool t(false);
  return &t;
}
const Tactic* pool2d_onednn_nchwc() {
  static const OnednnPool t(true);
  return &t;
}

}  // namespace kiln::backends::cpu::onednn
#endif  // KILN_HAVE_ONEDNN
