// libFuzzer target: the engine loader. Mutated engines almost never keep valid checksums, which
// would stop every input at the CRC check; so when the first byte of the input is odd, the checksums
// are recomputed for the mutated bytes and the loader goes on to the header JSON, the profiles, the
// graph and the weight references.
#include <cstring>
#include <string>

#include "core/checksum.h"
#include "engine/engine_impl.h"
#include "fuzz_util.h"

KILN_FUZZ_TARGET(engine) {
  kiln::fuzz::bound_allocations();
  if (size < 1) return 0;
  bool fix = data[0] & 1;
  std::string b(reinterpret_cast<const char*>(data + 1), size - 1);
  if (fix && b.size() >= 32) {
    uint32_t hlen;
    std::memcpy(&hlen, b.data() + 12, 4);
    if (hlen <= b.size() - 32) {
      uint32_t hc = kiln::crc32c(0, b.data() + 32, hlen),
               bc = kiln::crc32c(0, b.data() + 32 + hlen, b.size() - 32 - hlen);
      std::memcpy(b.data() + 24, &hc, 4);
      std::memcpy(b.data() + 28, &bc, 4);
    }
  }
  auto e = kiln::detail::deserialize_engine(b);
  if (!e.ok() && e.status().message().empty()) __builtin_trap();
  return 0;
}
