// Test helper: builds small IR models by hand and compares two models numerically.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/interpreter.h"
#include "ops/shape_inference.h"

namespace kiln::testing {

class GraphBuilder {
 public:
  explicit GraphBuilder(int opset = 17) {
    model_.graph = std::make_shared<ir::Graph>();
    model_.graph->name = "test";
    model_.opset_imports[""] = opset;
    model_.graph->opset_imports[""] = opset;
    model_.ir_version = 8;
    opset_ = opset;
  }
  GraphBuilder& input(const std::string& name, Dims dims, DataType dt = DataType::kFloat32) {
    model_.graph->inputs.push_back({name, ir::TypeInfo::tensor(dt, SymShape::from_dims(dims))});
    return *this;
  }
  GraphBuilder& output(const std::string& name) {
    model_.graph->outputs.push_back({name, ir::TypeInfo()});
    return *this;
  }
  GraphBuilder& init(const std::string& name, Tensor t) {
    model_.graph->initializers[name] = std::move(t);
    return *this;
  }
  // The node appended to the graph. The reference is valid until the next node is added (the nodes
  // live in a vector): set its attributes before adding another.
  ir::Node& node(const std::string& op, std::vector<std::string> inputs, std::vector<std::string> outputs) {
    ir::Node n;
    n.name = op + "_" + std::to_string(model_.graph->nodes.size());
    n.op_type = op;
    n.opset = opset_;
    n.inputs = std::move(inputs);
    n.outputs = std::move(outputs);
    model_.graph->nodes.push_back(std::move(n));
    return model_.graph->nodes.back();
  }
  // Conv reading `inputs` (X, W[, B]) with `pad` on every side, `stride` along both axes and `group`
  // (each attribute set only when it differs from ONNX's default).
  ir::Node& conv(std::vector<std::string> inputs, const std::string& y, int64_t pad = 0, int64_t stride = 1,
                 int64_t group = 1) {
    ir::Node& n = node("Conv", std::move(inputs), {y});
    if (pad) set_ints(n, "pads", {pad, pad, pad, pad});
    if (stride != 1) set_ints(n, "strides", {stride, stride});
    if (group != 1) set_int(n, "group", group);
    return n;
  }
  // Gemm with transB = 1: a classifier over [N, K] weights.
  ir::Node& gemm_t(std::vector<std::string> inputs, const std::string& y) {
    ir::Node& n = node("Gemm", std::move(inputs), {y});
    set_int(n, "transB", 1);
    return n;
  }
  static void set_int(ir::Node& n, const std::string& a, int64_t v) {
    ir::Attribute at;
    at.type = ir::Attribute::Type::kInt;
    at.i = v;
    n.attrs[a] = at;
  }
  static void set_ints(ir::Node& n, const std::string& a, std::vector<int64_t> v) {
    ir::Attribute at;
    at.type = ir::Attribute::Type::kInts;
    at.ints = std::move(v);
    n.attrs[a] = at;
  }
  static void set_float(ir::Node& n, const std::string& a, float v) {
    ir::Attribute at;
    at.type = ir::Attribute::Type::kFloat;
    at.f = v;
    n.attrs[a] = at;
  }
  // Sorts and infers types; the model is ready to run or optimize.
  ir::Model finish() {
    Status s = model_.graph->topological_sort();
    if (s.ok()) s = ops::infer_shapes(*model_.graph);
    if (!s.ok()) throw std::runtime_error(s.to_string());
    return model_;
  }

 private:
  ir::Model model_;
  int opset_;
};

inline Tensor random_tensor(Dims dims, uint64_t seed, DataType dt = DataType::kFloat32, double lo = -1, double hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  Tensor t(dt, std::move(dims));
  for (int64_t i = 0; i < t.numel(); ++i) t.set_f64(i, u(rng));
  return t;
}

inline std::map<std::string, ops::Value> random_inputs(const ir::Graph& g, uint64_t seed) {
  std::map<std::string, ops::Value> in;
  for (const auto& i : g.inputs) in[i.name] = ops::Value(random_tensor(i.type.shape.concrete(), seed++, i.type.elem));
  return in;
}

inline std::vector<ops::Value> run(const ir::Model& m, const std::map<std::string, ops::Value>& inputs) {
  ops::Interpreter interp(m.graph);
  auto r = interp.run(inputs);
  if (!r.ok()) throw std::runtime_error(r.status().to_string());
  return r.value();
}

// Largest absolute difference between the outputs of two models on the same random inputs.
inline double max_abs_diff(const ir::Model& a, const ir::Model& b, uint64_t seed = 1) {
  auto in = random_inputs(*a.graph, seed);
  auto ra = run(a, in), rb = run(b, in);
  double worst = 0;
  if (ra.size() != rb.size()) return INFINITY;
  for (size_t i = 0; i < ra.size(); ++i) {
    if (ra[i].tensor.shape() != rb[i].tensor.shape()) return INFINITY;
    for (int64_t k = 0; k < ra[i].tensor.numel(); ++k)
      worst = std::max(worst, std::fabs(ra[i].tensor.get_f64(k) - rb[i].tensor.get_f64(k)));
  }
  return worst;
}

inline int count_op(const ir::Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes) n += node.op_type == op;
  return n;
}

inline ir::Model clone(const ir::Model& m) {
  ir::Model c = m;
  c.graph = ir::deep_copy(*m.graph);
  return c;
}

}  // namespace kiln::testing
