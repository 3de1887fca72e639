// Random generators: RandomNormal, RandomUniform, RandomNormalLike, RandomUniformLike, Bernoulli,
// Multinomial. With a `seed` attribute the streams follow numpy's legacy RandomState(seed): MT19937
// seeded by init_genrand, 53-bit doubles from two 32-bit draws, the polar Gaussian method (pairs,
// second value cached) and inversion sampling for Bernoulli (binomial with n = 1). Without a seed,
// a fresh seed comes from std::random_device. Outputs are never constant-folded.
#include <cmath>
#include <random>

#include "ops/attention_rnn_util.h"

namespace kiln::ops {
namespace {

using arnn::round_to;

class Rng {
 public:
  explicit Rng(uint32_t seed) : mt_(seed) {}
  // Uniform in [0, 1) with 53 random bits.
  double uniform() {
    uint32_t a = static_cast<uint32_t>(mt_()) >> 5, b = static_cast<uint32_t>(mt_()) >> 6;
    return (static_cast<double>(a) * 67108864.0 + static_cast<double>(b)) / 9007199254740992.0;
  }
  // Standard normal by the polar (Marsaglia) method; each accepted pair yields two values.
  double normal() {
    if (has_cached_) {
      has_cached_ = false;
      return cached_;
    }
    double x1, x2, r2;
    do {
      x1 = 2.0 * uniform() - 1.0;
      x2 = 2.0 * uniform() - 1.0;
      r2 = x1 * x1 + x2 * x2;
    } while (r2 >= 1.0 || r2 == 0.0);
    double f = std::sqrt(-2.0 * std::log(r2) / r2);
    cached_ = f * x1;
    has_cached_ = true;
    return f * x2;
  }
  // One Bernoulli(p) draw: binomial(1, p) by inversion on the smaller of p and 1 - p.
  int64_t bernoulli(double p) {
    if (p <= 0.5) return inversion(p);
    return 1 - inversion(1.0 - p);
  }

 private:
  int64_t inversion(double p) {
    const double q = 1.0 - p, qn = std::exp(std::log(q));
    const double bound = std::min(1.0, p + 10.0 * std::sqrt(p * q + 1));
    int64_t x = 0;
    double px = qn, u = uniform();
    while (u > px) {
      ++x;
      if (static_cast<double>(x) > bound) {
        x = 0;
        px = qn;
        u = uniform();
      } else {
        u -= px;
        px = (static_cast<double>(2 - x) * p * px) / (static_cast<double>(x) * q);
      }
    }
    return x;
  }

  std::mt19937 mt_;
  bool has_cached_ = false;
  double cached_ = 0;
};

// The generator for a node: its `seed` attribute (truncated to an integer, numpy-style) or a
// nondeterministic one.
Result<Rng> make_rng(const ir::Node& n) {
  const ir::Attribute* s = n.attr("seed");
  if (!s || std::isnan(s->f)) return Rng(std::random_device{}());
  double v = std::trunc(static_cast<double>(s->f));
  if (!(v >= 0 && v <= 4294967295.0)) return InvalidArgument("seed ", s->f, " must be in [0, 2^32)");
  return Rng(static_cast<uint32_t>(v));
}

bool is_random_float(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kFloat16 || t == DataType::kBFloat16;
}

// The output dtype: the `dtype` attribute, else `dflt`.
Result<DataType> random_dtype(const ir::Node& n, DataType dflt) {
  const ir::Attribute* a = n.attr("dtype");
  if (!a) return dflt;
  if (a->i <= 0 || a->i > 1000 || !dtype_is_known(static_cast<int32_t>(a->i)))
    return InvalidModel("dtype ", a->i, " is not a known dtype");
  return static_cast<DataType>(a->i);
}

Result<Dims> shape_attr(const ir::Node& n) {
  const ir::Attribute* a = n.attr("shape");
  if (!a) return InvalidModel("the shape attribute is required");
  int64_t total = 1;
  for (int64_t d : a->ints) {
    if (d < 0) return InvalidModel("shape ", dims_str(a->ints), " has a negative dim");
    if (d > 0 && total > (int64_t{1} << 32) / d) return InvalidModel("shape ", dims_str(a->ints), " is too large");
    total *= d;
  }
  return a->ints;
}

// Kind: 0 normal, 1 uniform. Like: shape (and default dtype) from input 0.
template <int Kind, bool Like>
Status infer_random(InferContext& ctx) {
  auto dt = random_dtype(ctx.node, Like ? ctx.input_dtype(0) : DataType::kFloat32);
  if (!dt.ok()) return ctx.error(dt.status().message());
  if (Like) {
    ctx.set_output(0, *dt, ctx.input_shape(0));
    return Status::Ok();
  }
  auto shape = shape_attr(ctx.node);
  if (!shape.ok()) return ctx.error(shape.status().message());
  ctx.set_output(0, *dt, SymShape::from_dims(*shape));
  return Status::Ok();
}

template <int Kind, bool Like>
Status random_kernel(KernelContext& ctx) {
  Dims shape;
  DataType dflt = DataType::kFloat32;
  if (Like) {
    shape = ctx.input(0).shape();
    dflt = ctx.input(0).dtype();
  } else {
    KILN_ASSIGN_OR_RETURN(shape, shape_attr(ctx.node));
  }
  KILN_ASSIGN_OR_RETURN(DataType dt, random_dtype(ctx.node, dflt));
  if (!is_random_float(dt)) return ctx.unsupported(str_cat("output dtype ", dtype_name(dt), " is not supported"));
  KILN_ASSIGN_OR_RETURN(Rng rng, make_rng(ctx.node));
  // Draw, round to the output precision, then scale and shift in that precision.
  const double a = Kind == 0 ? ctx.node.attr_float("scale", 1.0f)
                             : ctx.node.attr_float("high", 1.0f) - ctx.node.attr_float("low", 0.0f);
  const double b = Kind == 0 ? ctx.node.attr_float("mean", 0.0f) : ctx.node.attr_float("low", 0.0f);
  Tensor out(dt == DataType::kFloat64 ? DataType::kFloat64 : DataType::kFloat32, shape);
  for (int64_t i = 0; i < out.numel(); ++i) {
    double v = round_to(Kind == 0 ? rng.normal() : rng.uniform(), dt);
    v = round_to(v * round_to(a, dt), dt);
    v = round_to(v + round_to(b, dt), dt);
    out.set_f64(i, v);
  }
  ctx.set_output(0, downcast_float(out, dt));
  return Status::Ok();
}

// Bernoulli: each output element is 1 with the probability given by the input element.
Status infer_bernoulli(InferContext& ctx) {
  auto dt = random_dtype(ctx.node, ctx.input_dtype(0));
  if (!dt.ok()) return ctx.error(dt.status().message());
  ctx.set_output(0, *dt, ctx.input_shape(0));
  return Status::Ok();
}

Status bernoulli_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (!is_random_float(x.dtype()))
    return ctx.unsupported(str_cat("input dtype ", dtype_name(x.dtype()), " is not supported"));
  KILN_ASSIGN_OR_RETURN(DataType dt, random_dtype(ctx.node, x.dtype()));
  if (!dtype_is_builtin(dt) && !is_low_precision_float(dt))
    return ctx.unsupported(str_cat("output dtype ", dtype_name(dt), " is not supported"));
  KILN_ASSIGN_OR_RETURN(Rng rng, make_rng(ctx.node));
  std::vector<double> p = arnn::as_f64(x);
  Tensor out(DataType::kFloat64, x.shape());
  for (size_t i = 0; i < p.size(); ++i) {
    if (!(p[i] >= 0 && p[i] <= 1)) return ctx.error(str_cat("probability ", p[i], " is outside [0, 1]"));
    out.data<double>()[i] = static_cast<double>(rng.bernoulli(p[i]));
  }
  KILN_ASSIGN_OR_RETURN(Tensor res, out.cast(dt));
  ctx.set_output(0, res);
  return Status::Ok();
}

// Multinomial: sample_size class indices per batch row, drawn from softmax(input row).
Status infer_multinomial(InferContext& ctx) {
  auto dt = random_dtype(ctx.node, DataType::kInt32);
  if (!dt.ok()) return ctx.error(dt.status().message());
  const SymShape& x = ctx.input_shape(0);
  if (x.rank_known && x.rank() != 2) return ctx.error(str_cat("input must be 2-D [batch, classes], got ", x.str()));
  int64_t n = ctx.node.attr_int("sample_size", 1);
  if (n < 0) return ctx.error(str_cat("sample_size must be non-negative, got ", n));
  ctx.set_output(0, *dt, SymShape({arnn::dim_at(x, 0), Dim(n)}));
  return Status::Ok();
}

Status multinomial_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (!is_random_float(x.dtype()))
    return ctx.unsupported(str_cat("input dtype ", dtype_name(x.dtype()), " is not supported"));
  if (x.rank() != 2) return ctx.error(str_cat("input must be 2-D [batch, classes], got ", x.describe()));
  KILN_ASSIGN_OR_RETURN(DataType dt, random_dtype(ctx.node, DataType::kInt32));
  if (dt != DataType::kInt32 && dt != DataType::kInt64) return ctx.error("dtype must be int32 or int64");
  const int64_t n = ctx.node.attr_int("sample_size", 1);
  if (n < 0) return ctx.error(str_cat("sample_size must be non-negative, got ", n));
  const int64_t B = x.dim(0), C = x.dim(1);
  if (C <= 0) return ctx.error("input needs at least one class");
  KILN_ASSIGN_OR_RETURN(Rng rng, make_rng(ctx.node));
  std::vector<double> v = arnn::as_f64(x), cum(static_cast<size_t>(C));
  Tensor out(dt, {B, n});
  for (int64_t b = 0; b < B; ++b) {
    const double* row = &v[static_cast<size_t>(b * C)];
    double mx = row[0];
    for (int64_t c = 1; c < C; ++c) mx = std::max(mx, row[c]);
    double total = 0;
    for (int64_t c = 0; c < C; ++c) {
      double e = std::exp(row[c] - mx);
      total += std::isnan(e) ? 0.0 : e;
      cum[static_cast<size_t>(c)] = total;
    }
    if (!(total > 0) || !std::isfinite(total)) return ctx.error(str_cat("row ", b, " has no valid probabilities"));
    for (int64_t s = 0; s < n; ++s) {
      double u = rng.uniform() * total;
      int64_t c = 0;
      while (c < C - 1 && cum[static_cast<size_t>(c)] <= u) ++c;
      out.set_i64(b * n + s, c);
    }
  }
  ctx.set_output(0, out);
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", RandomNormal, 1, (infer_random<0, false>), (random_kernel<0, false>), 0, 0);
KILN_REGISTER_OP_ARITY("", RandomUniform, 1, (infer_random<1, false>), (random_kernel<1, false>), 0, 0);
KILN_REGISTER_OP_ARITY("", RandomNormalLike, 1, (infer_random<0, true>), (random_kernel<0, true>), 1, 1);
KILN_REGISTER_OP_ARITY("", RandomUniformLike, 1, (infer_random<1, true>), (random_kernel<1, true>), 1, 1);
KILN_REGISTER_OP_ARITY("", Bernoulli, 15, infer_bernoulli, bernoulli_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Multinomial, 7, infer_multinomial, multinomial_kernel, 1, 1);

}  // namespace kiln::ops
