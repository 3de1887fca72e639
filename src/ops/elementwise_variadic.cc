// Variadic elementwise ops with numpy broadcasting over all inputs: Max, Min, Sum, Mean.
// (Before opset 8 the inputs had to share one shape; broadcasting accepts that as well.)
#include <cmath>

#include "ops/elementwise_util.h"
#include "ops/op_traits.h"

namespace kiln::ops {
namespace {

Status infer_variadic(InferContext& ctx) {
  if (ctx.num_inputs() == 0) return ctx.error("needs at least one input");
  return infer_broadcast_same_type(ctx, false);
}

// out[i] = fold of fn over the inputs' broadcast elements, in input order. Low-precision floats
// compute in float32; `finish` maps the folded value (Mean divides by the count).
template <typename Fn, typename Finish>
Status variadic_kernel(KernelContext& ctx, bool floats_only, Fn fn, Finish finish) {
  size_t n = ctx.num_inputs();
  if (n == 0) return ctx.error("needs at least one input");
  for (size_t i = 0; i < n; ++i)
    if (!ctx.has_input(i)) return ctx.error(str_cat("input ", i, " is missing"));
  KILN_RETURN_IF_ERROR(check_same_dtype(ctx, 0, n - 1));
  DataType dt = ctx.input(0).dtype();
  if (!is_numeric(dt) || (floats_only && !dtype_is_float(dt)))
    return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  std::vector<Tensor> ins;
  std::vector<const Tensor*> ptrs;
  for (size_t i = 0; i < n; ++i) ins.push_back(upcast_float(ctx.input(i)));
  for (const Tensor& t : ins) ptrs.push_back(&t);
  DataType cdt = ins[0].dtype();
  if (!dtype_is_builtin(cdt)) return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  KILN_ASSIGN_OR_RETURN(BroadcastPlan p, plan_broadcast(ctx.node, ptrs, false));
  Tensor out(cdt, p.out);
  dispatch_builtin(cdt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      T* po = out.data<T>();
      for (int64_t i = 0; i < out.numel(); ++i) {
        T acc = ins[0].data<T>()[p.index[0](i)];
        for (size_t k = 1; k < n; ++k) acc = fn(acc, ins[k].data<T>()[p.index[k](i)]);
        po[i] = finish(acc, n);
      }
    }
  });
  ctx.set_output(0, downcast_float(out, dt));
  return Status::Ok();
}

auto identity_finish = [](auto v, size_t) { return v; };

// Max/Min propagate NaN like numpy's maximum/minimum.
Status max_kernel(KernelContext& ctx) {
  return variadic_kernel(
      ctx, false,
      [](auto a, auto b) {
        using T = decltype(a);
        if constexpr (std::is_floating_point_v<T>) {
          if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
        }
        return a < b ? b : a;
      },
      identity_finish);
}
Status min_kernel(KernelContext& ctx) {
  return variadic_kernel(
      ctx, false,
      [](auto a, auto b) {
        using T = decltype(a);
        if constexpr (std::is_floating_point_v<T>) {
          if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
        }
        return b < a ? b : a;
      },
      identity_finish);
}
Status sum_kernel(KernelContext& ctx) {
  return variadic_kernel(
      ctx, true, [](auto a, auto b) { return wrap_op(a, b, [](auto x, auto y) { return x + y; }); }, identity_finish);
}
Status mean_kernel(KernelContext& ctx) {
  return variadic_kernel(
      ctx, true, [](auto a, auto b) { return wrap_op(a, b, [](auto x, auto y) { return x + y; }); },
      [](auto v, size_t n) { return static_cast<decltype(v)>(v / static_cast<decltype(v)>(n)); });
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Max, 1, infer_variadic, max_kernel, 1, -1);
KILN_REGISTER_OP_ARITY("", Min, 1, infer_variadic, min_kernel, 1, -1);
KILN_REGISTER_OP_ARITY("", Sum, 1, infer_variadic, sum_kernel, 1, -1);
KILN_REGISTER_OP_ARITY("", Mean, 1, infer_variadic, mean_kernel, 1, -1);

// Traits (registry.h); readers take the two-input forms as binary. Mean is in-place only: the
// elementwise passes have never taken it.
constexpr uint32_t kVariadicBroadcastInPlace = trait::kElementwiseBroadcast | trait::kInPlace;
KILN_OP_TRAITS("", Max, kVariadicBroadcastInPlace);
KILN_OP_TRAITS("", Min, kVariadicBroadcastInPlace);
KILN_OP_TRAITS("", Sum, kVariadicBroadcastInPlace);
KILN_OP_TRAITS("", Mean, trait::kInPlace);

}  // namespace kiln::ops
