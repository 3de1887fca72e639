// fuse_matmul_bias: MatMul(A, B) -> Add(bias) becomes kiln.FusedMatMul(A, B, bias), the
// Gemm-style "linear layer" (torch exports nn.Linear on inputs of rank > 2 this way).
//
// Preconditions: the MatMul's output has no other reader; the bias is a constant whose only
// non-1 dim is the last one and equals N (the MatMul output's last dim, known), so it broadcasts
// along the last dim only and never broadcasts the product up (its rank is at most the output's);
// it is stored as a 1-D [N] tensor. Exact: the fused node runs the same MatMul and Add.
// Leaves alone: non-constant biases (residual connections: fuse_activation takes those),
// per-row or full-shape constants, and an Add whose output shape differs from the MatMul's.
#include "passes/fusion_util.h"

namespace kiln::passes {

namespace {

using fusion::is_onnx;

bool try_matmul_bias(ir::Graph& g, const ir::UseIndex& uses, int ai) {
  const ir::Node& add = g.nodes[static_cast<size_t>(ai)];
  if (!is_onnx(add, "Add") || add.inputs.size() != 2) return false;
  for (size_t k = 0; k < 2; ++k) {
    const std::string& y = add.inputs[k];
    const std::string& b = add.inputs[1 - k];
    int mi = uses.producer(y);
    if (mi < 0 || !uses.single_use(y)) continue;
    const ir::Node& mm = g.nodes[static_cast<size_t>(mi)];
    if (!is_onnx(mm, "MatMul") || mm.inputs.size() != 2 || mm.outputs.size() != 1) continue;
    const Tensor* bias = ir::constant_value(g, b);
    const ir::TypeInfo* yt = fusion::type_of(g, y);
    if (!bias || !yt || !yt->shape.rank_known || yt->shape.rank() == 0 || bias->dtype() != yt->elem) continue;
    const Dim& n = yt->shape.dims.back();
    if (!n.known() || bias->numel() != n.value || bias->rank() > static_cast<int64_t>(yt->shape.rank())) continue;
    bool last_only = bias->rank() >= 1;
    for (int64_t i = 0; i + 1 < bias->rank(); ++i) last_only &= bias->dim(i) == 1;
    if (!last_only || !fusion::same_type(g, add.outputs[0], y)) continue;
    std::string bname = b;
    if (bias->rank() != 1) bname = fusion::add_initializer(g, b + "_1d", bias->reshaped({n.value}));
    ir::Node f = fusion::kiln_node("FusedMatMul", mm.name);
    f.inputs = {mm.inputs[0], mm.inputs[1], bname};
    f.outputs = {add.outputs[0]};
    fusion::replace_group(g, {mi, ai}, std::move(f));
    return true;
  }
  return false;
}

}  // namespace

Result<int> fuse_matmul_bias(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_matmul_bias); }

}  // namespace kiln::passes
