#include "ops/common.h"

#include <cstring>

namespace kiln::ops {

Result<int64_t> normalize_axis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank || (rank == 0 && axis != 0 && axis != -1))
    return InvalidArgument("axis ", axis, " is out of range for rank ", rank, " (valid: [", -rank, ", ", rank - 1,
                           "])");
  return axis < 0 ? axis + rank : axis;
}

Dims strides_of(const Dims& shape) {
  Dims s(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i)
    s[static_cast<size_t>(i)] = s[static_cast<size_t>(i) + 1] * shape[static_cast<size_t>(i) + 1];
  return s;
}

Result<Dims> broadcast_dims(const Dims& a, const Dims& b) {
  size_t r = std::max(a.size(), b.size());
  Dims out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da == db || db == 1)
      out[i] = da;
    else if (da == 1)
      out[i] = db;
    else
      return InvalidArgument("shapes ", dims_str(a), " and ", dims_str(b), " cannot be broadcast (dim ", i, ": ", da,
                             " vs ", db, ")");
  }
  return out;
}

SymShape broadcast_sym(const SymShape& a, const SymShape& b) {
  if (!a.rank_known || !b.rank_known) return SymShape::unknown();
  size_t r = std::max(a.rank(), b.rank());
  std::vector<Dim> out(r);
  for (size_t i = 0; i < r; ++i) {
    Dim da = i < r - a.rank() ? Dim(1) : a.dims[i - (r - a.rank())];
    Dim db = i < r - b.rank() ? Dim(1) : b.dims[i - (r - b.rank())];
    if (da.known() && da.value == 1)
      out[i] = db;
    else if (db.known() && db.value == 1)
      out[i] = da;
    else if (da.known())
      out[i] = da;
    else if (db.known())
      out[i] = db;
    else if (da == db)
      out[i] = da;
    else
      out[i] = Dim();
  }
  return SymShape(out);
}

BroadcastIndex::BroadcastIndex(const Dims& in_shape, const Dims& out_shape) : out_shape_(out_shape) {
  identity_ = in_shape == out_shape;
  Dims s = strides_of(in_shape);
  size_t off = out_shape.size() - in_shape.size();
  in_strides_.assign(out_shape.size(), 0);
  for (size_t i = 0; i < in_shape.size(); ++i) in_strides_[off + i] = in_shape[i] == 1 ? 0 : s[i];
}

int64_t BroadcastIndex::operator()(int64_t out_index) const {
  if (identity_) return out_index;
  int64_t in = 0;
  for (int64_t i = static_cast<int64_t>(out_shape_.size()) - 1; i >= 0 && out_index > 0; --i) {
    int64_t d = out_shape_[static_cast<size_t>(i)];
    int64_t c = out_index % d;
    out_index /= d;
    in += c * in_strides_[static_cast<size_t>(i)];
  }
  return in;
}

std::vector<int64_t> to_i64_vector(const Tensor& t) {
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.get_i64(i);
  return v;
}

std::vector<double> to_f64_vector(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.get_f64(i);
  return v;
}

Tensor make_i64_tensor(const std::vector<int64_t>& v, Dims shape) {
  return Tensor::from_vector<int64_t>(DataType::kInt64, std::move(shape), v);
}

Tensor make_i64_1d(const std::vector<int64_t>& v) { return make_i64_tensor(v, {static_cast<int64_t>(v.size())}); }

bool is_low_precision_float(DataType t) {
  return dtype_is_float(t) && t != DataType::kFloat32 && t != DataType::kFloat64;
}

Tensor upcast_float(const Tensor& t) {
  if (!is_low_precision_float(t.dtype())) return t;
  return t.cast(DataType::kFloat32).value();
}

Tensor downcast_float(const Tensor& t, DataType to) {
  if (t.dtype() == to) return t;
  return t.cast(to).value();
}

void copy_elements(const Tensor& src, int64_t src_off, Tensor& dst, int64_t dst_off, int64_t count) {
  if (count <= 0) return;
  if (src.dtype() == DataType::kString) {
    for (int64_t i = 0; i < count; ++i) dst.strings()[dst_off + i] = src.strings()[src_off + i];
    return;
  }
  size_t es = dtype_size(src.dtype());
  std::memcpy(static_cast<uint8_t*>(dst.raw()) + dst_off * es, static_cast<const uint8_t*>(src.raw()) + src_off * es,
              static_cast<size_t>(count) * es);
}

Status infer_same_as_input0(InferContext& ctx) {
  if (!ctx.has_input(0)) return Status::Ok();
  for (size_t i = 0; i < ctx.outputs.size(); ++i) ctx.set_output(i, ctx.input(0));
  return Status::Ok();
}

namespace {
SymShape broadcast_inputs(const InferContext& ctx) {
  SymShape s;
  bool first = true;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) continue;
    s = first ? ctx.input_shape(i) : broadcast_sym(s, ctx.input_shape(i));
    first = false;
  }
  return s;
}
}  // namespace

Status infer_broadcast_all(InferContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(0), broadcast_inputs(ctx));
  return Status::Ok();
}

Status infer_broadcast_bool(InferContext& ctx) {
  ctx.set_output(0, DataType::kBool, broadcast_inputs(ctx));
  return Status::Ok();
}

bool constant_ints(const InferContext& ctx, size_t i, std::vector<int64_t>* out) {
  const Tensor* t = ctx.constant(i);
  if (!t || !(dtype_is_integer(t->dtype()))) return false;
  *out = to_i64_vector(*t);
  return true;
}

}  // namespace kiln::ops
