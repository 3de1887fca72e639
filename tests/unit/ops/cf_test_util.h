// Helpers for the control-flow / sequence / string / quantization / ai.onnx.ml unit tests: node
// and attribute builders and a one-node kernel runner.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/attribute_builders.h"
#include "ops/common.h"
#include "ops/interpreter.h"
#include "ops/registry.h"
#include "ops/shape_inference.h"

namespace kiln::ops::cftest {

inline ir::Attribute int_attr(int64_t v) { return ir::attr_int(std::move(v)); }
inline ir::Attribute float_attr(float v) { return ir::attr_float(std::move(v)); }
inline ir::Attribute ints_attr(std::vector<int64_t> v) { return ir::attr_ints(std::move(v)); }
inline ir::Attribute str_attr(std::string s) { return ir::attr_string(std::move(s)); }
inline ir::Attribute strs_attr(std::vector<std::string> v) { return ir::attr_strings(std::move(v)); }
inline ir::Attribute tensor_attr(Tensor t) { return ir::attr_tensor(std::move(t)); }
inline ir::Attribute graph_attr(std::shared_ptr<ir::Graph> g) { return ir::attr_graph(std::move(g)); }

inline ir::Node make_node(const std::string& op, std::vector<std::string> ins, std::vector<std::string> outs,
                          int opset = 21, std::map<std::string, ir::Attribute> attrs = {},
                          const std::string& domain = "") {
  ir::Node n;
  n.name = op + "_node";
  n.op_type = op;
  n.domain = domain;
  n.opset = opset;
  n.inputs = std::move(ins);
  n.outputs = std::move(outs);
  n.attrs = std::move(attrs);
  return n;
}

inline Tensor f32(std::vector<float> v, Dims shape) { return Tensor::from_vector<float>(DataType::kFloat32, shape, v); }
inline Tensor f32(std::vector<float> v) {
  Dims d{static_cast<int64_t>(v.size())};
  return f32(std::move(v), d);
}
inline Tensor i64(std::vector<int64_t> v, Dims shape) {
  return Tensor::from_vector<int64_t>(DataType::kInt64, shape, v);
}
inline Tensor i64(std::vector<int64_t> v) {
  Dims d{static_cast<int64_t>(v.size())};
  return i64(std::move(v), d);
}
inline Tensor i64s(int64_t v) { return Tensor::scalar<int64_t>(DataType::kInt64, v); }
inline Tensor strs(std::vector<std::string> v, Dims shape) {
  Tensor t(DataType::kString, shape);
  for (size_t i = 0; i < v.size(); ++i) t.strings()[i] = v[i];
  return t;
}
inline Tensor strs(std::vector<std::string> v) {
  Dims d{static_cast<int64_t>(v.size())};
  return strs(std::move(v), d);
}

// Runs one node's kernel on the given values (Value::none() is a missing input).
inline Result<std::vector<Value>> run_values(const ir::Node& n, const std::vector<Value>& ins) {
  const OpSchema* s = OpRegistry::get().find(n.domain, n.op_type, n.opset);
  if (!s) return NotFound("no schema for ", n.op_type);
  std::vector<const Value*> ptrs;
  for (const auto& v : ins) ptrs.push_back(v.is_none() ? nullptr : &v);
  return run_node(n, *s, ptrs, nullptr);
}

inline Result<std::vector<Value>> run(const ir::Node& n, const std::vector<Tensor>& ins) {
  std::vector<Value> vals;
  for (const auto& t : ins) vals.push_back(t.defined() ? Value(t) : Value());
  return run_values(n, vals);
}

inline Tensor run1(const ir::Node& n, const std::vector<Tensor>& ins) {
  auto r = run(n, ins);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return Tensor();
  return r.value()[0].tensor;
}

inline std::vector<double> values(const Tensor& t) { return to_f64_vector(t); }

inline std::vector<std::string> strings_of(const Tensor& t) {
  std::vector<std::string> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.strings()[i]);
  return v;
}

inline bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

}  // namespace kiln::ops::cftest
