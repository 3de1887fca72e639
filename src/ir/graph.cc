#include "ir/graph.h"

#include <deque>
#include <set>
#include <unordered_set>

namespace kiln::ir {

TypeInfo TypeInfo::sequence(TypeInfo elem) {
  TypeInfo t;
  t.kind = Kind::kSequence;
  t.inner = std::make_shared<TypeInfo>(std::move(elem));
  return t;
}

TypeInfo TypeInfo::optional(TypeInfo elem) {
  TypeInfo t;
  t.kind = Kind::kOptional;
  t.inner = std::make_shared<TypeInfo>(std::move(elem));
  return t;
}

std::string TypeInfo::str() const {
  switch (kind) {
    case Kind::kTensor: return std::string(dtype_name(elem)) + shape.str();
    case Kind::kSequence: return "seq(" + (inner ? inner->str() : "?") + ")";
    case Kind::kOptional: return "optional(" + (inner ? inner->str() : "?") + ")";
    case Kind::kMap: return std::string("map(") + dtype_name(map_key) + "," + (inner ? inner->str() : "?") + ")";
    default: return "?";
  }
}

int64_t Node::attr_int(const std::string& n, int64_t dflt) const {
  const Attribute* a = attr(n);
  return a ? a->i : dflt;
}
float Node::attr_float(const std::string& n, float dflt) const {
  const Attribute* a = attr(n);
  return a ? a->f : dflt;
}
std::string Node::attr_string(const std::string& n, const std::string& dflt) const {
  const Attribute* a = attr(n);
  return a ? a->s : dflt;
}
std::vector<int64_t> Node::attr_ints(const std::string& n, std::vector<int64_t> dflt) const {
  const Attribute* a = attr(n);
  return a ? a->ints : dflt;
}
std::vector<float> Node::attr_floats(const std::string& n, std::vector<float> dflt) const {
  const Attribute* a = attr(n);
  return a ? a->floats : dflt;
}

std::string Node::where() const {
  std::string s = "node '" + name + "' (" + (domain.empty() ? "" : domain + ".") + op_type;
  if (opset) s += ", opset " + std::to_string(opset);
  return s + "): ";
}

bool Graph::defines(const std::string& v) const {
  if (initializers.count(v)) return true;
  for (const auto& in : inputs)
    if (in.name == v) return true;
  for (const auto& n : nodes)
    for (const auto& o : n.outputs)
      if (o == v) return true;
  return false;
}

bool Graph::visible(const std::string& v) const {
  for (const Graph* g = this; g; g = g->parent)
    if (g->defines(v)) return true;
  return false;
}

namespace {
// Values a node reads: its inputs plus what its subgraphs read from outside themselves.
std::vector<std::string> node_reads(const Node& n) {
  std::vector<std::string> r;
  for (const auto& i : n.inputs)
    if (!i.empty()) r.push_back(i);
  for (const auto& [name, a] : n.attrs) {
    if (a.g)
      for (auto& x : a.g->outer_references()) r.push_back(x);
    for (const auto& g : a.graphs)
      for (auto& x : g->outer_references()) r.push_back(x);
  }
  return r;
}
}  // namespace

std::vector<std::string> Graph::outer_references() const {
  std::unordered_set<std::string> local;
  for (const auto& i : inputs) local.insert(i.name);
  for (const auto& [k, v] : initializers) local.insert(k);
  for (const auto& n : nodes)
    for (const auto& o : n.outputs) local.insert(o);
  std::set<std::string> out;
  for (const auto& n : nodes)
    for (const auto& r : node_reads(n))
      if (!local.count(r)) out.insert(r);
  for (const auto& o : outputs)
    if (!local.count(o.name)) out.insert(o.name);
  return {out.begin(), out.end()};
}

Status Graph::topological_sort() {
  std::unordered_map<std::string, size_t> producer;
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (const auto& o : nodes[i].outputs) {
      if (o.empty()) continue;
      if (!producer.emplace(o, i).second)
        return InvalidModel("graph '", name, "': value '", o, "' is produced by two nodes ('", nodes[producer[o]].name,
                            "' and '", nodes[i].name, "')");
    }
  }
  std::unordered_set<std::string> available;
  for (const auto& in : inputs) available.insert(in.name);
  for (const auto& [k, v] : initializers) available.insert(k);
  std::vector<std::vector<size_t>> consumers(nodes.size());
  std::vector<size_t> pending(nodes.size(), 0);
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::set<std::string> reads;
    for (auto& r : node_reads(nodes[i])) reads.insert(r);
    for (const auto& r : reads) {
      auto it = producer.find(r);
      if (it != producer.end() && !available.count(r)) {
        consumers[it->second].push_back(i);
        ++pending[i];
      } else if (!available.count(r) && !(parent && parent->visible(r))) {
        return InvalidModel(nodes[i].where(), "input '", r,
                            "' is not produced by any node, graph input or initializer of graph '", name, "'");
      }
    }
  }
  std::deque<size_t> ready;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (pending[i] == 0) ready.push_back(i);
  std::vector<size_t> order;
  while (!ready.empty()) {
    size_t i = ready.front();
    ready.pop_front();
    order.push_back(i);
    for (size_t c : consumers[i])
      if (--pending[c] == 0) ready.push_back(c);
  }
  if (order.size() != nodes.size()) {
    for (size_t i = 0; i < nodes.size(); ++i)
      if (pending[i] != 0)
        return InvalidModel("graph '", name, "' has a cycle through ", nodes[i].where(),
                            "its inputs depend on its own outputs");
  }
  std::vector<Node> sorted;
  sorted.reserve(nodes.size());
  for (size_t i : order) sorted.push_back(std::move(nodes[i]));
  nodes = std::move(sorted);
  for (const auto& o : outputs)
    if (!o.name.empty() && !available.count(o.name) && !producer.count(o.name) && !(parent && parent->visible(o.name)))
      return InvalidModel("graph '", name, "': output '", o.name, "' is not produced by any node");
  return Status::Ok();
}

}  // namespace kiln::ir
