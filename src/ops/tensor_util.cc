#include "ops/tensor_util.h"

#include <algorithm>
#include <cstring>

namespace kiln::ops {

Status check_dims(const Dims& d, const std::string& what) {
  int64_t n = 1;
  for (int64_t x : d) {
    if (x < 0) return InvalidArgument(what, " has a negative dim: ", dims_str(d));
    if (x != 0 && n > kMaxTensorElements / x)
      return OutOfRange(what, " ", dims_str(d), " is too large (more than ", kMaxTensorElements, " elements)");
    n *= x;
  }
  return Status::Ok();
}

namespace {
template <typename U>
void take_typed(const U* s, U* d, const std::vector<int64_t>& idx, U fill) {
  for (size_t j = 0; j < idx.size(); ++j) d[j] = idx[j] < 0 ? fill : s[idx[j]];
}
}  // namespace

Tensor take_elements(const Tensor& src, const Dims& out_shape, const std::vector<int64_t>& idx, const Tensor* fill) {
  Tensor out(src.dtype(), out_shape);
  KILN_CHECK(static_cast<int64_t>(idx.size()) == out.numel());
  if (src.dtype() == DataType::kString) {
    std::string f = fill && fill->numel() ? fill->strings()[0] : std::string();
    for (size_t j = 0; j < idx.size(); ++j) out.strings()[j] = idx[j] < 0 ? f : src.strings()[idx[j]];
    return out;
  }
  size_t es = dtype_size(src.dtype());
  const void* fp = fill && fill->numel() ? fill->raw() : nullptr;
  auto run = [&](auto tag) {
    using U = decltype(tag);
    U f{};
    if (fp) std::memcpy(&f, fp, sizeof(U));
    take_typed(static_cast<const U*>(src.raw()), static_cast<U*>(out.raw()), idx, f);
  };
  switch (es) {
    case 1: run(uint8_t{}); break;
    case 2: run(uint16_t{}); break;
    case 4: run(uint32_t{}); break;
    case 8: run(uint64_t{}); break;
    default: {
      const auto* s = static_cast<const uint8_t*>(src.raw());
      auto* d = static_cast<uint8_t*>(out.raw());
      for (size_t j = 0; j < idx.size(); ++j) {
        if (idx[j] >= 0)
          std::memcpy(d + j * es, s + static_cast<size_t>(idx[j]) * es, es);
        else if (fp)
          std::memcpy(d + j * es, fp, es);
      }
    }
  }
  return out;
}

namespace {
// Calls copy(dst_index, src_index) for every element of a strided view, innermost dim in a tight loop.
template <typename Copy>
void walk_strided(const Dims& shape, const Dims& strides, int64_t offset, Copy&& copy) {
  int64_t n = dims_numel(shape);
  if (n <= 0) return;
  size_t r = shape.size();
  if (r == 0) {
    copy(0, offset);
    return;
  }
  int64_t inner = shape[r - 1], istride = strides[r - 1];
  Dims pos(r - 1, 0);
  int64_t cur = offset;
  for (int64_t j = 0; j < n; j += inner) {
    for (int64_t i = 0; i < inner; ++i) copy(j + i, cur + i * istride);
    for (size_t k = r - 1; k-- > 0;) {
      if (++pos[k] < shape[k]) {
        cur += strides[k];
        break;
      }
      cur -= strides[k] * (shape[k] - 1);
      pos[k] = 0;
    }
  }
}
}  // namespace

Tensor take_strided(const Tensor& src, const Dims& out_shape, const Dims& strides, int64_t offset) {
  Tensor out(src.dtype(), out_shape);
  if (src.dtype() == DataType::kString) {
    walk_strided(out_shape, strides, offset, [&](int64_t d, int64_t s) { out.strings()[d] = src.strings()[s]; });
    return out;
  }
  size_t es = dtype_size(src.dtype());
  auto run = [&](auto tag) {
    using U = decltype(tag);
    const U* s = static_cast<const U*>(src.raw());
    U* d = static_cast<U*>(out.raw());
    walk_strided(out_shape, strides, offset, [&](int64_t di, int64_t si) { d[di] = s[si]; });
  };
  switch (es) {
    case 1: run(uint8_t{}); break;
    case 2: run(uint16_t{}); break;
    case 4: run(uint32_t{}); break;
    case 8: run(uint64_t{}); break;
    default: {
      const auto* s = static_cast<const uint8_t*>(src.raw());
      auto* d = static_cast<uint8_t*>(out.raw());
      walk_strided(out_shape, strides, offset, [&](int64_t di, int64_t si) {
        std::memcpy(d + static_cast<size_t>(di) * es, s + static_cast<size_t>(si) * es, es);
      });
    }
  }
  return out;
}

Result<std::vector<int64_t>> ints_attr_or_input(const KernelContext& ctx, const std::string& name, size_t input,
                                                int input_since, bool* present) {
  *present = false;
  if (ctx.opset() < input_since) {
    const ir::Attribute* a = ctx.node.attr(name);
    if (!a) return std::vector<int64_t>{};
    *present = true;
    return a->ints;
  }
  if (!ctx.has_input(input)) return std::vector<int64_t>{};
  const Tensor& t = ctx.input(input);
  if (!dtype_is_integer(t.dtype()))
    return InvalidArgument("input '", name, "' must be an integer tensor, got ", t.describe());
  if (t.rank() > 1) return InvalidArgument("input '", name, "' must be 1-D, got ", t.describe());
  *present = true;
  return to_i64_vector(t);
}

Result<std::vector<int64_t>> normalize_axes(const std::vector<int64_t>& axes, int64_t rank) {
  std::vector<int64_t> out;
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(rank, 0)), false);
  for (int64_t a : axes) {
    if (a < -rank || a >= rank)
      return InvalidArgument("axis ", a, " is out of range for rank ", rank, " (valid: [", -rank, ", ", rank - 1, "])");
    int64_t n = a < 0 ? a + rank : a;
    if (seen[static_cast<size_t>(n)]) return InvalidArgument("axis ", a, " is repeated in axes");
    seen[static_cast<size_t>(n)] = true;
    out.push_back(n);
  }
  return out;
}

bool known_ints(const InferContext& ctx, size_t i, std::vector<int64_t>* out) {
  const SymValue* v = ctx.sym_value(i);
  if (!v) return false;
  out->clear();
  for (const SymInt& x : *v) {
    if (!x.known) return false;
    out->push_back(x.value);
  }
  return true;
}

bool known_ints_attr_or_input(const InferContext& ctx, const std::string& name, size_t input, int input_since,
                              std::vector<int64_t>* out, bool* present) {
  out->clear();
  *present = false;
  if (ctx.opset() < input_since) {
    const ir::Attribute* a = ctx.node.attr(name);
    if (a) {
      *present = true;
      *out = a->ints;
    }
    return true;
  }
  if (!ctx.has_input(input)) return true;
  *present = true;
  return known_ints(ctx, input, out);
}

int64_t known_length(const InferContext& ctx, size_t i) {
  if (const SymValue* v = ctx.sym_value(i)) return static_cast<int64_t>(v->size());
  const SymShape& s = ctx.input_shape(i);
  if (s.rank_known && s.rank() == 1 && s.dims[0].known()) return s.dims[0].value;
  if (s.rank_known && s.rank() == 0) return 1;
  return -1;
}

Dim dim_product(InferContext& ctx, const std::vector<Dim>& dims) {
  int64_t known = 1;
  const Dim* sym = nullptr;
  int unknown = 0;
  for (const Dim& d : dims) {
    if (d.known()) {
      if (d.value == 0) return Dim(0);
      if (known > (int64_t{1} << 62) / d.value) return ctx.new_symbol();
      known *= d.value;
    } else {
      ++unknown;
      sym = &d;
    }
  }
  if (unknown == 0) return Dim(known);
  if (unknown == 1 && known == 1 && !sym->param.empty()) return *sym;
  return ctx.new_symbol();
}

Dim dim_or_symbol(InferContext& ctx, const Dim& d) {
  if (d.known() || !d.param.empty()) return d;
  return ctx.new_symbol();
}

}  // namespace kiln::ops
