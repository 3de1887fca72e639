// CausalConvWithState (opset 27): stateful causal depthwise 1-D convolution.
//
// padded = concat(past_state or zeros [B, C, k-1], input [B, C, L]) along the last axis;
// output[b, c, t] = act(bias[c] + sum_j weight[c, 0, j] * padded[b, c, t + j]) with act none or
// SiLU (x * sigmoid(x), also called swish); present_state = the last k - 1 positions of padded.
#include <cmath>

#include "ops/conv_util.h"

namespace kiln::ops {
namespace {

Status check_activation(const ir::Node& node, bool* silu) {
  std::string act = node.attr_string("activation", "none");
  if (act != "none" && act != "silu" && act != "swish")
    return InvalidModel(node.where(), "activation '", act, "' is not one of none, silu, swish");
  *silu = act != "none";
  return Status::Ok();
}

Status infer_causal_conv(InferContext& ctx) {
  bool silu;
  KILN_RETURN_IF_ERROR(check_activation(ctx.node, &silu));
  const SymShape& xs = ctx.input_shape(0);
  const SymShape& ws = ctx.input_shape(1);
  DataType dt = ctx.input_dtype(0);
  if (xs.rank_known && xs.rank() != 3) return ctx.error(str_cat("input must be [B, C, L], got ", xs.str()));
  if (ws.rank_known && ws.rank() != 3) return ctx.error(str_cat("weight must be [C, 1, k], got ", ws.str()));
  ctx.set_output(0, dt, xs);
  Dim b = xs.rank_known ? xs.dims[0] : Dim(), c = xs.rank_known ? xs.dims[1] : Dim(), km1;
  if (!c.known() && ws.rank_known) c = ws.dims[0];
  if (ws.rank_known && ws.dims[2].known()) {
    if (ws.dims[2].value < 1) return ctx.error(str_cat("kernel size must be >= 1, got ", ws.dims[2].value));
    km1 = Dim(ws.dims[2].value - 1);
  } else if (ctx.has_input(3) && ctx.input_shape(3).rank_known && ctx.input_shape(3).rank() == 3) {
    km1 = ctx.input_shape(3).dims[2];
  }
  if (ctx.outputs.size() > 1) ctx.set_output(1, dt, SymShape({b, c, km1}));
  return Status::Ok();
}

Status causal_conv_kernel(KernelContext& ctx) {
  bool silu;
  KILN_RETURN_IF_ERROR(check_activation(ctx.node, &silu));
  const Tensor& x0 = ctx.input(0);
  const Tensor& w0 = ctx.input(1);
  if (!dtype_is_float(x0.dtype())) return ctx.unsupported(str_cat("CausalConvWithState on ", x0.describe()));
  if (x0.rank() != 3) return ctx.error(str_cat("input must be [B, C, L], got ", x0.describe()));
  const int64_t B = x0.dim(0), C = x0.dim(1), L = x0.dim(2);
  if (w0.dtype() != x0.dtype() || w0.rank() != 3 || w0.dim(0) != C || w0.dim(1) != 1 || w0.dim(2) < 1)
    return ctx.error(str_cat("weight ", w0.describe(), " must be [", C, ", 1, k >= 1] of ", dtype_name(x0.dtype())));
  const int64_t K = w0.dim(2), P = K - 1, T = P + L;
  Tensor bias, past;
  if (ctx.has_input(2)) {
    bias = ctx.input(2);
    if (bias.dtype() != x0.dtype() || bias.shape() != Dims{C})
      return ctx.error(str_cat("bias ", bias.describe(), " must be [", C, "]"));
    bias = upcast_float(bias);
  }
  if (ctx.has_input(3)) {
    past = ctx.input(3);
    if (past.dtype() != x0.dtype() || past.shape() != Dims{B, C, P})
      return ctx.error(str_cat("past_state ", past.describe(), " must be [", B, ", ", C, ", ", P, "]"));
  }
  auto to_f64 = [](const Tensor& t) {
    return t.dtype() == DataType::kFloat64 ? t : t.cast(DataType::kFloat64).value();
  };
  Tensor x = to_f64(x0), w = to_f64(w0);
  const double* px = x.data<double>();
  const double* pw = w.data<double>();
  // The padded sequence, one row of T per (b, c).
  std::vector<double> padded(static_cast<size_t>(B * C * T), 0.0);
  Tensor past64 = past.defined() ? to_f64(past) : Tensor();
  for (int64_t r = 0; r < B * C; ++r) {
    double* row = padded.data() + r * T;
    if (past64.defined())
      for (int64_t j = 0; j < P; ++j) row[j] = past64.data<double>()[r * P + j];
    for (int64_t t = 0; t < L; ++t) row[P + t] = px[r * L + t];
  }
  Tensor y(DataType::kFloat64, x0.shape());
  Tensor state(DataType::kFloat64, {B, C, P});
  double* py = y.data<double>();
  for (int64_t r = 0; r < B * C; ++r) {
    const int64_t c = r % C;
    const double* row = padded.data() + r * T;
    const double* wc = pw + c * K;
    const double b0 = bias.defined() ? bias.get_f64(c) : 0.0;
    for (int64_t t = 0; t < L; ++t) {
      double acc = b0;
      for (int64_t j = 0; j < K; ++j) acc += wc[j] * row[t + j];
      py[r * L + t] = acc;
    }
    for (int64_t j = 0; j < P; ++j) state.data<double>()[r * P + j] = row[T - P + j];
  }
  Tensor out = y.cast(x0.dtype()).value();  // rounds the conv result like the reference, then activates
  if (silu) {
    for (int64_t i = 0; i < out.numel(); ++i) {
      float v = static_cast<float>(out.get_f64(i));
      out.set_f64(i, static_cast<double>(v * (1.0f / (1.0f + std::exp(-v)))));
    }
  }
  ctx.set_output(0, out);
  if (ctx.num_outputs() > 1) ctx.set_output(1, state.cast(x0.dtype()).value());
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", CausalConvWithState, 27, infer_causal_conv, causal_conv_kernel, 2, 4);

}  // namespace kiln::ops
