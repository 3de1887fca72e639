// Q/DQ insertion: turns an FP32 graph plus calibrated activation ranges into the explicit-quantization
// graph ONNX Runtime's quantize_static (QDQ format) emits, so that implicit INT8 (kiln build --int8
// --calib-data) and explicit INT8 (a Q/DQ model) reach the same folding pass and kernels:
//
//   x ─Q─DQ─┐                                          (uint8 per tensor, asymmetric)
//   W_quantized ─DQ(axis)─┼─ Conv / Gemm / MatMul ─ y   (int8 per output channel, symmetric, zp 0)
//   B_quantized ─DQ(axis 0)┘                            (int32, scale = s_x * s_w[c], zp 0)
//   a ─Q─DQ─┐                   t ─Q─DQ─ MaxPool / Flatten / Reshape / Transpose / (Un)Squeeze ─ u ─Q─DQ─
//   b ─Q─DQ─┴─ Add ─ y                                    (u's Q/DQ take t's scale and zero point)
//   xs ─Q─DQ─ Concat / AveragePool / GlobalAveragePool ─ y
//
// A Relu, or a Clip with lower bound 0, that follows a quantized Conv/Gemm/MatMul/Add and whose
// readers are all quantized, is removed and its output becomes the layer's (as ONNX Runtime does):
// its range, calibrated after the activation, starts at 0, so the Q's zero point is 0 and the Q
// clamps exactly where the activation would (and at most at Clip's upper bound).
//
// Q/DQ go only where one of kiln's INT8 layers will take them (src/passes/fold_qdq_conv.cc,
// fold_qdq_matmul.cc), never around a node that would then run as float between a DQ and a Q:
//  - MatMul / Gemm with a constant weight: always (kiln.QConv when the output is quantized, else
//    kiln.QMatMul with a float output); MatMul of two activations (attention's products) stays FP32;
//  - 2-D Conv: always; when some reader of its output (after an absorbed Relu/Clip) stays float, the
//    output gets a Q/DQ pair all its readers read (the INT8 region's exit: one dequantization);
//  - Add: only a residual Add one of whose inputs is a quantized Conv's / Gemm's output read by the
//    Add alone (the conv takes it as its residual); other Adds stay FP32 (a transformer's);
//  - MaxPool, AveragePool without padding, GlobalAveragePool (4-D), and Flatten / Reshape after a
//    quantized layer (same scale): yes; Concat, Transpose, Squeeze, Unsqueeze: no (no INT8 layer).
// An activation gets a Q/DQ pair only when a quantized node reads it (or it is such an exit); other
// readers keep reading the FP32 value, and graph outputs stay FP32 (a quantized layer writing one
// dequantizes its result: ONNX Runtime's extra Q/DQ on the logits only adds rounding, and ties: on
// mobilenet_v2_fmnist 8 of 10,000 images' two top uint8 logits are equal, argmax taking the lower
// class, which is what separates kiln's flipped images from ONNX Runtime's at equal parameters). Nodes the
// exclusion predicate names (BuilderConfig::int8_exclude) are not quantized: their inputs stay FP32.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"
#include "quant/calibrator.h"

namespace kiln::quant {

using ExcludeFn = std::function<bool(const ir::Node&)>;

struct QdqPlan {
  std::set<int> nodes;               // quantized nodes (indices into the graph's nodes)
  std::map<int, int> absorbed;       // removed Relu/Clip node -> the quantized node taking its output
  std::vector<std::string> observe;  // activations whose ranges calibration measures (graph order)
  // Activations quantized with another's parameters (the output of a same-scale node -> its input).
  std::map<std::string, std::string> same_scale_as;
  std::vector<std::string> excluded;  // quantizable nodes left in FP32 by the predicate
  // Quantized layers' outputs that float readers read too: every reader reads their DQ.
  std::set<std::string> exits;
};

// Decides what gets quantized. The graph needs its types inferred (float32 activations only).
Result<QdqPlan> plan_qdq(const ir::Graph& g, const ExcludeFn& exclude);

// What insert_qdq did: per quantized activation its range and parameters (uint8).
struct QdqTensor {
  std::string name;
  Range range;
  QuantParams params;
};
struct QdqResult {
  std::vector<QdqTensor> activations;
  int weights = 0, biases = 0, nodes = 0, removed_activations = 0;
};

// Rewrites `g` by the plan with the calibrated ranges (every plan.observe entry must have one).
// Needs opset >= 13 (per-axis DequantizeLinear).
Result<QdqResult> insert_qdq(ir::Graph& g, const QdqPlan& plan, const std::map<std::string, Range>& ranges);

}  // namespace kiln::quant
