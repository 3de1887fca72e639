// kiln run: runs a model with the reference interpreter and writes/prints its outputs.
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/npy.h"
#include "engine/engine_impl.h"
#include "onnx/importer.h"
#include "ops/interpreter.h"
#include "tools/commands.h"

namespace kiln::tools {

namespace {
struct RunOptions {
  std::string model;
  std::vector<std::string> inputs;  // NAME=FILE
  std::string inputs_npz;
  std::string output_dir;
  std::string output_format = "npy";  // npy | pb, for --output-dir
  std::string save_outputs;           // all outputs in one .npz
  std::string shapes;
  uint64_t seed = 0;
  std::string expect_outputs;  // .npz with expected outputs by name
  Tolerance tol{1e-3, 1e-4};
};

// Returns whether every expected output matched (true when none were given).
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
  std::map<std::string, ops::Value> inputs;
  auto decl_of = [&](const std::string& name) -> const ir::ValueInfo* {
    for (const auto& in : g.inputs)
      if (in.name == name) return &in;
    return nullptr;
  };
  if (!o.inputs_npz.empty()) {
    KILN_ASSIGN_OR_RETURN(auto entries, read_npz(o.inputs_npz));
    for (auto& [name, t] : entries) inputs[name] = ops::Value(std::move(t));
  }
  for (const auto& spec : o.inputs) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos) return InvalidArgument("--input '", spec, "' must look like NAME=FILE");
    std::string name = spec.substr(0, eq);
    const ir::ValueInfo* decl = decl_of(name);
    if (!decl) return InvalidArgument("'", name, "' is not an input of the model");
    KILN_ASSIGN_OR_RETURN(ops::Value v, read_value_file(spec.substr(eq + 1), &decl->type));
    inputs[name] = std::move(v);
  }
  std::map<std::string, Dims> shapes;
  if (!o.shapes.empty()) {
    KILN_ASSIGN_OR_RETURN(shapes, parse_shapes(o.shapes));
  }
  KILN_RETURN_IF_ERROR(fill_random_inputs(g, o.seed, shapes, inputs));
  for (const auto& [name, v] : inputs) std::printf("input  %s\n", summarize(name, v).c_str());
  std::vector<ops::Value> outs;
  if (is_engine) {
    KILN_ASSIGN_OR_RETURN(outs, detail::run_engine(engine->impl(), inputs));
  } else {
    ops::Interpreter interp(graph);
    KILN_ASSIGN_OR_RETURN(outs, interp.run(inputs));
  }
  if (!o.output_dir.empty()) std::filesystem::create_directories(o.output_dir);
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
  return true;
}
}  // namespace

void add_run_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Run a model (reference interpreter) or an engine (.kiln)");
  cmd->add_option("model", o->model, "model.onnx or model.kiln")->required();
  cmd->add_option("--input", o->inputs, "NAME=FILE (.npy or ONNX .pb), repeatable");
  cmd->add_option("--inputs", o->inputs_npz, "all inputs from one .npz");
  cmd->add_option("--output-dir", o->output_dir, "write each output to DIR/NAME.npy");
  cmd->add_option("--output-format", o->output_format, "file format for --output-dir: npy or pb (TensorProto)")
      ->check(CLI::IsMember({"npy", "pb"}));
  cmd->add_option("--save-outputs", o->save_outputs, "write all outputs to one .npz (by output name)");
  cmd->add_option("--shapes", o->shapes, "shapes for random inputs: NAME:1x3x224x224,...");
  cmd->add_option("--seed", o->seed, "seed for random inputs");
  cmd->add_option("--expect-outputs", o->expect_outputs, "compare outputs with this .npz (by output name)");
  cmd->add_option("--rtol", o->tol.rtol, "relative tolerance for --expect-outputs");
  cmd->add_option("--atol", o->tol.atol, "absolute tolerance for --expect-outputs");
  cmd->callback([o, &exit_code]() {
    auto r = run_model(*o);
    exit_code = !r.ok() ? report_error(r.status()) : (r.value() ? kExitOk : kExitMismatch);
  });
}

}  // namespace kiln::tools
