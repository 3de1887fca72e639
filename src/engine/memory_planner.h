// Liveness-based activation memory planning: every intermediate tensor gets an offset in one arena;
// tensors whose lifetimes do not overlap share bytes, and ops that allow it write their output over
// an input that dies at that op (in place).
//
// Layer workspaces (PreparedLayer::workspace_bytes: a tactic's scratch) are planned in the same arena
// as values that live during their layer only: a workspace overlaps no input or output of its layer
// and takes the bytes of activations that are dead while the layer runs, so the arena grows only by
// what no such gap holds. (One region sized by the largest workspace would also be correct, since a
// context runs its layers one at a time, but it always adds that maximum on top of the activations.)
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "ir/graph.h"

namespace kiln::engine {

struct MemoryPlan {
  std::map<std::string, size_t> offsets;  // arena offset of each planned value
  std::map<std::string, size_t> sizes;    // its bytes (64-aligned)
  std::set<std::string> dynamic;          // sizes unknown before the run (data-dependent): not planned
  size_t arena_bytes = 0;                 // peak: the arena size
  size_t naive_bytes = 0;                 // sum of all planned tensors, as if none shared memory
  int in_place = 0;                       // outputs written over a dying input
  // Per main-graph node with a workspace: its arena offset and bytes (64-aligned).
  std::map<size_t, size_t> workspace_offsets, workspace_sizes;
  size_t workspace_bytes = 0;  // the largest layer workspace (what the --workspace cap compares)
};

// What the planner knows about the layers besides the values' sizes.
struct LayerNeeds {
  // Node i's workspace in bytes (0: none); empty: no layer has one.
  std::function<size_t(size_t node)> workspace;
  // Whether node i may write its output over its dying input 0 (in place) when op_allows_in_place;
  // empty: every such node may. The engine says no for layers that run a tactic, which write into
  // their own output slot while they read their inputs.
  std::function<bool(size_t node)> in_place_ok;
};

// Ops whose output may overwrite their first input (same size, elementwise or pure reshapes).
bool op_allows_in_place(const ir::Node& n);

// `g` is topologically sorted. `bytes_of` gives a value's size when known (nullopt: dynamic).
// Graph inputs and initializers are not planned (the caller's and the engine's memory).
MemoryPlan plan_memory(const ir::Graph& g, const std::function<std::optional<size_t>(const std::string&)>& bytes_of,
                       const LayerNeeds& needs = {});

}  // namespace kiln::engine
