/// kiln compare as a library call (the Python module's kiln.compare): the same options, checks and
/// messages as the command line, returning the report that `kiln compare --json` writes.
///
///   std::string report = kiln::compare_json({"model.onnx", "--random-inputs", "--seed", "1"});
#pragma once

#include <string>
#include <vector>

namespace kiln {

/// Runs `kiln compare ARGS...` (see `kiln compare --help` and the README) without printing and returns
/// its report as JSON text (`"pass"`, `"outputs"` with per-output statistics, `"divergence"`, ...).
/// A comparison outside its tolerances is a report with "pass": false, not an error. Throws kiln::Error
/// with the command's message and category when the comparison cannot be made (a bad flag, a missing
/// file, an unsupported model); `--replay` is left to the command line.
std::string compare_json(const std::vector<std::string>& args);

}  // namespace kiln
