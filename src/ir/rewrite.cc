#include "ir/rewrite.h"

#include <cmath>

namespace kiln::ir {

namespace {
void rename_in_subgraph(Graph& g, const std::string& from, const std::string& to) {
  if (g.defines(from)) return;  // shadowed inside
  for (auto& n : g.nodes) {
    for (auto& i : n.inputs)
      if (i == from) i = to;
    for (auto& [k, a] : n.attrs) {
      if (a.g) rename_in_subgraph(*a.g, from, to);
      for (auto& sg : a.graphs) rename_in_subgraph(*sg, from, to);
    }
  }
  for (auto& o : g.outputs)
    if (o.name == from) o.name = to;
}
}  // namespace

UseIndex::UseIndex(const Graph& g) {
  for (const auto& o : g.outputs) outputs_.insert(o.name);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    for (const auto& o : n.outputs)
      if (!o.empty()) producer_[o] = static_cast<int>(i);
    for (const auto& in : n.inputs)
      if (!in.empty()) consumers_[in].push_back(static_cast<int>(i));
    for (const auto& [k, a] : n.attrs) {
      std::vector<std::shared_ptr<Graph>> subs = a.graphs;
      if (a.g) subs.push_back(a.g);
      for (const auto& sg : subs)
        for (const auto& r : sg->outer_references()) consumers_[r].push_back(static_cast<int>(i));
    }
  }
}

int UseIndex::producer(const std::string& value) const {
  auto it = producer_.find(value);
  return it == producer_.end() ? -1 : it->second;
}

const std::vector<int>& UseIndex::consumers(const std::string& value) const {
  static const std::vector<int> kNone;
  auto it = consumers_.find(value);
  return it == consumers_.end() ? kNone : it->second;
}

bool UseIndex::single_use(const std::string& value) const {
  return consumers(value).size() == 1 && !is_graph_output(value);
}

const Tensor* constant_value(const Graph& g, const std::string& name) {
  auto it = g.initializers.find(name);
  if (it == g.initializers.end()) return nullptr;
  for (const auto& in : g.inputs)
    if (in.name == name) return nullptr;
  return &it->second;
}

const Tensor* outer_constant(const Graph& body, const std::string& name) {
  for (const Graph* p = body.parent; p; p = p->parent)
    if (p->defines(name)) return constant_value(*p, name);
  return nullptr;
}

bool is_constant(const Graph& g, const std::string& name) { return constant_value(g, name) != nullptr; }

bool constant_scalar(const Graph& g, const std::string& name, double* out) {
  const Tensor* t = constant_value(g, name);
  if (!t || t->numel() != 1 || !dtype_is_float(t->dtype())) return false;
  *out = t->get_f64(0);
  return true;
}

void replace_uses(Graph& g, const std::string& from, const std::string& to) {
  for (auto& n : g.nodes) {
    for (auto& i : n.inputs)
      if (i == from) i = to;
    for (auto& [k, a] : n.attrs) {
      if (a.g) rename_in_subgraph(*a.g, from, to);
      for (auto& sg : a.graphs) rename_in_subgraph(*sg, from, to);
    }
  }
}

void remove_nodes(Graph& g, const std::set<int>& indices) {
  std::vector<Node> kept;
  kept.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!indices.count(static_cast<int>(i))) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
}

std::string unique_name(const Graph& g, const std::string& base) {
  // In a body, a new name must not shadow an outer value it (or a nested body) reads: enclosing
  // graphs' names and the names its nodes read count as used.
  auto used = [&](const std::string& s) {
    for (const Graph* p = &g; p; p = p->parent) {
      if (p->initializers.count(s) || p->value_types.count(s)) return true;
      for (const auto& n : p->nodes) {
        if (n.name == s) return true;
        for (const auto& o : n.outputs)
          if (o == s) return true;
        if (p == &g)
          for (const auto& in : n.inputs)
            if (in == s) return true;
      }
      for (const auto& i : p->inputs)
        if (i.name == s) return true;
    }
    return false;
  };
  if (!used(base)) return base;
  for (int k = 1;; ++k) {
    std::string s = base + "_" + std::to_string(k);
    if (!used(s)) return s;
  }
}

}  // namespace kiln::ir

namespace kiln::ir {
std::vector<std::string> sources_of(const Node& n) {
  const Attribute* a = n.attr("kiln.sources");
  return a ? a->strings : std::vector<std::string>{n.name};
}

void add_sources(Node& into, const Node& from) {
  std::vector<std::string> s = sources_of(into);
  for (const auto& x : sources_of(from)) s.push_back(x);
  Attribute a;
  a.type = Attribute::Type::kStrings;
  a.strings = std::move(s);
  into.attrs["kiln.sources"] = std::move(a);
}
}  // namespace kiln::ir
