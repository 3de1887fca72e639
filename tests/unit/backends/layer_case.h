// One layer to test or time a tactic on: the node, its inputs and which of them are constants, with
// the pieces every tactic harness needs (tactic_test.cc, kiln_kernels_test.cc and
// bench/kernel_bench.cc): building the node and its epilogue, the LayerSignature a tactic sees and
// the reference kernel's output. No gtest here (the benchmark includes it too).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../graph_builder.h"
#include "backends/tactic.h"
#include "ir/attribute_builders.h"
#include "ir/graph.h"
#include "ops/interpreter.h"

namespace kiln::testing {

struct LayerCase {
  ir::Node node;
  std::vector<Tensor> inputs;  // undefined: missing optional input
  std::vector<bool> constant;  // weights (initializers) vs activations
};

// A node `op` of `domain` (opset 17 for ONNX, 1 for kiln) reading in0..in{n-1}, writing y.
inline ir::Node make_node(const std::string& domain, const std::string& op, size_t n_inputs) {
  ir::Node n;
  n.name = op + "_case";
  n.op_type = op;
  n.domain = domain;
  n.opset = domain.empty() ? 17 : 1;
  for (size_t i = 0; i < n_inputs; ++i) n.inputs.push_back("in" + std::to_string(i));
  n.outputs = {"y"};
  return n;
}

inline void set_string(ir::Node& n, const std::string& a, const std::string& v) { n.attrs[a] = ir::attr_string(v); }
inline void set_float(ir::Node& n, const std::string& a, float v) { n.attrs[a] = ir::attr_float(v); }

// A uniform integer in [lo, hi].
inline int64_t pick(std::mt19937& rng, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(rng() % (hi - lo + 1));
}

// A random kiln.Fused* epilogue activation (or none), with its attributes.
inline void add_epilogue(std::mt19937& rng, ir::Node& n) {
  static const char* kActs[] = {"", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSwish", "Clip", "SiLU", "Gelu"};
  std::string act = kActs[rng() % 9];
  if (act.empty()) return;
  set_string(n, "activation", act);
  if (act == "LeakyRelu") set_float(n, "activation_alpha", 0.1f);
  if (act == "Gelu" && rng() % 2) set_string(n, "activation_approximate", "tanh");
  if (act == "Clip") {
    if (rng() % 3) set_float(n, "activation_min", -0.5f);
    if (rng() % 3) set_float(n, "activation_max", 0.7f);
  }
}

// A Conv / kiln.FusedConv case's inputs for its node's attributes (set before): X `x` = [N, C, H,
// W], W `w` = [M, C / group, kH, kW], B [M] when `bias` (else missing), all but X constant, and with
// `residual` a residual of the output's shape (1 x 1 where the geometry leaves no output: the
// reference rejects those cases). Seeds seed .. seed + 3.
inline void add_conv_inputs(LayerCase& lc, uint64_t seed, const Dims& x, const Dims& w, bool bias, bool residual) {
  const ir::Node& nd = lc.node;
  lc.inputs.push_back(random_tensor(x, seed));
  lc.inputs.push_back(random_tensor(w, seed + 1));
  lc.inputs.push_back(bias ? random_tensor({w[0]}, seed + 2) : Tensor());
  lc.constant = {false, true, true, false};
  if (!residual) return;
  const std::string auto_pad = nd.attr_string("auto_pad", "NOTSET");
  const std::vector<int64_t> s = nd.attr_ints("strides", {1, 1}), d = nd.attr_ints("dilations", {1, 1}),
                             p = nd.attr_ints("pads", {0, 0, 0, 0});
  int64_t oh, ow;
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER")
    oh = (x[2] + s[0] - 1) / s[0], ow = (x[3] + s[1] - 1) / s[1];
  else
    oh = (x[2] + p[0] + p[2] - (w[2] - 1) * d[0] - 1) / s[0] + 1,
    ow = (x[3] + p[1] + p[3] - (w[3] - 1) * d[1] - 1) / s[1] + 1;
  if (oh <= 0 || ow <= 0) oh = ow = 1;
  lc.inputs.push_back(random_tensor({x[0], w[0], oh, ow}, seed + 3));
}

// What a tactic sees of the layer: each present input's dtype, shape and (constants) values.
inline backends::LayerSignature layer_signature(const LayerCase& lc) {
  backends::LayerSignature sig;
  sig.node = &lc.node;
  for (size_t i = 0; i < lc.node.inputs.size(); ++i) {
    backends::TensorSig t;
    if (!lc.node.inputs[i].empty() && lc.inputs[i].defined()) {
      t.present = true;
      t.dtype = lc.inputs[i].dtype();
      t.shape = lc.inputs[i].shape();
      if (lc.constant[i]) t.constant = &lc.inputs[i];
    }
    sig.inputs.push_back(t);
  }
  sig.outputs.resize(lc.node.outputs.size());
  return sig;
}

// The reference kernel's outputs; empty when the op rejects the case, or (`*known` set false) when
// no schema has the op.
inline std::vector<Tensor> reference_outputs(const LayerCase& lc, bool* known = nullptr) {
  const ops::OpSchema* s = ops::OpRegistry::get().find(lc.node.domain, lc.node.op_type, lc.node.opset);
  if (known) *known = s != nullptr;
  if (!s) return {};
  std::vector<ops::Value> vals;
  vals.reserve(lc.inputs.size());
  for (const auto& t : lc.inputs) vals.emplace_back(t);
  std::vector<const ops::Value*> ins;
  for (size_t i = 0; i < lc.node.inputs.size(); ++i)
    ins.push_back(lc.node.inputs[i].empty() || !lc.inputs[i].defined() ? nullptr : &vals[i]);
  ops::Interpreter runner(std::make_shared<ir::Graph>());  // runs kiln.FusedElementwise bodies
  auto r = ops::run_node(lc.node, *s, ins, &runner);
  if (!r.ok()) return {};
  std::vector<Tensor> out;
  for (const auto& v : r.value()) out.push_back(v.tensor);
  return out;
}

// The reference kernel's first output; undefined when the op rejects the case, or (`*known` set
// false) when no schema has the op.
inline Tensor reference_output(const LayerCase& lc, bool* known = nullptr) {
  std::vector<Tensor> outs = reference_outputs(lc, known);
  return outs.empty() ? Tensor() : outs[0];
}

}  // namespace kiln::testing
