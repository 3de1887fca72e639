// concat_blocked_kiln: the Concat that layout_blocked keeps between channel-blocked values (5-D
// [N, Cb, H, W, B] along axis 1, the channel blocks; SqueezeNet's fire modules). Per image, each
// input's blocks are one contiguous run of the output: the output is written once, front to back,
// by runs of memcpy spread over the threads. (Concats of other ranks and axes are other tactics'.)
#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/kiln_tactics.h"
#include "core/parallel.h"

namespace kiln::backends::cpu {
namespace {

class PreparedConcat : public PreparedLayer {
 public:
  struct Run {
    int64_t out_begin, src_begin, len;  // floats
    size_t input;
  };
  std::vector<Run> runs;  // in output order
  Dims out_shape;

  std::vector<Dims> output_shapes() const override { return {out_shape}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    float* y = out[0]->data<float>();
    const int64_t total = runs.empty() ? 0 : runs.back().out_begin + runs.back().len;
    parallel_for(total, 1 << 14, [&](int64_t b, int64_t e) {
      // The first run holding b, then each run overlapping [b, e).
      auto it = std::upper_bound(runs.begin(), runs.end(), b, [](int64_t v, const Run& r) { return v < r.out_begin; });
      for (--it; it != runs.end() && it->out_begin < e; ++it) {
        const int64_t lo = std::max(b, it->out_begin), hi = std::min(e, it->out_begin + it->len);
        const float* src = in[it->input]->data<float>() + it->src_begin + (lo - it->out_begin);
        std::memcpy(y + lo, src, static_cast<size_t>(hi - lo) * sizeof(float));
      }
    });
    return Status::Ok();
  }
};

class BlockedConcat : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return "concat_blocked_kiln"; }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Concat"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (!sig.domain().empty() || sig.op() != "Concat") return "not a Concat";
    if (auto e = float32_cpu_layer(sig); !e.empty()) return e;
    if (sig.inputs.empty()) return "no inputs";
    for (const auto& t : sig.inputs)
      if (!t.present || t.shape.size() != 5) return "not a Concat of 5-D channel-blocked values";
    const int64_t axis = sig.node->attr_int("axis", 0);
    if (axis != 1 && axis != -4) return "not along the channel blocks (axis 1 of 5-D)";
    const Dims& a = sig.inputs[0].shape;
    for (const auto& t : sig.inputs)
      for (size_t d = 0; d < 5; ++d)
        if (d != 1 && t.shape[d] != a[d] && t.shape[d] >= 0 && a[d] >= 0) return "inputs differ outside axis 1";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedConcat>();
    const Dims& a = sig.inputs[0].shape;
    const int64_t n = a[0], inner = a[2] * a[3] * a[4];
    int64_t blocks = 0;
    for (const auto& t : sig.inputs) blocks += t.shape[1];
    p->out_shape = {n, blocks, a[2], a[3], a[4]};
    int64_t at = 0;
    for (int64_t i = 0; i < n; ++i)
      for (size_t k = 0; k < sig.inputs.size(); ++k) {
        const int64_t len = sig.inputs[k].shape[1] * inner;
        if (len > 0) p->runs.push_back({at, i * len, len, k});
        at += len;
      }
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

}  // namespace

const Tactic* concat_blocked_kiln() {
  static const BlockedConcat t;
  return &t;
}

}  // namespace kiln::backends::cpu
