// Binary arithmetic with numpy broadcasting: Add, Sub, Mul, Div.
#include <cmath>

#include "ops/common.h"

namespace kiln::ops {
namespace {

// Applies fn elementwise over the broadcast of inputs 0 and 1. Low-precision floats compute in
// float32 and round once at the end, as ONNX's reference does.
template <typename Fn>
Status binary_arith(KernelContext& ctx, Fn fn) {
  const Tensor& a0 = ctx.input(0);
  const Tensor& b0 = ctx.input(1);
  if (a0.dtype() != b0.dtype())
    return ctx.error(str_cat("input dtypes differ: ", a0.describe(), " vs ", b0.describe()));
  DataType out_dt = a0.dtype();
  Tensor a = upcast_float(a0), b = upcast_float(b0);
  if (!dtype_is_builtin(a.dtype()) || a.dtype() == DataType::kBool)
    return ctx.unsupported(str_cat("dtype ", dtype_name(out_dt), " is not supported"));
  KILN_ASSIGN_OR_RETURN(Dims out_shape, broadcast_dims(a.shape(), b.shape()));
  Tensor out(a.dtype(), out_shape);
  BroadcastIndex ia(a.shape(), out_shape), ib(b.shape(), out_shape);
  Status st = dispatch_builtin(a.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      return Status::Ok();
    } else {
      const T* pa = a.data<T>();
      const T* pb = b.data<T>();
      T* po = out.data<T>();
      for (int64_t i = 0; i < out.numel(); ++i) {
        KILN_RETURN_IF_ERROR(fn(pa[ia(i)], pb[ib(i)], po[i]));
      }
      return Status::Ok();
    }
  });
  KILN_RETURN_IF_ERROR(st);
  ctx.set_output(0, downcast_float(out, out_dt));
  return Status::Ok();
}

// Integer arithmetic wraps (two's complement) instead of overflowing into undefined behaviour.
template <typename T, typename Op>
T wrap_op(T x, T y, Op op) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(op(static_cast<U>(x), static_cast<U>(y)));
  } else {
    return static_cast<T>(op(x, y));
  }
}

Status add_kernel(KernelContext& ctx) {
  return binary_arith(ctx, [](auto x, auto y, auto& o) {
    o = wrap_op(x, y, [](auto p, auto q) { return p + q; });
    return Status::Ok();
  });
}
Status sub_kernel(KernelContext& ctx) {
  return binary_arith(ctx, [](auto x, auto y, auto& o) {
    o = wrap_op(x, y, [](auto p, auto q) { return p - q; });
    return Status::Ok();
  });
}
Status mul_kernel(KernelContext& ctx) {
  return binary_arith(ctx, [](auto x, auto y, auto& o) {
    o = wrap_op(x, y, [](auto p, auto q) { return p * q; });
    return Status::Ok();
  });
}
Status div_kernel(KernelContext& ctx) {
  return binary_arith(ctx, [&](auto x, auto y, auto& o) -> Status {
    using T = std::decay_t<decltype(x)>;
    if constexpr (std::is_integral_v<T>) {
      if (y == 0) return InvalidArgument("integer division by zero");
      if constexpr (std::is_signed_v<T>) {
        if (x == std::numeric_limits<T>::min() && y == T(-1)) {
          o = x;  // the only overflowing case: wraps
          return Status::Ok();
        }
      }
      o = static_cast<T>(x / y);
    } else {
      o = x / y;
    }
    return Status::Ok();
  });
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Add, 1, infer_broadcast_all, add_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Sub, 1, infer_broadcast_all, sub_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Mul, 1, infer_broadcast_all, mul_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Div, 1, infer_broadcast_all, div_kernel, 2, 2);

}  // namespace kiln::ops
