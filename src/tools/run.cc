// kiln run: runs a model with the reference interpreter, or an engine, and writes/prints its
// outputs; --check-numerics names the first layer producing Inf/NaN, exceeding FP16's range or
// saturating INT8 (engine/numerics_guard.h).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/npy.h"
#include "engine/engine_impl.h"
#include "engine/numerics_guard.h"
#include "onnx/importer.h"
#include "ops/deadline.h"
#include "ops/interpreter.h"
#include "tools/commands.h"
#include "tools/inputs.h"

namespace kiln::tools {

namespace {
struct RunOptions {
  std::string model;
  InputOptions in;
  std::string output_dir;
  std::string output_format = "npy";  // npy | pb, for --output-dir
  std::string save_outputs;           // all outputs in one .npz
  int profile_index = -1;             // engines: force a profile
  std::string expect_outputs;         // .npz with expected outputs by name
  Tolerance tol{1e-3, 1e-4};
  double deadline_s = 0;      // --deadline; 0: none
  NumericsCheck numerics;     // --check-numerics, --int8-saturation
  std::string numerics_json;  // --numerics-json FILE
  bool cuda_graph = false;    // --use-cuda-graph (device engines)
};

// A directory to write into: created when missing; an existing file there is an error.
Status prepare_output_dir(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec))
    return InvalidArgument("--output-dir '", dir, "' exists and is not a directory");
  std::filesystem::create_directories(dir, ec);
  if (ec) return IOError("cannot create --output-dir '", dir, "': ", ec.message());
  return Status::Ok();
}

// Returns whether every expected output matched (true when none were given) and the numerics guard
// found no error.
Result<bool> run_model(const RunOptions& o) {
  // An engine file runs through an ExecutionContext, a model through the reference interpreter.
  bool is_engine = o.model.size() > 5 && o.model.compare(o.model.size() - 5, 5, ".kiln") == 0;
  std::shared_ptr<Engine> engine;
  std::shared_ptr<const ir::Graph> graph;
  if (is_engine) {
    try {
      engine = Engine::load(o.model);
    } catch (const Error& e) {
      return detail_status(e);
    }
    graph = engine->impl().model.graph;
  } else {
    KILN_ASSIGN_OR_RETURN(ir::Model model, onnx_import::load_model(o.model));
    KILN_RETURN_IF_ERROR(ops::check_supported(*model.graph));
    graph = model.graph;
  }
  const ir::Graph& g = *graph;
  if (!o.output_dir.empty()) KILN_RETURN_IF_ERROR(prepare_output_dir(o.output_dir));
  std::map<std::string, Dims> shapes;
  if (is_engine) {  // random dynamic inputs default to the opt shapes of the profile
    auto profiles = engine->profiles();
    if (!profiles.empty()) {
      const Profile& p =
          profiles[o.profile_index >= 0 && o.profile_index < static_cast<int>(profiles.size()) ? o.profile_index : 0];
      for (const auto& [name, r] : p.inputs) shapes[name] = r.opt;
    }
  }
  KILN_ASSIGN_OR_RETURN(LoadedInputs loaded, load_inputs(o.in, g, shapes));
  const std::map<std::string, ops::Value>& inputs = loaded.values;
  for (const auto& [name, v] : inputs) std::printf("input  %s\n", summarize(name, v).c_str());
  std::vector<ops::Value> outs;
  ops::DeadlineScope deadline(deadline_after(o.deadline_s));  // the engine's and the interpreter's run
  NumericsReport numerics;
  if (is_engine) {
    detail::RunInfo info;
    if (o.numerics.enabled && o.cuda_graph) {
      return InvalidArgument(
          "--use-cuda-graph and --check-numerics: the guard observes every layer, which a "
          "replayed graph does not show it — give one or the other");
    } else if (o.cuda_graph) {
      detail::DeviceRunStats st;
      KILN_ASSIGN_OR_RETURN(outs, detail::run_engine_graphed(engine->impl(), inputs, o.profile_index, &info, &st));
      if (st.graph_blocker.empty())
        std::printf("cuda graph: captured %d time(s), outputs from a replay\n", st.graph_captures);
      else
        std::printf("cuda graph: not used: %s (outputs from a layer-by-layer run)\n", st.graph_blocker.c_str());
    } else if (o.numerics.enabled) {
      KILN_ASSIGN_OR_RETURN(
          outs, detail::run_engine_checked(engine->impl(), inputs, o.numerics, &numerics, o.profile_index, &info));
    } else {
      KILN_ASSIGN_OR_RETURN(outs, detail::run_engine(engine->impl(), inputs, o.profile_index, &info));
    }
    if (info.profile >= 0)
      std::printf("profile %d '%s'\n", info.profile, engine->profiles()[info.profile].name.c_str());
    std::printf("memory activation %zu bytes\n", info.activation_bytes);
  } else {
    ops::Interpreter interp(graph);
    std::unique_ptr<engine::NumericsGuard> guard;
    if (o.numerics.enabled) {
      guard = std::make_unique<engine::NumericsGuard>(graph, o.numerics);
      guard->attach(interp);
      guard->begin_run(inputs);
    }
    KILN_ASSIGN_OR_RETURN(outs, interp.run(inputs));
    if (guard) numerics = guard->report();
  }
  bool numerics_ok = true;
  if (o.numerics.enabled) {
    std::string who = is_engine ? "engine " + o.model : "reference interpreter";
    for (const auto& line : engine::numerics_lines(numerics, who)) std::printf("%s\n", line.c_str());
    numerics_ok = numerics.first_error() == nullptr;
    if (!o.numerics_json.empty()) {
      std::ofstream f(o.numerics_json);
      f << engine::numerics_json(numerics).dump(1) << "\n";
      if (!f) return IOError("cannot write --numerics-json '", o.numerics_json, "'");
    }
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string& name = g.outputs[i].name;
    std::printf("output %s\n", summarize(name, outs[i]).c_str());
    if (o.output_dir.empty() || !outs[i].is_tensor()) continue;
    std::string base = o.output_dir + "/" + sanitize_name(name);
    if (o.output_format == "pb")
      KILN_RETURN_IF_ERROR(onnx_import::write_tensor_pb(base + ".pb", outs[i].tensor, name));
    else
      KILN_RETURN_IF_ERROR(write_npy(base + ".npy", outs[i].tensor));
  }
  if (!o.save_outputs.empty()) {
    std::vector<std::pair<std::string, Tensor>> entries;
    for (size_t i = 0; i < outs.size(); ++i)
      if (outs[i].is_tensor()) entries.emplace_back(g.outputs[i].name, outs[i].tensor);
    KILN_RETURN_IF_ERROR(write_npz(o.save_outputs, entries));
  }
  if (!o.expect_outputs.empty()) {
    KILN_ASSIGN_OR_RETURN(auto expected, read_npz(o.expect_outputs));
    int bad = 0;
    for (const auto& [name, want] : expected) {
      size_t i = 0;
      while (i < g.outputs.size() && g.outputs[i].name != name) ++i;
      if (i == g.outputs.size()) return InvalidArgument("expected output '", name, "' is not an output of the model");
      if (!outs[i].is_tensor()) return InvalidArgument("output '", name, "' is not a tensor");
      double max_err = 0;
      Status st = compare_tensor(name, outs[i].tensor, want, o.tol, &max_err);
      std::printf("compare %s: max abs error %.3g (rtol %g, atol %g): %s\n", name.c_str(), max_err, o.tol.rtol,
                  o.tol.atol, st.ok() ? "MATCH" : st.message().c_str());
      bad += !st.ok();
    }
    if (bad) {
      std::printf("%d output(s) differ from the expected values\n", bad);
      return false;
    }
  }
  return numerics_ok;
}
}  // namespace

void add_run_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Run a model (reference interpreter) or an engine (.kiln)");
  cmd->add_option("model", o->model, "model.onnx or model.kiln")->required();
  add_input_options(cmd, o->in);
  cmd->add_option("--output-dir", o->output_dir, "write each output to DIR/NAME.npy");
  cmd->add_option("--output-format", o->output_format, "file format for --output-dir: npy or pb (TensorProto)")
      ->check(CLI::IsMember({"npy", "pb"}));
  cmd->add_option("--save-outputs", o->save_outputs, "write all outputs to one .npz (by output name)");
  cmd->add_option("--profile-index", o->profile_index,
                  "engines: run on this optimization profile (default: the first whose ranges hold the input "
                  "shapes); random inputs take its opt shapes");
  cmd->add_option("--expect-outputs", o->expect_outputs, "compare outputs with this .npz (by output name)");
  cmd->add_option("--rtol", o->tol.rtol, "relative tolerance for --expect-outputs");
  cmd->add_option("--atol", o->tol.atol, "absolute tolerance for --expect-outputs");
  add_deadline_option(cmd, o->deadline_s);
  cmd->add_flag("--use-cuda-graph", o->cuda_graph,
                "device engines: run twice through a CUDA graph (capture, then replay) and print the replay's "
                "outputs, or why the graph could not be used");
  cmd->add_flag("--check-numerics", o->numerics.enabled,
                "name the first layer (bodies included) whose output holds Inf/NaN, exceeds FP16's range (an error "
                "for FP16 layers, a warning otherwise) or saturates INT8; exit 1 on an error. Runs the observing "
                "path (slower)");
  cmd->add_option("--int8-saturation", o->numerics.int8_saturation,
                  "--check-numerics: share of clipped values that makes an int8/uint8 output a finding (default 0.01)")
      ->check(bounded(0, 1));
  cmd->add_option("--numerics-json", o->numerics_json, "--check-numerics: write the findings as JSON to FILE");
  cmd->callback([o, &exit_code]() {
    auto r = run_model(*o);
    exit_code = !r.ok() ? report_error(r.status()) : (r.value() ? kExitOk : kExitMismatch);
  });
}

}  // namespace kiln::tools
