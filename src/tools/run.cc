// kiln run: runs a model with the reference interpreter and writes/prints its outputs.
#include <cstdio>
#include <filesystem>

#include "core/npy.h"
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
  std::string shapes;
  uint64_t seed = 0;
};

Status run_model(const RunOptions& o) {
  KILN_ASSIGN_OR_RETURN(ir::Model model, onnx_import::load_model(o.model));
  KILN_RETURN_IF_ERROR(ops::check_supported(*model.graph));
  const ir::Graph& g = *model.graph;
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
  ops::Interpreter interp(model.graph);
  KILN_ASSIGN_OR_RETURN(std::vector<ops::Value> outs, interp.run(inputs));
  if (!o.output_dir.empty()) std::filesystem::create_directories(o.output_dir);
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string& name = g.outputs[i].name;
    std::printf("output %s\n", summarize(name, outs[i]).c_str());
    if (!o.output_dir.empty() && outs[i].is_tensor())
      KILN_RETURN_IF_ERROR(write_npy(o.output_dir + "/" + sanitize_name(name) + ".npy", outs[i].tensor));
  }
  return Status::Ok();
}
}  // namespace

void add_run_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Run a model with the reference interpreter");
  cmd->add_option("model", o->model, "model.onnx")->required();
  cmd->add_option("--input", o->inputs, "NAME=FILE (.npy or ONNX .pb), repeatable");
  cmd->add_option("--inputs", o->inputs_npz, "all inputs from one .npz");
  cmd->add_option("--output-dir", o->output_dir, "write each output to DIR/NAME.npy");
  cmd->add_option("--shapes", o->shapes, "shapes for random inputs: NAME:1x3x224x224,...");
  cmd->add_option("--seed", o->seed, "seed for random inputs");
  cmd->callback([o, &exit_code]() {
    Status s = run_model(*o);
    exit_code = s.ok() ? kExitOk : report_error(s);
  });
}

}  // namespace kiln::tools
