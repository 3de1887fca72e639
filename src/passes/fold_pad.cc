// fold_pad_into_window: folds a constant-mode, zero-valued Pad of the spatial dims into the Conv or
// AveragePool that reads it, as the window's own pads. Exporters write these: inception_v3 pools with
// count_include_pad through `Pad(1,1) + AveragePool`, TF-style "SAME" models pad before their convs.
//
// Matches Pad (mode "constant", value absent or 0, constant non-negative pads, no `axes` input) whose
// only reader is a Conv or an AveragePool (plain ONNX, explicit pads: auto_pad NOTSET or absent) and
// whose pads on the batch and channel dims are 0. The window's pads become the sum.
//  - Conv: zero padding is what Conv pads with; exact.
//  - AveragePool (ceil_mode 0): the Pad's zeros are real elements the pool counts, so the result is
//    AveragePool with count_include_pad=1; exact when the pool already counted its own pads or had
//    none. A pool with pads and count_include_pad=0 would mix the two rules: left alone.
// MaxPool is left alone (its padding is -inf, not the Pad's 0), and so are negative pads (crops).
#include "ir/attribute_builders.h"
#include "ir/rewrite.h"
#include "passes/pass.h"

namespace kiln::passes {

namespace {

// The Pad's pads (begin..., end...) when the node is a foldable zero constant pad, else empty.
std::vector<int64_t> zero_constant_pads(const ir::Graph& g, const ir::Node& pad) {
  if (!pad.domain.empty() || pad.op_type != "Pad" || pad.inputs.empty() || pad.outputs.size() != 1) return {};
  if (pad.attr_string("mode", "constant") != "constant") return {};
  std::vector<int64_t> pads;
  if (pad.opset < 11) {
    pads = pad.attr_ints("pads");
    if (pad.attr_float("value", 0.0f) != 0.0f) return {};
  } else {
    if (pad.inputs.size() < 2 || pad.inputs[1].empty()) return {};
    if (pad.inputs.size() > 3 && !pad.inputs[3].empty()) return {};  // axes (opset 18)
    const Tensor* t = ir::constant_value(g, pad.inputs[1]);
    if (!t) return {};
    for (int64_t k = 0; k < t->numel(); ++k) pads.push_back(t->get_i64(k));
    if (pad.inputs.size() > 2 && !pad.inputs[2].empty()) {
      const Tensor* v = ir::constant_value(g, pad.inputs[2]);
      if (!v || v->numel() != 1 || v->get_f64(0) != 0.0) return {};
    }
  }
  if (pads.size() < 6 || pads.size() % 2) return {};  // N, C and at least one spatial dim
  for (int64_t p : pads)
    if (p < 0) return {};
  const size_t rank = pads.size() / 2;
  if (pads[0] || pads[1] || pads[rank] || pads[rank + 1]) return {};
  return pads;
}

}  // namespace

Result<int> fold_pad_into_window(ir::Graph& g) {
  int changed = 0;
  ir::UseIndex uses(g);
  for (auto& n : g.nodes) {
    if (!n.domain.empty() || (n.op_type != "Conv" && n.op_type != "AveragePool") || n.inputs.empty()) continue;
    int p = uses.producer(n.inputs[0]);
    if (p < 0 || !uses.single_use(n.inputs[0])) continue;
    const ir::Node& pad = g.nodes[static_cast<size_t>(p)];
    std::vector<int64_t> pads = zero_constant_pads(g, pad);
    if (pads.empty()) continue;
    const std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
    if (auto_pad != "NOTSET" && !auto_pad.empty()) continue;
    const size_t rank = pads.size() / 2, spatial = rank - 2;
    std::vector<int64_t> own = n.attr_ints("pads");
    if (own.empty()) own.assign(2 * spatial, 0);
    if (own.size() != 2 * spatial) continue;
    bool own_pads = false;
    for (int64_t v : own) own_pads |= v != 0;
    if (n.op_type == "AveragePool") {
      if (n.opset < 7 || n.attr_int("ceil_mode", 0) != 0) continue;  // count_include_pad: opset 7
      if (own_pads && n.attr_int("count_include_pad", 0) == 0) continue;
      n.attrs["count_include_pad"] = ir::attr_int(1);
    }
    for (size_t d = 0; d < spatial; ++d) {
      own[d] += pads[2 + d];
      own[spatial + d] += pads[rank + 2 + d];
    }
    n.attrs["pads"] = ir::attr_ints(own);
    n.inputs[0] = pad.inputs[0];  // the Pad is now dead; remove_dead_nodes drops it
    ++changed;
  }
  if (changed) {
    KILN_ASSIGN_OR_RETURN(int dead, remove_dead_nodes(g));
    (void)dead;
  }
  return changed;
}

}  // namespace kiln::passes
