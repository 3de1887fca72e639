// LpNormalization, MeanVarianceNormalization, LRN and Dropout.
#include <cmath>
#include <random>

#include "ops/op_traits.h"
#include "ops/reduce_util.h"

namespace kiln::ops {
namespace {

Tensor from_f64(const std::vector<double>& v, const Dims& shape, DataType dt) {
  Tensor t(DataType::kFloat64, shape);
  double* p = t.data<double>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = v[i];
  return dt == DataType::kFloat64 ? t : t.cast(dt).value();
}

// ---- LpNormalization: x / ||x||_p along one axis ----

Status lp_norm_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  if (!dtype_is_float(x0.dtype())) return ctx.unsupported(str_cat("input must be a float tensor, got ", x0.describe()));
  if (x0.rank() == 0) return ctx.error("input must have rank >= 1, got a scalar");
  auto axis = normalize_axis(ctx.node.attr_int("axis", -1), x0.rank());
  if (!axis.ok()) return ctx.error(axis.status().message());
  int64_t p = ctx.node.attr_int("p", 2);
  if (p != 1 && p != 2) return ctx.error(str_cat("p must be 1 or 2, got ", p));
  AxisSplit sp = split_at_axis(x0.shape(), *axis);
  std::vector<double> x = to_f64_vector(x0), y(x.size());
  for (int64_t o = 0; o < sp.outer; ++o) {
    for (int64_t in = 0; in < sp.inner; ++in) {
      int64_t base = o * sp.len * sp.inner + in;
      double norm = 0;
      for (int64_t k = 0; k < sp.len; ++k) {
        double v = x[static_cast<size_t>(base + k * sp.inner)];
        norm += p == 1 ? std::fabs(v) : v * v;
      }
      if (p == 2) norm = std::sqrt(norm);
      if (norm == 0) norm = 1;  // an all-zero slice stays zero (ONNX reference), not NaN
      for (int64_t k = 0; k < sp.len; ++k) {
        size_t i = static_cast<size_t>(base + k * sp.inner);
        y[i] = x[i] / norm;
      }
    }
  }
  ctx.set_output(0, from_f64(y, x0.shape(), x0.dtype()));
  return Status::Ok();
}

// ---- MeanVarianceNormalization: (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over `axes` ----
// (Opset 9 on; the opset-1 experimental form with across_channels/normalize_variance is not ONNX.)

Status mvn_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  if (!dtype_is_float(x0.dtype())) return ctx.unsupported(str_cat("input must be a float tensor, got ", x0.describe()));
  std::vector<int64_t> axes = ctx.node.attr_ints("axes", {0, 2, 3});
  auto ax = normalize_axes(axes, x0.rank());
  if (!ax.ok()) return ctx.error(ax.status().message());
  std::vector<bool> mask(static_cast<size_t>(x0.rank()), false);
  Dims kept = x0.shape();
  int64_t count = 1;
  for (int64_t a : *ax) {
    mask[static_cast<size_t>(a)] = true;
    count *= x0.dim(a);
    kept[static_cast<size_t>(a)] = 1;
  }
  std::vector<double> x = to_f64_vector(x0), y(x.size());
  size_t nk = static_cast<size_t>(dims_numel(kept));
  std::vector<double> sum(nk, 0.0), sq(nk, 0.0);
  for_each_reduced(x0.shape(), mask, [&](int64_t i, int64_t o) {
    sum[static_cast<size_t>(o)] += x[static_cast<size_t>(i)];
    sq[static_cast<size_t>(o)] += x[static_cast<size_t>(i)] * x[static_cast<size_t>(i)];
  });
  std::vector<double> mean(nk), den(nk);
  for (size_t o = 0; o < nk; ++o) {
    mean[o] = sum[o] / static_cast<double>(count);
    double var = sq[o] / static_cast<double>(count) - mean[o] * mean[o];
    den[o] = std::sqrt(var > 0 ? var : 0.0) + 1e-9;
  }
  for_each_reduced(x0.shape(), mask, [&](int64_t i, int64_t o) {
    y[static_cast<size_t>(i)] =
        (x[static_cast<size_t>(i)] - mean[static_cast<size_t>(o)]) / den[static_cast<size_t>(o)];
  });
  ctx.set_output(0, from_f64(y, x0.shape(), x0.dtype()));
  return Status::Ok();
}

// ---- LRN: x / (bias + alpha / size * sum of squares over neighbouring channels)^beta ----

// The kernel's attribute checks: a build refuses what a run would.
Status infer_lrn(InferContext& ctx) {
  if (!ctx.node.attr("size")) return ctx.error("attribute 'size' is required");
  int64_t size = ctx.node.attr_int("size", 1);
  if (size <= 0) return ctx.error(str_cat("size must be positive, got ", size));
  return infer_same_as_input0(ctx);
}

Status lrn_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  if (!dtype_is_float(x0.dtype())) return ctx.unsupported(str_cat("input must be a float tensor, got ", x0.describe()));
  if (x0.rank() < 2) return ctx.error(str_cat("input must have rank >= 2 (N, C, ...), got ", x0.describe()));
  if (!ctx.node.attr("size")) return ctx.error("attribute 'size' is required");
  int64_t size = ctx.node.attr_int("size", 1);
  if (size <= 0) return ctx.error(str_cat("size must be positive, got ", size));
  double alpha = ctx.node.attr_float("alpha", 1e-4f);
  double beta = ctx.node.attr_float("beta", 0.75f);
  double bias = ctx.node.attr_float("bias", 1.0f);
  AxisSplit sp = split_at_axis(x0.shape(), 1);      // outer = N, len = C, inner = spatial
  int64_t lo = (size - 1) / 2, hi = size - 1 - lo;  // floor and ceil of (size - 1) / 2
  std::vector<double> x = to_f64_vector(x0), y(x.size());
  for (int64_t n = 0; n < sp.outer; ++n) {
    for (int64_t c = 0; c < sp.len; ++c) {
      int64_t c0 = std::max<int64_t>(0, c - lo), c1 = std::min<int64_t>(sp.len - 1, c + hi);
      for (int64_t s = 0; s < sp.inner; ++s) {
        double sq = 0;
        for (int64_t j = c0; j <= c1; ++j) {
          double v = x[static_cast<size_t>((n * sp.len + j) * sp.inner + s)];
          sq += v * v;
        }
        size_t i = static_cast<size_t>((n * sp.len + c) * sp.inner + s);
        y[i] = x[i] / std::pow(bias + alpha / static_cast<double>(size) * sq, beta);
      }
    }
  }
  ctx.set_output(0, from_f64(y, x0.shape(), x0.dtype()));
  return Status::Ok();
}

// ---- Dropout ----
//
// Inference (the usual case) is the identity with an all-true mask. Training mode exists from
// opset 12 through the 'training_mode' input; there elements are dropped with numpy's generator
// seeded by 'seed' (as the ONNX reference does) and the kept ones scaled by 1 / (1 - ratio). Before opset 7, 'is_test'
// = 0 nominally meant training, but every runtime treats such nodes as inference: so does kiln.

DataType dropout_mask_dtype(const ir::Node& n, DataType data) { return n.opset >= 10 ? DataType::kBool : data; }

Status infer_dropout(InferContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(0));
  if (ctx.outputs.size() > 1) ctx.set_output(1, dropout_mask_dtype(ctx.node, ctx.input_dtype(0)), ctx.input_shape(0));
  return Status::Ok();
}

Status dropout_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  bool training = false;
  double ratio = ctx.node.attr_float("ratio", 0.5f);
  if (ctx.opset() >= 12) {
    ratio = 0.5;
    if (ctx.has_input(1)) {
      const Tensor& r = ctx.input(1);
      if (r.numel() != 1 || !dtype_is_float(r.dtype()))
        return ctx.error(str_cat("ratio must be a float scalar, got ", r.describe()));
      ratio = r.get_f64(0);
    }
    if (ctx.has_input(2)) {
      const Tensor& t = ctx.input(2);
      if (t.numel() != 1) return ctx.error(str_cat("training_mode must be a scalar, got ", t.describe()));
      training = t.get_f64(0) != 0;
    }
  }
  if (training && !(ratio >= 0 && ratio < 1)) return ctx.error(str_cat("ratio must be in [0, 1), got ", ratio));
  DataType mdt = dropout_mask_dtype(ctx.node, x.dtype());
  if (!training || ratio == 0) {  // the identity (Y shares X); the all-true mask only when asked for
    ctx.set_output(0, x);
    if (ctx.wants_output(1)) {
      Tensor ones(mdt, x.shape());
      for (int64_t i = 0; i < ones.numel(); ++i) ones.set_f64(i, 1);
      ctx.set_output(1, ones);
    }
    return Status::Ok();
  }
  Tensor mask(mdt, x.shape());
  if (!dtype_is_float(x.dtype())) return ctx.unsupported(str_cat("training-mode Dropout of ", x.describe()));
  // The ONNX reference draws numpy's legacy uniform(0, 1) after np.random.seed(seed): MT19937
  // seeded like std::mt19937, two 32-bit draws per 53-bit double. Same seed, same mask.
  std::mt19937 gen(static_cast<uint32_t>(ctx.node.attr_int("seed", 0)));
  auto next_uniform = [&]() {
    uint32_t a = gen() >> 5, b = gen() >> 6;
    return (a * 67108864.0 + b) / 9007199254740992.0;
  };
  std::vector<double> xv = to_f64_vector(x), y(xv.size());
  double scale = 1.0 / (1.0 - ratio);
  for (size_t i = 0; i < xv.size(); ++i) {
    bool keep = next_uniform() >= ratio;
    y[i] = keep ? xv[i] * scale : 0.0;
    mask.set_f64(static_cast<int64_t>(i), keep ? 1 : 0);
  }
  ctx.set_output(0, from_f64(y, x.shape(), x.dtype()));
  if (ctx.wants_output(1)) ctx.set_output(1, mask);
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", LpNormalization, 1, infer_same_as_input0, lp_norm_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", MeanVarianceNormalization, 9, infer_same_as_input0, mvn_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", LRN, 1, infer_lrn, lrn_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Dropout, 1, infer_dropout, dropout_kernel, 1, 3);

KILN_OP_TRAITS("", Dropout, trait::kInPlace);  // output 0 is X (scaled when training)

}  // namespace kiln::ops
