// libFuzzer target: the .npy parser, and the .npz reader on the same bytes (zip members, zip64
// sizes, deflate), through a memfd.
#include <string_view>

#include "core/npy.h"
#include "fuzz_util.h"

KILN_FUZZ_TARGET(npy) {
  kiln::fuzz::bound_allocations();
  auto t = kiln::parse_npy(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.npy");
  if (!t.ok() && t.status().message().empty()) __builtin_trap();
  kiln::fuzz::MemFile f(data, size);
  if (!f.ok()) return 0;
  auto z = kiln::read_npz(f.path());
  if (!z.ok() && z.status().message().empty()) __builtin_trap();
  return 0;
}
