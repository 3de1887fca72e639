// Indexing ops that read: Gather, GatherElements, GatherND, Compress, NonZero, OneHot.
#include <cmath>

#include "ops/tensor_util.h"

namespace kiln::ops {
namespace {

// Reads an index tensor (any integer dtype) and maps negative entries by +dim; errors name the
// first entry outside [-dim, dim).
Result<std::vector<int64_t>> read_indices(const Tensor& t, int64_t dim, const char* what) {
  if (!dtype_is_integer(t.dtype())) return InvalidArgument(what, " must be an integer tensor, got ", t.describe());
  std::vector<int64_t> v = to_i64_vector(t);
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t x = v[i];
    if (x < -dim || x >= dim)
      return OutOfRange(what, "[", i, "] = ", x, " is out of range for a dim of size ", dim, " (valid: [", -dim, ", ",
                        dim - 1, "])");
    if (x < 0) v[i] = x + dim;
  }
  return v;
}

// ---------------------------------------------------------------- Gather

Status gather_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape &data = ctx.input_shape(0), &ind = ctx.input_shape(1);
  if (!data.rank_known || !ind.rank_known) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  auto axis_r = normalize_axis(ctx.node.attr_int("axis", 0), static_cast<int64_t>(data.rank()));
  if (!axis_r.ok() || data.rank() == 0)
    return ctx.error(data.rank() == 0 ? "cannot gather from a scalar" : axis_r.status().message());
  size_t axis = static_cast<size_t>(*axis_r);
  std::vector<Dim> out(data.dims.begin(), data.dims.begin() + static_cast<std::ptrdiff_t>(axis));
  out.insert(out.end(), ind.dims.begin(), ind.dims.end());
  out.insert(out.end(), data.dims.begin() + static_cast<std::ptrdiff_t>(axis) + 1, data.dims.end());
  ctx.set_output(0, dt, SymShape(out));
  // Build validates what run validates: constant indices against a known extent, by the kernel's rule.
  if (const Tensor* c = ctx.constant(1); c && data.dims[axis].known()) {
    auto checked = read_indices(*c, data.dims[axis].value, "indices");
    if (!checked.ok()) return ctx.error(checked.status().message());
  }
  // Picking elements of a symbolic 1-D value (a dim out of a Shape).
  const SymValue* v = ctx.sym_value(0);
  std::vector<int64_t> idx;
  if (v && data.rank() == 1 && ind.rank() <= 1 && known_ints(ctx, 1, &idx)) {
    int64_t n = static_cast<int64_t>(v->size());
    SymValue o;
    for (int64_t i : idx) {
      if (i < -n || i >= n) return ctx.error(str_cat("index ", i, " is out of range for a dim of size ", n));
      o.push_back((*v)[static_cast<size_t>(i < 0 ? i + n : i)]);
    }
    ctx.set_output_value(0, std::move(o));
  }
  return Status::Ok();
}

Status gather_kernel(KernelContext& ctx) {
  const Tensor &data = ctx.input(0), &ind_t = ctx.input(1);
  if (data.rank() == 0) return ctx.error("cannot gather from a scalar");
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node.attr_int("axis", 0), data.rank()));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> ind, read_indices(ind_t, data.dim(axis), "indices"));
  Dims out_shape(data.shape().begin(), data.shape().begin() + axis);
  out_shape.insert(out_shape.end(), ind_t.shape().begin(), ind_t.shape().end());
  out_shape.insert(out_shape.end(), data.shape().begin() + axis + 1, data.shape().end());
  KILN_RETURN_IF_ERROR(check_dims(out_shape, "output shape"));
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < data.rank(); ++k)
    if (k != axis) (k < axis ? outer : inner) *= data.dim(k);
  Tensor out(data.dtype(), out_shape);
  int64_t n = static_cast<int64_t>(ind.size()), dim = data.dim(axis);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n; ++j)
      copy_elements(data, (o * dim + ind[static_cast<size_t>(j)]) * inner, out, (o * n + j) * inner, inner);
  ctx.set_output(0, out);
  return Status::Ok();
}

// ---------------------------------------------------------------- GatherElements

Status gather_elements_infer(InferContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(1));
  return Status::Ok();
}

// Checks the index tensor of GatherElements / ScatterElements against data; returns the axis.
Result<int64_t> check_elementwise_indices(const ir::Node& node, const Tensor& data, const Tensor& ind) {
  if (data.rank() == 0) return InvalidArgument("data must have rank >= 1");
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(node.attr_int("axis", 0), data.rank()));
  if (ind.rank() != data.rank())
    return InvalidArgument("indices ", ind.describe(), " must have the rank of data ", data.describe());
  for (int64_t k = 0; k < data.rank(); ++k)
    if (k != axis && ind.dim(k) > data.dim(k))
      return InvalidArgument("indices ", ind.describe(), " is larger than data ", data.describe(), " in dim ", k);
  return axis;
}

Status gather_elements_kernel(KernelContext& ctx) {
  const Tensor &data = ctx.input(0), &ind_t = ctx.input(1);
  KILN_ASSIGN_OR_RETURN(int64_t axis, check_elementwise_indices(ctx.node, data, ind_t));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> ind, read_indices(ind_t, data.dim(axis), "indices"));
  Dims strides = strides_of(data.shape());
  std::vector<int64_t> src;
  src.reserve(ind.size());
  size_t j = 0;
  for_each_index(ind_t.shape(), [&](const Dims& o) {
    int64_t s = 0;
    for (size_t k = 0; k < o.size(); ++k) s += (static_cast<int64_t>(k) == axis ? ind[j] : o[k]) * strides[k];
    src.push_back(s);
    ++j;
  });
  ctx.set_output(0, take_elements(data, ind_t.shape(), src));
  return Status::Ok();
}

// ---------------------------------------------------------------- GatherND

Status gather_nd_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape &data = ctx.input_shape(0), &ind = ctx.input_shape(1);
  int64_t b = ctx.node.attr_int("batch_dims", 0);
  if (!data.rank_known || !ind.rank_known || ind.rank() == 0 || !ind.dims.back().known()) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  int64_t r = static_cast<int64_t>(data.rank()), k = ind.dims.back().value;
  if (b < 0 || k < 1 || b + k > r || b >= static_cast<int64_t>(ind.rank()))
    return ctx.error(str_cat("indices ", ind.str(), " (batch_dims ", b, ") do not fit data ", data.str()));
  std::vector<Dim> out(ind.dims.begin(), ind.dims.end() - 1);
  out.insert(out.end(), data.dims.begin() + b + k, data.dims.end());
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

Status gather_nd_kernel(KernelContext& ctx) {
  const Tensor &data = ctx.input(0), &ind_t = ctx.input(1);
  int64_t b = ctx.node.attr_int("batch_dims", 0), r = data.rank(), q = ind_t.rank();
  if (!dtype_is_integer(ind_t.dtype())) return ctx.error(str_cat("indices must be integers, got ", ind_t.describe()));
  if (q < 1) return ctx.error("indices must have rank >= 1");
  int64_t k = ind_t.dim(q - 1);
  if (b < 0 || b >= q || k < 1 || b + k > r)
    return ctx.error(str_cat("indices ", ind_t.describe(), " (batch_dims ", b, ") do not fit data ", data.describe()));
  for (int64_t i = 0; i < b; ++i)
    if (ind_t.dim(i) != data.dim(i))
      return ctx.error(str_cat("batch dim ", i, " differs: data ", data.describe(), ", indices ", ind_t.describe()));
  Dims out_shape(ind_t.shape().begin(), ind_t.shape().end() - 1);
  out_shape.insert(out_shape.end(), data.shape().begin() + b + k, data.shape().end());
  Tensor out(data.dtype(), out_shape);
  Dims strides = strides_of(data.shape());
  int64_t batches = 1, per_batch = 1, inner = 1;
  for (int64_t i = 0; i < b; ++i) batches *= data.dim(i);
  for (int64_t i = b; i < q - 1; ++i) per_batch *= ind_t.dim(i);
  for (int64_t i = b + k; i < r; ++i) inner *= data.dim(i);
  int64_t batch_stride = b > 0 ? strides[static_cast<size_t>(b - 1)] : 0;
  std::vector<int64_t> ind = to_i64_vector(ind_t);
  for (int64_t bi = 0; bi < batches; ++bi) {
    for (int64_t m = 0; m < per_batch; ++m) {
      int64_t tuple = (bi * per_batch + m) * k, off = bi * batch_stride;
      for (int64_t j = 0; j < k; ++j) {
        int64_t d = data.dim(b + j), x = ind[static_cast<size_t>(tuple + j)];
        if (x < -d || x >= d)
          return ctx.error(str_cat("index ", x, " is out of range for dim ", b + j, " of data ", data.describe()));
        off += (x < 0 ? x + d : x) * strides[static_cast<size_t>(b + j)];
      }
      copy_elements(data, off, out, (bi * per_batch + m) * inner, inner);
    }
  }
  ctx.set_output(0, out);
  return Status::Ok();
}

// ---------------------------------------------------------------- Compress

Status compress_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  const ir::Attribute* axis_a = ctx.node.attr("axis");
  if (!axis_a) {
    ctx.set_output(0, dt, SymShape({ctx.new_symbol()}));
    return Status::Ok();
  }
  if (!in.rank_known) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  auto axis = normalize_axis(axis_a->i, static_cast<int64_t>(in.rank()));
  if (!axis.ok()) return ctx.error(axis.status().message());
  SymShape out = in;
  out.dims[static_cast<size_t>(*axis)] = ctx.new_symbol();
  ctx.set_output(0, dt, out);
  return Status::Ok();
}

Status compress_kernel(KernelContext& ctx) {
  Tensor x = ctx.input(0);
  const Tensor& cond = ctx.input(1);
  if (cond.rank() != 1) return ctx.error(str_cat("condition must be 1-D, got ", cond.describe()));
  const ir::Attribute* axis_a = ctx.node.attr("axis");
  int64_t axis = 0;
  if (axis_a) {
    KILN_ASSIGN_OR_RETURN(axis, normalize_axis(axis_a->i, x.rank()));
  } else {
    x = x.reshaped({x.numel()});
  }
  int64_t dim = x.dim(axis);
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < cond.numel(); ++i) {
    if (cond.get_f64(i) == 0) continue;
    if (i >= dim)
      return ctx.error(str_cat("condition ", cond.describe(), " selects index ", i, " beyond the axis size ", dim));
    keep.push_back(i);
  }
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < x.rank(); ++k)
    if (k != axis) (k < axis ? outer : inner) *= x.dim(k);
  Dims out_shape = x.shape();
  out_shape[static_cast<size_t>(axis)] = static_cast<int64_t>(keep.size());
  Tensor out(x.dtype(), out_shape);
  int64_t n = static_cast<int64_t>(keep.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n; ++j)
      copy_elements(x, (o * dim + keep[static_cast<size_t>(j)]) * inner, out, (o * n + j) * inner, inner);
  ctx.set_output(0, out);
  return Status::Ok();
}

// ---------------------------------------------------------------- NonZero

Status nonzero_infer(InferContext& ctx) {
  const SymShape& in = ctx.input_shape(0);
  ctx.set_output(0, DataType::kInt64,
                 SymShape({in.rank_known ? Dim(static_cast<int64_t>(in.rank())) : ctx.new_symbol(), ctx.new_symbol()}));
  return Status::Ok();
}

Status nonzero_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.dtype() == DataType::kString || x.dtype() == DataType::kComplex64 || x.dtype() == DataType::kComplex128)
    return ctx.unsupported(str_cat("dtype ", dtype_name(x.dtype()), " is not supported"));
  if (x.rank() == 0) {
    int64_t nnz = x.get_f64(0) != 0 ? 1 : 0;
    ctx.set_output(0, Tensor(DataType::kInt64, {0, nnz}));
    return Status::Ok();
  }
  // Flat positions first, coordinates from them: no vector per element (a detector's score
  // filtering runs NonZero over every anchor of every class).
  std::vector<int64_t> hits;
  const int64_t total = x.numel();
  if (x.dtype() == DataType::kBool) {
    const bool* p = x.data<bool>();
    for (int64_t i = 0; i < total; ++i)
      if (p[i]) hits.push_back(i);
  } else {
    const bool is_float = dtype_is_float(x.dtype());
    for (int64_t i = 0; i < total; ++i)
      if (is_float ? x.get_f64(i) != 0 : x.get_i64(i) != 0) hits.push_back(i);
  }
  const Dims strides = strides_of(x.shape());
  int64_t r = x.rank(), n = static_cast<int64_t>(hits.size());
  Tensor out(DataType::kInt64, {r, n});
  int64_t* po = out.data<int64_t>();
  for (int64_t k = 0; k < r; ++k)
    for (int64_t j = 0; j < n; ++j)
      po[k * n + j] = hits[static_cast<size_t>(j)] / strides[static_cast<size_t>(k)] % x.dim(k);
  ctx.set_output(0, out);
  return Status::Ok();
}

// ---------------------------------------------------------------- OneHot

// depth as an integer (any numeric dtype; floats truncate).
Result<int64_t> onehot_depth(const Tensor& t) {
  if (t.numel() != 1) return InvalidArgument("depth must hold exactly one element, got ", t.describe());
  double d = dtype_is_float(t.dtype()) ? std::trunc(t.get_f64(0)) : static_cast<double>(t.get_i64(0));
  if (!(d >= 1) || d > static_cast<double>(kMaxTensorElements))
    return InvalidArgument("depth must be a positive number, got ", t.get_f64(0));
  return static_cast<int64_t>(d);
}

Status onehot_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(2);
  const SymShape& in = ctx.input_shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  int64_t r = static_cast<int64_t>(in.rank()) + 1, axis = ctx.node.attr_int("axis", -1);
  if (axis < -r || axis >= r) return ctx.error(str_cat("axis ", axis, " is out of range for output rank ", r));
  if (axis < 0) axis += r;
  Dim depth = ctx.new_symbol();
  if (const Tensor* d = ctx.constant(1)) {
    auto v = onehot_depth(*d);
    if (!v.ok()) return ctx.error(v.status().message());  // as the kernel: a build refuses what a run would
    depth = Dim(*v);
  }
  std::vector<Dim> out = in.dims;
  out.insert(out.begin() + axis, depth);
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

Status onehot_kernel(KernelContext& ctx) {
  const Tensor &ind = ctx.input(0), &values = ctx.input(2);
  KILN_ASSIGN_OR_RETURN(int64_t depth, onehot_depth(ctx.input(1)));
  if (values.numel() != 2) return ctx.error(str_cat("values must hold [off, on], got ", values.describe()));
  if (ind.dtype() == DataType::kString) return ctx.error("indices must be numeric");
  int64_t r = ind.rank() + 1, axis = ctx.node.attr_int("axis", -1);
  if (axis < -r || axis >= r) return ctx.error(str_cat("axis ", axis, " is out of range for output rank ", r));
  if (axis < 0) axis += r;
  Dims out_shape = ind.shape();
  out_shape.insert(out_shape.begin() + axis, depth);
  KILN_RETURN_IF_ERROR(check_dims(out_shape, "output shape"));
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < ind.rank(); ++k) (k < axis ? outer : inner) *= ind.dim(k);
  // src index into values: 0 = off, 1 = on.
  std::vector<int64_t> src(static_cast<size_t>(dims_numel(out_shape)), 0);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      double v = dtype_is_float(ind.dtype()) ? std::trunc(ind.get_f64(o * inner + i))
                                             : static_cast<double>(ind.get_i64(o * inner + i));
      if (v < 0) v += static_cast<double>(depth);
      if (!(v >= 0 && v < static_cast<double>(depth))) continue;  // out of range (or NaN): all off
      src[static_cast<size_t>((o * depth + static_cast<int64_t>(v)) * inner + i)] = 1;
    }
  }
  ctx.set_output(0, take_elements(values.reshaped({2}), out_shape, src));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Gather, 1, gather_infer, gather_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", GatherElements, 11, gather_elements_infer, gather_elements_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", GatherND, 11, gather_nd_infer, gather_nd_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Compress, 9, compress_infer, compress_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", NonZero, 9, nonzero_infer, nonzero_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", OneHot, 9, onehot_infer, onehot_kernel, 3, 3);

}  // namespace kiln::ops
