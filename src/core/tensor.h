// Tensor: a typed, shaped view of shared, 64-byte-aligned storage. Copies share storage;
// clone() makes an independent copy. Strings live in their own vector.
#pragma once

#include <complex>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/status.h"

namespace kiln {

// Where a tensor's bytes live. Host memory for everything today; the CUDA backend's device buffers
// will say kCuda, and the runtime checks that a tensor given to an engine lives where its layers
// read (a device tensor given to a CPU engine is an error naming the input, not a crash).
struct MemoryLocation {
  enum class Kind : uint8_t { kHost, kCuda };
  Kind kind = Kind::kHost;
  int device = 0;  // the device index for kCuda
  bool host() const { return kind == Kind::kHost; }
  std::string str() const { return host() ? "host" : "cuda:" + std::to_string(device); }
  bool operator==(const MemoryLocation&) const = default;
};

class Tensor {
 public:
  Tensor() = default;
  // Zero-initialized tensor (empty strings for kString).
  Tensor(DataType dtype, Dims shape);
  // A tensor whose bytes are left as they come (not zeroed): for callers that write every byte next
  // (importing weights: zeroing hundreds of MB first costs as much as the copy). kString: empty strings.
  static Tensor uninitialized(DataType dtype, Dims shape);

  template <typename T>
  static Tensor scalar(DataType dtype, T value) {
    Tensor t(dtype, {});
    *t.data<T>() = value;
    return t;
  }
  template <typename T>
  static Tensor from_vector(DataType dtype, Dims shape, const std::vector<T>& values) {
    Tensor t(dtype, std::move(shape));
    KILN_CHECK(static_cast<int64_t>(values.size()) == t.numel());
    for (size_t i = 0; i < values.size(); ++i) t.data<T>()[i] = values[i];
    return t;
  }

  // A tensor over existing storage (no copy): `buffer` owns the memory, data starts at `offset`
  // bytes (64-byte aligned for fast kernels). Used for engine weights and memory-planned arenas.
  static Tensor alias(DataType dtype, Dims shape, std::shared_ptr<uint8_t[]> buffer, size_t offset,
                      MemoryLocation location = {});

  // Where the bytes live (host unless alias() said otherwise).
  const MemoryLocation& location() const { return location_; }

  bool defined() const { return dtype_ != DataType::kUndefined; }
  DataType dtype() const { return dtype_; }
  const Dims& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_[static_cast<size_t>(i)]; }
  int64_t numel() const { return dims_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  template <typename T>
  T* data() {
    return reinterpret_cast<T*>(raw());
  }
  template <typename T>
  const T* data() const {
    return reinterpret_cast<const T*>(raw());
  }
  void* raw() { return buffer_ ? buffer_.get() + offset_ : nullptr; }
  const void* raw() const { return buffer_ ? buffer_.get() + offset_ : nullptr; }
  std::string* strings() { return strings_ ? strings_->data() : nullptr; }
  const std::string* strings() const { return strings_ ? strings_->data() : nullptr; }

  // Same storage, new shape (numel must match).
  Tensor reshaped(Dims shape) const;
  // Becomes a fresh zeroed tensor of this dtype and shape, like `*this = Tensor(dtype, shape)`, but
  // the shape is copied into this tensor's own shape vector, reusing its capacity: a tensor renewed
  // at the same rank every run allocates no shape vector (tests/noalloc). The old storage is released.
  void renew(DataType dtype, const Dims& shape);
  void renew(DataType dtype, std::initializer_list<int64_t> shape);
  void renew(DataType dtype, std::span<const int64_t> shape);
  // renew() with the bytes left as they come (not zeroed), for callers that write every byte next (a
  // tactic's large outputs: zeroing them first would cost as much as the writes). kString: empty strings.
  void renew_uninitialized(DataType dtype, std::span<const int64_t> shape);
  // Becomes a view of `src`'s storage (its dtype, bytes and location) at `shape`, whose element count
  // must be src's, like `*this = src.reshaped(shape)` but the shape copied into this tensor's own shape
  // vector: no allocation once its capacity suffices (reference kernels' view outputs, tests/noalloc).
  void assign_view(const Tensor& src, std::span<const int64_t> shape);
  Tensor clone() const;

  // Element access through a common type, for reference kernels that are type-generic.
  double get_f64(int64_t i) const;
  int64_t get_i64(int64_t i) const;
  void set_f64(int64_t i, double v);
  void set_i64(int64_t i, int64_t v);

  // Converts to another dtype with ONNX Cast semantics (float->int saturates instead of UB;
  // `saturate` applies to float8 targets).
  Result<Tensor> cast(DataType to, bool saturate = true) const;

  std::string describe() const;  // "float32[1,3,224,224]"

 private:
  Tensor(DataType dtype, Dims shape, bool zero);  // zero: false leaves the bytes as allocated
  void renew_storage(bool zero = true);           // fresh bytes for dtype_ and shape_ (zeroed unless told)

  DataType dtype_ = DataType::kUndefined;
  Dims shape_;
  std::shared_ptr<uint8_t[]> buffer_;
  size_t offset_ = 0;
  MemoryLocation location_;
  std::shared_ptr<std::vector<std::string>> strings_;
};

// Calls fn(T{}) with the C++ type of a numeric dtype. Float16/BFloat16 map to Float16/BFloat16
// wrappers (raw bits); most reference kernels upcast those to float first.
#define KILN_DISPATCH_CASE(DT, T) \
  case DataType::DT: return fn(T{});

template <typename Fn>
auto dispatch_builtin(DataType t, Fn&& fn) {
  switch (t) {
    KILN_DISPATCH_CASE(kFloat32, float)
    KILN_DISPATCH_CASE(kFloat64, double)
    KILN_DISPATCH_CASE(kInt8, int8_t)
    KILN_DISPATCH_CASE(kInt16, int16_t)
    KILN_DISPATCH_CASE(kInt32, int32_t)
    KILN_DISPATCH_CASE(kInt64, int64_t)
    KILN_DISPATCH_CASE(kUInt8, uint8_t)
    KILN_DISPATCH_CASE(kUInt16, uint16_t)
    KILN_DISPATCH_CASE(kUInt32, uint32_t)
    KILN_DISPATCH_CASE(kUInt64, uint64_t)
    KILN_DISPATCH_CASE(kBool, bool)
    default: return fn(float{});  // callers check dtype_is_builtin first
  }
}
// True for dtypes with a native C++ type (everything dispatch_builtin handles).
bool dtype_is_builtin(DataType t);

}  // namespace kiln
