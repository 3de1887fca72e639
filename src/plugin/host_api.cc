// The host table of kiln/plugin.h: attribute and shape accessors over kiln's IR, error messages,
// serialization buffers.
#include "plugin/host_api.h"

#include <cstdio>

#include "kiln/custom_op.h"

namespace kiln::plugin {

kiln_tensor tensor_view(const Tensor& t) {
  kiln_tensor v{};
  v.dtype = static_cast<int32_t>(t.dtype());
  v.rank = static_cast<int32_t>(t.rank());
  v.dims = t.shape().data();
  v.data = const_cast<void*>(t.raw());
  v.nbytes = t.dtype() == DataType::kString ? 0 : t.nbytes();
  return v;
}

Result<ir::TypeInfo> output_type(const kiln_shape_ctx& ctx, size_t o) {
  if (o >= ctx.outputs.size() || !ctx.outputs[o].set)
    return InvalidModel("its infer callback did not set the type of output ", o);
  const auto& out = ctx.outputs[o];
  return ir::TypeInfo::tensor(static_cast<DataType>(out.dtype), SymShape(out.dims));
}

Result<Dims> output_dims(const kiln_shape_ctx& ctx, size_t o) {
  KILN_ASSIGN_OR_RETURN(ir::TypeInfo t, output_type(ctx, o));
  if (!t.shape.fully_known())
    return InvalidModel("its infer callback left output ", o, " with shape ", t.shape.str(),
                        " at the concrete input shapes (every dim must be known there)");
  return t.shape.concrete();
}

}  // namespace kiln::plugin

namespace {
using kiln::Dim;
using Input = kiln_shape_ctx::Input;

void set_constant(Input& in, const kiln::Tensor* t) {
  in.constant = t;
  if (t) in.constant_view = kiln::plugin::tensor_view(*t);
}
}  // namespace

kiln_shape_ctx kiln_shape_ctx::from_infer(const kiln::ops::InferContext& ctx) {
  kiln_shape_ctx s;
  s.writable = true;
  s.inputs.resize(ctx.num_inputs());
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    Input& in = s.inputs[i];
    if (!ctx.has_input(i)) continue;
    in.present = true;
    in.dtype = static_cast<int32_t>(ctx.input_dtype(i));
    const kiln::SymShape& sh = ctx.input_shape(i);
    if (sh.rank_known) in.rank = static_cast<int32_t>(sh.rank()), in.dims = sh.dims;
    set_constant(in, ctx.constant(i));
  }
  s.outputs.resize(ctx.node.outputs.size());
  return s;
}

kiln_shape_ctx kiln_shape_ctx::from_signature(const kiln::backends::LayerSignature& sig) {
  kiln_shape_ctx s;
  s.inputs.resize(sig.inputs.size());
  for (size_t i = 0; i < sig.inputs.size(); ++i) {
    const auto& t = sig.inputs[i];
    Input& in = s.inputs[i];
    if (!t.present) continue;
    in.present = true;
    in.dtype = static_cast<int32_t>(t.dtype);
    if (t.dtype != kiln::DataType::kUndefined) {
      in.rank = static_cast<int32_t>(t.shape.size());
      for (int64_t d : t.shape) in.dims.push_back(d >= 0 ? Dim(d) : Dim());
    }
    set_constant(in, t.constant);
  }
  s.outputs.resize(sig.outputs.size());
  return s;
}

kiln_shape_ctx kiln_shape_ctx::from_tensors(const std::vector<const kiln::Tensor*>& inputs, size_t outputs) {
  kiln_shape_ctx s;
  s.writable = true;
  s.inputs.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]) continue;
    Input& in = s.inputs[i];
    in.present = true;
    in.dtype = static_cast<int32_t>(inputs[i]->dtype());
    in.rank = static_cast<int32_t>(inputs[i]->rank());
    for (int64_t d : inputs[i]->shape()) in.dims.push_back(Dim(d));
  }
  s.outputs.resize(outputs);
  return s;
}

namespace {

void host_set_error(kiln_error* err, const char* message) {
  if (!err) return;
  err->set = true;
  err->message = message ? message : "(no message)";
}

void host_warn(const char* message) { std::fprintf(stderr, "kiln: warning: %s\n", message ? message : ""); }

const kiln::ir::Attribute* attr_of(const kiln_attrs* a, const char* name) {
  return a && a->node && name ? a->node->attr(name) : nullptr;
}

const char* host_node_name(const kiln_attrs* a) { return a && a->node ? a->node->name.c_str() : ""; }

using AttrType = kiln::ir::Attribute::Type;

int host_attr_int(const kiln_attrs* a, const char* name, int64_t* value) {
  const auto* at = attr_of(a, name);
  if (!at) return 0;
  if (at->type != AttrType::kInt) return -1;
  if (value) *value = at->i;
  return 1;
}
int host_attr_float(const kiln_attrs* a, const char* name, float* value) {
  const auto* at = attr_of(a, name);
  if (!at) return 0;
  if (at->type != AttrType::kFloat) return -1;
  if (value) *value = at->f;
  return 1;
}
int host_attr_string(const kiln_attrs* a, const char* name, const char** data, size_t* size) {
  const auto* at = attr_of(a, name);
  if (!at) return 0;
  if (at->type != AttrType::kString) return -1;
  if (data) *data = at->s.c_str();
  if (size) *size = at->s.size();
  return 1;
}
int host_attr_ints(const kiln_attrs* a, const char* name, const int64_t** values, size_t* count) {
  const auto* at = attr_of(a, name);
  if (!at) return 0;
  if (at->type != AttrType::kInts) return -1;
  if (values) *values = at->ints.data();
  if (count) *count = at->ints.size();
  return 1;
}
int host_attr_floats(const kiln_attrs* a, const char* name, const float** values, size_t* count) {
  const auto* at = attr_of(a, name);
  if (!at) return 0;
  if (at->type != AttrType::kFloats) return -1;
  if (values) *values = at->floats.data();
  if (count) *count = at->floats.size();
  return 1;
}

const Input* input_of(const kiln_shape_ctx* c, int32_t i) {
  return c && i >= 0 && static_cast<size_t>(i) < c->inputs.size() ? &c->inputs[i] : nullptr;
}
int32_t host_num_inputs(const kiln_shape_ctx* c) { return c ? static_cast<int32_t>(c->inputs.size()) : 0; }
int32_t host_num_outputs(const kiln_shape_ctx* c) { return c ? static_cast<int32_t>(c->outputs.size()) : 0; }
int32_t host_input_dtype(const kiln_shape_ctx* c, int32_t i) {
  const Input* in = input_of(c, i);
  return in && in->present ? in->dtype : 0;
}
int32_t host_input_rank(const kiln_shape_ctx* c, int32_t i) {
  const Input* in = input_of(c, i);
  return in && in->present ? in->rank : -1;
}
int64_t host_input_dim(const kiln_shape_ctx* c, int32_t i, int32_t axis) {
  const Input* in = input_of(c, i);
  if (!in || !in->present || axis < 0 || axis >= in->rank || static_cast<size_t>(axis) >= in->dims.size()) return -1;
  return in->dims[axis].known() ? in->dims[axis].value : -1;
}
const kiln_tensor* host_input_constant(const kiln_shape_ctx* c, int32_t i) {
  const Input* in = input_of(c, i);
  return in && in->constant ? &in->constant_view : nullptr;
}

kiln_shape_ctx::Output* output_of(kiln_shape_ctx* c, int32_t o) {
  return c && c->writable && o >= 0 && static_cast<size_t>(o) < c->outputs.size() ? &c->outputs[o] : nullptr;
}
int host_set_output_type(kiln_shape_ctx* c, int32_t o, int32_t dtype, int32_t rank) {
  auto* out = output_of(c, o);
  if (!out || rank < 0 || rank > 64 || !kiln::dtype_is_known(dtype) || dtype == 0) return KILN_FAIL;
  out->set = true;
  out->dtype = dtype;
  out->dims.assign(static_cast<size_t>(rank), Dim());
  return KILN_OK;
}
int host_set_output_dim(kiln_shape_ctx* c, int32_t o, int32_t axis, int64_t value) {
  auto* out = output_of(c, o);
  if (!out || !out->set || axis < 0 || static_cast<size_t>(axis) >= out->dims.size()) return KILN_FAIL;
  out->dims[axis] = value >= 0 ? Dim(value) : Dim();
  return KILN_OK;
}
int host_copy_input_dim(kiln_shape_ctx* c, int32_t o, int32_t axis, int32_t i, int32_t in_axis) {
  auto* out = output_of(c, o);
  const Input* in = input_of(c, i);
  if (!out || !out->set || axis < 0 || static_cast<size_t>(axis) >= out->dims.size() || !in || !in->present)
    return KILN_FAIL;
  out->dims[axis] = in_axis >= 0 && static_cast<size_t>(in_axis) < in->dims.size() ? in->dims[in_axis] : Dim();
  return KILN_OK;
}
int host_copy_input_type(kiln_shape_ctx* c, int32_t o, int32_t i) {
  auto* out = output_of(c, o);
  const Input* in = input_of(c, i);
  if (!out || !in || !in->present || in->dtype == 0) return KILN_FAIL;
  out->set = true;
  out->dtype = in->dtype;
  out->dims = in->dims;
  if (in->rank < 0) return KILN_FAIL;  // an unknown rank cannot be an output's
  return KILN_OK;
}

// The node's attributes but kiln's own ("kiln.*": the stored state kStateAttr, a body layer's chosen
// kernel, ...): what num_attrs / attr_name enumerate.
bool listed(const std::string& name) { return name.rfind("kiln.", 0) != 0; }
int32_t host_num_attrs(const kiln_attrs* a) {
  if (!a || !a->node) return 0;
  int32_t n = 0;
  for (const auto& [name, at] : a->node->attrs) n += listed(name);
  return n;
}
const char* host_attr_name(const kiln_attrs* a, int32_t index) {
  if (!a || !a->node || index < 0) return nullptr;
  for (const auto& [name, at] : a->node->attrs)
    if (listed(name) && index-- == 0) return name.c_str();
  return nullptr;
}
int32_t host_attr_type(const kiln_attrs* a, const char* name) {
  const auto* at = attr_of(a, name);
  if (!at || (name && !listed(name))) return 0;
  return at->type == AttrType::kTypeProto ? 13 : static_cast<int32_t>(at->type);  // ONNX's codes
}
int host_attr_strings(const kiln_attrs* a, const char* name, size_t index, const char** data, size_t* size,
                      size_t* count) {
  const auto* at = attr_of(a, name);
  if (!at) return 0;
  if (at->type != AttrType::kStrings) return -1;
  if (count) *count = at->strings.size();
  if (index < at->strings.size()) {
    if (data) *data = at->strings[index].c_str();
    if (size) *size = at->strings[index].size();
  }
  return 1;
}

int host_buffer_append(kiln_buffer* b, const void* data, size_t size) {
  if (!b || !b->bytes || (!data && size)) return KILN_FAIL;
  b->bytes->append(static_cast<const char*>(data), size);
  return KILN_OK;
}

const kiln_host_api kHostApi = {
    sizeof(kiln_host_api), KILN_PLUGIN_ABI_VERSION, KILN_VERSION,         host_set_error,      host_warn,
    host_node_name,        host_attr_int,           host_attr_float,      host_attr_string,    host_attr_ints,
    host_attr_floats,      host_num_inputs,         host_num_outputs,     host_input_dtype,    host_input_rank,
    host_input_dim,        host_input_constant,     host_set_output_type, host_set_output_dim, host_copy_input_dim,
    host_copy_input_type,  host_buffer_append,      host_num_attrs,       host_attr_name,      host_attr_type,
    host_attr_strings,
};

}  // namespace

namespace kiln {
const kiln_host_api* plugin_host_api() { return &kHostApi; }
}  // namespace kiln
