// Graph passes: each matches a pattern, rewrites the graph in place, and returns how many sites it
// changed. A pass that cannot prove a rewrite exact (up to float rounding) leaves the graph alone.
// The order lives in pipeline.cc. A pass whose rewrite depends on what the engine is built for (the
// layout's block, later the precision or the device) takes the build's Target (core/target.h) and
// reads nothing of the build machine or the environment.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/target.h"
#include "ir/graph.h"

namespace kiln::passes {

using PassFn = Result<int> (*)(ir::Graph& g);
using TargetPassFn = Result<int> (*)(ir::Graph& g, const Target& target);

struct PassInfo {
  PassInfo(const char* name, PassFn run, const char* description) : name(name), description(description), plain_(run) {}
  PassInfo(const char* name, TargetPassFn run, const char* description)
      : name(name), description(description), targeted_(run) {}
  Result<int> run(ir::Graph& g, const Target& target) const { return targeted_ ? targeted_(g, target) : plain_(g); }

  const char* name;         // stable, used by --disable-pass and reports
  const char* description;  // one line for `kiln inspect --passes`

 private:
  PassFn plain_ = nullptr;
  TargetPassFn targeted_ = nullptr;
};

struct PassStat {
  std::string name;
  int changed = 0;
  double ms = 0;
};

// The ordered pass list (see pipeline.cc for why each sits where it does).
const std::vector<PassInfo>& pipeline();

// Runs the pipeline on the model's main graph for `target`. After every pass that changed something
// the graph is re-sorted and its types re-inferred (that is also the verifier: a broken rewrite fails
// here, naming the pass). Unknown names in `disabled` are an error listing the valid ones.
Result<std::vector<PassStat>> optimize(ir::Model& model, const std::set<std::string>& disabled, const Target& target);

// Individual passes (one per file).
Result<int> fold_constants(ir::Graph& g);
Result<int> remove_dead_nodes(ir::Graph& g);
Result<int> eliminate_common_subexpressions(ir::Graph& g);
Result<int> remove_noop_ops(ir::Graph& g);
Result<int> fold_pad_into_window(ir::Graph& g);  // in fold_pad.cc
Result<int> lower_patchify_conv(ir::Graph& g);
Result<int> prune_padding_taps(ir::Graph& g);
Result<int> pool_before_pointwise_conv(ir::Graph& g);
Result<int> fold_batch_norm(ir::Graph& g);
Result<int> fuse_gelu(ir::Graph& g);
Result<int> fuse_hard_activations(ir::Graph& g);
Result<int> fuse_layer_norm(ir::Graph& g);
Result<int> fuse_attention(ir::Graph& g);
// fuse_attention for `target`: on CUDA only the variants its attention tactic takes (fuse_attention.cc).
Result<int> fuse_attention_for(ir::Graph& g, const Target& target);
Result<int> fuse_attention_heads(ir::Graph& g);  // in fuse_attention.cc
Result<int> fuse_matmul_bias(ir::Graph& g);
Result<int> fuse_channel_shuffle(ir::Graph& g);
// fuse_channel_shuffle on CPU targets; others keep the ONNX ops (fuse_channel_shuffle.cc).
Result<int> fuse_channel_shuffle_for(ir::Graph& g, const Target& target);
Result<int> fuse_activation(ir::Graph& g);
Result<int> fuse_horizontal_matmul(ir::Graph& g);
Result<int> fuse_elementwise(ir::Graph& g);
// The pipeline's: every tree on a CPU target, on a CUDA one the trees its one-kernel tactic runs.
Result<int> fuse_elementwise_for(ir::Graph& g, const Target& target);
// The layout pass at the target's block (Target::layout_block; 0 or a non-CPU target: no change),
// islands of blocked nodes kept only where the reorders they need cost less than their convs gain;
// and with an explicit block (channels per block; <= 0: no change), every blockable conv blocked
// unless decide_by_cost (layout_blocked.cc says how the cost is counted).
Result<int> layout_blocked(ir::Graph& g, const Target& target);
Result<int> layout_blocked_with_block(ir::Graph& g, int64_t block, bool decide_by_cost = false);
Result<int> layout_fuse_conv_dw(ir::Graph& g);
// CUDA targets allowing float16/bfloat16: channels-last convs and pools (layout_nhwc.cc); the
// _always form rewrites whatever the target (tests).
Result<int> layout_nhwc(ir::Graph& g, const Target& target);
Result<int> layout_nhwc_always(ir::Graph& g);
Result<int> layout_fuse_concat_elementwise(ir::Graph& g);  // in layout_fuse_concat.cc
Result<int> fold_qdq_matmul(ir::Graph& g);
Result<int> fold_qdq_matmul_epilogue(ir::Graph& g);  // in fold_qdq_matmul.cc
Result<int> fold_qdq_linear(ir::Graph& g);           // in fold_qdq_matmul.cc
Result<int> fold_qdq_conv(ir::Graph& g);
Result<int> fold_weight_dequantize(ir::Graph& g);

}  // namespace kiln::passes
