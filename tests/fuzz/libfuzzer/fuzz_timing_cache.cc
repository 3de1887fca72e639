// libFuzzer target: the timing-cache reader. The identity matches the seeds' ("machine": "fuzz"),
// so mutated files get past the version checks to the entries. Every input must open (a bad file is
// a warning and an empty cache), never abort.
#include "fuzz_util.h"
#include "tune/timing_cache.h"

KILN_FUZZ_TARGET(timing_cache) {
  kiln::fuzz::MemFile f(data, size);
  if (!f.ok()) return 0;
  kiln::tune::CacheIdentity id{KILN_VERSION, "fuzz", "fuzz"};
  auto c = kiln::tune::TimingCache::open(f.path(), id, [](const std::string& w) {
    if (w.empty()) __builtin_trap();  // a warning always says why the file is ignored
  });
  (void)c.find("x", "y", 1);
  return 0;
}
