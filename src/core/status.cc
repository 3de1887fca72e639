#include "core/status.h"

namespace kiln {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kInvalidModel: return "invalid model";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kIOError: return "I/O error";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kDeadlineExceeded: return "deadline exceeded";
  }
  return "unknown error";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(error_code_name(code_)) + ": " + message_;
}

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "kiln internal check failed at %s:%d: %s %s\n", file, line, cond, msg.c_str());
  std::abort();
}

}  // namespace kiln
