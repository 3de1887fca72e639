// Layers whose precision the graph fixes: ONNX's integer ops (MatMulInteger, QLinearMatMul) and kiln's INT8 layers
// folded from quantized graphs (kiln.DynQMatMul, kiln.QConv, kiln.QPool). Their signature's compute precision is int8
// whatever the build's precision (engine::signature_of): the graph, not the build, chose it.
#pragma once

#include "ir/graph.h"

namespace kiln::ops {

bool computes_in_int8(const ir::Node& n);

}  // namespace kiln::ops
