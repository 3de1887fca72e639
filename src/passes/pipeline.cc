// The pass pipeline, in order, with the reason for each placement.
#include <chrono>
#include <set>

#include "ir/rewrite.h"
#include "ops/shape_inference.h"
#include "passes/pass.h"

namespace kiln::passes {

const std::vector<PassInfo>& pipeline() {
  static const std::vector<PassInfo> kPasses = {
      // Before fold_constants, which would turn the weights' DequantizeLinear into float weights:
      // the Q/DQ pairs around convolutions, pools and the classifier become kiln's INT8 layers.
      {"fold_qdq_conv", fold_qdq_conv,
       "Q/DQ around Conv/Gemm/Add/pools -> kiln.QConv / kiln.QPool (INT8, channels-last)"},
      // Likewise before fold_constants; after fold_qdq_conv, which takes the Gemms whose output is quantized.
      {"fold_qdq_linear", fold_qdq_linear,
       "Q/DQ MatMul/Gemm with a constant int8 weight and a float output -> kiln.QMatMul (INT8)"},
      // First: turns Constant nodes and static shape computations into initializers, which every
      // later pattern relies on (it matches constants, not Constant nodes).
      {"fold_constants", fold_constants, "evaluate nodes whose inputs are known at build time"},
      // Before remove_noop_ops, which cancels the transposes it leaves against the model's own.
      {"lower_patchify_conv", lower_patchify_conv,
       "Conv with kernel == stride read as tokens (ViT/ConvNeXt/Swin patch embedding) -> patches x MatMul"},
      {"remove_noop_ops", remove_noop_ops,
       "drop Identity/Dropout/zero Pad/no-op Cast/Reshape/Transpose, merge Reshape and Transpose pairs"},
      // After remove_noop_ops, which would merge a Transpose it is given with the model's own.
      {"fuse_channel_shuffle", fuse_channel_shuffle_for,
       "[Concat ->] Reshape -> Transpose -> Reshape [-> Split / Slices] channel shuffle -> kiln.ChannelShuffle"},
      // After remove_noop_ops (all-zero Pads are gone) and before fold_batch_norm / fuse_activation,
      // which turn Conv into kiln.FusedConv: both match the plain ONNX Conv / AveragePool.
      {"fold_pad_into_window", fold_pad_into_window,
       "zero constant Pad -> the pads of the Conv / AveragePool reading it"},
      // After fold_pad_into_window (its pads count) and with shapes static (the builder pins the dims
      // every profile fixes): which taps read only padding depends on the input size.
      {"prune_padding_taps", prune_padding_taps,
       "Conv taps that only ever read padding (dilation >= input size) -> a smaller kernel"},
      {"eliminate_common_subexpressions", eliminate_common_subexpressions, "merge nodes computing the same values"},
      // On the plain ONNX quantization ops (after constant folding, so the scales are initializers),
      // before the fusions below take the Add / Mul pieces of its pattern.
      {"fold_qdq_matmul", fold_qdq_matmul,
       "DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(scale) -> Add(bias) -> kiln.DynQMatMul; "
       "Q(MatMul(DQ(x), DQ(W))) -> QLinearMatMul (INT8)"},
      // After the Q/DQ folding passes, which read the weights' DequantizeLinear nodes.
      {"fold_weight_dequantize", fold_weight_dequantize,
       "DequantizeLinear of a constant weight no INT8 pattern took -> a float initializer (any size)"},
      // On plain ONNX Conv and AveragePool, before fold_batch_norm / fuse_activation make FusedConvs.
      {"pool_before_pointwise_conv", pool_before_pointwise_conv,
       "1x1 Conv -> unpadded AveragePool -> the pool first (the conv on k*k times fewer pixels)"},
      // Before activation fusion: Conv -> BatchNorm -> Relu must become Conv -> Relu first.
      {"fold_batch_norm", fold_batch_norm, "fold BatchNormalization into Conv/Gemm weights, or lower it to Mul+Add"},
      // The pattern fusions below all match plain ONNX elementwise ops, so they come before
      // fuse_elementwise, which would otherwise swallow their pieces. Among them:
      // GELU first: it makes kiln.Gelu, which fuse_activation then folds into a linear layer.
      {"fuse_gelu", fuse_gelu, "GELU written with Erf or Tanh -> kiln.Gelu"},
      // Likewise HardSwish / HardSigmoid written out (opset < 14 exports): fuse_activation then
      // folds them into the conv before them.
      {"fuse_hard_activations", fuse_hard_activations,
       "x * HardSigmoid(x), x * Clip(x + 3, 0, 6) / 6, Clip(x + 3, 0, 6) / 6 -> HardSwish / HardSigmoid"},
      {"fuse_layer_norm", fuse_layer_norm, "decomposed layer normalization -> kiln.LayerNormalization"},
      // Before fuse_matmul_bias: an additive mask after Q K^T would otherwise look like a bias.
      {"fuse_attention", fuse_attention_for, "MatMul-scale-mask-Softmax-MatMul -> kiln.Attention"},
      {"fuse_matmul_bias", fuse_matmul_bias, "MatMul + constant bias -> kiln.FusedMatMul"},
      // After fuse_matmul_bias (a layer's bias is in place before its residual and activation).
      {"fuse_activation", fuse_activation,
       "Conv/Gemm/MatMul + residual Add + activation (Relu, Clip, Sigmoid, SiLU, GELU, ...) -> kiln.Fused*"},
      // After fuse_gelu (kiln.Gelu) and before fuse_elementwise (which would take the residual Add).
      {"fold_qdq_matmul_epilogue", fold_qdq_matmul_epilogue,
       "kiln.DynQMatMul + residual Add + Relu/GELU -> its epilogue"},
      // After fuse_activation, so only siblings with the same activation merge and none loses its own.
      {"fuse_horizontal_matmul", fuse_horizontal_matmul,
       "sibling MatMuls on one input with constant weights (Q/K/V) -> one MatMul + Split"},
      // After fuse_horizontal_matmul: the merged Q/K/V projection's Split is part of its pattern.
      {"fuse_attention_heads", fuse_attention_heads,
       "Attention between head split/merge Reshape+Transpose -> kiln.MultiHeadAttention (reads heads in place)"},
      // Last of the fusions: whatever elementwise chains the patterns above left.
      {"fuse_elementwise", fuse_elementwise_for, "chains of elementwise ops -> kiln.FusedElementwise"},
      // After every fusion: it converts the fused convs (activation and residual in place) and
      // must see the final graph to know where blocked values escape to plain readers. Its block is
      // the target's (--layout-block; by default what the target's instruction set prefers).
      {"layout_blocked", layout_blocked,
       "keep conv/pool activations channel-blocked (nChw16c/nChw8c) between layers; reorders at the boundaries"},
      // The CUDA analogue (float16/bfloat16 builds): after every fusion, for the same reason.
      {"layout_nhwc", layout_nhwc,
       "CUDA fp16/bf16, CPU bf16 with AMX: keep conv/pool activations channels-last (NHWC) between layers; 1x1 "
       "convs -> MatMul"},
      // On the blocked convs the layout pass made.
      {"layout_fuse_conv_dw", layout_fuse_conv_dw,
       "blocked 1x1 conv -> depthwise 3x3 conv -> kiln.BlockedConvDw (the wide intermediate stays in cache)"},
      // On the blocked Concats and the per-channel elementwise nodes the layout pass kept blocked.
      {"layout_fuse_concat_elementwise", layout_fuse_concat_elementwise,
       "blocked Concat -> per-channel elementwise (DenseNet's BN + ReLU) -> one layer (no concatenated copy)"},
      // Last: rewrites leave orphans behind.
      {"remove_dead_nodes", remove_dead_nodes, "drop nodes and initializers nothing reads"},
  };
  return kPasses;
}

namespace {
// Re-derives types after a rewrite; stale entries of removed values go, declared outputs stay. On a
// body this infers the body alone (outer values through its parents' types), with the types its
// control-flow node gave its inputs; the enclosing graph's refresh re-infers it in place later.
Status refresh(ir::Graph& g) {
  std::unordered_map<std::string, ir::TypeInfo> keep;
  for (const auto& in : g.inputs) keep[in.name] = in.type;
  g.value_types = std::move(keep);
  KILN_RETURN_IF_ERROR(g.topological_sort());
  return ops::infer_shapes(g);
}

// The bodies the pipeline optimizes: the subgraphs of ONNX nodes (If branches, Loop and Scan bodies).
// kiln's fused ops keep theirs private (the fused op's kernel runs it as it is).
std::vector<ir::Graph*> bodies_of(ir::Graph& g) {
  std::vector<ir::Graph*> out;
  for (auto& n : g.nodes) {
    if (n.domain == "kiln") continue;
    for (auto& [k, a] : n.attrs) {
      if (a.g) out.push_back(a.g.get());
      for (auto& sg : a.graphs) out.push_back(sg.get());
    }
  }
  return out;
}

Status run_pipeline(ir::Graph& g, const Target& target, const std::set<std::string>& disabled,
                    std::vector<PassStat>& stats, const std::string& where) {
  const auto& passes = pipeline();
  for (size_t k = 0; k < passes.size(); ++k) {
    const PassInfo& p = passes[k];
    if (disabled.count(p.name)) continue;
    // Every fusion decides per target itself: fuse_attention_for and fuse_elementwise_for fuse, for a
    // CUDA target, only what its tactics take (the others keep the plain ops its kernels run).
    auto t0 = std::chrono::steady_clock::now();
    auto r = p.run(g, target);
    if (!r.ok()) return r.status().with_context(std::string("pass ") + p.name + where + ": ");
    stats[k].changed += r.value();
    if (r.value()) {
      Status s = refresh(g);
      if (!s.ok())
        return s.with_context(std::string("after pass ") + p.name + where + " the graph is invalid (a kiln bug): ");
    }
    stats[k].ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  return Status::Ok();
}

// Optimizes the bodies of `g` (already optimized), each like a graph of its own, then theirs. A body
// keeps its inputs, outputs and the names it reads from enclosing graphs (the passes keep graph inputs
// and outputs by name, and only read outer values); outer constants it reads are copied into it first,
// so folding and fusion see them (fold_batch_norm folds an outer weight into a new body initializer),
// and the copies nothing rewrote are dropped again afterwards (the body reads the outer one, as before).
Status optimize_bodies(ir::Graph& g, const Target& target, const std::set<std::string>& disabled,
                       std::vector<PassStat>& stats) {
  for (ir::Graph* body : bodies_of(g)) {
    const auto types = body->value_types;
    const auto initializers = body->initializers;
    std::map<std::string, const Tensor*> lifted;
    for (const auto& name : body->outer_references()) {
      const Tensor* t = ir::outer_constant(*body, name);
      if (!t || body->initializers.count(name)) continue;
      body->initializers[name] = *t;
      lifted[name] = t;
    }
    const std::string where = " (in subgraph '" + body->name + "')";
    if (!refresh(*body).ok()) {
      // Not valid on its own at these shapes: an If branch that a condition known at build time never
      // takes (only the taken one is inferred with the graph). Left as it is.
      body->value_types = types;
      body->initializers = initializers;
      continue;
    }
    KILN_RETURN_IF_ERROR(run_pipeline(*body, target, disabled, stats, where));
    bool dropped = false;
    for (const auto& [name, t] : lifted) {
      auto it = body->initializers.find(name);
      if (it != body->initializers.end() && it->second.raw() == t->raw() && it->second.shape() == t->shape() &&
          it->second.dtype() == t->dtype()) {
        body->initializers.erase(it);
        dropped = true;
      }
    }
    if (dropped) KILN_RETURN_IF_ERROR(refresh(*body).with_context("subgraph '" + body->name + "' after the passes: "));
    KILN_RETURN_IF_ERROR(optimize_bodies(*body, target, disabled, stats));
  }
  return Status::Ok();
}

// Bodies no longer read some outer values (a folded weight, a Constant folded inside): what only they
// read is dead now. Innermost first, since a parent's values die with its bodies' reads.
Result<int> remove_dead_in_all(ir::Graph& g) {
  int removed = 0;
  for (ir::Graph* body : bodies_of(g)) {
    KILN_ASSIGN_OR_RETURN(int r, remove_dead_in_all(*body));
    removed += r;
  }
  KILN_ASSIGN_OR_RETURN(int r, remove_dead_nodes(g));
  return removed + r;
}

bool has_bodies(ir::Graph& g) { return !bodies_of(g).empty(); }
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
  for (const auto& p : pipeline()) stats.push_back({p.name, 0, 0});
  ir::Graph& g = *model.graph;
  KILN_RETURN_IF_ERROR(run_pipeline(g, target, disabled, stats, ""));
  if (has_bodies(g)) {
    // The main graph first (its rewrites keep every value a body reads), then every body under it.
    KILN_RETURN_IF_ERROR(optimize_bodies(g, target, disabled, stats));
    if (!disabled.count("remove_dead_nodes")) {
      KILN_ASSIGN_OR_RETURN(int removed, remove_dead_in_all(g));
      for (auto& s : stats)
        if (s.name == "remove_dead_nodes") s.changed += removed;
    }
    // The whole model re-inferred: the control-flow nodes see their optimized bodies.
    Status s = refresh(g);
    if (!s.ok()) return s.with_context("after optimizing the subgraphs the graph is invalid (a kiln bug): ");
  }
  return stats;
}

}  // namespace kiln::passes
