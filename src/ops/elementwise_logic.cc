// Comparison, logical and bitwise ops with numpy broadcasting: Equal, Less, Greater, LessOrEqual,
// GreaterOrEqual, And, Or, Xor, Not, BitShift, BitwiseAnd/Or/Xor/Not, Where.
#include <cmath>

#include "ops/elementwise_util.h"

namespace kiln::ops {
namespace {

// Ops that existed before opset 7 had the legacy 'broadcast'/'axis' attributes.

Status infer_compare(InferContext& ctx) {
  if (ctx.has_input(0) && ctx.has_input(1) && ctx.input_dtype(0) != DataType::kUndefined &&
      ctx.input_dtype(1) != DataType::kUndefined && ctx.input_dtype(0) != ctx.input_dtype(1))
    return ctx.error(str_cat("inputs must share one dtype, got ", dtype_name(ctx.input_dtype(0)), " and ",
                             dtype_name(ctx.input_dtype(1))));
  return infer_broadcast_to(ctx, DataType::kBool, ctx.opset() < 7);
}

// out[i] = cmp(a, b) over the broadcast of inputs 0 and 1 (same dtype; strings compare too).
template <typename Cmp>
Status compare_kernel(KernelContext& ctx, Cmp cmp) {
  KILN_RETURN_IF_ERROR(check_same_dtype(ctx, 0, 1));
  Tensor a = upcast_float(ctx.input(0)), b = upcast_float(ctx.input(1));
  KILN_ASSIGN_OR_RETURN(BroadcastPlan p, plan_broadcast(ctx.node, {&a, &b}, legacy_broadcast(ctx)));
  Tensor out(DataType::kBool, p.out);
  bool* po = out.data<bool>();
  if (a.dtype() == DataType::kString) {
    const std::string* sa = a.strings();
    const std::string* sb = b.strings();
    for (int64_t i = 0; i < out.numel(); ++i) po[i] = cmp(sa[p.index[0](i)], sb[p.index[1](i)]);
  } else if (a.dtype() == DataType::kBool) {  // bytes read as 0 / non-zero
    const uint8_t* pa = a.data<uint8_t>();
    const uint8_t* pb = b.data<uint8_t>();
    for (int64_t i = 0; i < out.numel(); ++i) po[i] = cmp(pa[p.index[0](i)] != 0, pb[p.index[1](i)] != 0);
  } else if (dtype_is_builtin(a.dtype())) {
    dispatch_builtin(a.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* pa = a.data<T>();
      const T* pb = b.data<T>();
      for (int64_t i = 0; i < out.numel(); ++i) po[i] = cmp(pa[p.index[0](i)], pb[p.index[1](i)]);
    });
  } else if (dtype_is_integer(a.dtype())) {  // int4, uint4, int2, uint2: stored one per byte
    for (int64_t i = 0; i < out.numel(); ++i) po[i] = cmp(a.get_i64(p.index[0](i)), b.get_i64(p.index[1](i)));
  } else {
    return ctx.unsupported(str_cat("comparison of dtype ", dtype_name(a.dtype()), " is not supported"));
  }
  ctx.set_output(0, out);
  return Status::Ok();
}

Status equal_kernel(KernelContext& ctx) {
  return compare_kernel(ctx, [](const auto& x, const auto& y) { return x == y; });
}
Status less_kernel(KernelContext& ctx) {
  return compare_kernel(ctx, [](const auto& x, const auto& y) { return x < y; });
}
Status greater_kernel(KernelContext& ctx) {
  return compare_kernel(ctx, [](const auto& x, const auto& y) { return x > y; });
}
Status less_equal_kernel(KernelContext& ctx) {
  return compare_kernel(ctx, [](const auto& x, const auto& y) { return x <= y; });
}
Status greater_equal_kernel(KernelContext& ctx) {
  return compare_kernel(ctx, [](const auto& x, const auto& y) { return x >= y; });
}

// Logical ops on bool tensors.
template <typename Fn>
Status logical_kernel(KernelContext& ctx, Fn fn) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != DataType::kBool || b.dtype() != DataType::kBool)
    return ctx.error(str_cat("inputs must be bool, got ", a.describe(), " and ", b.describe()));
  KILN_ASSIGN_OR_RETURN(BroadcastPlan p, plan_broadcast(ctx.node, {&a, &b}, legacy_broadcast(ctx)));
  Tensor out(DataType::kBool, p.out);
  const uint8_t* pa = a.data<uint8_t>();
  const uint8_t* pb = b.data<uint8_t>();
  bool* po = out.data<bool>();
  for (int64_t i = 0; i < out.numel(); ++i) po[i] = fn(pa[p.index[0](i)] != 0, pb[p.index[1](i)] != 0);
  ctx.set_output(0, out);
  return Status::Ok();
}

Status and_kernel(KernelContext& ctx) {
  return logical_kernel(ctx, [](bool x, bool y) { return x && y; });
}
Status or_kernel(KernelContext& ctx) {
  return logical_kernel(ctx, [](bool x, bool y) { return x || y; });
}
Status xor_kernel(KernelContext& ctx) {
  return logical_kernel(ctx, [](bool x, bool y) { return x != y; });
}

Status not_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.dtype() != DataType::kBool) return ctx.error(str_cat("input must be bool, got ", x.describe()));
  Tensor out(DataType::kBool, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) out.data<bool>()[i] = x.data<uint8_t>()[i] == 0;
  ctx.set_output(0, out);
  return Status::Ok();
}

Status infer_logical(InferContext& ctx) { return infer_broadcast_to(ctx, DataType::kBool, ctx.opset() < 7); }

// Bitwise ops over integer tensors of one dtype.
template <typename Fn>
Status bitwise_kernel(KernelContext& ctx, Fn fn, bool unsigned_only) {
  KILN_RETURN_IF_ERROR(check_same_dtype(ctx, 0, 1));
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  DataType dt = a.dtype();
  if (!dtype_is_integer(dt) || !dtype_is_builtin(dt) || (unsigned_only && dtype_is_signed(dt)))
    return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported (needs ",
                                   unsigned_only ? "an unsigned" : "an", " integer type)"));
  KILN_ASSIGN_OR_RETURN(BroadcastPlan p, plan_broadcast(ctx.node, {&a, &b}, false));
  Tensor out(dt, p.out);
  dispatch_builtin(dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      const T* pa = a.data<T>();
      const T* pb = b.data<T>();
      T* po = out.data<T>();
      for (int64_t i = 0; i < out.numel(); ++i) po[i] = fn(pa[p.index[0](i)], pb[p.index[1](i)]);
    }
  });
  ctx.set_output(0, out);
  return Status::Ok();
}

Status bitwise_and_kernel(KernelContext& ctx) {
  return bitwise_kernel(
      ctx, [](auto x, auto y) { return static_cast<decltype(x)>(x & y); }, false);
}
Status bitwise_or_kernel(KernelContext& ctx) {
  return bitwise_kernel(
      ctx, [](auto x, auto y) { return static_cast<decltype(x)>(x | y); }, false);
}
Status bitwise_xor_kernel(KernelContext& ctx) {
  return bitwise_kernel(
      ctx, [](auto x, auto y) { return static_cast<decltype(x)>(x ^ y); }, false);
}

Status bitwise_not_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  DataType dt = x.dtype();
  if (!dtype_is_integer(dt) || !dtype_is_builtin(dt))
    return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported (needs an integer type)"));
  Tensor out(dt, x.shape());
  dispatch_builtin(dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      for (int64_t i = 0; i < x.numel(); ++i) out.data<T>()[i] = static_cast<T>(~x.data<T>()[i]);
    }
  });
  ctx.set_output(0, out);
  return Status::Ok();
}

// BitShift: unsigned integers; shifting by the bit width or more gives 0.
Status bitshift_kernel(KernelContext& ctx) {
  std::string dir = ctx.node.attr_string("direction", "");
  if (dir != "LEFT" && dir != "RIGHT")
    return ctx.error(str_cat("attribute direction must be \"LEFT\" or \"RIGHT\", got \"", dir, "\""));
  bool left = dir == "LEFT";
  return bitwise_kernel(
      ctx,
      [left](auto x, auto y) {
        using T = decltype(x);
        constexpr auto bits = static_cast<uint64_t>(sizeof(T) * 8);
        if (static_cast<uint64_t>(y) >= bits) return T(0);
        using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, T>;
        return static_cast<T>(left ? static_cast<U>(x) << y : static_cast<U>(x) >> y);
      },
      true);
}

Status infer_same_type_broadcast(InferContext& ctx) { return infer_broadcast_same_type(ctx, false); }

// Where(condition, X, Y): X where condition is true, else Y, all three broadcast together.
Status where_kernel(KernelContext& ctx) {
  const Tensor& c = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& y = ctx.input(2);
  if (c.dtype() != DataType::kBool) return ctx.error(str_cat("condition must be bool, got ", c.describe()));
  if (x.dtype() != y.dtype())
    return ctx.error(str_cat("X and Y must share one dtype, got ", x.describe(), " and ", y.describe()));
  KILN_ASSIGN_OR_RETURN(BroadcastPlan p, plan_broadcast(ctx.node, {&c, &x, &y}, false));
  Tensor out(x.dtype(), p.out);
  const uint8_t* pc = c.data<uint8_t>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (pc[p.index[0](i)])
      copy_elements(x, p.index[1](i), out, i, 1);
    else
      copy_elements(y, p.index[2](i), out, i, 1);
  }
  ctx.set_output(0, out);
  return Status::Ok();
}

Status infer_where(InferContext& ctx) {
  DataType dx = ctx.input_dtype(1), dy = ctx.input_dtype(2);
  if (dx != DataType::kUndefined && dy != DataType::kUndefined && dx != dy)
    return ctx.error(str_cat("X and Y must share one dtype, got ", dtype_name(dx), " and ", dtype_name(dy)));
  return infer_broadcast_to(ctx, dx != DataType::kUndefined ? dx : dy, false);
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Equal, 1, infer_compare, equal_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Less, 1, infer_compare, less_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Greater, 1, infer_compare, greater_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", LessOrEqual, 12, infer_compare, less_equal_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", GreaterOrEqual, 12, infer_compare, greater_equal_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", And, 1, infer_logical, and_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Or, 1, infer_logical, or_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Xor, 1, infer_logical, xor_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Not, 1, infer_same_as_input0, not_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", BitShift, 11, infer_same_type_broadcast, bitshift_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", BitwiseAnd, 18, infer_same_type_broadcast, bitwise_and_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", BitwiseOr, 18, infer_same_type_broadcast, bitwise_or_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", BitwiseXor, 18, infer_same_type_broadcast, bitwise_xor_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", BitwiseNot, 18, infer_same_as_input0, bitwise_not_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Where, 9, infer_where, where_kernel, 3, 3);

}  // namespace kiln::ops
