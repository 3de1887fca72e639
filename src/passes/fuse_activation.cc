// fuse_activation: folds the epilogue of a linear layer into it.
//
// Linear layers: Conv, Gemm (opset >= 7), MatMul and the kiln.FusedConv / FusedGemm /
// FusedMatMul already made (e.g. by fuse_matmul_bias), as long as they have no activation yet.
// Each becomes (or stays) the kiln.Fused* node and gains:
//   - a residual: Add(y, r) with y the layer's output -> input 3 (Residual), for a layer with no
//     residual yet, when r and the Add's output have y's type (no broadcast either way: every
//     tactic reads the residual as an output-shaped tensor, so a broadcast one, e.g. Swin's
//     relative position bias once shapes are static, would leave the layer on its reference kernel);
//   - an activation read from y: an op declaring ops::trait::kEpilogue (Relu, LeakyRelu, Sigmoid,
//     Tanh, HardSwish, HardSigmoid, Clip with constant scalar bounds (or the opset < 11 attributes), Gelu (ONNX,
//     or kiln.Gelu from fuse_gelu)), and SiLU written as Mul(y, Sigmoid(y)).
// So Conv -> Add(identity) -> Relu (a ResNet block's end) becomes one FusedConv. The order is the
// unfused one: bias, + residual, activation; the fused reference runs the same ONNX kernels.
//
// Preconditions: y has no other reader (for SiLU: exactly the Sigmoid and the Mul) and is not a
// graph output; Clip bounds must be exact in a float attribute. Leaves alone: activations after
// other ops, a second activation on an already activated layer, Add(y, y), bounds given as
// non-constant inputs, and Gemm at opset < 7 (legacy broadcast attribute).
#include "ops/op_traits.h"
#include "passes/fusion_util.h"

namespace kiln::passes {

namespace {

using fusion::is_kiln;
using fusion::is_onnx;

// The kiln.Fused* form of a linear layer without activation, or false.
bool as_fused(const ir::Node& p, ir::Node* out) {
  if (p.attr("activation") || p.outputs.size() != 1) return false;
  if (is_kiln(p, "FusedConv") || is_kiln(p, "FusedGemm") || is_kiln(p, "FusedMatMul")) {
    *out = p;
    return true;
  }
  const char* op = nullptr;
  if (is_onnx(p, "Conv") && p.inputs.size() >= 2 && p.inputs.size() <= 3)
    op = "FusedConv";
  else if (is_onnx(p, "Gemm") && p.opset >= 7 && p.inputs.size() >= 2 && p.inputs.size() <= 3)
    op = "FusedGemm";
  else if (is_onnx(p, "MatMul") && p.inputs.size() == 2)
    op = "FusedMatMul";
  if (!op) return false;
  ir::Node f = fusion::kiln_node(op, p.name);
  f.inputs = p.inputs;
  f.outputs = p.outputs;
  f.attrs = p.attrs;
  *out = std::move(f);
  return true;
}

bool has_residual(const ir::Node& f) { return f.has_input(3); }

// Sets the activation attributes of `f` for activation node `a`; false if `a` is none we fuse.
bool set_activation(const ir::Graph& g, const ir::Node& a, ir::Node* f) {
  if (a.inputs.empty() || a.outputs.size() != 1 || !ops::has_trait(a, ops::trait::kEpilogue)) return false;
  if (is_onnx(a, "HardSigmoid") && a.inputs.size() == 1) {
    fusion::set_string(*f, "activation", "HardSigmoid");
    fusion::set_float(*f, "activation_alpha", a.attr_float("alpha", 0.2f));
    fusion::set_float(*f, "activation_beta", a.attr_float("beta", 0.5f));
    return true;
  }
  if (is_onnx(a, "LeakyRelu") && a.inputs.size() == 1) {
    fusion::set_string(*f, "activation", "LeakyRelu");
    fusion::set_float(*f, "activation_alpha", a.attr_float("alpha", 0.01f));
    return true;
  }
  if ((is_onnx(a, "Gelu") || is_kiln(a, "Gelu")) && a.inputs.size() == 1) {
    std::string approx = a.attr_string("approximate", "none");
    if (approx != "none" && approx != "tanh") return false;
    fusion::set_string(*f, "activation", "Gelu");
    fusion::set_string(*f, "activation_approximate", approx);
    return true;
  }
  if (is_onnx(a, "Clip")) {
    double bound[2];
    bool has[2] = {false, false};
    for (int k = 0; k < 2; ++k) {
      const char* name = k == 0 ? "min" : "max";
      if (a.opset < 11) {
        if (a.inputs.size() != 1) return false;
        if (a.attr(name)) {
          has[k] = true;
          bound[k] = a.attr_float(name, 0);
        }
      } else if (a.has_input(static_cast<size_t>(k + 1))) {
        if (!ir::constant_scalar(g, a.inputs[static_cast<size_t>(k + 1)], &bound[k]) || !fusion::fits_float(bound[k]))
          return false;
        has[k] = true;
      }
    }
    if (a.opset < 11) {  // the bounds default to float's finite range there
      for (int k = 0; k < 2; ++k)
        if (!has[k]) {
          has[k] = true;
          bound[k] = (k == 0 ? -1.0 : 1.0) * std::numeric_limits<float>::max();
        }
    }
    fusion::set_string(*f, "activation", "Clip");
    if (has[0]) fusion::set_float(*f, "activation_min", static_cast<float>(bound[0]));
    if (has[1]) fusion::set_float(*f, "activation_max", static_cast<float>(bound[1]));
    return true;
  }
  if (!a.domain.empty() || a.inputs.size() != 1) return false;
  fusion::set_string(*f, "activation", a.op_type);  // one without parameters (Relu, Sigmoid, Tanh, ...)
  return true;
}

bool try_activation(ir::Graph& g, const ir::UseIndex& uses, int ai) {
  auto node = [&](int i) -> const ir::Node& { return g.nodes[static_cast<size_t>(i)]; };
  const ir::Node& a = node(ai);
  if (a.inputs.empty() || a.outputs.size() != 1) return false;
  // Residual: Add(y, r) after a linear layer without residual.
  if (is_onnx(a, "Add") && a.inputs.size() == 2 && a.inputs[0] != a.inputs[1]) {
    for (size_t k = 0; k < 2; ++k) {
      const std::string& y = a.inputs[k];
      int p = uses.producer(y);
      ir::Node f;
      if (p < 0 || !uses.single_use(y) || !as_fused(node(p), &f) || has_residual(f) ||
          !fusion::same_type(g, a.outputs[0], y) || !fusion::same_type(g, a.inputs[1 - k], y))
        continue;
      f.inputs.resize(4);
      f.inputs[3] = a.inputs[1 - k];
      f.outputs = a.outputs;
      fusion::replace_group(g, {p, ai}, std::move(f));
      return true;
    }
    return false;
  }
  const std::string& y = a.inputs[0];
  int p = uses.producer(y);
  ir::Node f;
  if (p < 0 || uses.is_graph_output(y) || !as_fused(node(p), &f)) return false;
  // SiLU: Mul(y, Sigmoid(y)), y read by exactly these two.
  if (is_onnx(a, "Sigmoid") && a.inputs.size() == 1 && uses.consumers(y).size() == 2) {
    int mi = fusion::sole_consumer(uses, a.outputs[0]);
    if (mi < 0 || !is_onnx(node(mi), "Mul") || fusion::other_input(node(mi), a.outputs[0]) != y) return false;
    const auto& c = uses.consumers(y);
    if (!((c[0] == ai && c[1] == mi) || (c[0] == mi && c[1] == ai))) return false;
    fusion::set_string(f, "activation", "SiLU");
    f.outputs = node(mi).outputs;
    fusion::replace_group(g, {p, ai, mi}, std::move(f));
    return true;
  }
  if (!uses.single_use(y) || !set_activation(g, a, &f)) return false;
  f.outputs = a.outputs;
  fusion::replace_group(g, {p, ai}, std::move(f));
  return true;
}

}  // namespace

Result<int> fuse_activation(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_activation); }

}  // namespace kiln::passes
