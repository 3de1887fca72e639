// Transformer building blocks around attention: RotaryEmbedding (23), SwiGLU (28),
// CausalConvWithState (27), LinearAttention (27) and ai.onnx.preview FlexAttention (1).
#include <cmath>
#include <limits>

#include "ops/attention_rnn_util.h"

namespace kiln::ops {
namespace {

using arnn::dim_at;
using arnn::dim_div;
using arnn::dim_merge;
using arnn::dim_mul;
using arnn::round_to;

Status require_float(KernelContext& ctx, const Tensor& t, const char* name) {
  if (!arnn::is_float_dtype(t.dtype()))
    return ctx.unsupported(str_cat(name, " dtype ", dtype_name(t.dtype()), " is not supported"));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// RotaryEmbedding: rotates pairs of each head's first rotary_embedding_dim features by the
// angle whose cos/sin come from the caches (indexed by position_ids when given).

Status infer_rotary(InferContext& ctx) {
  const SymShape& x = ctx.input_shape(0);
  if (x.rank_known && x.rank() != 3 && x.rank() != 4)
    return ctx.error(str_cat("input must be 3-D or 4-D, got ", x.str()));
  if (x.rank_known && x.rank() == 3 && ctx.node.attr_int("num_heads", 0) <= 0)
    return ctx.error("3-D input needs a positive num_heads attribute");
  ctx.set_output(0, ctx.input(0));
  return Status::Ok();
}

Status rotary_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& cos_t = ctx.input(1);
  const Tensor& sin_t = ctx.input(2);
  KILN_RETURN_IF_ERROR(require_float(ctx, x, "input"));
  DataType dt = x.dtype();
  int64_t B, S, H, D;
  const bool four_d = x.rank() == 4;
  if (four_d) {  // [B, H, S, D]
    B = x.dim(0), H = x.dim(1), S = x.dim(2), D = x.dim(3);
  } else if (x.rank() == 3) {  // [B, S, H*D]
    H = ctx.node.attr_int("num_heads", 0);
    if (H <= 0) return ctx.error("3-D input needs a positive num_heads attribute");
    B = x.dim(0), S = x.dim(1);
    if (x.dim(2) % H != 0) return ctx.error(str_cat("hidden size ", x.dim(2), " is not divisible by num_heads ", H));
    D = x.dim(2) / H;
  } else {
    return ctx.error(str_cat("input must be 3-D or 4-D, got ", x.describe()));
  }
  int64_t rot = ctx.node.attr_int("rotary_embedding_dim", 0);
  if (rot == 0) rot = D;
  if (rot < 0 || rot > D || rot % 2 != 0)
    return ctx.error(str_cat("rotary_embedding_dim ", rot, " must be even and at most the head size ", D));
  const int64_t half = rot / 2;
  const bool interleaved = ctx.node.attr_int("interleaved", 0) != 0;
  std::vector<int64_t> pos;
  if (ctx.has_input(3)) {
    const Tensor& p = ctx.input(3);
    if (p.rank() != 2 || p.dim(0) != B || p.dim(1) != S)
      return ctx.error(str_cat("position_ids ", p.describe(), " must be [", B, ",", S, "]"));
    if (cos_t.rank() != 2 || sin_t.shape() != cos_t.shape() || cos_t.dim(1) != half)
      return ctx.error(str_cat("with position_ids, cos_cache ", cos_t.describe(), " and sin_cache ", sin_t.describe(),
                               " must be [max_position, ", half, "]"));
    pos = to_i64_vector(p);
    for (int64_t v : pos)
      if (v < 0 || v >= cos_t.dim(0))
        return ctx.error(str_cat("position id ", v, " is outside the caches' ", cos_t.dim(0), " positions"));
  } else if (cos_t.rank() != 3 || sin_t.shape() != cos_t.shape() || cos_t.dim(0) != B || cos_t.dim(1) != S ||
             cos_t.dim(2) != half) {
    return ctx.error(str_cat("without position_ids, cos_cache ", cos_t.describe(), " and sin_cache ", sin_t.describe(),
                             " must be [", B, ",", S, ",", half, "]"));
  }
  std::vector<double> xv = arnn::as_f64(x), cv = arnn::as_f64(cos_t), sv = arnn::as_f64(sin_t);
  std::vector<double> out = xv;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) {
      int64_t row = pos.empty() ? b * S + s : pos[static_cast<size_t>(b * S + s)];
      const double* c = &cv[static_cast<size_t>(row * half)];
      const double* sn = &sv[static_cast<size_t>(row * half)];
      for (int64_t h = 0; h < H; ++h) {
        int64_t base = four_d ? ((b * H + h) * S + s) * D : (b * S + s) * H * D + h * D;
        for (int64_t i = 0; i < half; ++i) {
          int64_t i1 = interleaved ? base + 2 * i : base + i;
          int64_t i2 = interleaved ? base + 2 * i + 1 : base + i + half;
          double x1 = xv[static_cast<size_t>(i1)], x2 = xv[static_cast<size_t>(i2)];
          out[static_cast<size_t>(i1)] = round_to(c[i] * x1, dt) - round_to(sn[i] * x2, dt);
          out[static_cast<size_t>(i2)] = round_to(sn[i] * x1, dt) + round_to(c[i] * x2, dt);
        }
      }
    }
  ctx.set_output(0, arnn::from_f64(out, x.shape(), dt));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// SwiGLU: Y = A * sigmoid(alpha * A) * B, A and B of identical shape (no broadcasting).

Status infer_swiglu(InferContext& ctx) {
  const SymShape& a = ctx.input_shape(0);
  const SymShape& b = ctx.input_shape(1);
  if (a.rank_known && b.rank_known) {
    if (a.rank() != b.rank()) return ctx.error(str_cat("A ", a.str(), " and B ", b.str(), " must have the same shape"));
    std::vector<Dim> d(a.rank());
    for (size_t i = 0; i < a.rank(); ++i) {
      if (a.dims[i].known() && b.dims[i].known() && a.dims[i].value != b.dims[i].value)
        return ctx.error(str_cat("A ", a.str(), " and B ", b.str(), " must have the same shape"));
      d[i] = dim_merge(a.dims[i], b.dims[i]);
    }
    ctx.set_output(0, ctx.input_dtype(0), SymShape(d));
  } else {
    ctx.set_output(0, ctx.input_dtype(0), a.rank_known ? a : b);
  }
  return Status::Ok();
}

Status swiglu_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  KILN_RETURN_IF_ERROR(require_float(ctx, a, "A"));
  if (a.dtype() != b.dtype() || a.shape() != b.shape())
    return ctx.error(str_cat("A ", a.describe(), " and B ", b.describe(), " must have the same shape and dtype"));
  DataType dt = a.dtype();
  double alpha = ctx.node.attr_float("alpha", 1.0f);
  std::vector<double> av = arnn::as_f64(a), bv = arnn::as_f64(b), y(av.size());
  // Each step rounds to the input precision, as the spec's Swish * B composition does.
  for (size_t i = 0; i < av.size(); ++i) {
    double z = round_to(alpha * av[i], dt);
    double sig = round_to(1.0 / round_to(1.0 + round_to(std::exp(-z), dt), dt), dt);
    y[i] = round_to(av[i] * sig, dt) * bv[i];
  }
  ctx.set_output(0, arnn::from_f64(y, a.shape(), dt));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// CausalConvWithState: depthwise causal 1-D convolution over [past_state | input], with an
// optional fused SiLU, returning the last k-1 positions as the next state.

Status causal_conv_activation(const ir::Node& n, bool* silu) {
  std::string act = n.attr_string("activation", "none");
  if (act != "none" && act != "silu" && act != "swish")
    return InvalidModel("activation must be 'none', 'silu' or 'swish', got '", act, "'");
  *silu = act != "none";
  return Status::Ok();
}

Status infer_causal_conv(InferContext& ctx) {
  bool silu;
  Status st = causal_conv_activation(ctx.node, &silu);
  if (!st.ok()) return ctx.error(st.message());
  const SymShape& x = ctx.input_shape(0);
  const SymShape& w = ctx.input_shape(1);
  if (x.rank_known && x.rank() != 3) return ctx.error(str_cat("input must be 3-D, got ", x.str()));
  if (w.rank_known && w.rank() != 3) return ctx.error(str_cat("weight must be 3-D, got ", w.str()));
  ctx.set_output(0, ctx.input(0));
  Dim k = dim_at(w, 2);
  Dim state = k.known() ? Dim(k.value - 1) : (ctx.has_input(3) ? dim_at(ctx.input_shape(3), 2) : Dim());
  if (ctx.outputs.size() > 1)
    ctx.set_output(1, ctx.input_dtype(0),
                   x.rank_known ? SymShape({x.dims[0], dim_merge(x.dims[1], dim_at(w, 0)), state}) : SymShape());
  return Status::Ok();
}

Status causal_conv_kernel(KernelContext& ctx) {
  bool silu;
  KILN_RETURN_IF_ERROR(causal_conv_activation(ctx.node, &silu));
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  KILN_RETURN_IF_ERROR(require_float(ctx, x, "input"));
  if (x.rank() != 3) return ctx.error(str_cat("input must be 3-D [batch, channels, length], got ", x.describe()));
  const int64_t B = x.dim(0), C = x.dim(1), L = x.dim(2);
  if (w.rank() != 3 || w.dim(0) != C || w.dim(1) != 1 || w.dim(2) < 1)
    return ctx.error(str_cat("weight ", w.describe(), " must be [", C, ",1,k] with k >= 1"));
  const int64_t k = w.dim(2), ks = k - 1;
  std::vector<double> bias(static_cast<size_t>(C), 0.0);
  if (ctx.has_input(2)) {
    const Tensor& b = ctx.input(2);
    if (b.numel() != C || b.rank() != 1) return ctx.error(str_cat("bias ", b.describe(), " must be [", C, "]"));
    bias = arnn::as_f64(b);
  }
  std::vector<double> state(static_cast<size_t>(B * C * ks), 0.0);
  if (ctx.has_input(3)) {
    const Tensor& p = ctx.input(3);
    if (p.rank() != 3 || p.dim(0) != B || p.dim(1) != C || p.dim(2) != ks)
      return ctx.error(str_cat("past_state ", p.describe(), " must be [", B, ",", C, ",", ks, "]"));
    state = arnn::as_f64(p);
  }
  DataType dt = x.dtype();
  std::vector<double> xv = arnn::as_f64(x), wv = arnn::as_f64(w);
  std::vector<double> y(static_cast<size_t>(B * C * L)), present(static_cast<size_t>(B * C * ks));
  std::vector<double> padded(static_cast<size_t>(ks + L));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t t = 0; t < ks; ++t)
        padded[static_cast<size_t>(t)] = state[static_cast<size_t>((b * C + c) * ks + t)];
      for (int64_t t = 0; t < L; ++t)
        padded[static_cast<size_t>(ks + t)] = xv[static_cast<size_t>((b * C + c) * L + t)];
      for (int64_t t = 0; t < L; ++t) {
        double acc = bias[static_cast<size_t>(c)];
        for (int64_t j = 0; j < k; ++j) acc += wv[static_cast<size_t>(c * k + j)] * padded[static_cast<size_t>(t + j)];
        if (silu) {
          acc = round_to(acc, dt);
          acc = acc * arnn::sigmoid(acc);
        }
        y[static_cast<size_t>((b * C + c) * L + t)] = acc;
      }
      for (int64_t t = 0; t < ks; ++t)
        present[static_cast<size_t>((b * C + c) * ks + t)] = padded[static_cast<size_t>(L + t)];
    }
  ctx.set_output(0, arnn::from_f64(y, x.shape(), dt));
  if (ctx.wants_output(1)) ctx.set_output(1, arnn::from_f64(present, {B, C, ks}, dt));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// LinearAttention: a recurrent state S (B, H_kv, d_k, d_v) updated per token with one of four
// rules (linear, gated, delta, gated_delta) and read by the queries: o_t = scale * q_t^T S_t.

struct LinearRule {
  bool gating = false, delta = false;
};

Status linear_attention_attrs(const ir::Node& n, LinearRule* r, int64_t* hq, int64_t* hkv) {
  std::string rule = n.attr_string("update_rule", "gated_delta");
  if (rule != "linear" && rule != "gated" && rule != "delta" && rule != "gated_delta")
    return InvalidModel("update_rule must be linear, gated, delta or gated_delta, got '", rule, "'");
  r->gating = rule == "gated" || rule == "gated_delta";
  r->delta = rule == "delta" || rule == "gated_delta";
  *hq = n.attr_int("q_num_heads", 0);
  *hkv = n.attr_int("kv_num_heads", 0);
  if (*hq <= 0 || *hkv <= 0 || *hq % *hkv != 0)
    return InvalidModel("q_num_heads (", *hq, ") must be a positive multiple of kv_num_heads (", *hkv, ")");
  return Status::Ok();
}

Status infer_linear_attention(InferContext& ctx) {
  LinearRule r;
  int64_t hq, hkv;
  Status st = linear_attention_attrs(ctx.node, &r, &hq, &hkv);
  if (!st.ok()) return ctx.error(st.message());
  const SymShape& q = ctx.input_shape(0);
  const SymShape& k = ctx.input_shape(1);
  const SymShape& v = ctx.input_shape(2);
  for (const SymShape* s : {&q, &k, &v})
    if (s->rank_known && s->rank() != 3) return ctx.error(str_cat("query, key and value must be 3-D, got ", s->str()));
  Dim batch = dim_merge(dim_at(q, 0), dim_merge(dim_at(k, 0), dim_at(v, 0)));
  Dim seq = dim_merge(dim_at(q, 1), dim_merge(dim_at(k, 1), dim_at(v, 1)));
  Dim dk = dim_merge(dim_div(dim_at(q, 2), hq), dim_div(dim_at(k, 2), hkv));
  Dim dv = dim_div(dim_at(v, 2), hkv);
  ctx.set_output(0, ctx.input_dtype(0), SymShape({batch, seq, dim_mul(Dim(hq), dv)}));
  DataType sdt = ctx.has_input(3) ? ctx.input_dtype(3) : ctx.input_dtype(0);
  if (ctx.outputs.size() > 1) ctx.set_output(1, sdt, SymShape({batch, Dim(hkv), dk, dv}));
  return Status::Ok();
}

Status linear_attention_kernel(KernelContext& ctx) {
  LinearRule rule;
  int64_t Hq, Hkv;
  KILN_RETURN_IF_ERROR(linear_attention_attrs(ctx.node, &rule, &Hq, &Hkv));
  const Tensor& q = ctx.input(0);
  const Tensor& k = ctx.input(1);
  const Tensor& v = ctx.input(2);
  KILN_RETURN_IF_ERROR(require_float(ctx, q, "query"));
  if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3)
    return ctx.error(
        str_cat("query, key and value must be 3-D, got ", q.describe(), ", ", k.describe(), ", ", v.describe()));
  const int64_t B = q.dim(0), T = q.dim(1);
  if (k.dim(0) != B || v.dim(0) != B || k.dim(1) != T || v.dim(1) != T)
    return ctx.error(str_cat("query ", q.describe(), ", key ", k.describe(), ", value ", v.describe(),
                             " disagree on batch or sequence length"));
  if (q.dim(2) % Hq != 0 || k.dim(2) % Hkv != 0 || v.dim(2) % Hkv != 0)
    return ctx.error("query/key/value hidden sizes must be divisible by their numbers of heads");
  const int64_t Dk = q.dim(2) / Hq, Dv = v.dim(2) / Hkv, group = Hq / Hkv;
  if (k.dim(2) / Hkv != Dk) return ctx.error(str_cat("key head size ", k.dim(2) / Hkv, " differs from query's ", Dk));
  const bool has_decay = ctx.has_input(4), has_beta = ctx.has_input(5);
  if (rule.gating != has_decay)
    return ctx.error(rule.gating ? "this update_rule needs the decay input" : "this update_rule takes no decay input");
  if (rule.delta != has_beta)
    return ctx.error(rule.delta ? "this update_rule needs the beta input" : "this update_rule takes no beta input");
  int64_t decay_w = 0, beta_w = 0;
  std::vector<double> decay, beta;
  if (has_decay) {
    const Tensor& g = ctx.input(4);
    decay_w = g.rank() == 3 ? g.dim(2) : -1;
    if (g.rank() != 3 || g.dim(0) != B || g.dim(1) != T || (decay_w != Hkv && decay_w != Hkv * Dk))
      return ctx.error(str_cat("decay ", g.describe(), " must be [", B, ",", T, ",", Hkv, " or ", Hkv * Dk, "]"));
    decay = arnn::as_f64(g);
  }
  if (has_beta) {
    const Tensor& be = ctx.input(5);
    beta_w = be.rank() == 3 ? be.dim(2) : -1;
    if (be.rank() != 3 || be.dim(0) != B || be.dim(1) != T || (beta_w != Hkv && beta_w != 1))
      return ctx.error(str_cat("beta ", be.describe(), " must be [", B, ",", T, ",", Hkv, " or 1]"));
    beta = arnn::as_f64(be);
  }
  DataType state_dt = q.dtype();
  std::vector<double> S(static_cast<size_t>(B * Hkv * Dk * Dv), 0.0);
  if (ctx.has_input(3)) {
    const Tensor& p = ctx.input(3);
    KILN_RETURN_IF_ERROR(require_float(ctx, p, "past_state"));
    if (p.shape() != Dims{B, Hkv, Dk, Dv})
      return ctx.error(str_cat("past_state ", p.describe(), " must be [", B, ",", Hkv, ",", Dk, ",", Dv, "]"));
    state_dt = p.dtype();
    S = arnn::as_f64(p);
  }
  double scale = ctx.node.attr_float("scale", 0.0f);
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(Dk));
  std::vector<double> qv = arnn::as_f64(q), kv = arnn::as_f64(k), vv = arnn::as_f64(v);
  std::vector<double> out(static_cast<size_t>(B * T * Hq * Dv), 0.0), vt(static_cast<size_t>(Dv));
  auto st_at = [&](int64_t b, int64_t h, int64_t i, int64_t j) -> double& {
    return S[static_cast<size_t>(((b * Hkv + h) * Dk + i) * Dv + j)];
  };
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < Hkv; ++h) {
        const double* kt = &kv[static_cast<size_t>((b * T + t) * Hkv * Dk + h * Dk)];
        if (rule.gating) {
          for (int64_t i = 0; i < Dk; ++i) {
            int64_t gi = decay_w == Hkv ? (b * T + t) * Hkv + h : (b * T + t) * Hkv * Dk + h * Dk + i;
            double g = std::exp(decay[static_cast<size_t>(gi)]);
            for (int64_t j = 0; j < Dv; ++j) st_at(b, h, i, j) *= g;
          }
        }
        for (int64_t j = 0; j < Dv; ++j)
          vt[static_cast<size_t>(j)] = vv[static_cast<size_t>((b * T + t) * Hkv * Dv + h * Dv + j)];
        if (rule.delta) {
          double be = beta[static_cast<size_t>((b * T + t) * beta_w + (beta_w == 1 ? 0 : h))];
          for (int64_t j = 0; j < Dv; ++j) {
            double retrieved = 0;
            for (int64_t i = 0; i < Dk; ++i) retrieved += st_at(b, h, i, j) * kt[i];
            vt[static_cast<size_t>(j)] = be * (vt[static_cast<size_t>(j)] - retrieved);
          }
        }
        for (int64_t i = 0; i < Dk; ++i)
          for (int64_t j = 0; j < Dv; ++j) st_at(b, h, i, j) += kt[i] * vt[static_cast<size_t>(j)];
      }
      for (int64_t h = 0; h < Hq; ++h) {
        const double* qt = &qv[static_cast<size_t>((b * T + t) * Hq * Dk + h * Dk)];
        for (int64_t j = 0; j < Dv; ++j) {
          double acc = 0;
          for (int64_t i = 0; i < Dk; ++i) acc += qt[i] * st_at(b, h / group, i, j);
          out[static_cast<size_t>((b * T + t) * Hq * Dv + h * Dv + j)] = scale * acc;
        }
      }
    }
  ctx.set_output(0, arnn::from_f64(out, {B, T, Hq * Dv}, q.dtype()));
  if (ctx.wants_output(1)) ctx.set_output(1, arnn::from_f64(S, {B, Hkv, Dk, Dv}, state_dt));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// FlexAttention (ai.onnx.preview): attention whose scores and probabilities may be rewritten by
// the score_mod / prob_mod subgraphs, evaluated in the softmax precision.

Status infer_flex_attention(InferContext& ctx) {
  const SymShape& q = ctx.input_shape(0);
  const SymShape& k = ctx.input_shape(1);
  const SymShape& v = ctx.input_shape(2);
  for (const SymShape* s : {&q, &k, &v})
    if (s->rank_known && s->rank() != 4) return ctx.error(str_cat("Q, K and V must be 4-D, got ", s->str()));
  ctx.set_output(0, ctx.input_dtype(0),
                 SymShape({dim_merge(dim_at(q, 0), dim_at(k, 0)), dim_at(q, 1), dim_at(q, 2), dim_at(v, 3)}));
  return Status::Ok();
}

Result<DataType> flex_compute_dtype(const ir::Node& n, DataType in) {
  if (const ir::Attribute* a = n.attr("softmax_precision")) {
    switch (a->i) {
      case 1: return DataType::kFloat32;
      case 10: return DataType::kFloat16;
      case 11: return DataType::kFloat64;
      case 16: return DataType::kBFloat16;
      default: return InvalidModel("softmax_precision must be 1, 10, 11 or 16, got ", a->i);
    }
  }
  return in == DataType::kFloat64 ? DataType::kFloat64 : DataType::kFloat32;
}

// Runs a modifier subgraph on `x` (values in `vals`, dtype `cdt`) and reads its output back.
Status run_mod(KernelContext& ctx, const ir::Attribute* g, const Dims& shape, DataType cdt, std::vector<double>& vals) {
  if (!g || !g->g) return Status::Ok();
  if (!ctx.subgraphs) return ctx.unsupported("modifier subgraphs need an interpreter to run them");
  Tensor in = arnn::from_f64(vals, shape, cdt);
  KILN_ASSIGN_OR_RETURN(std::vector<Value> outs, ctx.subgraphs->run_subgraph(*g->g, {Value(in)}));
  if (outs.size() != 1 || !outs[0].is_tensor()) return ctx.error("a modifier subgraph must produce exactly one tensor");
  const Tensor& o = outs[0].tensor;
  if (o.shape() != shape)
    return ctx.error(str_cat("modifier subgraph output ", o.describe(), " must keep the shape ", dims_str(shape)));
  if (!dtype_is_float(o.dtype()))
    return ctx.error(str_cat("modifier subgraph output ", o.describe(), " must be float"));
  vals = arnn::as_f64(o);
  for (double& x : vals) x = round_to(x, cdt);
  return Status::Ok();
}

Status flex_attention_kernel(KernelContext& ctx) {
  const Tensor& q = ctx.input(0);
  const Tensor& k = ctx.input(1);
  const Tensor& v = ctx.input(2);
  KILN_RETURN_IF_ERROR(require_float(ctx, q, "Q"));
  DataType dt = q.dtype();
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4)
    return ctx.error(str_cat("Q, K and V must be 4-D, got ", q.describe(), ", ", k.describe(), ", ", v.describe()));
  if (k.dtype() != dt || v.dtype() != dt) return ctx.error("Q, K and V must share a dtype");
  const int64_t B = q.dim(0), Hq = q.dim(1), L = q.dim(2), E = q.dim(3);
  const int64_t Hkv = k.dim(1), S = k.dim(2), Ev = v.dim(3);
  if (k.dim(0) != B || v.dim(0) != B || v.dim(1) != Hkv || v.dim(2) != S || k.dim(3) != E)
    return ctx.error(str_cat("shapes disagree: Q ", q.describe(), ", K ", k.describe(), ", V ", v.describe()));
  if (Hkv <= 0 || Hq % Hkv != 0) return ctx.error(str_cat("q heads ", Hq, " must be a multiple of kv heads ", Hkv));
  const int64_t group = Hq / Hkv;
  KILN_ASSIGN_OR_RETURN(DataType cdt, flex_compute_dtype(ctx.node, dt));
  double scale = 1.0 / std::sqrt(static_cast<double>(E));
  if (const ir::Attribute* a = ctx.node.attr("scale")) scale = a->f;
  // sqrt(scale) is taken in float32, then held in the input precision.
  const double ss = round_to(static_cast<double>(std::sqrt(static_cast<float>(scale))), dt);
  std::vector<double> qv = arnn::as_f64(q), kv = arnn::as_f64(k), vv = arnn::as_f64(v);
  for (double& x : qv) x = round_to(x * ss, dt);
  for (double& x : kv) x = round_to(x * ss, dt);
  const Dims sshape = {B, Hq, L, S};
  std::vector<double> scores(static_cast<size_t>(B * Hq * L * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < S; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < E; ++e)
            acc += qv[static_cast<size_t>(((b * Hq + h) * L + i) * E + e)] *
                   kv[static_cast<size_t>(((b * Hkv + h / group) * S + j) * E + e)];
          scores[static_cast<size_t>(((b * Hq + h) * L + i) * S + j)] = round_to(round_to(acc, dt), cdt);
        }
  KILN_RETURN_IF_ERROR(run_mod(ctx, ctx.node.attr("score_mod"), sshape, cdt, scores));
  for (int64_t r = 0; r < B * Hq * L; ++r) {
    double* row = &scores[static_cast<size_t>(r * S)];
    double mx = -std::numeric_limits<double>::infinity();
    bool nan = false;
    for (int64_t j = 0; j < S; ++j) {
      if (std::isnan(row[j]))
        nan = true;
      else
        mx = std::max(mx, row[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < S; ++j) {
      row[j] = nan ? std::numeric_limits<double>::quiet_NaN() : std::exp(row[j] - mx);
      sum += row[j];
    }
    for (int64_t j = 0; j < S; ++j) row[j] = round_to(row[j] / sum, cdt);
  }
  KILN_RETURN_IF_ERROR(run_mod(ctx, ctx.node.attr("prob_mod"), sshape, cdt, scores));
  std::vector<double> y(static_cast<size_t>(B * Hq * L * Ev), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t e = 0; e < Ev; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < S; ++j)
            acc += scores[static_cast<size_t>(((b * Hq + h) * L + i) * S + j)] *
                   vv[static_cast<size_t>(((b * Hkv + h / group) * S + j) * Ev + e)];
          y[static_cast<size_t>(((b * Hq + h) * L + i) * Ev + e)] = acc;
        }
  ctx.set_output(0, arnn::from_f64(y, {B, Hq, L, Ev}, dt));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", RotaryEmbedding, 23, infer_rotary, rotary_kernel, 3, 4);
KILN_REGISTER_OP_ARITY("", SwiGLU, 28, infer_swiglu, swiglu_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", CausalConvWithState, 27, infer_causal_conv, causal_conv_kernel, 2, 4);
KILN_REGISTER_OP_ARITY("", LinearAttention, 27, infer_linear_attention, linear_attention_kernel, 3, 6);
KILN_REGISTER_OP_ARITY("ai.onnx.preview", FlexAttention, 1, infer_flex_attention, flex_attention_kernel, 3, 3);

}  // namespace kiln::ops
