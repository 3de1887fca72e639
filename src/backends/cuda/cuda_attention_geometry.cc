// The CUDA attention tactics' shared signature analysis (cuda_attention_geometry.h).
#include "backends/cuda/cuda_attention_geometry.h"

#include <algorithm>

#include "ops/common.h"

namespace kiln::backends::cuda {

namespace {

// Right-aligned broadcast of batch dims (ops::broadcast_dims); false when they do not broadcast.
bool broadcast(const Dims& a, const Dims& b, Dims* out) {
  Result<Dims> r = ops::broadcast_dims(a, b);
  if (!r.ok()) return false;
  *out = r.value();
  return true;
}

// The batch stride of an operand whose batch dims are `own` among the problems' `full`: its matrix
// size when they are the same, 0 when they are all ones (shared); else -1 (partial broadcasting).
int64_t batch_stride(const Dims& own, const Dims& full, int64_t matrix) {
  if (dims_numel(own) == 1) return 0;
  Dims padded(full.size() - std::min(full.size(), own.size()), 1);
  padded.insert(padded.end(), own.begin(), own.end());
  return padded == full ? matrix : -1;
}

Dims leading(const Dims& s) { return Dims(s.begin(), s.end() - 2); }

}  // namespace

AttentionGeometry attention_geometry(const LayerSignature& sig) {
  AttentionGeometry g;
  const ir::Node& n = *sig.node;
  const bool mha = sig.op() == "MultiHeadAttention";
  Dims qb, kb, vb;  // the operands' batch dims
  if (mha) {
    const int64_t h = n.attr_int("num_heads", 0);
    const bool packed = !sig.has_input(1) && !sig.has_input(2);
    if (h < 1) return g.error = "num_heads < 1", g;
    if (!packed && (!sig.has_input(1) || !sig.has_input(2))) return g.error = "K without V", g;
    const Dims& q = sig.inputs[0].shape;
    const Dims& k = packed ? q : sig.inputs[1].shape;
    const Dims& v = packed ? q : sig.inputs[2].shape;
    if (q.size() < 2 || k.size() < 2 || v.size() < 2) return g.error = "Q, K and V need rank >= 2", g;
    const int64_t eq = packed ? q.back() / 3 : q.back(), ek = packed ? eq : k.back(), ev = packed ? eq : v.back();
    if ((packed && q.back() % 3) || eq % h || ek % h || ev % h) return g.error = "widths are not num_heads heads", g;
    g.sq = q[q.size() - 2], g.sk = k[k.size() - 2], g.d = eq / h, g.dv = ev / h;
    if (ek / h != g.d) return g.error = "Q and K head sizes differ", g;
    if (v[v.size() - 2] != g.sk) return g.error = "V's rows are not K's", g;
    g.nh = h;
    g.q = {0, g.sq * q.back(), g.d, q.back()};
    g.k = {packed ? eq : 0, g.sk * k.back(), g.d, k.back()};
    g.v = {packed ? 2 * eq : 0, g.sk * v.back(), g.dv, v.back()};
    qb = leading(q), kb = leading(k), vb = leading(v);
    for (Dims* b : {&qb, &kb, &vb}) b->push_back(h);
  } else {
    const Dims &q = sig.inputs[0].shape, &k = sig.inputs[1].shape, &v = sig.inputs[2].shape;
    if (q.size() < 2 || k.size() < 2 || v.size() < 2) return g.error = "Q, K and V need rank >= 2", g;
    g.k_transposed = n.attr_int("k_transposed", 0) != 0;
    g.sq = q[q.size() - 2], g.d = q.back();
    g.sk = g.k_transposed ? k.back() : k[k.size() - 2];
    const int64_t kd = g.k_transposed ? k[k.size() - 2] : k.back();
    g.dv = v.back();
    if (kd != g.d) return g.error = "Q and K head sizes differ", g;
    if (v[v.size() - 2] != g.sk) return g.error = "V's rows are not K's", g;
    g.q = {0, g.sq * g.d, 0, g.d};
    g.k = {0, g.sk * g.d, 0, k.back()};
    g.v = {0, g.sk * g.dv, 0, g.dv};
    qb = leading(q), kb = leading(k), vb = leading(v);
  }
  if (g.sq == 0 || g.sk == 0 || g.d == 0 || g.dv == 0) return g.error = "an empty problem", g;
  Dims b;
  if (!broadcast(qb, kb, &b) || !broadcast(b, vb, &b)) return g.error = "Q, K and V's batch dims do not broadcast", g;
  if (dims_numel(b) == 0) return g.error = "an empty batch", g;
  if (sig.has_input(3)) {
    const Dims& m = sig.inputs[3].shape;
    Dims scores = b;
    scores.push_back(g.sq), scores.push_back(g.sk);
    Dims s2;
    if (m.size() > scores.size() || !broadcast(scores, m, &s2) || s2 != scores)
      return g.error = "the mask does not broadcast to the scores", g;
  }
  if (b.size() > static_cast<size_t>(kAttentionMaxBatchRank))
    return g.error = "more than " + std::to_string(kAttentionMaxBatchRank) + " batch dims", g;
  g.batch = b;
  // Problems: nb batch indices (the lead dims, flattened) x nh heads.
  g.nb = dims_numel(b) / g.nh;
  Dims lead = mha ? Dims(b.begin(), b.end() - 1) : b;
  Dims ql = mha ? Dims(qb.begin(), qb.end() - 1) : qb, kl = mha ? Dims(kb.begin(), kb.end() - 1) : kb,
       vl = mha ? Dims(vb.begin(), vb.end() - 1) : vb;
  g.q.sb = batch_stride(ql, lead, g.q.sb), g.k.sb = batch_stride(kl, lead, g.k.sb);
  g.v.sb = batch_stride(vl, lead, g.v.sb);
  if (g.q.sb < 0 || g.k.sb < 0 || g.v.sb < 0) return g.error = "a batch dim broadcasts only partly (not on CUDA)", g;
  if (mha) {
    g.out = lead;
    g.out.push_back(g.sq), g.out.push_back(g.nh * g.dv);
    g.y = {0, g.sq * g.nh * g.dv, g.dv, g.nh * g.dv};
  } else {
    g.out = b;
    g.out.push_back(g.sq), g.out.push_back(g.dv);
    g.y = {0, g.sq * g.dv, 0, g.dv};
  }
  return g;
}

std::string attention_why_unsupported(const LayerSignature& sig, DataType dt) {
  const bool mha = sig.op() == "MultiHeadAttention";
  for (size_t i = 0; i < (mha ? 1u : 3u); ++i)
    if (!sig.has_input(i)) return "Q, K and V are required";
  for (size_t i = 0; i < sig.inputs.size() && i < 4; ++i)
    if (sig.inputs[i].present && sig.inputs[i].dtype != dt)
      return "input " + std::to_string(i) + " is " + dtype_name(sig.inputs[i].dtype) + ", not " + dtype_name(dt);
  if (sig.inputs.size() > 4) return "more than 4 inputs";
  if (!sig.fully_known()) {
    for (size_t i = 0; i < 3; ++i)
      if (sig.has_input(i) && sig.inputs[i].shape.size() < 2) return "Q, K and V need rank >= 2";
    return "";
  }
  return attention_geometry(sig).error;
}

bool attention_packed(const LayerSignature& sig) { return sig.op() == "MultiHeadAttention" && !sig.has_input(1); }

AttentionSoftmaxParams attention_softmax_params(const AttentionGeometry& g, const LayerSignature& sig, int64_t ld) {
  AttentionSoftmaxParams sm;
  sm.rows_per_problem = g.sq, sm.cols = g.sk, sm.ld = ld;
  sm.batch_rank = static_cast<int>(g.batch.size());
  for (size_t i = 0; i < g.batch.size(); ++i) sm.batch_dims[i] = g.batch[i];
  if (sig.has_input(3)) {
    Dims scores = g.batch;
    scores.push_back(g.sq), scores.push_back(g.sk);
    const Dims& m = sig.inputs[3].shape;
    const Dims ms = ops::strides_of(m);
    const size_t off = scores.size() - m.size();
    std::vector<int64_t> st(scores.size(), 0);
    for (size_t i = off; i < scores.size(); ++i) st[i] = m[i - off] == 1 ? 0 : ms[i - off];
    for (size_t i = 0; i < g.batch.size(); ++i) sm.mask_strides[i] = st[i];
    sm.mask_row_stride = st[scores.size() - 2], sm.mask_col_stride = st[scores.size() - 1];
  }
  return sm;
}

}  // namespace kiln::backends::cuda
