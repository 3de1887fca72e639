// String ops: StringNormalizer, StringConcat, StringSplit, RegexFullMatch.
//
// Case changes cover ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic letters (UTF-8); other
// scripts pass through unchanged (the spec leaves this to the `locale`, which is not consulted).
// RegexFullMatch uses std::regex (ECMAScript grammar) where the spec names RE2: the common syntax
// (classes, \w \d \s \b, quantifiers, groups, alternation, anchors) agrees; RE2-only syntax such as
// (?i) flags, \A / \z, (?P<name>...) and \pL classes is rejected with an error, and ECMAScript-only
// syntax RE2 rejects (backreferences, lookaround) is accepted.
#include <regex>
#include <set>

#include "ops/common.h"

namespace kiln::ops {
namespace {

Status require_string(const KernelContext& ctx, const Tensor& t, const char* name) {
  if (t.dtype() != DataType::kString) return ctx.error(str_cat(name, " must be a string tensor, got ", t.describe()));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// UTF-8 case mapping.

// Decodes one code point at s[i]; invalid bytes decode as themselves (one byte).
uint32_t decode_utf8(const std::string& s, size_t& i) {
  auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t c = b(i);
  auto cont = [&](size_t k) { return k < s.size() && (b(k) & 0xC0) == 0x80; };
  if (c < 0x80) return s[i++], c;
  if ((c & 0xE0) == 0xC0 && cont(i + 1)) {
    uint32_t cp = ((c & 0x1Fu) << 6) | (b(i + 1) & 0x3Fu);
    i += 2;
    return cp;
  }
  if ((c & 0xF0) == 0xE0 && cont(i + 1) && cont(i + 2)) {
    uint32_t cp = ((c & 0x0Fu) << 12) | ((b(i + 1) & 0x3Fu) << 6) | (b(i + 2) & 0x3Fu);
    i += 3;
    return cp;
  }
  if ((c & 0xF8) == 0xF0 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
    uint32_t cp = ((c & 0x07u) << 18) | ((b(i + 1) & 0x3Fu) << 12) | ((b(i + 2) & 0x3Fu) << 6) | (b(i + 3) & 0x3Fu);
    i += 4;
    return cp;
  }
  ++i;
  return 0x80000000u | c;  // a stray byte: kept verbatim
}

void encode_utf8(uint32_t cp, std::string& out) {
  if (cp & 0x80000000u) {
    out.push_back(static_cast<char>(cp & 0xFF));
  } else if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t to_lower_cp(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;  // Latin-1
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17E && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149)  // Latin Extended-A pairs
    return ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) ? (c % 2 ? c + 1 : c) : (c % 2 ? c : c + 1);
  if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;  // Greek
  if (c >= 0x410 && c <= 0x42F) return c + 32;                // Cyrillic
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

uint32_t to_upper_cp(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c == 0x3C2) return 0x3A3;  // final sigma
  if (c >= 0x100 && c <= 0x17E && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x178)
    return ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) ? (c % 2 ? c : c - 1) : (c % 2 ? c - 1 : c);
  if (c >= 0x3B1 && c <= 0x3CB && c != 0x3C2) return c - 32;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

std::string change_case(const std::string& s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = decode_utf8(s, i);
    if (!(cp & 0x80000000u)) cp = upper ? to_upper_cp(cp) : to_lower_cp(cp);
    encode_utf8(cp, out);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// StringNormalizer: drops stopwords (whole elements), then changes case. Input [C] or [1, C].

Status infer_string_normalizer(InferContext& ctx) {
  const SymShape& in = ctx.input_shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, DataType::kString, SymShape());
    return Status::Ok();
  }
  if (in.rank() == 1) {
    ctx.set_output(0, DataType::kString, SymShape({ctx.new_symbol()}));
  } else if (in.rank() == 2) {
    if (in.dims[0].known() && in.dims[0].value != 1)
      return ctx.error(str_cat("input must be [C] or [1, C], got ", in.str()));
    ctx.set_output(0, DataType::kString, SymShape({Dim(1), ctx.new_symbol()}));
  } else {
    return ctx.error(str_cat("input must be [C] or [1, C], got ", in.str()));
  }
  return Status::Ok();
}

Status string_normalizer_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  KILN_RETURN_IF_ERROR(require_string(ctx, x, "X"));
  if (!(x.rank() == 1 || (x.rank() == 2 && x.dim(0) == 1)))
    return ctx.error(str_cat("input must be [C] or [1, C], got ", x.describe()));
  std::string action = ctx.node.attr_string("case_change_action", "NONE");
  if (action != "NONE" && action != "LOWER" && action != "UPPER")
    return ctx.error(str_cat("case_change_action must be NONE, LOWER or UPPER, got '", action, "'"));
  bool case_sensitive = ctx.node.attr_int("is_case_sensitive", 0) != 0;
  std::set<std::string> stops;
  if (const ir::Attribute* a = ctx.node.attr("stopwords"))
    for (const auto& w : a->strings) stops.insert(case_sensitive ? w : change_case(w, false));
  std::vector<std::string> kept;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const std::string& s = x.strings()[i];
    if (stops.count(case_sensitive ? s : change_case(s, false))) continue;
    if (action == "NONE")
      kept.push_back(s);
    else
      kept.push_back(change_case(s, action == "UPPER"));
  }
  if (kept.empty()) kept.emplace_back();  // all dropped: one empty string
  int64_t c = static_cast<int64_t>(kept.size());
  Tensor out(DataType::kString, x.rank() == 1 ? Dims{c} : Dims{1, c});
  for (int64_t i = 0; i < c; ++i) out.strings()[i] = std::move(kept[static_cast<size_t>(i)]);
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// StringConcat: elementwise concatenation with broadcasting.

Status infer_string_concat(InferContext& ctx) {
  ctx.set_output(0, DataType::kString, broadcast_sym(ctx.input_shape(0), ctx.input_shape(1)));
  return Status::Ok();
}

Status string_concat_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  KILN_RETURN_IF_ERROR(require_string(ctx, a, "X"));
  KILN_RETURN_IF_ERROR(require_string(ctx, b, "Y"));
  KILN_ASSIGN_OR_RETURN(Dims shape, broadcast_dims(a.shape(), b.shape()));
  Tensor out(DataType::kString, shape);
  BroadcastIndex ia(a.shape(), shape), ib(b.shape(), shape);
  for (int64_t i = 0; i < out.numel(); ++i) out.strings()[i] = a.strings()[ia(i)] + b.strings()[ib(i)];
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// StringSplit: Python str.split semantics. Output 0 is X.shape + [max pieces] padded with "",
// output 1 the number of pieces per element.

std::vector<std::string> split_string(const std::string& s, const std::string& delim, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (delim.empty()) {  // runs of whitespace; leading/trailing whitespace ignored
    auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && is_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.push_back(s.substr(i));  // the rest, trailing whitespace included (as Python)
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_space(s[j])) ++j;
      parts.push_back(s.substr(i, j - i));
      i = j;
    }
    return parts;
  }
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) break;
    size_t p = s.find(delim, start);
    if (p == std::string::npos) break;
    parts.push_back(s.substr(start, p - start));
    start = p + delim.size();
  }
  parts.push_back(s.substr(start));
  return parts;
}

Status infer_string_split(InferContext& ctx) {
  const SymShape& in = ctx.input_shape(0);
  if (in.rank_known) {
    std::vector<Dim> d = in.dims;
    d.push_back(ctx.new_symbol());
    ctx.set_output(0, DataType::kString, SymShape(d));
  } else {
    ctx.set_output(0, DataType::kString, SymShape());
  }
  ctx.set_output(1, DataType::kInt64, in);
  return Status::Ok();
}

Status string_split_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  KILN_RETURN_IF_ERROR(require_string(ctx, x, "X"));
  std::string delim = ctx.node.attr_string("delimiter", "");
  const ir::Attribute* ms = ctx.node.attr("maxsplit");
  int64_t maxsplit = ms ? ms->i : -1;
  if (ms && maxsplit < 0) maxsplit = -1;  // negative: no limit (Python's convention)
  std::vector<std::vector<std::string>> parts(static_cast<size_t>(x.numel()));
  int64_t widest = 0;
  Tensor lengths(DataType::kInt64, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    parts[static_cast<size_t>(i)] = split_string(x.strings()[i], delim, maxsplit);
    int64_t n = static_cast<int64_t>(parts[static_cast<size_t>(i)].size());
    lengths.data<int64_t>()[i] = n;
    widest = std::max(widest, n);
  }
  Dims shape = x.shape();
  shape.push_back(widest);
  Tensor out(DataType::kString, shape);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const auto& p = parts[static_cast<size_t>(i)];
    for (size_t k = 0; k < p.size(); ++k) out.strings()[i * widest + static_cast<int64_t>(k)] = p[k];
  }
  ctx.set_output(0, std::move(out));
  ctx.set_output(1, std::move(lengths));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// RegexFullMatch

Status infer_regex_full_match(InferContext& ctx) {
  ctx.set_output(0, DataType::kBool, ctx.input_shape(0));
  return Status::Ok();
}

// RE2 syntax std::regex would misread or reject with a less helpful message.
Status check_re2_only_syntax(const KernelContext& ctx, const std::string& p) {
  for (size_t i = 0; i + 1 < p.size(); ++i) {
    if (p[i] == '\\') {
      char c = p[i + 1];
      if (c == 'A' || c == 'z' || c == 'Q' || c == 'E' || c == 'p' || c == 'P' || c == 'C')
        return ctx.unsupported(str_cat("pattern '", p, "': RE2 escape \\", c, " is not supported (std::regex)"));
      ++i;
    } else if (p[i] == '(' && p[i + 1] == '?' && i + 2 < p.size() && p[i + 2] != ':' && p[i + 2] != '=' &&
               p[i + 2] != '!') {
      return ctx.unsupported(
          str_cat("pattern '", p, "': RE2 group syntax (?", p[i + 2], "...) is not supported (std::regex)"));
    }
  }
  return Status::Ok();
}

Status regex_full_match_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  KILN_RETURN_IF_ERROR(require_string(ctx, x, "X"));
  const ir::Attribute* pa = ctx.node.attr("pattern");
  if (!pa) return ctx.error("attribute 'pattern' is required");
  KILN_RETURN_IF_ERROR(check_re2_only_syntax(ctx, pa->s));
  std::regex re;
  try {
    re = std::regex(pa->s, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return ctx.error(str_cat("invalid pattern '", pa->s, "': ", e.what()));
  }
  Tensor out(DataType::kBool, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    try {
      out.data<bool>()[i] = std::regex_match(x.strings()[i], re);
    } catch (const std::regex_error& e) {
      return ctx.error(str_cat("matching '", pa->s, "' failed on element ", i, ": ", e.what()));
    }
  }
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", StringNormalizer, 10, infer_string_normalizer, string_normalizer_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", StringConcat, 20, infer_string_concat, string_concat_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", StringSplit, 20, infer_string_split, string_split_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", RegexFullMatch, 20, infer_regex_full_match, regex_full_match_kernel, 1, 1);

}  // namespace kiln::ops
