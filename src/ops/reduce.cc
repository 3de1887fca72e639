// Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
// ReduceLogSum, ReduceLogSumExp, ReduceSumSquare, and ArgMax / ArgMin.
//
// Versions: 'axes' is an attribute before opset 13 (ReduceSum) / 18 (the others) and an optional
// input from then on, together with 'noop_with_empty_axes'. Float types accumulate in double;
// integer sums and products wrap (two's complement), as numpy's do.
#include <cmath>
#include <limits>
#include <span>
#include <string_view>

#include "ops/reduce_util.h"

namespace kiln::ops {
namespace {

enum class RK { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

// The opset from which 'axes' is an input.
int axes_input_since(const std::string& op) { return op == "ReduceSum" ? 13 : 18; }

// Where the axes come from. `known` is false when they are an input whose value is unknown
// (inference only). An empty `axes` with noop false means "all axes".
struct AxesSpec {
  bool known = true;
  bool noop = false;  // identity: empty axes with noop_with_empty_axes=1
  std::vector<int64_t> axes;
};

AxesSpec axes_from_attr_or_values(const ir::Node& node, int opset, const std::vector<int64_t>* input_axes,
                                  bool input_given) {
  AxesSpec s;
  if (opset < axes_input_since(node.op_type)) {
    s.axes = node.attr_ints("axes");
    return s;
  }
  bool noop_attr = node.attr_int("noop_with_empty_axes", 0) != 0;
  if (input_given) {
    if (!input_axes) {
      s.known = false;
      return s;
    }
    s.axes = *input_axes;
  }
  s.noop = s.axes.empty() && noop_attr;
  return s;
}

// Reduced-axis mask for `rank` from the spec (all axes when the list is empty).
Result<std::vector<bool>> reduced_mask(const AxesSpec& s, int64_t rank) {
  std::vector<bool> mask(static_cast<size_t>(rank), s.axes.empty() && !s.noop);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> ax, normalize_axes(s.axes, rank));
  for (int64_t a : ax) mask[static_cast<size_t>(a)] = true;
  return mask;
}

Status infer_reduce(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  bool keepdims = ctx.node.attr_int("keepdims", 1) != 0;
  std::vector<int64_t> axes_vals;
  bool input_given = ctx.opset() >= axes_input_since(ctx.node.op_type) && ctx.has_input(1);
  bool axes_const = input_given && constant_ints(ctx, 1, &axes_vals);
  AxesSpec s = axes_from_attr_or_values(ctx.node, ctx.opset(), axes_const ? &axes_vals : nullptr, input_given);
  if (!in.rank_known) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  int64_t rank = static_cast<int64_t>(in.rank());
  if (!s.known) {
    if (!keepdims) {
      ctx.set_output(0, dt, SymShape());
      return Status::Ok();
    }
    // Each dim either stays or becomes 1.
    std::vector<Dim> d(in.dims.size());
    for (size_t i = 0; i < d.size(); ++i)
      if (in.dims[i].known() && in.dims[i].value == 1) d[i] = Dim(1);
    ctx.set_output(0, dt, SymShape(d));
    return Status::Ok();
  }
  auto mask = reduced_mask(s, rank);
  if (!mask.ok()) return ctx.error(mask.status().message());
  std::vector<Dim> out;
  for (size_t i = 0; i < in.dims.size(); ++i) {
    if (!(*mask)[i])
      out.push_back(in.dims[i]);
    else if (keepdims)
      out.push_back(Dim(1));
  }
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

// Wrapping integer helpers (through uint64).
template <typename T>
uint64_t to_u64(T v) {
  if constexpr (std::is_signed_v<T>)
    return static_cast<uint64_t>(static_cast<int64_t>(v));
  else
    return static_cast<uint64_t>(v);
}
template <typename T>
uint64_t abs_u64(T v) {
  if constexpr (std::is_signed_v<T>)
    return v < 0 ? uint64_t(0) - to_u64(v) : to_u64(v);
  else
    return to_u64(v);
}

// Float reduction (T is float or double): accumulate in double.
template <typename T>
void reduce_float(RK kind, const Tensor& x, const std::vector<bool>& mask, int64_t count, Tensor& out) {
  const T* px = x.data<T>();
  int64_t n_out = out.numel();
  const double inf = std::numeric_limits<double>::infinity();
  double init = 0;
  if (kind == RK::kProd) init = 1;
  if (kind == RK::kMax || kind == RK::kLogSumExp) init = -inf;
  if (kind == RK::kMin) init = inf;
  std::vector<double> acc(static_cast<size_t>(n_out), init);
  for_each_reduced(x.shape(), mask, [&](int64_t i, int64_t o) {
    double v = px[i];
    double& a = acc[static_cast<size_t>(o)];
    switch (kind) {
      case RK::kSum:
      case RK::kMean:
      case RK::kLogSum: a += v; break;
      case RK::kSumSquare:
      case RK::kL2: a += v * v; break;
      case RK::kL1: a += std::fabs(v); break;
      case RK::kProd: a *= v; break;
      case RK::kMax:
      case RK::kLogSumExp:
        if (v > a || std::isnan(v)) a = std::isnan(a) ? a : v;
        break;
      case RK::kMin:
        if (v < a || std::isnan(v)) a = std::isnan(a) ? a : v;
        break;
    }
  });
  if (kind == RK::kLogSumExp) {
    // Second pass: log(sum(exp(x - max))) + max, stable for large values.
    std::vector<double> sum(static_cast<size_t>(n_out), 0.0);
    for_each_reduced(x.shape(), mask, [&](int64_t i, int64_t o) {
      double m = acc[static_cast<size_t>(o)];
      if (std::isfinite(m)) sum[static_cast<size_t>(o)] += std::exp(static_cast<double>(px[i]) - m);
    });
    for (int64_t o = 0; o < n_out; ++o) {
      double m = acc[static_cast<size_t>(o)];
      if (std::isfinite(m)) acc[static_cast<size_t>(o)] = m + std::log(sum[static_cast<size_t>(o)]);
    }
  }
  T* po = out.data<T>();
  for (int64_t o = 0; o < n_out; ++o) {
    double a = acc[static_cast<size_t>(o)];
    switch (kind) {
      case RK::kMean: a = a / static_cast<double>(count); break;
      case RK::kL2: a = std::sqrt(a); break;
      case RK::kLogSum: a = std::log(a); break;
      default: break;
    }
    po[o] = static_cast<T>(a);
  }
}

// Integer reduction for the kinds with an exact integer result.
template <typename T>
void reduce_int(RK kind, const Tensor& x, const std::vector<bool>& mask, int64_t count, Tensor& out) {
  const T* px = x.data<T>();
  int64_t n_out = out.numel();
  T* po = out.data<T>();
  if (kind == RK::kMax || kind == RK::kMin) {
    T init = kind == RK::kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
    for (int64_t o = 0; o < n_out; ++o) po[o] = init;
    for_each_reduced(x.shape(), mask, [&](int64_t i, int64_t o) {
      if (kind == RK::kMax ? px[i] > po[o] : px[i] < po[o]) po[o] = px[i];
    });
    return;
  }
  std::vector<uint64_t> acc(static_cast<size_t>(n_out), kind == RK::kProd ? 1 : 0);
  for_each_reduced(x.shape(), mask, [&](int64_t i, int64_t o) {
    uint64_t& a = acc[static_cast<size_t>(o)];
    switch (kind) {
      case RK::kProd: a *= to_u64(px[i]); break;
      case RK::kSumSquare: a += to_u64(px[i]) * to_u64(px[i]); break;
      case RK::kL1: a += abs_u64(px[i]); break;
      default: a += to_u64(px[i]); break;
    }
  });
  for (int64_t o = 0; o < n_out; ++o) {
    uint64_t a = acc[static_cast<size_t>(o)];
    if (kind == RK::kMean && count > 0) {
      if constexpr (std::is_signed_v<T>) {
        int64_t s = static_cast<int64_t>(a);
        a = static_cast<uint64_t>(s / count);
      } else {
        a = a / static_cast<uint64_t>(count);
      }
    }
    po[o] = static_cast<T>(a);  // truncation = wrapping
  }
}

// An attribute by a view of its name: Node::attr takes a std::string, and a name longer than the
// short-string buffer ("noop_with_empty_axes") would allocate on every call.
const ir::Attribute* find_attr(const ir::Node& n, std::string_view name) {
  for (const auto& kv : n.attrs)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

// Integer, float32 and float64 ReduceMax/ReduceMin and integer ReduceSum/ReduceProd of rank 1 to 8, the detectors'
// shape work inside If/Loop bodies (int64 reductions of a few elements, every iteration), without a heap allocation:
// axes, mask and indices on the stack, the output renewed over the node's last one (tests/noalloc). Gives the general
// kernel's values. False when it is not this case or something is wrong (the general kernel runs and reports it).
template <RK kKind>
bool reduce_minmax_in_place(KernelContext& ctx) {
  constexpr bool kSumProd = kKind == RK::kSum || kKind == RK::kProd;
  if constexpr (kKind != RK::kMax && kKind != RK::kMin && !kSumProd) {
    return false;
  } else {
    constexpr size_t kMaxRank = 8;
    const Tensor& x = ctx.input(0);
    const DataType dt = x.dtype();
    const size_t rank = static_cast<size_t>(x.rank());
    // Sum and Prod: integers only (they wrap like reduce_int's; floats accumulate in double there).
    const bool floating = !kSumProd && (dt == DataType::kFloat32 || dt == DataType::kFloat64);
    if (!(dtype_is_integer(dt) || floating) || !dtype_is_builtin(dt) || rank == 0 || rank > kMaxRank ||
        x.numel() == 0 || ctx.outputs.empty())
      return false;
    bool mask[kMaxRank] = {};
    size_t n_axes = 0;
    auto mark = [&](int64_t a) {
      if (a < 0) a += static_cast<int64_t>(rank);
      if (a < 0 || a >= static_cast<int64_t>(rank) || mask[a]) return false;
      mask[a] = true, ++n_axes;
      return true;
    };
    if (ctx.opset() >= axes_input_since(ctx.node.op_type)) {
      if (ctx.has_input(1)) {
        const Tensor& a = ctx.input(1);
        if (!dtype_is_integer(a.dtype()) || a.rank() > 1) return false;
        for (int64_t i = 0; i < a.numel(); ++i)
          if (!mark(a.get_i64(i))) return false;
      }
      const ir::Attribute* noop = find_attr(ctx.node, "noop_with_empty_axes");
      if (n_axes == 0 && noop && noop->i != 0) return false;  // the identity: the general kernel
    } else if (const ir::Attribute* axes = find_attr(ctx.node, "axes")) {
      for (int64_t a : axes->ints)
        if (!mark(a)) return false;
    }
    if (n_axes == 0)
      for (size_t i = 0; i < rank; ++i) mask[i] = true;  // no axes: all of them
    const ir::Attribute* keep = find_attr(ctx.node, "keepdims");
    const bool keepdims = !keep || keep->i != 0;
    int64_t out_shape[kMaxRank], ostride[kMaxRank];  // ostride: the output's stride per input axis (0: reduced)
    size_t out_rank = 0;
    for (size_t i = 0, stride = 1; i < rank; ++i) {
      const size_t k = rank - 1 - i;
      ostride[k] = mask[k] ? 0 : static_cast<int64_t>(stride);
      if (!mask[k]) stride *= static_cast<size_t>(x.dim(static_cast<int64_t>(k)));
    }
    for (size_t i = 0; i < rank; ++i)
      if (!mask[i] || keepdims) out_shape[out_rank++] = mask[i] ? 1 : x.dim(static_cast<int64_t>(i));
    Tensor& out = ctx.outputs[0].tensor;
    ctx.outputs[0].kind = Value::Kind::kTensor;
    out.renew(dt, std::span<const int64_t>(out_shape, out_rank));
    dispatch_builtin(dt, [&](auto tag) {
      using T = decltype(tag);
      const T* px = x.data<T>();
      T* po = out.data<T>();
      constexpr bool kFloat = std::is_floating_point_v<T>;
      // Floats: from +-infinity, and the first NaN met wins (reduce_float's rule; its double accumulator
      // holds every float value exactly, so the values are the same).
      const T init =
          kSumProd ? T(kKind == RK::kProd ? 1 : 0)
          : kFloat ? (kKind == RK::kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity())
                   : (kKind == RK::kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max());
      for (int64_t o = 0; o < out.numel(); ++o) po[o] = init;
      int64_t idx[kMaxRank] = {}, o = 0;
      const int64_t n = x.numel();
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (kSumProd) {
          if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
            // Modulo 2^bits of T: reduce_int's uint64 accumulator truncated at the end gives the same.
            using U = std::make_unsigned_t<T>;
            const uint64_t a = static_cast<U>(po[o]), b = static_cast<U>(px[i]);
            po[o] = static_cast<T>(kKind == RK::kSum ? a + b : a * b);
          }
        } else if constexpr (kFloat) {
          const T v = px[i];
          if (kKind == RK::kMax ? v > po[o] || std::isnan(v) : v < po[o] || std::isnan(v))
            po[o] = std::isnan(po[o]) ? po[o] : v;
        } else if (kKind == RK::kMax ? px[i] > po[o] : px[i] < po[o]) {
          po[o] = px[i];
        }
        for (size_t k = rank; k-- > 0;) {
          const int64_t d = x.dim(static_cast<int64_t>(k));
          if (++idx[k] < d) {
            o += ostride[k];
            break;
          }
          o -= ostride[k] * (d - 1);
          idx[k] = 0;
        }
      }
      if constexpr (kFloat)  // through double, as reduce_float stores (a signaling NaN comes out quiet)
        for (int64_t j = 0; j < out.numel(); ++j) po[j] = static_cast<T>(static_cast<double>(po[j]));
    });
    return true;
  }
}

template <RK kKind>
Status reduce_kernel(KernelContext& ctx) {
  if (reduce_minmax_in_place<kKind>(ctx)) return Status::Ok();
  const Tensor& x0 = ctx.input(0);
  int64_t rank = x0.rank();
  bool keepdims = ctx.node.attr_int("keepdims", 1) != 0;
  std::vector<int64_t> axes_vals;
  bool input_given = ctx.opset() >= axes_input_since(ctx.node.op_type) && ctx.has_input(1);
  if (input_given) {
    const Tensor& a = ctx.input(1);
    if (!dtype_is_integer(a.dtype())) return ctx.error(str_cat("axes must be int64, got ", a.describe()));
    if (a.rank() > 1) return ctx.error(str_cat("axes must be 1-D, got ", a.describe()));
    axes_vals = to_i64_vector(a);
  }
  AxesSpec s = axes_from_attr_or_values(ctx.node, ctx.opset(), input_given ? &axes_vals : nullptr, input_given);
  if (s.noop) {
    ctx.set_output(0, x0);
    return Status::Ok();
  }
  auto mask_r = reduced_mask(s, rank);
  if (!mask_r.ok()) return ctx.error(mask_r.status().message());
  const std::vector<bool>& mask = *mask_r;
  Dims kept_shape, out_shape;
  int64_t count = 1;
  for (int64_t i = 0; i < rank; ++i) {
    int64_t d = x0.dim(i);
    if (mask[static_cast<size_t>(i)]) {
      count *= d;
      kept_shape.push_back(1);
      if (keepdims) out_shape.push_back(1);
    } else {
      kept_shape.push_back(d);
      out_shape.push_back(d);
    }
  }
  DataType dt = x0.dtype();
  if (dt == DataType::kBool) {
    if (kKind != RK::kMax && kKind != RK::kMin)
      return ctx.unsupported(str_cat(ctx.node.op_type, " does not take bool input"));
    Tensor out(dt, kept_shape);
    const bool* px = x0.data<bool>();
    bool* po = out.data<bool>();
    for (int64_t o = 0; o < out.numel(); ++o) po[o] = kKind == RK::kMin;  // identity of any / all
    for_each_reduced(x0.shape(), mask,
                     [&](int64_t i, int64_t o) { po[o] = kKind == RK::kMax ? (po[o] || px[i]) : (po[o] && px[i]); });
    ctx.set_output(0, out.reshaped(out_shape));
    return Status::Ok();
  }
  if (!dtype_is_builtin(dt) && !is_low_precision_float(dt))
    return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  bool via_double = dtype_is_integer(dt) && (kKind == RK::kL2 || kKind == RK::kLogSum || kKind == RK::kLogSumExp);
  Tensor x = via_double ? x0.cast(DataType::kFloat64).value() : upcast_float(x0);
  Tensor out(x.dtype(), kept_shape);
  dispatch_builtin(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      reduce_float<T>(kKind, x, mask, count, out);
    } else if constexpr (!std::is_same_v<T, bool>) {
      reduce_int<T>(kKind, x, mask, count, out);
    }
  });
  Tensor res = via_double ? out.cast(dt).value() : downcast_float(out, dt);
  ctx.set_output(0, res.reshaped(out_shape));
  return Status::Ok();
}

// ---- ArgMax / ArgMin ----

Status infer_arg(InferContext& ctx) {
  const SymShape& in = ctx.input_shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, DataType::kInt64, SymShape());
    return Status::Ok();
  }
  int64_t rank = static_cast<int64_t>(in.rank());
  auto axis = normalize_axis(ctx.node.attr_int("axis", 0), rank);
  if (!axis.ok()) return ctx.error(axis.status().message());
  bool keepdims = ctx.node.attr_int("keepdims", 1) != 0;
  std::vector<Dim> out;
  for (int64_t i = 0; i < rank; ++i) {
    if (i != *axis)
      out.push_back(in.dims[static_cast<size_t>(i)]);
    else if (keepdims)
      out.push_back(Dim(1));
  }
  ctx.set_output(0, DataType::kInt64, SymShape(out));
  return Status::Ok();
}

template <bool kMax>
Status arg_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  int64_t rank = x0.rank();
  auto axis_r = normalize_axis(ctx.node.attr_int("axis", 0), rank);
  if (!axis_r.ok()) return ctx.error(axis_r.status().message());
  int64_t axis = rank == 0 ? 0 : *axis_r;
  bool keepdims = ctx.node.attr_int("keepdims", 1) != 0;
  bool last = ctx.node.attr_int("select_last_index", 0) != 0;
  DataType dt = x0.dtype();
  if (dt == DataType::kString || (!dtype_is_builtin(dt) && !is_low_precision_float(dt)))
    return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  AxisSplit sp = rank == 0 ? AxisSplit{} : split_at_axis(x0.shape(), axis);
  if (sp.len == 0 && sp.outer * sp.inner > 0)
    return ctx.error(
        str_cat("cannot take ", ctx.node.op_type, " over axis ", axis, " of size 0 (input ", x0.describe(), ")"));
  Dims out_shape;
  for (int64_t i = 0; i < rank; ++i) {
    if (i != axis)
      out_shape.push_back(x0.dim(i));
    else if (keepdims)
      out_shape.push_back(1);
  }
  Tensor x = upcast_float(x0);
  Tensor out(DataType::kInt64, out_shape);
  int64_t* po = out.data<int64_t>();
  dispatch_builtin(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    for (int64_t o = 0; o < sp.outer; ++o) {
      for (int64_t in = 0; in < sp.inner; ++in) {
        const T* row = px + o * sp.len * sp.inner + in;
        int64_t best = 0;
        for (int64_t k = 1; k < sp.len; ++k) {
          T v = row[k * sp.inner], b = row[best * sp.inner];
          bool better;
          if constexpr (std::is_floating_point_v<T>) {
            if (std::isnan(b)) continue;  // the first NaN wins, like numpy
            if (std::isnan(v)) {
              best = k;
              continue;
            }
          }
          if constexpr (kMax)
            better = last ? !(v < b) : v > b;
          else
            better = last ? !(v > b) : v < b;
          if (better) best = k;
        }
        po[o * sp.inner + in] = best;
      }
    }
  });
  ctx.set_output(0, out);
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", ReduceSum, 1, infer_reduce, reduce_kernel<RK::kSum>, 1, 2);
KILN_REGISTER_OP_ARITY("", ReduceMean, 1, infer_reduce, reduce_kernel<RK::kMean>, 1, 2);
KILN_REGISTER_OP_ARITY("", ReduceMax, 1, infer_reduce, reduce_kernel<RK::kMax>, 1, 2);
KILN_REGISTER_OP_ARITY("", ReduceMin, 1, infer_reduce, reduce_kernel<RK::kMin>, 1, 2);
KILN_REGISTER_OP_ARITY("", ReduceProd, 1, infer_reduce, reduce_kernel<RK::kProd>, 1, 2);
KILN_REGISTER_OP_ARITY("", ReduceL1, 1, infer_reduce, reduce_kernel<RK::kL1>, 1, 2);
KILN_REGISTER_OP_ARITY("", ReduceL2, 1, infer_reduce, reduce_kernel<RK::kL2>, 1, 2);
KILN_REGISTER_OP_ARITY("", ReduceLogSum, 1, infer_reduce, reduce_kernel<RK::kLogSum>, 1, 2);
KILN_REGISTER_OP_ARITY("", ReduceLogSumExp, 1, infer_reduce, reduce_kernel<RK::kLogSumExp>, 1, 2);
KILN_REGISTER_OP_ARITY("", ReduceSumSquare, 1, infer_reduce, reduce_kernel<RK::kSumSquare>, 1, 2);
KILN_REGISTER_OP_ARITY("", ArgMax, 1, infer_arg, arg_kernel<true>, 1, 1);
KILN_REGISTER_OP_ARITY("", ArgMin, 1, infer_arg, arg_kernel<false>, 1, 1);

}  // namespace kiln::ops
