// Helpers shared by the elementwise op files: numpy broadcasting over any number of inputs,
// opset < 7 legacy broadcasting ('broadcast'/'axis' attributes), and common inference rules.
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {

// Opsets before 7 broadcast only with the `broadcast` attribute (the legacy rule of plan_broadcast).
inline bool legacy_broadcast(const KernelContext& ctx) { return ctx.opset() < 7; }

// Before opset 7, binary ops (Add, Sub, Mul, Div, Pow, And, Or, Xor, Equal, Less, Greater)
// broadcast only when the attribute 'broadcast' is 1, and then only B onto A: B's dims match a
// contiguous run of A's dims starting at 'axis' (default: A's trailing dims). Without it the
// shapes must be equal. These rewrite B's shape to A's rank (1 elsewhere) so that numpy
// broadcasting gives the legacy result, or fail naming both shapes.
Result<Dims> legacy_align(const ir::Node& n, const Dims& a, const Dims& b);
Result<SymShape> legacy_align_sym(const ir::Node& n, const SymShape& a, const SymShape& b);

// The output shape of broadcasting several inputs, and for each input the map from an output
// flat index to that input's flat index.
struct BroadcastPlan {
  Dims out;
  std::vector<BroadcastIndex> index;
  int64_t numel() const { return dims_numel(out); }
};
// `legacy` applies legacy_align to a two-input op (callers pass ctx.opset() < 7 for the ops above).
Result<BroadcastPlan> plan_broadcast(const ir::Node& n, const std::vector<const Tensor*>& ins, bool legacy);

// The numpy broadcast of up to three tensors of rank <= 8, on the stack: the fast paths of elementwise
// kernels that run as shape work inside If/Loop bodies use it so as to allocate nothing (tests/noalloc).
struct SmallBroadcast {
  static constexpr size_t kMaxRank = 8, kMaxInputs = 3;
  size_t rank = 0, inputs = 0;
  int64_t out[kMaxRank] = {};
  int64_t stride[kMaxInputs][kMaxRank] = {};  // per input, its element stride along each output axis (0: broadcast)
  int64_t numel() const {
    int64_t n = 1;
    for (size_t i = 0; i < rank; ++i) n *= out[i];
    return n;
  }
  // Calls fn(i, offsets) for every output element i in order, offsets[k] the element of input k it reads.
  template <typename Fn>
  void for_each(Fn&& fn) const {
    const int64_t n = numel();
    int64_t idx[kMaxRank] = {}, off[kMaxInputs] = {};
    for (int64_t i = 0; i < n; ++i) {
      fn(i, static_cast<const int64_t*>(off));
      for (size_t k = rank; k-- > 0;) {
        if (++idx[k] < out[k]) {
          for (size_t j = 0; j < inputs; ++j) off[j] += stride[j][k];
          break;
        }
        for (size_t j = 0; j < inputs; ++j) off[j] -= stride[j][k] * (out[k] - 1);
        idx[k] = 0;
      }
    }
  }
};
// False when the shapes do not broadcast (the general path reports it), a rank exceeds kMaxRank or
// more than kMaxInputs are given.
bool small_broadcast(std::initializer_list<const Tensor*> ins, SmallBroadcast& s);

// Inference: output 0 gets dtype `out` and the broadcast of all present inputs' shapes (legacy
// rules for two inputs when `legacy`). Fails when two known dims definitely cannot broadcast.
Status infer_broadcast_to(InferContext& ctx, DataType out, bool legacy);
// Same, with the dtype of input 0; errors when the inputs' known dtypes differ.
Status infer_broadcast_same_type(InferContext& ctx, bool legacy);

// Fails when two present inputs have different dtypes.
Status check_same_dtype(const KernelContext& ctx, size_t first, size_t last);

// True for the dtypes arithmetic kernels handle (all ints, all floats incl. 16/8-bit ones).
bool is_numeric(DataType t);

// Integer arithmetic that wraps (two's complement) instead of overflowing: computes in an unsigned
// type at least as wide as unsigned int (so uint16 * uint16 cannot overflow a promoted int).
template <typename T, typename Op>
T wrap_op(T x, T y, Op op) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
    return static_cast<T>(op(static_cast<U>(x), static_cast<U>(y)));
  } else {
    return static_cast<T>(op(x, y));
  }
}

// Float to integer: truncates toward zero, saturating at the type's limits (NaN gives 0).
template <typename T>
T float_to_int(double v) {
  if (std::isnan(v)) return T(0);
  double t = std::trunc(v);
  if (t <= static_cast<double>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
  if (t >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(t);
}

// Maps every element of a float tensor through fn(double) -> double; float16, bfloat16 and
// float8 inputs compute in float32 and round back once.
template <typename Fn>
Status unary_float(KernelContext& ctx, Fn fn) {
  const Tensor& x0 = ctx.input(0);
  if (!dtype_is_float(x0.dtype()))
    return ctx.unsupported(str_cat("dtype ", dtype_name(x0.dtype()), " is not supported (needs a float type)"));
  // float32/float64 (nothing to upcast): the output renewed over the node's last one, so that a
  // steady-state run allocates nothing (tests/noalloc); the same values as below.
  const bool native = x0.dtype() == DataType::kFloat32 || x0.dtype() == DataType::kFloat64;
  Tensor x = native ? Tensor() : upcast_float(x0);
  const Tensor& in = native ? x0 : x;
  Tensor fresh;
  Tensor& out = native && !ctx.outputs.empty() ? ctx.outputs[0].tensor : fresh;
  out.renew(in.dtype(), in.shape());
  int64_t n = in.numel();
  if (in.dtype() == DataType::kFloat64) {
    for (int64_t i = 0; i < n; ++i) out.data<double>()[i] = fn(in.data<double>()[i]);
  } else {
    for (int64_t i = 0; i < n; ++i)
      out.data<float>()[i] = static_cast<float>(fn(static_cast<double>(in.data<float>()[i])));
  }
  if (&out == &fresh)
    ctx.set_output(0, downcast_float(out, x0.dtype()));
  else
    ctx.outputs[0].kind = Value::Kind::kTensor;
  return Status::Ok();
}

// Maps every element of a numeric tensor through fn(T) -> T with T its C++ type (float for the
// low-precision floats, which round back once). Bool and sub-byte ints are unsupported.
template <typename Fn>
Status unary_numeric(KernelContext& ctx, Fn fn) {
  const Tensor& x0 = ctx.input(0);
  Tensor x = upcast_float(x0);
  if (!dtype_is_builtin(x.dtype()) || x.dtype() == DataType::kBool)
    return ctx.unsupported(str_cat("dtype ", dtype_name(x0.dtype()), " is not supported"));
  Tensor out(x.dtype(), x.shape());
  dispatch_builtin(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      const T* px = x.data<T>();
      T* po = out.data<T>();
      for (int64_t i = 0; i < x.numel(); ++i) po[i] = fn(px[i]);
    }
  });
  ctx.set_output(0, downcast_float(out, x0.dtype()));
  return Status::Ok();
}

}  // namespace kiln::ops
