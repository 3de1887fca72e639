// oneDNN pooling tactics for MaxPool (without the Indices output), AveragePool,
// GlobalAveragePool and GlobalMaxPool over 1, 2 or 3 spatial dims on plain activations (ncw, nchw,
// ncdhw), and for kiln.BlockedPool (the same on channel-blocked 2-D activations, see
// ops/kiln_layout.h). The window is resolved by the reference kernel's own code (ops/conv_util.h):
// ceil_mode becomes a longer right padding (oneDNN's padding_r), see resolve_pool.
#if defined(KILN_HAVE_ONEDNN)
#include <algorithm>

#include "backends/cpu/onednn_common.h"
#include "backends/cpu/onednn_geometry.h"
#include "backends/cpu/onednn_tactics.h"
#include "core/parallel.h"
#include "ops/conv_util.h"

namespace kiln::backends::cpu::onednn {

bool is_global_pool(const std::string& op) { return op == "GlobalAveragePool" || op == "GlobalMaxPool"; }
bool is_max_pool(const std::string& op) { return op == "MaxPool" || op == "GlobalMaxPool"; }

std::string resolve_pool(const ir::Node& node, const std::string& op, int opset, const Dims& x, PoolGeometry& g) {
  if (x.size() < 3 || x.size() > 5) return "pooling over " + std::to_string(x.size() - 2) + " spatial dims";
  for (int64_t d : x)
    if (d <= 0) return "empty tensors";
  g.n = x[0], g.c = x[1];
  g.max = is_max_pool(op);
  WindowNd& w = g.w;
  w = WindowNd();
  w.in.assign(x.begin() + 2, x.end());
  const size_t rank = w.in.size();
  if (is_global_pool(op)) {
    w.kernel = w.in;
    w.out.assign(rank, 1);
    w.strides.assign(rank, 1), w.dilations.assign(rank, 1), w.pad_l.assign(rank, 0), w.pad_r.assign(rank, 0);
    return "";
  }
  // The attributes each opset has (the reference ignores the others); kiln.BlockedPool's are its
  // source op's.
  auto win = ops::resolve_window(node, x, nullptr, ops::window_options(op, opset));
  if (!win.ok()) return win.status().message();
  g.include_pad = op == "AveragePool" && node.attr_int("count_include_pad", 0) != 0;
  bool declared_pads = false, overhang = false;
  Dims declared_end;  // per dim, the end of the input and its declared padding
  for (size_t d = 0; d < rank; ++d) {
    const int64_t o = win->out[d];
    const int64_t pb = win->pad_begin[d], pe = win->pad_end[d];
    if (o <= 0) return "empty output";
    // A dilated 1-wide window is the same window; oneDNN 2.6 rejects the dilation there.
    const int64_t k = win->kernel[d], dil = k == 1 ? 1 : win->dilations[d], ext = (k - 1) * dil + 1;
    // Where the last window ends: past the declared padding with ceil_mode (that overhang is no
    // padding for ONNX: neither max nor either average counts it), inside it otherwise.
    const int64_t reach = (o - 1) * win->strides[d] + ext - w.in[d] - pb;
    overhang |= reach > pe;
    declared_pads |= pb > 0 || pe > 0;
    // Output positions made of padding only: the reference reads no input there.
    if (pb >= ext || std::max(pe, reach) >= ext) return "a pad as large as the kernel";
    // Nor a dilated window whose taps all skip the input.
    for (int64_t i = 0; i < o; ++i) {
      const int64_t start = i * win->strides[d] - pb, first = start >= 0 ? 0 : ops::ceil_div(-start, dil);
      if (first >= k || start + first * dil >= w.in[d]) return "a dilated window with no input tap";
    }
    w.out.push_back(o), w.kernel.push_back(k), w.strides.push_back(win->strides[d]), w.dilations.push_back(dil);
    w.pad_l.push_back(pb), w.pad_r.push_back(std::max(pe, reach));
    declared_end.push_back(w.in[d] + pe);
  }
  // count_include_pad over no declared padding counts the input taps only: the excluding average.
  if (g.include_pad && !declared_pads) g.include_pad = false;
  // oneDNN's including average divides by the whole kernel, the ceil_mode overhang too; ONNX by
  // the taps inside the input and the declared padding: the windows reaching past it are
  // rescaled after the primitive (per dim, kernel / taps inside; 1 elsewhere).
  g.rescale.clear();
  if (g.include_pad && overhang) {
    for (size_t d = 0; d < rank; ++d) {
      std::vector<float> f(static_cast<size_t>(w.out[d]), 1.f);
      for (int64_t i = 0; i < w.out[d]; ++i) {
        const int64_t start = i * w.strides[d] - w.pad_l[d];
        int64_t taps = 0;  // window taps before the declared end (none is before the begin padding)
        for (int64_t k = 0; k < w.kernel[d]; ++k) taps += start + k * w.dilations[d] < declared_end[d];
        f[static_cast<size_t>(i)] = static_cast<float>(w.kernel[d]) / static_cast<float>(taps);
      }
      g.rescale.push_back(std::move(f));
    }
  }
  return "";
}

namespace {

tag plain_tag(size_t rank) { return rank == 1 ? tag::ncw : rank == 2 ? tag::nchw : tag::ncdhw; }

class PreparedPool : public PreparedLayer {
 public:
  std::string name;
  PoolGeometry g;
  int64_t block = 0;  // > 0: channel-blocked [N, C/block, H, W, block] in and out
  memory::desc src_md, dst_md, scratch_md;
  int thread_cap = 1 << 20;  // 1: created and run on one thread
  dnnl::pooling_v2_forward::primitive_desc pd;
  dnnl::pooling_v2_forward prim;

  // Per spatial output position (row-major), the product of its dims' factors (g.rescale); empty
  // when no position needs one. Made at prepare: run() allocates nothing.
  std::vector<float> factors;
  void make_factors() {
    if (g.rescale.empty()) return;
    const Dims& out = g.w.out;
    int64_t plane = 1;
    for (int64_t o : out) plane *= o;
    factors.assign(static_cast<size_t>(plane), 1.f);
    for (int64_t i = 0; i < plane; ++i)
      for (size_t d = out.size(), r = static_cast<size_t>(i); d-- > 0; r /= static_cast<size_t>(out[d]))
        factors[static_cast<size_t>(i)] *= g.rescale[d][r % static_cast<size_t>(out[d])];
  }
  // Multiplies each output position by its factor: per plane of N * C (blocked: N * C / block
  // planes of `block` lanes each).
  void rescale(float* y) const {
    const int64_t lanes = block > 0 ? block : 1, planes = g.n * g.c / lanes;
    const int64_t plane = static_cast<int64_t>(factors.size());
    for (int64_t p = 0; p < planes; ++p)
      for (int64_t i = 0; i < plane; ++i) {
        const float f = factors[static_cast<size_t>(i)];
        if (f == 1.f) continue;
        float* v = y + (p * plane + i) * lanes;
        for (int64_t l = 0; l < lanes; ++l) v[l] *= f;
      }
  }

  std::vector<Dims> output_shapes() const override {
    Dims y{g.n, block > 0 ? g.c / block : g.c};
    y.insert(y.end(), g.w.out.begin(), g.w.out.end());
    if (block > 0) y.push_back(block);
    return {y};
  }
  size_t workspace_bytes(int) const override { return workspace_piece(scratch_md.get_size()); }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return guarded(name, [&]() -> Status {
      ThreadCapScope cap(thread_cap);
      auto& eng = cpu_engine();
      WorkspaceSlicer ws(ctx);
      execute(prim, scratch_md, ws.take(scratch_md.get_size()),
              {{DNNL_ARG_SRC, memory(src_md, eng, const_cast<void*>(in[0]->raw()))},
               {DNNL_ARG_DST, memory(dst_md, eng, out[0]->raw())}});
      if (!factors.empty()) rescale(out[0]->data<float>());
      return Status::Ok();
    });
  }
};

// Plain: the ONNX pooling ops over `rank` spatial dims. Blocked: kiln.BlockedPool on [N, Cb, H, W,
// B] (B = 8 or 16), pooled over all Cb * B channels (the zero padding lanes pool to zero, as the op
// requires). The blocked one also on one thread, for inputs of at most 256K floats (a
// squeeze-excite block's global average pool at batch 1): timed against the threaded one.
class OnednnPool : public Tactic {
 public:
  OnednnPool(bool blocked, size_t rank, bool single_thread = false)
      : blocked_(blocked), single_thread_(single_thread), rank_(rank) {}
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override {
    if (blocked_) return single_thread_ ? "pool2d_onednn_nchwc_single_thread" : "pool2d_onednn_nchwc";
    return rank_ == 1 ? "pool1d_onednn_ncw" : rank_ == 2 ? "pool2d_onednn_nchw" : "pool3d_onednn_ncdhw";
  }
  // 2: ceil_mode (as a longer right padding) and count_include_pad over no declared padding.
  int revision() const override { return 2; }
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
    if (single_thread_) {
      if (!sig.inputs[0].known()) return "one thread: the layer's size is not known";
      int64_t size = 1;
      for (int64_t d : sig.inputs[0].shape) size *= d;
      if (size > kSingleThreadMaxInput)
        return "one thread: more than " + std::to_string(kSingleThreadMaxInput) + " input floats";
    }
    if (sig.inputs[0].known()) {
      PoolGeometry g;
      return resolve_pool(n, op_of(sig), opset_of(sig), x, g);
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
    resolve_pool(*sig.node, op_of(sig), opset_of(sig), x, g);
    p->block = blocked_ ? sig.node->attr_int("block", 0) : 0;
    p->make_factors();
    if (single_thread_) p->thread_cap = 1;
    Status st = guarded(name(), [&]() -> Status {
      ThreadCapScope cap(p->thread_cap);  // oneDNN sizes its thread partition here
      using A = dnnl::algorithm;
      A alg = g.max ? A::pooling_max : g.include_pad ? A::pooling_avg_include_padding : A::pooling_avg_exclude_padding;
      tag t = !blocked_ ? plain_tag(rank_) : p->block == 16 ? tag::nChw16c : tag::nChw8c;
      memory::dims src{g.n, g.c}, dst{g.n, g.c}, dil;
      src.insert(src.end(), g.w.in.begin(), g.w.in.end());
      dst.insert(dst.end(), g.w.out.begin(), g.w.out.end());
      for (int64_t d : g.w.dilations) dil.push_back(d - 1);  // oneDNN's: 0 = dense
      p->src_md = memory::desc(src, dt::f32, t);
      p->dst_md = memory::desc(dst, dt::f32, t);
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, p->src_md, p->dst_md,
                                       to_dnnl(g.w.strides), to_dnnl(g.w.kernel), dil, to_dnnl(g.w.pad_l),
                                       to_dnnl(g.w.pad_r));
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
  int opset_of(const LayerSignature& sig) const {
    return blocked_ ? static_cast<int>(sig.node->attr_int("pool_opset", 12)) : sig.node->opset;
  }
  // X as the pool sees it, [N, C, spatial...] (blocked: C = Cb * B); dims may be -1.
  std::string plain_input(const LayerSignature& sig, Dims* x) const {
    if (!sig.has_input(0)) return "no X";
    const Dims& s = sig.inputs[0].shape;
    if (!blocked_) {
      if (s.size() != rank_ + 2)
        return "not " + std::to_string(rank_) + "-D pooling (X must be " + std::to_string(rank_ + 2) + "-D)";
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
  static constexpr int64_t kSingleThreadMaxInput = int64_t{1} << 18;
  bool blocked_, single_thread_;
  size_t rank_;  // spatial dims
};

}  // namespace

const Tactic* pool1d_onednn_ncw() {
  static const OnednnPool t(false, 1);
  return &t;
}
const Tactic* pool2d_onednn_nchw() {
  static const OnednnPool t(false, 2);
  return &t;
}
const Tactic* pool3d_onednn_ncdhw() {
  static const OnednnPool t(false, 3);
  return &t;
}
const Tactic* pool2d_onednn_nchwc() {
  static const OnednnPool t(true, 2);
  return &t;
}
const Tactic* pool2d_onednn_nchwc_single_thread() {
  static const OnednnPool t(true, 2, true);
  return &t;
}

}  // namespace kiln::backends::cpu::onednn
#endif  // KILN_HAVE_ONEDNN
