// The pass pipeline, in order, with the reason for each placement.
#include <chrono>

#include "ops/shape_inference.h"
#include "passes/pass.h"

namespace kiln::passes {

const std::vector<PassInfo>& pipeline() {
  static const std::vector<PassInfo> kPasses = {
      // First: turns Constant nodes and static shape computations into initializers, which every
      // later pattern relies on (it matches constants, not Constant nodes).
      {"fold_constants", fold_constants, "evaluate nodes whose inputs are known at build time"},
      {"remove_noop_ops", remove_noop_ops,
       "drop Identity/Dropout/zero Pad/no-op Cast/Reshape/Transpose, merge Reshape and Transpose pairs"},
      // After remove_noop_ops (all-zero Pads are gone) and before fold_batch_norm / fuse_activation,
      // which turn Conv into kiln.FusedConv: both match the plain ONNX Conv / AveragePool.
      {"fold_pad_into_window", fold_pad_into_window,
       "zero constant Pad -> the pads of the Conv / AveragePool reading it"},
      // After fold_pad_into_window (its pads count) and with shapes static (the builder pins the dims
      // every profile fixes): which taps read only padding depends on the input size.
      {"prune_padding_taps", prune_padding_taps,
       "Conv taps that only ever read padding (dilation >= input size) -> a smaller kernel"},
      {"eliminate_common_subexpressions", eliminate_common_subexpressions, "merge nodes computing the same values"},
      // Before activation fusion: Conv -> BatchNorm -> Relu must become Conv -> Relu first.
      {"fold_batch_norm", fold_batch_norm, "fold BatchNormalization into Conv/Gemm weights, or lower it to Mul+Add"},
      // The pattern fusions below all match plain ONNX elementwise ops, so they come before
      // fuse_elementwise, which would otherwise swallow their pieces. Among them:
      // GELU first: it makes kiln.Gelu, which fuse_activation then folds into a linear layer.
      {"fuse_gelu", fuse_gelu, "GELU written with Erf or Tanh -> kiln.Gelu"},
      {"fuse_layer_norm", fuse_layer_norm, "decomposed layer normalization -> kiln.LayerNormalization"},
      // Before fuse_matmul_bias: an additive mask after Q K^T would otherwise look like a bias.
      {"fuse_attention", fuse_attention, "MatMul-scale-mask-Softmax-MatMul -> kiln.Attention"},
      {"fuse_matmul_bias", fuse_matmul_bias, "MatMul + constant bias -> kiln.FusedMatMul"},
      // After fuse_matmul_bias (a layer's bias is in place before its residual and activation).
      {"fuse_activation", fuse_activation,
       "Conv/Gemm/MatMul + residual Add + activation (Relu, Clip, Sigmoid, SiLU, GELU, ...) -> kiln.Fused*"},
      // After fuse_activation, so only siblings with the same activation merge and none loses its own.
      {"fuse_horizontal_matmul", fuse_horizontal_matmul,
       "sibling MatMuls on one input with constant weights (Q/K/V) -> one MatMul + Split"},
      // After fuse_horizontal_matmul: the merged Q/K/V projection's Split is part of its pattern.
      {"fuse_attention_heads", fuse_attention_heads,
       "Attention between head split/merge Reshape+Transpose -> kiln.MultiHeadAttention (reads heads in place)"},
      // Last of the fusions: whatever elementwise chains the patterns above left.
      {"fuse_elementwise", fuse_elementwise, "chains of elementwise ops -> kiln.FusedElementwise"},
      // After every fusion: it converts the fused convs (activation and residual in place) and
      // must see the final graph to know where blocked values escape to plain readers. Its block is
      // the target's (--layout-block; by default what the target's instruction set prefers).
      {"layout_blocked", layout_blocked,
       "keep conv/pool activations channel-blocked (nChw16c/nChw8c) between layers; reorders at the boundaries"},
      // On the blocked convs the layout pass made.
      {"layout_fuse_conv_dw", layout_fuse_conv_dw,
       "blocked 1x1 conv -> depthwise 3x3 conv -> kiln.BlockedConvDw (the wide intermediate stays in cache)"},
      // Last: rewrites leave orphans behind.
      {"remove_dead_nodes", remove_dead_nodes, "drop nodes and initializers nothing reads"},
  };
  return kPasses;
}

namespace {
// Re-derives types after a rewrite; stale entries of removed values go, declared outputs stay.
Status refresh(ir::Graph& g) {
  std::unordered_map<std::string, ir::TypeInfo> keep;
  for (const auto& in : g.inputs) keep[in.name] = in.type;
  g.value_types = std::move(keep);
  KILN_RETURN_IF_ERROR(g.topological_sort());
  return ops::infer_shapes(g);
}
}  // namespace

Result<std::vector<PassStat>> optimize(ir::Model& model, const std::set<std::string>& disabled, const Target& target) {
  for (const auto& d : disabled) {
    bool known = false;
    std::string names;
    for (const auto& p : pipeline()) {
      known |= d == p.name;
      names += std::string(names.empty() ? "" : ", ") + p.name;
    }
    if (!known) return InvalidArgument("unknown pass '", d, "' (passes: ", names, ")");
  }
  std::vector<PassStat> stats;
  ir::Graph& g = *model.graph;
  for (const auto& p : pipeline()) {
    PassStat st{p.name, 0, 0};
    if (!disabled.count(p.name)) {
      auto t0 = std::chrono::steady_clock::now();
      auto r = p.run(g, target);
      if (!r.ok()) return r.status().with_context(std::string("pass ") + p.name + ": ");
      st.changed = r.value();
      if (st.changed) {
        Status s = refresh(g);
        if (!s.ok())
          return s.with_context(std::string("after pass ") + p.name + " the graph is invalid (a kiln bug): ");
      }
      st.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    stats.push_back(st);
  }
  return stats;
}

}  // namespace kiln::passes
