// Shapes: concrete (runtime) and symbolic (inference; dims may be named like "batch" or unknown).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

using Dims = std::vector<int64_t>;

int64_t dims_numel(const Dims& d);
std::string dims_str(const Dims& d);  // "[1,3,224,224]"

// One dimension of a symbolic shape: a known value, a named symbol, or unknown.
struct Dim {
  int64_t value = -1;  // >= 0 when known
  std::string param;   // symbol name when unknown but named (ONNX dim_param)
  Dim() = default;
  Dim(int64_t v) : value(v) {}  // NOLINT: implicit from a number is natural here
  static Dim symbol(std::string name) {
    Dim d;
    d.param = std::move(name);
    return d;
  }
  bool known() const { return value >= 0; }
  bool operator==(const Dim& o) const { return value == o.value && param == o.param; }
  std::string str() const;
};

// Arithmetic on known dims for shape inference: a result that overflows int64 (or goes negative)
// becomes an unknown dim, so inference never has undefined behaviour; the kernel reports the problem.
inline Dim dim_times(const Dim& a, int64_t b) {
  int64_t r;
  if (!a.known() || b < 0 || __builtin_mul_overflow(a.value, b, &r)) return Dim();
  return Dim(r);
}
inline Dim dim_plus(const Dim& a, int64_t b) {
  int64_t r;
  if (!a.known() || __builtin_add_overflow(a.value, b, &r) || r < 0) return Dim();
  return Dim(r);
}

struct SymShape {
  bool rank_known = false;
  std::vector<Dim> dims;

  SymShape() = default;
  explicit SymShape(std::vector<Dim> d) : rank_known(true), dims(std::move(d)) {}
  static SymShape from_dims(const Dims& d);
  static SymShape unknown() { return SymShape(); }
  size_t rank() const { return dims.size(); }
  bool fully_known() const;
  Dims concrete() const;    // only when fully_known()
  std::string str() const;  // "[batch,3,224,224]" or "?"
};

}  // namespace kiln
