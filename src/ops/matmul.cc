// Matrix products: MatMul (numpy semantics: batched broadcast, 1-D promotion), Gemm and
// MatMulInteger.
//
// The inner kernel walks i-k-j so the innermost loop streams rows of B and C (vectorizable).
// Float32 accumulates in float32 (as BLAS does), float64 in float64; integers wrap (two's
// complement) through uint64. Float16/bfloat16 compute in float32.
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/common.h"

namespace kiln::ops {
namespace {

// Accumulator for T: floats keep their own type, integers use wrapping uint64.
template <typename T>
using MatAcc = std::conditional_t<std::is_floating_point_v<T>, T, uint64_t>;

template <typename T>
MatAcc<T> to_acc(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return v;
  else if constexpr (std::is_signed_v<T>)
    return static_cast<uint64_t>(static_cast<int64_t>(v));
  else
    return static_cast<uint64_t>(v);
}

// double -> integer T, clamped (NaN -> 0) instead of undefined behaviour.
template <typename T>
T saturate_to(double v) {
  if (std::isnan(v)) return T(0);
  if (v <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
  if (v >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

// C[M,N] = A[M,K] * B[K,N], all row-major and contiguous.
template <typename T>
void matmul_2d(const T* a, const T* b, T* c, int64_t m, int64_t k, int64_t n, std::vector<MatAcc<T>>& row) {
  using Acc = MatAcc<T>;
  row.assign(static_cast<size_t>(n), Acc(0));
  for (int64_t i = 0; i < m; ++i) {
    Acc* r = row.data();
    for (int64_t j = 0; j < n; ++j) r[j] = Acc(0);
    const T* arow = a + i * k;
    for (int64_t p = 0; p < k; ++p) {
      Acc av = to_acc(arow[p]);
      const T* brow = b + p * n;
      for (int64_t j = 0; j < n; ++j) r[j] += av * to_acc(brow[j]);
    }
    T* crow = c + i * n;
    for (int64_t j = 0; j < n; ++j) crow[j] = static_cast<T>(r[j]);
  }
}

// Shapes of a (batched) matmul after numpy's 1-D promotion.
struct MatMulShape {
  Dims a_batch, b_batch, batch;  // batch dims of each operand and their broadcast
  int64_t m = 1, k = 1, n = 1;
  Dims out;  // final output shape (promoted 1-D dims removed)
};

Result<MatMulShape> matmul_shape(const Dims& a, const Dims& b) {
  if (a.empty() || b.empty())
    return InvalidArgument("MatMul inputs must have rank >= 1, got ", dims_str(a), " and ", dims_str(b));
  MatMulShape s;
  Dims pa = a.size() == 1 ? Dims{1, a[0]} : a;
  Dims pb = b.size() == 1 ? Dims{b[0], 1} : b;
  s.m = pa[pa.size() - 2];
  s.k = pa[pa.size() - 1];
  s.n = pb[pb.size() - 1];
  if (pb[pb.size() - 2] != s.k)
    return InvalidArgument("inner dimensions differ: A ", dims_str(a), " has K = ", s.k, ", B ", dims_str(b),
                           " has K = ", pb[pb.size() - 2]);
  s.a_batch.assign(pa.begin(), pa.end() - 2);
  s.b_batch.assign(pb.begin(), pb.end() - 2);
  KILN_ASSIGN_OR_RETURN(s.batch, broadcast_dims(s.a_batch, s.b_batch));
  s.out = s.batch;
  if (a.size() > 1) s.out.push_back(s.m);
  if (b.size() > 1) s.out.push_back(s.n);
  return s;
}

Status infer_matmul_like(InferContext& ctx, DataType out_dt) {
  const SymShape& a = ctx.input_shape(0);
  const SymShape& b = ctx.input_shape(1);
  if (!a.rank_known || !b.rank_known) {
    ctx.set_output(0, out_dt, SymShape());
    return Status::Ok();
  }
  if (a.rank() == 0 || b.rank() == 0)
    return ctx.error(str_cat("inputs must have rank >= 1, got ", a.str(), " and ", b.str()));
  std::vector<Dim> pa = a.rank() == 1 ? std::vector<Dim>{Dim(1), a.dims[0]} : a.dims;
  std::vector<Dim> pb = b.rank() == 1 ? std::vector<Dim>{b.dims[0], Dim(1)} : b.dims;
  const Dim& ka = pa[pa.size() - 1];
  const Dim& kb = pb[pb.size() - 2];
  if (ka.known() && kb.known() && ka.value != kb.value)
    return ctx.error(
        str_cat("inner dimensions differ: A ", a.str(), " has K = ", ka.value, ", B ", b.str(), " has K = ", kb.value));
  if (a.fully_known() && b.fully_known()) {  // batch broadcast: the kernel's check, with its message
    auto sh = matmul_shape(a.concrete(), b.concrete());
    if (!sh.ok()) return ctx.error(sh.status().message());
  }
  SymShape ab(std::vector<Dim>(pa.begin(), pa.end() - 2)), bb(std::vector<Dim>(pb.begin(), pb.end() - 2));
  SymShape out = broadcast_sym(ab, bb);
  if (a.rank() > 1) out.dims.push_back(pa[pa.size() - 2]);
  if (b.rank() > 1) out.dims.push_back(pb[pb.size() - 1]);
  ctx.set_output(0, out_dt, out);
  return Status::Ok();
}

Status infer_matmul(InferContext& ctx) { return infer_matmul_like(ctx, ctx.input_dtype(0)); }
Status infer_matmul_integer(InferContext& ctx) { return infer_matmul_like(ctx, DataType::kInt32); }

Status matmul_kernel(KernelContext& ctx) {
  const Tensor& a0 = ctx.input(0);
  const Tensor& b0 = ctx.input(1);
  if (a0.dtype() != b0.dtype())
    return ctx.error(str_cat("input dtypes differ: ", a0.describe(), " vs ", b0.describe()));
  DataType dt = a0.dtype();
  if (dt == DataType::kBool || (!dtype_is_builtin(dt) && !is_low_precision_float(dt)))
    return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  auto sh = matmul_shape(a0.shape(), b0.shape());
  if (!sh.ok()) return ctx.error(sh.status().message());
  Tensor a = upcast_float(a0), b = upcast_float(b0);
  Tensor out(a.dtype(), sh->out);
  int64_t batches = dims_numel(sh->batch);
  BroadcastIndex ia(sh->a_batch, sh->batch), ib(sh->b_batch, sh->batch);
  dispatch_builtin(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      std::vector<MatAcc<T>> row;
      for (int64_t bi = 0; bi < batches; ++bi) {
        matmul_2d<T>(a.data<T>() + ia(bi) * sh->m * sh->k, b.data<T>() + ib(bi) * sh->k * sh->n,
                     out.data<T>() + bi * sh->m * sh->n, sh->m, sh->k, sh->n, row);
      }
    }
  });
  ctx.set_output(0, downcast_float(out, dt));
  return Status::Ok();
}

// ---- Gemm: Y = alpha * A' * B' + beta * C ----

Status infer_gemm(InferContext& ctx) {
  const SymShape& a = ctx.input_shape(0);
  const SymShape& b = ctx.input_shape(1);
  DataType dt = ctx.input_dtype(0);
  if (!a.rank_known || !b.rank_known) {
    ctx.set_output(0, dt, SymShape(std::vector<Dim>{Dim(), Dim()}));
    return Status::Ok();
  }
  if (a.rank() != 2 || b.rank() != 2) return ctx.error(str_cat("A and B must be 2-D, got ", a.str(), " and ", b.str()));
  bool ta = ctx.node.attr_int("transA", 0) != 0, tb = ctx.node.attr_int("transB", 0) != 0;
  const Dim& ka = a.dims[ta ? 0 : 1];
  const Dim& kb = b.dims[tb ? 1 : 0];
  if (ka.known() && kb.known() && ka.value != kb.value)
    return ctx.error(str_cat("inner dimensions differ: A' has K = ", ka.value, ", B' has K = ", kb.value, " (A ",
                             a.str(), ", B ", b.str(), ", transA ", ta, ", transB ", tb, ")"));
  const Dim& m = a.dims[ta ? 1 : 0];
  const Dim& n = b.dims[tb ? 0 : 1];
  // C's broadcast where the shapes are known: the kernel's check with its message (a build must not
  // fuse a bias that a run refuses).
  const SymShape& c = ctx.input_shape(2);
  if (ctx.has_input(2) && ctx.node.attr_float("beta", 1.0f) != 0 && m.known() && n.known() && c.fully_known()) {
    const Dims cd = c.concrete(), out{m.value, n.value};
    auto bc = broadcast_dims(cd, out);
    if (!bc.ok() || *bc != out || cd.size() > 2)
      return ctx.error(str_cat("C ", dtype_name(ctx.input_dtype(2)), dims_str(cd),
                               " cannot be broadcast to the output [", m.value, ",", n.value, "]"));
  }
  ctx.set_output(0, dt, SymShape(std::vector<Dim>{m, n}));
  return Status::Ok();
}

// Row-major transpose of a 2-D tensor.
Tensor transpose_2d(const Tensor& t) {
  int64_t r = t.dim(0), c = t.dim(1);
  Tensor out(t.dtype(), {c, r});
  size_t es = dtype_size(t.dtype());
  const uint8_t* src = static_cast<const uint8_t*>(t.raw());
  uint8_t* dst = static_cast<uint8_t*>(out.raw());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) std::memcpy(dst + (j * r + i) * es, src + (i * c + j) * es, es);
  return out;
}

Status gemm_kernel(KernelContext& ctx) {
  const Tensor& a0 = ctx.input(0);
  const Tensor& b0 = ctx.input(1);
  DataType dt = a0.dtype();
  if (a0.dtype() != b0.dtype())
    return ctx.error(str_cat("input dtypes differ: ", a0.describe(), " vs ", b0.describe()));
  if (dt == DataType::kBool || (!dtype_is_builtin(dt) && !is_low_precision_float(dt)))
    return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  if (a0.rank() != 2 || b0.rank() != 2)
    return ctx.error(str_cat("A and B must be 2-D, got ", a0.describe(), " and ", b0.describe()));
  bool ta = ctx.node.attr_int("transA", 0) != 0, tb = ctx.node.attr_int("transB", 0) != 0;
  double alpha = ctx.node.attr_float("alpha", 1.0f), beta = ctx.node.attr_float("beta", 1.0f);
  Tensor a = upcast_float(a0), b = upcast_float(b0);
  if (ta) a = transpose_2d(a);
  if (tb) b = transpose_2d(b);
  int64_t m = a.dim(0), k = a.dim(1), n = b.dim(1);
  if (b.dim(0) != k)
    return ctx.error(str_cat("inner dimensions differ: A' is [", m, ",", k, "], B' is [", b.dim(0), ",", n, "] (A ",
                             a0.describe(), ", B ", b0.describe(), ", transA ", ta, ", transB ", tb, ")"));
  Dims out_shape{m, n};
  Tensor c;
  bool has_c = ctx.has_input(2) && beta != 0;
  if (has_c) {
    c = upcast_float(ctx.input(2));
    if (c.dtype() != a.dtype()) return ctx.error(str_cat("C dtype differs from A: ", ctx.input(2).describe()));
    auto bc = broadcast_dims(c.shape(), out_shape);
    if (!bc.ok() || *bc != out_shape || c.rank() > 2)
      return ctx.error(str_cat("C ", c.describe(), " cannot be broadcast to the output [", m, ",", n, "]"));
  }
  Tensor out(a.dtype(), out_shape);
  dispatch_builtin(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      std::vector<MatAcc<T>> row;
      matmul_2d<T>(a.data<T>(), b.data<T>(), out.data<T>(), m, k, n, row);
      T* po = out.data<T>();
      BroadcastIndex ci(has_c ? c.shape() : Dims{}, out_shape);
      const T* pc = has_c ? c.data<T>() : nullptr;
      bool unit = alpha == 1.0 && beta == 1.0;
      for (int64_t i = 0; i < m * n; ++i) {
        if constexpr (std::is_floating_point_v<T>) {
          T v = alpha == 1.0 ? po[i] : static_cast<T>(alpha * po[i]);
          if (pc) v = static_cast<T>(v + (beta == 1.0 ? pc[ci(i)] : static_cast<T>(beta * pc[ci(i)])));
          po[i] = v;
        } else if (unit) {
          if (pc) po[i] = static_cast<T>(to_acc(po[i]) + to_acc(pc[ci(i)]));
        } else {
          double v = alpha * static_cast<double>(po[i]) + (pc ? beta * static_cast<double>(pc[ci(i)]) : 0.0);
          po[i] = saturate_to<T>(v);
        }
      }
    }
  });
  ctx.set_output(0, downcast_float(out, dt));
  return Status::Ok();
}

// ---- MatMulInteger: int32 (A - a_zero_point) * (B - b_zero_point) ----

Status matmul_integer_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  auto is8 = [](DataType t) { return t == DataType::kInt8 || t == DataType::kUInt8; };
  if (!is8(a.dtype()) || !is8(b.dtype()))
    return ctx.unsupported(str_cat("A and B must be int8 or uint8, got ", a.describe(), " and ", b.describe()));
  auto sh = matmul_shape(a.shape(), b.shape());
  if (!sh.ok()) return ctx.error(sh.status().message());
  // Zero points: a scalar; per row of A (M values, or [..., M, 1]) / per column of B (N values, or
  // [..., 1, N]). They are subtracted from the operands up front.
  auto subtract_zp = [&](const Tensor& x, size_t zi, bool rows, const char* name) -> Result<std::vector<int64_t>> {
    std::vector<int64_t> v = to_i64_vector(x);
    if (!ctx.has_input(zi)) return v;
    Tensor z = ctx.input(zi);
    if (z.dtype() != x.dtype()) return InvalidArgument(name, " dtype differs from its operand: ", z.describe());
    if (z.numel() == 1)
      z = z.reshaped({});
    else if (rows && z.rank() == 1 && x.rank() >= 2)
      z = z.reshaped({z.numel(), 1});
    auto bc = broadcast_dims(z.shape(), x.shape());
    if (!bc.ok() || *bc != x.shape())
      return InvalidArgument(name, " ", z.describe(), " must be a scalar or per-", rows ? "row" : "column",
                             " values matching ", x.describe());
    BroadcastIndex zb(z.shape(), x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) v[static_cast<size_t>(i)] -= z.get_i64(zb(i));
    return v;
  };
  auto av_r = subtract_zp(a, 2, true, "a_zero_point");
  if (!av_r.ok()) return ctx.error(av_r.status().message());
  auto bv_r = subtract_zp(b, 3, false, "b_zero_point");
  if (!bv_r.ok()) return ctx.error(bv_r.status().message());
  const std::vector<int64_t>& av = *av_r;
  const std::vector<int64_t>& bv = *bv_r;
  Tensor out(DataType::kInt32, sh->out);
  int32_t* po = out.data<int32_t>();
  int64_t m = sh->m, k = sh->k, n = sh->n;
  BroadcastIndex ia(sh->a_batch, sh->batch), ib(sh->b_batch, sh->batch);
  std::vector<int64_t> row(static_cast<size_t>(n));
  for (int64_t bi = 0; bi < dims_numel(sh->batch); ++bi) {
    const int64_t* pa = av.data() + ia(bi) * m * k;
    const int64_t* pb = bv.data() + ib(bi) * k * n;
    for (int64_t i = 0; i < m; ++i) {
      std::fill(row.begin(), row.end(), 0);
      for (int64_t p = 0; p < k; ++p) {
        int64_t x = pa[i * k + p];
        for (int64_t j = 0; j < n; ++j)
          row[static_cast<size_t>(j)] += x * pb[p * n + j];  // |x*y| <= 2^16: no overflow for K < 2^47
      }
      for (int64_t j = 0; j < n; ++j)
        po[(bi * m + i) * n + j] = static_cast<int32_t>(static_cast<uint32_t>(row[static_cast<size_t>(j)]));
    }
  }
  ctx.set_output(0, out);
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", MatMul, 1, infer_matmul, matmul_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", Gemm, 1, infer_gemm, gemm_kernel, 2, 3);
KILN_REGISTER_OP_ARITY("", MatMulInteger, 10, infer_matmul_integer, matmul_integer_kernel, 2, 4);

}  // namespace kiln::ops
