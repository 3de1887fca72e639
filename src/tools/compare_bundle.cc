// kiln compare repro bundles (--save-failure) and --replay.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/npy.h"
#include "tools/compare_internal.h"

namespace kiln::tools::compare {

namespace {

namespace fs = std::filesystem;

std::string command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()), out, arg;
  for (char c : raw) {
    if (c) {
      arg += c;
      continue;
    }
    bool plain = !arg.empty() &&
                 arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=/.,:@%") ==
                     std::string::npos;
    std::string q = arg;
    if (!plain) {
      q = "'";
      for (char x : arg) q += x == '\'' ? std::string("'\\''") : std::string(1, x);
      q += "'";
    }
    out += (out.empty() ? "" : " ") + q;
    arg.clear();
  }
  return out;
}
}  // namespace

json versions_json(const ir::Model& m) {
  engine::TargetInfo host = engine::detect_host();
  json opsets = json::object();
  for (const auto& [d, v] : m.opset_imports) opsets[d.empty() ? "ai.onnx" : d] = v;
  return {{"kiln", KILN_VERSION},
          {"compiler", std::string(
#if defined(__clang__)
                           "clang "
#elif defined(__GNUC__)
                           "gcc "
#endif
                           ) +
                           __VERSION__},
          {"cpu_model", host.cpu_model},
          {"cpu_cores", host.cores},
          {"isa", host.isa},
          {"model_producer", m.producer_name + " " + m.producer_version},
          {"model_ir_version", m.ir_version},
          {"model_opsets", opsets}};
}

Status write_bundle(const CompareOptions& o, const std::string& dir, const std::map<std::string, ops::Value>& inputs,
                    const std::vector<std::pair<std::string, Tensor>>& ref_out,
                    const std::vector<std::pair<std::string, Tensor>>& test_out, const json& rep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IOError("cannot create '", dir, "': ", ec.message());
  std::vector<std::pair<std::string, Tensor>> ins;
  for (const auto& [k, v] : inputs)
    if (v.is_tensor()) ins.emplace_back(k, v.tensor);
  KILN_RETURN_IF_ERROR(write_npz(dir + "/inputs.npz", ins));
  KILN_RETURN_IF_ERROR(write_npz(dir + "/ref_outputs.npz", ref_out));
  KILN_RETURN_IF_ERROR(write_npz(dir + "/test_outputs.npz", test_out));
  // The model travels with the bundle when small enough to attach (64 MiB).
  json files = {{"inputs", "inputs.npz"}, {"ref_outputs", "ref_outputs.npz"}, {"test_outputs", "test_outputs.npz"}};
  if (fs::file_size(o.model, ec) < (size_t{64} << 20) && !ec) {
    fs::copy_file(o.model, dir + "/model.onnx", fs::copy_options::overwrite_existing, ec);
    if (!ec) files["model"] = "model.onnx";
  }
  if (!o.engine_file.empty()) {
    fs::copy_file(o.engine_file, dir + "/engine.kiln", fs::copy_options::overwrite_existing, ec);
    if (!ec) files["engine"] = "engine.kiln";
  }
  if (!o.ref_engine_file.empty()) {
    fs::copy_file(o.ref_engine_file, dir + "/ref_engine.kiln", fs::copy_options::overwrite_existing, ec);
    if (!ec) files["ref_engine"] = "ref_engine.kiln";
  }
  std::string cmd = command_line();
  json bundle = {{"kind", "kiln compare repro bundle"},
                 {"command", cmd},
                 {"cwd", fs::current_path().string()},
                 {"options", o},
                 {"files", files},
                 {"report", rep}};
  std::ofstream(dir + "/bundle.json") << bundle.dump(1) << "\n";
  std::ofstream(dir + "/command.txt") << cmd << "\n";
  std::ofstream(dir + "/README.txt")
      << "kiln compare repro bundle\n\nreplay:   kiln compare --replay " << dir << "\noriginal: " << cmd
      << "\n\nbundle.json: options, build config and profiles, versions (kiln, compiler, CPU, "
      << "model opset/producer), the full report with the first-divergence search\ninputs.npz: the failing inputs\n"
      << "ref_outputs.npz / test_outputs.npz: both sides' outputs\n";
  return Status::Ok();
}

Result<int> replay(const std::string& dir, const std::string& json_path, const std::string& html_path) {
  std::ifstream f(dir + "/bundle.json");
  if (!f) return NotFound("'", dir, "/bundle.json' not found: is this a kiln compare --save-failure bundle?");
  json bundle;
  try {
    bundle = json::parse(f);
  } catch (const std::exception& e) {
    return InvalidArgument("'", dir, "/bundle.json': ", e.what());
  }
  CompareOptions o = bundle.at("options").get<CompareOptions>();
  const json& files = bundle["files"];
  if (files.contains("model")) o.model = dir + "/" + files["model"].get<std::string>();
  if (files.contains("engine")) o.engine_file = dir + "/" + files["engine"].get<std::string>();
  if (files.contains("ref_engine")) o.ref_engine_file = dir + "/" + files["ref_engine"].get<std::string>();
  if (o.ref != "onnx" && o.ref != "engine") o.ref = dir + "/ref_outputs.npz";
  o.inputs = dir + "/inputs.npz";
  o.input_files.clear();
  o.input_ranges.clear();
  o.save_inputs.clear();
  o.save_failure.clear();
  std::printf("replay of: %s\n", bundle.value("command", "").c_str());
  return run_compare(o, json_path, html_path, &bundle);
}

}  // namespace kiln::tools::compare
