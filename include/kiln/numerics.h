/// The numerics guard (ExecutionContext::set_numerics_check, `kiln run --check-numerics`,
/// `kiln compare --check-numerics`): checks every layer's outputs in execution order, the layers of
/// If/Loop/Scan bodies included, and names the first layer that
///   - produces Inf or NaN (an error);
///   - holds a value beyond FP16's range (|x| > 65504): an error where the layer runs in FP16, a
///     warning where it does not (an FP32 layer: the value predicts trouble under --fp16);
///   - saturates INT8: for a layer producing int8/uint8 values, the share of values clipped at the
///     type's min/max (QuantizeLinear: exactly the elements its input put outside the range, except
///     at a limit equal to the zero point, which clamps at real 0 like a folded ReLU; other
///     layers: the values at either limit, a limit equal to the output's zero point left out) above a
///     threshold (an error).
/// Each finding carries the offending range, the count of bad values and the ranges of the layer's
/// inputs. Off by default, and free when off; while on, runs take the observing path (the
/// interpreter loop, not the allocation-free bound path), which costs time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

struct NumericsCheck {
  bool enabled = false;
  /// An int8/uint8 output is reported when more than this share of its values is clipped.
  double int8_saturation = 0.01;
  /// Findings kept per run (the first of each kind are always kept).
  int max_findings = 100;
};

/// Range of one tensor a layer read or wrote.
struct NumericsRange {
  std::string name;
  std::string dtype;  ///< "float32", "int8", ...
  std::vector<int64_t> shape;
  bool observed = false;    ///< false: not a numeric tensor (a sequence, strings, absent)
  double min = 0, max = 0;  ///< over the finite values (0, 0 when there are none)
  int64_t nan = 0, inf = 0, elements = 0;
};

struct NumericsFinding {
  enum class Kind { kNonFinite, kFP16Overflow, kINT8Saturation };
  Kind kind = Kind::kNonFinite;
  bool warning = false;    ///< FP16 range exceeded by a layer that does not run in FP16
  int64_t index = 0;       ///< position of the layer in execution order (bodies included)
  std::string layer;       ///< the layer's name; a body layer's path: "If_3/then_branch/Mul_5"
  std::string op_type;     ///< "Conv", "kiln.FusedConv", ...
  std::string precision;   ///< the precision the layer runs in: fp32, fp16, bf16, int8
  std::string output;      ///< the offending output tensor
  NumericsRange range;     ///< its range
  int64_t bad = 0;         ///< values that are non-finite / beyond 65504 / clipped
  double share = 0;        ///< bad / elements
  bool introduced = true;  ///< false when an input of the layer already had this kind of problem
  std::vector<NumericsRange> inputs;
  std::string message;  ///< one sentence naming all of the above
};

/// A run's verdict: the findings in execution order and the layers checked.
struct NumericsReport {
  std::vector<NumericsFinding> findings;
  int64_t layers_checked = 0;
  int64_t propagated = 0;        ///< later findings that only carry a problem an input already had
  int64_t findings_dropped = 0;  ///< beyond max_findings
  /// The first error (not a warning), or nullptr when there is none.
  const NumericsFinding* first_error() const {
    for (const auto& f : findings)
      if (!f.warning) return &f;
    return nullptr;
  }
};

const char* numerics_kind_name(NumericsFinding::Kind k);  ///< "nan/inf", "fp16-range", "int8-saturation"

}  // namespace kiln
