// Helpers for the tensor shape / data movement / indexing ops (tensor_*.cc): size checks, index
// walking, dtype-generic element moves, attribute-or-input lists, and symbolic dim arithmetic.
#pragma once

#include <string>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {

// Largest tensor a data-movement kernel will allocate (elements): guards against shapes taken
// from inputs that would overflow or exhaust memory.
constexpr int64_t kMaxTensorElements = int64_t{1} << 34;

// Checks that every dim is >= 0 and that the element count is representable and allocatable.
Status check_dims(const Dims& d, const std::string& what);

// Calls fn(idx) for every multi-index of `shape` in row-major order (nothing if it is empty).
template <typename Fn>
void for_each_index(const Dims& shape, Fn&& fn) {
  for (int64_t d : shape)
    if (d <= 0) return;
  Dims idx(shape.size(), 0);
  while (true) {
    fn(static_cast<const Dims&>(idx));
    int64_t k = static_cast<int64_t>(shape.size()) - 1;
    for (; k >= 0; --k) {
      if (++idx[static_cast<size_t>(k)] < shape[static_cast<size_t>(k)]) break;
      idx[static_cast<size_t>(k)] = 0;
    }
    if (k < 0) return;
  }
}

// A new tensor of `out_shape` whose element j is src[src_index[j]], or `fill` (a one-element
// tensor of src's dtype; zero when null) where src_index[j] < 0. Any dtype, strings included.
Tensor take_elements(const Tensor& src, const Dims& out_shape, const std::vector<int64_t>& src_index,
                     const Tensor* fill = nullptr);

// A new tensor of out_shape read through a strided view of src: the element at multi-index o is
// src[offset + sum_k o[k] * strides[k]]. Strides may be 0 (broadcast) or negative (reversal);
// the caller guarantees every address is inside src. Any dtype, strings included.
Tensor take_strided(const Tensor& src, const Dims& out_shape, const Dims& strides, int64_t offset);

// An int list given as attribute `name` (when the node's opset < input_since) or as input `input`
// (from input_since on). *present says whether it was given at all.
Result<std::vector<int64_t>> ints_attr_or_input(const KernelContext& ctx, const std::string& name, size_t input,
                                                int input_since, bool* present);

// Normalizes axes against rank; rejects out-of-range and repeated axes.
Result<std::vector<int64_t>> normalize_axes(const std::vector<int64_t>& axes, int64_t rank);

// --- inference helpers ---

// Input i's value as plain ints when every element is a known number.
bool known_ints(const InferContext& ctx, size_t i, std::vector<int64_t>* out);
// Same for an attribute-or-input list (see ints_attr_or_input); *present as there.
bool known_ints_attr_or_input(const InferContext& ctx, const std::string& name, size_t input, int input_since,
                              std::vector<int64_t>* out, bool* present);
// Rank of a 1-D input's length when known (e.g. the shape input of Reshape): -1 otherwise.
int64_t known_length(const InferContext& ctx, size_t i);

// Product of dims: known when all are, the single symbolic factor when the rest multiply to 1,
// else a fresh symbol.
Dim dim_product(InferContext& ctx, const std::vector<Dim>& dims);
// A dim or a fresh symbol when unknown and unnamed (so equal symbols can be traced).
Dim dim_or_symbol(InferContext& ctx, const Dim& d);

}  // namespace kiln::ops
