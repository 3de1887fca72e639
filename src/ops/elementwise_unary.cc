// Unary math ops: Abs, Neg, Sign, Exp, Log, Sqrt, Reciprocal, trigonometric and hyperbolic
// functions, Ceil, Floor, Round, Erf, IsNaN, IsInf. Shape and dtype follow the input (IsNaN and
// IsInf give bool). 'consumed_inputs' (opset < 6) only described memory reuse and is ignored.
#include <cmath>
#include <limits>

#include "ops/elementwise_util.h"
#include "ops/op_traits.h"

namespace kiln::ops {
namespace {

// Negation that wraps for the most negative integer instead of overflowing.
template <typename T>
T negate(T x) {
  if constexpr (std::is_integral_v<T>) {
    return wrap_op(T(0), x, [](auto p, auto q) { return p - q; });
  } else {
    return -x;
  }
}

Status abs_kernel(KernelContext& ctx) {
  return unary_numeric(ctx, [](auto x) {
    using T = decltype(x);
    if constexpr (std::is_unsigned_v<T>)
      return x;
    else if constexpr (std::is_integral_v<T>)
      return x < 0 ? negate(x) : x;
    else
      return std::fabs(x);
  });
}
Status neg_kernel(KernelContext& ctx) {
  return unary_numeric(ctx, [](auto x) { return negate(x); });
}
Status sign_kernel(KernelContext& ctx) {
  return unary_numeric(ctx, [](auto x) {
    using T = decltype(x);
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(x)) return x;
    }
    return x > T(0) ? T(1) : (x < T(0) ? static_cast<T>(-1) : T(0));
  });
}

#define KILN_UNARY_FLOAT(NAME, EXPR)                        \
  Status NAME(KernelContext& ctx) {                         \
    return unary_float(ctx, [](double x) { return EXPR; }); \
  }

KILN_UNARY_FLOAT(exp_kernel, std::exp(x))
KILN_UNARY_FLOAT(log_kernel, std::log(x))
KILN_UNARY_FLOAT(sqrt_kernel, std::sqrt(x))
KILN_UNARY_FLOAT(reciprocal_kernel, 1.0 / x)
KILN_UNARY_FLOAT(sin_kernel, std::sin(x))
KILN_UNARY_FLOAT(cos_kernel, std::cos(x))
KILN_UNARY_FLOAT(tan_kernel, std::tan(x))
KILN_UNARY_FLOAT(asin_kernel, std::asin(x))
KILN_UNARY_FLOAT(acos_kernel, std::acos(x))
KILN_UNARY_FLOAT(atan_kernel, std::atan(x))
KILN_UNARY_FLOAT(sinh_kernel, std::sinh(x))
KILN_UNARY_FLOAT(cosh_kernel, std::cosh(x))
KILN_UNARY_FLOAT(asinh_kernel, std::asinh(x))
KILN_UNARY_FLOAT(acosh_kernel, std::acosh(x))
KILN_UNARY_FLOAT(atanh_kernel, std::atanh(x))
KILN_UNARY_FLOAT(ceil_kernel, std::ceil(x))
KILN_UNARY_FLOAT(floor_kernel, std::floor(x))
KILN_UNARY_FLOAT(round_kernel, std::nearbyint(x))  // default rounding mode: halves to even
KILN_UNARY_FLOAT(erf_kernel, std::erf(x))

#undef KILN_UNARY_FLOAT

// Elementwise float predicate -> bool tensor.
template <typename Pred>
Status float_predicate(KernelContext& ctx, Pred pred) {
  const Tensor& x = ctx.input(0);
  if (!dtype_is_float(x.dtype()))
    return ctx.unsupported(str_cat("dtype ", dtype_name(x.dtype()), " is not supported (needs a float type)"));
  Tensor out(DataType::kBool, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) out.data<bool>()[i] = pred(x.get_f64(i));
  ctx.set_output(0, out);
  return Status::Ok();
}

Status isnan_kernel(KernelContext& ctx) {
  return float_predicate(ctx, [](double v) { return std::isnan(v); });
}
Status isinf_kernel(KernelContext& ctx) {
  bool pos = ctx.node.attr_int("detect_positive", 1) != 0;
  bool neg = ctx.node.attr_int("detect_negative", 1) != 0;
  return float_predicate(ctx, [&](double v) { return std::isinf(v) && (v > 0 ? pos : neg); });
}

Status infer_bool_like_input(InferContext& ctx) {
  ctx.set_output(0, DataType::kBool, ctx.input_shape(0));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Abs, 1, infer_same_as_input0, abs_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Neg, 1, infer_same_as_input0, neg_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Sign, 9, infer_same_as_input0, sign_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Exp, 1, infer_same_as_input0, exp_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Log, 1, infer_same_as_input0, log_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Sqrt, 1, infer_same_as_input0, sqrt_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Reciprocal, 1, infer_same_as_input0, reciprocal_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Sin, 7, infer_same_as_input0, sin_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Cos, 7, infer_same_as_input0, cos_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Tan, 7, infer_same_as_input0, tan_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Asin, 7, infer_same_as_input0, asin_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Acos, 7, infer_same_as_input0, acos_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Atan, 7, infer_same_as_input0, atan_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Sinh, 9, infer_same_as_input0, sinh_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Cosh, 9, infer_same_as_input0, cosh_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Asinh, 9, infer_same_as_input0, asinh_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Acosh, 9, infer_same_as_input0, acosh_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Atanh, 9, infer_same_as_input0, atanh_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Ceil, 1, infer_same_as_input0, ceil_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Floor, 1, infer_same_as_input0, floor_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Round, 11, infer_same_as_input0, round_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Erf, 9, infer_same_as_input0, erf_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", IsNaN, 9, infer_bool_like_input, isnan_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", IsInf, 10, infer_bool_like_input, isinf_kernel, 1, 1);

// Traits (registry.h). Tan, the inverse and hyperbolic functions and IsNaN / IsInf declare none:
// no pass or planner rule has treated them as elementwise yet (declaring one changes what fuses).
constexpr uint32_t kUnaryInPlace = trait::kElementwiseUnary | trait::kInPlace;
KILN_OP_TRAITS("", Abs, kUnaryInPlace | trait::kKeepsZero);
KILN_OP_TRAITS("", Neg, kUnaryInPlace | trait::kKeepsZero);
KILN_OP_TRAITS("", Sign, kUnaryInPlace | trait::kKeepsZero);
KILN_OP_TRAITS("", Exp, kUnaryInPlace);
KILN_OP_TRAITS("", Log, kUnaryInPlace);
KILN_OP_TRAITS("", Sqrt, kUnaryInPlace | trait::kKeepsZero);
KILN_OP_TRAITS("", Reciprocal, kUnaryInPlace);
KILN_OP_TRAITS("", Sin, kUnaryInPlace | trait::kKeepsZero);
KILN_OP_TRAITS("", Cos, kUnaryInPlace);
KILN_OP_TRAITS("", Ceil, kUnaryInPlace | trait::kKeepsZero);
KILN_OP_TRAITS("", Floor, kUnaryInPlace | trait::kKeepsZero);
KILN_OP_TRAITS("", Round, kUnaryInPlace | trait::kKeepsZero);
KILN_OP_TRAITS("", Erf, kUnaryInPlace | trait::kKeepsZero);

}  // namespace kiln::ops
