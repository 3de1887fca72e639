#include "core/checksum.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KILN_CRC_X86 1
#endif

namespace kiln {

namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // CRC-32C, reflected

// tables[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
      t[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b)
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
};

#if KILN_CRC_X86
// The crc32 instruction has a latency of 3 cycles and a throughput of 1: three independent streams
// over three consecutive blocks keep it busy, and the three states are joined with "shift by one
// block" (multiplying by x^(8*kBlock) mod P, a linear map applied byte-wise through 4 tables).
constexpr size_t kBlock = 4096;

// The raw (un-inverted) state after feeding `n` zero bytes to state `c`.
__attribute__((target("sse4.2"))) uint32_t raw_zeros(uint32_t c, size_t n) {
  uint64_t s = c;
  for (; n >= 8; n -= 8) s = _mm_crc32_u64(s, 0);
  for (; n > 0; --n) s = _mm_crc32_u8(static_cast<uint32_t>(s), 0);
  return static_cast<uint32_t>(s);
}

struct BlockShift {
  std::array<std::array<uint32_t, 256>, 4> t{};
  BlockShift() {
    uint32_t basis[32];
    for (int i = 0; i < 32; ++i) basis[i] = raw_zeros(1u << i, kBlock);
    for (int k = 0; k < 4; ++k)
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int i = 0; i < 8; ++i)
          if (b & (1u << i)) v ^= basis[8 * k + i];
        t[static_cast<size_t>(k)][b] = v;
      }
  }
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, const uint8_t* p, size_t n) {
  static const BlockShift shift;
  uint64_t c = ~crc;
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7); --n) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
  for (; n >= 3 * kBlock; n -= 3 * kBlock, p += 3 * kBlock) {
    uint64_t a = c, b = 0, d = 0;
    for (size_t i = 0; i < kBlock; i += 8) {
      uint64_t x, y, z;
      std::memcpy(&x, p + i, 8);
      std::memcpy(&y, p + kBlock + i, 8);
      std::memcpy(&z, p + 2 * kBlock + i, 8);
      a = _mm_crc32_u64(a, x);
      b = _mm_crc32_u64(b, y);
      d = _mm_crc32_u64(d, z);
    }
    // state(A B C) = shift(shift(a) ^ b) ^ d: the CRC update is linear in the state.
    c = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(d);
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  for (; n > 0; --n) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
  return ~static_cast<uint32_t>(c);
}
#endif

}  // namespace

uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n) {
  static const Tables tables;
  const auto& t = tables.t;
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;  // little-endian hosts (every host kiln builds for)
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][hi & 0xff] ^
        t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
  }
  for (; n > 0; --n) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return ~c;
}

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
#if KILN_CRC_X86
  static const bool hw = __builtin_cpu_supports("sse4.2");
  if (hw) return crc32c_sse42(crc, static_cast<const uint8_t*>(data), n);
#endif
  return crc32c_portable(crc, data, n);
}

}  // namespace kiln
