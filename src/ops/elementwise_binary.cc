// Binary arithmetic with numpy broadcasting: Add, Sub, Mul, Div, Pow, Mod. Opset < 7 forms use
// the legacy 'broadcast'/'axis' attributes (see elementwise_util.h); 'consumed_inputs' (opset < 6)
// only described memory reuse and is ignored.
#include <cmath>
#include <limits>
#include <span>

#include "ops/elementwise_util.h"
#include "ops/op_traits.h"

namespace kiln::ops {
namespace {

Status infer_arith(InferContext& ctx) { return infer_broadcast_same_type(ctx, ctx.opset() < 7); }

// Applies fn elementwise over the broadcast of inputs 0 and 1 (same dtype). Low-precision floats
// compute in float32 and round once at the end, as ONNX's reference does.
template <typename Fn>
Status binary_arith(KernelContext& ctx, Fn fn) {
  KILN_RETURN_IF_ERROR(check_same_dtype(ctx, 0, 1));
  const Tensor& a0 = ctx.input(0);
  const Tensor& b0 = ctx.input(1);
  DataType out_dt = a0.dtype();
  // Builtin dtypes of rank <= 8 (shape work inside If/Loop bodies, every iteration): the broadcast on
  // the stack and the output renewed over the node's last one, no heap allocation (tests/noalloc).
  SmallBroadcast sb;
  if (!legacy_broadcast(ctx) && dtype_is_builtin(out_dt) && out_dt != DataType::kBool && !ctx.outputs.empty() &&
      small_broadcast({&a0, &b0}, sb)) {
    Tensor& out = ctx.outputs[0].tensor;
    ctx.outputs[0].kind = Value::Kind::kTensor;
    out.renew(out_dt, std::span<const int64_t>(sb.out, sb.rank));
    Status st = dispatch_builtin(out_dt, [&](auto tag) -> Status {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) {
        const T* pa = a0.data<T>();
        const T* pb = b0.data<T>();
        T* po = out.data<T>();
        Status bad = Status::Ok();
        sb.for_each([&](int64_t i, const int64_t* off) {
          if (!bad.ok()) return;
          Status e = fn(pa[off[0]], pb[off[1]], po[i]);
          if (!e.ok()) bad = e;
        });
        return bad;
      }
      return Status::Ok();
    });
    if (!st.ok()) return ctx.error(st.message());
    return Status::Ok();
  }
  Tensor a = upcast_float(a0), b = upcast_float(b0);
  if (!dtype_is_builtin(a.dtype()) || a.dtype() == DataType::kBool)
    return ctx.unsupported(str_cat("dtype ", dtype_name(out_dt), " is not supported"));
  KILN_ASSIGN_OR_RETURN(BroadcastPlan p, plan_broadcast(ctx.node, {&a, &b}, legacy_broadcast(ctx)));
  Tensor out(a.dtype(), p.out);
  Status st = dispatch_builtin(a.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      return Status::Ok();
    } else {
      const T* pa = a.data<T>();
      const T* pb = b.data<T>();
      T* po = out.data<T>();
      for (int64_t i = 0; i < out.numel(); ++i) {
        KILN_RETURN_IF_ERROR(fn(pa[p.index[0](i)], pb[p.index[1](i)], po[i]));
      }
      return Status::Ok();
    }
  });
  if (!st.ok()) return ctx.error(st.message());
  ctx.set_output(0, downcast_float(out, out_dt));
  return Status::Ok();
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
      o = static_cast<T>(x / y);  // truncates toward zero, like C and ONNX
    } else {
      o = x / y;
    }
    return Status::Ok();
  });
}

// Mod: fmod=1 gives C's fmod (sign of the dividend); fmod=0 gives Python's % (sign of the
// divisor), which for floats is numpy's mod.
Status mod_kernel(KernelContext& ctx) {
  bool fmod = ctx.node.attr_int("fmod", 0) != 0;
  return binary_arith(ctx, [&](auto x, auto y, auto& o) -> Status {
    using T = std::decay_t<decltype(x)>;
    if constexpr (std::is_integral_v<T>) {
      if (y == 0) return InvalidArgument("integer modulo by zero");
      if constexpr (std::is_signed_v<T>) {
        if (y == T(-1)) {  // avoids INT_MIN % -1 overflow; the remainder is 0 anyway
          o = 0;
          return Status::Ok();
        }
        T r = static_cast<T>(x % y);
        if (!fmod && r != 0 && ((r < 0) != (y < 0))) r = static_cast<T>(r + y);
        o = r;
      } else {
        o = static_cast<T>(x % y);
      }
    } else {
      T r = std::fmod(x, y);
      if (!fmod && r != 0 && ((r < 0) != (y < 0))) r += y;
      o = r;
    }
    return Status::Ok();
  });
}

// Integer power by squaring, wrapping on overflow. Negative exponents give 1/x^n truncated.
template <typename T>
Result<T> int_pow(T base, int64_t e) {
  if (e < 0) {
    if (base == 1) return T(1);
    if constexpr (std::is_signed_v<T>) {
      if (base == T(-1)) return static_cast<T>((e % 2) ? -1 : 1);
    }
    if (base == 0) return InvalidArgument("integer zero raised to a negative power ", e);
    return T(0);
  }
  T result = 1;
  T b = base;
  auto mul = [](T p, T q) { return wrap_op(p, q, [](auto u, auto v) { return u * v; }); };
  while (e > 0) {
    if (e & 1) result = mul(result, b);
    e >>= 1;
    if (e) b = mul(b, b);
  }
  return result;
}

// Pow: base and exponent may have different dtypes (opset >= 12); the output has the base's.
Status pow_kernel(KernelContext& ctx) {
  const Tensor& a0 = ctx.input(0);
  const Tensor& b0 = ctx.input(1);
  if (!is_numeric(a0.dtype()) || !is_numeric(b0.dtype()))
    return ctx.unsupported(str_cat("Pow of ", a0.describe(), " by ", b0.describe(), " is not supported"));
  if (ctx.opset() < 12 && a0.dtype() != b0.dtype())
    return ctx.error(
        str_cat("base and exponent dtypes differ before opset 12: ", a0.describe(), " vs ", b0.describe()));
  Tensor a = upcast_float(a0), b = upcast_float(b0);
  if (!dtype_is_builtin(a.dtype()) || !dtype_is_builtin(b.dtype()))
    return ctx.unsupported(str_cat("Pow of ", a0.describe(), " by ", b0.describe(), " is not supported"));
  KILN_ASSIGN_OR_RETURN(BroadcastPlan p, plan_broadcast(ctx.node, {&a, &b}, legacy_broadcast(ctx)));
  Tensor out(a.dtype(), p.out);
  bool int_exp = dtype_is_integer(b.dtype());
  Status st = dispatch_builtin(a.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      return Status::Ok();
    } else {
      const T* pa = a.data<T>();
      T* po = out.data<T>();
      for (int64_t i = 0; i < out.numel(); ++i) {
        T x = pa[p.index[0](i)];
        int64_t j = p.index[1](i);
        if constexpr (std::is_floating_point_v<T>) {
          po[i] = static_cast<T>(std::pow(static_cast<double>(x), b.get_f64(j)));
        } else if (int_exp) {
          int64_t e = b.get_i64(j);
          if (b.dtype() == DataType::kUInt64 && e < 0) e = std::numeric_limits<int64_t>::max();
          KILN_ASSIGN_OR_RETURN(po[i], int_pow<T>(x, e));
        } else {
          po[i] = float_to_int<T>(std::pow(static_cast<double>(x), b.get_f64(j)));
        }
      }
      return Status::Ok();
    }
  });
  if (!st.ok()) return ctx.error(st.message());
  ctx.set_output(0, downcast_float(out, a0.dtype()));
  return Status::Ok();
}

Status infer_pow(InferContext& ctx) { return infer_broadcast_to(ctx, ctx.input_dtype(0), ctx.opset() < 7); }

}  // namespace

KILN_REGISTER_OP_ARITY("", Add, 1, infer_arith, add_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Sub, 1, infer_arith, sub_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Mul, 1, infer_arith, mul_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Div, 1, infer_arith, div_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Mod, 10, infer_arith, mod_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Pow, 1, infer_pow, pow_kernel, 2, 2);

// Traits (registry.h): numpy broadcasting from opset 7 (readers check the opset). Mod declares none.
constexpr uint32_t kBroadcastInPlace = trait::kElementwiseBroadcast | trait::kInPlace;
KILN_OP_TRAITS("", Add, kBroadcastInPlace);
KILN_OP_TRAITS("", Sub, kBroadcastInPlace);
KILN_OP_TRAITS("", Mul, kBroadcastInPlace);
KILN_OP_TRAITS("", Div, kBroadcastInPlace);
KILN_OP_TRAITS("", Pow, kBroadcastInPlace);

}  // namespace kiln::ops
