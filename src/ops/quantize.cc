// Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul.
//
// QuantizeLinear / DequantizeLinear support the three granularities of opset 21+ (per-tensor,
// per-axis, blocked), every quantized type up to opset 25 (int/uint 2, 4, 8, 16, int32 for
// dequantization, float8 and float4), `saturate`, `output_dtype` and `precision`.
#include <cmath>
#include <limits>

#include "ops/common.h"

namespace kiln::ops {
namespace {

// Integer range of a quantized integer type; false for float types.
bool quant_int_range(DataType t, int64_t* lo, int64_t* hi) {
  switch (t) {
    case DataType::kUInt8: *lo = 0, *hi = 255; return true;
    case DataType::kInt8: *lo = -128, *hi = 127; return true;
    case DataType::kUInt16: *lo = 0, *hi = 65535; return true;
    case DataType::kInt16: *lo = -32768, *hi = 32767; return true;
    case DataType::kUInt4: *lo = 0, *hi = 15; return true;
    case DataType::kInt4: *lo = -8, *hi = 7; return true;
    case DataType::kUInt2: *lo = 0, *hi = 3; return true;
    case DataType::kInt2: *lo = -2, *hi = 1; return true;
    case DataType::kInt32:
      *lo = std::numeric_limits<int32_t>::min(), *hi = std::numeric_limits<int32_t>::max();
      return true;
    default: return false;
  }
}

bool is_float8(DataType t) {
  return t == DataType::kFloat8E4M3FN || t == DataType::kFloat8E4M3FNUZ || t == DataType::kFloat8E5M2 ||
         t == DataType::kFloat8E5M2FNUZ;
}

// Quantized types QuantizeLinear can produce.
bool is_quant_output_type(DataType t) {
  int64_t lo, hi;
  return (quant_int_range(t, &lo, &hi) && t != DataType::kInt32) || is_float8(t) || t == DataType::kFloat4E2M1;
}

bool is_scale_type(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBFloat16 || t == DataType::kFloat64 ||
         t == DataType::kFloat8E8M0;
}

// Maps each element of x to the element of the scale (and zero point) that applies to it.
class ScaleIndex {
 public:
  // Validates the scale shape against x: per-tensor (scalar or one element), per-axis (1-D of
  // x.shape[axis]) or blocked (rank of x, ceil(x.shape[axis] / block_size) along axis).
  static Result<ScaleIndex> make(const Dims& x, const Dims& scale, int64_t axis_attr, int64_t block_size) {
    ScaleIndex s;
    if (block_size < 0) return InvalidArgument("block_size must be >= 0, got ", block_size);
    int64_t scale_numel = dims_numel(scale);
    if (scale.empty() || (scale_numel == 1 && block_size == 0)) {
      s.mode_ = kPerTensor;
      return s;
    }
    int64_t rank = static_cast<int64_t>(x.size());
    auto ax = normalize_axis(axis_attr, rank);
    if (!ax.ok()) return InvalidArgument("quantization axis: ", ax.status().message());
    int64_t axis = ax.value();
    s.dim_ = x[static_cast<size_t>(axis)];
    s.inner_ = 1;
    for (size_t i = static_cast<size_t>(axis) + 1; i < x.size(); ++i) s.inner_ *= x[i];
    if (block_size == 0) {
      if (scale.size() != 1 || scale[0] != s.dim_)
        return InvalidArgument("per-axis scale must be 1-D of length ", s.dim_, " (x", dims_str(x), ", axis ", axis,
                               "), got shape ", dims_str(scale));
      s.mode_ = kPerAxis;
      return s;
    }
    if (scale.size() != x.size())
      return InvalidArgument("blocked quantization needs a scale of the rank of x", dims_str(x), ", got shape ",
                             dims_str(scale));
    int64_t blocks = s.dim_ == 0 ? 0 : (s.dim_ - 1) / block_size + 1;
    for (size_t i = 0; i < x.size(); ++i) {
      int64_t want = static_cast<int64_t>(i) == axis ? blocks : x[i];
      if (scale[i] != want)
        return InvalidArgument("blocked quantization: scale shape ", dims_str(scale), " does not match x", dims_str(x),
                               " with axis ", axis, " and block_size ", block_size, " (dim ", i, " must be ", want,
                               ")");
    }
    s.mode_ = kBlocked;
    s.block_ = block_size;
    s.blocks_ = blocks;
    return s;
  }

  int64_t operator()(int64_t i) const {
    switch (mode_) {
      case kPerTensor: return 0;
      case kPerAxis: return (i / inner_) % dim_;
      case kBlocked: {
        int64_t inner_idx = i % inner_;
        int64_t c = (i / inner_) % dim_;
        int64_t outer = i / (inner_ * dim_);
        return (outer * blocks_ + c / block_) * inner_ + inner_idx;
      }
    }
    return 0;
  }

 private:
  enum Mode { kPerTensor, kPerAxis, kBlocked };
  Mode mode_ = kPerTensor;
  int64_t dim_ = 1, inner_ = 1, block_ = 1, blocks_ = 1;
};

// Rounds a float32 value to the precision of `t` (float16/bfloat16), as numpy does after each op.
float round_to(float v, DataType t) {
  if (t == DataType::kFloat16) return half_to_float(float_to_half(v));
  if (t == DataType::kBFloat16) return bfloat16_to_float(float_to_bfloat16(v));
  return v;
}

// ---------------------------------------------------------------------------------------------
// QuantizeLinear

Result<DataType> quantize_output_type(const ir::Node& node, DataType zero_point_dtype) {
  int64_t attr = node.attr_int("output_dtype", 0);
  if (attr != 0 && !dtype_is_known(static_cast<int32_t>(attr)))
    return InvalidModel(node.where(), "output_dtype ", attr, " is not a data type");
  DataType out = static_cast<DataType>(attr);
  if (zero_point_dtype != DataType::kUndefined) {
    if (attr != 0 && out != zero_point_dtype)
      return InvalidModel(node.where(), "output_dtype ", dtype_name(out), " disagrees with the zero point type ",
                          dtype_name(zero_point_dtype));
    out = zero_point_dtype;
  }
  if (out == DataType::kUndefined) out = DataType::kUInt8;
  if (!is_quant_output_type(out))
    return Status(ErrorCode::kUnsupported, node.where() + "quantizing to " + dtype_name(out) + " is not supported");
  return out;
}

Status infer_quantize(InferContext& ctx) {
  DataType zp = ctx.has_input(2) ? ctx.input_dtype(2) : DataType::kUndefined;
  auto out = quantize_output_type(ctx.node, zp);
  if (!out.ok()) {
    if (out.status().code() == ErrorCode::kUnsupported) return Status::Ok();  // the kernel reports it
    return out.status();
  }
  ctx.set_output(0, out.value(), ctx.input_shape(0));
  return Status::Ok();
}

Status quantize_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  const Tensor* zp = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  if (!dtype_is_float(x.dtype()) && x.dtype() != DataType::kInt32)
    return ctx.error(str_cat("x must be a float or int32 tensor, got ", x.describe()));
  if (!is_scale_type(scale.dtype()))
    return ctx.error(str_cat("y_scale must be a float tensor, got ", scale.describe()));
  KILN_ASSIGN_OR_RETURN(DataType out_dt, quantize_output_type(ctx.node, zp ? zp->dtype() : DataType::kUndefined));
  int64_t axis = ctx.node.attr_int("axis", 1);
  int64_t block = ctx.node.attr_int("block_size", 0);
  auto idx = ScaleIndex::make(x.shape(), scale.shape(), axis, block);
  if (!idx.ok()) return ctx.error(idx.status().message());
  if (zp && zp->shape() != scale.shape() && !(zp->numel() == 1 && scale.numel() == 1))
    return ctx.error(
        str_cat("y_zero_point shape ", dims_str(zp->shape()), " differs from y_scale shape ", dims_str(scale.shape())));
  bool saturate = ctx.node.attr_int("saturate", 1) != 0;
  // Division precision: the `precision` attribute, else that of numpy's x / y_scale.
  DataType prec = static_cast<DataType>(ctx.node.attr_int("precision", 0));
  if (prec == DataType::kUndefined) {
    if (x.dtype() == DataType::kFloat64 || scale.dtype() == DataType::kFloat64 || x.dtype() == DataType::kInt32)
      prec = DataType::kFloat64;
    else if (x.dtype() == scale.dtype() && (x.dtype() == DataType::kFloat16 || x.dtype() == DataType::kBFloat16))
      prec = x.dtype();
    else
      prec = DataType::kFloat32;
  }
  if (prec != DataType::kFloat64 && prec != DataType::kFloat32 && prec != DataType::kFloat16 &&
      prec != DataType::kBFloat16)
    return ctx.unsupported(str_cat("precision ", dtype_name(prec), " is not supported"));

  Tensor out(out_dt, x.shape());
  int64_t lo = 0, hi = 0;
  bool int_out = quant_int_range(out_dt, &lo, &hi);
  const ScaleIndex& si = idx.value();
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t s = si(i);
    double q;
    if (prec == DataType::kFloat64) {
      q = x.get_f64(i) / scale.get_f64(s);
    } else {
      float xf = round_to(static_cast<float>(x.get_f64(i)), prec);
      float sf = round_to(static_cast<float>(scale.get_f64(s)), prec);
      q = round_to(xf / sf, prec);
    }
    if (int_out) {
      double r = std::isnan(q) ? 0.0 : std::nearbyint(q);  // ties to even
      if (zp) r += static_cast<double>(zp->get_i64(s));
      r = std::min(std::max(r, static_cast<double>(lo)), static_cast<double>(hi));
      out.set_i64(i, static_cast<int64_t>(r));
    } else {
      double v = q + (zp ? zp->get_f64(s) : 0.0);
      uint8_t* po = static_cast<uint8_t*>(out.raw());
      if (out_dt == DataType::kFloat4E2M1)
        po[i] = float_to_float4e2m1(static_cast<float>(v), saturate);
      else
        po[i] = float_to_float8(static_cast<float>(v), out_dt, saturate);
    }
  }
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// DequantizeLinear

DataType dequantize_output_type(const ir::Node& node, DataType scale_dtype) {
  int64_t attr = node.attr_int("output_dtype", 0);
  if (attr != 0 && dtype_is_known(static_cast<int32_t>(attr))) return static_cast<DataType>(attr);
  return scale_dtype;
}

Status infer_dequantize(InferContext& ctx) {
  DataType out = dequantize_output_type(ctx.node, ctx.input_dtype(1));
  ctx.set_output(0, out, ctx.input_shape(0));
  return Status::Ok();
}

Status dequantize_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  const Tensor* zp = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  int64_t lo, hi;
  if (!quant_int_range(x.dtype(), &lo, &hi) && !is_float8(x.dtype()) && x.dtype() != DataType::kFloat4E2M1 &&
      x.dtype() != DataType::kFloat8E8M0)
    return ctx.error(str_cat("x must be a quantized tensor, got ", x.describe()));
  if (!is_scale_type(scale.dtype()))
    return ctx.error(str_cat("x_scale must be a float tensor, got ", scale.describe()));
  if (zp && zp->dtype() != x.dtype())
    return ctx.error(
        str_cat("x_zero_point dtype ", dtype_name(zp->dtype()), " differs from x dtype ", dtype_name(x.dtype())));
  if (zp && zp->shape() != scale.shape() && !(zp->numel() == 1 && scale.numel() == 1))
    return ctx.error(
        str_cat("x_zero_point shape ", dims_str(zp->shape()), " differs from x_scale shape ", dims_str(scale.shape())));
  DataType out_dt = dequantize_output_type(ctx.node, scale.dtype());
  if (out_dt != DataType::kFloat32 && out_dt != DataType::kFloat16 && out_dt != DataType::kBFloat16 &&
      out_dt != DataType::kFloat64)
    return ctx.unsupported(str_cat("output type ", dtype_name(out_dt), " is not supported"));
  auto idx =
      ScaleIndex::make(x.shape(), scale.shape(), ctx.node.attr_int("axis", 1), ctx.node.attr_int("block_size", 0));
  if (!idx.ok()) return ctx.error(idx.status().message());
  const ScaleIndex& si = idx.value();
  Tensor out(out_dt, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t s = si(i);
    double v = x.get_f64(i) - (zp ? zp->get_f64(s) : 0.0);
    out.set_f64(i, v * scale.get_f64(s));
  }
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// DynamicQuantizeLinear: uint8 quantization with scale and zero point computed from the data.

Status infer_dynamic_quantize(InferContext& ctx) {
  ctx.set_output(0, DataType::kUInt8, ctx.input_shape(0));
  ctx.set_output(1, DataType::kFloat32, SymShape(std::vector<Dim>{}));
  ctx.set_output(2, DataType::kUInt8, SymShape(std::vector<Dim>{}));
  return Status::Ok();
}

Status dynamic_quantize_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.dtype() != DataType::kFloat32) return ctx.error(str_cat("x must be float32, got ", x.describe()));
  const float* px = x.data<float>();
  float maxx = 0.0f, minx = 0.0f;  // the range always includes 0
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (px[i] > maxx) maxx = px[i];
    if (px[i] < minx) minx = px[i];
  }
  if (std::isinf(maxx) || std::isinf(minx)) return ctx.error("x contains infinite values; no finite scale exists");
  const float qmin = 0.0f, qmax = 255.0f;
  float scale = (maxx == minx ? 1.0f : (maxx - minx)) / (qmax - qmin);
  float initial_zp = qmin - minx / scale;
  float zp = std::nearbyint(std::min(qmax, std::max(qmin, initial_zp)));
  Tensor y(DataType::kUInt8, x.shape());
  uint8_t* py = y.data<uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    float q = px[i] / scale;
    float r = std::isnan(q) ? 0.0f : std::nearbyint(q) + zp;
    py[i] = static_cast<uint8_t>(std::min(qmax, std::max(qmin, r)));
  }
  ctx.set_output(0, std::move(y));
  ctx.set_output(1, Tensor::scalar<float>(DataType::kFloat32, scale));
  ctx.set_output(2, Tensor::scalar<uint8_t>(DataType::kUInt8, static_cast<uint8_t>(zp)));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// QLinearMatMul: quantized numpy-style MatMul. a's scale/zero point may be per row of a, b's per
// column of b; the output's are per tensor.

// Symbolic numpy matmul shape (1-D operands are promoted and the added dim removed).
SymShape matmul_sym(const SymShape& a, const SymShape& b) {
  if (!a.rank_known || !b.rank_known || a.rank() == 0 || b.rank() == 0) return SymShape::unknown();
  std::vector<Dim> ad = a.dims, bd = b.dims;
  bool a1 = ad.size() == 1, b1 = bd.size() == 1;
  if (a1) ad.insert(ad.begin(), Dim(1));
  if (b1) bd.push_back(Dim(1));
  SymShape abatch(std::vector<Dim>(ad.begin(), ad.end() - 2)), bbatch(std::vector<Dim>(bd.begin(), bd.end() - 2));
  std::vector<Dim> out = broadcast_sym(abatch, bbatch).dims;
  if (!a1) out.push_back(ad[ad.size() - 2]);
  if (!b1) out.push_back(bd.back());
  return SymShape(out);
}

Status infer_qlinear_matmul(InferContext& ctx) {
  DataType out = ctx.has_input(7) ? ctx.input_dtype(7) : ctx.input_dtype(0);
  ctx.set_output(0, out, matmul_sym(ctx.input_shape(0), ctx.input_shape(3)));
  return Status::Ok();
}

// Scale/zero point of a matmul operand: one value, or one per entry of `count` (rows/cols).
Status check_qparam(const KernelContext& ctx, const Tensor& t, const char* name, int64_t count) {
  if (t.numel() == 1 && t.rank() <= 1) return Status::Ok();
  if (t.rank() == 1 && t.numel() == count) return Status::Ok();
  return ctx.error(str_cat(name, " must be a scalar or 1-D of length ", count, ", got shape ", dims_str(t.shape())));
}

Status qlinear_matmul_kernel(KernelContext& ctx) {
  for (size_t i : {0, 1, 3, 4, 6})
    if (!ctx.has_input(i)) return ctx.error(str_cat("input ", i, " is required"));
  const Tensor& a = ctx.input(0);
  const Tensor& as = ctx.input(1);
  const Tensor* azp = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const Tensor& b = ctx.input(3);
  const Tensor& bs = ctx.input(4);
  const Tensor* bzp = ctx.has_input(5) ? &ctx.input(5) : nullptr;
  const Tensor& ys = ctx.input(6);
  const Tensor* yzp = ctx.has_input(7) ? &ctx.input(7) : nullptr;
  int64_t lo, hi;
  for (const Tensor* t : {&a, &b})
    if (!quant_int_range(t->dtype(), &lo, &hi) || t->dtype() == DataType::kInt32)
      return ctx.error(str_cat("quantized inputs must be 8/16-bit integers, got ", t->describe()));
  DataType out_dt = yzp ? yzp->dtype() : a.dtype();
  if (!quant_int_range(out_dt, &lo, &hi))
    return ctx.error(str_cat("output type ", dtype_name(out_dt), " is not supported"));
  if (as.dtype() != bs.dtype() || as.dtype() != ys.dtype() || !is_scale_type(as.dtype()))
    return ctx.error(
        str_cat("scales must share one float dtype: ", as.describe(), ", ", bs.describe(), ", ", ys.describe()));
  if (a.rank() == 0 || b.rank() == 0) return ctx.error("QLinearMatMul inputs must have rank >= 1");
  Dims ad = a.shape(), bd = b.shape();
  bool a1 = ad.size() == 1, b1 = bd.size() == 1;
  if (a1) ad.insert(ad.begin(), 1);
  if (b1) bd.push_back(1);
  int64_t M = ad[ad.size() - 2], K = ad.back(), K2 = bd[bd.size() - 2], N = bd.back();
  if (K != K2) return ctx.error(str_cat("inner dimensions differ: a", dims_str(a.shape()), " b", dims_str(b.shape())));
  KILN_RETURN_IF_ERROR(check_qparam(ctx, as, "a_scale", M));
  if (azp) KILN_RETURN_IF_ERROR(check_qparam(ctx, *azp, "a_zero_point", M));
  KILN_RETURN_IF_ERROR(check_qparam(ctx, bs, "b_scale", N));
  if (bzp) KILN_RETURN_IF_ERROR(check_qparam(ctx, *bzp, "b_zero_point", N));
  if (ys.numel() != 1) return ctx.error(str_cat("y_scale must have one element, got shape ", dims_str(ys.shape())));
  if (yzp && yzp->numel() != 1)
    return ctx.error(str_cat("y_zero_point must have one element, got shape ", dims_str(yzp->shape())));
  Dims abatch(ad.begin(), ad.end() - 2), bbatch(bd.begin(), bd.end() - 2);
  KILN_ASSIGN_OR_RETURN(Dims batch, broadcast_dims(abatch, bbatch));
  Dims out_full = batch;
  out_full.push_back(M);
  out_full.push_back(N);
  Dims out_shape = batch;
  if (!a1) out_shape.push_back(M);
  if (!b1) out_shape.push_back(N);
  Tensor out(out_dt, out_shape);
  Dims abfull = batch, bbfull = batch;
  abfull.push_back(1), abfull.push_back(1);
  bbfull.push_back(1), bbfull.push_back(1);
  Dims a_b = abatch, b_b = bbatch;
  a_b.push_back(1), a_b.push_back(1);
  b_b.push_back(1), b_b.push_back(1);
  int64_t nbatch = dims_numel(batch);
  BroadcastIndex ia(a_b, abfull), ib(b_b, bbfull);
  DataType sdt = as.dtype();
  double yz = yzp ? static_cast<double>(yzp->get_i64(0)) : 0.0;
  for (int64_t bi = 0; bi < nbatch; ++bi) {
    int64_t abase = ia(bi) * M * K, bbase = ib(bi) * K * N;
    for (int64_t m = 0; m < M; ++m) {
      int64_t az = azp ? azp->get_i64(azp->numel() == 1 ? 0 : m) : 0;
      float asv = static_cast<float>(as.get_f64(as.numel() == 1 ? 0 : m));
      for (int64_t n = 0; n < N; ++n) {
        int64_t bz = bzp ? bzp->get_i64(bzp->numel() == 1 ? 0 : n) : 0;
        int64_t acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += (a.get_i64(abase + m * K + k) - az) * (b.get_i64(bbase + k * N + n) - bz);
        // The multiplier is computed in the scales' precision, as the reference does.
        double mult;
        if (sdt == DataType::kFloat64) {
          mult = as.get_f64(as.numel() == 1 ? 0 : m) * bs.get_f64(bs.numel() == 1 ? 0 : n) / ys.get_f64(0);
        } else {
          float bsv = static_cast<float>(bs.get_f64(bs.numel() == 1 ? 0 : n));
          float p = round_to(asv * bsv, sdt);
          mult = round_to(p / static_cast<float>(ys.get_f64(0)), sdt);
        }
        double d = static_cast<double>(acc) * mult + yz;
        double r = std::isnan(d) ? yz : std::nearbyint(d);
        r = std::min(std::max(r, static_cast<double>(lo)), static_cast<double>(hi));
        out.set_i64(bi * M * N + m * N + n, static_cast<int64_t>(r));
      }
    }
  }
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", QuantizeLinear, 10, infer_quantize, quantize_kernel, 2, 3);
KILN_REGISTER_OP_ARITY("", DequantizeLinear, 10, infer_dequantize, dequantize_kernel, 2, 3);
KILN_REGISTER_OP_ARITY("", DynamicQuantizeLinear, 11, infer_dynamic_quantize, dynamic_quantize_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", QLinearMatMul, 10, infer_qlinear_matmul, qlinear_matmul_kernel, 8, 8);

}  // namespace kiln::ops
