#include "ops/conv_util.h"

#include <algorithm>

namespace kiln::ops {

namespace {

Status check_len(const ir::Node& node, const char* name, const Dims& v, size_t want) {
  if (v.size() != want)
    return InvalidModel(node.where(), "attribute '", name, "' has ", v.size(), " values ", dims_str(v), ", expected ",
                        want, " (one per spatial dim)");
  return Status::Ok();
}

Status check_range(const ir::Node& node, const char* name, const Dims& v, int64_t lo) {
  for (int64_t x : v)
    if (x < lo || x > kMaxWindowAttr)
      return InvalidModel(node.where(), "attribute '", name, "' = ", dims_str(v), " has value ", x, " outside [", lo,
                          ", ", kMaxWindowAttr, "]");
  return Status::Ok();
}

}  // namespace

WindowOptions window_options(const std::string& op_type, int opset) {
  WindowOptions o;
  if (op_type == "MaxPool" || op_type == "AveragePool" || op_type == "LpPool") {
    o.kernel_required = true;
    if (op_type == "MaxPool") {
      o.has_dilations = opset >= 10;
      o.has_ceil_mode = opset >= 10;
    } else if (op_type == "AveragePool") {
      o.has_dilations = opset >= 19;
      o.has_ceil_mode = opset >= 10;
    } else {
      o.has_dilations = opset >= 18;
      o.has_ceil_mode = opset >= 18;
    }
  } else if (op_type == "MaxUnpool") {
    o.kernel_required = true;
    o.has_dilations = false;
  } else if (op_type == "ConvTranspose") {
    o.transpose = true;
  }
  return o;
}

Result<Window> read_window(const ir::Node& node, size_t rank, const Dims* kernel_from_weights,
                           const WindowOptions& opts) {
  Window w;
  w.rank = rank;
  if (const ir::Attribute* a = node.attr("kernel_shape")) {
    w.kernel = a->ints;
    KILN_RETURN_IF_ERROR(check_len(node, "kernel_shape", w.kernel, rank));
    KILN_RETURN_IF_ERROR(check_range(node, "kernel_shape", w.kernel, 1));
    if (kernel_from_weights && *kernel_from_weights != w.kernel)
      return InvalidModel(node.where(), "kernel_shape ", dims_str(w.kernel),
                          " disagrees with the weights' spatial dims ", dims_str(*kernel_from_weights));
  } else if (kernel_from_weights) {
    w.kernel = *kernel_from_weights;
    KILN_RETURN_IF_ERROR(check_range(node, "kernel_shape (from W)", w.kernel, 0));
  } else if (opts.kernel_required) {
    return InvalidModel(node.where(), "the required attribute 'kernel_shape' is missing");
  }
  w.strides = node.attr_ints("strides", Dims(rank, 1));
  if (w.strides.empty()) w.strides.assign(rank, 1);
  KILN_RETURN_IF_ERROR(check_len(node, "strides", w.strides, rank));
  KILN_RETURN_IF_ERROR(check_range(node, "strides", w.strides, 1));
  w.dilations = opts.has_dilations ? node.attr_ints("dilations", Dims(rank, 1)) : Dims(rank, 1);
  if (w.dilations.empty()) w.dilations.assign(rank, 1);
  KILN_RETURN_IF_ERROR(check_len(node, "dilations", w.dilations, rank));
  KILN_RETURN_IF_ERROR(check_range(node, "dilations", w.dilations, 1));
  w.auto_pad = node.attr_string("auto_pad", "NOTSET");
  if (w.auto_pad.empty()) w.auto_pad = "NOTSET";
  if (w.auto_pad != "NOTSET" && w.auto_pad != "SAME_UPPER" && w.auto_pad != "SAME_LOWER" && w.auto_pad != "VALID")
    return InvalidModel(node.where(), "auto_pad '", w.auto_pad,
                        "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
  Dims pads = node.attr_ints("pads", Dims(2 * rank, 0));
  if (pads.empty()) pads.assign(2 * rank, 0);
  if (pads.size() != 2 * rank)
    return InvalidModel(node.where(), "attribute 'pads' has ", pads.size(), " values ", dims_str(pads), ", expected ",
                        2 * rank, " (begin and end per spatial dim)");
  KILN_RETURN_IF_ERROR(check_range(node, "pads", pads, 0));
  w.pad_begin.assign(pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(rank));
  w.pad_end.assign(pads.begin() + static_cast<std::ptrdiff_t>(rank), pads.end());
  w.ceil_mode = opts.has_ceil_mode && node.attr_int("ceil_mode", 0) != 0;
  return w;
}

Result<int64_t> window_output(const Window& w, size_t d, int64_t in, int64_t* pad_begin, int64_t* pad_end) {
  int64_t s = w.strides[d], ext = w.extent(d);
  int64_t pb = 0, pe = 0, out = 0;
  if (w.kernel[d] < 1) return InvalidArgument("kernel extent along spatial dim ", d, " is ", w.kernel[d]);
  if (in < 0 || in > kMaxExtent) return InvalidArgument("spatial dim ", d, " has invalid extent ", in);
  if (w.auto_pad == "SAME_UPPER" || w.auto_pad == "SAME_LOWER") {
    out = ceil_div(in, s);
    int64_t total = std::max<int64_t>(0, (out - 1) * s + ext - in);
    if (w.auto_pad == "SAME_UPPER") {
      pb = total / 2;
      pe = total - pb;
    } else {
      pe = total / 2;
      pb = total - pe;
    }
  } else if (w.auto_pad == "VALID") {
    if (in < ext)
      return InvalidArgument("spatial dim ", d, ": input extent ", in, " is smaller than the (dilated) kernel extent ",
                             ext, " with auto_pad VALID");
    out = (in - ext) / s + 1;
  } else {
    pb = w.pad_begin[d];
    pe = w.pad_end[d];
    int64_t padded = in + pb + pe;
    if (padded < ext)
      return InvalidArgument("spatial dim ", d, ": padded input extent ", padded, " (", in, " + pads ", pb, "+", pe,
                             ") is smaller than the (dilated) kernel extent ", ext);
    if (w.ceil_mode) {
      out = ceil_div(padded - ext, s) + 1;
      // The last window must start inside the input or its leading padding.
      if ((out - 1) * s >= in + pb) --out;
    } else {
      out = (padded - ext) / s + 1;
    }
  }
  if (pad_begin) *pad_begin = pb;
  if (pad_end) *pad_end = pe;
  return out;
}

Result<Dim> window_output_sym(const Window& w, size_t d, const Dim& in) {
  if (!in.known() || in.value > kMaxExtent || d >= w.kernel.size()) return Dim();
  KILN_ASSIGN_OR_RETURN(int64_t out, window_output(w, d, in.value, nullptr, nullptr));
  return Dim(out);
}

void valid_output_range(int64_t offset, int64_t stride, int64_t in, int64_t out, int64_t* lo, int64_t* hi) {
  // o * stride + offset >= 0  <=>  o >= ceil(-offset / stride)
  int64_t l = offset >= 0 ? 0 : ceil_div(-offset, stride);
  // o * stride + offset < in  <=>  o < ceil((in - offset) / stride)
  int64_t h = in - offset <= 0 ? 0 : ceil_div(in - offset, stride);
  l = std::min(l, out);
  h = std::min(h, out);
  *lo = l;
  *hi = std::max(l, h);
}

Result<WindowGeometry> resolve_window(const ir::Node& node, const Dims& input_shape, const Dims* weight_shape) {
  return resolve_window(node, input_shape, weight_shape, window_options(node.op_type, node.opset));
}

Result<WindowGeometry> resolve_window(const ir::Node& node, const Dims& input_shape, const Dims* weight_shape,
                                      const WindowOptions& opts) {
  if (input_shape.size() < 3)
    return InvalidArgument(node.where(), "input X must have rank >= 3 (N, C, spatial...), got shape ",
                           dims_str(input_shape));
  if (weight_shape && weight_shape->size() != input_shape.size())
    return InvalidArgument(node.where(), "weights W ", dims_str(*weight_shape), " must have the rank of X ",
                           dims_str(input_shape));
  const size_t n = input_shape.size() - 2;
  Dims wk;
  if (weight_shape) wk.assign(weight_shape->begin() + 2, weight_shape->end());
  WindowGeometry g;
  KILN_ASSIGN_OR_RETURN(g.window, read_window(node, n, weight_shape ? &wk : nullptr, opts));
  const Window& w = g.window;
  Dims out_shape, out_pad;
  if (opts.transpose) {
    KILN_ASSIGN_OR_RETURN(out_shape, transpose_output_shape(node, n));
    KILN_ASSIGN_OR_RETURN(out_pad, transpose_output_padding(node, n));
  }
  for (size_t d = 0; d < n; ++d) {
    const int64_t in = input_shape[d + 2];
    int64_t o = 0, pb = 0, pe = 0;
    if (opts.transpose) {
      if (w.kernel.size() <= d || w.kernel[d] < 1)
        return InvalidArgument(node.where(), "kernel ", dims_str(w.kernel), " has an empty dim");
      if (Status st = transpose_dim(w, d, in, out_shape, out_pad, &o, &pb); !st.ok())
        return InvalidArgument(node.where(), st.message());
      pe = (in - 1) * w.strides[d] + w.extent(d) - pb - o;
    } else {
      if (w.kernel.size() <= d) return InvalidArgument(node.where(), "the kernel's shape is unknown");
      auto r = window_output(w, d, in, &pb, &pe);
      if (!r.ok()) return InvalidArgument(node.where(), r.status().message());
      o = *r;
    }
    g.in.push_back(in);
    g.out.push_back(o);
    g.kernel.push_back(w.kernel[d]);
    g.strides.push_back(w.strides[d]);
    g.dilations.push_back(w.dilations[d]);
    g.pad_begin.push_back(pb);
    g.pad_end.push_back(pe);
  }
  return g;
}

Status check_nchw(const Tensor& t, const char* what, const char* input_name) {
  if (t.rank() < 3)
    return InvalidArgument(what, ": input '", input_name, "' must have rank >= 3 (N, C, spatial...), got ",
                           t.describe());
  return Status::Ok();
}

Result<int64_t> checked_numel(const Dims& d) {
  constexpr int64_t kMaxElements = int64_t{1} << 32;
  int64_t n = 1;
  for (int64_t x : d) {
    if (x < 0) return InvalidArgument("negative dimension in shape ", dims_str(d));
    if (x == 0) return int64_t{0};
  }
  for (int64_t x : d) {
    if (n > kMaxElements / x) return InvalidArgument("shape ", dims_str(d), " has more than 2^32 elements");
    n *= x;
  }
  return n;
}

// output_shape may list only the spatial dims or the whole shape; returns the spatial part.
Result<Dims> transpose_output_shape(const ir::Node& node, size_t n) {
  Dims os = node.attr_ints("output_shape");
  if (os.empty()) return os;
  if (os.size() == n + 2) os.erase(os.begin(), os.begin() + 2);
  if (os.size() != n)
    return InvalidModel(node.where(), "output_shape ", dims_str(os), " must have ", n, " (spatial) values");
  for (int64_t v : os)
    if (v < 0 || v > (int64_t{1} << 40))
      return InvalidModel(node.where(), "output_shape ", dims_str(os), " is invalid");
  return os;
}

Result<Dims> transpose_output_padding(const ir::Node& node, size_t n) {
  Dims op = node.attr_ints("output_padding", Dims(n, 0));
  if (op.empty()) op.assign(n, 0);
  if (op.size() != n)
    return InvalidModel(node.where(), "output_padding ", dims_str(op), " must have ", n,
                        " values (one per spatial dim)");
  for (int64_t v : op)
    if (v < 0 || v > kMaxWindowAttr) return InvalidModel(node.where(), "output_padding ", dims_str(op), " is invalid");
  return op;
}

// Output extent and begin pad of spatial dim d for input extent `in`.
Status transpose_dim(const Window& w, size_t d, int64_t in, const Dims& out_shape, const Dims& out_pad, int64_t* out,
                     int64_t* pad_begin) {
  if (in < 0 || in > kMaxExtent) return InvalidArgument("spatial dim ", d, " has invalid extent ", in);
  const int64_t s = w.strides[d], ext = w.extent(d);
  // Output extent before removing pads (computed wide: stride * in can exceed 64 bits).
  const __int128 wide = static_cast<__int128>(s) * (in - 1) + out_pad[d] + ext;
  if (wide > kMaxExtent)
    return InvalidArgument("spatial dim ", d, ": output extent ", static_cast<double>(wide), " is too large");
  const int64_t natural = static_cast<int64_t>(wide);
  const bool same = w.auto_pad == "SAME_UPPER" || w.auto_pad == "SAME_LOWER";
  if (!out_shape.empty() || same) {
    int64_t o = !out_shape.empty() ? out_shape[d] : in * s;
    int64_t total = std::max<int64_t>(0, natural - o);
    *pad_begin = w.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    *out = o;
    return Status::Ok();
  }
  int64_t pb = w.auto_pad == "VALID" ? 0 : w.pad_begin[d], pe = w.auto_pad == "VALID" ? 0 : w.pad_end[d];
  int64_t o = natural - pb - pe;
  if (o < 0)
    return InvalidArgument("spatial dim ", d, ": output extent ", o, " is negative (pads ", pb, "+", pe,
                           " exceed the full extent ", natural, ")");
  *pad_begin = pb;
  *out = o;
  return Status::Ok();
}

}  // namespace kiln::ops
