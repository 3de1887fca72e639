#include "engine/memory_planner.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "ops/op_traits.h"

namespace kiln::engine {

bool op_allows_in_place(const ir::Node& n) { return ops::has_trait(n, ops::trait::kInPlace); }

MemoryPlan plan_memory(const ir::Graph& g, const std::function<std::optional<size_t>(const std::string&)>& bytes_of,
                       const LayerNeeds& needs) {
  MemoryPlan plan;
  std::set<std::string> external;
  for (const auto& in : g.inputs) external.insert(in.name);
  for (const auto& [k, v] : g.initializers) external.insert(k);
  const int end = static_cast<int>(g.nodes.size());
  struct Life {
    int first = 0, last = 0;
    size_t bytes = 0;
  };
  std::unordered_map<std::string, Life> life;
  std::vector<std::string> order;  // definition order
  for (int i = 0; i < end; ++i) {
    const ir::Node& n = g.nodes[static_cast<size_t>(i)];
    for (const auto& in : n.inputs)
      if (life.count(in)) life[in].last = i;
    for (const auto& [k, a] : n.attrs) {
      std::vector<std::shared_ptr<ir::Graph>> subs = a.graphs;
      if (a.g) subs.push_back(a.g);
      for (const auto& sg : subs)
        for (const auto& r : sg->outer_references())
          if (life.count(r)) life[r].last = i;
    }
    for (const auto& o : n.outputs) {
      if (o.empty() || external.count(o)) continue;
      auto b = bytes_of(o);
      if (!b) {
        plan.dynamic.insert(o);
        continue;
      }
      life[o] = {i, i, (*b + 63) / 64 * 64};
      order.push_back(o);
    }
  }
  for (const auto& o : g.outputs)
    if (life.count(o.name)) life[o.name].last = end;  // outputs live until the caller reads them

  // In place: an output takes over the slot of input 0 when that input dies here with the same size.
  std::unordered_map<std::string, std::string> shares;  // value -> value whose slot it reuses
  for (int i = 0; i < end; ++i) {
    const ir::Node& n = g.nodes[static_cast<size_t>(i)];
    if (!op_allows_in_place(n) || n.inputs.empty() || n.outputs.empty()) continue;
    if (needs.in_place_ok && !needs.in_place_ok(static_cast<size_t>(i))) continue;
    const std::string& in = n.inputs[0];
    const std::string& out = n.outputs[0];
    if (!life.count(in) || !life.count(out) || life[in].last != i || life[in].bytes != life[out].bytes) continue;
    bool read_twice = std::count(n.inputs.begin(), n.inputs.end(), in) > 1;
    if (read_twice) continue;
    std::string root = in;
    while (shares.count(root)) root = shares[root];
    shares[out] = root;
    life[root].last = std::max(life[root].last, life[out].last);
    ++plan.in_place;
  }

  // Greedy by size: largest first, lowest offset that overlaps no placed buffer alive at the same time.
  std::vector<std::string> roots;
  for (const auto& v : order)
    if (!shares.count(v)) roots.push_back(v);
  // Workspaces: pseudo-values alive during their layer only ("\x01" + index cannot name a value).
  std::map<std::string, size_t> workspace_of;
  if (needs.workspace)
    for (int i = 0; i < end; ++i)
      if (size_t b = needs.workspace(static_cast<size_t>(i))) {
        std::string key = "\x01" + std::to_string(i);
        life[key] = {i, i, (b + 63) / 64 * 64};
        roots.push_back(key);
        workspace_of[key] = static_cast<size_t>(i);
      }
  std::stable_sort(roots.begin(), roots.end(),
                   [&](const std::string& a, const std::string& b) { return life[a].bytes > life[b].bytes; });
  struct Placed {
    size_t offset, bytes;
    int first, last;
  };
  std::vector<Placed> placed;
  for (const auto& v : roots) {
    const Life& l = life[v];
    std::vector<std::pair<size_t, size_t>> busy;
    for (const auto& p : placed)
      if (p.first <= l.last && l.first <= p.last) busy.emplace_back(p.offset, p.offset + p.bytes);
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (const auto& [b0, b1] : busy) {
      if (offset + l.bytes <= b0) break;
      offset = std::max(offset, b1);
    }
    placed.push_back({offset, l.bytes, l.first, l.last});
    plan.arena_bytes = std::max(plan.arena_bytes, offset + l.bytes);
    if (auto w = workspace_of.find(v); w != workspace_of.end()) {
      plan.workspace_offsets[w->second] = offset;
      plan.workspace_sizes[w->second] = l.bytes;
      plan.workspace_bytes = std::max(plan.workspace_bytes, l.bytes);
      continue;
    }
    plan.offsets[v] = offset;
  }
  for (const auto& v : order) {
    std::string root = v;
    while (shares.count(root)) root = shares[root];
    plan.offsets[v] = plan.offsets[root];
    plan.sizes[v] = life[v].bytes;
    plan.naive_bytes += life[v].bytes;
  }
  return plan;
}

}  // namespace kiln::engine
