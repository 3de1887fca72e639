// Liveness-based activation memory planning: every intermediate tensor gets an offset in one arena;
// tensors whose lifetimes do not overlap share bytes, and ops that allow it write their output over
// an input that dies at that op (in place).
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
};

// Ops whose output may overwrite their first input (same size, elementwise or pure reshapes).
bool op_allows_in_place(const ir::Node& n);

// `g` is topologically sorted. `bytes_of` gives a value's size when known (nullopt: dynamic).
// Graph inputs and initializers are not planned (the caller's and the engine's memory).
MemoryPlan plan_memory(const ir::Graph& g, const std::function<std::optional<size_t>(const std::string&)>& bytes_of);

}  // namespace kiln::engine
