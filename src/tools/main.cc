// kiln: the command-line front end. One file per subcommand; each registers itself here.
#include <CLI/CLI.hpp>

#include "engine/engine_impl.h"
#include "kiln/custom_op.h"
#include "kiln/kiln.h"
#include "onnx/importer.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln: ONNX inference compiler and runtime with built-in parity checking"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION);
  int exit_code = 0;
  kiln::tools::add_run_command(app, exit_code);
  kiln::tools::add_conformance_command(app, exit_code);
  kiln::tools::add_build_command(app, exit_code);
  kiln::tools::add_inspect_command(app, exit_code);
  kiln::tools::add_compare_command(app, exit_code);
  kiln::tools::add_bench_command(app, exit_code);
  // --threads on every subcommand: one OpenMP team for kiln's kernels and oneDNN's, set before the
  // command builds (the auto-tuner times candidates at this count) or runs anything. Bounded: libgomp
  // aborts when it cannot create the threads asked for.
  for (CLI::App* sub : app.get_subcommands({}))
    sub->add_option_function<int>(
           "--threads", [](const int& n) { kiln::set_threads(n); },
           "threads for the kernels (default: one per core, or OMP_NUM_THREADS); build tunes for this count")
        ->check(kiln::tools::bounded(1, kiln::tools::kMaxThreads));
  for (CLI::App* sub : app.get_subcommands({}))
    sub->add_flag_callback(
        "--allow-external-data-outside", [] { kiln::onnx_import::set_allow_external_data_outside_default(true); },
        "let external data (of models and .pb inputs) resolve outside their file's folder (off: refused)");
  // --plugin on every subcommand: custom-op libraries (kiln/plugin.h), loaded before the command
  // imports a model or loads an engine; KILN_PLUGIN_PATH's are loaded first.
  for (CLI::App* sub : app.get_subcommands({}))
    sub->add_option_function<std::vector<std::string>>(
           "--plugin",
           [](const std::vector<std::string>& paths) {
             for (const auto& p : paths) kiln::load_plugin(p);
           },
           "load a custom-op plugin (a shared library, kiln/plugin.h; repeatable; see examples/plugins)")
        ->type_name("LIB.so")
        ->allow_extra_args(false);
  try {
    kiln::load_env_plugins();
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kiln::tools::kExitUsage;
  } catch (...) {
    // The subcommands return Status; whatever still escapes one (an allocation failing on a hostile
    // size, a library throwing) is reported in kiln's categories, never as an abort.
    return kiln::tools::report_error(kiln::detail::status_of_exception(std::current_exception(), ""));
  }
  return exit_code;
}
