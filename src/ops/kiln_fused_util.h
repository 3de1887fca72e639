// Helpers for the kiln-domain fused ops (kiln_fused.cc, kiln_fused_misc.cc). A fused op's
// reference is the ONNX ops it replaced, run one after the other through their own reference
// kernels on a synthesized ir::Node, so the fused result equals the unfused graph's by
// construction. Inference composes the same ops' inference functions.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/attribute_builders.h"
#include "ops/common.h"
#include "ops/interpreter.h"

namespace kiln::ops::fused {

using Attrs = std::map<std::string, ir::Attribute>;

inline ir::Attribute int_attr(int64_t v) { return ir::attr_int(std::move(v)); }
inline ir::Attribute float_attr(float v) { return ir::attr_float(std::move(v)); }
inline ir::Attribute string_attr(std::string v) { return ir::attr_string(std::move(v)); }
inline ir::Attribute ints_attr(std::vector<int64_t> v) { return ir::attr_ints(std::move(v)); }

// The ONNX node the fused node stands in for: same name (so errors point at the fused node), the
// given op and opset, inputs "in0".. ("" where `present[i]` is false), one output.
inline ir::Node synth_node(const ir::Node& owner, const std::string& op, int opset, const std::vector<bool>& present,
                           Attrs attrs) {
  ir::Node n;
  n.name = owner.name;
  n.op_type = op;
  n.opset = opset;
  for (size_t i = 0; i < present.size(); ++i) n.inputs.push_back(present[i] ? "in" + std::to_string(i) : "");
  n.outputs = {"out"};
  n.attrs = std::move(attrs);
  return n;
}

// Runs ONNX op `op` at `opset` on tensors (nullptr marks a missing optional input); output 0.
inline Result<Tensor> run_onnx(const KernelContext& ctx, const std::string& op, int opset,
                               const std::vector<const Tensor*>& in, Attrs attrs = {}) {
  const OpSchema* s = OpRegistry::get().find("", op, opset);
  if (!s || !s->reference) return Internal(ctx.node.where(), "no reference kernel for ", op, " at opset ", opset);
  std::vector<bool> present;
  std::vector<Value> vals;
  vals.reserve(in.size());
  for (const Tensor* t : in) {
    present.push_back(t != nullptr);
    vals.push_back(t ? Value(*t) : Value());
  }
  std::vector<const Value*> ptrs;
  for (size_t i = 0; i < in.size(); ++i) ptrs.push_back(in[i] ? &vals[i] : nullptr);
  ir::Node n = synth_node(ctx.node, op, opset, present, std::move(attrs));
  KILN_ASSIGN_OR_RETURN(std::vector<Value> out, run_node(n, *s, ptrs, ctx.subgraphs));
  if (out.empty() || !out[0].is_tensor()) return Internal(ctx.node.where(), op, " produced no tensor");
  return std::move(out[0].tensor);
}

// Output 0's type of `node` (a node kiln made up) inferred by schema `s`, inside the inference of
// ctx.node: input types (nullptr: missing) and constants given, symbols numbered on from ctx's.
inline Result<ir::TypeInfo> infer_as(InferContext& ctx, const OpSchema& s, const ir::Node& node,
                                     const std::vector<const ir::TypeInfo*>& in,
                                     const std::vector<const Tensor*>& constants) {
  InferContext sub(node);
  sub.inputs = in;
  sub.constants = constants;
  sub.constants.resize(in.size(), nullptr);
  sub.input_values.assign(in.size(), nullptr);
  sub.outputs.resize(1);
  sub.output_values.resize(1);
  sub.symbol_counter = ctx.symbol_counter;
  sub.infer_subgraph = ctx.infer_subgraph;
  if (s.infer) KILN_RETURN_IF_ERROR(s.infer(sub));
  return sub.outputs[0];
}

// Output 0's type of ONNX op `op` at `opset` given input types (nullptr: missing) and constants.
inline Result<ir::TypeInfo> infer_onnx(InferContext& ctx, const std::string& op, int opset,
                                       const std::vector<const ir::TypeInfo*>& in,
                                       const std::vector<const Tensor*>& constants, Attrs attrs = {}) {
  const OpSchema* s = OpRegistry::get().find("", op, opset);
  if (!s) return Internal(ctx.node.where(), "no schema for ", op, " at opset ", opset);
  std::vector<bool> present;
  for (const auto* t : in) present.push_back(t != nullptr);
  return infer_as(ctx, *s, synth_node(ctx.node, op, opset, present, std::move(attrs)), in, constants);
}

}  // namespace kiln::ops::fused
