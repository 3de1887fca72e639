// Storage dtypes of a device engine built with --fp16 / --bf16 / --best: which activations live in
// float16 or bfloat16 between layers (TensorRT's reformat-free reduced-precision regions).
//
// After the passes, before tactic selection, every layer that touches float32 data gets a storage
// dtype D (float32, float16 or bfloat16):
//   - a layer that computes (its op has a device tactic computing in a float precision) gets the
//     build's reduced precision (float16 before bfloat16 under --best), or its --layer-precisions
//     entry's, when a tactic of that precision takes it with every float32 input and output in D;
//     otherwise float32;
//   - a layer that only moves data (views, Transpose, Slice, Concat, Gather, ...) follows its first
//     float activation input (a reduced region stays reduced through it; Gather of a constant table
//     takes the reduced precision);
//   - the layer's float32 outputs are stored in D, its float constant inputs (weights, biases) are
//     converted to D once at build time (a copy per dtype, "<name>::fp16");
//   - where a value's storage differs from what a consumer reads, a Cast layer converts it (one per
//     value and dtype, placed before its first consumer), named "<value>::to_<precision>";
//   - engine inputs and outputs keep the model's dtypes: an output produced in D is renamed
//     "<name>::<precision>" and a Cast back to float32 produces the declared name. Values read by
//     If/Loop/Scan bodies stay float32 the same way, and nodes holding bodies stay float32.
// Each tactic then sees its layer's dtypes in its LayerSignature (backends/tactic.h: the dtype
// contract). CPU targets are left alone: kiln's CPU BF16 tactics convert their float32 input
// themselves, and the CPU has no FP16 kernels.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "core/status.h"
#include "core/target.h"
#include "engine/precision.h"
#include "ir/graph.h"

namespace kiln::engine {

struct StorageDtypeStats {
  DataType reduced = DataType::kUndefined;  // the build's reduced storage dtype (kUndefined: none, nothing done)
  int reduced_layers = 0;                   // layers now reading and writing float16/bfloat16
  int casts = 0;                            // Cast layers inserted where precisions meet
  int constants = 0;                        // constants converted
  // Computing layers left in float32 because no tactic of the reduced precision takes them (not those a
  // --layer-precisions rule keeps): op -> count, and one example layer with its first tactic's reason.
  std::map<std::string, int> float32_ops;
  std::string float32_example;
};

// Rewrites `g` (the optimized graph) as above. `typed`: g inferred at the opt shapes (infer_at), for
// the tactics' shape checks. A no-op (reduced kUndefined) for CPU targets and FP32-only policies.
Result<StorageDtypeStats> assign_storage_dtypes(ir::Graph& g, const ir::Graph& typed, const Target& target,
                                                const PrecisionPolicy& policy);

}  // namespace kiln::engine
