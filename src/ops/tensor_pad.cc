// Padding and cropping: Pad (constant / reflect / edge / wrap, negative pads crop), CenterCropPad,
// and Col2Im (the inverse of im2col: sums sliding blocks back into an image).
#include <algorithm>

#include "ops/movement_geometry.h"
#include "ops/tensor_util.h"

namespace kiln::ops {

const char* pads_attr_name(int opset) { return opset < 2 ? "paddings" : "pads"; }

Result<PadSpec> expand_pads(const std::vector<int64_t>& pads, bool has_axes, const std::vector<int64_t>& axes_in,
                            int64_t r) {
  std::vector<int64_t> axes = axes_in;
  if (!has_axes) {
    axes.clear();
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  }
  KILN_ASSIGN_OR_RETURN(axes, normalize_axes(axes, r));
  if (pads.size() != 2 * axes.size())
    return InvalidArgument("pads ", dims_str(pads), " must have 2 entries per padded axis (", axes.size(), " axes)");
  PadSpec s;
  s.begin.assign(static_cast<size_t>(r), 0);
  s.end.assign(static_cast<size_t>(r), 0);
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t b = pads[i], e = pads[i + axes.size()];
    if (b < -kMaxTensorElements || b > kMaxTensorElements || e < -kMaxTensorElements || e > kMaxTensorElements)
      return InvalidArgument("pads ", dims_str(pads), " has an entry out of range");
    s.begin[static_cast<size_t>(axes[i])] = b;
    s.end[static_cast<size_t>(axes[i])] = e;
  }
  return s;
}

// Source coordinate of output coordinate o along one axis (-1: the fill value).
// Size of one padded axis (negative pads crop), or why it cannot be padded.
Result<int64_t> pad_axis_size(int64_t d, int64_t b, int64_t e, const std::string& mode) {
  int64_t crop_lo = std::max<int64_t>(-b, 0), crop_hi = std::max<int64_t>(-e, 0);
  int64_t dd = d - crop_lo - crop_hi, pb = std::max<int64_t>(b, 0), pe = std::max<int64_t>(e, 0);
  if (dd < 0) return InvalidArgument("negative pads (", b, ", ", e, ") crop more than the axis size ", d);
  int64_t n = 0;
  if (__builtin_add_overflow(dd, pb, &n) || __builtin_add_overflow(n, pe, &n) || n > (int64_t{1} << 31))
    return InvalidArgument("pads (", b, ", ", e, ") make axis of size ", d, " larger than 2^31");
  if (mode != "constant" && dd == 0 && n > 0) return InvalidArgument("cannot pad an empty axis in '", mode, "' mode");
  return n;
}

Result<std::vector<int64_t>> pad_axis_map(int64_t d, int64_t b, int64_t e, const std::string& mode) {
  KILN_ASSIGN_OR_RETURN(int64_t n, pad_axis_size(d, b, e, mode));
  int64_t crop_lo = std::max<int64_t>(-b, 0), crop_hi = std::max<int64_t>(-e, 0);
  int64_t dd = d - crop_lo - crop_hi, pb = std::max<int64_t>(b, 0);
  std::vector<int64_t> map(static_cast<size_t>(n));
  for (int64_t o = 0; o < n; ++o) {
    int64_t i = o - pb;
    if (i < 0 || i >= dd) {
      if (mode == "constant") {
        i = -1;
      } else if (mode == "edge") {
        i = std::clamp<int64_t>(i, 0, dd - 1);
      } else if (mode == "wrap") {
        i = ((i % dd) + dd) % dd;
      } else {  // reflect: mirror without repeating the edge
        if (dd == 1) {
          i = 0;
        } else {
          int64_t p = 2 * (dd - 1);
          i = ((i % p) + p) % p;
          if (i >= dd) i = p - i;
        }
      }
    }
    map[static_cast<size_t>(o)] = i < 0 ? -1 : i + crop_lo;
  }
  return map;
}

namespace {

// ---------------------------------------------------------------- Pad

Status pad_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  int64_t r = static_cast<int64_t>(in.rank());
  std::vector<int64_t> pads, axes;
  bool has_axes = false, known = true;
  if (ctx.opset() < 11) {
    pads = ctx.node.attr_ints(pads_attr_name(ctx.opset()));
  } else {
    known = known_ints(ctx, 1, &pads);
    if (ctx.opset() >= 18 && ctx.has_input(3)) {
      has_axes = true;
      known = known && known_ints(ctx, 3, &axes);
    }
  }
  std::vector<Dim> out = in.dims;
  if (!known) {
    for (Dim& d : out) d = ctx.new_symbol();
    ctx.set_output(0, dt, SymShape(out));
    return Status::Ok();
  }
  auto spec = expand_pads(pads, has_axes, axes, r);
  if (!spec.ok()) return ctx.error(spec.status().message());
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t add = 0, total = 0;
    if (__builtin_add_overflow(spec->begin[i], spec->end[i], &add)) return ctx.error("pads overflow int64");
    if (out[i].known()) {
      if (__builtin_add_overflow(out[i].value, add, &total) || total < 0)
        return ctx.error(str_cat("pads ", dims_str(pads), " crop dim ", i, " of ", in.str(), " below zero"));
      out[i] = Dim(total);
    } else if (add != 0) {
      out[i] = ctx.new_symbol();
    }
  }
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

// A tensor of `shape`, each element from per-axis source coordinate maps (-1 anywhere: fill).
Tensor take_by_axis_maps(const Tensor& x, const std::vector<std::vector<int64_t>>& maps, const Tensor* fill) {
  Dims out_shape;
  for (const auto& m : maps) out_shape.push_back(static_cast<int64_t>(m.size()));
  Dims strides = strides_of(x.shape());
  std::vector<int64_t> idx;
  idx.reserve(static_cast<size_t>(dims_numel(out_shape)));
  for_each_index(out_shape, [&](const Dims& o) {
    int64_t src = 0;
    for (size_t k = 0; k < o.size(); ++k) {
      int64_t c = maps[k][static_cast<size_t>(o[k])];
      if (c < 0) {
        src = -1;
        break;
      }
      src += c * strides[k];
    }
    idx.push_back(src);
  });
  return take_elements(x, out_shape, idx, fill);
}

Status pad_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::string mode = ctx.node.attr_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" && !(mode == "wrap" && ctx.opset() >= 19))
    return ctx.error(str_cat("unknown mode '", mode, "'"));
  std::vector<int64_t> pads, axes;
  bool has_axes = false;
  Tensor fill;
  if (ctx.opset() < 11) {
    pads = ctx.node.attr_ints(pads_attr_name(ctx.opset()));
    fill = Tensor(x.dtype(), {1});
    if (x.dtype() != DataType::kString) fill.set_f64(0, ctx.node.attr_float("value", 0.0f));
  } else {
    if (!ctx.has_input(1)) return ctx.error("pads input is required");
    const Tensor& p = ctx.input(1);
    if (!dtype_is_integer(p.dtype()) || p.rank() != 1)
      return ctx.error(str_cat("pads must be a 1-D integer tensor, got ", p.describe()));
    pads = to_i64_vector(p);
    if (ctx.has_input(2) && ctx.input(2).numel() > 0) {
      fill = ctx.input(2);
      if (fill.dtype() != x.dtype())
        return ctx.error(
            str_cat("constant_value ", fill.describe(), " must have the input's dtype ", dtype_name(x.dtype())));
    }
    if (ctx.opset() >= 18 && ctx.has_input(3)) {
      bool present = false;
      KILN_ASSIGN_OR_RETURN(axes, ints_attr_or_input(ctx, "axes", 3, 18, &present));
      has_axes = true;
    }
  }
  KILN_ASSIGN_OR_RETURN(PadSpec spec, expand_pads(pads, has_axes, axes, x.rank()));
  // Output sizes first: the per-axis index tables are only built once the whole output is known to
  // be allocatable (an axis padded to 2^31 beside an empty axis would otherwise build a 16 GB table).
  Dims out_shape;
  for (int64_t k = 0; k < x.rank(); ++k) {
    auto n = pad_axis_size(x.dim(k), spec.begin[static_cast<size_t>(k)], spec.end[static_cast<size_t>(k)], mode);
    if (!n.ok()) return ctx.error(str_cat("dim ", k, " of ", x.describe(), ": ", n.status().message()));
    out_shape.push_back(*n);
  }
  KILN_RETURN_IF_ERROR(check_dims(out_shape, "output shape"));
  if (dims_numel(out_shape) == 0) {
    ctx.set_output(0, Tensor(x.dtype(), out_shape));
    return Status::Ok();
  }
  std::vector<std::vector<int64_t>> maps;
  for (int64_t k = 0; k < x.rank(); ++k) {
    auto m = pad_axis_map(x.dim(k), spec.begin[static_cast<size_t>(k)], spec.end[static_cast<size_t>(k)], mode);
    if (!m.ok()) return ctx.error(str_cat("dim ", k, " of ", x.describe(), ": ", m.status().message()));
    maps.push_back(std::move(m).value());
  }
  ctx.set_output(0, take_by_axis_maps(x, maps, fill.defined() ? &fill : nullptr));
  return Status::Ok();
}

// ---------------------------------------------------------------- CenterCropPad

Result<std::vector<int64_t>> crop_pad_axes(const ir::Node& node, int64_t r) {
  std::vector<int64_t> axes = node.attr_ints("axes");
  if (!node.attr("axes"))
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  return normalize_axes(axes, r);
}

Status center_crop_pad_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  auto axes = crop_pad_axes(ctx.node, static_cast<int64_t>(in.rank()));
  if (!axes.ok()) return ctx.error(axes.status().message());
  std::vector<Dim> out = in.dims;
  const SymValue* v = ctx.sym_value(1);
  if (v && v->size() != axes->size())
    return ctx.error(str_cat("shape has ", v->size(), " entries for ", axes->size(), " axes"));
  for (size_t i = 0; i < axes->size(); ++i) {
    Dim d = v ? (*v)[i].dim() : Dim();
    out[static_cast<size_t>((*axes)[i])] = dim_or_symbol(ctx, d);
  }
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

Status center_crop_pad_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& s = ctx.input(1);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, crop_pad_axes(ctx.node, x.rank()));
  if (!dtype_is_integer(s.dtype()) || s.rank() != 1 || s.numel() != static_cast<int64_t>(axes.size()))
    return ctx.error(
        str_cat("shape must be a 1-D integer tensor with one entry per axis (", axes.size(), "), got ", s.describe()));
  std::vector<int64_t> target = to_i64_vector(s);
  std::vector<std::vector<int64_t>> maps;
  for (int64_t k = 0; k < x.rank(); ++k) {
    std::vector<int64_t> m(static_cast<size_t>(x.dim(k)));
    for (int64_t o = 0; o < x.dim(k); ++o) m[static_cast<size_t>(o)] = o;
    maps.push_back(std::move(m));
  }
  Dims out_shape = x.shape();
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i], d = x.dim(a), t = target[i];
    if (t < 0 || t > kMaxTensorElements) return ctx.error(str_cat("shape ", dims_str(target), " has an invalid entry"));
    std::vector<int64_t> m(static_cast<size_t>(t));
    // Crop: keep the centre (the extra element goes to the end); pad: zeros on both sides.
    int64_t off = d >= t ? (d - t) / 2 : -((t - d) / 2);
    for (int64_t o = 0; o < t; ++o) {
      int64_t src = o + off;
      m[static_cast<size_t>(o)] = src >= 0 && src < d ? src : -1;
    }
    maps[static_cast<size_t>(a)] = std::move(m);
    out_shape[static_cast<size_t>(a)] = t;
  }
  KILN_RETURN_IF_ERROR(check_dims(out_shape, "output shape"));
  ctx.set_output(0, take_by_axis_maps(x, maps, nullptr));
  return Status::Ok();
}

// ---------------------------------------------------------------- Col2Im

Status col2im_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  int64_t n = known_length(ctx, 1);
  if (n < 0) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  std::vector<Dim> out;
  out.push_back(in.rank_known && in.rank() == 3 ? dim_or_symbol(ctx, in.dims[0]) : ctx.new_symbol());
  Dim c = ctx.new_symbol();
  std::vector<int64_t> block;
  if (in.rank_known && in.rank() == 3 && in.dims[1].known() && known_ints(ctx, 2, &block)) {
    int64_t p = 1;
    for (int64_t b : block) p *= b > 0 && b < (1 << 20) ? b : 0;
    if (p > 0 && in.dims[1].value % p == 0) c = Dim(in.dims[1].value / p);
  }
  out.push_back(c);
  const SymValue* img = ctx.sym_value(1);
  for (int64_t i = 0; i < n; ++i)
    out.push_back(img ? dim_or_symbol(ctx, (*img)[static_cast<size_t>(i)].dim()) : ctx.new_symbol());
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

Status col2im_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor &img_t = ctx.input(1), &block_t = ctx.input(2);
  if (!dtype_is_float(x.dtype())) return ctx.unsupported(str_cat("dtype ", dtype_name(x.dtype()), " is not supported"));
  if (x.rank() != 3) return ctx.error(str_cat("input must be 3-D (N, C*prod(block_shape), L), got ", x.describe()));
  if (!dtype_is_integer(img_t.dtype()) || !dtype_is_integer(block_t.dtype()) || img_t.rank() != 1 ||
      block_t.rank() != 1 || img_t.numel() != block_t.numel() || img_t.numel() == 0)
    return ctx.error(str_cat("image_shape and block_shape must be 1-D integer tensors of the same length, got ",
                             img_t.describe(), " and ", block_t.describe()));
  std::vector<int64_t> img = to_i64_vector(img_t), block = to_i64_vector(block_t);
  size_t n = img.size();
  std::vector<int64_t> dil = ctx.node.attr_ints("dilations", std::vector<int64_t>(n, 1));
  std::vector<int64_t> strides = ctx.node.attr_ints("strides", std::vector<int64_t>(n, 1));
  std::vector<int64_t> pads = ctx.node.attr_ints("pads", std::vector<int64_t>(2 * n, 0));
  if (dil.size() != n || strides.size() != n || pads.size() != 2 * n)
    return ctx.error(str_cat("dilations, strides and pads must have ", n, ", ", n, " and ", 2 * n, " entries"));
  int64_t block_size = 1, num_blocks = 1;
  Dims blocks_per_dim;
  const int64_t kLimit = int64_t{1} << 30;
  for (size_t d = 0; d < n; ++d) {
    if (img[d] <= 0 || img[d] > kLimit || block[d] <= 0 || block[d] > kLimit || dil[d] <= 0 || dil[d] > kLimit ||
        strides[d] <= 0 || strides[d] > kLimit || pads[d] < 0 || pads[d] > kLimit || pads[d + n] < 0 ||
        pads[d + n] > kLimit)
      return ctx.error(str_cat("invalid image_shape ", dims_str(img), ", block_shape ", dims_str(block),
                               ", dilations, strides or pads"));
    int64_t eff = dil[d] * (block[d] - 1) + 1;
    int64_t span = img[d] + pads[d] + pads[d + n] - eff;
    if (span < 0) return ctx.error(str_cat("block ", dims_str(block), " does not fit image ", dims_str(img)));
    blocks_per_dim.push_back(span / strides[d] + 1);
    block_size *= block[d];
    num_blocks *= blocks_per_dim.back();
    if (block_size > kLimit || num_blocks > kLimit) return ctx.error("block_shape or image_shape is too large");
  }
  if (x.dim(1) % block_size != 0)
    return ctx.error(str_cat("input dim 1 (", x.dim(1), ") is not a multiple of prod(block_shape) = ", block_size));
  if (x.dim(2) != num_blocks)
    return ctx.error(str_cat("input dim 2 (", x.dim(2), ") must equal the number of blocks ", num_blocks));
  int64_t batch = x.dim(0), channels = x.dim(1) / block_size;
  Dims out_shape = {batch, channels};
  out_shape.insert(out_shape.end(), img.begin(), img.end());
  KILN_RETURN_IF_ERROR(check_dims(out_shape, "output shape"));
  Dims img_strides = strides_of(img);
  int64_t img_size = dims_numel(img);
  std::vector<double> acc(static_cast<size_t>(dims_numel(out_shape)), 0.0);
  Dims block_dims(block.begin(), block.end());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t c = 0; c < channels; ++c) {
      int64_t kk_flat = 0;
      for_each_index(block_dims, [&](const Dims& kk) {
        int64_t row = (b * x.dim(1) + c * block_size + kk_flat) * num_blocks;
        int64_t l_flat = 0;
        for_each_index(blocks_per_dim, [&](const Dims& l) {
          int64_t pos = 0;
          bool inside = true;
          for (size_t d = 0; d < n && inside; ++d) {
            int64_t p = l[d] * strides[d] - pads[d] + kk[d] * dil[d];
            inside = p >= 0 && p < img[d];
            pos += p * img_strides[d];
          }
          if (inside) acc[static_cast<size_t>((b * channels + c) * img_size + pos)] += x.get_f64(row + l_flat);
          ++l_flat;
        });
        ++kk_flat;
      });
    }
  }
  Tensor out(x.dtype(), out_shape);
  for (size_t i = 0; i < acc.size(); ++i) out.set_f64(static_cast<int64_t>(i), acc[i]);
  ctx.set_output(0, out);
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Pad, 1, pad_infer, pad_kernel, 1, 4);
KILN_REGISTER_OP_ARITY("", CenterCropPad, 18, center_crop_pad_infer, center_crop_pad_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Col2Im, 18, col2im_infer, col2im_kernel, 3, 3);

}  // namespace kiln::ops
