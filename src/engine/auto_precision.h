// Automatic mixed precision (kiln build --precision auto --tolerance SPEC --calib-data DATA): the
// builder chooses each layer's precision itself, the fastest assignment whose outputs stay within a
// stated tolerance of the FP32 engine's on held-back inputs.
//
//  1. The FP32 engine (the reference) and one engine per reduced precision with every layer in it
//     (INT8: calibrated once, the ranges kept in a calibration cache the later builds reuse; BF16)
//     say which layers can compute in what: a unit is a layer of the FP32 engine (a conv or matrix
//     product with its fused epilogue, a pooling layer, ...) whose ONNX nodes compute in a reduced
//     precision in one of those engines.
//  2. Sensitivity: per unit and candidate precision, an engine with only that unit reduced; its
//     output error on the calibration inputs (tolerance-relative for atol/rtol, the normalized squared
//     error for top-k) and the time it saves (the tuner's timings, from the shared timing cache) rank
//     the candidates. A candidate that saves no time is dropped.
//  3. Search: the units, least sensitive first, each at its fastest candidate; the longest prefix that
//     meets the tolerance on the HELD-BACK inputs (batches after --calib-batches) is found by
//     bisection; the unit after it stays at its next candidate or FP32, and the search goes on with
//     the rest, within a build budget.
// The chosen engine records the tolerance, the ranking, the assignment and the held-back figures in
// its build record ("auto_precision"), which kiln inspect shows.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "ir/graph.h"
#include "kiln/kiln.h"

namespace kiln::detail {

struct EngineImpl;

/// One --tolerance: "OUTPUT:atol=A,rtol=R" (every element |got - ref| <= A + R*|ref|, numpy's
/// allclose) or "OUTPUT:topK=Q" (the reference's top-1 class, along the last dim, is among the
/// candidate's top K for at least a share Q of the rows).
struct Tolerance {
  enum class Kind { kClose, kTopK };
  std::string spec;  // as given
  std::string output;
  Kind kind = Kind::kClose;
  double atol = 0, rtol = 0;
  int k = 1;
  double agreement = 1;
};
Result<Tolerance> parse_tolerance(const std::string& spec);

/// One output's error against the reference, accumulated over batches.
struct OutputError {
  int64_t elements = 0, violations = 0;  // kClose: elements outside atol + rtol*|ref|
  double worst_ratio = 0;                // kClose: max |d| / (atol + rtol*|ref|) (inf when the bound is 0)
  double max_abs = 0;
  double sq_err = 0, sq_ref = 0;  // normalized squared error: sq_err / sq_ref
  int64_t rows = 0, agree = 0;    // kTopK
};
// Adds one batch's `got` against `ref` (same shape, float32; error when not).
Status accumulate_error(const Tolerance& t, const Tensor& ref, const Tensor& got, OutputError* e);
bool tolerance_met(const Tolerance& t, const OutputError& e);
// The ranking's key: kClose the worst tolerance ratio, kTopK the normalized squared error.
double sensitivity_of(const Tolerance& t, const OutputError& e);
// "agreement 99.61% (255/256, need 99.50%)", "max |d| 0.0123 (worst 0.41 of the tolerance)".
std::string describe_error(const Tolerance& t, const OutputError& e);

/// The whole --precision auto build (BuilderConfig::auto_precision); build_engine calls it.
Result<std::shared_ptr<EngineImpl>> build_auto_precision(const ir::Model& model, const BuilderConfig& cfg);

}  // namespace kiln::detail
