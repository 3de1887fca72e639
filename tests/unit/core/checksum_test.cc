#include "core/checksum.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace kiln {
namespace {

TEST(Crc32c, KnownVectors) {
  // RFC 3720 (iSCSI) appendix B.4 and the common check value.
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c(0, zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(0, ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(0, inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(0, nullptr, 0), 0u);
}

TEST(Crc32c, HardwareAndPortableAgreeAndChain) {
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(3 * 4096 * 2 + 100);  // spans the 3-stream blocks of the SSE4.2 path
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t off : {0, 1, 3, 7}) {
    for (size_t n : {0, 1, 5, 8, 9, 63, 64, 1000, 4090, 3 * 4096 - 1, 3 * 4096, 3 * 4096 + 9, 6 * 4096 + 50}) {
      const uint8_t* p = buf.data() + off;
      uint32_t whole = crc32c(0, p, n);
      EXPECT_EQ(whole, crc32c_portable(0, p, n)) << "offset " << off << " length " << n;
      size_t half = n / 3;
      EXPECT_EQ(whole, crc32c(crc32c(0, p, half), p + half, n - half)) << "chained, length " << n;
    }
  }
  // A flipped bit changes the checksum.
  uint32_t before = crc32c(0, buf.data(), buf.size());
  buf[9000] ^= 0x10;
  EXPECT_NE(before, crc32c(0, buf.data(), buf.size()));
}

}  // namespace
}  // namespace kiln
