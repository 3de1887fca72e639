// Type conversions: Cast, CastLike, BitCast. Conversions themselves live in Tensor::cast
// (src/core/tensor.cc) and the float8/float4 codecs in src/core/dtype.cc.
#include <cstring>

#include "ops/elementwise_util.h"

namespace kiln::ops {
namespace {

// Cast-1 named the target type with a string ("FLOAT", "INT64", ...): TensorProto's enum names.
bool dtype_from_onnx_name(const std::string& s, DataType* out) {
  static const std::pair<const char*, DataType> kNames[] = {
      {"FLOAT", DataType::kFloat32},   {"UINT8", DataType::kUInt8},       {"INT8", DataType::kInt8},
      {"UINT16", DataType::kUInt16},   {"INT16", DataType::kInt16},       {"INT32", DataType::kInt32},
      {"INT64", DataType::kInt64},     {"STRING", DataType::kString},     {"BOOL", DataType::kBool},
      {"FLOAT16", DataType::kFloat16}, {"DOUBLE", DataType::kFloat64},    {"UINT32", DataType::kUInt32},
      {"UINT64", DataType::kUInt64},   {"BFLOAT16", DataType::kBFloat16},
  };
  for (const auto& [name, dt] : kNames) {
    if (s == name) {
      *out = dt;
      return true;
    }
  }
  return false;
}

// The 'to' attribute: an ONNX dtype code (a string name before opset 6).
Result<DataType> target_dtype(const ir::Node& n) {
  const ir::Attribute* a = n.attr("to");
  if (!a) return InvalidModel("attribute 'to' is required");
  if (a->type == ir::Attribute::Type::kString) {
    DataType dt;
    if (!dtype_from_onnx_name(a->s, &dt)) return InvalidModel("attribute to=\"", a->s, "\" is not a known type name");
    return dt;
  }
  if (!dtype_is_known(static_cast<int32_t>(a->i)))
    return InvalidModel("attribute to=", a->i, " is not a known ONNX data type");
  return static_cast<DataType>(a->i);
}

bool is_complex(DataType t) { return t == DataType::kComplex64 || t == DataType::kComplex128; }

// Converts x to `to`, honouring 'saturate' (float8 targets) and 'round_mode' (float8e8m0 target).
Status cast_to(KernelContext& ctx, const Tensor& x, DataType to) {
  if (is_complex(x.dtype()) || is_complex(to))
    return ctx.unsupported(str_cat("cast from ", dtype_name(x.dtype()), " to ", dtype_name(to), " is not supported"));
  bool saturate = ctx.node.attr_int("saturate", 1) != 0;
  std::string mode = ctx.node.attr_string("round_mode", "up");
  E8M0Rounding rounding;
  if (mode == "up")
    rounding = E8M0Rounding::kUp;
  else if (mode == "down")
    rounding = E8M0Rounding::kDown;
  else if (mode == "nearest")
    rounding = E8M0Rounding::kNearest;
  else
    return ctx.error(str_cat("attribute round_mode must be \"up\", \"down\" or \"nearest\", got \"", mode, "\""));
  if (to == DataType::kFloat8E8M0 && x.dtype() != to && x.dtype() != DataType::kString) {
    Tensor out(to, x.shape());
    for (int64_t i = 0; i < x.numel(); ++i)
      out.data<uint8_t>()[i] = float_to_float8e8m0(static_cast<float>(x.get_f64(i)), saturate, rounding);
    ctx.set_output(0, out);
    return Status::Ok();
  }
  auto r = x.cast(to, saturate);
  if (!r.ok()) return ctx.error(r.status().message());
  ctx.set_output(0, std::move(r).value());
  return Status::Ok();
}

Status cast_kernel(KernelContext& ctx) {
  auto to = target_dtype(ctx.node);
  if (!to.ok()) return ctx.error(to.status().message());
  return cast_to(ctx, ctx.input(0), *to);
}

Status infer_cast(InferContext& ctx) {
  auto to = target_dtype(ctx.node);
  if (!to.ok()) return ctx.error(to.status().message());
  ctx.set_output(0, *to, ctx.input_shape(0));
  return Status::Ok();
}

Status castlike_kernel(KernelContext& ctx) { return cast_to(ctx, ctx.input(0), ctx.input(1).dtype()); }

Status infer_castlike(InferContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(0));
  return Status::Ok();
}

// BitCast: reinterprets each element's bytes as `to` (same element size; shape unchanged).
Status bitcast_kernel(KernelContext& ctx) {
  auto to = target_dtype(ctx.node);
  if (!to.ok()) return ctx.error(to.status().message());
  const Tensor& x = ctx.input(0);
  if (x.dtype() == DataType::kString || *to == DataType::kString || dtype_packed_bits(x.dtype()) < 8 ||
      dtype_packed_bits(*to) < 8)
    return ctx.error(str_cat("cannot bitcast ", dtype_name(x.dtype()), " to ", dtype_name(*to),
                             " (string and sub-byte types have no fixed byte layout)"));
  if (dtype_size(x.dtype()) != dtype_size(*to))
    return ctx.error(str_cat("cannot bitcast ", dtype_name(x.dtype()), " (", dtype_size(x.dtype()), " bytes) to ",
                             dtype_name(*to), " (", dtype_size(*to), " bytes): element sizes differ"));
  Tensor out(*to, x.shape());
  if (x.nbytes()) std::memcpy(out.raw(), x.raw(), x.nbytes());
  if (*to == DataType::kBool)  // keep bool bytes canonical (0 or 1)
    for (int64_t i = 0; i < out.numel(); ++i) out.data<uint8_t>()[i] = out.data<uint8_t>()[i] != 0;
  ctx.set_output(0, out);
  return Status::Ok();
}

Status infer_bitcast(InferContext& ctx) {
  auto to = target_dtype(ctx.node);
  if (!to.ok()) return ctx.error(to.status().message());
  DataType from = ctx.input_dtype(0);
  if (from != DataType::kUndefined && dtype_size(from) != dtype_size(*to))
    return ctx.error(str_cat("cannot bitcast ", dtype_name(from), " to ", dtype_name(*to), ": element sizes differ"));
  ctx.set_output(0, *to, ctx.input_shape(0));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Cast, 1, infer_cast, cast_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", CastLike, 15, infer_castlike, castlike_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", BitCast, 26, infer_bitcast, bitcast_kernel, 1, 1);

}  // namespace kiln::ops
