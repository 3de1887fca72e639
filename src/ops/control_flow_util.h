// Helpers for control flow, sequence and optional ops: comparing and widening static types,
// copying subgraphs, and inferring loop bodies whose carried values may change shape.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "ir/graph.h"
#include "ops/registry.h"

namespace kiln::ops::cf {

// Structural equality of two static types (dims compare by value and symbol name).
bool same_type(const ir::TypeInfo& a, const ir::TypeInfo& b);

// The narrowest type that covers both a and b: equal dims stay, differing dims become
// `fresh_dim()` (an unknown dim by default), differing ranks an unknown shape. An optional and
// its element type widen to the optional. Differing kinds or dtypes give an unknown type/dtype.
ir::TypeInfo widen(const ir::TypeInfo& a, const ir::TypeInfo& b, const std::function<Dim()>& fresh_dim = nullptr);

// Deep copy of a graph (nested subgraphs included) whose parent is `parent`.
std::shared_ptr<ir::Graph> clone_graph(const ir::Graph& g, const ir::Graph* parent);

// Infers a loop body (Loop, Scan) whose inputs [in0, in0 + n) are fed back from its outputs
// [out0, out0 + n) on the next iteration. The carried input types are widened until the body's
// outputs fit them (on scratch copies of the body), then the body itself is inferred once with
// those types, so the types recorded in the body hold for every iteration.
// Returns the body's output types; `in_types` receives the carried input types used.
Result<std::vector<ir::TypeInfo>> infer_loop_body(InferContext& ctx, const ir::Graph& body,
                                                  std::vector<ir::TypeInfo>& in_types, size_t in0, size_t out0,
                                                  size_t n);

// The graph attribute `name`, or an error naming the node.
Result<const ir::Graph*> graph_attr(const ir::Node& node, const char* name);

// Element type of a sequence-typed input (nullptr when not statically a sequence).
const ir::TypeInfo* sequence_elem(const InferContext& ctx, size_t i);

}  // namespace kiln::ops::cf
