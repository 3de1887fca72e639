// Helpers shared by op files: axes, broadcasting, dtype handling, common inference rules.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "ops/registry.h"

namespace kiln::ops {

// Maps a possibly negative axis into [0, rank); error names the axis and rank.
Result<int64_t> normalize_axis(int64_t axis, int64_t rank);
Dims strides_of(const Dims& shape);  // row-major element strides

// Numpy-style multidirectional broadcasting.
Result<Dims> broadcast_dims(const Dims& a, const Dims& b);
SymShape broadcast_sym(const SymShape& a, const SymShape& b);

// Maps an output flat index to the flat index of an input broadcast into the output shape.
class BroadcastIndex {
 public:
  BroadcastIndex(const Dims& in_shape, const Dims& out_shape);
  int64_t operator()(int64_t out_index) const;

 private:
  Dims out_shape_, in_strides_;  // in_strides_ are 0 on broadcast axes, aligned to out rank
  bool identity_ = false;
};

// Reads an integer tensor (any int dtype) as int64 values.
std::vector<int64_t> to_i64_vector(const Tensor& t);
std::vector<double> to_f64_vector(const Tensor& t);
Tensor make_i64_tensor(const std::vector<int64_t>& v, Dims shape);
Tensor make_i64_1d(const std::vector<int64_t>& v);

// Float kernels compute in float32 or float64; these convert the 16/8-bit float types.
bool is_low_precision_float(DataType t);              // float16, bfloat16, float8*, float4
Tensor upcast_float(const Tensor& t);                 // low-precision float -> float32, else unchanged
Tensor downcast_float(const Tensor& t, DataType to);  // float32 -> `to` (no-op if same)

// Copies elements `count` from src[src_off] to dst[dst_off] (same dtype, strings included).
void copy_elements(const Tensor& src, int64_t src_off, Tensor& dst, int64_t dst_off, int64_t count);

// Common inference rules.
Status infer_same_as_input0(InferContext& ctx);  // every output: input 0's type
Status infer_broadcast_all(InferContext& ctx);   // output 0: broadcast of all inputs, input 0 dtype
Status infer_broadcast_bool(InferContext& ctx);  // output 0: broadcast of all inputs, bool

// A value of a constant input as int64 list, when known at build time.
bool constant_ints(const InferContext& ctx, size_t i, std::vector<int64_t>* out);

}  // namespace kiln::ops
