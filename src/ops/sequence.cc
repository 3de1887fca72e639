// Sequence ops: SequenceEmpty, SequenceConstruct, SequenceInsert, SequenceAt, SequenceErase,
// SequenceLength, SplitToSequence, ConcatFromSequence, SequenceMap; and the optional ops
// Optional, OptionalHasElement, OptionalGetElement.
//
// Statically a sequence is seq(elem): one tensor type that covers every element, so dims that
// differ between elements are unknown. At run time a sequence is a Value of kind kSequence; an
// empty optional is Value::none(), a present one is the tensor or sequence itself.
#include "ops/common.h"
#include "ops/control_flow_util.h"
#include "ops/deadline.h"

namespace kiln::ops {
namespace {

ir::TypeInfo seq_of(DataType dt, SymShape s = SymShape()) {
  return ir::TypeInfo::sequence(ir::TypeInfo::tensor(dt, std::move(s)));
}

// The sequence value of input i, or an error naming what came instead.
Result<const Value*> sequence_input(const KernelContext& ctx, size_t i) {
  if (i >= ctx.num_inputs() || !ctx.inputs[i]) return ctx.error(str_cat("input ", i, " (a sequence) is missing"));
  const Value& v = ctx.input_value(i);
  if (!v.is_sequence())
    return ctx.error(
        str_cat("input ", i, " must be a sequence, got ", v.is_tensor() ? "a tensor" : "an empty optional"));
  return &v;
}

Result<const Tensor*> tensor_input(const KernelContext& ctx, size_t i) {
  if (!ctx.has_input(i)) return ctx.error(str_cat("input ", i, " (a tensor) is missing"));
  const Value& v = ctx.input_value(i);
  if (!v.is_tensor()) return ctx.error(str_cat("input ", i, " must be a tensor, got a sequence"));
  return &v.tensor;
}

// A position input (int32/int64 scalar or one-element tensor).
Result<int64_t> position_input(const KernelContext& ctx, size_t i) {
  KILN_ASSIGN_OR_RETURN(const Tensor* t, tensor_input(ctx, i));
  if (t->dtype() != DataType::kInt32 && t->dtype() != DataType::kInt64)
    return ctx.error(str_cat("position must be int32 or int64, got ", t->describe()));
  if (t->numel() != 1 || t->rank() > 1) return ctx.error(str_cat("position must be a scalar, got ", t->describe()));
  return t->get_i64(0);
}

// Widens the element type of a sequence to cover `t` too (dtype mismatch is an error).
Status widen_elem(const InferContext& ctx, ir::TypeInfo& elem, const ir::TypeInfo& t) {
  if (elem.is_tensor() && t.is_tensor() && elem.elem != DataType::kUndefined && t.elem != DataType::kUndefined &&
      elem.elem != t.elem)
    return ctx.error(str_cat("sequence elements must share one dtype: ", elem.str(), " vs ", t.str()));
  elem = cf::widen(elem, t);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------

Status infer_sequence_empty(InferContext& ctx) {
  ctx.set_output(0,
                 seq_of(static_cast<DataType>(ctx.node.attr_int("dtype", static_cast<int64_t>(DataType::kFloat32)))));
  return Status::Ok();
}

Status sequence_empty_kernel(KernelContext& ctx) {
  int64_t dt = ctx.node.attr_int("dtype", static_cast<int64_t>(DataType::kFloat32));
  if (!dtype_is_known(static_cast<int32_t>(dt)) || dt == 0)
    return ctx.error(str_cat("dtype ", dt, " is not a data type"));
  ctx.set_output_value(0, Value::make_sequence({}, static_cast<DataType>(dt)));
  return Status::Ok();
}

Status infer_sequence_construct(InferContext& ctx) {
  if (ctx.num_inputs() == 0) return ctx.error("SequenceConstruct needs at least one input");
  ir::TypeInfo elem = ctx.has_input(0) ? ctx.input(0) : ir::TypeInfo();
  for (size_t i = 1; i < ctx.num_inputs(); ++i)
    KILN_RETURN_IF_ERROR(widen_elem(ctx, elem, ctx.has_input(i) ? ctx.input(i) : ir::TypeInfo()));
  ctx.set_output(0, ir::TypeInfo::sequence(elem));
  return Status::Ok();
}

Status sequence_construct_kernel(KernelContext& ctx) {
  std::vector<Tensor> items;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    KILN_ASSIGN_OR_RETURN(const Tensor* t, tensor_input(ctx, i));
    if (!items.empty() && t->dtype() != items[0].dtype())
      return ctx.error(str_cat("inputs must share one dtype: input 0 is ", items[0].describe(), ", input ", i, " is ",
                               t->describe()));
    items.push_back(*t);
  }
  DataType dt = items[0].dtype();
  ctx.set_output_value(0, Value::make_sequence(std::move(items), dt));
  return Status::Ok();
}

Status infer_sequence_insert(InferContext& ctx) {
  const ir::TypeInfo* e = cf::sequence_elem(ctx, 0);
  ir::TypeInfo elem = e ? *e : ir::TypeInfo();
  if (ctx.has_input(1)) KILN_RETURN_IF_ERROR(widen_elem(ctx, elem, ctx.input(1)));
  ctx.set_output(0, ir::TypeInfo::sequence(elem));
  return Status::Ok();
}

Status sequence_insert_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Value* s, sequence_input(ctx, 0));
  KILN_ASSIGN_OR_RETURN(const Tensor* t, tensor_input(ctx, 1));
  DataType dt = s->sequence_elem != DataType::kUndefined ? s->sequence_elem
                                                         : (s->sequence.empty() ? t->dtype() : s->sequence[0].dtype());
  if (t->dtype() != dt)
    return ctx.error(str_cat("cannot insert ", t->describe(), " into a sequence of ", dtype_name(dt)));
  std::vector<Tensor> items = s->sequence;
  int64_t n = static_cast<int64_t>(items.size());
  int64_t pos = n;
  if (ctx.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(pos, position_input(ctx, 2));
    if (pos < -n || pos > n)
      return ctx.error(
          str_cat("position ", pos, " is out of range for a sequence of ", n, " (valid: [", -n, ", ", n, "])"));
    if (pos < 0) pos += n;
  }
  items.insert(items.begin() + pos, *t);
  ctx.set_output_value(0, Value::make_sequence(std::move(items), dt));
  return Status::Ok();
}

Status infer_sequence_at(InferContext& ctx) {
  if (const ir::TypeInfo* e = cf::sequence_elem(ctx, 0)) ctx.set_output(0, *e);
  return Status::Ok();
}

Status sequence_at_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Value* s, sequence_input(ctx, 0));
  KILN_ASSIGN_OR_RETURN(int64_t pos, position_input(ctx, 1));
  int64_t n = static_cast<int64_t>(s->sequence.size());
  if (pos < -n || pos >= n)
    return ctx.error(
        str_cat("position ", pos, " is out of range for a sequence of ", n, " (valid: [", -n, ", ", n - 1, "])"));
  ctx.set_output(0, s->sequence[static_cast<size_t>(pos < 0 ? pos + n : pos)]);
  return Status::Ok();
}

Status infer_same_sequence(InferContext& ctx) {
  if (ctx.has_input(0) && ctx.input(0).kind == ir::TypeInfo::Kind::kSequence) ctx.set_output(0, ctx.input(0));
  return Status::Ok();
}

Status sequence_erase_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Value* s, sequence_input(ctx, 0));
  int64_t n = static_cast<int64_t>(s->sequence.size());
  int64_t pos = -1;
  if (ctx.has_input(1)) {
    KILN_ASSIGN_OR_RETURN(pos, position_input(ctx, 1));
  }
  if (pos < -n || pos >= n)
    return ctx.error(
        str_cat("position ", pos, " is out of range for a sequence of ", n, " (valid: [", -n, ", ", n - 1, "])"));
  std::vector<Tensor> items = s->sequence;
  items.erase(items.begin() + (pos < 0 ? pos + n : pos));
  ctx.set_output_value(0, Value::make_sequence(std::move(items), s->sequence_elem));
  return Status::Ok();
}

Status infer_sequence_length(InferContext& ctx) {
  ctx.set_output(0, DataType::kInt64, SymShape(std::vector<Dim>{}));
  return Status::Ok();
}

Status sequence_length_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Value* s, sequence_input(ctx, 0));
  ctx.set_output(0, Tensor::scalar<int64_t>(DataType::kInt64, static_cast<int64_t>(s->sequence.size())));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// SplitToSequence

Status infer_split_to_sequence(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  const SymShape& in = ctx.input_shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, seq_of(dt));
    return Status::Ok();
  }
  int64_t rank = static_cast<int64_t>(in.rank());
  auto axis = normalize_axis(ctx.node.attr_int("axis", 0), rank);
  if (!axis.ok()) return ctx.error(axis.status().message());
  std::vector<Dim> d = in.dims;
  size_t ax = static_cast<size_t>(axis.value());
  if (!ctx.has_input(1)) {
    if (ctx.node.attr_int("keepdims", 1))
      d[ax] = Dim(1);
    else
      d.erase(d.begin() + static_cast<std::ptrdiff_t>(ax));
  } else {
    // The piece length is known when every piece has the same one.
    std::vector<int64_t> split;
    Dim piece;
    if (constant_ints(ctx, 1, &split) && !split.empty()) {
      const Tensor* c = ctx.constant(1);
      bool uniform = true;
      for (int64_t v : split) uniform &= v == split[0];
      if (c->rank() == 0 && in.dims[ax].known() && split[0] > 0 && in.dims[ax].value % split[0] == 0)
        piece = Dim(split[0]);
      if (c->rank() == 1 && uniform) piece = Dim(split[0]);
    }
    d[ax] = piece;
  }
  ctx.set_output(0, seq_of(dt, SymShape(d)));
  return Status::Ok();
}

// Slices [start, start + len) of axis `axis`.
Tensor slice_axis(const Tensor& t, int64_t axis, int64_t start, int64_t len) {
  Dims shape = t.shape();
  int64_t outer = 1, inner = 1, dim = shape[static_cast<size_t>(axis)];
  for (int64_t i = 0; i < axis; ++i) outer *= shape[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(axis) + 1; i < shape.size(); ++i) inner *= shape[i];
  shape[static_cast<size_t>(axis)] = len;
  Tensor out(t.dtype(), shape);
  for (int64_t o = 0; o < outer; ++o) copy_elements(t, (o * dim + start) * inner, out, o * len * inner, len * inner);
  return out;
}

Status split_to_sequence_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Tensor* x, tensor_input(ctx, 0));
  if (x->rank() == 0) return ctx.error("cannot split a scalar");
  auto axis_r = normalize_axis(ctx.node.attr_int("axis", 0), x->rank());
  if (!axis_r.ok()) return ctx.error(axis_r.status().message());
  int64_t axis = axis_r.value();
  int64_t dim = x->dim(axis);
  std::vector<int64_t> lengths;
  bool squeeze = false;
  if (!ctx.has_input(1)) {
    lengths.assign(static_cast<size_t>(dim), 1);
    squeeze = ctx.node.attr_int("keepdims", 1) == 0;
  } else {
    KILN_ASSIGN_OR_RETURN(const Tensor* split, tensor_input(ctx, 1));
    if (split->dtype() != DataType::kInt32 && split->dtype() != DataType::kInt64)
      return ctx.error(str_cat("split must be int32 or int64, got ", split->describe()));
    if (split->rank() == 0) {
      int64_t len = split->get_i64(0);
      if (len <= 0) return ctx.error(str_cat("split length must be positive, got ", len));
      for (int64_t p = 0; p < dim; p += len) lengths.push_back(std::min(len, dim - p));
    } else if (split->rank() == 1) {
      int64_t sum = 0;
      for (int64_t v : to_i64_vector(*split)) {
        if (v < 0) return ctx.error(str_cat("split lengths must be >= 0, got ", v));
        if (v > dim - sum) return ctx.error(str_cat("split lengths add up to more than dim ", axis, " (", dim, ")"));
        sum += v;
        lengths.push_back(v);
      }
      if (sum != dim)
        return ctx.error(
            str_cat("split lengths add up to ", sum, " but dim ", axis, " of ", x->describe(), " is ", dim));
    } else {
      return ctx.error(str_cat("split must be a scalar or 1-D, got ", split->describe()));
    }
  }
  std::vector<Tensor> items;
  int64_t start = 0;
  for (int64_t len : lengths) {
    Tensor piece = slice_axis(*x, axis, start, len);
    start += len;
    if (squeeze) {
      Dims s = piece.shape();
      s.erase(s.begin() + axis);
      piece = piece.reshaped(s);
    }
    items.push_back(std::move(piece));
  }
  ctx.set_output_value(0, Value::make_sequence(std::move(items), x->dtype()));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// ConcatFromSequence

Status infer_concat_from_sequence(InferContext& ctx) {
  const ir::TypeInfo* e = cf::sequence_elem(ctx, 0);
  if (!e || !e->is_tensor()) return Status::Ok();
  if (!ctx.node.attr("axis")) return ctx.error("attribute 'axis' is required");
  bool new_axis = ctx.node.attr_int("new_axis", 0) != 0;
  if (!e->shape.rank_known) {
    ctx.set_output(0, e->elem, SymShape());
    return Status::Ok();
  }
  int64_t rank = static_cast<int64_t>(e->shape.rank()) + (new_axis ? 1 : 0);
  auto axis = normalize_axis(ctx.node.attr_int("axis", 0), rank);
  if (!axis.ok()) return ctx.error(axis.status().message());
  std::vector<Dim> d = e->shape.dims;
  if (new_axis)
    d.insert(d.begin() + axis.value(), Dim());
  else
    d[static_cast<size_t>(axis.value())] = Dim();
  ctx.set_output(0, e->elem, SymShape(d));
  return Status::Ok();
}

Status concat_from_sequence_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Value* s, sequence_input(ctx, 0));
  const ir::Attribute* axis_attr = ctx.node.attr("axis");
  if (!axis_attr) return ctx.error("attribute 'axis' is required");
  bool new_axis = ctx.node.attr_int("new_axis", 0) != 0;
  const std::vector<Tensor>& items = s->sequence;
  if (items.empty()) return ctx.error("cannot concatenate an empty sequence");
  const Tensor& first = items[0];
  int64_t rank = first.rank() + (new_axis ? 1 : 0);
  if (rank == 0) return ctx.error("cannot concatenate scalars without new_axis=1");
  auto axis_r = normalize_axis(axis_attr->i, rank);
  if (!axis_r.ok()) return ctx.error(axis_r.status().message());
  int64_t axis = axis_r.value();
  // View every element with the concatenation axis present.
  auto view = [&](const Tensor& t) {
    if (!new_axis) return t;
    Dims d = t.shape();
    d.insert(d.begin() + axis, 1);
    return t.reshaped(d);
  };
  Dims out_shape = view(first).shape();
  int64_t total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    Tensor v = view(items[i]);
    if (v.dtype() != first.dtype() || v.rank() != rank)
      return ctx.error(
          str_cat("element ", i, " ", items[i].describe(), " does not match element 0 ", first.describe()));
    for (int64_t k = 0; k < rank; ++k)
      if (k != axis && v.dim(k) != out_shape[static_cast<size_t>(k)])
        return ctx.error(str_cat("element ", i, " ", items[i].describe(), " differs from element 0 ", first.describe(),
                                 " outside axis ", axis));
    total += v.dim(axis);
  }
  out_shape[static_cast<size_t>(axis)] = total;
  Tensor out(first.dtype(), out_shape);
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < axis; ++k) outer *= out_shape[static_cast<size_t>(k)];
  for (int64_t k = axis + 1; k < rank; ++k) inner *= out_shape[static_cast<size_t>(k)];
  int64_t offset = 0;
  for (const Tensor& t : items) {
    int64_t len = view(t).dim(axis);
    for (int64_t o = 0; o < outer; ++o)
      copy_elements(t, o * len * inner, out, (o * total + offset) * inner, len * inner);
    offset += len;
  }
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// SequenceMap: runs the body once per element; sequence inputs are iterated together, tensor
// inputs are passed whole to every iteration. Output j is the sequence of body output j.

Status infer_sequence_map(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ir::Graph* body, cf::graph_attr(ctx.node, "body"));
  if (body->inputs.size() != ctx.num_inputs())
    return ctx.error(str_cat("body takes ", body->inputs.size(), " inputs but the node has ", ctx.num_inputs()));
  std::vector<ir::TypeInfo> in;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const ir::TypeInfo* e = cf::sequence_elem(ctx, i);
    in.push_back(e ? *e : (ctx.has_input(i) && ctx.input(i).is_tensor() ? ctx.input(i) : ir::TypeInfo()));
  }
  if (!ctx.infer_subgraph) return Status::Ok();
  KILN_ASSIGN_OR_RETURN(std::vector<ir::TypeInfo> outs, ctx.infer_subgraph(*body, in));
  for (size_t j = 0; j < outs.size() && j < ctx.outputs.size(); ++j) ctx.set_output(j, ir::TypeInfo::sequence(outs[j]));
  return Status::Ok();
}

Status sequence_map_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ir::Graph* body, cf::graph_attr(ctx.node, "body"));
  if (!ctx.subgraphs) return ctx.unsupported("SequenceMap needs a subgraph runner");
  if (body->inputs.size() != ctx.num_inputs())
    return ctx.error(str_cat("body takes ", body->inputs.size(), " inputs but the node has ", ctx.num_inputs()));
  if (body->outputs.size() != ctx.num_outputs())
    return ctx.error(str_cat("body has ", body->outputs.size(), " outputs but the node has ", ctx.num_outputs()));
  KILN_ASSIGN_OR_RETURN(const Value* s0, sequence_input(ctx, 0));
  size_t n = s0->sequence.size();
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    if (!ctx.inputs[i]) return ctx.error(str_cat("input ", i, " is missing"));
    const Value& v = ctx.input_value(i);
    if (v.is_sequence() && v.sequence.size() != n)
      return ctx.error(str_cat("input ", i, " is a sequence of ", v.sequence.size(), ", input 0 of ", n));
    if (v.is_none()) return ctx.error(str_cat("input ", i, " is an empty optional"));
  }
  std::vector<std::vector<Tensor>> results(body->outputs.size());
  std::vector<Value> feed(ctx.num_inputs());
  for (size_t k = 0; k < n; ++k) {
    KILN_RETURN_IF_ERROR(check_deadline(ctx.node, static_cast<int64_t>(k)));
    for (size_t i = 0; i < ctx.num_inputs(); ++i) {
      const Value& v = ctx.input_value(i);
      feed[i] = v.is_sequence() ? Value(v.sequence[k]) : v;
    }
    KILN_ASSIGN_OR_RETURN(std::vector<Value> outs, ctx.subgraphs->run_subgraph(*body, feed));
    for (size_t j = 0; j < outs.size() && j < results.size(); ++j) {
      if (!outs[j].is_tensor()) return ctx.error(str_cat("body output ", j, " must be a tensor"));
      results[j].push_back(std::move(outs[j].tensor));
    }
  }
  for (size_t j = 0; j < results.size(); ++j) {
    DataType dt = results[j].empty() ? body->outputs[j].type.elem : results[j][0].dtype();
    ctx.set_output_value(j, Value::make_sequence(std::move(results[j]), dt));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Optional

Status infer_optional(InferContext& ctx) {
  if (ctx.has_input(0)) {
    ctx.set_output(0, ir::TypeInfo::optional(ctx.input(0)));
  } else if (const ir::Attribute* a = ctx.node.attr("type")) {
    ctx.set_output(0, ir::TypeInfo::optional(a->type_proto));
  } else {
    return ctx.error("an Optional without input needs the 'type' attribute");
  }
  return Status::Ok();
}

Status optional_kernel(KernelContext& ctx) {
  if (ctx.num_inputs() > 0 && ctx.inputs[0])
    ctx.set_output_value(0, ctx.input_value(0));
  else
    ctx.set_output_value(0, Value::none());
  return Status::Ok();
}

Status infer_optional_has_element(InferContext& ctx) {
  ctx.set_output(0, DataType::kBool, SymShape(std::vector<Dim>{}));
  return Status::Ok();
}

Status optional_has_element_kernel(KernelContext& ctx) {
  bool has = ctx.num_inputs() > 0 && ctx.inputs[0] && !ctx.inputs[0]->is_none();
  ctx.set_output(0, Tensor::scalar<bool>(DataType::kBool, has));
  return Status::Ok();
}

Status infer_optional_get_element(InferContext& ctx) {
  if (!ctx.has_input(0)) return Status::Ok();
  const ir::TypeInfo& t = ctx.input(0);
  if (t.kind == ir::TypeInfo::Kind::kOptional) {
    if (t.inner) ctx.set_output(0, *t.inner);
  } else {
    ctx.set_output(0, t);
  }
  return Status::Ok();
}

Status optional_get_element_kernel(KernelContext& ctx) {
  if (ctx.num_inputs() == 0 || !ctx.inputs[0] || ctx.inputs[0]->is_none())
    return ctx.error("the optional input is empty: it has no element to get");
  ctx.set_output_value(0, ctx.input_value(0));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", SequenceEmpty, 11, infer_sequence_empty, sequence_empty_kernel, 0, 0);
KILN_REGISTER_OP_ARITY("", SequenceConstruct, 11, infer_sequence_construct, sequence_construct_kernel, 1, -1);
KILN_REGISTER_OP_ARITY("", SequenceInsert, 11, infer_sequence_insert, sequence_insert_kernel, 2, 3);
KILN_REGISTER_OP_ARITY("", SequenceAt, 11, infer_sequence_at, sequence_at_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", SequenceErase, 11, infer_same_sequence, sequence_erase_kernel, 1, 2);
KILN_REGISTER_OP_ARITY("", SequenceLength, 11, infer_sequence_length, sequence_length_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", SplitToSequence, 11, infer_split_to_sequence, split_to_sequence_kernel, 1, 2);
KILN_REGISTER_OP_ARITY("", ConcatFromSequence, 11, infer_concat_from_sequence, concat_from_sequence_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("", SequenceMap, 17, infer_sequence_map, sequence_map_kernel, 1, -1);
KILN_REGISTER_OP_ARITY("", Optional, 15, infer_optional, optional_kernel, 0, 1);
KILN_REGISTER_OP_ARITY("", OptionalHasElement, 15, infer_optional_has_element, optional_has_element_kernel, 0, 1);
KILN_REGISTER_OP_ARITY("", OptionalGetElement, 15, infer_optional_get_element, optional_get_element_kernel, 1, 1);

}  // namespace kiln::ops
