// Status and Result: how errors travel inside kiln. User errors never abort; internal invariants
// use KILN_CHECK, which aborts with file and line.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // bad input from the caller (shape, dtype, value)
  kInvalidModel,     // the model file or graph is malformed
  kUnsupported,      // valid, but kiln cannot do it (op, dtype, attribute)
  kNotFound,         // a file, name or value is missing
  kIOError,          // reading or writing failed
  kOutOfRange,       // shape outside a profile, index out of bounds
  kInternal,         // a bug in kiln
  // A run stopped at its deadline (ExecutionContext::set_deadline, --deadline): neither the input's
  // fault nor a bug, and worth telling apart (a caller may retry with more time).
  kDeadlineExceeded,
};

const char* error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

  // Prepends context ("node 'conv_7' (Conv): ") to the message, keeping the code.
  Status with_context(const std::string& prefix) const {
    if (ok()) return *this;
    return Status(code_, prefix + message_);
  }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

// Builds a message from streamable parts: Invalid("axis ", axis, " out of range").
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <typename... Args>
Status InvalidArgument(Args&&... args) {
  return Status(ErrorCode::kInvalidArgument, str_cat(std::forward<Args>(args)...));
}
template <typename... Args>
Status InvalidModel(Args&&... args) {
  return Status(ErrorCode::kInvalidModel, str_cat(std::forward<Args>(args)...));
}
template <typename... Args>
Status Unsupported(Args&&... args) {
  return Status(ErrorCode::kUnsupported, str_cat(std::forward<Args>(args)...));
}
template <typename... Args>
Status NotFound(Args&&... args) {
  return Status(ErrorCode::kNotFound, str_cat(std::forward<Args>(args)...));
}
template <typename... Args>
Status IOError(Args&&... args) {
  return Status(ErrorCode::kIOError, str_cat(std::forward<Args>(args)...));
}
template <typename... Args>
Status OutOfRange(Args&&... args) {
  return Status(ErrorCode::kOutOfRange, str_cat(std::forward<Args>(args)...));
}
template <typename... Args>
Status DeadlineExceeded(Args&&... args) {
  return Status(ErrorCode::kDeadlineExceeded, str_cat(std::forward<Args>(args)...));
}
template <typename... Args>
Status Internal(Args&&... args) {
  return Status(ErrorCode::kInternal, str_cat(std::forward<Args>(args)...));
}

// Result<T>: a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

#define KILN_RETURN_IF_ERROR(expr)       \
  do {                                   \
    ::kiln::Status _kiln_st = (expr);    \
    if (!_kiln_st.ok()) return _kiln_st; \
  } while (0)

#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

#define KILN_ASSIGN_OR_RETURN(lhs, expr) KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(_kiln_res_, __LINE__), lhs, expr)

// Internal invariant: aborts with file and line. Never for user errors.
#define KILN_CHECK(cond)                                                         \
  do {                                                                           \
    if (!(cond)) ::kiln::check_failed(__FILE__, __LINE__, #cond, std::string()); \
  } while (0)
