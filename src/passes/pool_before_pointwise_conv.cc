// pool_before_pointwise_conv: a 1x1 convolution followed by an average pool becomes the pool followed
// by the convolution. Both are linear and the 1x1 conv acts on each pixel alone (its bias too passes
// through an average unchanged), so they commute; pooled first, the conv runs on k*k times fewer
// pixels. DenseNet's transitions (BN, ReLU, 1x1 conv, 2x2 average pool) spend a fifth of the
// network's multiply-adds in those convs: three quarters of it goes.
//
// Matches a plain ONNX Conv with a 1x1 kernel (known weight shape), strides 1, no pads (explicit 0s,
// or auto_pad NOTSET / VALID), any group and bias, on a 4-D input, whose only reader is a 2-D
// AveragePool with no pads (count_include_pad then does not matter) and ceil_mode 0, that is not a
// graph output. The pool keeps its attributes and reads the conv's input; the conv reads the pooled
// value and writes the pool's output (its name unchanged, so later nodes and kiln compare see the
// same value). Exact up to float rounding (the sums run in another order).
// Leaves alone: MaxPool (not linear), pools with pads or ceil_mode (partial or padded windows),
// convs with a stride, pads or a larger kernel, and a conv read by anything else.
#include "ir/rewrite.h"
#include "passes/pass.h"

namespace kiln::passes {

namespace {

bool all_zero(const std::vector<int64_t>& v) {
  for (int64_t x : v)
    if (x != 0) return false;
  return true;
}

bool all_one(const std::vector<int64_t>& v) {
  for (int64_t x : v)
    if (x != 1) return false;
  return true;
}

bool unpadded(const ir::Node& n) {
  const std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  return (auto_pad == "NOTSET" || auto_pad == "VALID") && all_zero(n.attr_ints("pads"));
}

bool rank4(const ir::Graph& g, const std::string& v) {
  auto it = g.value_types.find(v);
  return it != g.value_types.end() && it->second.shape.rank_known && it->second.shape.rank() == 4;
}

bool is_pointwise_conv(const ir::Graph& g, const ir::Node& n) {
  if (!n.domain.empty() || n.op_type != "Conv" || n.outputs.size() != 1 || n.inputs.size() < 2) return false;
  if (n.inputs[0].empty() || n.inputs[1].empty() || !rank4(g, n.inputs[0])) return false;
  if (const Tensor* w = ir::constant_value(g, n.inputs[1])) {
    if (w->rank() != 4 || w->dim(2) != 1 || w->dim(3) != 1) return false;
  } else {
    auto t = g.value_types.find(n.inputs[1]);
    if (t == g.value_types.end() || !t->second.shape.rank_known || t->second.shape.rank() != 4) return false;
    for (size_t d = 2; d < 4; ++d)
      if (!t->second.shape.dims[d].known() || t->second.shape.dims[d].value != 1) return false;
  }
  const std::vector<int64_t> ks = n.attr_ints("kernel_shape");
  if (!ks.empty() && !all_one(ks)) return false;
  return all_one(n.attr_ints("strides")) && unpadded(n);
}

bool is_plain_average_pool(const ir::Graph& g, const ir::Node& n) {
  if (!n.domain.empty() || n.op_type != "AveragePool" || n.inputs.size() != 1 || n.outputs.size() != 1) return false;
  if (n.attr_ints("kernel_shape").size() != 2 || !rank4(g, n.outputs[0])) return false;
  return unpadded(n) && n.attr_int("ceil_mode", 0) == 0;
}

}  // namespace

Result<int> pool_before_pointwise_conv(ir::Graph& g) {
  int changed = 0;
  ir::UseIndex uses(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::Node& pool = g.nodes[i];
    if (!is_plain_average_pool(g, pool)) continue;
    const int p = uses.producer(pool.inputs[0]);
    if (p < 0 || !uses.single_use(pool.inputs[0])) continue;
    ir::Node& conv = g.nodes[static_cast<size_t>(p)];
    if (!is_pointwise_conv(g, conv)) continue;
    const std::string x = conv.inputs[0], y = pool.outputs[0];
    const std::string pooled = ir::unique_name(g, x + "/pooled");
    pool.inputs[0] = x;
    pool.outputs[0] = pooled;
    conv.inputs[0] = pooled;
    conv.outputs[0] = y;
    ++changed;  // the conv now comes after the pool: the pipeline re-sorts the graph
  }
  if (changed) KILN_RETURN_IF_ERROR(g.topological_sort());
  return changed;
}

}  // namespace kiln::passes
