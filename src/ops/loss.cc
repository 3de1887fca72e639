// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.
//
// Inputs are (N, C) or (N, C, d1, ..., dk) with integer targets (N) or (N, d1, ..., dk).
// loss[n, d] = -weight[t] * input[n, t, d] for t = target[n, d]; targets equal to ignore_index
// contribute 0 and weigh 0. 'mean' divides the sum by the total weight of the counted targets.
#include <cmath>
#include <limits>

#include "ops/reduce_util.h"

namespace kiln::ops {
namespace {

Status infer_loss(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  std::string red = ctx.node.attr_string("reduction", "mean");
  if (red != "none" && red != "sum" && red != "mean")
    return ctx.error(str_cat("reduction must be 'none', 'sum' or 'mean', got '", red, "'"));
  ctx.set_output(0, dt, red == "none" ? ctx.input_shape(1) : SymShape(std::vector<Dim>{}));
  if (ctx.outputs.size() > 1) ctx.set_output(1, dt, ctx.input_shape(0));
  return Status::Ok();
}

// Computes the loss from log-probabilities `logp` laid out like the (N, C, d...) input.
Status nll_from(KernelContext& ctx, const std::vector<double>& logp, const Dims& in_shape, DataType dt) {
  const Tensor& target = ctx.input(1);
  if (!dtype_is_integer(target.dtype()))
    return ctx.error(str_cat("target must be an integer tensor, got ", target.describe()));
  if (in_shape.size() < 2) return ctx.error(str_cat("input must be (N, C, ...), got rank ", in_shape.size()));
  Dims expect_t(in_shape);
  expect_t.erase(expect_t.begin() + 1);
  if (target.shape() != expect_t)
    return ctx.error(str_cat("target ", target.describe(), " must have shape ", dims_str(expect_t), " for input ",
                             dims_str(in_shape)));
  int64_t c = in_shape[1];
  std::vector<double> weight;
  if (ctx.has_input(2)) {
    const Tensor& w = ctx.input(2);
    if (w.rank() != 1 || w.dim(0) != c)
      return ctx.error(str_cat("weight must have shape [", c, "], got ", w.describe()));
    weight = to_f64_vector(w);
  }
  std::string red = ctx.node.attr_string("reduction", "mean");
  if (red != "none" && red != "sum" && red != "mean")
    return ctx.error(str_cat("reduction must be 'none', 'sum' or 'mean', got '", red, "'"));
  bool has_ignore = ctx.node.attr("ignore_index") != nullptr;
  int64_t ignore = ctx.node.attr_int("ignore_index", 0);
  AxisSplit sp = split_at_axis(in_shape, 1);  // outer = N, len = C, inner = d1*...*dk
  std::vector<int64_t> t = to_i64_vector(target);
  std::vector<double> loss(t.size());
  double total = 0, wsum = 0;
  for (int64_t n = 0; n < sp.outer; ++n) {
    for (int64_t d = 0; d < sp.inner; ++d) {
      size_t ti = static_cast<size_t>(n * sp.inner + d);
      int64_t cls = t[ti];
      if (has_ignore && cls == ignore) {
        loss[ti] = 0;
        continue;
      }
      if (cls < 0 || cls >= c)
        return ctx.error(str_cat("target value ", cls, " at index ", ti, " is out of range [0, ", c, ")"));
      double w = weight.empty() ? 1.0 : weight[static_cast<size_t>(cls)];
      loss[ti] = -logp[static_cast<size_t>((n * c + cls) * sp.inner + d)] * w;
      total += loss[ti];
      wsum += w;
    }
  }
  Tensor out;
  if (red == "none") {
    out = Tensor(DataType::kFloat64, target.shape());
    for (size_t i = 0; i < loss.size(); ++i) out.data<double>()[i] = loss[i];
  } else {
    double v = red == "sum" ? total : total / wsum;
    out = Tensor::scalar<double>(DataType::kFloat64, v);
  }
  ctx.set_output(0, out.cast(dt).value());
  return Status::Ok();
}

Status nll_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (!dtype_is_float(x.dtype())) return ctx.unsupported(str_cat("input must be a float tensor, got ", x.describe()));
  return nll_from(ctx, to_f64_vector(x), x.shape(), x.dtype());
}

Status sce_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (!dtype_is_float(x.dtype())) return ctx.unsupported(str_cat("scores must be a float tensor, got ", x.describe()));
  if (x.rank() < 2) return ctx.error(str_cat("scores must be (N, C, ...), got ", x.describe()));
  // log_softmax over the class axis.
  std::vector<double> v = to_f64_vector(x);
  AxisSplit sp = split_at_axis(x.shape(), 1);
  for (int64_t n = 0; n < sp.outer; ++n) {
    for (int64_t d = 0; d < sp.inner; ++d) {
      double* base = v.data() + n * sp.len * sp.inner + d;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k < sp.len; ++k) mx = std::max(mx, base[k * sp.inner]);
      double sum = 0;
      for (int64_t k = 0; k < sp.len; ++k) sum += std::exp(base[k * sp.inner] - mx);
      double ls = std::log(sum);
      for (int64_t k = 0; k < sp.len; ++k) base[k * sp.inner] = base[k * sp.inner] - mx - ls;
    }
  }
  KILN_RETURN_IF_ERROR(nll_from(ctx, v, x.shape(), x.dtype()));
  if (ctx.wants_output(1)) {
    Tensor lp(DataType::kFloat64, x.shape());
    for (size_t i = 0; i < v.size(); ++i) lp.data<double>()[i] = v[i];
    ctx.set_output(1, lp.cast(x.dtype()).value());
  }
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", NegativeLogLikelihoodLoss, 12, infer_loss, nll_kernel, 2, 3);
KILN_REGISTER_OP_ARITY("", SoftmaxCrossEntropyLoss, 12, infer_loss, sce_kernel, 2, 3);

}  // namespace kiln::ops
