#include "ops/op_traits.h"

#include "ops/registry.h"

namespace kiln::ops {

OpTraitTable& OpTraitTable::get() {
  static OpTraitTable t;
  return t;
}

bool OpTraitTable::add(const std::string& domain, const std::string& op_type, OpTraits t) {
  OpTraits& have = traits_[{canonical_domain(domain), op_type}];
  have.bits |= t.bits;
  if (t.onednn_post_op) have.onednn_post_op = t.onednn_post_op;
  return true;
}

const OpTraits& OpTraitTable::of(const std::string& domain, const std::string& op_type) const {
  static const OpTraits kNone;
  auto it = traits_.find({canonical_domain(domain), op_type});
  return it == traits_.end() ? kNone : it->second;
}

std::vector<std::pair<std::string, std::string>> OpTraitTable::ops() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [k, v] : traits_) out.push_back(k);
  return out;
}

bool has_trait(const ir::Node& n, uint32_t t) { return OpTraitTable::get().of(n.domain, n.op_type).has(t); }

}  // namespace kiln::ops
