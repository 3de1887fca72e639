// fold_qdq_matmul: ONNX Runtime's dynamic quantization of a linear layer (quantize_dynamic) becomes
// one INT8 layer, kiln.DynQMatMul (src/ops/dyn_quant_matmul.cc):
//
//   (q, s, z) = DynamicQuantizeLinear(X)
//   y = Add(Mul(Cast<float>(MatMulInteger(q, B, z, b_zp?)), Mul(s, w_scale)), bias)   (the Add optional)
//   -> y = kiln.DynQMatMul(X, B, b_zp, w_scale, bias)
//
// The scale may also be s itself (w_scale 1: Mul(s, 1) is s exactly). Preconditions: the
// MatMulInteger reads the quantizer's q and z (its own zero point, not another's), B is a 2-D
// constant and b_zp (if any) a constant scalar or [N]; w_scale a float32 constant, a scalar or [N];
// the bias a float32 constant [N] (its only non-1 dim the last); the integer product, the Cast and the
// float Mul have no other readers. Exact: the fused node's reference runs the same ONNX kernels in the
// same order. The quantizer and the scale Mul stay for their other readers (dead code removal drops
// them otherwise: several layers reading one quantized X each quantize it again, which costs one pass
// over X). Leaves alone: MatMulInteger with other operands (activation x activation, run-time
// weights), which stays an ONNX MatMulInteger.
//
// fold_qdq_matmul_epilogue (after fuse_gelu and fuse_activation, before fuse_elementwise): a residual
// Add(y, r) of y's type and then a Relu or GELU (ONNX Gelu or kiln.Gelu, erf or tanh form) reading a
// DynQMatMul's y alone become its Residual input and activation, in that order (the reference's).
#include "passes/fusion_util.h"

namespace kiln::passes {

namespace {

using fusion::is_kiln;
using fusion::is_onnx;

bool is_float_constant_vector(const Tensor* t, int64_t n) {
  if (!t || t->dtype() != DataType::kFloat32) return false;
  if (t->numel() == 1) return t->rank() <= 1;
  return t->rank() == 1 && t->numel() == n;
}

bool try_fold(ir::Graph& g, const ir::UseIndex& uses, int mi) {
  auto node = [&](int i) -> const ir::Node& { return g.nodes[static_cast<size_t>(i)]; };
  const ir::Node& mm = node(mi);
  if (!is_onnx(mm, "MatMulInteger") || mm.inputs.size() < 3 || mm.outputs.size() != 1) return false;
  int di = uses.producer(mm.inputs[0]);
  if (di < 0 || !is_onnx(node(di), "DynamicQuantizeLinear")) return false;
  const ir::Node& dq = node(di);
  if (dq.outputs.size() != 3 || dq.outputs[0] != mm.inputs[0] || dq.outputs[2] != mm.inputs[2]) return false;
  const Tensor* b = ir::constant_value(g, mm.inputs[1]);
  if (!b || b->rank() != 2 || (b->dtype() != DataType::kInt8 && b->dtype() != DataType::kUInt8)) return false;
  const int64_t n = b->dim(1);
  std::string bzp = mm.has_input(3) ? mm.inputs[3] : "";
  if (!bzp.empty()) {
    const Tensor* z = ir::constant_value(g, bzp);
    if (!z || z->dtype() != b->dtype() || !(z->numel() == 1 || (z->rank() == 1 && z->numel() == n))) return false;
  }
  // Cast<float> -> Mul(scale)
  int ci = fusion::sole_consumer(uses, mm.outputs[0]);
  if (ci < 0 || !is_onnx(node(ci), "Cast") || node(ci).attr_int("to", 0) != 1) return false;
  const std::string& accf = node(ci).outputs[0];
  int ui = fusion::sole_consumer(uses, accf);
  if (ui < 0 || !is_onnx(node(ui), "Mul")) return false;
  const std::string s = fusion::other_input(node(ui), accf);
  if (s.empty()) return false;
  std::string w_scale;
  if (s == dq.outputs[1]) {
    w_scale = fusion::add_initializer(g, mm.name + "_w_scale", Tensor::scalar<float>(DataType::kFloat32, 1.0f));
  } else {
    int si = uses.producer(s);
    if (si < 0 || !is_onnx(node(si), "Mul")) return false;
    const std::string c = fusion::other_input(node(si), dq.outputs[1]);
    if (c.empty() || !is_float_constant_vector(ir::constant_value(g, c), n)) return false;
    w_scale = c;
  }
  std::set<int> group = {mi, ci, ui};
  std::string out = node(ui).outputs[0];
  std::string bias;
  // + bias
  int ai = fusion::sole_consumer(uses, out);
  if (ai >= 0 && is_onnx(node(ai), "Add")) {
    const std::string c = fusion::other_input(node(ai), out);
    const Tensor* t = c.empty() ? nullptr : ir::constant_value(g, c);
    const ir::TypeInfo* yt = fusion::type_of(g, out);
    bool last_only = t && t->dtype() == DataType::kFloat32 && t->numel() == n && t->rank() >= 1 && yt &&
                     yt->shape.rank_known && static_cast<size_t>(t->rank()) <= yt->shape.rank();
    for (int64_t i = 0; last_only && i + 1 < t->rank(); ++i) last_only = t->dim(i) == 1;
    if (last_only && fusion::same_type(g, node(ai).outputs[0], out)) {
      bias = t->rank() == 1 ? c : fusion::add_initializer(g, c + "_1d", t->reshaped({n}));
      out = node(ai).outputs[0];
      group.insert(ai);
    }
  }
  ir::Node f = fusion::kiln_node("DynQMatMul", mm.name);
  f.inputs = {dq.inputs[0], mm.inputs[1], bzp, w_scale, bias};
  f.outputs = {out};
  fusion::replace_group(g, group, std::move(f));
  return true;
}

bool try_epilogue(ir::Graph& g, const ir::UseIndex& uses, int ai) {
  auto node = [&](int i) -> const ir::Node& { return g.nodes[static_cast<size_t>(i)]; };
  const ir::Node& a = node(ai);
  if (a.inputs.empty() || a.outputs.size() != 1) return false;
  auto layer_of = [&](const std::string& y) -> int {
    int p = uses.producer(y);
    if (p < 0 || !is_kiln(node(p), "DynQMatMul") || node(p).attr("activation") || !uses.single_use(y) ||
        uses.is_graph_output(y))
      return -1;
    return p;
  };
  if (is_onnx(a, "Add") && a.inputs.size() == 2 && a.inputs[0] != a.inputs[1]) {
    for (size_t k = 0; k < 2; ++k) {
      const std::string& y = a.inputs[k];
      int p = layer_of(y);
      if (p < 0 || node(p).has_input(5) || !fusion::same_type(g, a.outputs[0], y) ||
          !fusion::same_type(g, a.inputs[1 - k], y))
        continue;
      ir::Node f = node(p);
      f.inputs.resize(6);
      f.inputs[5] = a.inputs[1 - k];
      f.outputs = a.outputs;
      fusion::replace_group(g, {p, ai}, std::move(f));
      return true;
    }
    return false;
  }
  if (a.inputs.size() != 1) return false;
  int p = layer_of(a.inputs[0]);
  if (p < 0) return false;
  ir::Node f = node(p);
  if (is_onnx(a, "Relu")) {
    fusion::set_string(f, "activation", "Relu");
  } else if (is_onnx(a, "Gelu") || is_kiln(a, "Gelu")) {
    std::string approx = a.attr_string("approximate", "none");
    if (approx != "none" && approx != "tanh") return false;
    fusion::set_string(f, "activation", "Gelu");
    fusion::set_string(f, "activation_approximate", approx);
  } else {
    return false;
  }
  f.outputs = a.outputs;
  fusion::replace_group(g, {p, ai}, std::move(f));
  return true;
}

}  // namespace

Result<int> fold_qdq_matmul(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_fold); }

Result<int> fold_qdq_matmul_epilogue(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_epilogue); }

}  // namespace kiln::passes
