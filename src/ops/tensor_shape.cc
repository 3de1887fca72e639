// Shape ops: Identity, Constant, ConstantOfShape, Shape, Size, Reshape, Flatten, Squeeze,
// Unsqueeze, Expand, Range, EyeLike. Inference carries symbolic values (SymValue) through the
// integer ops of shape sub-graphs so that Reshape/Expand targets stay exact.
#include <cmath>
#include <limits>

#include "ops/op_traits.h"
#include "ops/tensor_util.h"

namespace kiln::ops {
namespace {

// Passes input 0's symbolic value on to output 0 (ops that keep the elements: Identity, Reshape...).
void forward_value(InferContext& ctx) {
  if (const SymValue* v = ctx.sym_value(0)) ctx.set_output_value(0, *v);
}

// ---------------------------------------------------------------- Identity

Status identity_infer(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(infer_same_as_input0(ctx));
  forward_value(ctx);
  return Status::Ok();
}

Status identity_kernel(KernelContext& ctx) {
  ctx.set_output_value(0, ctx.input_value(0));
  return Status::Ok();
}

// ---------------------------------------------------------------- Constant

Result<Tensor> constant_value(const ir::Node& node) {
  static const char* kNames[] = {"value",     "sparse_value", "value_float",  "value_floats",
                                 "value_int", "value_ints",   "value_string", "value_strings"};
  const ir::Attribute* found = nullptr;
  std::string name;
  for (const char* n : kNames) {
    if (const ir::Attribute* a = node.attr(n)) {
      if (found) return InvalidModel("has both '", name, "' and '", n, "'; Constant takes exactly one value attribute");
      found = a;
      name = n;
    }
  }
  if (!found)
    return InvalidModel("has no value attribute (value, value_float(s), value_int(s), value_string(s), sparse_value)");
  if (name == "value" || name == "sparse_value") {
    if (!found->t.defined()) return InvalidModel("attribute '", name, "' holds no tensor");
    return found->t;
  }
  if (name == "value_float") return Tensor::scalar<float>(DataType::kFloat32, found->f);
  if (name == "value_floats")
    return Tensor::from_vector<float>(DataType::kFloat32, {static_cast<int64_t>(found->floats.size())}, found->floats);
  if (name == "value_int") return Tensor::scalar<int64_t>(DataType::kInt64, found->i);
  if (name == "value_ints") return make_i64_1d(found->ints);
  Tensor t(DataType::kString, name == "value_string" ? Dims{} : Dims{static_cast<int64_t>(found->strings.size())});
  if (name == "value_string")
    t.strings()[0] = found->s;
  else
    for (size_t i = 0; i < found->strings.size(); ++i) t.strings()[i] = found->strings[i];
  return t;
}

Status constant_infer(InferContext& ctx) {
  auto t = constant_value(ctx.node);
  if (!t.ok()) return ctx.error(t.status().message());
  ctx.set_output(0, t->dtype(), SymShape::from_dims(t->shape()));
  return Status::Ok();
}

Status constant_kernel(KernelContext& ctx) {
  auto t = constant_value(ctx.node);
  if (!t.ok()) return InvalidModel(ctx.node.where(), t.status().message());
  ctx.set_output(0, std::move(t).value());
  return Status::Ok();
}

// ---------------------------------------------------------------- ConstantOfShape

Result<Tensor> constant_of_shape_fill(const ir::Node& node) {
  const ir::Attribute* a = node.attr("value");
  if (!a) return Tensor::scalar<float>(DataType::kFloat32, 0.0f);
  if (!a->t.defined() || a->t.numel() != 1)
    return InvalidModel(node.where(), "attribute 'value' must be a one-element tensor, got ",
                        a->t.defined() ? a->t.describe() : std::string("nothing"));
  return a->t;
}

Status constant_of_shape_infer(InferContext& ctx) {
  auto fill = constant_of_shape_fill(ctx.node);
  if (!fill.ok()) return fill.status();
  DataType dt = fill->dtype();
  if (const SymValue* v = ctx.sym_value(0)) {
    std::vector<Dim> dims;
    for (const SymInt& x : *v) {
      if (x.known && x.value < 0) return ctx.error(str_cat("shape has a negative dim ", x.value));
      dims.push_back(dim_or_symbol(ctx, x.dim()));
    }
    ctx.set_output(0, dt, SymShape(dims));
    return Status::Ok();
  }
  int64_t k = known_length(ctx, 0);
  if (k < 0) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  if (k > 64) return ctx.error(str_cat("shape input has ", k, " entries; ranks above 64 are not supported"));
  std::vector<Dim> dims;
  for (int64_t i = 0; i < k; ++i) dims.push_back(ctx.new_symbol());
  ctx.set_output(0, dt, SymShape(dims));
  return Status::Ok();
}

Status constant_of_shape_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Tensor fill, constant_of_shape_fill(ctx.node));
  const Tensor& s = ctx.input(0);
  if (!dtype_is_integer(s.dtype()) || s.rank() > 1)
    return ctx.error(str_cat("input must be a 1-D integer tensor, got ", s.describe()));
  Dims shape = to_i64_vector(s);
  KILN_RETURN_IF_ERROR(check_dims(shape, "output shape"));
  ctx.set_output(0, take_strided(fill.reshaped({1}), shape, Dims(shape.size(), 0), 0));
  return Status::Ok();
}

// ---------------------------------------------------------------- Shape, Size

// [start, end) of Shape-15 for a tensor of rank r, clamped.
std::pair<int64_t, int64_t> shape_range(const ir::Node& node, int64_t r) {
  int64_t start = node.attr_int("start", 0), end = node.attr_int("end", r);
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = std::clamp<int64_t>(start, 0, r);
  end = std::clamp<int64_t>(end, 0, r);
  return {start, std::max(start, end)};
}

Status shape_infer(InferContext& ctx) {
  const SymShape& s = ctx.input_shape(0);
  if (!s.rank_known) {
    ctx.set_output(0, DataType::kInt64, SymShape({ctx.new_symbol()}));
    return Status::Ok();
  }
  auto [start, end] = shape_range(ctx.node, static_cast<int64_t>(s.rank()));
  ctx.set_output(0, DataType::kInt64, SymShape({Dim(end - start)}));
  SymValue v;
  for (int64_t i = start; i < end; ++i) v.push_back(SymInt::of(s.dims[static_cast<size_t>(i)]));
  ctx.set_output_value(0, std::move(v));
  return Status::Ok();
}

Status shape_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  auto [start, end] = shape_range(ctx.node, x.rank());
  if (ctx.num_outputs() == 0) return Status::Ok();
  // Renewed in place: the node's kept output keeps its shape vector from run to run.
  ctx.outputs[0].kind = Value::Kind::kTensor;
  Tensor& y = ctx.outputs[0].tensor;
  y.renew(DataType::kInt64, {end - start});
  for (int64_t i = start; i < end; ++i) y.data<int64_t>()[i - start] = x.shape()[static_cast<size_t>(i)];
  return Status::Ok();
}

Status size_infer(InferContext& ctx) {
  ctx.set_output(0, DataType::kInt64, SymShape(std::vector<Dim>{}));
  const SymShape& s = ctx.input_shape(0);
  if (s.rank_known) {
    Dim n = dim_product(ctx, s.dims);
    if (n.known() || !n.param.empty()) ctx.set_output_value(0, {SymInt::of(n)});
  }
  return Status::Ok();
}

Status size_kernel(KernelContext& ctx) {
  ctx.set_output(0, Tensor::scalar<int64_t>(DataType::kInt64, ctx.input(0).numel()));
  return Status::Ok();
}

// ---------------------------------------------------------------- Reshape

Status reshape_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  bool allowzero = ctx.node.attr_int("allowzero", 0) != 0;
  SymValue target;
  if (ctx.opset() < 5) {
    for (int64_t v : ctx.node.attr_ints("shape")) target.push_back(SymInt::of(v));
  } else if (const SymValue* v = ctx.sym_value(1)) {
    target = *v;
  } else {
    int64_t k = known_length(ctx, 1);
    if (k > 64) return ctx.error(str_cat("axes has ", k, " entries; ranks above 64 are not supported"));
    std::vector<Dim> dims;
    for (int64_t i = 0; i < k; ++i) dims.push_back(ctx.new_symbol());
    ctx.set_output(0, dt, k < 0 ? SymShape() : SymShape(dims));
    return Status::Ok();
  }
  std::vector<Dim> out;
  int64_t infer_at = -1;
  for (size_t i = 0; i < target.size(); ++i) {
    const SymInt& x = target[i];
    if (!x.known) {
      out.push_back(dim_or_symbol(ctx, x.dim()));
    } else if (x.value == -1) {
      if (infer_at >= 0) return ctx.error("shape has more than one -1");
      infer_at = static_cast<int64_t>(i);
      out.push_back(Dim());
    } else if (x.value < -1) {
      return ctx.error(str_cat("shape has an invalid dim ", x.value));
    } else if (x.value == 0 && !allowzero) {
      if (in.rank_known && i >= in.rank())
        return ctx.error(str_cat("shape[", i, "] = 0 copies input dim ", i, " but the input has rank ", in.rank()));
      out.push_back(in.rank_known ? dim_or_symbol(ctx, in.dims[i]) : ctx.new_symbol());
    } else {
      out.push_back(Dim(x.value));
    }
  }
  // With every dim known, the kernel's count checks hold now: a build refuses what a run would
  // (with the kernel's message).
  bool all_known = in.fully_known();
  for (size_t i = 0; i < out.size() && all_known; ++i)
    all_known = static_cast<int64_t>(i) == infer_at || out[i].known();
  if (all_known) {
    const std::string x = str_cat(dtype_name(dt), dims_str(in.concrete()));
    int64_t n_in = 1, n_out = 1;
    bool overflow = false;
    for (const Dim& d : in.dims) overflow |= __builtin_mul_overflow(n_in, d.value, &n_in);
    for (size_t i = 0; i < out.size(); ++i)
      if (static_cast<int64_t>(i) != infer_at) overflow |= __builtin_mul_overflow(n_out, out[i].value, &n_out);
    Dims raw;  // the shape input as given (kernel messages print it)
    for (const SymInt& t : target) raw.push_back(t.known ? t.value : -2);
    if (!overflow && infer_at < 0 && n_in != n_out) {
      Dims o;
      for (const Dim& d : out) o.push_back(d.value);
      return ctx.error(
          str_cat("cannot reshape ", x, " (", n_in, " elements) to ", dims_str(o), " (", n_out, " elements)"));
    }
    if (!overflow && infer_at >= 0 && (n_out == 0 || n_in % n_out != 0))
      return ctx.error(str_cat("cannot reshape ", x, " to ", dims_str(raw), ": -1 cannot be inferred"));
  }
  if (infer_at >= 0) {
    // Resolve -1: cancel equal symbols between input and output, then divide the known parts.
    Dim resolved = ctx.new_symbol();
    if (in.rank_known) {
      std::vector<Dim> rest(in.dims.begin(), in.dims.end());
      bool ok = true;
      int64_t out_known = 1;
      for (size_t i = 0; i < out.size() && ok; ++i) {
        if (static_cast<int64_t>(i) == infer_at) continue;
        if (out[i].known()) {
          if (__builtin_mul_overflow(out_known, out[i].value, &out_known) || out_known > (int64_t{1} << 40)) ok = false;
          continue;
        }
        auto it = std::find_if(rest.begin(), rest.end(), [&](const Dim& d) { return !d.known() && d == out[i]; });
        if (it == rest.end())
          ok = false;
        else
          rest.erase(it);
      }
      if (ok && out_known > 0) {
        Dim in_rest = dim_product(ctx, rest);
        if (in_rest.known()) {
          if (in_rest.value % out_known != 0)
            return ctx.error(str_cat("cannot reshape ", in.str(), " to ", SymShape(out).str(), " (-1 at ", infer_at,
                                     "): sizes do not divide"));
          resolved = Dim(in_rest.value / out_known);
        } else if (out_known == 1 && !in_rest.param.empty()) {
          resolved = in_rest;
        }
      }
    }
    out[static_cast<size_t>(infer_at)] = resolved;
  }
  ctx.set_output(0, dt, SymShape(out));
  forward_value(ctx);
  return Status::Ok();
}

Status reshape_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> shape;
  if (ctx.opset() < 5) {
    shape = ctx.node.attr_ints("shape");
  } else {
    const Tensor& s = ctx.input(1);
    if (!dtype_is_integer(s.dtype()) || s.rank() != 1)
      return ctx.error(str_cat("shape must be a 1-D integer tensor, got ", s.describe()));
    shape = to_i64_vector(s);
  }
  bool allowzero = ctx.node.attr_int("allowzero", 0) != 0;
  int64_t infer_at = -1, known = 1;
  Dims out(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t v = shape[i];
    if (v == -1) {
      if (infer_at >= 0) return ctx.error(str_cat("shape ", dims_str(shape), " has more than one -1"));
      infer_at = static_cast<int64_t>(i);
      continue;
    }
    if (v < -1) return ctx.error(str_cat("shape ", dims_str(shape), " has an invalid dim ", v));
    if (v == 0 && !allowzero) {
      if (static_cast<int64_t>(i) >= x.rank())
        return ctx.error(str_cat("shape ", dims_str(shape), ": 0 at ", i, " copies a dim the input ", x.describe(),
                                 " does not have"));
      v = x.dim(static_cast<int64_t>(i));
    }
    out[i] = v;
    if (v != 0 && known > kMaxTensorElements / v) return ctx.error(str_cat("shape ", dims_str(shape), " is too large"));
    known *= v;
  }
  if (infer_at >= 0) {
    if (known == 0 || x.numel() % known != 0)
      return ctx.error(str_cat("cannot reshape ", x.describe(), " to ", dims_str(shape), ": -1 cannot be inferred"));
    out[static_cast<size_t>(infer_at)] = x.numel() / known;
  } else if (known != x.numel()) {
    return ctx.error(str_cat("cannot reshape ", x.describe(), " (", x.numel(), " elements) to ", dims_str(out), " (",
                             known, " elements)"));
  }
  ctx.set_output(0, x.reshaped(out));
  return Status::Ok();
}

// ---------------------------------------------------------------- Flatten

Status flatten_infer(InferContext& ctx) {
  const SymShape& in = ctx.input_shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, ctx.input_dtype(0), SymShape({ctx.new_symbol(), ctx.new_symbol()}));
    return Status::Ok();
  }
  int64_t r = static_cast<int64_t>(in.rank());
  int64_t axis = ctx.node.attr_int("axis", 1);
  if (axis < -r || axis > r) return ctx.error(str_cat("axis ", axis, " is out of range for rank ", r));
  if (axis < 0) axis += r;
  std::vector<Dim> a(in.dims.begin(), in.dims.begin() + axis), b(in.dims.begin() + axis, in.dims.end());
  ctx.set_output(0, ctx.input_dtype(0), SymShape({dim_product(ctx, a), dim_product(ctx, b)}));
  return Status::Ok();
}

Status flatten_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t r = x.rank(), axis = ctx.node.attr_int("axis", 1);
  if (axis < -r || axis > r) return ctx.error(str_cat("axis ", axis, " is out of range for rank ", r));
  if (axis < 0) axis += r;
  int64_t a = 1, b = 1;
  for (int64_t i = 0; i < r; ++i) (i < axis ? a : b) *= x.dim(i);
  ctx.set_output(0, x.reshaped({a, b}));
  return Status::Ok();
}

// ---------------------------------------------------------------- Squeeze, Unsqueeze

Status squeeze_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  std::vector<int64_t> axes;
  bool present = false;
  bool known = known_ints_attr_or_input(ctx, "axes", 1, 13, &axes, &present);
  if (!in.rank_known) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  int64_t r = static_cast<int64_t>(in.rank());
  if (!known) {
    int64_t k = known_length(ctx, 1);
    if (k > 64) return ctx.error(str_cat("axes has ", k, " entries; ranks above 64 are not supported"));
    std::vector<Dim> dims;
    for (int64_t i = 0; k >= 0 && i < r - k; ++i) dims.push_back(ctx.new_symbol());
    ctx.set_output(0, dt, k < 0 || k > r ? SymShape() : SymShape(dims));
    return Status::Ok();
  }
  std::vector<bool> drop(static_cast<size_t>(r), false);
  if (present) {
    auto n = normalize_axes(axes, r);
    if (!n.ok()) return ctx.error(n.status().message());
    for (int64_t a : *n) {
      const Dim& d = in.dims[static_cast<size_t>(a)];
      if (d.known() && d.value != 1)
        return ctx.error(str_cat("cannot squeeze axis ", a, " of ", in.str(), ": its size is ", d.value));
      drop[static_cast<size_t>(a)] = true;
    }
  } else {
    for (int64_t i = 0; i < r; ++i) {
      const Dim& d = in.dims[static_cast<size_t>(i)];
      if (!d.known()) {  // might be 1 or not: the rank is not known
        ctx.set_output(0, dt, SymShape());
        return Status::Ok();
      }
      drop[static_cast<size_t>(i)] = d.value == 1;
    }
  }
  std::vector<Dim> out;
  for (int64_t i = 0; i < r; ++i)
    if (!drop[static_cast<size_t>(i)]) out.push_back(in.dims[static_cast<size_t>(i)]);
  ctx.set_output(0, dt, SymShape(out));
  forward_value(ctx);
  return Status::Ok();
}

Status squeeze_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  bool present = false;
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ints_attr_or_input(ctx, "axes", 1, 13, &present));
  std::vector<bool> drop(static_cast<size_t>(x.rank()), false);
  if (present) {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> n, normalize_axes(axes, x.rank()));
    for (int64_t a : n) {
      if (x.dim(a) != 1)
        return ctx.error(str_cat("cannot squeeze axis ", a, " of ", x.describe(), ": its size is ", x.dim(a)));
      drop[static_cast<size_t>(a)] = true;
    }
  } else {
    for (int64_t i = 0; i < x.rank(); ++i) drop[static_cast<size_t>(i)] = x.dim(i) == 1;
  }
  Dims out;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (!drop[static_cast<size_t>(i)]) out.push_back(x.dim(i));
  ctx.set_output(0, x.reshaped(out));
  return Status::Ok();
}

Status unsqueeze_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  std::vector<int64_t> axes;
  bool present = false;
  bool known = known_ints_attr_or_input(ctx, "axes", 1, 13, &axes, &present);
  if (!in.rank_known) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  int64_t r = static_cast<int64_t>(in.rank());
  if (!known) {
    int64_t k = known_length(ctx, 1);
    if (k > 64) return ctx.error(str_cat("axes has ", k, " entries; ranks above 64 are not supported"));
    std::vector<Dim> dims;
    for (int64_t i = 0; k >= 0 && i < r + k; ++i) dims.push_back(ctx.new_symbol());
    ctx.set_output(0, dt, k < 0 ? SymShape() : SymShape(dims));
    return Status::Ok();
  }
  if (!present) return ctx.error("axes are required");
  int64_t out_r = r + static_cast<int64_t>(axes.size());
  auto n = normalize_axes(axes, out_r);
  if (!n.ok()) return ctx.error(n.status().message());
  std::vector<bool> ins(static_cast<size_t>(out_r), false);
  for (int64_t a : *n) ins[static_cast<size_t>(a)] = true;
  std::vector<Dim> out;
  size_t j = 0;
  for (int64_t i = 0; i < out_r; ++i) out.push_back(ins[static_cast<size_t>(i)] ? Dim(1) : in.dims[j++]);
  ctx.set_output(0, dt, SymShape(out));
  forward_value(ctx);
  return Status::Ok();
}

Status unsqueeze_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  bool present = false;
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ints_attr_or_input(ctx, "axes", 1, 13, &present));
  if (!present) return ctx.error("axes are required");
  int64_t out_r = x.rank() + static_cast<int64_t>(axes.size());
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> n, normalize_axes(axes, out_r));
  std::vector<bool> ins(static_cast<size_t>(out_r), false);
  for (int64_t a : n) ins[static_cast<size_t>(a)] = true;
  Dims out;
  int64_t j = 0;
  for (int64_t i = 0; i < out_r; ++i) out.push_back(ins[static_cast<size_t>(i)] ? 1 : x.dim(j++));
  ctx.set_output(0, x.reshaped(out));
  return Status::Ok();
}

// ---------------------------------------------------------------- Expand

Status expand_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  if (const SymValue* v = ctx.sym_value(1)) {
    std::vector<Dim> target;
    for (const SymInt& x : *v) {
      if (x.known && x.value < 0) return ctx.error(str_cat("shape has a negative dim ", x.value));
      target.push_back(x.dim());
    }
    if (in.rank_known) {
      for (size_t i = 0; i < std::min(in.rank(), target.size()); ++i) {
        const Dim& a = in.dims[in.rank() - 1 - i];
        const Dim& b = target[target.size() - 1 - i];
        if (a.known() && b.known() && a.value != 1 && b.value != 1 && a.value != b.value)
          return ctx.error(str_cat("cannot expand ", in.str(), " to ", SymShape(target).str()));
      }
    }
    SymShape out = broadcast_sym(in, SymShape(target));
    for (Dim& d : out.dims) d = dim_or_symbol(ctx, d);
    ctx.set_output(0, dt, out);
    return Status::Ok();
  }
  int64_t k = known_length(ctx, 1);
  if (!in.rank_known || k < 0) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  if (k > 64) return ctx.error(str_cat("shape input has ", k, " entries; ranks above 64 are not supported"));
  size_t r = std::max<size_t>(in.rank(), static_cast<size_t>(k));
  std::vector<Dim> out;
  for (size_t i = 0; i < r; ++i) {
    const Dim* d = i + in.rank() >= r ? &in.dims[i - (r - in.rank())] : nullptr;
    out.push_back(d && d->known() && d->value != 1 ? *d : ctx.new_symbol());
  }
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

Status expand_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& s = ctx.input(1);
  if (!dtype_is_integer(s.dtype()) || s.rank() != 1)
    return ctx.error(str_cat("shape must be a 1-D integer tensor, got ", s.describe()));
  Dims target = to_i64_vector(s);
  for (int64_t d : target)
    if (d < 0) return ctx.error(str_cat("shape ", dims_str(target), " has a negative dim"));
  auto out = broadcast_dims(x.shape(), target);
  if (!out.ok()) return ctx.error(str_cat("cannot expand ", x.describe(), " to ", dims_str(target)));
  KILN_RETURN_IF_ERROR(check_dims(*out, "output shape"));
  // Input dims aligned to the right; missing and size-1 dims repeat (stride 0).
  Dims in_strides = strides_of(x.shape()), strides(out->size(), 0);
  size_t off = out->size() - x.shape().size();
  for (size_t i = 0; i < x.shape().size(); ++i) strides[off + i] = x.shape()[i] == 1 ? 0 : in_strides[i];
  ctx.set_output(0, take_strided(x, *out, strides, 0));
  return Status::Ok();
}

// ---------------------------------------------------------------- Range

Status range_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  std::vector<int64_t> s, l, d;
  if (dtype_is_integer(dt) && known_ints(ctx, 0, &s) && known_ints(ctx, 1, &l) && known_ints(ctx, 2, &d) &&
      s.size() == 1 && l.size() == 1 && d.size() == 1 && d[0] != 0) {
    __int128 diff = static_cast<__int128>(l[0]) - s[0];
    __int128 n = (diff + d[0] + (d[0] > 0 ? -1 : 1)) / d[0];
    ctx.set_output(0, dt, SymShape({Dim(static_cast<int64_t>(std::max<__int128>(n, 0)))}));
    return Status::Ok();
  }
  ctx.set_output(0, dt, SymShape({ctx.new_symbol()}));
  return Status::Ok();
}

Status range_kernel(KernelContext& ctx) {
  const Tensor &s = ctx.input(0), &l = ctx.input(1), &d = ctx.input(2);
  DataType dt = s.dtype();
  if (l.dtype() != dt || d.dtype() != dt)
    return ctx.error(str_cat("start, limit and delta must share a dtype, got ", s.describe(), ", ", l.describe(), ", ",
                             d.describe()));
  if (s.numel() != 1 || l.numel() != 1 || d.numel() != 1)
    return ctx.error(
        str_cat("start, limit and delta must be scalars, got ", s.describe(), ", ", l.describe(), ", ", d.describe()));
  if (dtype_is_integer(dt)) {
    int64_t a = s.get_i64(0), b = l.get_i64(0), step = d.get_i64(0);
    if (step == 0) return ctx.error("delta is 0");
    __int128 diff = static_cast<__int128>(b) - a;
    __int128 n = std::max<__int128>((diff + step + (step > 0 ? -1 : 1)) / step, 0);
    if (n > kMaxTensorElements)
      return ctx.error(str_cat("the range has too many elements (", static_cast<double>(n), ")"));
    Tensor out(dt, {static_cast<int64_t>(n)});
    for (int64_t i = 0; i < static_cast<int64_t>(n); ++i)
      out.set_i64(i, static_cast<int64_t>(static_cast<__int128>(a) + static_cast<__int128>(i) * step));
    ctx.set_output(0, out);
    return Status::Ok();
  }
  if (!dtype_is_float(dt)) return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  double a = s.get_f64(0), b = l.get_f64(0), step = d.get_f64(0);
  if (step == 0 || !std::isfinite(a) || !std::isfinite(b) || !std::isfinite(step))
    return ctx.error(str_cat("invalid range: start ", a, ", limit ", b, ", delta ", step));
  double n = std::max(std::ceil((b - a) / step), 0.0);
  if (n > static_cast<double>(kMaxTensorElements))
    return ctx.error(str_cat("the range has too many elements (", n, ")"));
  Tensor out(dt, {static_cast<int64_t>(n)});
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) out.set_f64(i, a + static_cast<double>(i) * step);
  ctx.set_output(0, out);
  return Status::Ok();
}

// ---------------------------------------------------------------- EyeLike

DataType eyelike_dtype(const ir::Node& node, DataType in) {
  const ir::Attribute* a = node.attr("dtype");
  if (!a || !dtype_is_known(static_cast<int32_t>(a->i))) return in;
  return static_cast<DataType>(a->i);
}

Status eyelike_infer(InferContext& ctx) {
  const SymShape& in = ctx.input_shape(0);
  if (in.rank_known && in.rank() != 2) return ctx.error(str_cat("input must be 2-D, got ", in.str()));
  ctx.set_output(0, eyelike_dtype(ctx.node, ctx.input_dtype(0)),
                 in.rank_known ? in : SymShape({ctx.new_symbol(), ctx.new_symbol()}));
  return Status::Ok();
}

Status eyelike_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() != 2) return ctx.error(str_cat("input must be 2-D, got ", x.describe()));
  DataType dt = eyelike_dtype(ctx.node, x.dtype());
  if (dt == DataType::kString || dt == DataType::kComplex64 || dt == DataType::kComplex128)
    return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  int64_t k = ctx.node.attr_int("k", 0);
  Tensor out(dt, x.shape());
  for (int64_t i = 0; i < x.dim(0); ++i) {
    if (k < -x.dim(1) || k > x.dim(1)) break;
    int64_t j = i + k;
    if (j >= 0 && j < x.dim(1)) out.set_f64(i * x.dim(1) + j, 1.0);
  }
  ctx.set_output(0, out);
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Identity, 1, identity_infer, identity_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Constant, 1, constant_infer, constant_kernel, 0, 0);
KILN_REGISTER_OP_ARITY("", ConstantOfShape, 9, constant_of_shape_infer, constant_of_shape_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Shape, 1, shape_infer, shape_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Size, 1, size_infer, size_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Reshape, 1, reshape_infer, reshape_kernel, 1, 2);
KILN_REGISTER_OP_ARITY("", Flatten, 1, flatten_infer, flatten_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Squeeze, 1, squeeze_infer, squeeze_kernel, 1, 2);
KILN_REGISTER_OP_ARITY("", Unsqueeze, 1, unsqueeze_infer, unsqueeze_kernel, 1, 2);
KILN_REGISTER_OP_ARITY("", Expand, 8, expand_infer, expand_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Range, 11, range_infer, range_kernel, 3, 3);
KILN_REGISTER_OP_ARITY("", EyeLike, 9, eyelike_infer, eyelike_kernel, 1, 1);

// Traits (registry.h): the views and the shape queries (moving no element, engine::is_shape_work).
KILN_OP_TRAITS("", Identity, trait::kView | trait::kInPlace);
KILN_OP_TRAITS("", Reshape, trait::kView | trait::kInPlace);
KILN_OP_TRAITS("", Flatten, trait::kView | trait::kInPlace);
KILN_OP_TRAITS("", Squeeze, trait::kView | trait::kInPlace);
KILN_OP_TRAITS("", Unsqueeze, trait::kView | trait::kInPlace);
KILN_OP_TRAITS("", Shape, trait::kShapeQuery);
KILN_OP_TRAITS("", Size, trait::kShapeQuery);
KILN_OP_TRAITS("", Constant, trait::kShapeQuery);

}  // namespace kiln::ops
