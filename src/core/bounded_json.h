// JSON from files other people wrote (engine headers, timing caches): parsed with its nesting
// bounded, so that a 100,000-deep "[[[[..." is a named error instead of a stack overflow in the
// recursive parts of nlohmann::json (copying, dumping, comparing a value all recurse).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "core/status.h"

namespace kiln {

// kiln's own files nest a handful of levels; 64 leaves room for anything a future version adds.
constexpr int kMaxJsonDepth = 64;

// The deepest nesting of arrays and objects in `text` (strings skipped), stopping early past `limit`.
int json_depth(std::string_view text, int limit);

// Parses `text`; deeper than `max_depth`, or not JSON, is an error of category `code` naming `what`.
Result<nlohmann::json> parse_bounded_json(std::string_view text, const std::string& what, ErrorCode code,
                                          int max_depth = kMaxJsonDepth);

}  // namespace kiln
