// Attention (opset 23, 24): scaled dot-product attention with multi-head / grouped-query heads,
// 3-D (packed heads) or 4-D inputs, boolean or additive masks, offset-aware causal masking, an
// internal KV cache (past_* -> present_*), an external cache length (nonpad_kv_seqlen, opset 24),
// soft capping, and the optional qk_matmul_output debug output.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/attention_rnn_util.h"

namespace kiln::ops {
namespace {

using arnn::dim_add;
using arnn::dim_at;
using arnn::dim_div;
using arnn::dim_merge;
using arnn::dim_mul;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Attribute validation shared by inference and the kernel.
Status check_attention_attrs(const ir::Node& n) {
  int64_t mode = n.attr_int("qk_matmul_output_mode", 0);
  if (mode < 0 || mode > 3) return InvalidModel("qk_matmul_output_mode must be 0..3, got ", mode);
  if (const ir::Attribute* sp = n.attr("softmax_precision")) {
    int64_t v = sp->i;
    if (v != 1 && v != 10 && v != 11 && v != 16)
      return InvalidModel("softmax_precision must be 1, 10, 11 or 16, got ", v);
  }
  return Status::Ok();
}

Status infer_attention(InferContext& ctx) {
  Status st = check_attention_attrs(ctx.node);
  if (!st.ok()) return ctx.error(st.message());
  DataType dt = ctx.input_dtype(0);
  const SymShape& q = ctx.input_shape(0);
  const SymShape& k = ctx.input_shape(1);
  const SymShape& v = ctx.input_shape(2);
  size_t rank = q.rank_known ? q.rank() : (k.rank_known ? k.rank() : (v.rank_known ? v.rank() : 0));
  if (rank != 0 && rank != 3 && rank != 4)
    return ctx.error(str_cat("Q, K and V must be 3-D or 4-D, got Q ", q.str(), ", K ", k.str(), ", V ", v.str()));
  for (const SymShape* s : {&q, &k, &v})
    if (s->rank_known && rank != 0 && s->rank() != rank)
      return ctx.error(
          str_cat("Q, K and V must have the same rank, got Q ", q.str(), ", K ", k.str(), ", V ", v.str()));
  if (rank == 0) {
    for (size_t i = 0; i < ctx.outputs.size(); ++i) ctx.set_output(i, dt, SymShape());
    return Status::Ok();
  }
  Dim batch = dim_merge(dim_at(q, 0), dim_merge(dim_at(k, 0), dim_at(v, 0)));
  Dim hq, hkv, sq, skv, dk, dv;
  if (rank == 4) {
    hq = dim_at(q, 1);
    hkv = dim_merge(dim_at(k, 1), dim_at(v, 1));
    sq = dim_at(q, 2);
    skv = dim_merge(dim_at(k, 2), dim_at(v, 2));
    dk = dim_merge(dim_at(q, 3), dim_at(k, 3));
    dv = dim_at(v, 3);
  } else {
    const ir::Attribute* qh = ctx.node.attr("q_num_heads");
    const ir::Attribute* kh = ctx.node.attr("kv_num_heads");
    if (!qh || !kh) return ctx.error("3-D inputs need the q_num_heads and kv_num_heads attributes");
    if (qh->i <= 0 || kh->i <= 0)
      return ctx.error(str_cat("q_num_heads (", qh->i, ") and kv_num_heads (", kh->i, ") must be positive"));
    hq = Dim(qh->i);
    hkv = Dim(kh->i);
    sq = dim_at(q, 1);
    skv = dim_merge(dim_at(k, 1), dim_at(v, 1));
    dk = dim_merge(dim_div(dim_at(q, 2), qh->i), dim_div(dim_at(k, 2), kh->i));
    dv = dim_div(dim_at(v, 2), kh->i);
  }
  Dim past = Dim(0);
  if (ctx.has_input(4)) past = dim_merge(dim_at(ctx.input_shape(4), 2), dim_at(ctx.input_shape(5), 2));
  Dim total = dim_add(past, skv);
  if (rank == 4)
    ctx.set_output(0, dt, SymShape({batch, hq, sq, dv}));
  else
    ctx.set_output(0, dt, SymShape({batch, sq, dim_mul(hq, dv)}));
  if (ctx.outputs.size() > 1) ctx.set_output(1, dt, SymShape({batch, hkv, total, dk}));
  if (ctx.outputs.size() > 2) ctx.set_output(2, dt, SymShape({batch, hkv, total, dv}));
  if (ctx.outputs.size() > 3) ctx.set_output(3, dt, SymShape({batch, hq, sq, total}));
  return Status::Ok();
}

// A [B, H, S, D] view of Q, K or V as doubles: 4-D inputs are used as they are, 3-D inputs
// [B, S, H*D] are split into heads.
struct Heads {
  int64_t b = 0, h = 0, s = 0, d = 0;
  std::vector<double> data;  // [b][h][s][d]
  double at(int64_t bi, int64_t hi, int64_t si, int64_t di) const {
    return data[static_cast<size_t>(((bi * h + hi) * s + si) * d + di)];
  }
};

Result<Heads> to_heads(const Tensor& t, int64_t num_heads, const char* name) {
  Heads out;
  std::vector<double> v = arnn::as_f64(t);
  if (t.rank() == 4) {
    out.b = t.dim(0);
    out.h = t.dim(1);
    out.s = t.dim(2);
    out.d = t.dim(3);
    out.data = std::move(v);
    return out;
  }
  int64_t hidden = t.dim(2);
  if (num_heads <= 0 || hidden % num_heads != 0)
    return InvalidArgument(name, " hidden size ", hidden, " is not divisible by its number of heads ", num_heads);
  out.b = t.dim(0);
  out.s = t.dim(1);
  out.h = num_heads;
  out.d = hidden / num_heads;
  out.data.resize(v.size());
  for (int64_t bi = 0; bi < out.b; ++bi)
    for (int64_t si = 0; si < out.s; ++si)
      for (int64_t hi = 0; hi < out.h; ++hi)
        for (int64_t di = 0; di < out.d; ++di)
          out.data[static_cast<size_t>(((bi * out.h + hi) * out.s + si) * out.d + di)] =
              v[static_cast<size_t>((bi * out.s + si) * hidden + hi * out.d + di)];
  return out;
}

// Concatenates past [B, H, P, D] and new [B, H, S, D] along the sequence axis.
Heads concat_seq(const Heads& past, const Heads& cur) {
  Heads out;
  out.b = cur.b;
  out.h = cur.h;
  out.s = past.s + cur.s;
  out.d = cur.d;
  out.data.resize(static_cast<size_t>(out.b * out.h * out.s * out.d));
  for (int64_t bi = 0; bi < out.b; ++bi)
    for (int64_t hi = 0; hi < out.h; ++hi)
      for (int64_t si = 0; si < out.s; ++si)
        for (int64_t di = 0; di < out.d; ++di)
          out.data[static_cast<size_t>(((bi * out.h + hi) * out.s + si) * out.d + di)] =
              si < past.s ? past.at(bi, hi, si, di) : cur.at(bi, hi, si - past.s, di);
  return out;
}

Status attention_kernel(KernelContext& ctx) {
  KILN_RETURN_IF_ERROR(check_attention_attrs(ctx.node));
  const Tensor& q_t = ctx.input(0);
  const Tensor& k_t = ctx.input(1);
  const Tensor& v_t = ctx.input(2);
  DataType dt = q_t.dtype();
  if (!arnn::is_float_dtype(dt)) return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  if (k_t.dtype() != dt || v_t.dtype() != dt)
    return ctx.error(
        str_cat("Q, K and V must share a dtype, got ", q_t.describe(), ", ", k_t.describe(), ", ", v_t.describe()));
  int64_t rank = q_t.rank();
  if ((rank != 3 && rank != 4) || k_t.rank() != rank || v_t.rank() != rank)
    return ctx.error(str_cat("Q, K and V must all be 3-D or all 4-D, got ", q_t.describe(), ", ", k_t.describe(), ", ",
                             v_t.describe()));
  int64_t q_heads_attr = 0, kv_heads_attr = 0;
  if (rank == 3) {
    q_heads_attr = ctx.node.attr_int("q_num_heads", 0);
    kv_heads_attr = ctx.node.attr_int("kv_num_heads", 0);
    if (q_heads_attr <= 0 || kv_heads_attr <= 0)
      return ctx.error("3-D inputs need positive q_num_heads and kv_num_heads attributes");
  }
  KILN_ASSIGN_OR_RETURN(Heads Q, to_heads(q_t, q_heads_attr, "Q"));
  KILN_ASSIGN_OR_RETURN(Heads K, to_heads(k_t, kv_heads_attr, "K"));
  KILN_ASSIGN_OR_RETURN(Heads V, to_heads(v_t, kv_heads_attr, "V"));
  const int64_t B = Q.b, Hq = Q.h, Sq = Q.s, D = Q.d, Hkv = K.h, Dv = V.d;
  if (K.b != B || V.b != B)
    return ctx.error(str_cat("batch sizes differ: Q ", q_t.describe(), ", K ", k_t.describe(), ", V ", v_t.describe()));
  if (V.h != Hkv || V.s != K.s)
    return ctx.error(str_cat("K ", k_t.describe(), " and V ", v_t.describe(), " disagree on heads or sequence length"));
  if (K.d != D) return ctx.error(str_cat("Q head size ", D, " differs from K head size ", K.d));
  if (Hkv <= 0 || Hq % Hkv != 0)
    return ctx.error(str_cat("q_num_heads ", Hq, " must be a multiple of kv_num_heads ", Hkv));
  const int64_t group = Hq / Hkv;

  // KV cache.
  bool has_past_k = ctx.has_input(4), has_past_v = ctx.has_input(5);
  if (has_past_k != has_past_v) return ctx.error("past_key and past_value must be given together");
  int64_t P = 0;
  if (has_past_k) {
    const Tensor& pk = ctx.input(4);
    const Tensor& pv = ctx.input(5);
    if (pk.rank() != 4 || pk.dim(0) != B || pk.dim(1) != Hkv || pk.dim(3) != D)
      return ctx.error(str_cat("past_key ", pk.describe(), " must be [", B, ",", Hkv, ",past,", D, "]"));
    if (pv.rank() != 4 || pv.dim(0) != B || pv.dim(1) != Hkv || pv.dim(2) != pk.dim(2) || pv.dim(3) != Dv)
      return ctx.error(str_cat("past_value ", pv.describe(), " must be [", B, ",", Hkv, ",", pk.dim(2), ",", Dv, "]"));
    if (pk.dtype() != dt || pv.dtype() != dt) return ctx.error("past_key/past_value dtype differs from Q");
    KILN_ASSIGN_OR_RETURN(Heads PK, to_heads(pk, 0, "past_key"));
    KILN_ASSIGN_OR_RETURN(Heads PV, to_heads(pv, 0, "past_value"));
    P = PK.s;
    K = concat_seq(PK, K);
    V = concat_seq(PV, V);
  }
  const int64_t T = K.s;  // total kv length

  // External cache length.
  std::vector<int64_t> nonpad;
  if (ctx.opset() >= 24 && ctx.has_input(6)) {
    if (has_past_k) return ctx.error("nonpad_kv_seqlen cannot be combined with past_key/past_value");
    const Tensor& np = ctx.input(6);
    if (!dtype_is_integer(np.dtype()) || np.numel() != B)
      return ctx.error(str_cat("nonpad_kv_seqlen ", np.describe(), " must be an integer tensor of ", B, " elements"));
    nonpad = to_i64_vector(np);
  }

  // Mask, broadcast right-aligned to [B, Hq, Sq, T]; its last dim may be shorter than T.
  const Tensor* mask = ctx.has_input(3) ? &ctx.input(3) : nullptr;
  Dims mdims(4, 1);
  std::vector<double> mvals;
  bool mask_bool = false;
  if (mask) {
    if (mask->rank() < 1 || mask->rank() > 4)
      return ctx.error(str_cat("attn_mask ", mask->describe(), " must be 1-D to 4-D"));
    mask_bool = mask->dtype() == DataType::kBool;
    if (!mask_bool && !arnn::is_float_dtype(mask->dtype()))
      return ctx.error(str_cat("attn_mask must be bool or float, got ", mask->describe()));
    for (int64_t i = 0; i < mask->rank(); ++i) mdims[static_cast<size_t>(4 - mask->rank() + i)] = mask->dim(i);
    const Dims full = {B, Hq, Sq, T};
    for (size_t i = 0; i < 3; ++i)
      if (mdims[i] != 1 && mdims[i] != full[i])
        return ctx.error(
            str_cat("attn_mask ", mask->describe(), " does not broadcast to [", B, ",", Hq, ",", Sq, ",", T, "]"));
    if (mdims[3] > T) return ctx.error(str_cat("attn_mask ", mask->describe(), " is longer than the ", T, " keys"));
    mvals = arnn::as_f64(*mask);
  }
  auto mask_at = [&](int64_t bi, int64_t hi, int64_t i, int64_t j) -> double {
    // Positions past the mask's end are masked out (False / -inf).
    if (j >= mdims[3]) return kNegInf;
    int64_t idx =
        (((mdims[0] == 1 ? 0 : bi) * mdims[1] + (mdims[1] == 1 ? 0 : hi)) * mdims[2] + (mdims[2] == 1 ? 0 : i)) *
            mdims[3] +
        j;
    double m = mvals[static_cast<size_t>(idx)];
    if (mask_bool) return m != 0 ? 0.0 : kNegInf;
    return m;
  };

  const bool causal = ctx.node.attr_int("is_causal", 0) != 0;
  const int64_t mode = ctx.node.attr_int("qk_matmul_output_mode", 0);
  const double softcap = ctx.node.attr_float("softcap", 0.0f);
  double scale = 1.0 / std::sqrt(static_cast<double>(D));
  if (const ir::Attribute* a = ctx.node.attr("scale")) scale = static_cast<double>(a->f);
  const double sqrt_scale = std::sqrt(scale);
  // Q and K are each scaled by sqrt(scale) in the input precision, as the spec's graph does.
  auto scaled = [&](double x) { return arnn::round_to(x * sqrt_scale, dt); };

  std::vector<double> y(static_cast<size_t>(B * Hq * Sq * Dv), 0.0);
  std::vector<double> qk(static_cast<size_t>(B * Hq * Sq * T), 0.0);
  std::vector<double> bias(static_cast<size_t>(T)), score(static_cast<size_t>(T)), prob(static_cast<size_t>(T));
  std::vector<double> qrow(static_cast<size_t>(D));
  for (int64_t bi = 0; bi < B; ++bi) {
    int64_t offset = has_past_k ? P : (!nonpad.empty() ? nonpad[static_cast<size_t>(bi)] - Sq : 0);
    for (int64_t hi = 0; hi < Hq; ++hi) {
      const int64_t kh = hi / group;
      for (int64_t i = 0; i < Sq; ++i) {
        for (int64_t d = 0; d < D; ++d) qrow[static_cast<size_t>(d)] = scaled(Q.at(bi, hi, i, d));
        // Additive bias: mask, causal frontier (j <= i + offset), external cache length.
        for (int64_t j = 0; j < T; ++j) {
          double b = mask ? mask_at(bi, hi, i, j) : 0.0;
          if (causal && j > i + offset) b += kNegInf;
          if (!nonpad.empty() && j >= nonpad[static_cast<size_t>(bi)]) b += kNegInf;
          bias[static_cast<size_t>(j)] = b;
        }
        for (int64_t j = 0; j < T; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += qrow[static_cast<size_t>(d)] * scaled(K.at(bi, kh, j, d));
          if (softcap > 0) s = softcap * std::tanh(s / softcap);
          score[static_cast<size_t>(j)] = s;
        }
        double* qk_row = &qk[static_cast<size_t>(((bi * Hq + hi) * Sq + i) * T)];
        for (int64_t j = 0; j < T; ++j) {
          double s = score[static_cast<size_t>(j)];
          qk_row[j] = mode == 2 ? s + bias[static_cast<size_t>(j)] : s;
        }
        // Softmax over s + bias. A row whose maximum is -inf softmaxes to zeros; NaN propagates.
        double mx = kNegInf;
        bool nan = false;
        for (int64_t j = 0; j < T; ++j) {
          double x = score[static_cast<size_t>(j)] + bias[static_cast<size_t>(j)];
          if (std::isnan(x))
            nan = true;
          else
            mx = std::max(mx, x);
        }
        double sum = 0;
        for (int64_t j = 0; j < T; ++j) {
          double x = score[static_cast<size_t>(j)] + bias[static_cast<size_t>(j)];
          double e = nan ? std::numeric_limits<double>::quiet_NaN() : (mx == kNegInf ? 0.0 : std::exp(x - mx));
          prob[static_cast<size_t>(j)] = e;
          sum += e;
        }
        if (sum == 0) sum = 1;
        for (int64_t j = 0; j < T; ++j) prob[static_cast<size_t>(j)] /= sum;
        // Fully-masked-row guard, decided on the bias alone: the row becomes zeros.
        bool all_masked = T > 0;
        for (int64_t j = 0; j < T && all_masked; ++j)
          if (!(bias[static_cast<size_t>(j)] == kNegInf)) all_masked = false;
        if (all_masked) std::fill(prob.begin(), prob.end(), 0.0);
        if (mode == 3)
          for (int64_t j = 0; j < T; ++j) qk_row[j] = prob[static_cast<size_t>(j)];
        double* y_row = &y[static_cast<size_t>(((bi * Hq + hi) * Sq + i) * Dv)];
        for (int64_t j = 0; j < T; ++j) {
          double p = prob[static_cast<size_t>(j)];
          for (int64_t d = 0; d < Dv; ++d) y_row[d] += p * V.at(bi, kh, j, d);
        }
      }
    }
  }

  if (rank == 4) {
    ctx.set_output(0, arnn::from_f64(y, {B, Hq, Sq, Dv}, dt));
  } else {
    std::vector<double> y3(y.size());
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t hi = 0; hi < Hq; ++hi)
        for (int64_t i = 0; i < Sq; ++i)
          for (int64_t d = 0; d < Dv; ++d)
            y3[static_cast<size_t>((bi * Sq + i) * Hq * Dv + hi * Dv + d)] =
                y[static_cast<size_t>(((bi * Hq + hi) * Sq + i) * Dv + d)];
    ctx.set_output(0, arnn::from_f64(y3, {B, Sq, Hq * Dv}, dt));
  }
  if (ctx.wants_output(1)) ctx.set_output(1, arnn::from_f64(K.data, {B, Hkv, T, D}, dt));
  if (ctx.wants_output(2)) ctx.set_output(2, arnn::from_f64(V.data, {B, Hkv, T, Dv}, dt));
  if (ctx.wants_output(3)) ctx.set_output(3, arnn::from_f64(qk, {B, Hq, Sq, T}, dt));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Attention, 23, infer_attention, attention_kernel, 3, 7);

}  // namespace kiln::ops
