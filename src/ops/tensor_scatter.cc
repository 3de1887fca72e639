// Indexing ops that write: ScatterElements (and the deprecated Scatter), ScatterND with their
// reductions (none / add / mul / max / min), and TensorScatter (KV-cache update, opset 24).
#include <algorithm>

#include "ops/scatter_reduction.h"
#include "ops/tensor_util.h"

namespace kiln::ops {
namespace {

using Reduction = ScatterReduction;

Result<Reduction> parse_reduction(const ir::Node& node) {
  std::string r = node.attr_string("reduction", "none");
  if (auto red = scatter_reduction(r)) return *red;
  return InvalidArgument("unknown reduction '", r, "' (none, add, mul, max, min)");
}

template <typename T>
T combine(T a, T b, Reduction r) {
  return scatter_combine(a, b, r);
}

// Writes updates into a copy of data: element upd_off[i] + j of updates (j < block) goes to
// out_off[i] + j of the output, combined by the reduction. Low-precision floats compute in float32.
Result<Tensor> scatter_blocks(const Tensor& data, const Tensor& updates, const std::vector<int64_t>& out_off,
                              const std::vector<int64_t>& upd_off, int64_t block, Reduction red) {
  if (red == Reduction::kNone) {
    Tensor out = data.clone();
    for (size_t i = 0; i < out_off.size(); ++i) copy_elements(updates, upd_off[i], out, out_off[i], block);
    return out;
  }
  Tensor out = upcast_float(data).clone(), upd = upcast_float(updates);
  if (!dtype_is_builtin(out.dtype()))
    return Unsupported("reductions on dtype ", dtype_name(data.dtype()), " are not supported");
  dispatch_builtin(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* po = out.data<T>();
    const T* pu = upd.data<T>();
    for (size_t i = 0; i < out_off.size(); ++i)
      for (int64_t j = 0; j < block; ++j) po[out_off[i] + j] = combine(po[out_off[i] + j], pu[upd_off[i] + j], red);
  });
  return downcast_float(out, data.dtype());
}

// ---------------------------------------------------------------- ScatterElements, Scatter

Status scatter_infer(InferContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(0));
  return Status::Ok();
}

// The kernels' index rules and messages, shared with shape inference: build refuses constant
// indices that the run would (at a known extent).
std::string elements_index_error(size_t j, int64_t x, int64_t axis, int64_t dim) {
  return str_cat("indices[", j, "] = ", x, " is out of range for axis ", axis, " of size ", dim);
}
std::string nd_index_error(int64_t x, int64_t j, const std::string& data) {
  return str_cat("index ", x, " is out of range for dim ", j, " of data ", data);
}

Status scatter_elements_infer(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(scatter_infer(ctx));
  const SymShape& data = ctx.input_shape(0);
  const Tensor* c = ctx.constant(1);
  if (!c || !dtype_is_integer(c->dtype()) || !data.rank_known || data.rank() == 0) return Status::Ok();
  auto axis = normalize_axis(ctx.node.attr_int("axis", 0), static_cast<int64_t>(data.rank()));
  if (!axis.ok() || !data.dims[static_cast<size_t>(axis.value())].known()) return Status::Ok();  // the kernel says
  const int64_t dim = data.dims[static_cast<size_t>(axis.value())].value;
  std::vector<int64_t> ind = to_i64_vector(*c);
  for (size_t j = 0; j < ind.size(); ++j)
    if (ind[j] < -dim || ind[j] >= dim) return ctx.error(elements_index_error(j, ind[j], axis.value(), dim));
  return Status::Ok();
}

Status scatter_nd_infer(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(scatter_infer(ctx));
  const SymShape& data = ctx.input_shape(0);
  const Tensor* c = ctx.constant(1);
  if (!c || !dtype_is_integer(c->dtype()) || !data.rank_known || c->rank() < 1) return Status::Ok();
  const int64_t k = c->dim(c->rank() - 1);
  if (k < 1 || k > static_cast<int64_t>(data.rank())) return Status::Ok();  // the kernel says
  const std::string desc = std::string(dtype_name(ctx.input_dtype(0))) + data.str();
  std::vector<int64_t> ind = to_i64_vector(*c);
  for (size_t t = 0; t < ind.size(); ++t) {
    const int64_t j = static_cast<int64_t>(t) % k;
    const Dim& d = data.dims[static_cast<size_t>(j)];
    if (d.known() && (ind[t] < -d.value || ind[t] >= d.value)) return ctx.error(nd_index_error(ind[t], j, desc));
  }
  return Status::Ok();
}

Status scatter_elements_kernel(KernelContext& ctx) {
  const Tensor &data = ctx.input(0), &ind_t = ctx.input(1), &upd = ctx.input(2);
  KILN_ASSIGN_OR_RETURN(Reduction red, parse_reduction(ctx.node));
  if (upd.dtype() != data.dtype())
    return ctx.error(str_cat("updates ", upd.describe(), " must have the dtype of data ", data.describe()));
  if (ind_t.shape() != upd.shape())
    return ctx.error(str_cat("indices ", ind_t.describe(), " and updates ", upd.describe(), " must have one shape"));
  if (!dtype_is_integer(ind_t.dtype())) return ctx.error(str_cat("indices must be integers, got ", ind_t.describe()));
  if (data.rank() == 0) return ctx.error("data must have rank >= 1");
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node.attr_int("axis", 0), data.rank()));
  if (ind_t.rank() != data.rank())
    return ctx.error(str_cat("indices ", ind_t.describe(), " must have the rank of data ", data.describe()));
  for (int64_t k = 0; k < data.rank(); ++k)
    if (k != axis && ind_t.dim(k) > data.dim(k))
      return ctx.error(str_cat("indices ", ind_t.describe(), " is larger than data ", data.describe(), " in dim ", k));
  std::vector<int64_t> ind_copy;
  if (ind_t.dtype() != DataType::kInt64) ind_copy = to_i64_vector(ind_t);
  const int64_t* ind = ind_copy.empty() ? ind_t.data<int64_t>() : ind_copy.data();
  const size_t count = static_cast<size_t>(ind_t.numel());
  const Dims strides = strides_of(data.shape());
  const int64_t dim = data.dim(axis), rank = data.rank(), axis_stride = strides[static_cast<size_t>(axis)];
  // Calls at(j, offset in data) for every update j in order: the index position walked as an
  // odometer (the last dim fastest), `base` its offset in data without the axis term.
  auto walk = [&](auto&& at) -> Status {
    Dims pos(static_cast<size_t>(rank), 0);
    int64_t base = 0;
    for (size_t j = 0; j < count; ++j) {
      const int64_t x = ind[j];
      if (x < -dim || x >= dim) return OutOfRange(elements_index_error(j, x, axis, dim));
      at(j, base + (x < 0 ? x + dim : x) * axis_stride);
      for (int64_t k = rank - 1; k >= 0; --k) {
        const size_t uk = static_cast<size_t>(k);
        if (++pos[uk] < ind_t.dim(k)) {
          if (k != axis) base += strides[uk];
          break;
        }
        if (k != axis) base -= (pos[uk] - 1) * strides[uk];
        pos[uk] = 0;
      }
    }
    return Status::Ok();
  };
  const size_t es = dtype_size(data.dtype());
  if (red == Reduction::kNone && data.dtype() != DataType::kString && (es == 1 || es == 2 || es == 4 || es == 8)) {
    // Straight into the copy, without a call per element: a detector's multi-level RoI pooling
    // scatters millions of them.
    Tensor out = data.clone();
    auto scatter = [&](auto* po, const auto* pu) { return walk([&](size_t j, int64_t off) { po[off] = pu[j]; }); };
    Status st;
    if (es == 1) st = scatter(static_cast<uint8_t*>(out.raw()), static_cast<const uint8_t*>(upd.raw()));
    if (es == 2) st = scatter(static_cast<uint16_t*>(out.raw()), static_cast<const uint16_t*>(upd.raw()));
    if (es == 4) st = scatter(static_cast<uint32_t*>(out.raw()), static_cast<const uint32_t*>(upd.raw()));
    if (es == 8) st = scatter(static_cast<uint64_t*>(out.raw()), static_cast<const uint64_t*>(upd.raw()));
    KILN_RETURN_IF_ERROR(st);
    ctx.set_output(0, out);
    return Status::Ok();
  }
  std::vector<int64_t> out_off(count), upd_off(count);
  KILN_RETURN_IF_ERROR(walk([&](size_t j, int64_t off) { out_off[j] = off, upd_off[j] = static_cast<int64_t>(j); }));
  KILN_ASSIGN_OR_RETURN(Tensor out, scatter_blocks(data, upd, out_off, upd_off, 1, red));
  ctx.set_output(0, out);
  return Status::Ok();
}

// ---------------------------------------------------------------- ScatterND

Status scatter_nd_kernel(KernelContext& ctx) {
  const Tensor &data = ctx.input(0), &ind_t = ctx.input(1), &upd = ctx.input(2);
  KILN_ASSIGN_OR_RETURN(Reduction red, parse_reduction(ctx.node));
  if (upd.dtype() != data.dtype())
    return ctx.error(str_cat("updates ", upd.describe(), " must have the dtype of data ", data.describe()));
  if (!dtype_is_integer(ind_t.dtype())) return ctx.error(str_cat("indices must be integers, got ", ind_t.describe()));
  int64_t q = ind_t.rank(), r = data.rank();
  if (q < 1) return ctx.error("indices must have rank >= 1");
  int64_t k = ind_t.dim(q - 1);
  if (k > r)
    return ctx.error(str_cat("indices ", ind_t.describe(), " index more dims than data ", data.describe(), " has"));
  Dims want(ind_t.shape().begin(), ind_t.shape().end() - 1);
  want.insert(want.end(), data.shape().begin() + k, data.shape().end());
  if (upd.shape() != want)
    return ctx.error(str_cat("updates ", upd.describe(), " must have shape ", dims_str(want), " (indices ",
                             ind_t.describe(), ", data ", data.describe(), ")"));
  Dims strides = strides_of(data.shape());
  int64_t inner = 1;
  for (int64_t i = k; i < r; ++i) inner *= data.dim(i);
  int64_t n = k > 0 ? ind_t.numel() / k : dims_numel(Dims(ind_t.shape().begin(), ind_t.shape().end() - 1));
  std::vector<int64_t> ind = to_i64_vector(ind_t), out_off, upd_off;
  for (int64_t t = 0; t < n; ++t) {
    int64_t off = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t d = data.dim(j), x = ind[static_cast<size_t>(t * k + j)];
      if (x < -d || x >= d) return ctx.error(nd_index_error(x, j, data.describe()));
      off += (x < 0 ? x + d : x) * strides[static_cast<size_t>(j)];
    }
    out_off.push_back(off);
    upd_off.push_back(t * inner);
  }
  KILN_ASSIGN_OR_RETURN(Tensor out, scatter_blocks(data, upd, out_off, upd_off, inner, red));
  ctx.set_output(0, out);
  return Status::Ok();
}

// ---------------------------------------------------------------- TensorScatter

Status tensor_scatter_kernel(KernelContext& ctx) {
  const Tensor &past = ctx.input(0), &upd = ctx.input(1);
  std::string mode = ctx.node.attr_string("mode", "linear");
  if (mode != "linear" && mode != "circular")
    return ctx.error(str_cat("mode must be linear or circular, got '", mode, "'"));
  if (past.rank() < 2) return ctx.error(str_cat("past_cache must have rank >= 2, got ", past.describe()));
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node.attr_int("axis", -2), past.rank()));
  if (axis == 0) return ctx.error("axis must not be the batch axis 0");
  if (upd.dtype() != past.dtype() || upd.rank() != past.rank())
    return ctx.error(
        str_cat("update ", upd.describe(), " must match past_cache ", past.describe(), " in dtype and rank"));
  for (int64_t k = 0; k < past.rank(); ++k)
    if (k != axis ? upd.dim(k) != past.dim(k) : upd.dim(k) > past.dim(k))
      return ctx.error(
          str_cat("update ", upd.describe(), " does not fit past_cache ", past.describe(), " (axis ", axis, ")"));
  int64_t batch = past.dim(0), max_len = past.dim(axis), seq = upd.dim(axis);
  std::vector<int64_t> wi(static_cast<size_t>(batch), 0);
  if (ctx.has_input(2)) {
    const Tensor& w = ctx.input(2);
    if (!dtype_is_integer(w.dtype()) || w.numel() != batch)
      return ctx.error(str_cat("write_indices must hold one integer per batch (", batch, "), got ", w.describe()));
    wi = to_i64_vector(w);
  }
  int64_t prefix = 1, inner = 1;
  for (int64_t k = 1; k < axis; ++k) prefix *= past.dim(k);
  for (int64_t k = axis + 1; k < past.rank(); ++k) inner *= past.dim(k);
  Tensor out = past.clone();
  for (int64_t b = 0; b < batch; ++b) {
    int64_t start = wi[static_cast<size_t>(b)];
    if (start < 0 || (mode == "linear" && start > max_len - seq))
      return ctx.error(
          str_cat("write_indices[", b, "] = ", start, " does not fit ", seq, " updates into a cache of ", max_len));
    for (int64_t p = 0; p < prefix; ++p) {
      int64_t row = b * prefix + p;
      for (int64_t s = 0; s < seq; ++s) {
        int64_t pos = mode == "circular" ? (start + s) % max_len : start + s;
        copy_elements(upd, (row * seq + s) * inner, out, (row * max_len + pos) * inner, inner);
      }
    }
  }
  ctx.set_output(0, out);
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", ScatterElements, 11, scatter_elements_infer, scatter_elements_kernel, 3, 3);
KILN_REGISTER_OP_ARITY("", Scatter, 9, scatter_elements_infer, scatter_elements_kernel, 3, 3);
KILN_REGISTER_OP_ARITY("", ScatterND, 11, scatter_nd_infer, scatter_nd_kernel, 3, 3);
KILN_REGISTER_OP_ARITY("", TensorScatter, 24, scatter_infer, tensor_scatter_kernel, 2, 3);

}  // namespace kiln::ops
