// Attribute values built in one line: for passes that synthesize nodes, and for tests.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

inline Attribute attr_int(int64_t v) {
  Attribute a;
  a.type = Attribute::Type::kInt;
  a.i = v;
  return a;
}
inline Attribute attr_float(float v) {
  Attribute a;
  a.type = Attribute::Type::kFloat;
  a.f = v;
  return a;
}
inline Attribute attr_string(std::string v) {
  Attribute a;
  a.type = Attribute::Type::kString;
  a.s = std::move(v);
  return a;
}
inline Attribute attr_ints(std::vector<int64_t> v) {
  Attribute a;
  a.type = Attribute::Type::kInts;
  a.ints = std::move(v);
  return a;
}
inline Attribute attr_strings(std::vector<std::string> v) {
  Attribute a;
  a.type = Attribute::Type::kStrings;
  a.strings = std::move(v);
  return a;
}
inline Attribute attr_tensor(Tensor t) {
  Attribute a;
  a.type = Attribute::Type::kTensor;
  a.t = std::move(t);
  return a;
}
inline Attribute attr_graph(std::shared_ptr<Graph> g) {
  Attribute a;
  a.type = Attribute::Type::kGraph;
  a.g = std::move(g);
  return a;
}

}  // namespace kiln::ir
