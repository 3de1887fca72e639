// fold_weight_dequantize: a DequantizeLinear whose inputs are all initializers (a quantized weight
// that no INT8 pattern took: e.g. the classifier Gemm of a calibrated model, whose logits stay float)
// becomes the float initializer it computes, whatever its size. fold_constants leaves outputs over 1M
// elements alone to keep engine files small, but a float layer cannot use packed kernels on a weight
// computed at run time: it would run its reference kernel. Runs after the Q/DQ folding passes, which
// need the weights' DequantizeLinear nodes to recognize their patterns.
#include <set>

#include "ir/rewrite.h"
#include "ops/interpreter.h"
#include "passes/pass.h"

namespace kiln::passes {

Result<int> fold_weight_dequantize(ir::Graph& g) {
  std::set<int> folded;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    if (!n.domain.empty() || n.op_type != "DequantizeLinear" || n.outputs.size() != 1 || n.outputs[0].empty()) continue;
    std::vector<ops::Value> values;
    values.reserve(n.inputs.size());
    bool constant = !n.inputs.empty();
    for (const auto& in : n.inputs) {
      if (in.empty()) {
        values.emplace_back();
        continue;
      }
      auto it = g.initializers.find(in);
      if (it == g.initializers.end()) {
        constant = false;
        break;
      }
      values.emplace_back(it->second);
    }
    if (!constant) continue;
    const ops::OpSchema* s = ops::OpRegistry::get().find(n.domain, n.op_type, n.opset);
    if (!s || !s->reference) continue;
    std::vector<const ops::Value*> ins;
    for (size_t k = 0; k < n.inputs.size(); ++k) ins.push_back(n.inputs[k].empty() ? nullptr : &values[k]);
    auto r = ops::run_node(n, *s, ins, nullptr);
    if (!r.ok() || r.value().empty() || !r.value()[0].is_tensor()) continue;
    g.initializers[n.outputs[0]] = r.value()[0].tensor;
    folded.insert(static_cast<int>(i));
  }
  ir::remove_nodes(g, folded);
  return static_cast<int>(folded.size());
}

}  // namespace kiln::passes
