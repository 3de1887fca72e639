// Softmax, LogSoftmax, Hardmax.
//
// Before opset 13 the input is coerced to 2-D at `axis` (default 1): [prod(dims[:axis]),
// prod(dims[axis:])] and each row of that matrix is normalized. From opset 13 on, `axis`
// (default -1) names the single dimension normalized.
#include <cmath>
#include <limits>

#include "ops/reduce_util.h"

namespace kiln::ops {
namespace {

enum class SM { kSoftmax, kLogSoftmax, kHardmax };

Status infer_softmax(InferContext& ctx) {
  const SymShape& in = ctx.input_shape(0);
  if (in.rank_known) {
    int64_t rank = static_cast<int64_t>(in.rank());
    int64_t dflt = ctx.opset() < 13 ? 1 : -1;
    int64_t axis = ctx.node.attr_int("axis", dflt);
    // Opset<13 allows axis == rank (every dim in the outer part).
    bool ok = ctx.opset() < 13 ? (axis >= -rank && axis <= rank) : normalize_axis(axis, rank).ok();
    if (!ok) return ctx.error(str_cat("axis ", axis, " is out of range for rank ", rank));
  }
  ctx.set_output(0, ctx.input_dtype(0), in);
  return Status::Ok();
}

template <SM kKind>
Status softmax_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  DataType dt = x0.dtype();
  if (!dtype_is_float(dt))
    return ctx.unsupported(str_cat(ctx.node.op_type, " needs a float input, got ", x0.describe()));
  int64_t rank = x0.rank();
  AxisSplit sp;
  if (ctx.opset() < 13) {
    int64_t axis = ctx.node.attr_int("axis", 1);
    if (axis < -rank || axis > rank) return ctx.error(str_cat("axis ", axis, " is out of range for rank ", rank));
    if (axis < 0) axis += rank;
    sp = split_2d(x0.shape(), axis);
  } else {
    int64_t axis = ctx.node.attr_int("axis", -1);
    if (rank == 0) {
      if (axis != 0 && axis != -1) return ctx.error(str_cat("axis ", axis, " is out of range for a scalar"));
      sp = AxisSplit{};
    } else {
      auto a = normalize_axis(axis, rank);
      if (!a.ok()) return ctx.error(a.status().message());
      sp = split_at_axis(x0.shape(), *a);
    }
  }
  Tensor x = upcast_float(x0);
  Tensor out(x.dtype(), x.shape());
  dispatch_builtin(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      const T* px = x.data<T>();
      T* po = out.data<T>();
      std::vector<double> e(static_cast<size_t>(sp.len));
      for (int64_t o = 0; o < sp.outer; ++o) {
        for (int64_t in = 0; in < sp.inner; ++in) {
          int64_t base = o * sp.len * sp.inner + in;
          double mx = -std::numeric_limits<double>::infinity();
          int64_t arg = 0;
          for (int64_t k = 0; k < sp.len; ++k) {
            double v = px[base + k * sp.inner];
            if (v > mx) {
              mx = v;
              arg = k;
            }
          }
          if (kKind == SM::kHardmax) {
            for (int64_t k = 0; k < sp.len; ++k) po[base + k * sp.inner] = static_cast<T>(k == arg ? 1 : 0);
            continue;
          }
          double sum = 0;
          for (int64_t k = 0; k < sp.len; ++k) {
            e[static_cast<size_t>(k)] = std::exp(static_cast<double>(px[base + k * sp.inner]) - mx);
            sum += e[static_cast<size_t>(k)];
          }
          double log_sum = std::log(sum);
          for (int64_t k = 0; k < sp.len; ++k) {
            double r = kKind == SM::kSoftmax ? e[static_cast<size_t>(k)] / sum
                                             : static_cast<double>(px[base + k * sp.inner]) - mx - log_sum;
            po[base + k * sp.inner] = static_cast<T>(r);
          }
        }
      }
    }
  });
  ctx.set_output(0, downcast_float(out, dt));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Softmax, 1, infer_softmax, softmax_kernel<SM::kSoftmax>, 1, 1);
KILN_REGISTER_OP_ARITY("", LogSoftmax, 1, infer_softmax, softmax_kernel<SM::kLogSoftmax>, 1, 1);
KILN_REGISTER_OP_ARITY("", Hardmax, 1, infer_softmax, softmax_kernel<SM::kHardmax>, 1, 1);

}  // namespace kiln::ops
