#include "core/bounded_json.h"

namespace kiln {

int json_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

Result<nlohmann::json> parse_bounded_json(std::string_view text, const std::string& what, ErrorCode code,
                                          int max_depth) {
  if (json_depth(text, max_depth) > max_depth)
    return Status(code, str_cat(what, " nests arrays/objects deeper than ", max_depth,
                                " levels (kiln's own files nest a few): refused"));
  try {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded())
      return Status(code, str_cat(what, text.empty() ? " is empty" : " is not valid JSON (truncated?)"));
    return j;
  } catch (const std::bad_alloc&) {
    return Status(code, str_cat(what, ": not enough memory to parse it"));
  } catch (const std::exception& e) {
    return Status(code, str_cat(what, " is not valid JSON (", e.what(), ")"));
  }
}

}  // namespace kiln
