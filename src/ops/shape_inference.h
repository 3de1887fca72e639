// Shape and type inference over a whole graph (subgraphs included). Folds nodes whose inputs are
// all known constants so that shape sub-graphs (Shape -> Gather -> Concat -> Reshape) resolve.
#pragma once

#include <map>
#include <string>

#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln::ops {

struct InferOptions {
  bool fold_constants = true;
  int64_t max_fold_elements = 1 << 20;  // larger constant results are not kept
  // When set, receives every value of the main graph known at build time (initializers that are
  // not inputs, Constant outputs, folded nodes): the constant-folding pass uses it.
  std::map<std::string, Tensor>* constants_out = nullptr;
};

// Fills g.value_types for every value. Errors name the node and say what disagrees.
Status infer_shapes(ir::Graph& g, const InferOptions& opts = {});

// Type of a tensor as the IR states it.
ir::TypeInfo type_of(const Tensor& t);

}  // namespace kiln::ops
