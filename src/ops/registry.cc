#include "ops/registry.h"

namespace kiln::ops {

std::string canonical_domain(const std::string& d) { return d == "ai.onnx" ? std::string() : d; }

const SymShape& InferContext::input_shape(size_t i) const {
  static const SymShape kUnknown;
  if (!has_input(i) || !inputs[i]->is_tensor()) return kUnknown;
  return inputs[i]->shape;
}

Dim InferContext::new_symbol() {
  static int fallback = 0;
  int* c = symbol_counter ? symbol_counter : &fallback;
  return Dim::symbol("unk__" + std::to_string((*c)++));
}

const Tensor& KernelContext::input(size_t i) const {
  if (i >= inputs.size() || inputs[i] == nullptr || inputs[i]->is_none()) throw MissingInput(i);
  if (!inputs[i]->is_tensor()) throw MissingInput(i, true);
  return inputs[i]->tensor;
}

OpRegistry& OpRegistry::get() {
  static OpRegistry r;
  return r;
}

bool OpRegistry::add(OpSchema s) {
  s.domain = canonical_domain(s.domain);
  schemas_.push_back(std::move(s));
  return true;
}

const OpSchema* OpRegistry::find(const std::string& domain, const std::string& op_type, int opset) const {
  std::string d = canonical_domain(domain);
  const OpSchema* best = nullptr;
  for (const auto& s : schemas_) {
    if (s.op_type != op_type || s.domain != d || s.since_version > opset) continue;
    if (!best || s.since_version > best->since_version) best = &s;
  }
  return best;
}

bool OpRegistry::knows(const std::string& domain, const std::string& op_type) const {
  std::string d = canonical_domain(domain);
  for (const auto& s : schemas_)
    if (s.op_type == op_type && s.domain == d) return true;
  return false;
}

std::vector<const OpSchema*> OpRegistry::all() const {
  std::vector<const OpSchema*> out;
  for (const auto& s : schemas_) out.push_back(&s);
  return out;
}

}  // namespace kiln::ops
