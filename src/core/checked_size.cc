#include "core/checked_size.h"

#include <atomic>
#include <cstdlib>
#include <limits>

namespace kiln {

namespace {

size_t env_limit() {
  const char* s = std::getenv("KILN_MAX_TENSOR_BYTES");
  if (!s || !*s) return kDefaultMaxTensorBytes;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || *end != '\0' || v == 0) return kDefaultMaxTensorBytes;  // unparsable: the default
  return static_cast<size_t>(v);
}

std::atomic<size_t> g_limit{0};  // 0: not set, use the environment's

}  // namespace

bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

bool checked_add(int64_t a, int64_t b, int64_t* out) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

Result<int64_t> checked_numel(const Dims& dims, std::string_view what, ErrorCode code) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0) return Status(code, str_cat(what, ": negative dimension ", d, " in shape ", dims_str(dims)));
  }
  for (int64_t d : dims) {
    if (!checked_mul(n, d, &n))
      return Status(code, str_cat(what, ": shape ", dims_str(dims), " has more elements than fit in 64 bits"));
  }
  return n;
}

Result<size_t> checked_tensor_bytes(DataType dt, const Dims& dims, const std::string& what, ErrorCode code) {
  KILN_ASSIGN_OR_RETURN(int64_t n, checked_numel(dims, what, code));
  int64_t es = dt == DataType::kString ? static_cast<int64_t>(sizeof(std::string))
                                       : static_cast<int64_t>(std::max<size_t>(dtype_size(dt), 1));
  int64_t bytes;
  size_t limit = max_tensor_bytes();
  if (!checked_mul(n, es, &bytes) || static_cast<uint64_t>(bytes) > limit)
    return Status(code, str_cat(what, ": a ", dtype_name(dt), " tensor of shape ", dims_str(dims), " would take ",
                                checked_mul(n, es, &bytes) ? std::to_string(bytes) : std::string("more than 2^63"),
                                " bytes, more than the limit of ", limit,
                                " bytes on one tensor read from a file (raise it with KILN_MAX_TENSOR_BYTES)"));
  return static_cast<size_t>(bytes);
}

size_t max_tensor_bytes() {
  static const size_t from_env = env_limit();
  size_t v = g_limit.load(std::memory_order_relaxed);
  return v ? v : from_env;
}

void set_max_tensor_bytes(size_t n) { g_limit.store(n, std::memory_order_relaxed); }

}  // namespace kiln
