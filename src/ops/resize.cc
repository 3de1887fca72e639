// Resize (opsets 10, 11, 13, 18, 19) and the deprecated Upsample (opsets 7, 9).
//
// Resizing is separable: each resized axis is processed in turn. For every output coordinate x
// along an axis, the coordinate transformation gives a source coordinate x_ori; the output is a
// weighted sum of input samples around it (one for nearest, 2 for linear, 4 for cubic, more with
// antialias when downsampling), with sample indices clamped to the input (edge padding).
//
// Versions: Upsample-7 (scales attribute) / Upsample-9 and Resize-10 (scales input) use the
// asymmetric transform and "simple" nearest rounding (floor when upsampling, ceil when
// downsampling). Resize-11 adds roi/sizes inputs and the coordinate/nearest/cubic attributes,
// Resize-18 antialias, axes and keep_aspect_ratio_policy, Resize-19 half_pixel_symmetric.
#include <algorithm>
#include <cmath>

#include "ops/conv_util.h"
#include "ops/resize_plan.h"

namespace kiln::ops {
namespace {

enum class Mode { kNearest, kLinear, kCubic };

struct ResizeAttrs {
  Mode mode = Mode::kNearest;
  std::string coord = "half_pixel";
  std::string nearest = "round_prefer_floor";  // or "simple" for Upsample / Resize-10
  double cubic_a = -0.75;
  bool exclude_outside = false;
  double extrapolation = 0.0;
  bool antialias = false;
  std::string keep_aspect = "stretch";
  std::vector<int64_t> axes;  // empty: all
};

Result<ResizeAttrs> read_attrs(const ir::Node& node) {
  ResizeAttrs a;
  const bool legacy = node.op_type == "Upsample" || node.opset < 11;
  std::string mode = node.attr_string("mode", "nearest");
  if (mode == "nearest")
    a.mode = Mode::kNearest;
  else if (mode == "linear" || mode == "bilinear")
    a.mode = Mode::kLinear;
  else if (mode == "cubic" && !legacy)
    a.mode = Mode::kCubic;
  else
    return InvalidModel(node.where(), "mode '", mode, "' is not supported (nearest, linear", legacy ? "" : ", cubic",
                        ")");
  if (legacy) {
    a.coord = "asymmetric";
    a.nearest = "simple";
    return a;
  }
  a.coord = node.attr_string("coordinate_transformation_mode", "half_pixel");
  static const char* kCoords[] = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                                  "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"};
  if (std::none_of(std::begin(kCoords), std::end(kCoords), [&](const char* c) { return a.coord == c; }))
    return InvalidModel(node.where(), "coordinate_transformation_mode '", a.coord, "' is not supported");
  a.nearest = node.attr_string("nearest_mode", "round_prefer_floor");
  if (a.nearest != "round_prefer_floor" && a.nearest != "round_prefer_ceil" && a.nearest != "floor" &&
      a.nearest != "ceil")
    return InvalidModel(node.where(), "nearest_mode '", a.nearest, "' is not supported");
  a.cubic_a = node.attr_float("cubic_coeff_a", -0.75f);
  a.exclude_outside = node.attr_int("exclude_outside", 0) != 0;
  a.extrapolation = node.attr_float("extrapolation_value", 0.0f);
  a.antialias = node.attr_int("antialias", 0) != 0;
  if (a.antialias && a.mode == Mode::kNearest)
    return InvalidModel(node.where(), "antialias is not supported with mode 'nearest'");
  a.keep_aspect = node.attr_string("keep_aspect_ratio_policy", "stretch");
  if (a.keep_aspect != "stretch" && a.keep_aspect != "not_larger" && a.keep_aspect != "not_smaller")
    return InvalidModel(node.where(), "keep_aspect_ratio_policy '", a.keep_aspect, "' is not supported");
  a.axes = node.attr_ints("axes");
  return a;
}

// Where the inputs live for this op/opset.
struct InputSlots {
  int roi = -1, scales = -1, sizes = -1;
};
InputSlots slots(const ir::Node& node) {
  if (node.op_type == "Upsample") return node.opset >= 9 ? InputSlots{-1, 1, -1} : InputSlots{};
  if (node.opset < 11) return {-1, 1, -1};
  return {1, 2, 3};
}

// Per-axis geometry: output extent, scale used by the coordinate transform, roi.
struct AxisPlan {
  int64_t in = 0, out = 0;
  double scale = 1.0, roi_start = 0.0, roi_end = 1.0;
};

Result<int64_t> scaled_extent(int64_t in, double scale) {
  double v = static_cast<double>(in) * scale;
  if (!(v >= 0) || v > static_cast<double>(int64_t{1} << 40))
    return InvalidArgument("resized extent ", in, " * ", scale, " is out of range");
  return static_cast<int64_t>(std::floor(v));
}

// Resolves scales / sizes / roi / axes into one AxisPlan per dim of X.
Result<std::vector<AxisPlan>> make_plan(const ResizeAttrs& a, const Dims& x_shape, const std::vector<double>* scales,
                                        const std::vector<int64_t>* sizes, const std::vector<double>* roi) {
  const int64_t r = static_cast<int64_t>(x_shape.size());
  std::vector<int64_t> axes;
  if (a.axes.empty()) {
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  } else {
    for (int64_t ax : a.axes) {
      KILN_ASSIGN_OR_RETURN(int64_t n, normalize_axis(ax, r));
      if (std::find(axes.begin(), axes.end(), n) != axes.end())
        return InvalidArgument("axes ", dims_str(a.axes), " repeat axis ", n);
      axes.push_back(n);
    }
  }
  const size_t na = axes.size();
  std::vector<AxisPlan> plan(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) {
    plan[static_cast<size_t>(i)].in = x_shape[static_cast<size_t>(i)];
    plan[static_cast<size_t>(i)].out = x_shape[static_cast<size_t>(i)];
  }
  if (roi && !roi->empty()) {
    if (roi->size() != 2 * na)
      return InvalidArgument("roi has ", roi->size(), " values, expected ", 2 * na,
                             " (start and end per resized axis)");
    for (size_t j = 0; j < na; ++j) {
      plan[static_cast<size_t>(axes[j])].roi_start = (*roi)[j];
      plan[static_cast<size_t>(axes[j])].roi_end = (*roi)[na + j];
    }
  }
  if (sizes) {
    if (sizes->size() != na) return InvalidArgument("sizes has ", sizes->size(), " values, expected ", na);
    for (int64_t s : *sizes)
      if (s < 0 || s > (int64_t{1} << 40)) return InvalidArgument("sizes value ", s, " is out of range");
    if (a.keep_aspect == "stretch") {
      for (size_t j = 0; j < na; ++j) {
        AxisPlan& p = plan[static_cast<size_t>(axes[j])];
        p.out = (*sizes)[j];
        p.scale = p.in > 0 ? static_cast<double>(p.out) / static_cast<double>(p.in) : 1.0;
      }
    } else {
      double scale = a.keep_aspect == "not_larger" ? INFINITY : 0.0;
      for (size_t j = 0; j < na; ++j) {
        const AxisPlan& p = plan[static_cast<size_t>(axes[j])];
        double s = p.in > 0 ? static_cast<double>((*sizes)[j]) / static_cast<double>(p.in) : 1.0;
        scale = a.keep_aspect == "not_larger" ? std::min(scale, s) : std::max(scale, s);
      }
      for (size_t j = 0; j < na; ++j) {
        AxisPlan& p = plan[static_cast<size_t>(axes[j])];
        p.scale = scale;
        p.out = static_cast<int64_t>(std::floor(scale * static_cast<double>(p.in) + 0.5));  // round half up
      }
    }
  } else if (scales) {
    if (scales->size() != na) return InvalidArgument("scales has ", scales->size(), " values, expected ", na);
    for (size_t j = 0; j < na; ++j) {
      AxisPlan& p = plan[static_cast<size_t>(axes[j])];
      p.scale = (*scales)[j];
      if (!(p.scale > 0) || !std::isfinite(p.scale))
        return InvalidArgument("scales value ", p.scale, " must be positive and finite");
      KILN_ASSIGN_OR_RETURN(p.out, scaled_extent(p.in, p.scale));
    }
  } else {
    return InvalidArgument("neither scales nor sizes is given");
  }
  return plan;
}

double source_coordinate(const ResizeAttrs& a, const AxisPlan& p, int64_t xi) {
  const double x = static_cast<double>(xi), in = static_cast<double>(p.in), s = p.scale;
  const double out_f = s * in;  // the resized length before flooring
  if (a.coord == "asymmetric") return x / s;
  if (a.coord == "half_pixel") return (x + 0.5) / s - 0.5;
  if (a.coord == "tf_half_pixel_for_nn") return (x + 0.5) / s;
  if (a.coord == "pytorch_half_pixel") return p.out > 1 ? (x + 0.5) / s - 0.5 : 0.0;
  if (a.coord == "align_corners") return out_f == 1.0 ? 0.0 : x * (in - 1) / (out_f - 1);
  if (a.coord == "half_pixel_symmetric") {
    double adjustment = static_cast<double>(p.out) / out_f;
    double offset = in / 2 * (1 - adjustment);
    return offset + (x + 0.5) / s - 0.5;
  }
  // tf_crop_and_resize
  double span = (p.roi_end - p.roi_start) * (in - 1);
  double v = out_f == 1.0 ? span / 2 : x * span / (out_f - 1);
  return v + p.roi_start * (in - 1);
}

double cubic_weight(double x, double A) {
  x = std::fabs(x);
  if (x <= 1) return ((A + 2) * x - (A + 3)) * x * x + 1;
  if (x < 2) return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
  return 0.0;
}

// Interpolation taps of one axis: for output coordinate o, taps [o*n, (o+1)*n) of (index, weight).
struct AxisTaps {
  int64_t n = 0;
  std::vector<int64_t> index;
  std::vector<double> weight;
  std::vector<char> extrapolate;  // tf_crop_and_resize: output is extrapolation_value
};

Result<AxisTaps> axis_taps(const ResizeAttrs& a, const AxisPlan& p) {
  AxisTaps t;
  const double scale = std::min(p.scale, 1.0);  // antialias widens the kernel only when downsampling
  int64_t j_start = 0;                          // taps j in [j_start, j_start + n) around p = ceil(x) - 1
  if (a.mode == Mode::kNearest) {
    t.n = 1;
  } else {
    const double reach = (a.mode == Mode::kLinear ? 1.0 : 2.0) / (a.antialias ? scale : 1.0);
    if (!(reach <= 65536)) return InvalidArgument("antialias with scale ", p.scale, " needs too many taps");
    j_start = static_cast<int64_t>(std::floor(-reach)) + 1;
    t.n = 2 - 2 * j_start;
  }
  const int64_t last = p.in - 1;
  for (int64_t o = 0; o < p.out; ++o) {
    double x = source_coordinate(a, p, o);
    t.extrapolate.push_back(a.coord == "tf_crop_and_resize" && (x < 0 || x > static_cast<double>(last)));
    if (!std::isfinite(x)) x = 0;
    x = std::clamp(x, -1e15, 1e15);
    const double base = std::ceil(x) - 1;  // the sample left of x (x itself excluded)
    const double r = x - base;             // in (0, 1]
    const int64_t pi = static_cast<int64_t>(base);
    if (a.mode == Mode::kNearest) {
      bool up;  // take pi + 1 rather than pi
      if (r == 1.0)
        up = true;  // x is an integer
      else if (a.nearest == "round_prefer_floor")
        up = r > 0.5;
      else if (a.nearest == "round_prefer_ceil")
        up = r >= 0.5;
      else if (a.nearest == "floor")
        up = false;
      else if (a.nearest == "ceil")
        up = true;
      else
        up = p.scale < 1.0;  // simple: ceil when downsampling, floor when upsampling
      t.index.push_back(std::clamp<int64_t>(up ? pi + 1 : pi, 0, std::max<int64_t>(last, 0)));
      t.weight.push_back(1.0);
      continue;
    }
    double sum = 0;
    size_t first = t.weight.size();
    for (int64_t j = j_start; j < j_start + t.n; ++j) {
      double w;
      if (a.mode == Mode::kLinear) {
        w = a.antialias ? std::clamp(1 - std::fabs((static_cast<double>(j) - r) * scale), 0.0, 1.0)
                        : 1 - std::fabs(static_cast<double>(j) - r);
      } else {
        w = cubic_weight((static_cast<double>(j) - r) * (a.antialias ? scale : 1.0), a.cubic_a);
      }
      int64_t idx = pi + j;
      if (a.exclude_outside && (idx < 0 || idx > last)) w = 0;
      t.index.push_back(std::clamp<int64_t>(idx, 0, std::max<int64_t>(last, 0)));
      t.weight.push_back(w);
      sum += w;
    }
    if ((a.antialias || a.exclude_outside) && sum != 0)
      for (size_t k = first; k < t.weight.size(); ++k) t.weight[k] /= sum;
  }
  return t;
}

// Resizes `data` (shape `shape`) along `axis` to t.out.
std::vector<double> resize_axis(const std::vector<double>& data, Dims& shape, size_t axis, const ResizeAxis& t,
                                double extrapolation) {
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < axis; ++i) outer *= shape[i];
  for (size_t i = axis + 1; i < shape.size(); ++i) inner *= shape[i];
  std::vector<double> out(static_cast<size_t>(outer * t.out * inner));
  for (int64_t b = 0; b < outer; ++b) {
    for (int64_t o = 0; o < t.out; ++o) {
      double* dst = out.data() + (b * t.out + o) * inner;
      if (t.extrapolate[static_cast<size_t>(o)]) {
        std::fill(dst, dst + inner, extrapolation);
        continue;
      }
      std::fill(dst, dst + inner, 0.0);
      for (int64_t k = 0; k < t.n; ++k) {
        double w = t.weight[static_cast<size_t>(o * t.n + k)];
        const double* src = data.data() + (b * t.in + t.index[static_cast<size_t>(o * t.n + k)]) * inner;
        for (int64_t i = 0; i < inner; ++i) dst[i] += w * src[i];
      }
    }
  }
  shape[axis] = t.out;
  return out;
}

}  // namespace

Result<ResizeGeometry> resize_geometry(const ir::Node& node, const Dims& x,
                                       const std::function<const Tensor*(size_t)>& input) {
  KILN_ASSIGN_OR_RETURN(ResizeAttrs a, read_attrs(node));
  InputSlots in = slots(node);
  auto given = [&](int slot) -> const Tensor* {
    if (slot < 0) return nullptr;
    const Tensor* t = input(static_cast<size_t>(slot));
    return t && t->numel() > 0 ? t : nullptr;
  };
  std::vector<double> scales, roi;
  std::vector<int64_t> sizes;
  bool have_scales = false, have_sizes = false;
  if (in.scales < 0) {  // Upsample-7: attribute
    for (float f : node.attr_floats("scales")) scales.push_back(f);
    have_scales = true;
  } else if (const Tensor* s = given(in.scales)) {
    if (!dtype_is_float(s->dtype())) return InvalidArgument("scales must be a float tensor, got ", s->describe());
    scales = to_f64_vector(*s);
    have_scales = true;
  }
  if (const Tensor* s = given(in.sizes)) {
    if (have_scales) return InvalidArgument("only one of scales and sizes may be given");
    if (!dtype_is_integer(s->dtype())) return InvalidArgument("sizes must be an integer tensor, got ", s->describe());
    sizes = to_i64_vector(*s);
    have_sizes = true;
  }
  if (in.roi >= 0 && a.coord == "tf_crop_and_resize") {  // roi is unused otherwise
    if (const Tensor* rt = input(static_cast<size_t>(in.roi))) {
      if (rt->numel() > 0 && !dtype_is_float(rt->dtype()))
        return InvalidArgument("roi must be a float tensor, got ", rt->describe());
      roi = to_f64_vector(*rt);
    }
  }
  if (a.coord == "tf_crop_and_resize" && roi.empty())
    return InvalidArgument("coordinate_transformation_mode tf_crop_and_resize needs the roi input");
  KILN_ASSIGN_OR_RETURN(std::vector<AxisPlan> plan,
                        make_plan(a, x, have_scales ? &scales : nullptr, have_sizes ? &sizes : nullptr, &roi));
  ResizeGeometry g;
  g.nearest = a.mode == Mode::kNearest;
  g.extrapolation = a.extrapolation;
  for (const AxisPlan& p : plan) g.out_shape.push_back(p.out);
  KILN_ASSIGN_OR_RETURN(int64_t numel, checked_numel(g.out_shape));
  for (const AxisPlan& p : plan) {
    ResizeAxis ax;
    ax.in = p.in, ax.out = p.out;
    ax.identity = p.out == p.in && std::fabs(p.scale - 1.0) < 1e-9 &&
                  (a.coord != "tf_crop_and_resize" || (p.roi_start == 0.0 && p.roi_end == 1.0));
    g.axes.push_back(std::move(ax));
  }
  if (numel == 0) return g;
  for (size_t i = 0; i < plan.size(); ++i) {
    const AxisPlan& p = plan[i];
    if (p.in == 0 && p.out > 0) return InvalidArgument("cannot resize an empty axis to ", p.out);
    if (!g.nearest && g.axes[i].identity) continue;
    KILN_ASSIGN_OR_RETURN(AxisTaps t, axis_taps(a, p));
    g.axes[i].n = t.n;
    g.axes[i].index = std::move(t.index);
    g.axes[i].weight = std::move(t.weight);
    g.axes[i].extrapolate = std::move(t.extrapolate);
  }
  return g;
}

namespace {

// Nearest: a gather (exact for every dtype, including 64-bit integers beyond double precision).
Tensor resize_nearest(const Tensor& x, const ResizeGeometry& g) {
  const size_t r = g.axes.size();
  const Dims in_stride = strides_of(x.shape());
  Tensor y(x.dtype(), g.out_shape);
  std::vector<int64_t> o(r, 0);
  for (int64_t i = 0; i < y.numel(); ++i) {
    int64_t src = 0;
    bool extrapolate = false;
    for (size_t d = 0; d < r; ++d) {
      src += g.axes[d].index[static_cast<size_t>(o[d])] * in_stride[d];
      extrapolate = extrapolate || g.axes[d].extrapolate[static_cast<size_t>(o[d])];
    }
    if (extrapolate)
      y.set_f64(i, g.extrapolation);
    else
      copy_elements(x, src, y, i, 1);
    for (size_t d = r; d > 0; --d) {
      if (++o[d - 1] < g.out_shape[d - 1]) break;
      o[d - 1] = 0;
    }
  }
  return y;
}

Status resize_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (!dtype_is_float(x.dtype()) && !dtype_is_integer(x.dtype()))
    return ctx.unsupported(str_cat(ctx.node.op_type, " on ", x.describe()));
  auto geometry = resize_geometry(ctx.node, x.shape(), [&](size_t i) -> const Tensor* {
    return i < ctx.num_inputs() && ctx.has_input(i) ? &ctx.input(i) : nullptr;
  });
  if (!geometry.ok()) {
    if (geometry.status().code() == ErrorCode::kInvalidModel) return geometry.status();
    return ctx.error(geometry.status().message());
  }
  const ResizeGeometry& g = *geometry;
  if (dims_numel(g.out_shape) == 0) {
    ctx.set_output(0, Tensor(x.dtype(), g.out_shape));
    return Status::Ok();
  }
  if (g.nearest) {
    ctx.set_output(0, resize_nearest(x, g));
    return Status::Ok();
  }
  // Axes that shrink go first so that intermediate results stay small.
  std::vector<size_t> order;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t axis = 0; axis < g.axes.size(); ++axis)
      if ((g.axes[axis].out <= g.axes[axis].in) == (pass == 0)) order.push_back(axis);
  std::vector<double> data = to_f64_vector(x);
  Dims shape = x.shape();
  for (size_t axis : order) {
    const ResizeAxis& t = g.axes[axis];
    if (t.identity) continue;
    data = resize_axis(data, shape, axis, t, g.extrapolation);
  }
  Tensor y(x.dtype(), g.out_shape);
  const bool is_int = dtype_is_integer(x.dtype());
  for (int64_t i = 0; i < y.numel(); ++i) {
    double v = data[static_cast<size_t>(i)];
    if (is_int) {
      v = std::nearbyint(v);  // round half to even, then saturate
      if (std::isnan(v)) v = 0;
      y.set_f64(i, v);  // set_f64 saturates to the integer range
    } else {
      y.set_f64(i, v);
    }
  }
  ctx.set_output(0, y);
  return Status::Ok();
}

Status infer_resize(InferContext& ctx) {
  const SymShape& xs = ctx.input_shape(0);
  DataType dt = ctx.input_dtype(0);
  if (!xs.rank_known) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(ResizeAttrs a, read_attrs(ctx.node));
  InputSlots in = slots(ctx.node);
  const int64_t r = static_cast<int64_t>(xs.rank());
  std::vector<int64_t> axes;  // the resized axes, in the order scales/sizes list them
  if (a.axes.empty()) {
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  } else {
    for (int64_t ax : a.axes) {
      auto n = normalize_axis(ax, r);
      if (!n.ok()) return ctx.error(n.status().message());
      axes.push_back(*n);
    }
  }
  std::vector<Dim> out(xs.dims);
  for (int64_t ax : axes) out[static_cast<size_t>(ax)] = ctx.new_symbol();
  // Scales / sizes known at build time give concrete dims where X's dims are known.
  const Tensor* st = in.scales >= 0 ? ctx.constant(static_cast<size_t>(in.scales)) : nullptr;
  const Tensor* zt = in.sizes >= 0 ? ctx.constant(static_cast<size_t>(in.sizes)) : nullptr;
  std::vector<double> scales;
  if (in.scales < 0) {
    for (float f : ctx.node.attr_floats("scales")) scales.push_back(f);
  } else if (st && st->numel() > 0 && dtype_is_float(st->dtype())) {
    scales = to_f64_vector(*st);
  }
  // Constant scales are checked as the kernel checks them (make_plan, same messages): a build
  // refuses what a run would. Sizes given too are the kernel's error as well.
  const bool sizes_given = zt && zt->numel() > 0;
  if (!scales.empty() && sizes_given) return ctx.error("only one of scales and sizes may be given");
  if (!scales.empty() && scales.size() != axes.size())
    return ctx.error(str_cat("scales has ", scales.size(), " values, expected ", axes.size()));
  if (!scales.empty()) {
    for (size_t j = 0; j < axes.size(); ++j) {
      const Dim& d = xs.dims[static_cast<size_t>(axes[j])];
      if (!(scales[j] > 0) || !std::isfinite(scales[j]))
        return ctx.error(str_cat("scales value ", scales[j], " must be positive and finite"));
      if (scales[j] == 1.0) {
        out[static_cast<size_t>(axes[j])] = d;
      } else if (d.known()) {
        auto e = scaled_extent(d.value, scales[j]);
        if (!e.ok()) return ctx.error(e.status().message());
        out[static_cast<size_t>(axes[j])] = Dim(*e);
      }
    }
  } else if (zt && zt->numel() > 0 && dtype_is_integer(zt->dtype()) &&
             zt->numel() == static_cast<int64_t>(axes.size())) {
    std::vector<int64_t> sizes = to_i64_vector(*zt);
    for (int64_t v : sizes)
      if (v < 0 || v > (int64_t{1} << 40)) return ctx.error(str_cat("sizes value ", v, " is out of range"));
    if (a.keep_aspect == "stretch") {
      for (size_t j = 0; j < axes.size(); ++j)
        if (sizes[j] >= 0) out[static_cast<size_t>(axes[j])] = Dim(sizes[j]);
    } else {
      bool all_known = true;
      Dims x_dims;
      for (const Dim& d : xs.dims) {
        all_known = all_known && d.known();
        x_dims.push_back(d.value);
      }
      if (all_known) {
        auto plan = make_plan(a, x_dims, nullptr, &sizes, nullptr);
        if (plan.ok())
          for (size_t i = 0; i < plan->size(); ++i) out[i] = Dim((*plan)[i].out);
      }
    }
  }
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Resize, 10, infer_resize, resize_kernel, 1, 4);
KILN_REGISTER_OP_ARITY("", Upsample, 7, infer_resize, resize_kernel, 1, 2);

}  // namespace kiln::ops
