// The reductions of ScatterElements / ScatterND (none, add, mul, max, min): how an update combines
// with the value it lands on, for the reference kernels (ops/tensor_scatter.cc) and
// scatter_elements_kiln (backends/cpu/index_tactic.cc), which must agree bit for bit.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <type_traits>

namespace kiln::ops {

enum class ScatterReduction { kNone, kAdd, kMul, kMax, kMin };

// The reduction named by a node's `reduction` attribute; nullopt for an unknown name.
inline std::optional<ScatterReduction> scatter_reduction(const std::string& r) {
  if (r == "none") return ScatterReduction::kNone;
  if (r == "add") return ScatterReduction::kAdd;
  if (r == "mul") return ScatterReduction::kMul;
  if (r == "max") return ScatterReduction::kMax;
  if (r == "min") return ScatterReduction::kMin;
  return std::nullopt;
}

// `a` (the value in place) combined with update `b`; integers wrap instead of overflowing.
template <typename T>
T scatter_combine(T a, T b, ScatterReduction r) {
  using R = ScatterReduction;
  if constexpr (std::is_same_v<T, bool>) {
    switch (r) {
      case R::kAdd:
      case R::kMax: return a || b;
      case R::kMul:
      case R::kMin: return a && b;
      default: return b;
    }
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    switch (r) {
      case R::kAdd: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
      case R::kMul: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
      case R::kMax: return std::max(a, b);
      case R::kMin: return std::min(a, b);
      default: return b;
    }
  } else {
    switch (r) {
      case R::kAdd: return a + b;
      case R::kMul: return a * b;
      case R::kMax: return std::max(a, b);
      case R::kMin: return std::min(a, b);
      default: return b;
    }
  }
}

}  // namespace kiln::ops
