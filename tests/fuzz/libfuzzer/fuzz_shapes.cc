// libFuzzer target: the --shapes parser (tools/cli_common.cc) and the engine profile parser
// (engine/profiles.cc, JSON from an engine header). The first byte picks which.
#include <string>

#include "core/bounded_json.h"
#include "engine/profiles.h"
#include "fuzz_util.h"
#include "tools/cli_common.h"

KILN_FUZZ_TARGET(shapes) {
  if (size < 1) return 0;
  std::string s(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) {
    auto r = kiln::tools::parse_shapes(s);
    if (!r.ok() && r.status().message().empty()) __builtin_trap();
  } else {
    auto j = kiln::parse_bounded_json(s, "profiles", kiln::ErrorCode::kInvalidModel);
    if (!j.ok()) return 0;
    auto p = kiln::detail::profiles_from_json(j.value());
    if (!p.ok() && p.status().message().empty()) __builtin_trap();
  }
  return 0;
}
