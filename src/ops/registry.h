// The op registry: one OpSchema per (domain, op_type, since_version), each carrying its shape and
// type inference and its reference kernel. Op files register themselves with KILN_REGISTER_OP.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "ir/graph.h"
#include "ops/value.h"

namespace kiln::ops {

// One element of an integer value known at build time, as a number (any sign) or as a dim symbol.
// Shape sub-graphs (Shape -> Gather -> Concat -> Reshape) carry these so that symbolic dims survive.
struct SymInt {
  bool known = false;
  int64_t value = 0;  // when known
  std::string param;  // when not known: the dim symbol ("" = nothing known)
  static SymInt of(int64_t v) {
    SymInt s;
    s.known = true;
    s.value = v;
    return s;
  }
  static SymInt of(const Dim& d) {
    if (d.known()) return of(d.value);
    SymInt s;
    s.param = d.param;
    return s;
  }
  Dim dim() const { return known ? (value >= 0 ? Dim(value) : Dim()) : (param.empty() ? Dim() : Dim::symbol(param)); }
};
using SymValue = std::vector<SymInt>;  // the elements of a scalar or 1-D integer tensor

// Shape/type inference for one node.
struct InferContext {
  const ir::Node& node;
  std::vector<const ir::TypeInfo*> inputs;  // nullptr where the optional input is missing
  std::vector<const Tensor*> constants;     // the value of input i when known at build time
  std::vector<ir::TypeInfo> outputs;        // filled by the op; one per node output
  // Symbolic values of small integer inputs (from constants or from ops like Shape), nullptr when
  // unknown; an op that knows its output's value sets output_values (all-known ones become constants).
  std::vector<const SymValue*> input_values;
  std::vector<std::optional<SymValue>> output_values;
  // Infers a subgraph's output types from its input types (for If/Loop/Scan).
  std::function<Result<std::vector<ir::TypeInfo>>(const ir::Graph&, const std::vector<ir::TypeInfo>&)> infer_subgraph;
  int* symbol_counter = nullptr;

  explicit InferContext(const ir::Node& n) : node(n) {}
  int opset() const { return node.opset; }
  size_t num_inputs() const { return inputs.size(); }
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i] != nullptr; }
  // Type of input i; an unknown type when the input is missing (inference is best effort, kernels
  // validate at run time), so no infer function can read through a null pointer.
  const ir::TypeInfo& input(size_t i) const {
    static const ir::TypeInfo kMissing;
    return has_input(i) ? *inputs[i] : kMissing;
  }
  // Dtype and shape of a tensor input (unknown shape if the input is not a tensor).
  DataType input_dtype(size_t i) const { return has_input(i) ? inputs[i]->elem : DataType::kUndefined; }
  const SymShape& input_shape(size_t i) const;
  const Tensor* constant(size_t i) const { return i < constants.size() ? constants[i] : nullptr; }
  const SymValue* sym_value(size_t i) const { return i < input_values.size() ? input_values[i] : nullptr; }
  void set_output_value(size_t i, SymValue v) {
    if (i < output_values.size()) output_values[i] = std::move(v);
  }
  // A fresh symbol for a dim only known at run time ("unk__3").
  Dim new_symbol();
  void set_output(size_t i, ir::TypeInfo t) {
    if (i < outputs.size()) outputs[i] = std::move(t);
  }
  void set_output(size_t i, DataType dt, SymShape s) { set_output(i, ir::TypeInfo::tensor(dt, std::move(s))); }
  Status error(const std::string& msg) const { return InvalidModel(node.where(), msg); }
};

// Runs a subgraph (If/Loop/Scan body) with the given inputs; outer-scope values are visible.
class SubgraphRunner {
 public:
  virtual ~SubgraphRunner() = default;
  // Fills `results` (resized to the body's outputs) by assignment over what it held: a caller that
  // keeps the vector from run to run (control_flow.cc) gets them with no allocation of the vector or
  // of the tensors' shape vectors (tests/noalloc).
  virtual Status run_subgraph_into(const ir::Graph& g, const std::vector<Value>& inputs,
                                   std::vector<Value>& results) = 0;
  // The same, into a fresh vector.
  Result<std::vector<Value>> run_subgraph(const ir::Graph& g, const std::vector<Value>& inputs) {
    std::vector<Value> results;
    KILN_RETURN_IF_ERROR(run_subgraph_into(g, inputs, results));
    return results;
  }
};

// Thrown by KernelContext::input() for a required input that is absent (or not a tensor); the
// interpreter turns it into an error naming the node and the input.
struct MissingInput {
  size_t index;
  bool wrong_kind = false;
  explicit MissingInput(size_t i, bool kind = false) : index(i), wrong_kind(kind) {}
};

// Execution of one node by a reference kernel.
struct KernelContext {
  const ir::Node& node;
  std::vector<const Value*> inputs;  // nullptr where the optional input is missing
  std::vector<Value> outputs;        // one per node output; kernels fill them
  SubgraphRunner* subgraphs = nullptr;

  explicit KernelContext(const ir::Node& n) : node(n) {}
  int opset() const { return node.opset; }
  size_t num_inputs() const { return inputs.size(); }
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i] != nullptr && !inputs[i]->is_none(); }
  // The tensor of input i. Required inputs may be read directly; read optional ones only after
  // has_input(i). A missing or non-tensor input makes the run fail with a clean error.
  const Tensor& input(size_t i) const;
  // Input i as a value (tensor, sequence or empty optional); a missing input throws like input().
  const Value& input_value(size_t i) const {
    if (i >= inputs.size() || inputs[i] == nullptr) throw MissingInput(i);
    return *inputs[i];
  }
  size_t num_outputs() const { return outputs.size(); }
  bool wants_output(size_t i) const { return node.has_output(i); }
  void set_output(size_t i, Tensor t) {
    if (i < outputs.size()) outputs[i] = Value(std::move(t));
  }
  void set_output_value(size_t i, Value v) {
    if (i < outputs.size()) outputs[i] = std::move(v);
  }
  Status error(const std::string& msg) const { return InvalidArgument(node.where(), msg); }
  Status unsupported(const std::string& msg) const { return Unsupported(node.where(), msg); }
};

using InferFn = Status (*)(InferContext&);
using KernelFn = Status (*)(KernelContext&);

struct OpSchema {
  std::string domain;  // "" for ai.onnx
  std::string op_type;
  int since_version = 1;
  InferFn infer = nullptr;
  KernelFn reference = nullptr;
  int min_inputs = 0, max_inputs = -1;  // arity checks done by the interpreter (-1: unbounded)
};

class OpRegistry {
 public:
  static OpRegistry& get();
  bool add(OpSchema s);
  // The schema with the largest since_version <= opset, or nullptr.
  const OpSchema* find(const std::string& domain, const std::string& op_type, int opset) const;
  // Any version of this op (used to tell "unsupported opset" from "unknown op").
  bool knows(const std::string& domain, const std::string& op_type) const;
  std::vector<const OpSchema*> all() const;

 private:
  std::vector<OpSchema> schemas_;
};

// "ai.onnx" and "" are the same domain.
std::string canonical_domain(const std::string& d);

}  // namespace kiln::ops

// Registers an op: KILN_REGISTER_OP("", Relu, 6, infer_unary, relu_kernel). Arity limits are
// checked before the kernel runs: KILN_REGISTER_OP_ARITY(..., min_inputs, max_inputs).
#define KILN_REGISTER_OP_ARITY(DOMAIN, OP, SINCE, INFER, KERNEL, MIN_IN, MAX_IN) \
  static const bool KILN_CONCAT(kiln_registered_##OP##_, __LINE__) =             \
      ::kiln::ops::OpRegistry::get().add({DOMAIN, #OP, SINCE, INFER, KERNEL, MIN_IN, MAX_IN})
#define KILN_REGISTER_OP(DOMAIN, OP, SINCE, INFER, KERNEL) \
  KILN_REGISTER_OP_ARITY(DOMAIN, OP, SINCE, INFER, KERNEL, 0, -1)
