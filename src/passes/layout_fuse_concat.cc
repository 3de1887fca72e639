// layout_fuse_concat_elementwise: a Concat of channel-blocked values whose only reader is a
// kiln.FusedElementwise by per-channel or scalar operands becomes one kiln.BlockedConcatElementwise,
// which runs the elementwise program on each concatenated input in place: the concatenation is never
// written out and read back. DenseNet concatenates every earlier feature map of a block before each
// layer's BatchNormalization + ReLU (lowered to Mul, Add, Relu and fused): each copy goes.
//
// Matches (after layout_blocked): a Concat along axis 1 of 5-D blocked float32 values (the layout
// pass's blocked Concat: every input whole channel blocks), whose output is no graph output and is
// read once, by a kiln.FusedElementwise of the same shape whose other inputs are one value each or
// per-channel blocked constants ([1, Cb, 1, 1, B], as layout_blocked makes them). The fused node
// takes the Concat's inputs first (attribute pieces), then the elementwise node's other inputs, its
// body (with the concatenation moved to body input 0), name, outputs and the provenance of both.
// Its reference kernel concatenates and runs the body, so it computes what the pair did.
// Leaves alone: Concats with other readers, elementwise nodes with operands of other shapes.
#include "passes/fusion_util.h"

namespace kiln::passes {

namespace {

using fusion::is_kiln;
using fusion::is_onnx;

bool is_blocked_f32(const ir::TypeInfo* t) {
  return t && t->elem == DataType::kFloat32 && t->shape.rank_known && t->shape.rank() == 5 &&
         t->shape.dims[1].known() && t->shape.dims[4].known();
}

bool is_blocked_concat(const ir::Graph& g, const ir::Node& n) {
  if (!is_onnx(n, "Concat") || n.outputs.size() != 1 || n.outputs[0].empty() || n.inputs.empty()) return false;
  const int64_t axis = n.attr_int("axis", 0);
  if (axis != 1 && axis != -4) return false;
  for (const auto& in : n.inputs)
    if (in.empty() || !is_blocked_f32(fusion::type_of(g, in))) return false;
  return is_blocked_f32(fusion::type_of(g, n.outputs[0]));
}

// An operand the fused kernel takes: one value, or [1, Cb, 1, 1, B] of the output's blocks.
bool per_channel_or_scalar(const ir::Graph& g, const std::string& v, const SymShape& out) {
  const Tensor* t = ir::constant_value(g, v);
  if (!t || t->dtype() != DataType::kFloat32) return false;
  if (t->numel() == 1) return true;
  return t->rank() == 5 && t->dim(0) == 1 && t->dim(1) == out.dims[1].value && t->dim(2) == 1 && t->dim(3) == 1 &&
         t->dim(4) == out.dims[4].value;
}

bool try_fuse(ir::Graph& g, const ir::UseIndex& uses, int ci) {
  const ir::Node& cat = g.nodes[static_cast<size_t>(ci)];
  if (!is_blocked_concat(g, cat) || !uses.single_use(cat.outputs[0])) return false;
  const int ei = uses.consumers(cat.outputs[0])[0];
  const ir::Node& e = g.nodes[static_cast<size_t>(ei)];
  const ir::Attribute* body_attr = e.attr("body");
  if (!is_kiln(e, "FusedElementwise") || e.outputs.size() != 1 || !body_attr || !body_attr->g) return false;
  const ir::TypeInfo* y = fusion::type_of(g, e.outputs[0]);
  const ir::TypeInfo* c = fusion::type_of(g, cat.outputs[0]);
  if (!y || !fusion::same_type(g, e.outputs[0], cat.outputs[0])) return false;
  size_t at = 0;
  for (size_t j = 0; j < e.inputs.size(); ++j) {
    if (e.inputs[j] == cat.outputs[0]) {
      at = j;
    } else if (!per_channel_or_scalar(g, e.inputs[j], c->shape)) {
      return false;
    }
  }
  if (body_attr->g->inputs.size() != e.inputs.size()) return false;
  ir::Node f = fusion::kiln_node("BlockedConcatElementwise", e.name);
  for (const auto& [k, v] : e.attrs)
    if (k != "kiln.sources") f.attrs[k] = v;
  // The concatenation becomes body input 0 (the kernel's order: pieces, then the operands).
  auto body = std::make_shared<ir::Graph>(*body_attr->g);
  std::rotate(body->inputs.begin(), body->inputs.begin() + static_cast<int64_t>(at),
              body->inputs.begin() + static_cast<int64_t>(at) + 1);
  f.attrs["body"].g = body;
  fusion::set_int(f, "block", c->shape.dims[4].value);
  fusion::set_int(f, "pieces", static_cast<int64_t>(cat.inputs.size()));
  f.inputs = cat.inputs;
  for (size_t j = 0; j < e.inputs.size(); ++j)
    if (j != at) f.inputs.push_back(e.inputs[j]);
  f.outputs = e.outputs;
  fusion::replace_group(g, {ci, ei}, std::move(f));
  return true;
}

}  // namespace

Result<int> layout_fuse_concat_elementwise(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_fuse); }

}  // namespace kiln::passes
