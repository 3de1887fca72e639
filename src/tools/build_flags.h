// The engine-build flags shared by kiln build, bench and compare: one place registers them (same
// names, same help) and turns them into a BuilderConfig.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "core/status.h"
#include "kiln/kiln.h"

namespace kiln::tools {

struct BuildFlags {
  std::string min_shapes, opt_shapes, max_shapes;
  std::string build_shapes;           // fixed shapes (min = opt = max): build --shapes, compare --build-shapes
  std::vector<std::string> profiles;  // --profile, repeatable
  bool fp32 = false, fp16 = false, bf16 = false, int8 = false;
  std::string workspace = "1G", activation_memory = "1G";  // SIZE: 64M, 512K, 2G, 4096B, or MiB
  std::vector<std::string> disabled_passes;
  std::vector<std::string> tactics;
  std::string timing_cache;
  std::string isa = "native", layout_block = "auto", channels_last = "auto";
  bool strict_tactics = false, verbose = false;
  bool best = false, strongly_typed = false;  // --best, --strongly-typed
  std::string layer_precisions;               // NAME_OR_GLOB:fp32|bf16|fp16|int8,...
  std::string precision_constraints = "prefer";
  // --int8 calibration (BuilderConfig::calib_*)
  std::string calib_data, calibrator = "minmax", calib_cache;
  int calib_batches = 0, calib_batch_size = 32;
  double calib_percentile = 99.99;
  std::string device = "cpu";  // --device: cpu, cuda, cuda:N
  bool tf32 = false;
  bool exact_gelu = false;
  std::string precision;                // --precision auto (automatic mixed precision)
  std::vector<std::string> tolerances;  // --tolerance, repeatable
};
// As kiln compare's repro bundles record them (bundle.json "options"; flat, beside compare's own).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(BuildFlags, min_shapes, opt_shapes, max_shapes, build_shapes, profiles,
                                                fp32, fp16, bf16, int8, workspace, activation_memory, disabled_passes,
                                                tactics, timing_cache, isa, layout_block, channels_last, strict_tactics,
                                                verbose, best, strongly_typed, layer_precisions, precision_constraints,
                                                calib_data, calibrator, calib_cache, calib_batches, calib_batch_size,
                                                calib_percentile, device, tf32, exact_gelu, precision, tolerances)

// Registers the build flags on `cmd` in the option group "Engine build": --min-shapes, --opt-shapes,
// --max-shapes, --profile, --fp32/--fp16/--bf16/--int8, --isa, --layout-block, --workspace, --activation-memory,
// --disable-pass, --tactics,
// --timing-cache, --strict-tactics, --verbose, and the fixed-shape flag under the name
// `fixed_shapes_flag` ("--shapes" for kiln build, "--build-shapes" for compare; nullptr: none, the
// command fills f.build_shapes itself, as bench does from its --shapes). Returns the options.
std::vector<CLI::Option*> add_build_flags(CLI::App* cmd, BuildFlags& f, const char* fixed_shapes_flag);
// The names of those options given on the command line (after parsing).
std::vector<std::string> given_flags(const std::vector<CLI::Option*>& options);
// A warning (stderr) that the given build flags do nothing for an engine file, built already.
void warn_ignored_build_flags(const std::vector<std::string>& given, const std::string& engine_file);

// The BuilderConfig the flags ask for (profiles parsed and validated). Leaves cfg.log and cfg.warn
// to the caller (the builder's defaults print to stderr).
Result<BuilderConfig> builder_config(const BuildFlags& f);

// --layer-precisions: "NAME_OR_GLOB:PRECISION,..." (fp32, bf16, fp16, int8).
Result<std::vector<LayerPrecision>> layer_precisions_from_flag(const std::string& spec);
// One --profile value: "[PROFILE=]INPUT:MIN/OPT/MAX[,INPUT:MIN/OPT/MAX...]" with dims like 1x3x224x224;
// "INPUT:DIMS" alone fixes that input (min = opt = max).
Result<Profile> profile_from_flag(const std::string& spec);
// min/opt/max flags (trtexec syntax) -> profiles, validated (ranks, min <= opt <= max).
Result<std::vector<Profile>> profiles_from_flags(const std::string& min_s, const std::string& opt_s,
                                                 const std::string& max_s, const std::string& shapes);

}  // namespace kiln::tools
