// Runtime values the interpreter passes between nodes: a tensor, a sequence of tensors, or an
// empty optional.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace kiln::ops {

struct Value {
  enum class Kind { kNone, kTensor, kSequence };
  Kind kind = Kind::kNone;
  Tensor tensor;
  std::vector<Tensor> sequence;
  DataType sequence_elem = DataType::kUndefined;  // element dtype, known even when empty

  Value() = default;
  Value(Tensor t) : kind(Kind::kTensor), tensor(std::move(t)) {}  // NOLINT: implicit by design
  static Value make_sequence(std::vector<Tensor> items, DataType elem) {
    Value v;
    v.kind = Kind::kSequence;
    v.sequence = std::move(items);
    v.sequence_elem = elem;
    return v;
  }
  static Value none() { return Value(); }
  bool is_tensor() const { return kind == Kind::kTensor; }
  bool is_sequence() const { return kind == Kind::kSequence; }
  bool is_none() const { return kind == Kind::kNone; }
};

}  // namespace kiln::ops
