#include "core/dtype.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kiln {

namespace {
struct DTypeInfo {
  DataType type;
  const char* name;
  size_t size;
  int packed_bits;
};
constexpr DTypeInfo kInfos[] = {
    {DataType::kUndefined, "undefined", 0, 0},
    {DataType::kFloat32, "float32", 4, 32},
    {DataType::kUInt8, "uint8", 1, 8},
    {DataType::kInt8, "int8", 1, 8},
    {DataType::kUInt16, "uint16", 2, 16},
    {DataType::kInt16, "int16", 2, 16},
    {DataType::kInt32, "int32", 4, 32},
    {DataType::kInt64, "int64", 8, 64},
    {DataType::kString, "string", 0, 0},
    {DataType::kBool, "bool", 1, 8},
    {DataType::kFloat16, "float16", 2, 16},
    {DataType::kFloat64, "float64", 8, 64},
    {DataType::kUInt32, "uint32", 4, 32},
    {DataType::kUInt64, "uint64", 8, 64},
    {DataType::kComplex64, "complex64", 8, 64},
    {DataType::kComplex128, "complex128", 16, 128},
    {DataType::kBFloat16, "bfloat16", 2, 16},
    {DataType::kFloat8E4M3FN, "float8e4m3fn", 1, 8},
    {DataType::kFloat8E4M3FNUZ, "float8e4m3fnuz", 1, 8},
    {DataType::kFloat8E5M2, "float8e5m2", 1, 8},
    {DataType::kFloat8E5M2FNUZ, "float8e5m2fnuz", 1, 8},
    {DataType::kUInt4, "uint4", 1, 4},
    {DataType::kInt4, "int4", 1, 4},
    {DataType::kFloat4E2M1, "float4e2m1", 1, 4},
    {DataType::kFloat8E8M0, "float8e8m0", 1, 8},
    {DataType::kUInt2, "uint2", 1, 2},
    {DataType::kInt2, "int2", 1, 2},
};
const DTypeInfo* info(DataType t) {
  auto i = static_cast<int32_t>(t);
  if (i < 0 || i >= static_cast<int32_t>(std::size(kInfos))) return nullptr;
  return &kInfos[i];
}
}  // namespace

size_t dtype_size(DataType t) {
  const DTypeInfo* i = info(t);
  return i ? i->size : 0;
}
const char* dtype_name(DataType t) {
  const DTypeInfo* i = info(t);
  return i ? i->name : "unknown";
}
bool dtype_from_name(const std::string& name, DataType* out) {
  for (const auto& i : kInfos) {
    if (name == i.name) {
      *out = i.type;
      return true;
    }
  }
  return false;
}
bool dtype_is_known(int32_t code) { return code > 0 && code < static_cast<int32_t>(std::size(kInfos)); }
int dtype_packed_bits(DataType t) {
  const DTypeInfo* i = info(t);
  return i ? i->packed_bits : 0;
}
bool dtype_is_float(DataType t) {
  switch (t) {
    case DataType::kFloat32:
    case DataType::kFloat16:
    case DataType::kFloat64:
    case DataType::kBFloat16:
    case DataType::kFloat8E4M3FN:
    case DataType::kFloat8E4M3FNUZ:
    case DataType::kFloat8E5M2:
    case DataType::kFloat8E5M2FNUZ:
    case DataType::kFloat4E2M1:
    case DataType::kFloat8E8M0: return true;
    default: return false;
  }
}
bool dtype_is_integer(DataType t) {
  switch (t) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kUInt16:
    case DataType::kInt16:
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kUInt32:
    case DataType::kUInt64:
    case DataType::kUInt4:
    case DataType::kInt4:
    case DataType::kUInt2:
    case DataType::kInt2: return true;
    default: return false;
  }
}
bool dtype_is_signed(DataType t) {
  switch (t) {
    case DataType::kInt8:
    case DataType::kInt16:
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kInt4:
    case DataType::kInt2: return true;
    default: return dtype_is_float(t);
  }
}

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: value = mant * 2^-24
      float v = std::ldexp(static_cast<float>(mant), -24);
      std::memcpy(&bits, &v, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to Inf
  if (abs < 0x38800000u) {                                               // subnormal or zero in half
    float a;
    std::memcpy(&a, &abs, 4);
    float scaled = a * 16777216.0f;                          // 2^24, exact
    auto m = static_cast<uint32_t>(std::nearbyint(scaled));  // default rounding: to nearest even
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t mant = abs & 0x7fffffu;
  uint32_t exp = (abs >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float bfloat16_to_float(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

namespace {
// Description of a small float format; decoding by formula, encoding by nearest table entry.
struct SmallFloat {
  int exp_bits, mant_bits, bias;
  bool fnuz;     // no negative zero; 0x80 is NaN
  bool has_inf;  // IEEE-style Inf/NaN at max exponent (E5M2)
  bool e4m3fn;   // only S.1111.111 is NaN
};
SmallFloat format_of(DataType t) {
  switch (t) {
    case DataType::kFloat8E4M3FN: return {4, 3, 7, false, false, true};
    case DataType::kFloat8E4M3FNUZ: return {4, 3, 8, true, false, false};
    case DataType::kFloat8E5M2: return {5, 2, 15, false, true, false};
    case DataType::kFloat8E5M2FNUZ: return {5, 2, 16, true, false, false};
    default: return {2, 1, 1, false, false, false};  // float4 e2m1: no NaN, no Inf
  }
}
float decode_small(uint32_t v, const SmallFloat& f, int total_bits) {
  uint32_t sign_bit = 1u << (total_bits - 1);
  uint32_t mag = v & (sign_bit - 1);
  bool neg = v & sign_bit;
  uint32_t exp = mag >> f.mant_bits;
  uint32_t mant = mag & ((1u << f.mant_bits) - 1);
  uint32_t max_exp = (1u << f.exp_bits) - 1;
  if (f.fnuz && v == sign_bit) return std::numeric_limits<float>::quiet_NaN();
  if (f.e4m3fn && exp == max_exp && mant == ((1u << f.mant_bits) - 1)) return std::numeric_limits<float>::quiet_NaN();
  if (f.has_inf && exp == max_exp) {
    if (mant != 0) return std::numeric_limits<float>::quiet_NaN();
    return neg ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  }
  float r;
  if (exp == 0)
    r = std::ldexp(static_cast<float>(mant), 1 - f.bias - f.mant_bits);
  else
    r = std::ldexp(static_cast<float>(mant | (1u << f.mant_bits)), static_cast<int>(exp) - f.bias - f.mant_bits);
  return neg ? -r : r;
}
uint32_t encode_small(float x, const SmallFloat& f, int total_bits, bool saturate, bool has_nan) {
  uint32_t sign_bit = 1u << (total_bits - 1);
  uint32_t nan_code = f.fnuz ? sign_bit : (sign_bit - 1);  // E5M2: 0x7f is a NaN too
  if (std::isnan(x)) return has_nan ? nan_code : 0;
  bool neg = std::signbit(x);
  float a = std::fabs(x);
  // Positive finite codes in increasing order of value.
  uint32_t n = sign_bit;
  float max_finite = 0;
  uint32_t max_code = 0;
  for (uint32_t c = 0; c < n; ++c) {
    float v = decode_small(c, f, total_bits);
    if (std::isfinite(v) && v > max_finite) {
      max_finite = v;
      max_code = c;
    }
  }
  auto overflow = [&]() -> uint32_t {
    if (saturate) return (neg ? sign_bit : 0) | max_code;  // Inf too, as ONNX's reference does
    if (f.has_inf) return (neg ? sign_bit : 0) | (((1u << f.exp_bits) - 1) << f.mant_bits);
    return has_nan ? nan_code : ((neg ? sign_bit : 0) | max_code);
  };
  if (std::isinf(a)) return overflow();
  // Find the nearest code; ties go to the even code.
  uint32_t best = 0;
  float best_err = std::numeric_limits<float>::infinity();
  for (uint32_t c = 0; c <= max_code; ++c) {
    float v = decode_small(c, f, total_bits);
    if (!std::isfinite(v)) continue;
    float err = std::fabs(v - a);
    if (err < best_err || (err == best_err && (c & 1u) == 0)) {
      best_err = err;
      best = c;
    }
  }
  // Beyond the largest finite value by at least half an ulp: overflow.
  float prev = decode_small(max_code - 1, f, total_bits);
  float next = max_finite + (max_finite - prev);
  if (a > max_finite && (a - max_finite) >= (next - a)) {
    bool tie = (a - max_finite) == (next - a);
    if (!(tie && (max_code & 1u) == 0)) return overflow();
  }
  if (best == 0 && f.fnuz) return 0;  // no negative zero
  return (neg ? sign_bit : 0) | best;
}
}  // namespace

float float8_to_float(uint8_t v, DataType t) {
  if (t == DataType::kFloat8E8M0) {
    if (v == 0xff) return std::numeric_limits<float>::quiet_NaN();
    return std::ldexp(1.0f, static_cast<int>(v) - 127);
  }
  return decode_small(v, format_of(t), 8);
}

uint8_t float_to_float8(float x, DataType t, bool saturate) {
  if (t == DataType::kFloat8E8M0) return float_to_float8e8m0(x, saturate, E8M0Rounding::kUp);
  return static_cast<uint8_t>(encode_small(x, format_of(t), 8, saturate, true));
}

uint8_t float_to_float8e8m0(float x, bool saturate, E8M0Rounding mode) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  uint32_t exp = (bits >> 23) & 0xffu;
  uint32_t mant = bits & 0x7fffffu;
  if (exp == 0xffu) return 0xff;  // Inf, NaN
  bool round_up = false;
  switch (mode) {
    case E8M0Rounding::kUp: round_up = mant != 0; break;
    case E8M0Rounding::kDown: round_up = false; break;
    case E8M0Rounding::kNearest: {
      bool half = mant & 0x400000u;          // the first dropped bit
      bool rest = mant & 0x3fffffu;          // any bit below it
      round_up = half && (rest || exp > 0);  // normal numbers: halves go up
      break;
    }
  }
  if (round_up && exp == 0xfeu && saturate) round_up = false;
  return static_cast<uint8_t>(exp + (round_up ? 1 : 0));  // 0xfe + 1 = 0xff: NaN
}

float float4e2m1_to_float(uint8_t v) { return decode_small(v & 0xf, format_of(DataType::kFloat4E2M1), 4); }

uint8_t float_to_float4e2m1(float f, bool saturate) {
  (void)saturate;  // float4e2m1 has no Inf/NaN: out-of-range values always saturate
  return static_cast<uint8_t>(encode_small(f, format_of(DataType::kFloat4E2M1), 4, true, false));
}

}  // namespace kiln
