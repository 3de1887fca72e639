#pragma once

#include <CLI/CLI.hpp>

#include "kiln/kiln.h"
#include "tools/cli_common.h"

namespace kiln::tools {

// Each subcommand stores its exit status in `exit_code` when it runs.
void add_run_command(CLI::App& app, int& exit_code);
void add_conformance_command(CLI::App& app, int& exit_code);
void add_build_command(CLI::App& app, int& exit_code);
void add_inspect_command(CLI::App& app, int& exit_code);
namespace compare {
struct CompareResult;
}
// `result` (the library's compare, include/kiln/compare.h): the report and error go there, nothing printed.
void add_compare_command(CLI::App& app, int& exit_code, compare::CompareResult* result = nullptr);
void add_bench_command(CLI::App& app, int& exit_code);

// The Status behind a public kiln::Error (for exit codes and messages).
Status detail_status(const Error& e);

}  // namespace kiln::tools
