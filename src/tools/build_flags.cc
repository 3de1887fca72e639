// The engine-build flags shared by kiln build, bench and compare (build_flags.h).
#include "tools/build_flags.h"

#include <cstdio>

#include "core/target.h"
#include "engine/precision.h"
#include "tools/cli_common.h"

namespace kiln::tools {

std::vector<CLI::Option*> add_build_flags(CLI::App* cmd, BuildFlags& f, const char* fixed_shapes_flag) {
  const char* group = "Engine build";
  std::vector<CLI::Option*> all;
  auto opt = [&](const std::string& name, auto& var, const std::string& help) {
    all.push_back(cmd->add_option(name, var, help)->group(group));
    return all.back();
  };
  auto flag = [&](const std::string& name, bool& var, const std::string& help) {
    all.push_back(cmd->add_flag(name, var, help)->group(group));
    return all.back();
  };
  opt("--min-shapes", f.min_shapes,
      "NAME:1x3x224x224,... smallest shapes of dynamic inputs (with --opt-shapes and --max-shapes: the first "
      "profile)");
  opt("--opt-shapes", f.opt_shapes, "shapes to tune and plan memory for");
  opt("--max-shapes", f.max_shapes, "largest shapes of dynamic inputs");
  if (fixed_shapes_flag)
    opt(fixed_shapes_flag, f.build_shapes, "fixed build shapes NAME:1x3x224x224,... (min = opt = max)");
  opt("--profile", f.profiles,
      "an optimization profile, repeatable: [NAME=]INPUT:MIN/OPT/MAX[,INPUT:MIN/OPT/MAX...], e.g. "
      "small=x:1x3x224x224/2x3x224x224/4x3x224x224 (dims separated by x; INPUT:DIMS fixes an input). Inputs whose "
      "symbolic dims another input of the profile binds may be left out. At run time the first profile holding "
      "every input shape is used. --min/--opt/--max-shapes (or the fixed shapes) form the first profile when given");
  flag("--fp32", f.fp32, "FP32 precision (default; always allowed, whatever else is)");
  flag("--fp16", f.fp16,
       "allow FP16. --device cuda: layers with an FP16 kernel keep their activations and weights in FP16 "
       "(FP32 accumulation), Casts where they meet FP32 layers, engine inputs/outputs in the model's dtypes. "
       "Refused on the CPU, which has no FP16 kernels in kiln (CPUs without AVX-512 FP16, such as AMD "
       "Zen 4, have no FP16 arithmetic; FP16 storage with FP32 compute would only add conversions)");
  flag("--bf16", f.bf16,
       "allow BF16 (CPU: oneDNN's AVX-512 BF16 kernels for convolutions and matrix products: bf16 inputs and "
       "weights, fp32 accumulation and outputs), timed per layer against FP32, the faster kept. Without "
       "avx512_bf16: a warning, and the layers stay FP32. --device cuda: as --fp16, in BF16");
  flag("--best", f.best, "allow every precision that has kernels here; the fastest per layer, by timing");
  opt("--layer-precisions", f.layer_precisions,
      "NAME_OR_GLOB:fp32|bf16|fp16|int8,... the precision of the layers whose name (or source ONNX node's name) "
      "matches; the first matching entry wins; honoured as --precision-constraints says");
  opt("--precision-constraints", f.precision_constraints,
      "obey (a layer precision that no kernel meets fails the build, naming the layer), prefer (default: warn and "
      "use the build's precisions) or none (ignore --layer-precisions)");
  flag("--strongly-typed", f.strongly_typed,
       "every layer computes in the type the graph gives its tensors: reduced precision only where the graph "
       "says so (no --bf16/--fp16/--best/--layer-precisions with it)");
  flag("--int8", f.int8,
       "INT8: calibrate on --calib-data (or reuse --calib-cache) and insert QuantizeLinear/DequantizeLinear nodes "
       "(per-channel int8 weights, per-tensor uint8 activations); a model with Q/DQ nodes builds as it is");
  opt("--calib-data", f.calib_data,
      "INT8 calibration inputs: a directory of .npy/.npz files (each a batch; .npz entries named by input) or one "
      ".npz of stacked inputs (cut into --calib-batch-size rows)");
  opt("--calib-batches", f.calib_batches, "use at most N calibration batches (default: all)");
  opt("--calib-batch-size", f.calib_batch_size, "rows per batch of a stacked --calib-data .npz (default 32)");
  opt("--calibrator", f.calibrator,
      "minmax (default: observed range), entropy (TensorRT's KL divergence), percentile, mse")
      ->check(CLI::IsMember({"minmax", "entropy", "percentile", "mse"}));
  opt("--calib-percentile", f.calib_percentile, "the percentile calibrator's percentile of |x| (default 99.99)");
  opt("--calib-cache", f.calib_cache,
      "calibration ranges file: written after calibrating, reused by later builds of the same model and calibrator "
      "without data (a stale, foreign or corrupt one is refused with a warning)");
  opt("--isa", f.isa,
      "instruction set kiln's own kernels may use: native (this machine's best, default), portable, avx2, avx512, "
      "avx512_vnni, avx512_bf16, amx (each includes the ones before it; at most what this machine has). Recorded in "
      "the engine and in the timing cache keys; oneDNN picks its own");
  opt("--layout-block", f.layout_block,
      "channels per block of the blocked conv layout: auto (default: 16 with AVX-512, 8 with AVX2, 0 without either "
      "or without oneDNN), 0 (plain NCHW), 8 or 16. Recorded in the engine");
  opt("--channels-last", f.channels_last,
      "keep conv/pool activations channels-last (NHWC) between layers: auto (default: CUDA builds allowing fp16 or "
      "bf16, whose tensor cores are NHWC-native; CPU --bf16 builds on a CPU with AMX, whose tile kernels oneDNN runs "
      "on NHWC bf16 only), on (CUDA: every float build; CPU: the AMX bf16 path, refused without it), off. Recorded "
      "in the engine");
  opt("--workspace", f.workspace,
      "the most workspace (tactic scratch) one layer may use at any profile's max shapes, like trtexec's "
      "--memPoolSize=workspace: SIZE as 64M, 512K, 2G or MiB (default 1G). A layer whose kernel needs more fails the "
      "build, naming it, the bytes it needs and the limit");
  opt("--activation-memory", f.activation_memory,
      "the most planned activation memory per context at any profile's max shapes: SIZE as for --workspace "
      "(default 1G)");
  opt("--disable-pass", f.disabled_passes, "skip a graph pass by name (repeatable; kiln inspect --passes lists them)");
  opt("--tactics", f.tactics,
      "only these kernels (names as kiln inspect shows them, comma-separated); 'reference': reference kernels only")
      ->delimiter(',');
  opt("--timing-cache", f.timing_cache,
      "file of tactic timings reused across builds and models on this machine (created if missing; safe to share "
      "between concurrent builds; a stale, foreign or corrupt one is ignored with a warning and moved aside)");
  flag("--strict-tactics", f.strict_tactics,
       "fail (exit code 4) instead of warning when a layer would run its reference kernel, naming every such layer "
       "and why no tactic took it (shape work such as Shape/Reshape is exempt), or when a QuantizeLinear/"
       "DequantizeLinear layer is left that no INT8 layer takes (a float conversion around float work)");
  flag("--verbose", f.verbose, "more build detail (each layer's candidates and times)");
  opt("--device", f.device,
      "where the engine runs: cpu (default), cuda (device 0) or cuda:N. A CUDA engine is built on the machine with "
      "that GPU (its kernels are timed there); layers without a CUDA kernel run on the host, reported");
  flag("--tf32", f.tf32, "CUDA: float32 matrix products may use TF32 tensor cores (default: exact float32)");
  flag("--exact-gelu", f.exact_gelu,
       "CUDA, float16/bfloat16: keep GELU (erf) after a matrix product exact, in a pass of its own (default: "
       "cuBLASLt's fused epilogue, GELU's tanh form, at most 4.7e-4 from erf; the build counts such layers)");
  opt("--precision", f.precision,
      "auto: automatic mixed precision, each layer's precision chosen by measured sensitivity and timing, the "
      "fastest assignment meeting every --tolerance on held-back inputs (the --calib-data batches after "
      "--calib-batches); candidates: --int8/--bf16 when given, else every precision with kernels here");
  opt("--tolerance", f.tolerances,
      "with --precision auto, repeatable: OUTPUT:atol=A,rtol=R (every element within A + R*|fp32| of the FP32 "
      "engine's) or OUTPUT:top1=Q (a share Q of the rows keep FP32's top class; topK: among the top K)");
  return all;
}

std::vector<std::string> given_flags(const std::vector<CLI::Option*>& options) {
  std::vector<std::string> names;
  for (const CLI::Option* o : options)
    if (o->count() > 0) names.push_back(o->get_name());
  return names;
}

void warn_ignored_build_flags(const std::vector<std::string>& given, const std::string& engine_file) {
  if (given.empty()) return;
  std::string names;
  for (const auto& n : given) names += (names.empty() ? "" : ", ") + n;
  std::fprintf(stderr, "kiln: warning: %s: build flags, ignored: '%s' is an engine built already\n", names.c_str(),
               engine_file.c_str());
}

Result<BuilderConfig> builder_config(const BuildFlags& f) {
  BuilderConfig cfg;
  KILN_ASSIGN_OR_RETURN(cfg.profiles, profiles_from_flags(f.min_shapes, f.opt_shapes, f.max_shapes, f.build_shapes));
  for (const auto& spec : f.profiles) {
    KILN_ASSIGN_OR_RETURN(Profile p, profile_from_flag(spec));
    cfg.profiles.push_back(std::move(p));
  }
  cfg.precision = f.fp16 ? Precision::kFP16 : f.bf16 ? Precision::kBF16 : f.int8 ? Precision::kINT8 : Precision::kFP32;
  // The flags combine (TensorRT's builder flags): each one given allows its precision.
  if (f.bf16 && cfg.precision != Precision::kBF16) cfg.extra_precisions.push_back(Precision::kBF16);
  if (f.int8 && cfg.precision != Precision::kINT8) cfg.extra_precisions.push_back(Precision::kINT8);
  if (f.best) cfg.extra_precisions.push_back(Precision::kMixed);
  cfg.strongly_typed = f.strongly_typed;
  KILN_ASSIGN_OR_RETURN(cfg.layer_precisions, layer_precisions_from_flag(f.layer_precisions));
  if (f.precision_constraints == "obey")
    cfg.precision_constraints = PrecisionConstraints::kObey;
  else if (f.precision_constraints == "prefer")
    cfg.precision_constraints = PrecisionConstraints::kPrefer;
  else if (f.precision_constraints == "none")
    cfg.precision_constraints = PrecisionConstraints::kNone;
  else
    return InvalidArgument("--precision-constraints '", f.precision_constraints, "': one of obey, prefer, none");
  KILN_ASSIGN_OR_RETURN(cfg.workspace_bytes, parse_size(f.workspace, "--workspace"));
  KILN_ASSIGN_OR_RETURN(cfg.activation_bytes, parse_size(f.activation_memory, "--activation-memory"));
  cfg.disabled_passes = f.disabled_passes;
  cfg.tactics = f.tactics;
  cfg.timing_cache = f.timing_cache;
  cfg.isa = f.isa;
  if (f.layout_block == "auto") {
    cfg.layout_block = -1;
  } else if (f.layout_block == "0" || f.layout_block == "8" || f.layout_block == "16") {
    cfg.layout_block = std::stoi(f.layout_block);
  } else {
    return InvalidArgument("--layout-block ", f.layout_block, ": one of auto, 0 (plain NCHW), 8, 16");
  }
  if (f.channels_last == "auto" || f.channels_last == "on" || f.channels_last == "off")
    cfg.channels_last = f.channels_last == "auto" ? -1 : f.channels_last == "on" ? 1 : 0;
  else
    return InvalidArgument("--channels-last ", f.channels_last, ": one of auto, on, off");
  cfg.strict_tactics = f.strict_tactics;
  cfg.verbose = f.verbose;
  if (!f.precision.empty() && f.precision != "auto")
    return InvalidArgument("--precision '", f.precision,
                           "': only 'auto' (automatic mixed precision); for one precision use --fp32, --bf16, --int8 "
                           "or --best");
  cfg.auto_precision = f.precision == "auto";
  cfg.tolerances = f.tolerances;
  if (!cfg.auto_precision && !f.tolerances.empty())
    return InvalidArgument("--tolerance is the target of --precision auto: add --precision auto");
  if (cfg.auto_precision && f.best)
    return InvalidArgument(
        "--precision auto chooses among the precisions itself: leave out --best (or name the "
        "candidates with --int8 / --bf16)");
  if (!f.int8 && !f.best && !cfg.auto_precision && (!f.calib_data.empty() || !f.calib_cache.empty()))
    return InvalidArgument("--calib-data / --calib-cache calibrate an INT8 build: add --int8 (or --best)");
  cfg.calib_data = f.calib_data;
  cfg.calib_batches = f.calib_batches;
  cfg.calib_batch_size = f.calib_batch_size;
  cfg.calibrator = f.calibrator;
  cfg.calib_percentile = f.calib_percentile;
  cfg.calib_cache = f.calib_cache;
  if (!parse_device(f.device, &cfg.device))
    return InvalidArgument("--device '", f.device, "': one of cpu, cuda, cuda:N");
  cfg.tf32 = f.tf32;
  cfg.exact_gelu = f.exact_gelu;
  return cfg;
}

Result<std::vector<LayerPrecision>> layer_precisions_from_flag(const std::string& spec) {
  std::vector<LayerPrecision> out;
  if (spec.empty()) return out;
  for (size_t pos = 0; pos <= spec.size();) {
    size_t comma = spec.find(',', pos);
    std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? spec.size() + 1 : comma + 1;
    size_t c = item.rfind(':');
    LayerPrecision lp;
    if (c == std::string::npos || c == 0 || !engine::parse_precision(item.substr(c + 1), &lp.precision))
      return InvalidArgument("--layer-precisions item '", item,
                             "' must look like NAME_OR_GLOB:PRECISION with PRECISION one of fp32, bf16, fp16, int8 "
                             "(e.g. '/encoder/layer.0/*:fp32')");
    lp.pattern = item.substr(0, c);
    out.push_back(std::move(lp));
  }
  return out;
}

// One --profile value: "[PROFILE=]INPUT:MIN/OPT/MAX[,INPUT:MIN/OPT/MAX...]" with dims like 1x3x224x224;
// "INPUT:DIMS" alone fixes that input (min = opt = max).
Result<Profile> profile_from_flag(const std::string& spec) {
  Profile p;
  std::string body = spec;
  size_t eq = spec.find('='), colon = spec.find(':');
  if (eq != std::string::npos && (colon == std::string::npos || eq < colon)) {
    p.name = spec.substr(0, eq);
    body = spec.substr(eq + 1);
  }
  if (body.empty()) return InvalidArgument("--profile '", spec, "' gives no input shapes");
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t comma = body.find(',', pos);
    std::string item = body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? body.size() + 1 : comma + 1;
    size_t c = item.rfind(':');
    if (c == std::string::npos || c == 0)
      return InvalidArgument("--profile item '", item, "' must look like INPUT:MIN/OPT/MAX, e.g. x:1x3x224x224/",
                             "4x3x224x224/8x3x224x224");
    std::string name = item.substr(0, c), ranges = item.substr(c + 1);
    std::vector<std::string> parts;
    for (size_t q = 0;;) {
      size_t slash = ranges.find('/', q);
      parts.push_back(ranges.substr(q, slash == std::string::npos ? std::string::npos : slash - q));
      if (slash == std::string::npos) break;
      q = slash + 1;
    }
    if (parts.size() == 1) parts = {parts[0], parts[0], parts[0]};
    if (parts.size() != 3)
      return InvalidArgument("--profile item '", item, "': give MIN/OPT/MAX (three shapes) or one fixed shape");
    std::vector<Dims> d;
    for (const auto& part : parts) {
      KILN_ASSIGN_OR_RETURN(auto m, parse_shapes(name + ":" + part));
      d.push_back(m.begin()->second);
    }
    if (p.inputs.count(name)) return InvalidArgument("--profile '", spec, "' gives input '", name, "' twice");
    p.inputs[name] = {d[0], d[1], d[2]};
  }
  return p;
}

Result<std::vector<Profile>> profiles_from_flags(const std::string& min_s, const std::string& opt_s,
                                                 const std::string& max_s, const std::string& shapes) {
  std::map<std::string, Dims> mn, op, mx;
  if (!shapes.empty()) {
    KILN_ASSIGN_OR_RETURN(mn, parse_shapes(shapes));
    op = mx = mn;
  }
  if (!min_s.empty() || !opt_s.empty() || !max_s.empty()) {
    if (min_s.empty() || opt_s.empty() || max_s.empty())
      return InvalidArgument(
          "give all three of --min-shapes, --opt-shapes and --max-shapes (or --shapes for a fixed shape)");
    KILN_ASSIGN_OR_RETURN(mn, parse_shapes(min_s));
    KILN_ASSIGN_OR_RETURN(op, parse_shapes(opt_s));
    KILN_ASSIGN_OR_RETURN(mx, parse_shapes(max_s));
  }
  if (mn.empty()) return std::vector<Profile>{};
  Profile p;
  for (const auto& [name, d] : mn) {
    if (!op.count(name) || !mx.count(name))
      return InvalidArgument("input '", name, "' has a --min-shapes entry but no --opt-shapes/--max-shapes entry");
    const Dims &o = op[name], &x = mx[name];
    if (o.size() != d.size() || x.size() != d.size())
      return InvalidArgument("input '", name, "': min ", dims_str(d), ", opt ", dims_str(o), " and max ", dims_str(x),
                             " differ in rank");
    for (size_t i = 0; i < d.size(); ++i)
      if (!(d[i] <= o[i] && o[i] <= x[i]))
        return InvalidArgument("input '", name, "' dim ", i, ": need min <= opt <= max, got ", d[i], ", ", o[i], ", ",
                               x[i]);
    p.inputs[name] = {d, o, x};
  }
  for (const auto& [name, d] : op)
    if (!mn.count(name))
      return InvalidArgument("input '", name, "' has an --opt-shapes entry but no --min-shapes entry");
  return std::vector<Profile>{p};
}

}  // namespace kiln::tools
