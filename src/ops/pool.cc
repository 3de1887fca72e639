// Pooling: AveragePool, MaxPool (with Indices), LpPool, their Global* forms, and MaxUnpool.
//
// A window along spatial dim d for output position o covers input positions
// o * stride - pad_begin + k * dilation, k in [0, kernel). Positions outside [0, in) are padding:
// they never contribute a value; AveragePool with count_include_pad counts those inside the
// declared padding [-pad_begin, in + pad_end) (never the extra ceil_mode overhang).
#include <cmath>
#include <limits>

#include "ops/conv_util.h"

namespace kiln::ops {
namespace {

enum class PoolKind { kAverage, kMax, kLp };

// One spatial dim of a pooling window.
struct PoolAxis {
  int64_t in = 0, out = 0, kernel = 1, stride = 1, dilation = 1, pad_begin = 0, pad_end = 0;

  // For output position o: the kernel taps [*lo, *hi) that land inside the input, and how many
  // land inside input + declared padding.
  void window(int64_t o, int64_t* lo, int64_t* hi, int64_t* with_pad) const {
    const int64_t start = o * stride - pad_begin;  // position of tap 0
    // start + k * dilation in [a, b)  <=>  k in [ceil((a - start) / dilation), ceil((b - start) / dilation))
    auto taps = [&](int64_t a, int64_t b, int64_t* first, int64_t* last) {
      *first = std::clamp<int64_t>(ceil_div(a - start, dilation), 0, kernel);
      *last = std::clamp<int64_t>(ceil_div(b - start, dilation), *first, kernel);
    };
    int64_t pf, pl;
    taps(0, in, lo, hi);
    taps(-pad_begin, in + pad_end, &pf, &pl);
    *with_pad = pl - pf;
  }
};

struct PoolPlan {
  int64_t batch = 0, channels = 0;
  std::vector<PoolAxis> axes;
  Dims out_shape;
};

Result<PoolPlan> make_pool_plan(const WindowGeometry& win, const Dims& x_shape) {
  PoolPlan p;
  p.batch = x_shape[0];
  p.channels = x_shape[1];
  p.out_shape = {p.batch, p.channels};
  for (size_t d = 0; d < win.rank(); ++d) {
    PoolAxis a;
    a.in = win.in[d];
    a.out = win.out[d];
    a.pad_begin = win.pad_begin[d];
    a.pad_end = win.pad_end[d];
    a.kernel = win.kernel[d];
    a.stride = win.strides[d];
    a.dilation = win.dilations[d];
    p.out_shape.push_back(a.out);
    p.axes.push_back(a);
  }
  KILN_RETURN_IF_ERROR(checked_numel(p.out_shape).status());
  return p;
}

// Calls visit(out_offset, taps, padded_count) for every output position of one (n, c) plane,
// where taps lists the in-plane input offsets of the window (row-major) and padded_count is the
// number of window positions inside input + declared padding (a double: kernels may be huge).
template <typename Visit>
void for_each_window(const PoolPlan& p, Visit&& visit) {
  const size_t n = p.axes.size();
  Dims in_shape, out_shape;
  for (const auto& a : p.axes) {
    in_shape.push_back(a.in);
    out_shape.push_back(a.out);
  }
  const Dims in_stride = strides_of(in_shape);
  const int64_t out_plane = dims_numel(out_shape);
  std::vector<int64_t> o(n, 0), k(n, 0), k_lo(n, 0), k_hi(n, 0), taps;
  for (int64_t oi = 0; oi < out_plane; ++oi) {
    taps.clear();
    double padded = 1;
    bool empty = false;
    for (size_t d = 0; d < n; ++d) {
      int64_t with_pad;
      p.axes[d].window(o[d], &k_lo[d], &k_hi[d], &with_pad);
      padded *= static_cast<double>(with_pad);
      k[d] = k_lo[d];
      empty = empty || k_lo[d] >= k_hi[d];
    }
    while (!empty) {
      int64_t off = 0;
      for (size_t d = 0; d < n; ++d) {
        const PoolAxis& a = p.axes[d];
        off += (o[d] * a.stride - a.pad_begin + k[d] * a.dilation) * in_stride[d];
      }
      taps.push_back(off);
      size_t d = n;
      while (d > 0) {
        --d;
        if (++k[d] < k_hi[d]) break;
        k[d] = k_lo[d];
        if (d == 0) empty = true;
      }
    }
    visit(oi, taps, padded);
    for (size_t d = n; d > 0; --d) {
      if (++o[d - 1] < out_shape[d - 1]) break;
      o[d - 1] = 0;
    }
  }
}

// p for LpPool / GlobalLpPool: a float attribute in opset 1, an int from opset 2.
Result<double> lp_norm_p(const ir::Node& node) {
  const ir::Attribute* a = node.attr("p");
  double p = 2.0;
  if (a) p = a->type == ir::Attribute::Type::kFloat ? static_cast<double>(a->f) : static_cast<double>(a->i);
  if (!(p > 0) || !std::isfinite(p)) return InvalidModel(node.where(), "attribute p must be positive, got ", p);
  return p;
}

WindowOptions pool_options(const ir::Node& node) { return window_options(node.op_type, node.opset); }

Status infer_pool(InferContext& ctx) {
  const SymShape& xs = ctx.input_shape(0);
  DataType dt = ctx.input_dtype(0);
  if (!xs.rank_known) {
    for (size_t i = 0; i < ctx.outputs.size(); ++i) ctx.set_output(i, i == 0 ? dt : DataType::kInt64, SymShape());
    return Status::Ok();
  }
  if (xs.rank() < 3) return ctx.error(str_cat("input X must have rank >= 3 (N, C, spatial...), got ", xs.str()));
  KILN_ASSIGN_OR_RETURN(Window win, read_window(ctx.node, xs.rank() - 2, nullptr, pool_options(ctx.node)));
  std::vector<Dim> out = {xs.dims[0], xs.dims[1]};
  for (size_t d = 0; d + 2 < xs.rank(); ++d) {
    auto o = window_output_sym(win, d, xs.dims[d + 2]);
    if (!o.ok()) return ctx.error(o.status().message());
    out.push_back(*o);
  }
  ctx.set_output(0, dt, SymShape(out));
  if (ctx.outputs.size() > 1) ctx.set_output(1, DataType::kInt64, SymShape(out));
  return Status::Ok();
}

Status pool_kernel(KernelContext& ctx, PoolKind kind) {
  const Tensor& x0 = ctx.input(0);
  KILN_RETURN_IF_ERROR(check_nchw(x0, ctx.node.op_type.c_str(), "X"));
  const bool is_float = dtype_is_float(x0.dtype());
  if (kind != PoolKind::kMax && !is_float)
    return ctx.unsupported(str_cat(ctx.node.op_type, " on ", x0.describe(), " (float types only)"));
  if (kind == PoolKind::kMax && !is_float && !(dtype_is_builtin(x0.dtype()) && x0.dtype() != DataType::kBool))
    return ctx.unsupported(str_cat("MaxPool on ", x0.describe()));
  KILN_ASSIGN_OR_RETURN(WindowGeometry win, resolve_window(ctx.node, x0.shape(), nullptr, pool_options(ctx.node)));
  auto plan_r = make_pool_plan(win, x0.shape());
  if (!plan_r.ok()) return ctx.error(plan_r.status().message());
  const PoolPlan& plan = *plan_r;
  const int64_t storage_order = ctx.node.attr_int("storage_order", 0);
  if (storage_order != 0 && storage_order != 1)
    return ctx.error(str_cat("storage_order must be 0 or 1, got ", storage_order));
  const bool count_include_pad = ctx.node.attr_int("count_include_pad", 0) != 0;
  double p_norm = 2.0;
  if (kind == PoolKind::kLp) {
    KILN_ASSIGN_OR_RETURN(p_norm, lp_norm_p(ctx.node));
  }

  Tensor x = upcast_float(x0);
  Tensor y(x.dtype(), plan.out_shape);
  Tensor indices;
  const bool want_indices = kind == PoolKind::kMax && ctx.num_outputs() > 1 && ctx.wants_output(1);
  if (want_indices) indices = Tensor(DataType::kInt64, plan.out_shape);
  const int64_t planes = plan.batch * plan.channels;
  const int64_t in_plane = dims_numel(Dims(x0.shape().begin() + 2, x0.shape().end()));
  const int64_t out_plane = planes > 0 ? y.numel() / planes : 0;
  // Column-major (storage_order 1) index of a row-major in-plane offset.
  Dims in_sp(x0.shape().begin() + 2, x0.shape().end());
  Dims row_stride = strides_of(in_sp), col_stride(in_sp.size(), 1);
  for (size_t d = 1; d < in_sp.size(); ++d) col_stride[d] = col_stride[d - 1] * in_sp[d - 1];
  auto to_storage_index = [&](int64_t off) {
    if (storage_order == 0) return off;
    int64_t r = 0;
    for (size_t d = 0; d < in_sp.size(); ++d) {
      r += (off / row_stride[d]) * col_stride[d];
      off %= row_stride[d];
    }
    return r;
  };

  return dispatch_builtin(x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      return ctx.unsupported("bool pooling");
    } else {
      const T* px = x.data<T>();
      T* py = y.data<T>();
      int64_t* pi = want_indices ? indices.data<int64_t>() : nullptr;
      for (int64_t pl = 0; pl < planes; ++pl) {
        const T* xp = px + pl * in_plane;
        T* yp = py + pl * out_plane;
        for_each_window(plan, [&](int64_t oi, const std::vector<int64_t>& taps, double padded) {
          if (kind == PoolKind::kMax) {
            T best = std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                          : std::numeric_limits<T>::lowest();
            int64_t arg = taps.empty() ? 0 : taps[0];
            for (int64_t t : taps) {  // NaN never compares greater: ignored, like padding
              if (xp[t] > best) {
                best = xp[t];
                arg = t;
              }
            }
            yp[oi] = best;
            if (pi) pi[pl * out_plane + oi] = pl * in_plane + to_storage_index(arg);
          } else if (kind == PoolKind::kAverage) {
            double sum = 0;
            for (int64_t t : taps) sum += static_cast<double>(xp[t]);
            double count = count_include_pad ? padded : static_cast<double>(taps.size());
            yp[oi] = count > 0 ? static_cast<T>(sum / count) : T(0);
          } else {
            double sum = 0;
            for (int64_t t : taps) sum += std::pow(std::fabs(static_cast<double>(xp[t])), p_norm);
            yp[oi] = static_cast<T>(std::pow(sum, 1.0 / p_norm));
          }
        });
      }
      ctx.set_output(0, downcast_float(y, x0.dtype()));
      if (want_indices) ctx.set_output(1, indices);
      return Status::Ok();
    }
  });
}

Status average_pool_kernel(KernelContext& ctx) { return pool_kernel(ctx, PoolKind::kAverage); }
Status max_pool_kernel(KernelContext& ctx) { return pool_kernel(ctx, PoolKind::kMax); }
Status lp_pool_kernel(KernelContext& ctx) { return pool_kernel(ctx, PoolKind::kLp); }

// ---- Global pools: one value per (n, c) over all spatial positions.

Status infer_global_pool(InferContext& ctx) {
  const SymShape& xs = ctx.input_shape(0);
  if (!xs.rank_known) {
    ctx.set_output(0, ctx.input_dtype(0), SymShape());
    return Status::Ok();
  }
  if (xs.rank() < 2) return ctx.error(str_cat("input X must have rank >= 2 (N, C, spatial...), got ", xs.str()));
  std::vector<Dim> out = {xs.dims[0], xs.dims[1]};
  out.resize(xs.rank(), Dim(1));
  ctx.set_output(0, ctx.input_dtype(0), SymShape(out));
  return Status::Ok();
}

Status global_pool_kernel(KernelContext& ctx, PoolKind kind) {
  const Tensor& x0 = ctx.input(0);
  if (x0.rank() < 2) return ctx.error(str_cat("input X must have rank >= 2 (N, C, spatial...), got ", x0.describe()));
  if (!dtype_is_float(x0.dtype()))
    return ctx.unsupported(str_cat(ctx.node.op_type, " on ", x0.describe(), " (float types only)"));
  double p_norm = 2.0;
  if (kind == PoolKind::kLp) {
    KILN_ASSIGN_OR_RETURN(p_norm, lp_norm_p(ctx.node));
  }
  Tensor x = upcast_float(x0);
  Dims out_shape = {x.dim(0), x.dim(1)};
  out_shape.resize(static_cast<size_t>(x.rank()), 1);
  Tensor y(x.dtype(), out_shape);
  const int64_t planes = x.dim(0) * x.dim(1);
  const int64_t plane = planes > 0 ? x.numel() / planes : 0;
  for (int64_t pl = 0; pl < planes; ++pl) {
    double acc = kind == PoolKind::kMax ? -std::numeric_limits<double>::infinity() : 0.0;
    for (int64_t i = 0; i < plane; ++i) {
      double v = x.get_f64(pl * plane + i);
      if (kind == PoolKind::kMax)
        acc = std::isnan(v) || v > acc ? v : acc;
      else if (kind == PoolKind::kAverage)
        acc += v;
      else
        acc += std::pow(std::fabs(v), p_norm);
    }
    if (kind == PoolKind::kAverage) acc = plane > 0 ? acc / static_cast<double>(plane) : std::nan("");
    if (kind == PoolKind::kLp) acc = std::pow(acc, 1.0 / p_norm);
    y.set_f64(pl, acc);
  }
  ctx.set_output(0, downcast_float(y, x0.dtype()));
  return Status::Ok();
}

Status global_average_pool_kernel(KernelContext& ctx) { return global_pool_kernel(ctx, PoolKind::kAverage); }
Status global_max_pool_kernel(KernelContext& ctx) { return global_pool_kernel(ctx, PoolKind::kMax); }
Status global_lp_pool_kernel(KernelContext& ctx) { return global_pool_kernel(ctx, PoolKind::kLp); }

// ---- MaxUnpool: scatters X into zeros at the flat positions given by I (MaxPool's Indices).
// The indices address the unpooled shape inferred from the window (in - 1) * stride - pads + kernel;
// when output_shape is given and differs, that result is placed at the start of each dim of a
// zero tensor of output_shape (as ONNX's reference does).

// (in - 1) * stride - pads + kernel, computed wide (stride * in can exceed 64 bits).
Result<int64_t> unpooled_extent(const Window& win, size_t d, int64_t in) {
  if (in < 1 || in > kMaxExtent) return InvalidArgument("spatial dim ", d, " has invalid extent ", in);
  __int128 v = static_cast<__int128>(in - 1) * win.strides[d] - (win.pad_begin[d] + win.pad_end[d]) + win.kernel[d];
  if (v < 0 || v > kMaxExtent)
    return InvalidArgument("unpooled extent of spatial dim ", d, " is out of range (", static_cast<double>(v), ")");
  return static_cast<int64_t>(v);
}

Result<Dims> unpool_inferred_shape(const ir::Node& node, const Dims& x_shape) {
  if (x_shape.size() < 3)
    return InvalidArgument("input X must have rank >= 3 (N, C, spatial...), got shape ", dims_str(x_shape));
  KILN_ASSIGN_OR_RETURN(Window win, read_window(node, x_shape.size() - 2, nullptr, window_options("MaxUnpool", 1)));
  Dims shape = {x_shape[0], x_shape[1]};
  for (size_t d = 0; d < win.rank; ++d) {
    KILN_ASSIGN_OR_RETURN(int64_t v, unpooled_extent(win, d, x_shape[d + 2]));
    shape.push_back(v);
  }
  return shape;
}

Status infer_max_unpool(InferContext& ctx) {
  const SymShape& xs = ctx.input_shape(0);
  DataType dt = ctx.input_dtype(0);
  std::vector<int64_t> os;
  if (ctx.has_input(2) && constant_ints(ctx, 2, &os)) {
    ctx.set_output(0, dt, SymShape::from_dims(os));
    return Status::Ok();
  }
  if (ctx.has_input(2)) {
    const SymShape& ss = ctx.input_shape(2);
    if (ss.rank_known && ss.rank() == 1 && ss.dims[0].known()) {
      std::vector<Dim> dims;
      for (int64_t i = 0; i < ss.dims[0].value; ++i) dims.push_back(ctx.new_symbol());
      ctx.set_output(0, dt, SymShape(dims));
    } else {
      ctx.set_output(0, dt, SymShape());
    }
    return Status::Ok();
  }
  if (!xs.rank_known) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  if (xs.rank() < 3) return ctx.error(str_cat("input X must have rank >= 3 (N, C, spatial...), got ", xs.str()));
  KILN_ASSIGN_OR_RETURN(Window win, read_window(ctx.node, xs.rank() - 2, nullptr, window_options("MaxUnpool", 1)));
  std::vector<Dim> out = {xs.dims[0], xs.dims[1]};
  for (size_t d = 0; d < win.rank; ++d) {
    const Dim& in = xs.dims[d + 2];
    if (!in.known() || in.value > kMaxExtent) {
      out.push_back(Dim());
      continue;
    }
    auto v = unpooled_extent(win, d, in.value);
    if (!v.ok()) return ctx.error(v.status().message());
    out.push_back(Dim(*v));
  }
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

Status max_unpool_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& idx = ctx.input(1);
  auto inferred_r = unpool_inferred_shape(ctx.node, x.shape());
  if (!inferred_r.ok()) return ctx.error(inferred_r.status().message());
  Dims inferred = *inferred_r;
  if (idx.shape() != x.shape() || !dtype_is_integer(idx.dtype()))
    return ctx.error(str_cat("indices I ", idx.describe(), " must be integers with the shape of X ", x.describe()));
  Dims out_shape = inferred;
  if (ctx.has_input(2)) {
    out_shape = to_i64_vector(ctx.input(2));
    if (out_shape.size() != inferred.size())
      return ctx.error(str_cat("output_shape ", dims_str(out_shape), " must have rank ", inferred.size()));
  }
  auto inferred_numel = checked_numel(inferred);
  auto out_numel = checked_numel(out_shape);
  if (!inferred_numel.ok()) return ctx.error(inferred_numel.status().message());
  if (!out_numel.ok()) return ctx.error(out_numel.status().message());
  Tensor scattered(x.dtype(), inferred);
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t at = idx.get_i64(i);
    if (at < 0 || at >= *inferred_numel)
      return ctx.error(str_cat("index ", at, " at position ", i, " is outside the unpooled tensor ", dims_str(inferred),
                               " (", *inferred_numel, " elements)"));
    copy_elements(x, i, scattered, at, 1);
  }
  if (out_shape == inferred) {
    ctx.set_output(0, scattered);
    return Status::Ok();
  }
  // Place the scattered block at the origin of the requested shape (cropping where smaller).
  Tensor y(x.dtype(), out_shape);
  const size_t r = out_shape.size();
  Dims common(r);
  for (size_t d = 0; d < r; ++d) common[d] = std::min(inferred[d], out_shape[d]);
  const int64_t rows = r > 1 ? dims_numel(Dims(common.begin(), common.end() - 1)) : 1;
  Dims src_stride = strides_of(inferred), dst_stride = strides_of(out_shape),
       row_shape(common.begin(), common.end() - 1);
  Dims row_index_stride = strides_of(row_shape);
  if (dims_numel(common) > 0) {
    for (int64_t row = 0; row < rows; ++row) {
      int64_t src = 0, dst = 0, rem = row;
      for (size_t d = 0; d + 1 < r; ++d) {
        int64_t c = rem / row_index_stride[d];
        rem %= row_index_stride[d];
        src += c * src_stride[d];
        dst += c * dst_stride[d];
      }
      copy_elements(scattered, src, y, dst, common[r - 1]);
    }
  }
  ctx.set_output(0, y);
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", AveragePool, 1, infer_pool, average_pool_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", MaxPool, 1, infer_pool, max_pool_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", LpPool, 1, infer_pool, lp_pool_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", GlobalAveragePool, 1, infer_global_pool, global_average_pool_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", GlobalMaxPool, 1, infer_global_pool, global_max_pool_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", GlobalLpPool, 1, infer_global_pool, global_lp_pool_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", MaxUnpool, 9, infer_max_unpool, max_unpool_kernel, 2, 3);

}  // namespace kiln::ops
