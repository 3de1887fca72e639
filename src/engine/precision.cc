#include "engine/precision.h"

#include <algorithm>

#include "backends/registry.h"

namespace kiln::engine {

std::string precision_name(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "fp32";
    case DataType::kBFloat16: return "bf16";
    case DataType::kFloat16: return "fp16";
    case DataType::kInt8: return "int8";
    default: return dtype_name(t);
  }
}

bool parse_precision(const std::string& name, Precision* out) {
  static const std::pair<const char*, Precision> names[] = {
      {"fp32", Precision::kFP32}, {"bf16", Precision::kBF16}, {"fp16", Precision::kFP16}, {"int8", Precision::kINT8}};
  for (const auto& [n, p] : names)
    if (name == n) return *out = p, true;
  return false;
}

DataType precision_dtype(Precision p) {
  switch (p) {
    case Precision::kFP32: return DataType::kFloat32;
    case Precision::kBF16: return DataType::kBFloat16;
    case Precision::kFP16: return DataType::kFloat16;
    case Precision::kINT8: return DataType::kInt8;
    case Precision::kMixed: break;
  }
  return DataType::kUndefined;
}

bool glob_match(const std::string& pattern, const std::string& name) {
  // Iterative wildcard match with backtracking to the last '*'.
  size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p, ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++, mark = n;
    } else if (star != std::string::npos) {
      p = star + 1, n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

namespace {

// Whether some tactic computes in `dt` on the target's device; `usable`: one whose CPU features the
// target has. `needs`: the features the tactics of `dt` need, when none is usable.
bool has_kernels(DataType dt, const Target& target, bool* usable, IsaSet* needs) {
  bool any = false;
  *usable = false;
  *needs = kIsaPortable;
  for (const backends::Tactic* t : backends::all_tactics()) {
    backends::TacticInfo info = t->info();
    if (info.device != target.device.kind || !(info.compute == dt || (info.any_float_compute && dtype_is_float(dt))))
      continue;
    any = true;
    if (target.device.kind != DeviceKind::kCPU || (info.isa & ~target.isa) == 0) *usable = true;
    *needs |= info.isa;
  }
  return any;
}

std::string cpu_hint(DataType dt) {
  if (dt == DataType::kFloat16)
    return " (CPUs without AVX-512 FP16, such as AMD Zen 4, have no FP16 arithmetic: FP16 storage with FP32 "
           "compute would only add conversions, so kiln refuses rather than pretend). Build with --bf16 where "
           "the CPU has AVX-512 BF16, or --fp32";
  return " — leave the flag out";
}

}  // namespace

namespace {
// The precisions the flags name: BuilderConfig::precision, then extra_precisions.
std::vector<Precision> asked_precisions(const BuilderConfig& cfg) {
  std::vector<Precision> asked{cfg.precision};
  asked.insert(asked.end(), cfg.extra_precisions.begin(), cfg.extra_precisions.end());
  return asked;
}
}  // namespace

Result<PrecisionPolicy> precision_policy(const BuilderConfig& cfg, const Target& target,
                                         const std::function<void(const std::string&)>& warn) {
  PrecisionPolicy p;
  p.constraints = cfg.precision_constraints;
  p.strongly_typed = cfg.strongly_typed;
  p.allowed = {DataType::kFloat32};
  std::vector<Precision> asked = asked_precisions(cfg);
  const bool best = std::find(asked.begin(), asked.end(), Precision::kMixed) != asked.end();
  if (best) asked = {Precision::kFP32, Precision::kBF16, Precision::kFP16, Precision::kINT8};
  const std::string device = device_name(target.device);
  for (Precision a : asked) {
    DataType dt = precision_dtype(a);
    if (dt == DataType::kFloat32 || std::find(p.allowed.begin(), p.allowed.end(), dt) != p.allowed.end()) continue;
    if (cfg.strongly_typed)
      return InvalidArgument("--strongly-typed takes every layer's precision from the graph's types; --",
                             precision_name(dt), " asks for another — give one or the other");
    bool usable = false;
    IsaSet needs = kIsaPortable;
    if (!has_kernels(dt, target, &usable, &needs)) {
      if (best) continue;  // --best: every precision that has kernels here
      return Unsupported("--", precision_name(dt), ": this kiln has no kernel computing in ", precision_name(dt),
                         " on ", device, target.device.kind == DeviceKind::kCPU ? cpu_hint(dt) : " — leave it out");
    }
    if (!usable) {
      if (!best)
        warn("--" + precision_name(dt) + ": its kernels need " + isa_names(needs) +
             ", which the target lacks (it has " + isa_names(target.isa) +
             "): every layer stays in the other precisions");
      continue;
    }
    p.allowed.push_back(dt);
  }
  for (const LayerPrecision& r : cfg.layer_precisions) {
    if (cfg.strongly_typed)
      return InvalidArgument(
          "--strongly-typed takes every layer's precision from the graph's types; "
          "--layer-precisions '",
          r.pattern, "' asks for another — give one or the other");
    DataType dt = precision_dtype(r.precision);
    if (dt == DataType::kUndefined)
      return InvalidArgument("--layer-precisions '", r.pattern, "': a layer takes fp32, bf16, fp16 or int8");
    p.rules.push_back({r.pattern, dt});
  }
  if (!p.rules.empty() && p.constraints == PrecisionConstraints::kNone)
    warn("--layer-precisions: ignored, since --precision-constraints is none (use prefer or obey)");
  return p;
}

namespace {
const PrecisionPolicy::Rule* matching_rule(const PrecisionPolicy& p, const std::vector<std::string>& names) {
  if (p.constraints == PrecisionConstraints::kNone) return nullptr;
  for (const auto& r : p.rules)
    for (const auto& n : names)
      if (!n.empty() && glob_match(r.pattern, n)) return &r;
  return nullptr;
}
}  // namespace

LayerPrecisions layer_precisions(const PrecisionPolicy& p, const std::vector<std::string>& names, DataType data_dtype) {
  LayerPrecisions lp;
  const bool float_data =
      data_dtype == DataType::kFloat32 || data_dtype == DataType::kBFloat16 || data_dtype == DataType::kFloat16;
  if (p.strongly_typed) {
    lp.allowed = {float_data ? data_dtype : DataType::kFloat32};
    return lp;
  }
  lp.allowed = p.allowed;
  // A layer whose input the graph gives as 8-bit integers (explicit quantization: Q/DQ folded,
  // QLinearConv, MatMulInteger) may compute in int8 whatever the flags: the graph says so.
  if ((data_dtype == DataType::kInt8 || data_dtype == DataType::kUInt8) &&
      std::find(lp.allowed.begin(), lp.allowed.end(), DataType::kInt8) == lp.allowed.end())
    lp.allowed.insert(lp.allowed.begin(), DataType::kInt8);
  // Layer precisions constrain floating-point arithmetic: integer and boolean layers (shape
  // computations, indices, masks) are left to their kernels.
  if (!float_data) return lp;
  if (const PrecisionPolicy::Rule* r = matching_rule(p, names)) {
    lp.required = r->precision;
    lp.rule = r->pattern + ":" + precision_name(r->precision);
    lp.fallback = p.allowed;
    lp.allowed = {r->precision};
  }
  return lp;
}

bool layer_pinned_fp32(const PrecisionPolicy& p, const std::vector<std::string>& names) {
  const PrecisionPolicy::Rule* r = matching_rule(p, names);
  return r && r->precision == DataType::kFloat32;
}

bool int8_requested(const BuilderConfig& cfg) {
  const std::vector<Precision> asked = asked_precisions(cfg);
  auto has = [&](Precision x) { return std::find(asked.begin(), asked.end(), x) != asked.end(); };
  return has(Precision::kINT8) || (has(Precision::kMixed) && (!cfg.calib_data.empty() || !cfg.calib_cache.empty()));
}

}  // namespace kiln::engine
