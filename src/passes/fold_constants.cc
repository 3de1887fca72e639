// fold_constants: replaces every node whose outputs are all known at build time (all inputs
// constant, or a shape computation over static shapes, e.g. Shape -> Gather -> Unsqueeze -> Concat
// feeding a Reshape) by initializers. Random ops and nodes with subgraphs are left alone (shape
// inference never folds them); outputs larger than 1M elements are not folded (they would bloat
// the engine file more than they save). CastLike(constant, x) folds too when x's dtype is known
// (only its dtype is read: ONNX function bodies such as Gelu's cast every constant this way), and
// folding repeats while that makes more nodes constant.
#include "ir/rewrite.h"
#include "ops/interpreter.h"
#include "ops/shape_inference.h"
#include "passes/pass.h"

namespace kiln::passes {

namespace {

// CastLike(c, like) with c constant and like's dtype known: the CastLike kernel run on c and an
// empty tensor of that dtype.
bool fold_cast_like(ir::Graph& g, const std::map<std::string, Tensor>& known, const ir::Node& n) {
  if (!n.domain.empty() || n.op_type != "CastLike" || n.inputs.size() != 2 || n.outputs.size() != 1) return false;
  auto c = known.find(n.inputs[0]);
  auto t = g.value_types.find(n.inputs[1]);
  if (c == known.end() || t == g.value_types.end() || !t->second.is_tensor() ||
      t->second.elem == DataType::kUndefined || c->second.numel() > 4096)
    return false;
  const ops::OpSchema* s = ops::OpRegistry::get().find(n.domain, n.op_type, n.opset);
  if (!s || !s->reference) return false;
  ops::Value in(c->second), like(Tensor(t->second.elem, {0}));
  auto r = ops::run_node(n, *s, {&in, &like}, nullptr);
  if (!r.ok() || r.value().empty() || !r.value()[0].is_tensor()) return false;
  g.initializers[n.outputs[0]] = r.value()[0].tensor;
  return true;
}

}  // namespace

Result<int> fold_constants(ir::Graph& g) {
  int total = 0;
  for (bool again = true; again;) {
    std::map<std::string, Tensor> known;
    ops::InferOptions opts;
    opts.constants_out = &known;
    KILN_RETURN_IF_ERROR(ops::infer_shapes(g, opts));
    std::set<int> folded;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const ir::Node& n = g.nodes[i];
      bool all = !n.outputs.empty();
      for (const auto& o : n.outputs)
        if (!o.empty() && !known.count(o)) all = false;
      if (all) {
        for (const auto& o : n.outputs)
          if (!o.empty()) g.initializers[o] = known.at(o);
        folded.insert(static_cast<int>(i));
      }
    }
    again = false;
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (!folded.count(static_cast<int>(i)) && fold_cast_like(g, known, g.nodes[i])) {
        folded.insert(static_cast<int>(i));
        again = true;
      }
    ir::remove_nodes(g, folded);
    total += static_cast<int>(folded.size());
  }
  return total;
}

}  // namespace kiln::passes
