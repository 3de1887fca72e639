// Helpers shared by the reduction, softmax, normalization and loss kernels: walking a tensor
// with some axes reduced, splitting a shape around one axis, and reading axis lists.
#pragma once

#include <cmath>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {

// A shape seen as [outer, len, inner] around one axis (row-major).
struct AxisSplit {
  int64_t outer = 1, len = 1, inner = 1;
};
inline AxisSplit split_at_axis(const Dims& shape, int64_t axis) {
  AxisSplit s;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    int64_t d = shape[static_cast<size_t>(i)];
    if (i < axis)
      s.outer *= d;
    else if (i == axis)
      s.len = d;
    else
      s.inner *= d;
  }
  return s;
}
// The shape coerced to 2-D at `axis`: [prod(shape[:axis]), prod(shape[axis:])] (opset<13 softmax).
inline AxisSplit split_2d(const Dims& shape, int64_t axis) {
  AxisSplit s;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i)
    (i < axis ? s.outer : s.len) *= shape[static_cast<size_t>(i)];
  return s;
}

// Calls fn(in_index, out_index) for every element of `shape`, where out_index is the flat index
// in the shape with every `reduced` axis collapsed to 1. Input indices come in increasing order.
template <typename Fn>
void for_each_reduced(const Dims& shape, const std::vector<bool>& reduced, Fn&& fn) {
  int64_t n = dims_numel(shape);
  if (n == 0) return;
  size_t r = shape.size();
  if (r == 0) {
    fn(int64_t{0}, int64_t{0});
    return;
  }
  Dims kept(shape);
  for (size_t i = 0; i < r; ++i)
    if (reduced[i]) kept[i] = 1;
  Dims ks = strides_of(kept);
  Dims ostride(r, 0);
  for (size_t i = 0; i < r; ++i) ostride[i] = reduced[i] ? 0 : ks[i];
  Dims idx(r, 0);
  int64_t out = 0;
  for (int64_t i = 0; i < n; ++i) {
    fn(i, out);
    for (int64_t k = static_cast<int64_t>(r) - 1; k >= 0; --k) {
      size_t u = static_cast<size_t>(k);
      if (++idx[u] < shape[u]) {
        out += ostride[u];
        break;
      }
      out -= ostride[u] * (shape[u] - 1);
      idx[u] = 0;
    }
  }
}

// Normalizes a list of axes against `rank`; rejects out-of-range and repeated axes.
inline Result<std::vector<int64_t>> normalize_axes(const std::vector<int64_t>& axes, int64_t rank) {
  std::vector<int64_t> out;
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (int64_t a : axes) {
    KILN_ASSIGN_OR_RETURN(int64_t n, normalize_axis(a, rank));
    if (rank == 0) continue;  // a scalar has no axis to reduce
    if (seen[static_cast<size_t>(n)]) return InvalidArgument("axis ", a, " is repeated in axes");
    seen[static_cast<size_t>(n)] = true;
    out.push_back(n);
  }
  return out;
}

}  // namespace kiln::ops
