// kiln.Attention as one kernel: for each (batch..., head) problem and block of query rows, the
// block's scores Q K' * scale + mask are computed by a register-blocked micro-kernel into a
// per-thread buffer (never the whole score tensor), turned into exp(s - max) with their row sums,
// multiplied by V and divided by the sums on the way out. Batch dims broadcast as MatMul's do
// (e.g. one K/V head shared by every query head); the mask broadcasts into the scores
// (additive, any shape whose last two dims are 1 or the scores'). kiln.MultiHeadAttention is the
// same kernel reading the heads in place from [batch, S, heads * D] projections (or one packed QKV
// projection) and writing [batch, S, heads * Dv]: only the offsets and row strides differ. See
// src/ops/kiln_fused_misc.cc.
#include <algorithm>

#include "backends/cpu/xformer_kernels.h"
#include "backends/cpu/xformer_tactics.h"
#include "core/parallel.h"

namespace kiln::backends::cpu {
namespace {

// Bytes of scores a thread keeps for one row block (the rest of the block's data is Q, K, V).
constexpr int64_t kScoreBlockFloats = 16384;

// One of Q, K, V, mask, Y as the kernel walks it: batch dims (the heads among them for
// MultiHeadAttention) with their element strides, the row stride and the offset of element 0.
struct Operand {
  Dims batch;
  std::vector<int64_t> strides;
  int64_t rs = 0, base = 0;
};

// A plain tensor [batch..., rows, cols]: contiguous batch dims.
Operand plain(const Dims& s) {
  Operand o;
  o.batch.assign(s.begin(), s.end() - 2);
  o.rs = s.back();
  int64_t st = s[s.size() - 2] * s.back();
  o.strides.resize(o.batch.size());
  for (size_t i = o.batch.size(); i-- > 0;) o.strides[i] = st, st *= o.batch[i];
  return o;
}

// [batch..., rows, width] read as heads [batch..., heads, rows, head] starting at column `col`.
Operand heads_of(const Dims& s, int64_t heads, int64_t head, int64_t col) {
  Operand o;
  o.batch.assign(s.begin(), s.end() - 2);
  o.batch.push_back(heads);
  o.rs = s.back();
  int64_t st = s[s.size() - 2] * s.back();
  o.strides.resize(o.batch.size());
  o.strides.back() = head;
  for (size_t i = o.batch.size() - 1; i-- > 0;) o.strides[i] = st, st *= o.batch[i];
  o.base = col;
  return o;
}

struct Geometry {
  int64_t sq = 0, sk = 0, d = 0, dv = 0;
  bool k_transposed = false;
  Operand q, k, v, y;
  Dims batch;  // of the problems
  Dims out;
  std::string error;
};

// Offsets of problem `idx` (a multi-index into g.batch) in `o`, broadcasting its batch dims.
int64_t offset(const Operand& o, const Dims& batch, const std::vector<int64_t>& idx) {
  int64_t off = o.base;
  for (size_t i = 0; i < o.batch.size(); ++i) {
    size_t t = batch.size() - o.batch.size() + i;
    if (o.batch[i] != 1) off += idx[t] * o.strides[i];
  }
  return off;
}

Geometry geometry(const LayerSignature& sig) {
  Geometry g;
  const ir::Node& n = *sig.node;
  bool mha = sig.op() == "MultiHeadAttention";
  if (mha) {
    int64_t h = n.attr_int("num_heads", 0);
    bool packed = !sig.has_input(1) && !sig.has_input(2);
    if (h < 1) return g.error = "num_heads < 1", g;
    if (!packed && (!sig.has_input(1) || !sig.has_input(2))) return g.error = "K without V", g;
    const Dims& q = sig.inputs[0].shape;
    const Dims& k = packed ? q : sig.inputs[1].shape;
    const Dims& v = packed ? q : sig.inputs[2].shape;
    if (q.size() < 2 || k.size() < 2 || v.size() < 2) return g.error = "Q, K and V need rank >= 2", g;
    int64_t eq = packed ? q.back() / 3 : q.back(), ek = packed ? eq : k.back(), ev = packed ? eq : v.back();
    if ((packed && q.back() % 3) || eq % h || ek % h || ev % h) return g.error = "widths are not num_heads heads", g;
    g.sq = q[q.size() - 2], g.sk = k[k.size() - 2], g.d = eq / h, g.dv = ev / h;
    if (ek / h != g.d) return g.error = "Q and K head sizes differ", g;
    if (v[v.size() - 2] != g.sk) return g.error = "V's rows are not K's", g;
    g.q = heads_of(q, h, g.d, 0);
    g.k = heads_of(k, h, g.d, packed ? eq : 0);
    g.v = heads_of(v, h, g.dv, packed ? 2 * eq : 0);
  } else {
    const Dims &q = sig.inputs[0].shape, &k = sig.inputs[1].shape, &v = sig.inputs[2].shape;
    if (q.size() < 2 || k.size() < 2 || v.size() < 2) return g.error = "Q, K and V need rank >= 2", g;
    g.k_transposed = n.attr_int("k_transposed", 0) != 0;
    g.sq = q[q.size() - 2], g.d = q.back();
    g.sk = g.k_transposed ? k.back() : k[k.size() - 2];
    int64_t kd = g.k_transposed ? k[k.size() - 2] : k.back();
    g.dv = v.back();
    if (kd != g.d) return g.error = "Q and K head sizes differ", g;
    if (v[v.size() - 2] != g.sk) return g.error = "V's rows are not K's", g;
    g.q = plain(q), g.k = plain(k), g.v = plain(v);
  }
  if (g.sk == 0) return g.error = "no keys", g;
  Dims sb;
  if (!xf_broadcast(g.q.batch, g.k.batch, &sb)) return g.error = "Q and K batch dims do not broadcast", g;
  if (sig.has_input(3)) {
    const Dims& m = sig.inputs[3].shape;
    int64_t mc = m.empty() ? 1 : m.back(), mr = m.size() < 2 ? 1 : m[m.size() - 2];
    if ((mc != 1 && mc != g.sk) || (mr != 1 && mr != g.sq)) return g.error = "the mask does not broadcast", g;
    Dims mb = m.size() > 2 ? Dims(m.begin(), m.end() - 2) : Dims{};
    if (!xf_broadcast(sb, mb, &sb)) return g.error = "the mask's batch dims do not broadcast", g;
  }
  if (!xf_broadcast(sb, g.v.batch, &g.batch)) return g.error = "V's batch dims do not broadcast", g;
  if (mha) {  // Y [batch..., sq, heads * dv]
    g.out.assign(g.batch.begin(), g.batch.end() - 1);
    g.out.push_back(g.sq);
    g.out.push_back(g.batch.back() * g.dv);
    g.y = heads_of(g.out, g.batch.back(), g.dv, 0);
  } else {
    g.out = g.batch;
    g.out.push_back(g.sq);
    g.out.push_back(g.dv);
    g.y = plain(g.out);
  }
  return g;
}

class PreparedAttention : public PreparedLayer {
 public:
  const xf::Kernels* k = nullptr;
  xf::AttentionProblem p;  // pointers filled per run
  Dims out;

  std::vector<Dims> output_shapes() const override { return {out}; }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& outs) const override {
    xf::AttentionProblem r = p;
    r.q = in[0]->data<float>();
    // A packed MultiHeadAttention reads K and V from input 0 (the offsets say where).
    r.k = (in.size() > 1 && in[1] ? in[1] : in[0])->data<float>();
    r.v = (in.size() > 2 && in[2] ? in[2] : in[0])->data<float>();
    r.mask = in.size() > 3 && in[3] ? in[3]->data<float>() : nullptr;
    r.y = outs[0]->data<float>();
    int64_t items = r.problems() * r.row_blocks();
    parallel_for(items, 1, [&](int64_t b, int64_t e) { k->attention(r, b, e); });
    return Status::Ok();
  }
};

class AttentionKiln : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return "attention_kiln_fused"; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"kiln", "Attention"}, {"kiln", "MultiHeadAttention"}};
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = xf_float32_layer(sig); !e.empty()) return e;
    bool mha = sig.op() == "MultiHeadAttention";
    for (size_t i = 0; i < (mha ? 1 : 3); ++i)
      if (!sig.has_input(i)) return "Q, K and V are required";
    if (!sig.fully_known()) {
      for (size_t i = 0; i < 3; ++i)
        if (sig.has_input(i) && sig.inputs[i].shape.size() < 2) return "Q, K and V need rank >= 2";
      return "";
    }
    return geometry(sig).error;
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    Geometry g = geometry(sig);
    auto prep = std::make_unique<PreparedAttention>();
    prep->k = &xf::kernels(cpu_isa(sig.isa));
    prep->out = g.out;
    xf::AttentionProblem& p = prep->p;
    p.sq = g.sq, p.sk = g.sk, p.d = g.d, p.dv = g.dv;
    p.k_transposed = g.k_transposed;
    p.q_rs = g.q.rs, p.k_rs = g.k.rs, p.v_rs = g.v.rs, p.y_rs = g.y.rs;
    p.scale = sig.node->attr_float("scale", 1.f);
    Operand mask;
    if (sig.has_input(3)) {
      const Dims& m = sig.inputs[3].shape;
      int64_t mc = m.empty() ? 1 : m.back(), mr = m.size() < 2 ? 1 : m[m.size() - 2];
      p.mask_rows_vary = mc == g.sk;
      p.mask_rs = mr == 1 ? 0 : mc;
      Dims full = m;
      while (full.size() < 2) full.insert(full.begin(), 1);
      mask = plain(full);
    }
    int64_t problems = 1;
    for (int64_t d : g.batch) problems *= d;
    std::vector<int64_t> idx(g.batch.size(), 0);
    for (int64_t pb = 0; pb < problems; ++pb) {
      p.q_off.push_back(offset(g.q, g.batch, idx));
      p.k_off.push_back(offset(g.k, g.batch, idx));
      p.v_off.push_back(offset(g.v, g.batch, idx));
      p.mask_off.push_back(offset(mask, g.batch, idx));
      p.y_off.push_back(offset(g.y, g.batch, idx));
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
