// CumSum, CumProd (scans along one axis, with 'exclusive' and 'reverse') and TopK.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/reduce_util.h"

namespace kiln::ops {
namespace {

// ---- CumSum / CumProd ----

// Reads the scan axis: a scalar or one-element 1-D integer tensor (the kernel and, for a constant
// axis, inference: a build refuses what a run would).
Result<int64_t> scan_axis(const Tensor& a, int64_t rank) {
  if (!dtype_is_integer(a.dtype()) || a.numel() != 1 || a.rank() > 1)
    return InvalidArgument("axis must be an integer scalar, got ", a.describe());
  return normalize_axis(a.get_i64(0), rank);
}

template <bool kProd>
Status scan_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  DataType dt = x0.dtype();
  if (dt == DataType::kBool || (!dtype_is_builtin(dt) && !is_low_precision_float(dt)))
    return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  if (x0.rank() == 0) return ctx.error("input must have rank >= 1, got a scalar");
  auto axis = scan_axis(ctx.input(1), x0.rank());
  if (!axis.ok()) return ctx.error(axis.status().message());
  bool exclusive = ctx.node.attr_int("exclusive", 0) != 0;
  bool reverse = ctx.node.attr_int("reverse", 0) != 0;
  AxisSplit sp = split_at_axis(x0.shape(), *axis);
  Tensor x = upcast_float(x0);
  Tensor out(x.dtype(), x.shape());
  dispatch_builtin(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      // Floats accumulate in double; integers wrap through uint64.
      using Acc = std::conditional_t<std::is_floating_point_v<T>, double, uint64_t>;
      const T* px = x.data<T>();
      T* po = out.data<T>();
      for (int64_t o = 0; o < sp.outer; ++o) {
        for (int64_t in = 0; in < sp.inner; ++in) {
          int64_t base = o * sp.len * sp.inner + in;
          Acc acc = kProd ? Acc(1) : Acc(0);
          for (int64_t j = 0; j < sp.len; ++j) {
            int64_t k = reverse ? sp.len - 1 - j : j;
            int64_t idx = base + k * sp.inner;
            Acc v;
            if constexpr (std::is_floating_point_v<T>)
              v = px[idx];
            else if constexpr (std::is_signed_v<T>)
              v = static_cast<uint64_t>(static_cast<int64_t>(px[idx]));
            else
              v = static_cast<uint64_t>(px[idx]);
            if (exclusive) {
              po[idx] = static_cast<T>(acc);
              acc = kProd ? acc * v : acc + v;
            } else {
              acc = kProd ? acc * v : acc + v;
              po[idx] = static_cast<T>(acc);
            }
          }
        }
      }
    }
  });
  ctx.set_output(0, downcast_float(out, dt));
  return Status::Ok();
}

// ---- TopK ----

// k from the attribute (opset < 10) or the constant input; false when unknown.
bool topk_k_static(const InferContext& ctx, int64_t* k) {
  if (ctx.opset() < 10) {
    if (!ctx.node.attr("k")) return false;
    *k = ctx.node.attr_int("k", 0);
    return true;
  }
  std::vector<int64_t> v;
  if (!constant_ints(ctx, 1, &v) || v.size() != 1) return false;
  *k = v[0];
  return true;
}

Status infer_topk(InferContext& ctx) {
  const SymShape& in = ctx.input_shape(0);
  DataType dt = ctx.input_dtype(0);
  if (!in.rank_known) {
    ctx.set_output(0, dt, SymShape());
    ctx.set_output(1, DataType::kInt64, SymShape());
    return Status::Ok();
  }
  auto axis = normalize_axis(ctx.node.attr_int("axis", -1), static_cast<int64_t>(in.rank()));
  if (!axis.ok() || in.rank() == 0)
    return ctx.error(str_cat("axis ", ctx.node.attr_int("axis", -1), " is out of range for rank ", in.rank()));
  SymShape out = in;
  int64_t k = 0;
  Dim& d = out.dims[static_cast<size_t>(*axis)];
  if (topk_k_static(ctx, &k)) {
    if (k < 0 || (d.known() && k > d.value))
      return ctx.error(str_cat("k = ", k, " is out of range for axis ", *axis, " of size ", d.str()));
    d = Dim(k);
  } else {
    d = ctx.new_symbol();
  }
  ctx.set_output(0, dt, out);
  ctx.set_output(1, DataType::kInt64, out);
  return Status::Ok();
}

Status topk_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  DataType dt = x0.dtype();
  if (dt == DataType::kBool || (!dtype_is_builtin(dt) && !is_low_precision_float(dt)))
    return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  if (x0.rank() == 0) return ctx.error("input must have rank >= 1, got a scalar");
  auto axis = normalize_axis(ctx.node.attr_int("axis", -1), x0.rank());
  if (!axis.ok()) return ctx.error(axis.status().message());
  int64_t k;
  if (ctx.opset() < 10) {
    if (!ctx.node.attr("k")) return ctx.error("attribute 'k' is required");
    k = ctx.node.attr_int("k", 0);
  } else {
    if (!ctx.has_input(1)) return ctx.error("input 'K' is required");
    const Tensor& kt = ctx.input(1);
    if (!dtype_is_integer(kt.dtype()) || kt.numel() != 1)
      return ctx.error(str_cat("K must be a one-element integer tensor, got ", kt.describe()));
    k = kt.get_i64(0);
  }
  bool largest = ctx.opset() < 11 || ctx.node.attr_int("largest", 1) != 0;
  AxisSplit sp = split_at_axis(x0.shape(), *axis);
  if (k < 0 || k > sp.len)
    return ctx.error(str_cat("k = ", k, " is out of range for axis ", *axis, " of size ", sp.len));
  Dims out_shape = x0.shape();
  out_shape[static_cast<size_t>(*axis)] = k;
  Tensor x = upcast_float(x0);
  Tensor values(x.dtype(), out_shape), indices(DataType::kInt64, out_shape);
  int64_t* pi = indices.data<int64_t>();
  dispatch_builtin(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* pv = values.data<T>();
    // "a comes before b": by value (NaN counts as the largest), ties by lower index.
    auto before = [&](T a, int64_t ia, T b, int64_t ib) {
      if constexpr (std::is_floating_point_v<T>) {
        bool na = std::isnan(a), nb = std::isnan(b);
        if (na || nb) {
          if (na && nb) return ia < ib;
          return largest ? na : nb;
        }
      }
      if (a != b) return largest ? a > b : a < b;
      return ia < ib;
    };
    // (value, index) pairs side by side, selected then sorted: `before` is a strict total order, so
    // any exact selection gives the same k elements in the same order.
    std::vector<std::pair<T, int64_t>> items(static_cast<size_t>(sp.len));
    auto cmp = [&](const std::pair<T, int64_t>& a, const std::pair<T, int64_t>& b) {
      return before(a.first, a.second, b.first, b.second);
    };
    for (int64_t o = 0; o < sp.outer; ++o) {
      for (int64_t in = 0; in < sp.inner; ++in) {
        int64_t base = o * sp.len * sp.inner + in;
        for (int64_t a = 0; a < sp.len; ++a) items[static_cast<size_t>(a)] = {px[base + a * sp.inner], a};
        if (k < sp.len) std::nth_element(items.begin(), items.begin() + k, items.end(), cmp);
        std::sort(items.begin(), items.begin() + k, cmp);
        int64_t obase = o * k * sp.inner + in;
        for (int64_t j = 0; j < k; ++j) {
          pv[obase + j * sp.inner] = items[static_cast<size_t>(j)].first;
          pi[obase + j * sp.inner] = items[static_cast<size_t>(j)].second;
        }
      }
    }
  });
  ctx.set_output(0, downcast_float(values, dt));
  ctx.set_output(1, indices);
  return Status::Ok();
}

Status infer_scan(InferContext& ctx) {
  const SymShape& x = ctx.input_shape(0);
  if (x.rank_known && x.rank() == 0) return ctx.error("input must have rank >= 1, got a scalar");
  if (const Tensor* a = ctx.constant(1); a && x.rank_known) {
    auto axis = scan_axis(*a, static_cast<int64_t>(x.rank()));
    if (!axis.ok()) return ctx.error(axis.status().message());
  }
  return infer_same_as_input0(ctx);
}

}  // namespace

KILN_REGISTER_OP_ARITY("", CumSum, 11, infer_scan, scan_kernel<false>, 2, 2);
KILN_REGISTER_OP_ARITY("", CumProd, 26, infer_scan, scan_kernel<true>, 2, 2);
KILN_REGISTER_OP_ARITY("", TopK, 1, infer_topk, topk_kernel, 1, 2);

}  // namespace kiln::ops
