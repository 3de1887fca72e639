// Per-layer precision: which compute dtypes each layer's tactics may use, from the build's precision
// flags (TensorRT's builder flags: FP32 always, plus --bf16 / --fp16 / --int8, or every one with
// --best), its --layer-precisions and --precision-constraints, and --strongly-typed.
//
// Device-independent: a precision is a compute dtype (TacticInfo::compute); the CPU's BF16 tactics and
// the CUDA backend's FP16/BF16/INT8/FP8 ones are chosen the same way. The tuner times the layer's
// tactics of every allowed precision against each other and keeps the fastest (engine/tactics.h:
// choose_tactic); the engine records each layer's precision (LayerInfo::precision, kiln inspect); the
// timing cache keys every timing on it (tune/layer_key.cc: the signature's compute dtype).
//
// A layer precision (first matching --layer-precisions entry; the pattern is matched against the
// layer's name and the names of the ONNX nodes it came from) narrows a floating-point layer to that
// precision (a kernel that only moves data, TacticInfo::compute kUndefined, meets any):
//   obey    the layer computes in it or the build fails, naming the layer and why;
//   prefer  (default) it is tried alone first; when no kernel of it takes the layer, a warning and
//           the build's precisions;
//   none    layer precisions are ignored (with a warning that they are).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "core/target.h"
#include "ir/graph.h"
#include "kiln/kiln.h"

namespace kiln::engine {

struct PrecisionPolicy {
  std::vector<DataType> allowed;  // the build's compute dtypes, float32 first
  struct Rule {
    std::string pattern;
    DataType precision = DataType::kFloat32;
  };
  std::vector<Rule> rules;
  PrecisionConstraints constraints = PrecisionConstraints::kPrefer;
  bool strongly_typed = false;
};

// The build's policy from its config, checked: a precision no kernel of this kiln computes in on the
// target's device is refused (kiln has no FP16 CPU kernel: --fp16 says so and what to use instead);
// one whose kernels need CPU features the target lacks (BF16 without avx512_bf16) is a warning, and
// the layers stay in the other precisions. --strongly-typed with a reduced precision or layer
// precisions is refused (the graph's types decide).
Result<PrecisionPolicy> precision_policy(const BuilderConfig& cfg, const Target& target,
                                         const std::function<void(const std::string&)>& warn);

// One layer's precisions. A layer whose first input is int8/uint8 in the graph (explicit quantization)
// may also compute in int8, first, without --int8.
struct LayerPrecisions {
  std::vector<DataType> allowed;  // what the tuner chooses among, in order (ties: the earlier)
  // A layer precision matched: `allowed` is {required}. Under prefer, `fallback` is what the layer
  // gets when no kernel of `required` takes it.
  DataType required = DataType::kUndefined;
  std::vector<DataType> fallback;
  std::string rule;  // the entry that matched ("PATTERN:bf16")
};
// `names`: the layer's name and its source ONNX nodes (ir::sources_of). `data_dtype`: the dtype of the
// layer's first input in the graph (what --strongly-typed computes in).
LayerPrecisions layer_precisions(const PrecisionPolicy& p, const std::vector<std::string>& names, DataType data_dtype);
// Whether a --layer-precisions entry keeps the layer in FP32: what INT8 calibration leaves out.
bool layer_pinned_fp32(const PrecisionPolicy& p, const std::vector<std::string>& names);

/// Whether the build asks for INT8 (--int8, or --best with calibration data or a cache): the builder
/// then calibrates (or takes the model's own Q/DQ nodes) before the passes (engine/calibration.h).
bool int8_requested(const BuilderConfig& cfg);

// "fp32", "bf16", "fp16", "int8" (and dtype_name for the others); parse: the flag's spelling.
std::string precision_name(DataType t);
bool parse_precision(const std::string& name, Precision* out);
DataType precision_dtype(Precision p);  // kMixed: kUndefined
// Shell-style glob: * any run, ? any one character.
bool glob_match(const std::string& pattern, const std::string& name);

}  // namespace kiln::engine
