// Overflow-checked element counts and byte sizes for anything a file declares (an .npy header, a
// TensorProto's dims, an engine weight, a profile). A shape whose element count overflows int64, or
// a tensor larger than the allocation limit, is an error naming it, its shape and the bytes it would
// take, before anything is allocated: a file must never make kiln wrap a size to 0 bytes and
// "succeed", nor throw bad_alloc.
//
// The limit on one file-driven allocation is KILN_MAX_TENSOR_BYTES (bytes, read once; default
// 16 GiB), or set_max_tensor_bytes() (tests, API users).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/status.h"

namespace kiln {

constexpr size_t kDefaultMaxTensorBytes = size_t{16} << 30;

// a * b for non-negative a, b; false on overflow (out is left unset).
bool checked_mul(int64_t a, int64_t b, int64_t* out);
// a + b for non-negative a, b; false on overflow.
bool checked_add(int64_t a, int64_t b, int64_t* out);

// The element count of `dims`. A negative dim or an overflow is an error of category `code`,
// prefixed by `what` ("initializer 'w'"): a view, so that a kernel's literal builds no string per call.
Result<int64_t> checked_numel(const Dims& dims, std::string_view what, ErrorCode code = ErrorCode::kInvalidArgument);

// The bytes kiln's in-memory layout of a `dt` tensor of `dims` takes (strings count their
// std::string objects), checked for overflow and against max_tensor_bytes().
Result<size_t> checked_tensor_bytes(DataType dt, const Dims& dims, const std::string& what,
                                    ErrorCode code = ErrorCode::kInvalidArgument);

size_t max_tensor_bytes();
void set_max_tensor_bytes(size_t n);  // 0 restores the default (or KILN_MAX_TENSOR_BYTES)

}  // namespace kiln
