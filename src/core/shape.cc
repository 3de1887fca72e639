#include "core/shape.h"

#include <sstream>
#include <stdexcept>

namespace kiln {

// 0 when a dim is 0, else the product, overflow-checked: a product that overflows int64 throws
// std::length_error naming the shape (kernels, the engine and every public entry point report it as
// a kOutOfRange error), so that no size computed from a hostile shape wraps. Shapes a file declares
// are checked with a Status before they get here (core/checked_size.h).
int64_t dims_numel(const Dims& d) {
  for (int64_t x : d)
    if (x == 0) return 0;  // empty, however large the other dims
  int64_t n = 1;
  for (int64_t x : d)
    if (__builtin_mul_overflow(n, x, &n))
      throw std::length_error("the element count of shape " + dims_str(d) + " overflows int64");
  return n;
}

std::string dims_str(const Dims& d) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < d.size(); ++i) os << (i ? "," : "") << d[i];
  os << ']';
  return os.str();
}

std::string Dim::str() const {
  if (known()) return std::to_string(value);
  return param.empty() ? "?" : param;
}

SymShape SymShape::from_dims(const Dims& d) {
  std::vector<Dim> v(d.begin(), d.end());
  return SymShape(std::move(v));
}

bool SymShape::fully_known() const {
  if (!rank_known) return false;
  for (const Dim& d : dims)
    if (!d.known()) return false;
  return true;
}

Dims SymShape::concrete() const {
  Dims out;
  for (const Dim& d : dims) out.push_back(d.value);
  return out;
}

std::string SymShape::str() const {
  if (!rank_known) return "?";
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + dims[i].str();
  return s + "]";
}

}  // namespace kiln
