// Reference kernels and shape inference of kiln.QConv and kiln.QPool (kiln_quantized.h says what
// they compute). Plain loops in exact integer (accumulation) and double (requantization) arithmetic:
// the ground truth for the INT8 tactics and for `kiln compare` on a folded graph.
#include "ops/kiln_quantized.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/conv_core.h"

namespace kiln::ops {

QuantizedLayerParams quantized_layer_params(const ir::Node& n) {
  QuantizedLayerParams p;
  p.x_scale = n.attr_float("x_scale", 1.0f);
  p.y_scale = n.attr_float("y_scale", 1.0f);
  p.residual_scale = n.attr_float("residual_scale", 1.0f);
  p.x_zero_point = n.attr_int("x_zero_point", 0);
  p.y_zero_point = n.attr_int("y_zero_point", 0);
  p.residual_zero_point = n.attr_int("residual_zero_point", 0);
  p.inner_scale = n.attr_float("inner_scale", 0.0f);
  p.inner_zero_point = n.attr_int("inner_zero_point", 0);
  p.inner_type = static_cast<DataType>(n.attr_int("inner_type", static_cast<int64_t>(DataType::kUInt8)));
  p.w_scales = n.attr_floats("w_scales", {1.0f});
  p.y_type = static_cast<DataType>(n.attr_int("y_type", static_cast<int64_t>(DataType::kUInt8)));
  p.activation = n.attr_string("activation", "");
  p.activation_min = n.attr_float("activation_min", -std::numeric_limits<float>::infinity());
  p.activation_max = n.attr_float("activation_max", std::numeric_limits<float>::infinity());
  p.channels_last = n.attr_int("channels_last", 0) != 0;
  p.mode = n.attr_string("mode", "");
  return p;
}

bool is_kiln_quantized_layer(const ir::Node& n) {
  return n.domain == "kiln" && (n.op_type == "QConv" || n.op_type == "QPool");
}

Dims to_channels_last(const Dims& d) {
  if (d.size() < 3) return d;
  Dims o{d[0]};
  o.insert(o.end(), d.begin() + 2, d.end());
  o.push_back(d[1]);
  return o;
}

Dims to_channels_first(const Dims& d) {
  if (d.size() < 3) return d;
  Dims o{d[0], d.back()};
  o.insert(o.end(), d.begin() + 1, d.end() - 1);
  return o;
}

namespace {

bool is_8bit(DataType t) { return t == DataType::kInt8 || t == DataType::kUInt8; }

SymShape sym_to_channels_first(const SymShape& s) {
  if (!s.rank_known || s.rank() < 3) return s;
  std::vector<Dim> d{s.dims[0], s.dims.back()};
  d.insert(d.end(), s.dims.begin() + 1, s.dims.end() - 1);
  return SymShape(d);
}
SymShape sym_to_channels_last(const SymShape& s) {
  if (!s.rank_known || s.rank() < 3) return s;
  std::vector<Dim> d{s.dims[0]};
  d.insert(d.end(), s.dims.begin() + 2, s.dims.end());
  d.push_back(s.dims[1]);
  return SymShape(d);
}

// The element index in channels-last order of element i of a channels-first tensor of shape `nchw`.
struct LayoutMap {
  int64_t c = 1, plane = 1;
  explicit LayoutMap(const Dims& nchw) {
    c = nchw.size() > 1 ? nchw[1] : 1;
    for (size_t d = 2; d < nchw.size(); ++d) plane *= nchw[d];
  }
  int64_t operator()(int64_t i) const {
    const int64_t p = i % plane, ch = (i / plane) % c, n = i / (plane * c);
    return (n * plane + p) * c + ch;
  }
};

// Values of `t` as int64 minus `zp`, in channels-first order (`cl`: t is channels-last).
std::vector<int64_t> centered_nchw(const Tensor& t, int64_t zp, bool cl, Dims* nchw) {
  *nchw = cl ? to_channels_first(t.shape()) : t.shape();
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  LayoutMap map(*nchw);
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.get_i64(cl ? map(i) : i) - zp;
  return v;
}

int64_t requantize(double v, const QuantizedLayerParams& p) {
  double q = v / static_cast<double>(p.y_scale);
  if (std::isnan(q)) q = 0;
  q = std::nearbyint(q) + static_cast<double>(p.y_zero_point);  // ties to even
  return static_cast<int64_t>(std::min<double>(p.y_max(), std::max<double>(p.y_min(), q)));
}

Status check_params(const QuantizedLayerParams& p, const std::string& where) {
  if (!is_8bit(p.y_type)) return InvalidModel(where, "y_type must be uint8 or int8, got ", dtype_name(p.y_type));
  if (!(p.x_scale > 0) || !(p.y_scale > 0) || !(p.residual_scale > 0))
    return InvalidModel(where, "scales must be positive");
  if (p.activation != "" && p.activation != "Relu" && p.activation != "Clip")
    return InvalidModel(where, "activation '", p.activation, "' is not one of Relu, Clip");
  return Status::Ok();
}

// ---- kiln.QConv

Status infer_qconv(InferContext& ctx) {
  auto p = quantized_layer_params(ctx.node);
  KILN_RETURN_IF_ERROR(check_params(p, ctx.node.where()));
  const SymShape& xs = ctx.input_shape(0);
  const SymShape& ws = ctx.input_shape(1);
  if (!xs.rank_known || !ws.rank_known) {
    ctx.set_output(0, p.y_type, SymShape());
    return Status::Ok();
  }
  if (xs.rank() == 2) {  // a Gemm: [N, C] x W [M, C, 1, 1]
    ctx.set_output(0, p.y_type, SymShape(std::vector<Dim>{xs.dims[0], ws.dims[0]}));
    return Status::Ok();
  }
  const SymShape x = p.channels_last ? sym_to_channels_first(xs) : xs;
  const size_t rank = x.rank();
  if (rank < 3 || ws.rank() != rank) return ctx.error(str_cat("x ", xs.str(), " and w ", ws.str(), " do not match"));
  Dims wk;
  for (size_t d = 2; d < rank; ++d) {
    if (!ws.dims[d].known()) return ctx.error("w's kernel dims must be known");
    wk.push_back(ws.dims[d].value);
  }
  auto win = read_window(ctx.node, rank - 2, &wk, {});
  if (!win.ok()) return win.status();
  std::vector<Dim> out(rank);
  out[0] = x.dims[0];
  out[1] = ws.dims[0];
  for (size_t d = 2; d < rank; ++d) {
    auto o = window_output_sym(*win, d - 2, x.dims[d]);
    if (!o.ok()) return ctx.error(o.status().message());
    out[d] = *o;
  }
  SymShape y(out);
  ctx.set_output(0, p.y_type, p.channels_last ? sym_to_channels_last(y) : y);
  return Status::Ok();
}

Status qconv_kernel(KernelContext& ctx) {
  const auto p = quantized_layer_params(ctx.node);
  KILN_RETURN_IF_ERROR(check_params(p, ctx.node.where()));
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  if (!is_8bit(x.dtype()) || w.dtype() != DataType::kInt8)
    return ctx.error(str_cat("x must be uint8/int8 and w int8, got ", x.describe(), " and ", w.describe()));
  if (w.rank() < 3) return ctx.error(str_cat("w ", w.describe(), " must be [M, C/group, k...]"));
  const bool gemm = x.rank() == 2;
  const bool cl = p.channels_last && !gemm;
  Dims xd;
  std::vector<int64_t> xv = centered_nchw(x, p.x_zero_point, cl, &xd);
  if (gemm) xd = {xd[0], xd[1], 1, 1};
  if (xd.size() != w.rank()) return ctx.error(str_cat("x ", x.describe(), " and w ", w.describe(), " do not match"));
  KILN_ASSIGN_OR_RETURN(WindowGeometry win, resolve_window(ctx.node, xd, &w.shape()));
  auto plan = make_conv_plan(win, xd, w.shape(), ctx.node.attr_int("group", 1));
  if (!plan.ok()) return ctx.error(plan.status().message());
  const int64_t m_count = plan->out_channels;
  if (p.w_scales.size() != 1 && static_cast<int64_t>(p.w_scales.size()) != m_count)
    return ctx.error(str_cat("w_scales has ", p.w_scales.size(), " values for ", m_count, " output channels"));
  std::vector<int64_t> wv(static_cast<size_t>(w.numel()));
  for (int64_t i = 0; i < w.numel(); ++i) wv[static_cast<size_t>(i)] = w.get_i64(i);
  std::vector<int64_t> bias(static_cast<size_t>(m_count), 0);
  if (ctx.has_input(2)) {
    const Tensor& b = ctx.input(2);
    if (b.dtype() != DataType::kInt32 || b.numel() != m_count)
      return ctx.error(str_cat("bias ", b.describe(), " must be int32 of ", m_count, " values"));
    for (int64_t m = 0; m < m_count; ++m) bias[static_cast<size_t>(m)] = b.get_i64(m);
  }
  std::vector<int64_t> acc(static_cast<size_t>(dims_numel(plan->out_shape)));
  conv_forward<int64_t>(*plan, xv.data(), wv.data(), bias.data(), acc.data());
  const Dims y_nchw = plan->out_shape;
  const Dims y_shape = gemm ? Dims{y_nchw[0], y_nchw[1]} : cl ? to_channels_last(y_nchw) : y_nchw;
  const Tensor* r = ctx.has_input(3) ? &ctx.input(3) : nullptr;
  if (r && (r->shape() != y_shape || !is_8bit(r->dtype())))
    return ctx.error(
        str_cat("residual ", r->describe(), " must be uint8/int8 of the output's shape ", dims_str(y_shape)));
  Tensor y(p.y_type, y_shape);
  LayoutMap map(y_nchw);
  const int64_t plane = map.plane;
  for (size_t i = 0; i < acc.size(); ++i) {
    const int64_t m = (static_cast<int64_t>(i) / plane) % m_count;
    const int64_t at = cl ? map(static_cast<int64_t>(i)) : static_cast<int64_t>(i);
    double v = static_cast<double>(acc[i]) * static_cast<double>(p.x_scale) * static_cast<double>(p.w_scale(m));
    if (p.has_inner()) {
      double q = std::nearbyint(v / static_cast<double>(p.inner_scale)) + static_cast<double>(p.inner_zero_point);
      q = std::min<double>(p.inner_max(), std::max<double>(p.inner_min(), q));
      v = static_cast<double>(p.inner_scale) * (q - static_cast<double>(p.inner_zero_point));
    }
    if (r) v += static_cast<double>(p.residual_scale) * static_cast<double>(r->get_i64(at) - p.residual_zero_point);
    if (p.activation == "Relu") v = std::max(v, 0.0);
    if (p.activation == "Clip") v = std::min<double>(p.activation_max, std::max<double>(p.activation_min, v));
    y.set_i64(at, requantize(v, p));
  }
  ctx.set_output(0, y);
  return Status::Ok();
}

// ---- kiln.QPool

WindowOptions pool_options(const std::string& mode) { return window_options(mode, 19); }

Status infer_qpool(InferContext& ctx) {
  auto p = quantized_layer_params(ctx.node);
  KILN_RETURN_IF_ERROR(check_params(p, ctx.node.where()));
  if (p.mode != "MaxPool" && p.mode != "AveragePool" && p.mode != "GlobalAveragePool")
    return ctx.error(str_cat("mode '", p.mode, "' is not MaxPool, AveragePool or GlobalAveragePool"));
  const SymShape& xs = ctx.input_shape(0);
  if (!xs.rank_known) {
    ctx.set_output(0, p.y_type, SymShape());
    return Status::Ok();
  }
  const SymShape x = p.channels_last ? sym_to_channels_first(xs) : xs;
  const size_t rank = x.rank();
  if (rank < 3) return ctx.error(str_cat("x ", xs.str(), " must be [N, C, spatial...]"));
  std::vector<Dim> out(x.dims.begin(), x.dims.end());
  if (p.mode == "GlobalAveragePool") {
    for (size_t d = 2; d < rank; ++d) out[d] = Dim(1);
  } else {
    auto win = read_window(ctx.node, rank - 2, nullptr, pool_options(p.mode));
    if (!win.ok()) return win.status();
    for (size_t d = 2; d < rank; ++d) {
      auto o = window_output_sym(*win, d - 2, x.dims[d]);
      if (!o.ok()) return ctx.error(o.status().message());
      out[d] = *o;
    }
  }
  SymShape y(out);
  ctx.set_output(0, p.y_type, p.channels_last ? sym_to_channels_last(y) : y);
  return Status::Ok();
}

Status qpool_kernel(KernelContext& ctx) {
  const auto p = quantized_layer_params(ctx.node);
  KILN_RETURN_IF_ERROR(check_params(p, ctx.node.where()));
  const Tensor& x = ctx.input(0);
  if (!is_8bit(x.dtype()) || x.rank() != 4)
    return ctx.error(str_cat("x must be a 4-D uint8/int8 tensor, got ", x.describe()));
  Dims xd;
  const std::vector<int64_t> xv = centered_nchw(x, p.x_zero_point, p.channels_last, &xd);
  const int64_t n = xd[0], c = xd[1], h = xd[2], wd = xd[3];
  int64_t kh = h, kw = wd, sh = 1, sw = 1, dh = 1, dw = 1, ph = 0, pw = 0, oh = 1, ow = 1;
  bool count_pad = false;
  if (p.mode != "GlobalAveragePool") {
    KILN_ASSIGN_OR_RETURN(WindowGeometry win, resolve_window(ctx.node, xd, nullptr, pool_options(p.mode)));
    kh = win.kernel[0], kw = win.kernel[1], sh = win.strides[0], sw = win.strides[1];
    dh = win.dilations[0], dw = win.dilations[1], ph = win.pad_begin[0], pw = win.pad_begin[1];
    oh = win.out[0], ow = win.out[1];
    count_pad = ctx.node.attr_int("count_include_pad", 0) != 0;
    if (p.mode == "AveragePool" && (win.pad_begin[0] || win.pad_begin[1] || win.pad_end[0] || win.pad_end[1]) &&
        count_pad)
      return ctx.unsupported("AveragePool with count_include_pad and pads (the folding pass leaves it as it is)");
  }
  const Dims y_nchw{n, c, oh, ow};
  Tensor y(p.y_type, p.channels_last ? to_channels_last(y_nchw) : y_nchw);
  LayoutMap map(y_nchw);
  const bool max = p.mode == "MaxPool";
  int64_t i = 0;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch) {
      const int64_t* plane = xv.data() + (b * c + ch) * h * wd;
      for (int64_t r = 0; r < oh; ++r)
        for (int64_t q = 0; q < ow; ++q, ++i) {
          int64_t best = std::numeric_limits<int64_t>::min(), sum = 0, count = 0;
          for (int64_t a = 0; a < kh; ++a)
            for (int64_t e = 0; e < kw; ++e) {
              const int64_t yy = r * sh + a * dh - ph, xx = q * sw + e * dw - pw;
              if (yy < 0 || yy >= h || xx < 0 || xx >= wd) continue;
              const int64_t v = plane[yy * wd + xx];
              best = std::max(best, v), sum += v, ++count;
            }
          double v = 0;
          if (max)
            v = count ? static_cast<double>(best) * p.x_scale : 0.0;
          else
            v = count ? static_cast<double>(sum) * p.x_scale / static_cast<double>(count) : 0.0;
          y.set_i64(p.channels_last ? map(i) : i, requantize(v, p));
        }
    }
  ctx.set_output(0, y);
  return Status::Ok();
}

// ---- kiln.QuantizeChannelsLast

Status infer_quantize_channels_last(InferContext& ctx) {
  auto p = quantized_layer_params(ctx.node);
  KILN_RETURN_IF_ERROR(check_params(p, ctx.node.where()));
  ctx.set_output(0, p.y_type, sym_to_channels_last(ctx.input_shape(0)));
  return Status::Ok();
}

Status quantize_channels_last_kernel(KernelContext& ctx) {
  const auto p = quantized_layer_params(ctx.node);
  KILN_RETURN_IF_ERROR(check_params(p, ctx.node.where()));
  const Tensor& x = ctx.input(0);
  if (x.dtype() != DataType::kFloat32 || x.rank() < 3)
    return ctx.error(str_cat("x must be float32 [N, C, spatial...], got ", x.describe()));
  Tensor y(p.y_type, to_channels_last(x.shape()));
  LayoutMap map(x.shape());
  const float* px = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    // QuantizeLinear's reference arithmetic: float division, ties to even, saturation.
    double q = static_cast<double>(px[i] / p.y_scale);
    q = std::isnan(q) ? 0.0 : std::nearbyint(q);
    q = std::min<double>(p.y_max(), std::max<double>(p.y_min(), q + static_cast<double>(p.y_zero_point)));
    y.set_i64(map(i), static_cast<int64_t>(q));
  }
  ctx.set_output(0, y);
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("kiln", QuantizeChannelsLast, 1, infer_quantize_channels_last, quantize_channels_last_kernel, 1,
                       1);
KILN_REGISTER_OP_ARITY("kiln", QConv, 1, infer_qconv, qconv_kernel, 2, 4);
KILN_REGISTER_OP_ARITY("kiln", QPool, 1, infer_qpool, qpool_kernel, 1, 1);

}  // namespace kiln::ops
