#pragma once

#include <CLI/CLI.hpp>

#include "tools/cli_common.h"

namespace kiln::tools {

// Each subcommand stores its exit status in `exit_code` when it runs.
void add_run_command(CLI::App& app, int& exit_code);
void add_conformance_command(CLI::App& app, int& exit_code);

}  // namespace kiln::tools
