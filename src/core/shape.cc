#include "core/shape.h"

#include <sstream>

namespace kiln {

int64_t dims_numel(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
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
