// CRC-32C (Castagnoli), the checksum of engine files: the SSE4.2 crc32 instruction where the CPU has
// it (about 8 bytes per 3 cycles: a 100 MB engine in ~15 ms), a table-driven portable path
// elsewhere, both giving the same value. crc32c(crc32c(0, a), b) == crc32c(0, a + b).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln {

uint32_t crc32c(uint32_t crc, const void* data, size_t n);
// The portable path, for tests that compare both.
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n);

}  // namespace kiln
