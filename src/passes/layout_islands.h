// The islands of a layout pass (layout_blocked: the CPU's channel-blocked layout; layout_nhwc: CUDA's
// channels-last one): the nodes a pass would put in its layout, connected through the values they
// pass each other and through the boundary conversion they share (one per plain value read in the
// layout), each with what its convs gain and what its boundary conversions cost, in bytes moved. An
// island whose gain is below its cost goes back to the plain layout; one with a map of unknown size
// stays (as every island did before the cost models).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/rewrite.h"
#include "passes/fusion_util.h"

namespace kiln::passes::layout {

struct Island {
  std::vector<size_t> convs;
  double gain = 0, cost = 0;  // bytes moved
  bool unknown = false;       // a map of unknown size: kept in the layout
  bool goes_plain() const { return !unknown && gain < cost; }
};

// Bytes of value v with `element_bytes` per element (the layout's storage); -1 when a dim is not known.
inline double value_bytes(const ir::Graph& g, const std::string& v, double element_bytes) {
  const ir::TypeInfo* t = fusion::type_of(g, v);
  if (!t || !t->shape.rank_known) return -1;
  double n = element_bytes;
  for (const auto& d : t->shape.dims) {
    if (!d.known()) return -1;
    n *= static_cast<double>(d.value);
  }
  return n;
}

// Whether value v, made in the layout, also needs its plain form: a graph output, or read by a node
// that does not read it in the layout (`reads_layout(k, j)` false) in some position.
template <class ReadsLayout>
bool needs_plain_form(const ir::Graph& g, const ir::UseIndex& uses, const std::string& v, ReadsLayout reads_layout) {
  bool plain = uses.is_graph_output(v);
  for (int k : uses.consumers(v)) {
    const ir::Node& r = g.nodes[static_cast<size_t>(k)];
    int reads = 0, layout_reads = 0;
    for (size_t j = 0; j < r.inputs.size(); ++j)
      if (r.inputs[j] == v) ++reads, layout_reads += reads_layout(static_cast<size_t>(k), j);
    plain |= reads == 0 || layout_reads != reads;
  }
  return plain;
}

// `in_layout(i)`: node i is one the pass rewrites; `is_conv(i)`: it is a conv (its gain counts);
// `reads_layout(i, j)`: node i reads its input j in the layout; `value_bytes(v)`: the bytes of value v in
// the layout (< 0: unknown); `conv_gain(i)`: what conv i gains in the layout; `needs_plain_form(v)`: value
// v (made in the layout) also needs its plain form (a boundary conversion out: 2 x its bytes).
template <class InLayout, class IsConv, class ReadsLayout, class ValueBytes, class ConvGain, class NeedsPlain>
std::vector<Island> islands(const ir::Graph& g, InLayout in_layout, IsConv is_conv, ReadsLayout reads_layout,
                            ValueBytes value_bytes, ConvGain conv_gain, NeedsPlain needs_plain_form) {
  const size_t count = g.nodes.size();
  std::vector<size_t> parent(count);
  for (size_t i = 0; i < count; ++i) parent[i] = i;
  auto find = [&](size_t i) {
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
  };
  std::map<std::string, size_t> producer, first_plain_reader;
  for (size_t i = 0; i < count; ++i)
    if (in_layout(i)) producer[g.nodes[i].outputs[0]] = i;
  for (size_t i = 0; i < count; ++i) {
    if (!in_layout(i)) continue;
    const ir::Node& n = g.nodes[i];
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      if (!reads_layout(i, j)) continue;
      if (auto p = producer.find(n.inputs[j]); p != producer.end()) {
        parent[find(i)] = find(p->second);
      } else {
        auto [it, fresh_value] = first_plain_reader.emplace(n.inputs[j], i);
        if (!fresh_value) parent[find(i)] = find(it->second);  // one shared conversion in
      }
    }
  }
  std::map<size_t, Island> by_root;
  for (size_t i = 0; i < count; ++i) {
    if (!in_layout(i)) continue;
    Island& is = by_root[find(i)];
    const double y = value_bytes(g.nodes[i].outputs[0]);
    is.unknown |= y < 0;
    if (is_conv(i)) is.convs.push_back(i), is.gain += conv_gain(i);
    if (needs_plain_form(g.nodes[i].outputs[0])) is.cost += 2 * y;
  }
  for (const auto& [v, reader] : first_plain_reader) {
    Island& is = by_root[find(reader)];
    is.unknown |= value_bytes(v) < 0;
    is.cost += 2 * value_bytes(v);
  }
  std::vector<Island> out;
  for (auto& [root, is] : by_root) out.push_back(std::move(is));
  return out;
}

}  // namespace kiln::passes::layout
