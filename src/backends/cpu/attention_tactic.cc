// kiln.Attention as one kernel: for each (batch..., head) problem and block of query rows, the
// block's scores Q K' * scale + mask are computed by a register-blocked micro-kernel into a
// per-thread buffer (never the whole score tensor), turned into exp(s - max) with their row sums,
// multiplied by V and divided by the sums on the way out. Batch dims broadcast as MatMul's do
// (e.g. one K/V head shared by every query head); the mask broadcasts into the scores
// (additive, any shape whose last two dims are 1 or the scores'). See src/ops/kiln_fused_misc.cc.
#include <algorithm>

#include "backends/cpu/xformer_kernels.h"
#include "backends/cpu/xformer_tactics.h"
#include "core/parallel.h"

namespace kiln::backends::cpu {
namespace {

// Bytes of scores a thread keeps for one row block (the rest of the block's data is Q, K, V).
constexpr int64_t kScoreBlockFloats = 16384;

struct Geometry {
  int64_t sq = 0, sk = 0, d = 0, dv = 0;
  Dims batch;  // of the output
  Dims out;
  std::string error;
};

Dims batch_of(const Dims& s) { return Dims(s.begin(), s.end() - 2); }

// Element strides of `dims` (a batch prefix of a tensor whose problems are `problem` elements
// apart) right-aligned against `target`, 0 where broadcast.
std::vector<int64_t> batch_strides(const Dims& dims, const Dims& target, int64_t problem) {
  std::vector<int64_t> st(target.size(), 0);
  int64_t s = problem;
  for (size_t i = dims.size(); i-- > 0;) {
    size_t t = target.size() - (dims.size() - i);
    st[t] = dims[i] == 1 ? 0 : s;
    s *= dims[i];
  }
  return st;
}

Geometry geometry(const LayerSignature& sig) {
  Geometry g;
  const Dims &q = sig.inputs[0].shape, &k = sig.inputs[1].shape, &v = sig.inputs[2].shape;
  if (q.size() < 2 || k.size() < 2 || v.size() < 2) {
    g.error = "Q, K and V need rank >= 2";
    return g;
  }
  bool kt = sig.node->attr_int("k_transposed", 0) != 0;
  g.sq = q[q.size() - 2], g.d = q.back();
  g.sk = kt ? k.back() : k[k.size() - 2];
  int64_t kd = kt ? k[k.size() - 2] : k.back();
  g.dv = v.back();
  if (kd != g.d) g.error = "Q and K head sizes differ";
  if (v[v.size() - 2] != g.sk) g.error = "V's rows are not K's";
  if (g.sk == 0) g.error = "no keys";
  Dims sb;
  if (!xf_broadcast(batch_of(q), batch_of(k), &sb)) g.error = "Q and K batch dims do not broadcast";
  if (sig.has_input(3)) {
    const Dims& m = sig.inputs[3].shape;
    int64_t mc = m.empty() ? 1 : m.back(), mr = m.size() < 2 ? 1 : m[m.size() - 2];
    if ((mc != 1 && mc != g.sk) || (mr != 1 && mr != g.sq)) g.error = "the mask does not broadcast to the scores";
    Dims mb = m.size() > 2 ? batch_of(m) : Dims{};
    if (!xf_broadcast(sb, mb, &sb)) g.error = "the mask's batch dims do not broadcast";
  }
  if (!xf_broadcast(sb, batch_of(v), &g.batch)) g.error = "V's batch dims do not broadcast";
  g.out = g.batch;
  g.out.push_back(g.sq);
  g.out.push_back(g.dv);
  return g;
}

class PreparedAttention : public PreparedLayer {
 public:
  const xf::Kernels* k = nullptr;
  xf::AttentionProblem p;  // pointers filled per run
  Dims out;

  std::vector<Dims> output_shapes() const override { return {out}; }

  Status run(const std::vector<const Tensor*>& in, const std::vector<Tensor*>& outs) const override {
    xf::AttentionProblem r = p;
    r.q = in[0]->data<float>();
    r.k = in[1]->data<float>();
    r.v = in[2]->data<float>();
    r.mask = in.size() > 3 && in[3] ? in[3]->data<float>() : nullptr;
    r.y = outs[0]->data<float>();
    int64_t items = r.problems() * r.row_blocks();
    parallel_for(items, 1, [&](int64_t b, int64_t e) { k->attention(r, b, e); });
    return Status::Ok();
  }
};

class AttentionKiln : public Tactic {
 public:
  std::string name() const override { return "attention_kiln_fused"; }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "Attention"}}; }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = xf_float32_layer(sig); !e.empty()) return e;
    for (size_t i = 0; i < 3; ++i)
      if (!sig.has_input(i)) return "Q, K and V are required";
    if (!sig.fully_known()) {
      for (size_t i = 0; i < 3; ++i)
        if (sig.inputs[i].shape.size() < 2) return "Q, K and V need rank >= 2";
      return "";
    }
    return geometry(sig).error;
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    Geometry g = geometry(sig);
    auto prep = std::make_unique<PreparedAttention>();
    prep->k = &xf::kernels(cpu_isa());
    prep->out = g.out;
    xf::AttentionProblem& p = prep->p;
    p.sq = g.sq, p.sk = g.sk, p.d = g.d, p.dv = g.dv;
    p.k_transposed = sig.node->attr_int("k_transposed", 0) != 0;
    p.q_rs = g.d, p.k_rs = p.k_transposed ? g.sk : g.d, p.v_rs = g.dv, p.y_rs = g.dv;
    p.scale = sig.node->attr_float("scale", 1.f);
    const Dims &qs = sig.inputs[0].shape, &ks = sig.inputs[1].shape, &vs = sig.inputs[2].shape;
    auto qst = batch_strides(batch_of(qs), g.batch, g.sq * g.d);
    auto kst = batch_strides(batch_of(ks), g.batch, g.sk * g.d);
    auto vst = batch_strides(batch_of(vs), g.batch, g.sk * g.dv);
    std::vector<int64_t> mst(g.batch.size(), 0);
    if (sig.has_input(3)) {
      const Dims& m = sig.inputs[3].shape;
      int64_t mc = m.empty() ? 1 : m.back(), mr = m.size() < 2 ? 1 : m[m.size() - 2];
      p.mask_rows_vary = mc == g.sk;
      p.mask_rs = mr == 1 ? 0 : mc;
      if (m.size() > 2) mst = batch_strides(batch_of(m), g.batch, mr * mc);
    }
    int64_t problems = 1;
    for (int64_t d : g.batch) problems *= d;
    std::vector<int64_t> idx(g.batch.size(), 0);
    for (int64_t pb = 0; pb < problems; ++pb) {
      int64_t oq = 0, ok = 0, ov = 0, om = 0;
      for (size_t i = 0; i < idx.size(); ++i)
        oq += idx[i] * qst[i], ok += idx[i] * kst[i], ov += idx[i] * vst[i], om += idx[i] * mst[i];
      p.q_off.push_back(oq), p.k_off.push_back(ok), p.v_off.push_back(ov), p.mask_off.push_back(om);
      p.y_off.push_back(pb * g.sq * g.dv);
      for (size_t i = idx.size(); i-- > 0;) {
        if (++idx[i] < g.batch[i]) break;
        idx[i] = 0;
      }
    }
    // Row blocks: whole problems when the scores fit, then smaller until every thread has work.
    int64_t mr = prep->k->micro_rows;
    auto round_up = [&](int64_t x) { return std::max<int64_t>(mr, (x + mr - 1) / mr * mr); };
    int64_t ld_s = std::max<int64_t>(g.sk, 1);
    int64_t rb = round_up(std::min(g.sq, std::max<int64_t>(1, kScoreBlockFloats / ld_s)));
    int64_t want = 2 * static_cast<int64_t>(max_threads());
    while (rb > mr && problems * ((g.sq + rb - 1) / rb) < want) rb = round_up(rb / 2);
    p.row_block = rb;
    return std::unique_ptr<PreparedLayer>(std::move(prep));
  }
};

}  // namespace

const Tactic* attention_kiln_fused() {
  static const AttentionKiln t;
  return &t;
}

}  // namespace kiln::backends::cpu
