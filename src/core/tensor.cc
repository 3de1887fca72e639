#include "core/tensor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>

#include "core/buffer_cache.h"

namespace kiln {

namespace {
std::shared_ptr<uint8_t[]> alloc_aligned(size_t bytes, bool zero = true) {
  size_t n = (bytes + 63) / 64 * 64;
  if (n == 0) n = 64;
  // Inside an ExecutionContext's run: a buffer an earlier run released (core/buffer_cache.h).
  if (BufferCache* cache = current_buffer_cache())
    if (std::shared_ptr<uint8_t[]> b = cache->acquire(n)) {
      if (zero) std::memset(b.get(), 0, n);
      return b;
    }
  // nothrow + explicit throw: under ASan a failing throwing new aborts instead of throwing, and
  // the interpreter turns bad_alloc into an error.
  auto* p = static_cast<uint8_t*>(::operator new[](n, std::align_val_t(64), std::nothrow));
  if (!p) throw std::bad_alloc();
  if (zero) std::memset(p, 0, n);
  return std::shared_ptr<uint8_t[]>(p, [](uint8_t* q) { ::operator delete[](q, std::align_val_t(64)); });
}

template <typename To>
To saturate_cast(double v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != 0;  // NaN is non-zero: true, like numpy
  } else if constexpr (std::is_integral_v<To>) {
    // Truncate toward zero like C, but clamp instead of undefined behaviour (NaN gives 0).
    if (std::isnan(v)) return To(0);
    double t = std::trunc(v);
    if (t <= static_cast<double>(std::numeric_limits<To>::min())) return std::numeric_limits<To>::min();
    if (t >= static_cast<double>(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    return static_cast<To>(t);
  } else {
    return static_cast<To>(v);
  }
}

int64_t sub_byte_wrap(int64_t v, DataType t) {
  switch (t) {
    case DataType::kUInt4: return v & 0xf;
    case DataType::kInt4: {
      int64_t x = v & 0xf;
      return x >= 8 ? x - 16 : x;
    }
    case DataType::kUInt2: return v & 0x3;
    case DataType::kInt2: {
      int64_t x = v & 0x3;
      return x >= 2 ? x - 4 : x;
    }
    default: return v;
  }
}
}  // namespace

bool dtype_is_builtin(DataType t) {
  switch (t) {
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kInt8:
    case DataType::kInt16:
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kUInt8:
    case DataType::kUInt16:
    case DataType::kUInt32:
    case DataType::kUInt64:
    case DataType::kBool: return true;
    default: return false;
  }
}

Tensor::Tensor(DataType dtype, Dims shape) : Tensor(dtype, std::move(shape), /*zero=*/true) {}

namespace {
// The bytes of a tensor of this shape, overflow-checked (std::length_error naming it), so that a
// hostile shape never wraps to a small buffer; nbytes() is then exact for the tensor's life.
size_t checked_nbytes(DataType dtype, const Dims& shape) {
  const size_t n = static_cast<size_t>(dims_numel(shape));  // throws on an int64 overflow
  size_t bytes;
  const size_t es = dtype == DataType::kString ? sizeof(std::string) : dtype_size(dtype);
  if (__builtin_mul_overflow(n, es, &bytes))
    throw std::length_error(std::string("a ") + dtype_name(dtype) + " tensor of shape " + dims_str(shape) +
                            " takes more bytes than fit in 64 bits");
  return bytes;
}
}  // namespace

Tensor::Tensor(DataType dtype, Dims shape, bool zero) : dtype_(dtype), shape_(std::move(shape)) {
  for (int64_t d : shape_) KILN_CHECK(d >= 0);
  checked_nbytes(dtype_, shape_);
  if (dtype_ == DataType::kString) {
    strings_ = std::make_shared<std::vector<std::string>>(static_cast<size_t>(numel()));
  } else {
    buffer_ = alloc_aligned(nbytes(), zero);
  }
}

namespace {
// to = shape, reusing to's capacity; `shape` may lie inside `to` (vector::assign forbids that).
void assign_dims(Dims& to, std::span<const int64_t> shape) {
  if (to.empty() || shape.empty() || shape.data() < to.data() || shape.data() >= to.data() + to.size()) {
    to.assign(shape.begin(), shape.end());
    return;
  }
  if (shape.data() == to.data()) {
    to.resize(shape.size());  // a prefix of itself
    return;
  }
  Dims copy(shape.begin(), shape.end());  // a part other than a prefix: rare
  to.swap(copy);
}

template <typename Shape>
void renew_shape(DataType dtype, const Shape& shape, DataType& dtype_out, Dims& shape_out) {
  for (int64_t d : shape) KILN_CHECK(d >= 0);
  dtype_out = dtype;
  assign_dims(shape_out, std::span<const int64_t>(shape.begin(), shape.size()));
}
}  // namespace

void Tensor::renew(DataType dtype, const Dims& shape) {
  renew_shape(dtype, shape, dtype_, shape_);
  renew_storage();
}
void Tensor::renew(DataType dtype, std::initializer_list<int64_t> shape) {
  renew_shape(dtype, shape, dtype_, shape_);
  renew_storage();
}

void Tensor::renew(DataType dtype, std::span<const int64_t> shape) {
  renew_shape(dtype, shape, dtype_, shape_);
  renew_storage();
}

void Tensor::renew_uninitialized(DataType dtype, std::span<const int64_t> shape) {
  renew_shape(dtype, shape, dtype_, shape_);
  renew_storage(/*zero=*/false);
}

void Tensor::assign_view(const Tensor& src, std::span<const int64_t> shape) {
  KILN_CHECK(src.defined());
  int64_t n = 1;
  for (int64_t d : shape) KILN_CHECK(d >= 0 && !__builtin_mul_overflow(n, d, &n));
  KILN_CHECK(n == src.numel());
  if (&src != this) {
    dtype_ = src.dtype_;
    buffer_ = src.buffer_;
    offset_ = src.offset_;
    location_ = src.location_;
    strings_ = src.strings_;
  }
  assign_dims(shape_, shape);
}

void Tensor::renew_storage(bool zero) {
  checked_nbytes(dtype_, shape_);
  buffer_.reset();
  strings_.reset();
  offset_ = 0;
  location_ = {};
  if (dtype_ == DataType::kString)
    strings_ = std::make_shared<std::vector<std::string>>(static_cast<size_t>(numel()));
  else
    buffer_ = alloc_aligned(nbytes(), zero);
}

Tensor Tensor::uninitialized(DataType dtype, Dims shape) { return Tensor(dtype, std::move(shape), /*zero=*/false); }

Tensor Tensor::alias(DataType dtype, Dims shape, std::shared_ptr<uint8_t[]> buffer, size_t offset,
                     MemoryLocation location) {
  KILN_CHECK(dtype != DataType::kString);
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  for (int64_t d : t.shape_) KILN_CHECK(d >= 0);
  checked_nbytes(dtype, t.shape_);
  t.buffer_ = std::move(buffer);
  t.offset_ = offset;
  t.location_ = location;
  return t;
}

Tensor Tensor::reshaped(Dims shape) const {
  KILN_CHECK(dims_numel(shape) == numel());
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = uninitialized(dtype_, shape_);
  if (dtype_ == DataType::kString) {
    *t.strings_ = *strings_;
  } else if (nbytes()) {
    std::memcpy(t.raw(), raw(), nbytes());
  }
  return t;
}

double Tensor::get_f64(int64_t i) const {
  const uint8_t* p = static_cast<const uint8_t*>(raw());
  switch (dtype_) {
    case DataType::kFloat16: return half_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
    case DataType::kBFloat16: return bfloat16_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
    case DataType::kFloat8E4M3FN:
    case DataType::kFloat8E4M3FNUZ:
    case DataType::kFloat8E5M2:
    case DataType::kFloat8E5M2FNUZ:
    case DataType::kFloat8E8M0: return float8_to_float(p[i], dtype_);
    case DataType::kFloat4E2M1: return float4e2m1_to_float(p[i]);
    case DataType::kUInt4:
    case DataType::kUInt2: return p[i];
    case DataType::kInt4:
    case DataType::kInt2: return static_cast<int8_t>(p[i]);
    default:
      return dispatch_builtin(dtype_, [&](auto tag) -> double {
        using T = decltype(tag);
        return static_cast<double>(reinterpret_cast<const T*>(p)[i]);
      });
  }
}

int64_t Tensor::get_i64(int64_t i) const {
  const uint8_t* p = static_cast<const uint8_t*>(raw());
  switch (dtype_) {
    case DataType::kInt64: return reinterpret_cast<const int64_t*>(p)[i];
    case DataType::kUInt64: return static_cast<int64_t>(reinterpret_cast<const uint64_t*>(p)[i]);
    case DataType::kInt32: return reinterpret_cast<const int32_t*>(p)[i];
    case DataType::kUInt32: return reinterpret_cast<const uint32_t*>(p)[i];
    case DataType::kInt16: return reinterpret_cast<const int16_t*>(p)[i];
    case DataType::kUInt16: return reinterpret_cast<const uint16_t*>(p)[i];
    case DataType::kInt8:
    case DataType::kInt4:
    case DataType::kInt2: return reinterpret_cast<const int8_t*>(p)[i];
    case DataType::kUInt8:
    case DataType::kBool:
    case DataType::kUInt4:
    case DataType::kUInt2: return p[i];
    default: return saturate_cast<int64_t>(get_f64(i));
  }
}

void Tensor::set_f64(int64_t i, double v) {
  uint8_t* p = static_cast<uint8_t*>(raw());
  switch (dtype_) {
    case DataType::kFloat16: reinterpret_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v)); return;
    case DataType::kBFloat16: reinterpret_cast<uint16_t*>(p)[i] = float_to_bfloat16(static_cast<float>(v)); return;
    case DataType::kFloat8E4M3FN:
    case DataType::kFloat8E4M3FNUZ:
    case DataType::kFloat8E5M2:
    case DataType::kFloat8E5M2FNUZ:
    case DataType::kFloat8E8M0: p[i] = float_to_float8(static_cast<float>(v), dtype_, true); return;
    case DataType::kFloat4E2M1: p[i] = float_to_float4e2m1(static_cast<float>(v), true); return;
    case DataType::kUInt4:
    case DataType::kInt4:
    case DataType::kUInt2:
    case DataType::kInt2: set_i64(i, saturate_cast<int64_t>(v)); return;
    default:
      dispatch_builtin(dtype_, [&](auto tag) {
        using T = decltype(tag);
        reinterpret_cast<T*>(p)[i] = saturate_cast<T>(v);
      });
  }
}

void Tensor::set_i64(int64_t i, int64_t v) {
  uint8_t* p = static_cast<uint8_t*>(raw());
  switch (dtype_) {
    case DataType::kInt64: reinterpret_cast<int64_t*>(p)[i] = v; return;
    case DataType::kUInt64: reinterpret_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(v); return;
    case DataType::kInt32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case DataType::kUInt32: reinterpret_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v); return;
    case DataType::kInt16: reinterpret_cast<int16_t*>(p)[i] = static_cast<int16_t>(v); return;
    case DataType::kUInt16: reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(v); return;
    case DataType::kInt8: reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); return;
    case DataType::kUInt8: p[i] = static_cast<uint8_t>(v); return;
    case DataType::kBool: p[i] = v != 0; return;
    case DataType::kInt4:
    case DataType::kInt2: reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(sub_byte_wrap(v, dtype_)); return;
    case DataType::kUInt4:
    case DataType::kUInt2: p[i] = static_cast<uint8_t>(sub_byte_wrap(v, dtype_)); return;
    default: set_f64(i, static_cast<double>(v));
  }
}

Result<Tensor> Tensor::cast(DataType to, bool saturate) const {
  if (to == dtype_) return clone();
  Tensor out(to, shape_);
  int64_t n = numel();
  if (dtype_ == DataType::kString || to == DataType::kString) {
    if (dtype_ == DataType::kString) {
      for (int64_t i = 0; i < n; ++i) {
        const std::string& s = strings_->at(static_cast<size_t>(i));
        char* end = nullptr;
        double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end == s.c_str())
          return InvalidArgument("cannot convert string '", s, "' to ", dtype_name(to));
        if (dtype_is_float(to) || to == DataType::kBool)
          out.set_f64(i, v);
        else
          out.set_i64(i, std::strtoll(s.c_str(), nullptr, 10));
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        std::string s;
        if (dtype_is_float(dtype_)) {
          double v = get_f64(i);
          if (std::isnan(v))
            s = "NaN";
          else if (std::isinf(v))
            s = v > 0 ? "INF" : "-INF";
          else {
            // The shortest representation that reads back as the same value of the source type
            // (float64 needs up to 17 digits; float32 and narrower up to 9).
            bool is_f64 = dtype_ == DataType::kFloat64;
            char buf[64];
            for (int prec = 1; prec <= 17; ++prec) {
              std::snprintf(buf, sizeof buf, "%.*g", prec, v);
              double back = std::strtod(buf, nullptr);
              if (is_f64 ? back == v : static_cast<float>(back) == static_cast<float>(v)) break;
            }
            s = buf;
          }
        } else if (dtype_ == DataType::kBool) {
          s = get_i64(i) ? "1" : "0";
        } else if (dtype_ == DataType::kUInt64) {
          s = std::to_string(data<uint64_t>()[i]);
        } else {
          s = std::to_string(get_i64(i));
        }
        out.strings()[i] = s;
      }
    }
    return out;
  }
  bool float_src = dtype_is_float(dtype_);
  bool f8_dst = to == DataType::kFloat8E4M3FN || to == DataType::kFloat8E4M3FNUZ || to == DataType::kFloat8E5M2 ||
                to == DataType::kFloat8E5M2FNUZ || to == DataType::kFloat8E8M0;
  for (int64_t i = 0; i < n; ++i) {
    if (f8_dst) {
      static_cast<uint8_t*>(out.raw())[i] = float_to_float8(static_cast<float>(get_f64(i)), to, saturate);
    } else if (to == DataType::kFloat4E2M1) {
      static_cast<uint8_t*>(out.raw())[i] = float_to_float4e2m1(static_cast<float>(get_f64(i)), saturate);
    } else if (float_src || dtype_is_float(to)) {
      if (dtype_ == DataType::kUInt64)
        out.set_f64(i, static_cast<double>(data<uint64_t>()[i]));
      else if (to == DataType::kUInt64 && !float_src)
        out.data<uint64_t>()[i] = static_cast<uint64_t>(get_i64(i));
      else if (to == DataType::kUInt64)
        out.data<uint64_t>()[i] = saturate_cast<uint64_t>(get_f64(i));
      else if (!float_src)
        out.set_f64(i, static_cast<double>(get_i64(i)));
      else
        out.set_f64(i, get_f64(i));
    } else {
      out.set_i64(i, get_i64(i));  // integer to integer: wraps like C (two's complement)
    }
  }
  return out;
}

std::string Tensor::describe() const { return std::string(dtype_name(dtype_)) + dims_str(shape_); }

}  // namespace kiln
