// Small helpers for op unit tests: build a node, run its reference kernel, run its inference.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "ir/attribute_builders.h"
#include "ir/graph.h"
#include "ops/interpreter.h"
#include "ops/registry.h"

namespace kiln::ops::arnn_testing {

inline ir::Attribute attr_i(int64_t v) { return ir::attr_int(std::move(v)); }
inline ir::Attribute attr_f(float v) { return ir::attr_float(std::move(v)); }
inline ir::Attribute attr_s(std::string v) { return ir::attr_string(std::move(v)); }
inline ir::Attribute attr_ints(std::vector<int64_t> v) { return ir::attr_ints(std::move(v)); }
inline ir::Attribute attr_strings(std::vector<std::string> v) { return ir::attr_strings(std::move(v)); }

// A node with inputs "in0".. (empty names where `present` is false) and `num_outputs` outputs.
inline ir::Node make_node(const std::string& op, int opset, size_t num_inputs, size_t num_outputs,
                          std::map<std::string, ir::Attribute> attrs = {}, const std::string& domain = "") {
  ir::Node n;
  n.name = "n";
  n.op_type = op;
  n.domain = domain;
  n.opset = opset;
  for (size_t i = 0; i < num_inputs; ++i) n.inputs.push_back("in" + std::to_string(i));
  for (size_t i = 0; i < num_outputs; ++i) n.outputs.push_back("out" + std::to_string(i));
  n.attrs = std::move(attrs);
  return n;
}

// Runs the node's kernel; undefined tensors in `inputs` are missing optional inputs.
inline Result<std::vector<Value>> run(ir::Node n, const std::vector<Tensor>& inputs) {
  const OpSchema* s = OpRegistry::get().find(n.domain, n.op_type, n.opset);
  if (!s) return NotFound("no schema for ", n.op_type);
  std::vector<Value> vals;
  vals.reserve(inputs.size());
  for (const Tensor& t : inputs) vals.push_back(t.defined() ? Value(t) : Value());
  std::vector<const Value*> ptrs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() && i < n.inputs.size()) n.inputs[i].clear();
    ptrs.push_back(inputs[i].defined() ? &vals[i] : nullptr);
  }
  return run_node(n, *s, ptrs, nullptr);
}

// Runs the node's shape inference on the given input types (kUnknown kind = missing input).
inline Result<std::vector<ir::TypeInfo>> infer(ir::Node n, const std::vector<ir::TypeInfo>& inputs) {
  const OpSchema* s = OpRegistry::get().find(n.domain, n.op_type, n.opset);
  if (!s) return NotFound("no schema for ", n.op_type);
  for (size_t i = 0; i < inputs.size() && i < n.inputs.size(); ++i)
    if (inputs[i].kind == ir::TypeInfo::Kind::kUnknown) n.inputs[i].clear();
  InferContext ctx(n);
  int counter = 0;
  ctx.symbol_counter = &counter;
  for (const auto& t : inputs) ctx.inputs.push_back(t.kind == ir::TypeInfo::Kind::kUnknown ? nullptr : &t);
  ctx.constants.assign(inputs.size(), nullptr);
  ctx.outputs.resize(n.outputs.size());
  KILN_RETURN_IF_ERROR(s->infer(ctx));
  return ctx.outputs;
}

inline Tensor f32(Dims shape, std::vector<float> v) { return Tensor::from_vector<float>(DataType::kFloat32, shape, v); }
inline Tensor i64(Dims shape, std::vector<int64_t> v) {
  return Tensor::from_vector<int64_t>(DataType::kInt64, shape, v);
}
inline ir::TypeInfo tinfo(DataType dt, std::vector<Dim> dims) {
  return ir::TypeInfo::tensor(dt, SymShape(std::move(dims)));
}

inline void expect_values(const Tensor& t, const std::vector<double>& want, double tol = 1e-5) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want.size())) << t.describe();
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_NEAR(t.get_f64(i), want[static_cast<size_t>(i)], tol) << "at " << i;
}

}  // namespace kiln::ops::arnn_testing
