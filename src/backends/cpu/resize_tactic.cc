// Resize / Upsample on float32 X whose resized axes are among its last two (NCHW images, any
// leading dims): every mode (nearest, linear, cubic, antialias), coordinate transform and nearest
// rounding, with the taps the reference kernel computes (ops/resize_plan.h), in float. Separable:
// each output row is a weighted sum of input rows (vectorized, lt::blend_rows) and each element a
// weighted sum of the taps along the row. When the rows grow (upsampling in H) the input rows a
// block of output rows needs are resized along W once and then blended; otherwise each output row
// is blended first and resized along W after, so the W pass always runs on the fewer rows.
#include <algorithm>
#include <cstring>

#include "backends/cpu/kiln_tactics.h"
#include "backends/cpu/longtail_kernels.h"
#include "backends/cpu/xformer_kernels.h"
#include "core/parallel.h"
#include "ops/resize_plan.h"

namespace kiln::backends::cpu {
namespace {

// Output elements a thread gets at least (a few flops each; a parallel region costs about 0.1 ms).
constexpr int64_t kGrainElements = int64_t{1} << 17;
constexpr int64_t kRowBlock = 16;  // output rows of one work item

// One axis of the view [outer, H, W]: output o reads taps [o * n, (o + 1) * n).
struct Taps {
  int64_t in = 1, out = 1, n = 1;
  bool identity = true;  // out == in, tap o is element o with weight 1
  std::vector<int64_t> index;
  std::vector<float> weight;
  std::vector<char> extrapolate;
};

Taps identity_taps(int64_t len) {
  Taps t;
  t.in = t.out = len;
  for (int64_t o = 0; o < len; ++o) t.index.push_back(o), t.weight.push_back(1.f), t.extrapolate.push_back(0);
  return t;
}

// The reference's taps of one axis; identity when they read element o alone for output o.
Taps taps_of(const ops::ResizeAxis& a, bool nearest) {
  if (a.identity && !nearest) return identity_taps(a.in);
  Taps t;
  t.in = a.in, t.out = a.out, t.n = a.n;
  t.index = a.index;
  t.weight.assign(a.weight.begin(), a.weight.end());
  t.extrapolate = a.extrapolate;
  t.identity = a.in == a.out && a.n == 1;
  for (int64_t o = 0; t.identity && o < a.out; ++o)
    t.identity = t.index[static_cast<size_t>(o)] == o && !t.extrapolate[static_cast<size_t>(o)];
  return t;
}

class PreparedResize : public PreparedLayer {
 public:
  const lt::Kernels* k = nullptr;
  Dims out_shape;
  int64_t outer = 1;
  Taps h, w;
  float fill = 0.f;
  bool w_first = false;  // resize input rows along W, then blend them (H grows)

  std::vector<Dims> output_shapes() const override { return {out_shape}; }

  // dst[0, w.out) from one row of w.in elements.
  void resize_row(const float* src, float* dst) const {
    if (w.identity) {
      std::memcpy(dst, src, static_cast<size_t>(w.out) * sizeof(float));
      return;
    }
    const int64_t n = w.n;
    for (int64_t o = 0; o < w.out; ++o) {
      if (w.extrapolate[static_cast<size_t>(o)]) {
        dst[o] = fill;
        continue;
      }
      const int64_t* ix = w.index.data() + o * n;
      const float* wt = w.weight.data() + o * n;
      float acc = wt[0] * src[ix[0]];
      for (int64_t t = 1; t < n; ++t) acc += wt[t] * src[ix[t]];
      dst[o] = acc;
    }
  }

  // Output rows [y0, y1) of plane p.
  void rows(const float* x, float* y, int64_t p, int64_t y0, int64_t y1) const {
    const float* plane = x + p * h.in * w.in;
    float* out = y + p * h.out * w.out;
    const float* srcs[64];
    if (h.identity) {
      for (int64_t r = y0; r < y1; ++r) resize_row(plane + r * w.in, out + r * w.out);
      return;
    }
    if (w_first) {
      int64_t lo = h.in, hi = -1;
      for (int64_t r = y0; r < y1; ++r)
        for (int64_t t = 0; t < h.n; ++t) {
          int64_t i = h.index[static_cast<size_t>(r * h.n + t)];
          lo = std::min(lo, i), hi = std::max(hi, i);
        }
      float* buf = xf::thread_scratch(0, static_cast<size_t>(std::max<int64_t>(hi - lo + 1, 1) * w.out));
      for (int64_t i = lo; i <= hi; ++i) resize_row(plane + i * w.in, buf + (i - lo) * w.out);
      for (int64_t r = y0; r < y1; ++r) {
        float* dst = out + r * w.out;
        if (h.extrapolate[static_cast<size_t>(r)]) {
          std::fill(dst, dst + w.out, fill);
          continue;
        }
        for (int64_t t = 0; t < h.n; ++t) srcs[t] = buf + (h.index[static_cast<size_t>(r * h.n + t)] - lo) * w.out;
        k->blend_rows(srcs, h.weight.data() + r * h.n, h.n, dst, w.out);
      }
      return;
    }
    float* buf = xf::thread_scratch(0, static_cast<size_t>(w.in));
    for (int64_t r = y0; r < y1; ++r) {
      float* dst = out + r * w.out;
      if (h.extrapolate[static_cast<size_t>(r)]) {
        std::fill(dst, dst + w.out, fill);
        continue;
      }
      for (int64_t t = 0; t < h.n; ++t) srcs[t] = plane + h.index[static_cast<size_t>(r * h.n + t)] * w.in;
      const float* src = srcs[0];
      if (h.n > 1 || h.weight[static_cast<size_t>(r * h.n)] != 1.f) {
        k->blend_rows(srcs, h.weight.data() + r * h.n, h.n, buf, w.in);
        src = buf;
      }
      resize_row(src, dst);
    }
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& outs) const override {
    const float* x = in[0]->data<float>();
    float* y = outs[0]->data<float>();
    if (outs[0]->numel() == 0) return Status::Ok();
    const int64_t blocks = (h.out + kRowBlock - 1) / kRowBlock;
    parallel_for(outer * blocks, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(kRowBlock * w.out, 1)),
                 [&](int64_t u0, int64_t u1) {
                   for (int64_t u = u0; u < u1; ++u) {
                     int64_t r0 = (u % blocks) * kRowBlock;
                     rows(x, y, u / blocks, r0, std::min(h.out, r0 + kRowBlock));
                   }
                 });
    return Status::Ok();
  }
};

class ResizeKiln : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return "resize_kiln"; }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Resize"}, {"", "Upsample"}}; }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.device.kind != DeviceKind::kCPU || sig.compute != DataType::kFloat32) return "not a float32 CPU layer";
    if (!sig.has_input(0) || sig.inputs[0].dtype != DataType::kFloat32) return "X is not float32";
    if (sig.inputs[0].shape.empty()) return "X is a scalar";
    for (size_t i = 1; i < sig.inputs.size(); ++i)
      if (sig.has_input(i) && !sig.inputs[i].constant)
        return "input " + std::to_string(i) + " (roi / scales / sizes) is computed at run time";
    if (!sig.inputs[0].known()) return "";
    std::unique_ptr<PreparedResize> p;
    return plan(sig, &p);
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    std::unique_ptr<PreparedResize> p;
    if (auto e = plan(sig, &p); !e.empty()) return Unsupported(name(), ": ", e);
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  static std::string plan(const LayerSignature& sig, std::unique_ptr<PreparedResize>* out) {
    const Dims& x = sig.inputs[0].shape;
    auto g = ops::resize_geometry(
        *sig.node, x, [&](size_t i) -> const Tensor* { return sig.has_input(i) ? sig.inputs[i].constant : nullptr; });
    if (!g.ok()) return g.status().message();
    auto p = std::make_unique<PreparedResize>();
    p->out_shape = g->out_shape;
    p->fill = static_cast<float>(g->extrapolation);
    const size_t r = x.size();
    if (dims_numel(g->out_shape) == 0) {
      *out = std::move(p);
      return "";
    }
    std::vector<Taps> taps;
    for (size_t d = 0; d < r; ++d) taps.push_back(taps_of(g->axes[d], g->nearest));
    for (size_t d = 0; d + 2 < r; ++d) {
      if (!taps[d].identity) return "resizes axis " + std::to_string(d) + " (only the last two axes)";
      p->outer *= x[d];
    }
    p->w = std::move(taps[r - 1]);
    p->h = r >= 2 ? std::move(taps[r - 2]) : identity_taps(1);
    if (p->h.n > 64) return "more than 64 taps per output row (antialias at this scale)";
    p->w_first = p->h.out > p->h.in;
    p->k = &lt::kernels(cpu_isa(sig.isa));
    *out = std::move(p);
    return "";
  }
};

}  // namespace

const Tactic* resize_kiln() {
  static const ResizeKiln t;
  return &t;
}

}  // namespace kiln::backends::cpu
