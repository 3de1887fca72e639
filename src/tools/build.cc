// kiln build: ONNX model -> optimized engine file (trtexec-like options).
#include <chrono>
#include <cstdio>

#include "engine/engine_impl.h"
#include "kiln/kiln.h"
#include "tools/commands.h"

namespace kiln::tools {

namespace {
struct BuildOptions {
  std::string model, output;
  std::string min_shapes, opt_shapes, max_shapes, shapes;
  bool fp32 = false, fp16 = false, bf16 = false, int8 = false;
  std::string workspace = "1G", activation_memory = "1G";
  bool verbose = false, strict_tactics = false;
  std::vector<std::string> disabled_passes;
  std::vector<std::string> tactics;
  std::string timing_cache;
  std::vector<std::string> profiles;  // --profile, repeatable
};
}  // namespace

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

void add_build_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<BuildOptions>();
  CLI::App* cmd = app.add_subcommand("build", "Build an optimized engine from an ONNX model");
  cmd->add_option("model", o->model, "model.onnx")->required();
  cmd->add_option("-o,--output", o->output, "engine file to write (model.kiln)")->required();
  cmd->add_option("--min-shapes", o->min_shapes, "NAME:1x3x224x224,... smallest shapes of dynamic inputs");
  cmd->add_option("--opt-shapes", o->opt_shapes, "shapes to tune and plan memory for");
  cmd->add_option("--max-shapes", o->max_shapes, "largest shapes of dynamic inputs");
  cmd->add_option("--shapes", o->shapes, "fixed shapes (min = opt = max)");
  cmd->add_option("--profile", o->profiles,
                  "an optimization profile, repeatable: [NAME=]INPUT:MIN/OPT/MAX[,INPUT:MIN/OPT/MAX...], e.g. "
                  "small=x:1x3x224x224/2x3x224x224/4x3x224x224 (dims separated by x; INPUT:DIMS fixes an input). "
                  "Inputs whose symbolic dims another input of the profile binds may be left out. At run time the "
                  "first profile holding every input shape is used. --min/--opt/--max-shapes (or --shapes) form "
                  "the first profile when given");
  cmd->add_flag("--fp32", o->fp32, "FP32 precision (default)");
  cmd->add_flag("--fp16", o->fp16, "FP16 precision (not implemented yet)");
  cmd->add_flag("--bf16", o->bf16, "BF16 precision (not implemented yet)");
  cmd->add_flag("--int8", o->int8, "INT8 precision (not implemented yet)");
  cmd->add_option("--workspace", o->workspace,
                  "the most workspace (tactic scratch) one layer may use at any profile's max shapes, like "
                  "trtexec's --memPoolSize=workspace: SIZE as 64M, 512K, 2G or MiB (default 1G). A layer whose "
                  "kernel needs more fails the build, naming it, the bytes it needs and the limit");
  cmd->add_option("--activation-memory", o->activation_memory,
                  "the most planned activation memory per context at any profile's max shapes: SIZE as for "
                  "--workspace (default 1G)");
  cmd->add_option("--disable-pass", o->disabled_passes, "skip a graph pass by name (repeatable)");
  cmd->add_option("--tactics", o->tactics,
                  "only these kernels (names as kiln inspect shows them, comma-separated); 'reference': "
                  "reference kernels only")
      ->delimiter(',');
  cmd->add_option("--timing-cache", o->timing_cache,
                  "file of tactic timings reused across builds and models on this machine (created if missing; "
                  "safe to share between concurrent builds; a stale, foreign or corrupt one is ignored with a "
                  "warning and moved aside)");
  cmd->add_flag("--strict-tactics", o->strict_tactics,
                "fail (exit code 4) instead of warning when a layer would run its reference kernel, naming "
                "every such layer and why no tactic took it (shape work such as Shape/Reshape is exempt)");
  cmd->add_flag("--verbose", o->verbose, "more detail (each layer's candidates and times)");
  cmd->callback([o, &exit_code]() {
    auto profiles = profiles_from_flags(o->min_shapes, o->opt_shapes, o->max_shapes, o->shapes);
    if (!profiles.ok()) {
      exit_code = report_error(profiles.status());
      return;
    }
    for (const auto& spec : o->profiles) {
      auto p = profile_from_flag(spec);
      if (!p.ok()) {
        exit_code = report_error(p.status());
        return;
      }
      profiles.value().push_back(p.value());
    }
    BuilderConfig cfg;
    cfg.precision = o->fp16   ? Precision::kFP16
                    : o->bf16 ? Precision::kBF16
                    : o->int8 ? Precision::kINT8
                              : Precision::kFP32;
    cfg.profiles = profiles.value();
    auto workspace = parse_size(o->workspace, "--workspace");
    auto activations = parse_size(o->activation_memory, "--activation-memory");
    for (const Status& s : {workspace.status(), activations.status()})
      if (!s.ok()) {
        exit_code = report_error(s);
        return;
      }
    cfg.workspace_bytes = workspace.value();
    cfg.activation_bytes = activations.value();
    cfg.disabled_passes = o->disabled_passes;
    cfg.tactics = o->tactics;
    cfg.timing_cache = o->timing_cache;
    cfg.verbose = o->verbose;
    cfg.strict_tactics = o->strict_tactics;
    cfg.log = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
    try {
      using Clock = std::chrono::steady_clock;
      auto seconds = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double>(b - a).count();
      };
      auto t0 = Clock::now();
      auto engine = Builder(cfg).build_from_file(o->model);
      auto t1 = Clock::now();
      engine->save(o->output);
      auto t2 = Clock::now();
      int reference = 0;
      for (const auto& l : engine->impl().layers) reference += l.finding();
      std::printf(
          "[kiln build] wrote %s: %.2f s in all (loading and building %.2f s, writing %.2f s); %d %s reference "
          "kernels\n",
          o->output.c_str(), seconds(t0, t2), seconds(t0, t1), seconds(t1, t2), reference,
          reference == 1 ? "layer runs" : "layers run");
      exit_code = kExitOk;
    } catch (const Error& e) {
      exit_code = report_error(detail_status(e));
    }
  });
}

}  // namespace kiln::tools
