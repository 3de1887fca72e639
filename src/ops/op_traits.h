// Op traits: facts about an op that the passes, the memory planner and the tactic chooser read
// instead of keeping op lists of their own. Declared next to the op's registration in its
// src/ops/<family>.cc with KILN_OP_TRAITS, keyed like the registry by (domain, op_type), they hold
// for every version of the op; a reader keeps its own version preconditions (binary arithmetic
// broadcasts numpy-style from opset 7 only) and arity checks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"

namespace kiln::ops {

namespace trait {
enum : uint32_t {
  // y[i] = f(x[i]) for input 0; any other input is a scalar parameter (Clip's bounds).
  kElementwiseUnary = 1u << 0,
  // y[i] = f(a[i], b[i], ...), the inputs broadcast numpy-style to the output.
  kElementwiseBroadcast = 1u << 1,
  // Output 0 may reuse input 0's buffer when that input dies at this node with the same size.
  kInPlace = 1u << 2,
  // f(0) = 0 whatever the attributes: the zero padding lanes of a channel-blocked value stay zero.
  kKeepsZero = 1u << 3,
  // Fusable as the activation epilogue of Conv / Gemm / MatMul: kiln.Fused*'s "activation" runs it
  // (kiln_fused.cc's apply_activation must know the op; oneDNN tactics map it in onednn_common.cc).
  kEpilogue = 1u << 4,
  // Output 0 holds input 0's elements unchanged, perhaps with another shape (no element moves).
  kView = 1u << 5,
  // Computed from shapes or attributes only: reads no input element (Shape, Size, Constant).
  kShapeQuery = 1u << 6,
};
}  // namespace trait

struct OpTraits {
  uint32_t bits = 0;  // trait:: flags
  // An epilogue's oneDNN eltwise post-op algorithm as dnnl_alg_kind2str names it ("eltwise_relu").
  const char* onednn_post_op = nullptr;
  bool has(uint32_t t) const { return (bits & t) != 0; }  // any of the flags in t
};

class OpTraitTable {
 public:
  static OpTraitTable& get();
  // Adds traits to (domain, op_type), whatever its versions; flags of several declarations add up.
  bool add(const std::string& domain, const std::string& op_type, OpTraits t);
  // The traits of (domain, op_type) ("" and "ai.onnx" alike); none when it declared none.
  const OpTraits& of(const std::string& domain, const std::string& op_type) const;
  // Every op that declared traits, as (canonical domain, op_type).
  std::vector<std::pair<std::string, std::string>> ops() const;

 private:
  std::map<std::pair<std::string, std::string>, OpTraits> traits_;
};

// Whether node `n`'s op declared any of the trait:: flags in `t`.
bool has_trait(const ir::Node& n, uint32_t t);

}  // namespace kiln::ops

// Declares an op's traits next to its registration:
//   KILN_OP_TRAITS("", Relu, trait::kElementwiseUnary | trait::kInPlace);
// KILN_OP_TRAITS_ONEDNN also names an epilogue's oneDNN eltwise post-op.
#define KILN_OP_TRAITS_ONEDNN(DOMAIN, OP, BITS, ALG)             \
  static const bool KILN_CONCAT(kiln_traits_##OP##_, __LINE__) = \
      ::kiln::ops::OpTraitTable::get().add(DOMAIN, #OP, {BITS, ALG})
#define KILN_OP_TRAITS(DOMAIN, OP, BITS) KILN_OP_TRAITS_ONEDNN(DOMAIN, OP, BITS, nullptr)
