// oneDNN 2-D pooling tactic for MaxPool (without the Indices output), AveragePool,
// GlobalAveragePool and GlobalMaxPool, on plain NCHW activations. ceil_mode stays on the reference
// kernel (ONNX's rule for the last window differs between opsets).
#if defined(KILN_HAVE_ONEDNN)
#include <algorithm>

#include "backends/cpu/onednn_common.h"
#include "backends/cpu/onednn_tactics.h"

namespace kiln::backends::cpu::onednn {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

struct PoolGeometry {
  int64_t n, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, oh, ow;
};

bool is_global(const ir::Node& n) { return n.op_type == "GlobalAveragePool" || n.op_type == "GlobalMaxPool"; }
bool is_max(const ir::Node& n) { return n.op_type == "MaxPool" || n.op_type == "GlobalMaxPool"; }

std::string resolve(const ir::Node& node, const Dims& x, PoolGeometry& g) {
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  if (g.n <= 0 || g.c <= 0 || g.h <= 0 || g.w <= 0) return "empty tensors";
  if (is_global(node)) {
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

class PreparedPool : public PreparedLayer {
 public:
  std::string name;
  PoolGeometry g;
  memory::desc src_md, dst_md;
  dnnl::pooling_v2_forward::primitive_desc pd;
  dnnl::pooling_v2_forward prim;

  std::vector<Dims> output_shapes() const override { return {{g.n, g.c, g.oh, g.ow}}; }
  Status run(const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) const override {
    return guarded(name, [&]() -> Status {
      auto& eng = cpu_engine();
      execute(prim, pd.scratchpad_desc(),
              {{DNNL_ARG_SRC, memory(src_md, eng, const_cast<void*>(in[0]->raw()))},
               {DNNL_ARG_DST, memory(dst_md, eng, out[0]->raw())}});
      return Status::Ok();
    });
  }
};

class OnednnPool : public Tactic {
 public:
  std::string name() const override { return "pool2d_onednn_nchw"; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "MaxPool"}, {"", "AveragePool"}, {"", "GlobalAveragePool"}, {"", "GlobalMaxPool"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    const ir::Node& n = *sig.node;
    if (!sig.domain().empty()) return "not an ONNX pooling op";
    if (auto e = check_f32(sig); !e.empty()) return e;
    if (!sig.has_input(0) || sig.inputs[0].shape.size() != 4) return "not 2-D pooling (X must be 4-D)";
    if (n.outputs.size() > 1 && !n.outputs[1].empty()) return "MaxPool's Indices output";
    if (sig.inputs[0].known()) {
      PoolGeometry g;
      return resolve(n, sig.inputs[0].shape, g);
    }
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedPool>();
    p->name = name();
    PoolGeometry& g = p->g;
    resolve(*sig.node, sig.inputs[0].shape, g);
    Status st = guarded(name(), [&]() -> Status {
      using A = dnnl::algorithm;
      A alg = is_max(*sig.node)                                 ? A::pooling_max
              : sig.node->attr_int("count_include_pad", 0) != 0 ? A::pooling_avg_include_padding
                                                                : A::pooling_avg_exclude_padding;
      p->src_md = memory::desc({g.n, g.c, g.h, g.w}, dt::f32, tag::nchw);
      p->dst_md = memory::desc({g.n, g.c, g.oh, g.ow}, dt::f32, tag::nchw);
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, p->src_md, p->dst_md, {g.sh, g.sw},
                                       {g.kh, g.kw}, {g.dh - 1, g.dw - 1}, {g.pt, g.pl}, {g.pb, g.pr});
      p->pd = dnnl::pooling_v2_forward::primitive_desc(d, attr, cpu_engine());
      p->prim = dnnl::pooling_v2_forward(p->pd);
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

}  // namespace

const Tactic* pool2d_onednn_nchw() {
  static const OnednnPool t;
  return &t;
}

}  // namespace kiln::backends::cpu::onednn
#endif  // KILN_HAVE_ONEDNN
