#include "ops/elementwise_util.h"

#include <algorithm>

namespace kiln::ops {

namespace {
bool legacy_broadcast_on(const ir::Node& n) { return n.attr_int("broadcast", 0) != 0; }

// Where B's dims start inside A under legacy broadcasting.
Result<int64_t> legacy_axis(const ir::Node& n, size_t rank_a, size_t rank_b) {
  auto ra = static_cast<int64_t>(rank_a), rb = static_cast<int64_t>(rank_b);
  if (rb > ra) return InvalidArgument("legacy broadcasting (opset < 7) needs rank(B) <= rank(A), got ", rb, " > ", ra);
  int64_t axis = ra - rb;
  if (n.attr("axis")) {
    axis = n.attr_int("axis", 0);
    if (axis < 0) axis += ra;
    if (axis < 0 || axis > ra - rb)
      return InvalidArgument("legacy broadcast axis ", n.attr_int("axis", 0), " does not fit B (rank ", rb,
                             ") into A (rank ", ra, ")");
  }
  return axis;
}
}  // namespace

Result<Dims> legacy_align(const ir::Node& n, const Dims& a, const Dims& b) {
  if (!legacy_broadcast_on(n)) {
    if (a != b)
      return InvalidArgument("shapes ", dims_str(a), " and ", dims_str(b),
                             " differ and attribute broadcast is 0 (opset < 7 broadcasts only when broadcast=1)");
    return b;
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, legacy_axis(n, a.size(), b.size()));
  Dims r(a.size(), 1);
  for (size_t i = 0; i < b.size(); ++i) {
    size_t k = static_cast<size_t>(axis) + i;
    if (b[i] != 1 && b[i] != a[k])
      return InvalidArgument("cannot broadcast B ", dims_str(b), " onto A ", dims_str(a), " at axis ", axis, " (dim ",
                             k, ": ", b[i], " vs ", a[k], ")");
    r[k] = b[i];
  }
  return r;
}

Result<SymShape> legacy_align_sym(const ir::Node& n, const SymShape& a, const SymShape& b) {
  if (!legacy_broadcast_on(n)) {
    if (a.rank_known && b.rank_known) {
      if (a.rank() != b.rank())
        return InvalidModel("shapes ", a.str(), " and ", b.str(),
                            " differ and attribute broadcast is 0 (opset < 7 broadcasts only when broadcast=1)");
      for (size_t i = 0; i < a.rank(); ++i)
        if (a.dims[i].known() && b.dims[i].known() && a.dims[i].value != b.dims[i].value)
          return InvalidModel("shapes ", a.str(), " and ", b.str(),
                              " differ and attribute broadcast is 0 (opset < 7 broadcasts only when broadcast=1)");
    }
    return b;
  }
  if (!a.rank_known || !b.rank_known) return SymShape::unknown();
  auto axis = legacy_axis(n, a.rank(), b.rank());
  if (!axis.ok()) return InvalidModel(axis.status().message());
  std::vector<Dim> r(a.rank(), Dim(1));
  for (size_t i = 0; i < b.rank(); ++i) r[static_cast<size_t>(*axis) + i] = b.dims[i];
  return SymShape(r);
}

bool small_broadcast(std::initializer_list<const Tensor*> ins, SmallBroadcast& s) {
  if (ins.size() > SmallBroadcast::kMaxInputs) return false;
  s.rank = 0, s.inputs = ins.size();
  for (const Tensor* t : ins) {
    if (static_cast<size_t>(t->rank()) > SmallBroadcast::kMaxRank) return false;
    s.rank = std::max(s.rank, static_cast<size_t>(t->rank()));
  }
  for (size_t i = 0; i < s.rank; ++i) s.out[i] = 1;
  for (const Tensor* t : ins) {
    const size_t lead = s.rank - static_cast<size_t>(t->rank());
    for (size_t i = lead; i < s.rank; ++i) {
      const int64_t d = t->dim(static_cast<int64_t>(i - lead));
      if (d == s.out[i] || d == 1) continue;
      if (s.out[i] != 1) return false;
      s.out[i] = d;
    }
  }
  size_t j = 0;
  for (const Tensor* t : ins) {
    const size_t lead = s.rank - static_cast<size_t>(t->rank());
    int64_t stride = 1;
    for (size_t i = s.rank; i-- > 0;) {
      const int64_t d = i < lead ? 1 : t->dim(static_cast<int64_t>(i - lead));
      s.stride[j][i] = d == 1 ? 0 : stride;
      stride *= d;
    }
    ++j;
  }
  return true;
}

Result<BroadcastPlan> plan_broadcast(const ir::Node& n, const std::vector<const Tensor*>& ins, bool legacy) {
  BroadcastPlan p;
  std::vector<Dims> shapes;
  for (const Tensor* t : ins) shapes.push_back(t->shape());
  if (legacy && shapes.size() == 2) {
    KILN_ASSIGN_OR_RETURN(shapes[1], legacy_align(n, shapes[0], shapes[1]));
  }
  if (!shapes.empty()) p.out = shapes[0];
  for (size_t i = 1; i < shapes.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(p.out, broadcast_dims(p.out, shapes[i]));
  }
  for (const Dims& s : shapes) p.index.emplace_back(s, p.out);
  return p;
}

namespace {
// Fails when two known dims can definitely not broadcast together.
Status check_broadcastable(const InferContext& ctx, const SymShape& a, const SymShape& b) {
  if (!a.rank_known || !b.rank_known) return Status::Ok();
  size_t r = std::max(a.rank(), b.rank());
  for (size_t i = 0; i < r; ++i) {
    if (i < r - a.rank() || i < r - b.rank()) continue;
    const Dim& da = a.dims[i - (r - a.rank())];
    const Dim& db = b.dims[i - (r - b.rank())];
    if (da.known() && db.known() && da.value != db.value && da.value != 1 && db.value != 1)
      return ctx.error(str_cat("input shapes ", a.str(), " and ", b.str(), " cannot be broadcast (", da.value, " vs ",
                               db.value, ")"));
  }
  return Status::Ok();
}
}  // namespace

Status infer_broadcast_to(InferContext& ctx, DataType out, bool legacy) {
  std::vector<SymShape> shapes;
  for (size_t i = 0; i < ctx.num_inputs(); ++i)
    if (ctx.has_input(i)) shapes.push_back(ctx.input_shape(i));
  if (legacy && shapes.size() == 2) {
    auto r = legacy_align_sym(ctx.node, shapes[0], shapes[1]);
    if (!r.ok()) return ctx.error(r.status().message());
    shapes[1] = *r;
  }
  SymShape s;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (i == 0) {
      s = shapes[0];
      continue;
    }
    KILN_RETURN_IF_ERROR(check_broadcastable(ctx, s, shapes[i]));
    s = broadcast_sym(s, shapes[i]);
  }
  ctx.set_output(0, out, s);
  return Status::Ok();
}

Status infer_broadcast_same_type(InferContext& ctx, bool legacy) {
  DataType dt = DataType::kUndefined;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i) || ctx.input_dtype(i) == DataType::kUndefined) continue;
    if (dt != DataType::kUndefined && ctx.input_dtype(i) != dt)
      return ctx.error(str_cat("inputs must share one dtype, got ", dtype_name(dt), " and ",
                               dtype_name(ctx.input_dtype(i)), " (input ", i, ")"));
    dt = ctx.input_dtype(i);
  }
  return infer_broadcast_to(ctx, dt, legacy);
}

Status check_same_dtype(const KernelContext& ctx, size_t first, size_t last) {
  const Tensor* ref = nullptr;
  for (size_t i = first; i <= last && i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) continue;
    if (ref && ctx.input(i).dtype() != ref->dtype())
      return ctx.error(str_cat("inputs must share one dtype, got ", ref->describe(), " and ", ctx.input(i).describe(),
                               " (input ", i, ")"));
    if (!ref) ref = &ctx.input(i);
  }
  return Status::Ok();
}

bool is_numeric(DataType t) { return dtype_is_float(t) || dtype_is_integer(t); }

}  // namespace kiln::ops
