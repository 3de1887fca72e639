// Unique: the distinct elements (or slices along an axis) of a tensor, sorted or in order of first
// occurrence, with first-occurrence indices, inverse indices and counts.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/tensor_util.h"

namespace kiln::ops {
namespace {

Status unique_infer(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  Dim u = ctx.new_symbol();
  const ir::Attribute* axis_a = ctx.node.attr("axis");
  SymShape y({u});
  Dim items = in.rank_known ? dim_product(ctx, in.dims) : ctx.new_symbol();
  if (axis_a) {
    if (!in.rank_known) {
      y = SymShape();
      items = ctx.new_symbol();
    } else {
      auto axis = normalize_axis(axis_a->i, static_cast<int64_t>(in.rank()));
      if (!axis.ok()) return ctx.error(axis.status().message());
      y = in;
      items = dim_or_symbol(ctx, in.dims[static_cast<size_t>(*axis)]);
      y.dims[static_cast<size_t>(*axis)] = u;
    }
  }
  ctx.set_output(0, dt, y);
  ctx.set_output(1, DataType::kInt64, SymShape({u}));
  ctx.set_output(2, DataType::kInt64, SymShape({items}));
  ctx.set_output(3, DataType::kInt64, SymShape({u}));
  return Status::Ok();
}

// Orders: NaN after every number and equal to NaN (so NaNs collapse into one).
struct KeyLess {
  bool operator()(double a, double b) const {
    if (std::isnan(a)) return false;
    if (std::isnan(b)) return true;
    return a < b;
  }
  template <typename K>
  bool operator()(const K& a, const K& b) const {
    return a < b;
  }
};

// Groups items (rows of `keys`, slice_len keys each) into distinct values. Returns the item that
// first holds each distinct value, in output order, and each item's distinct-value index.
template <typename K>
void group_items(const std::vector<K>& keys, int64_t n, int64_t slice_len, bool sorted, std::vector<int64_t>* first,
                 std::vector<int64_t>* inverse, std::vector<int64_t>* counts) {
  KeyLess less;
  auto item_less = [&](int64_t a, int64_t b) {
    for (int64_t j = 0; j < slice_len; ++j) {
      const K& x = keys[static_cast<size_t>(a * slice_len + j)];
      const K& y = keys[static_cast<size_t>(b * slice_len + j)];
      if (less(x, y)) return true;
      if (less(y, x)) return false;
    }
    return false;
  };
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), item_less);
  // Groups in sorted order; stable sort puts each group's first occurrence first.
  std::vector<int64_t> group_first, group_count, group_of(static_cast<size_t>(n));
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || item_less(order[i - 1], order[i])) {
      group_first.push_back(order[i]);
      group_count.push_back(0);
    }
    group_of[static_cast<size_t>(order[i])] = static_cast<int64_t>(group_first.size()) - 1;
    ++group_count.back();
  }
  std::vector<int64_t> rank(group_first.size());  // output position of each group
  std::vector<int64_t> by_pos(group_first.size());
  std::iota(by_pos.begin(), by_pos.end(), 0);
  if (!sorted)
    std::sort(by_pos.begin(), by_pos.end(), [&](int64_t a, int64_t b) {
      return group_first[static_cast<size_t>(a)] < group_first[static_cast<size_t>(b)];
    });
  for (size_t p = 0; p < by_pos.size(); ++p) rank[static_cast<size_t>(by_pos[p])] = static_cast<int64_t>(p);
  first->clear();
  counts->clear();
  for (int64_t g : by_pos) {
    first->push_back(group_first[static_cast<size_t>(g)]);
    counts->push_back(group_count[static_cast<size_t>(g)]);
  }
  inverse->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    (*inverse)[static_cast<size_t>(i)] = rank[static_cast<size_t>(group_of[static_cast<size_t>(i)])];
}

Status unique_kernel(KernelContext& ctx) {
  Tensor x = ctx.input(0);
  if (x.dtype() == DataType::kComplex64 || x.dtype() == DataType::kComplex128)
    return ctx.unsupported(str_cat("dtype ", dtype_name(x.dtype()), " is not supported"));
  bool sorted = ctx.node.attr_int("sorted", 1) != 0;
  const ir::Attribute* axis_a = ctx.node.attr("axis");
  int64_t axis = 0;
  if (axis_a) {
    KILN_ASSIGN_OR_RETURN(axis, normalize_axis(axis_a->i, x.rank()));
  } else {
    x = x.reshaped({x.numel()});
  }
  int64_t n = x.dim(axis), outer = 1, inner = 1;
  for (int64_t k = 0; k < x.rank(); ++k)
    if (k != axis) (k < axis ? outer : inner) *= x.dim(k);
  int64_t slice_len = outer * inner;
  // Element j of item i's slice (row-major over the other dims) sits at src(i, j).
  auto src = [&](int64_t i, int64_t j) { return ((j / inner) * n + i) * inner + j % inner; };
  std::vector<int64_t> first, inverse, counts;
  auto run = [&](auto get) {
    using K = decltype(get(int64_t{0}));
    std::vector<K> keys(static_cast<size_t>(n * slice_len));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < slice_len; ++j) keys[static_cast<size_t>(i * slice_len + j)] = get(src(i, j));
    group_items(keys, n, slice_len, sorted, &first, &inverse, &counts);
  };
  if (x.dtype() == DataType::kString)
    run([&](int64_t e) { return x.strings()[e]; });
  else if (x.dtype() == DataType::kUInt64)
    run([&](int64_t e) { return x.data<uint64_t>()[e]; });
  else if (dtype_is_float(x.dtype()))
    run([&](int64_t e) { return x.get_f64(e); });
  else
    run([&](int64_t e) { return x.get_i64(e); });
  int64_t u = static_cast<int64_t>(first.size());
  Dims y_shape = x.shape();
  y_shape[static_cast<size_t>(axis)] = u;
  std::vector<int64_t> idx;
  idx.reserve(static_cast<size_t>(u * slice_len));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t p = 0; p < u; ++p)
      for (int64_t in = 0; in < inner; ++in) idx.push_back((o * n + first[static_cast<size_t>(p)]) * inner + in);
  ctx.set_output(0, take_elements(x, y_shape, idx));
  ctx.set_output(1, make_i64_1d(first));
  ctx.set_output(2, make_i64_1d(inverse));
  ctx.set_output(3, make_i64_1d(counts));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Unique, 11, unique_infer, unique_kernel, 1, 1);

}  // namespace kiln::ops
