// Data-movement ops: Transpose, Concat, Split, Slice, Tile, DepthToSpace, SpaceToDepth, Trilu,
// ReverseSequence. (Pad, CenterCropPad and Col2Im are in tensor_pad.cc.)
#include <algorithm>
#include <cstring>
#include <span>

#include "ops/movement_geometry.h"
#include "ops/tensor_util.h"

namespace kiln::ops {

// Sizes of Split's n outputs along an axis of size dim (dim < 0: unknown, then only an explicit
// split gives sizes; others come back empty).
Result<std::vector<int64_t>> split_sizes(bool has_split, const std::vector<int64_t>& split, int64_t num_outputs,
                                         int64_t n, int64_t dim) {
  if (has_split) {
    if (static_cast<int64_t>(split.size()) != n)
      return InvalidArgument("split ", dims_str(split), " has ", split.size(), " entries for ", n, " outputs");
    int64_t sum = 0;
    for (int64_t s : split) {
      if (s < 0 || s > kMaxTensorElements) return InvalidArgument("split ", dims_str(split), " has an invalid size");
      sum += s;
    }
    if (dim >= 0 && sum != dim)
      return InvalidArgument("split ", dims_str(split), " sums to ", sum, " but the axis has size ", dim);
    return split;
  }
  if (num_outputs >= 0 && num_outputs != n)
    return InvalidArgument("num_outputs is ", num_outputs, " but the node has ", n, " outputs");
  if (n <= 0) return InvalidArgument("Split needs at least one output");
  if (dim < 0) return std::vector<int64_t>{};
  if (dim % n == 0) return std::vector<int64_t>(static_cast<size_t>(n), dim / n);
  if (num_outputs < 0) return InvalidArgument("an axis of size ", dim, " cannot be split into ", n, " equal parts");
  int64_t chunk = (dim + n - 1) / n, last = dim - chunk * (n - 1);
  if (last < 0) return InvalidArgument("an axis of size ", dim, " cannot be split into ", n, " parts");
  std::vector<int64_t> sizes(static_cast<size_t>(n), chunk);
  sizes.back() = last;
  return sizes;
}

// Clamps [start, end) with step for an axis of size dim, as ONNX Slice does.
Result<SliceAxis> slice_axis(int64_t dim, int64_t start, int64_t end, int64_t step) {
  if (step == 0) return InvalidArgument("slice step is 0");
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  SliceAxis s;
  s.step = step;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    s.len = end > start ? static_cast<int64_t>((static_cast<uint64_t>(end - start) + static_cast<uint64_t>(step) - 1) /
                                               static_cast<uint64_t>(step))
                        : 0;
  } else {
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
    uint64_t ustep = uint64_t{0} - static_cast<uint64_t>(step);
    s.len = start > end ? static_cast<int64_t>((static_cast<uint64_t>(start - end) + ustep - 1) / ustep) : 0;
  }
  s.start = start;
  return s;
}

Status check_slice_params(SliceParams& p, int64_t rank) {
  size_t n = p.starts.size();
  if (p.ends.size() != n)
    return InvalidArgument("starts ", dims_str(p.starts), " and ends ", dims_str(p.ends), " differ in length");
  if (!p.has_axes) {
    p.axes.clear();
    for (size_t i = 0; i < n; ++i) p.axes.push_back(static_cast<int64_t>(i));
  }
  if (!p.has_steps) p.steps.assign(n, 1);
  if (p.axes.size() != n || p.steps.size() != n)
    return InvalidArgument("starts, ends, axes and steps differ in length (", n, ", ", p.ends.size(), ", ",
                           p.axes.size(), ", ", p.steps.size(), ")");
  KILN_ASSIGN_OR_RETURN(p.axes, normalize_axes(p.axes, rank));
  for (int64_t s : p.steps)
    if (s == 0) return InvalidArgument("slice step is 0");
  return Status::Ok();
}

namespace {

// ---------------------------------------------------------------- Transpose

Result<std::vector<int64_t>> transpose_perm(const ir::Node& node, int64_t r) {
  std::vector<int64_t> perm = node.attr_ints("perm");
  if (!node.attr("perm")) {
    for (int64_t i = r - 1; i >= 0; --i) perm.push_back(i);
    return perm;
  }
  if (static_cast<int64_t>(perm.size()) != r)
    return InvalidArgument("perm ", dims_str(perm), " has ", perm.size(), " entries for an input of rank ", r);
  std::vector<bool> seen(static_cast<size_t>(r), false);
  for (int64_t p : perm) {
    if (p < 0 || p >= r || seen[static_cast<size_t>(p)])
      return InvalidArgument("perm ", dims_str(perm), " is not a permutation of [0, ", r, ")");
    seen[static_cast<size_t>(p)] = true;
  }
  return perm;
}

Status transpose_infer(InferContext& ctx) {
  const SymShape& in = ctx.input_shape(0);
  if (!in.rank_known) {
    const ir::Attribute* p = ctx.node.attr("perm");
    std::vector<Dim> dims;
    for (size_t i = 0; p && i < p->ints.size(); ++i) dims.push_back(ctx.new_symbol());
    ctx.set_output(0, ctx.input_dtype(0), p ? SymShape(dims) : SymShape());
    return Status::Ok();
  }
  auto perm = transpose_perm(ctx.node, static_cast<int64_t>(in.rank()));
  if (!perm.ok()) return ctx.error(perm.status().message());
  std::vector<Dim> out;
  for (int64_t p : *perm) out.push_back(in.dims[static_cast<size_t>(p)]);
  ctx.set_output(0, ctx.input_dtype(0), SymShape(out));
  return Status::Ok();
}

Status transpose_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> perm, transpose_perm(ctx.node, x.rank()));
  Dims in_strides = strides_of(x.shape()), out_shape, strides;
  for (int64_t p : perm) {
    out_shape.push_back(x.dim(p));
    strides.push_back(in_strides[static_cast<size_t>(p)]);
  }
  ctx.set_output(0, take_strided(x, out_shape, strides, 0));
  return Status::Ok();
}

// ---------------------------------------------------------------- Concat

int64_t concat_axis(const ir::Node& node) {
  // Concat-1 had an optional axis defaulting to 1; later versions require it.
  return node.attr_int("axis", node.opset < 4 ? 1 : 0);
}

Status concat_infer(InferContext& ctx) {
  DataType dt = DataType::kUndefined;
  const SymShape* ref = nullptr;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (dt == DataType::kUndefined) dt = ctx.input_dtype(i);
    const SymShape& s = ctx.input_shape(i);
    if (!s.rank_known) continue;
    if (ref && s.rank() != ref->rank())
      return ctx.error(str_cat("inputs have different ranks: ", ref->str(), " and ", s.str()));
    if (!ref) ref = &s;
  }
  if (!ref) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  auto axis_r = normalize_axis(concat_axis(ctx.node), static_cast<int64_t>(ref->rank()));
  if (!axis_r.ok() || ref->rank() == 0)
    return ctx.error(ref->rank() == 0 ? "cannot concatenate scalars" : axis_r.status().message());
  size_t axis = static_cast<size_t>(*axis_r);
  std::vector<Dim> out(ref->rank());
  bool sum_known = true;
  int64_t sum = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const SymShape& s = ctx.input_shape(i);
    if (!s.rank_known) {
      sum_known = false;
      continue;
    }
    for (size_t k = 0; k < s.rank(); ++k) {
      const Dim& d = s.dims[k];
      if (k == axis) {
        if (!d.known() || __builtin_add_overflow(sum, d.value, &sum)) sum_known = false;
        continue;
      }
      if (d.known() && out[k].known() && d.value != out[k].value)
        return ctx.error(str_cat("inputs disagree on dim ", k, ": ", ref->str(), " vs ", s.str()));
      if (d.known() || (!out[k].known() && out[k].param.empty())) out[k] = d;
    }
  }
  out[axis] = sum_known ? Dim(sum) : ctx.new_symbol();
  for (Dim& d : out) d = dim_or_symbol(ctx, d);
  ctx.set_output(0, dt, SymShape(out));
  if (axis == 0 && out.size() == 1) {
    SymValue v;
    for (size_t i = 0; i < ctx.num_inputs(); ++i) {
      const SymValue* iv = ctx.sym_value(i);
      if (!iv) return Status::Ok();
      v.insert(v.end(), iv->begin(), iv->end());
    }
    ctx.set_output_value(0, std::move(v));
  }
  return Status::Ok();
}

Status concat_kernel(KernelContext& ctx) {
  const Tensor& first = ctx.input(0);
  if (first.rank() == 0) return ctx.error("cannot concatenate scalars");
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(concat_axis(ctx.node), first.rank()));
  Dims out_shape = first.shape();
  out_shape[static_cast<size_t>(axis)] = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& t = ctx.input(i);
    if (t.dtype() != first.dtype() || t.rank() != first.rank())
      return ctx.error(str_cat("input ", i, " is ", t.describe(), ", input 0 is ", first.describe()));
    for (int64_t k = 0; k < t.rank(); ++k)
      if (k != axis && t.dim(k) != first.dim(k))
        return ctx.error(str_cat("input ", i, " ", t.describe(), " differs from input 0 ", first.describe(), " in dim ",
                                 k, " (only axis ", axis, " may differ)"));
    out_shape[static_cast<size_t>(axis)] += t.dim(axis);
  }
  KILN_RETURN_IF_ERROR(check_dims(out_shape, "output shape"));
  Tensor out(first.dtype(), out_shape);
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < first.rank(); ++k) (k < axis ? outer : inner) *= k == axis ? 1 : first.dim(k);
  int64_t dst = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (size_t i = 0; i < ctx.num_inputs(); ++i) {
      const Tensor& t = ctx.input(i);
      int64_t block = t.dim(axis) * inner;
      copy_elements(t, o * block, out, dst, block);
      dst += block;
    }
  }
  ctx.set_output(0, out);
  return Status::Ok();
}

// ---------------------------------------------------------------- Split

// The explicit split list: attribute (opset 2-12), input 1 (opset 1 or >= 13).
struct SplitSpec {
  bool has_split = false, known = true;
  std::vector<int64_t> split;
  int64_t num_outputs = -1;
};

SplitSpec split_spec_infer(const InferContext& ctx) {
  SplitSpec s;
  if (ctx.opset() >= 18 && ctx.node.attr("num_outputs")) s.num_outputs = ctx.node.attr_int("num_outputs", -1);
  if (ctx.opset() >= 2 && ctx.opset() < 13) {
    if (const ir::Attribute* a = ctx.node.attr("split")) {
      s.has_split = true;
      s.split = a->ints;
    }
    return s;
  }
  if (ctx.opset() < 2 && ctx.node.attr("split")) {
    s.has_split = true;
    s.split = ctx.node.attr_ints("split");
    return s;
  }
  if (ctx.has_input(1)) {
    s.has_split = true;
    s.known = known_ints(ctx, 1, &s.split);
  }
  return s;
}

Status split_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  int64_t n = static_cast<int64_t>(ctx.outputs.size());
  if (!in.rank_known) {
    for (int64_t i = 0; i < n; ++i) ctx.set_output(static_cast<size_t>(i), dt, SymShape());
    return Status::Ok();
  }
  auto axis_r = normalize_axis(ctx.node.attr_int("axis", 0), static_cast<int64_t>(in.rank()));
  if (!axis_r.ok() || in.rank() == 0)
    return ctx.error(in.rank() == 0 ? "cannot split a scalar" : axis_r.status().message());
  size_t axis = static_cast<size_t>(*axis_r);
  SplitSpec spec = split_spec_infer(ctx);
  std::vector<int64_t> sizes;
  if (spec.known) {
    const Dim& d = in.dims[axis];
    auto r = split_sizes(spec.has_split, spec.split, spec.num_outputs, n, d.known() ? d.value : -1);
    if (!r.ok()) return ctx.error(r.status().message());
    sizes = *r;
  }
  for (int64_t i = 0; i < n; ++i) {
    SymShape s = in;
    s.dims[axis] = sizes.empty() ? (n == 1 ? dim_or_symbol(ctx, in.dims[axis]) : ctx.new_symbol())
                                 : Dim(sizes[static_cast<size_t>(i)]);
    ctx.set_output(static_cast<size_t>(i), dt, s);
  }
  return Status::Ok();
}

Status split_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() == 0) return ctx.error("cannot split a scalar");
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node.attr_int("axis", 0), x.rank()));
  SplitSpec spec;
  if (ctx.opset() >= 18 && ctx.node.attr("num_outputs")) spec.num_outputs = ctx.node.attr_int("num_outputs", -1);
  if ((ctx.opset() >= 2 && ctx.opset() < 13) || (ctx.opset() < 2 && ctx.node.attr("split"))) {
    spec.has_split = ctx.node.attr("split") != nullptr;
    spec.split = ctx.node.attr_ints("split");
  } else if (ctx.has_input(1)) {
    const Tensor& s = ctx.input(1);
    if (!dtype_is_integer(s.dtype()) || s.rank() > 1)
      return ctx.error(str_cat("split must be a 1-D integer tensor, got ", s.describe()));
    spec.has_split = true;
    spec.split = to_i64_vector(s);
  }
  int64_t n = static_cast<int64_t>(ctx.num_outputs());
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> sizes,
                        split_sizes(spec.has_split, spec.split, spec.num_outputs, n, x.dim(axis)));
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < x.rank(); ++k)
    if (k != axis) (k < axis ? outer : inner) *= x.dim(k);
  int64_t begin = 0;
  for (int64_t i = 0; i < n; ++i) {
    Dims shape = x.shape();
    int64_t len = sizes[static_cast<size_t>(i)];
    shape[static_cast<size_t>(axis)] = len;
    Tensor out(x.dtype(), shape);
    for (int64_t o = 0; o < outer; ++o)
      copy_elements(x, (o * x.dim(axis) + begin) * inner, out, o * len * inner, len * inner);
    begin += len;
    ctx.set_output(static_cast<size_t>(i), out);
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- Slice

Status slice_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  SliceParams p;
  bool known = true;
  if (ctx.opset() < 10) {
    p.starts = ctx.node.attr_ints("starts");
    p.ends = ctx.node.attr_ints("ends");
    p.has_axes = ctx.node.attr("axes") != nullptr;
    p.axes = ctx.node.attr_ints("axes");
  } else {
    known = known_ints(ctx, 1, &p.starts) && known_ints(ctx, 2, &p.ends);
    known = known && known_ints_attr_or_input(ctx, "axes", 3, 10, &p.axes, &p.has_axes);
    known = known && known_ints_attr_or_input(ctx, "steps", 4, 10, &p.steps, &p.has_steps);
  }
  if (!in.rank_known) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  int64_t r = static_cast<int64_t>(in.rank());
  std::vector<Dim> out = in.dims;
  if (!known) {
    std::vector<int64_t> axes;
    bool has_axes = false;
    if (ctx.opset() >= 10 && known_ints_attr_or_input(ctx, "axes", 3, 10, &axes, &has_axes) && has_axes) {
      auto n = normalize_axes(axes, r);
      if (!n.ok()) return ctx.error(n.status().message());
      for (int64_t a : *n) out[static_cast<size_t>(a)] = ctx.new_symbol();
    } else {
      for (Dim& d : out) d = ctx.new_symbol();
    }
    ctx.set_output(0, dt, SymShape(out));
    return Status::Ok();
  }
  Status st = check_slice_params(p, r);
  if (!st.ok()) return ctx.error(st.message());
  std::vector<SliceAxis> sliced;
  for (size_t i = 0; i < p.axes.size(); ++i) {
    Dim& d = out[static_cast<size_t>(p.axes[i])];
    if (d.known()) {
      auto s = slice_axis(d.value, p.starts[i], p.ends[i], p.steps[i]);
      if (!s.ok()) return ctx.error(s.status().message());
      sliced.push_back(*s);
      d = Dim(s->len);
    } else if (p.starts[i] == 0 && p.steps[i] == 1 && p.ends[i] >= (int64_t{1} << 62)) {
      d = dim_or_symbol(ctx, d);  // the whole axis
    } else {
      d = ctx.new_symbol();
    }
  }
  ctx.set_output(0, dt, SymShape(out));
  // A slice of a symbolic 1-D value (e.g. part of a Shape).
  const SymValue* v = ctx.sym_value(0);
  if (v && r == 1 && sliced.size() == 1) {
    SymValue o;
    for (int64_t i = 0; i < sliced[0].len; ++i)
      o.push_back((*v)[static_cast<size_t>(sliced[0].start + i * sliced[0].step)]);
    ctx.set_output_value(0, std::move(o));
  } else if (v && r == 1 && p.axes.empty()) {
    ctx.set_output_value(0, *v);
  }
  return Status::Ok();
}

// Slice (opset >= 10) of rank 1 to 8 with at most 8 sliced axes, the detectors' shape work inside
// If/Loop bodies, without a heap allocation: parameters and strides on the stack, the output renewed
// over the node's last one (tests/noalloc). False when it is not this case or a parameter is wrong
// (the general kernel runs and reports it).
bool slice_in_place(KernelContext& ctx) {
  constexpr size_t kMax = 8;
  const Tensor& x = ctx.input(0);
  const size_t rank = static_cast<size_t>(x.rank());
  if (ctx.opset() < 10 || x.dtype() == DataType::kString || !x.raw() || rank == 0 || rank > kMax || !ctx.has_input(1) ||
      !ctx.has_input(2) || ctx.outputs.empty())
    return false;
  auto read = [&](size_t k, int64_t* v, size_t& n) {
    const Tensor& t = ctx.input(k);
    if (!dtype_is_integer(t.dtype()) || t.rank() > 1 || t.numel() > static_cast<int64_t>(kMax)) return false;
    n = static_cast<size_t>(t.numel());
    for (size_t i = 0; i < n; ++i) v[i] = t.get_i64(static_cast<int64_t>(i));
    return true;
  };
  int64_t starts[kMax], ends[kMax], axes[kMax], steps[kMax];
  size_t n = 0, m = 0;
  if (!read(1, starts, n) || !read(2, ends, m) || m != n) return false;
  if (ctx.has_input(3)) {
    if (!read(3, axes, m) || m != n) return false;
  } else {
    for (size_t i = 0; i < n; ++i) axes[i] = static_cast<int64_t>(i);
  }
  if (ctx.has_input(4)) {
    if (!read(4, steps, m) || m != n) return false;
  } else {
    for (size_t i = 0; i < n; ++i) steps[i] = 1;
  }
  int64_t out_shape[kMax], strides[kMax], in_strides[kMax];
  bool seen[kMax] = {};
  for (size_t i = rank, st = 1; i-- > 0;) {
    in_strides[i] = static_cast<int64_t>(st);
    st *= static_cast<size_t>(x.dim(static_cast<int64_t>(i)));
  }
  for (size_t i = 0; i < rank; ++i) out_shape[i] = x.dim(static_cast<int64_t>(i)), strides[i] = in_strides[i];
  int64_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    int64_t a = axes[i] < 0 ? axes[i] + static_cast<int64_t>(rank) : axes[i];
    if (a < 0 || a >= static_cast<int64_t>(rank) || seen[a] || steps[i] == 0) return false;
    seen[a] = true;
    Result<SliceAxis> r = slice_axis(x.dim(a), starts[i], ends[i], steps[i]);
    if (!r.ok()) return false;
    const SliceAxis& s = r.value();
    out_shape[a] = s.len;
    if (s.len > 0) offset += s.start * in_strides[a];
    strides[a] = s.len > 1 ? s.step * in_strides[a] : 0;  // one element: the step never applies
  }
  Tensor& out = ctx.outputs[0].tensor;
  ctx.outputs[0].kind = Value::Kind::kTensor;
  out.renew(x.dtype(), std::span<const int64_t>(out_shape, rank));
  const int64_t total = out.numel();
  const size_t es = dtype_size(x.dtype());
  const auto* src = static_cast<const uint8_t*>(x.raw());
  auto* dst = static_cast<uint8_t*>(out.raw());
  int64_t idx[kMax] = {}, si = offset;
  for (int64_t di = 0; di < total; ++di) {
    std::memcpy(dst + static_cast<size_t>(di) * es, src + static_cast<size_t>(si) * es, es);
    for (size_t k = rank; k-- > 0;) {
      if (++idx[k] < out_shape[k]) {
        si += strides[k];
        break;
      }
      si -= strides[k] * (out_shape[k] - 1);
      idx[k] = 0;
    }
  }
  return true;
}

Status slice_kernel(KernelContext& ctx) {
  if (slice_in_place(ctx)) return Status::Ok();
  const Tensor& x = ctx.input(0);
  SliceParams p;
  if (ctx.opset() < 10) {
    p.starts = ctx.node.attr_ints("starts");
    p.ends = ctx.node.attr_ints("ends");
    p.has_axes = ctx.node.attr("axes") != nullptr;
    p.axes = ctx.node.attr_ints("axes");
  } else {
    bool present = false;
    if (!ctx.has_input(1) || !ctx.has_input(2)) return ctx.error("starts and ends are required");
    KILN_ASSIGN_OR_RETURN(p.starts, ints_attr_or_input(ctx, "starts", 1, 10, &present));
    KILN_ASSIGN_OR_RETURN(p.ends, ints_attr_or_input(ctx, "ends", 2, 10, &present));
    KILN_ASSIGN_OR_RETURN(p.axes, ints_attr_or_input(ctx, "axes", 3, 10, &p.has_axes));
    KILN_ASSIGN_OR_RETURN(p.steps, ints_attr_or_input(ctx, "steps", 4, 10, &p.has_steps));
  }
  Status st = check_slice_params(p, x.rank());
  if (!st.ok()) return ctx.error(st.message());
  Dims in_strides = strides_of(x.shape()), out_shape = x.shape(), strides = in_strides;
  int64_t offset = 0;
  for (size_t i = 0; i < p.axes.size(); ++i) {
    size_t a = static_cast<size_t>(p.axes[i]);
    KILN_ASSIGN_OR_RETURN(SliceAxis s, slice_axis(x.dim(p.axes[i]), p.starts[i], p.ends[i], p.steps[i]));
    out_shape[a] = s.len;
    if (s.len > 0) offset += s.start * in_strides[a];
    strides[a] = s.len > 1 ? s.step * in_strides[a] : 0;  // one element: the step never applies
  }
  ctx.set_output(0, take_strided(x, out_shape, strides, offset));
  return Status::Ok();
}

// ---------------------------------------------------------------- Tile

Status tile_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  std::vector<Dim> out = in.dims;
  if (ctx.opset() < 6) {  // Tile-1: tiles and axis scalars
    std::vector<int64_t> tiles, axis;
    if (known_ints(ctx, 1, &tiles) && known_ints(ctx, 2, &axis) && tiles.size() == 1 && axis.size() == 1) {
      auto a = normalize_axis(axis[0], static_cast<int64_t>(in.rank()));
      if (!a.ok()) return ctx.error(a.status().message());
      Dim& d = out[static_cast<size_t>(*a)];
      d = d.known() ? dim_times(d, tiles[0]) : (tiles[0] == 1 ? d : ctx.new_symbol());
    } else {
      for (Dim& d : out) d = ctx.new_symbol();
    }
    ctx.set_output(0, dt, SymShape(out));
    return Status::Ok();
  }
  std::vector<int64_t> reps;
  if (!known_ints(ctx, 1, &reps)) {
    for (Dim& d : out) d = ctx.new_symbol();
  } else {
    if (reps.size() != in.rank())
      return ctx.error(
          str_cat("repeats ", dims_str(reps), " must have one entry per input dim (rank ", in.rank(), ")"));
    for (size_t i = 0; i < out.size(); ++i) {
      if (reps[i] < 0) return ctx.error(str_cat("repeats ", dims_str(reps), " has a negative entry"));
      Dim& d = out[i];
      if (d.known() && reps[i] <= kMaxTensorElements)
        d = dim_times(d, reps[i]);
      else if (reps[i] == 0)
        d = Dim(0);
      else if (reps[i] != 1)
        d = ctx.new_symbol();
    }
  }
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

Status tile_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> reps(static_cast<size_t>(x.rank()), 1);
  if (ctx.opset() < 6) {
    if (ctx.num_inputs() < 3) return ctx.error("Tile-1 takes input, tiles and axis");
    const Tensor &t = ctx.input(1), &a = ctx.input(2);
    if (t.numel() != 1 || a.numel() != 1 || !dtype_is_integer(t.dtype()) || !dtype_is_integer(a.dtype()))
      return ctx.error(str_cat("tiles and axis must be integer scalars, got ", t.describe(), " and ", a.describe()));
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(a.get_i64(0), x.rank()));
    reps[static_cast<size_t>(axis)] = t.get_i64(0);
  } else {
    const Tensor& r = ctx.input(1);
    if (!dtype_is_integer(r.dtype()) || r.rank() != 1 || r.numel() != x.rank())
      return ctx.error(str_cat("repeats must be a 1-D integer tensor with one entry per input dim, got ", r.describe(),
                               " for input ", x.describe()));
    reps = to_i64_vector(r);
  }
  Dims out_shape;
  for (int64_t i = 0; i < x.rank(); ++i) {
    int64_t rep = reps[static_cast<size_t>(i)];
    if (rep < 0) return ctx.error(str_cat("repeats ", dims_str(reps), " has a negative entry"));
    if (x.dim(i) != 0 && rep > kMaxTensorElements / x.dim(i))
      return ctx.error(str_cat("repeats ", dims_str(reps), " make the output too large"));
    out_shape.push_back(x.dim(i) * rep);
  }
  KILN_RETURN_IF_ERROR(check_dims(out_shape, "output shape"));
  // The output seen as [rep0, d0, rep1, d1, ...]: the repeat axes have stride 0.
  Dims in_strides = strides_of(x.shape()), view, strides;
  for (int64_t i = 0; i < x.rank(); ++i) {
    view.insert(view.end(), {reps[static_cast<size_t>(i)], x.dim(i)});
    strides.insert(strides.end(), {0, in_strides[static_cast<size_t>(i)]});
  }
  ctx.set_output(0, take_strided(x, view, strides, 0).reshaped(out_shape));
  return Status::Ok();
}

// ---------------------------------------------------------------- DepthToSpace, SpaceToDepth

Status space_depth_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  int64_t b = ctx.node.attr_int("blocksize", 0);
  if (b <= 0) return ctx.error(str_cat("blocksize must be positive, got ", b));
  if (!in.rank_known) {
    ctx.set_output(0, dt, SymShape({ctx.new_symbol(), ctx.new_symbol(), ctx.new_symbol(), ctx.new_symbol()}));
    return Status::Ok();
  }
  if (in.rank() != 4) return ctx.error(str_cat("input must be 4-D (N, C, H, W), got ", in.str()));
  bool to_space = ctx.node.op_type == "DepthToSpace";
  std::vector<Dim> out = {in.dims[0], Dim(), Dim(), Dim()};
  const Dim &c = in.dims[1], &h = in.dims[2], &w = in.dims[3];
  if (b > (int64_t{1} << 20)) return ctx.error(str_cat("blocksize ", b, " is absurdly large"));
  if (to_space) {
    if (c.known() && c.value % (b * b) != 0)
      return ctx.error(str_cat("channels ", c.value, " are not divisible by blocksize^2 = ", b * b));
    out[1] = c.known() ? Dim(c.value / (b * b)) : Dim();
    out[2] = dim_times(h, b);
    out[3] = dim_times(w, b);
  } else {
    if ((h.known() && h.value % b != 0) || (w.known() && w.value % b != 0))
      return ctx.error(str_cat("spatial dims of ", in.str(), " are not divisible by blocksize ", b));
    out[1] = dim_times(dim_times(c, b), b);
    out[2] = h.known() ? Dim(h.value / b) : Dim();
    out[3] = w.known() ? Dim(w.value / b) : Dim();
  }
  for (Dim& d : out) d = dim_or_symbol(ctx, d);
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

Status depth_to_space_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t b = ctx.node.attr_int("blocksize", 0);
  if (x.rank() != 4) return ctx.error(str_cat("input must be 4-D (N, C, H, W), got ", x.describe()));
  if (b <= 0 || b > 1 << 20 || x.dim(1) % (b * b) != 0)
    return ctx.error(str_cat("channels of ", x.describe(), " are not divisible by blocksize^2 (blocksize ", b, ")"));
  std::string mode = ctx.node.attr_string("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") return ctx.error(str_cat("mode must be DCR or CRD, got '", mode, "'"));
  int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3), oc = c / (b * b);
  // The output [N, C', H*b, W*b] seen as [N, C', H, b, W, b].
  Dims view = {n, oc, h, b, w, b}, strides;
  if (mode == "DCR")
    strides = {c * h * w, h * w, w, b * oc * h * w, 1, oc * h * w};
  else
    strides = {c * h * w, b * b * h * w, w, b * h * w, 1, h * w};
  Tensor out = take_strided(x, view, strides, 0);
  ctx.set_output(0, out.reshaped({n, oc, h * b, w * b}));
  return Status::Ok();
}

Status space_to_depth_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t b = ctx.node.attr_int("blocksize", 0);
  if (x.rank() != 4) return ctx.error(str_cat("input must be 4-D (N, C, H, W), got ", x.describe()));
  if (b <= 0 || x.dim(2) % b != 0 || x.dim(3) % b != 0)
    return ctx.error(str_cat("spatial dims of ", x.describe(), " are not divisible by blocksize ", b));
  int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3), oh = h / b, ow = w / b;
  // The output [N, C*b*b, H/b, W/b] seen as [N, b, b, C, H/b, W/b].
  Dims view = {n, b, b, c, oh, ow};
  Dims strides = {c * h * w, w, 1, h * w, b * w, b};
  Tensor out = take_strided(x, view, strides, 0);
  ctx.set_output(0, out.reshaped({n, c * b * b, oh, ow}));
  return Status::Ok();
}

// ---------------------------------------------------------------- Trilu

Status trilu_infer(InferContext& ctx) {
  const SymShape& in = ctx.input_shape(0);
  if (in.rank_known && in.rank() < 2) return ctx.error(str_cat("input must have rank >= 2, got ", in.str()));
  return infer_same_as_input0(ctx);
}

Status trilu_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 2) return ctx.error(str_cat("input must have rank >= 2, got ", x.describe()));
  int64_t k = 0;
  if (ctx.has_input(1)) {
    const Tensor& kt = ctx.input(1);
    if (kt.numel() != 1 || !dtype_is_integer(kt.dtype()))
      return ctx.error(str_cat("k must be an integer scalar, got ", kt.describe()));
    k = kt.get_i64(0);
  }
  bool upper = ctx.node.attr_int("upper", 1) != 0;
  int64_t rows = x.dim(x.rank() - 2), cols = x.dim(x.rank() - 1);
  std::vector<int64_t> idx(static_cast<size_t>(x.numel()));
  for (int64_t e = 0; e < x.numel(); ++e) {
    int64_t i = (e / cols) % rows, j = e % cols;
    int64_t diff = j - i;  // keep when diff >= k (upper) or diff <= k (lower)
    bool keep = upper ? diff >= k : diff <= k;
    idx[static_cast<size_t>(e)] = keep ? e : -1;
  }
  ctx.set_output(0, take_elements(x, x.shape(), idx));
  return Status::Ok();
}

// ---------------------------------------------------------------- ReverseSequence

Status reverse_sequence_infer(InferContext& ctx) { return infer_same_as_input0(ctx); }

Status reverse_sequence_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& lens_t = ctx.input(1);
  int64_t ta = ctx.node.attr_int("time_axis", 0), ba = ctx.node.attr_int("batch_axis", 1);
  if (x.rank() < 2) return ctx.error(str_cat("input must have rank >= 2, got ", x.describe()));
  if ((ta != 0 && ta != 1) || (ba != 0 && ba != 1) || ta == ba)
    return ctx.error(str_cat("time_axis (", ta, ") and batch_axis (", ba, ") must be 0 and 1 in some order"));
  std::vector<int64_t> lens = to_i64_vector(lens_t);
  if (!dtype_is_integer(lens_t.dtype()) || lens_t.rank() != 1 || lens_t.numel() != x.dim(ba))
    return ctx.error(
        str_cat("sequence_lens must be 1-D with one entry per batch (", x.dim(ba), "), got ", lens_t.describe()));
  for (int64_t l : lens)
    if (l < 0 || l > x.dim(ta))
      return ctx.error(str_cat("sequence_lens ", dims_str(lens), " has an entry outside [0, ", x.dim(ta), "]"));
  Dims strides = strides_of(x.shape());
  std::vector<int64_t> idx;
  idx.reserve(static_cast<size_t>(x.numel()));
  for_each_index(x.shape(), [&](const Dims& o) {
    int64_t t = o[static_cast<size_t>(ta)], len = lens[static_cast<size_t>(o[static_cast<size_t>(ba)])];
    int64_t src_t = t < len ? len - 1 - t : t;
    int64_t src = 0;
    for (size_t k = 0; k < o.size(); ++k) src += (static_cast<int64_t>(k) == ta ? src_t : o[k]) * strides[k];
    idx.push_back(src);
  });
  ctx.set_output(0, take_elements(x, x.shape(), idx));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Transpose, 1, transpose_infer, transpose_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Concat, 1, concat_infer, concat_kernel, 1, -1);
KILN_REGISTER_OP_ARITY("", Split, 1, split_infer, split_kernel, 1, 2);
KILN_REGISTER_OP_ARITY("", Slice, 1, slice_infer, slice_kernel, 1, 5);
KILN_REGISTER_OP_ARITY("", Tile, 1, tile_infer, tile_kernel, 2, 3);
KILN_REGISTER_OP_ARITY("", DepthToSpace, 1, space_depth_infer, depth_to_space_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", SpaceToDepth, 1, space_depth_infer, space_to_depth_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", Trilu, 14, trilu_infer, trilu_kernel, 1, 2);
KILN_REGISTER_OP_ARITY("", ReverseSequence, 10, reverse_sequence_infer, reverse_sequence_kernel, 2, 2);

}  // namespace kiln::ops
