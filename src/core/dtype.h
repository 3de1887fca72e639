// Element types. Numbering follows ONNX's TensorProto.DataType so that files and engines agree.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace kiln {

enum class DataType : int32_t {
  kUndefined = 0,
  kFloat32 = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kUInt16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kFloat64 = 11,
  kUInt32 = 12,
  kUInt64 = 13,
  kComplex64 = 14,
  kComplex128 = 15,
  kBFloat16 = 16,
  kFloat8E4M3FN = 17,
  kFloat8E4M3FNUZ = 18,
  kFloat8E5M2 = 19,
  kFloat8E5M2FNUZ = 20,
  kUInt4 = 21,
  kInt4 = 22,
  kFloat4E2M1 = 23,
  kFloat8E8M0 = 24,
  kUInt2 = 25,
  kInt2 = 26,
};

// Size of one element in kiln's in-memory layout. Sub-byte types (int4, uint4, float4, int2, uint2)
// are stored unpacked, one byte per element; packing happens only at file boundaries.
size_t dtype_size(DataType t);
const char* dtype_name(DataType t);  // "float32", "int64", ...
bool dtype_from_name(const std::string& name, DataType* out);
bool dtype_is_known(int32_t onnx_code);
bool dtype_is_float(DataType t);    // any floating type, incl. float8/float4
bool dtype_is_integer(DataType t);  // signed or unsigned integer (not bool)
bool dtype_is_signed(DataType t);
// Number of bits a packed element occupies in ONNX files (4 for int4, 2 for int2, else 8*size).
int dtype_packed_bits(DataType t);

// 16-bit and 8-bit float conversions (round to nearest even, NaN/Inf handled per format).
struct Float16 {
  uint16_t bits = 0;
};
struct BFloat16 {
  uint16_t bits = 0;
};

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bfloat16_to_float(uint16_t b);
// Rounds to nearest even; a NaN stays a quiet NaN. Inline and branch-free, so loops over it vectorize.
inline uint16_t float_to_bfloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}
// Float8 and float4: `saturate` clamps out-of-range finite values to the largest finite value
// (ONNX Cast's default), otherwise they become Inf or NaN as the format allows.
float float8_to_float(uint8_t v, DataType t);
uint8_t float_to_float8(float f, DataType t, bool saturate);
// Float8 E8M0 (powers of two, no sign) rounds by mode, following ONNX's reference: kUp rounds any
// fraction up to the next power of two, kDown truncates, kNearest rounds halves up. Inf and NaN
// give NaN (0xff); `saturate` keeps finite values that would round past 2^127 at 2^127.
// The sign is ignored (the magnitude is encoded). float_to_float8(x, kFloat8E8M0, s) uses kUp.
enum class E8M0Rounding { kUp, kDown, kNearest };
uint8_t float_to_float8e8m0(float f, bool saturate, E8M0Rounding mode);
float float4e2m1_to_float(uint8_t v);
uint8_t float_to_float4e2m1(float f, bool saturate);

}  // namespace kiln
