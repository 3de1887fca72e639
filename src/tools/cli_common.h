// Shared pieces of the kiln subcommands: loading inputs, summarizing outputs, exit codes.
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"
#include "ops/value.h"

namespace kiln::tools {

// Exit codes (documented in the README).
constexpr int kExitOk = 0;
constexpr int kExitMismatch = 1;      // outputs differ / tests failed
constexpr int kExitUsage = 2;         // bad command line
constexpr int kExitInvalidInput = 3;  // bad model, input file or value
constexpr int kExitUnsupported = 4;   // valid but unsupported
constexpr int kExitInternal = 5;
constexpr int kExitDeadline = 6;  // a run passed its --deadline

// Bounds of the flags that size a run's resources: beyond them libgomp or the thread library abort,
// or the process just runs out of memory.
constexpr int kMaxThreads = 1024;              // --threads
constexpr int kMaxStreams = 256;               // bench --streams: one thread and one context each
constexpr int kMaxIterations = 1000000000;     // bench --iterations, --warmup
constexpr double kMaxSeconds = 7 * 24 * 3600;  // --duration, --warmup-ms (as seconds), --deadline

// A CLI11 check: a finite number in [lo, hi] (NaN and inf are refused; CLI11's Range lets NaN pass).
CLI::Validator bounded(double lo, double hi);

// Adds --deadline SECONDS (every run of the command stops with a 'deadline exceeded' error, exit 6,
// once it has run that long); 0: none.
void add_deadline_option(CLI::App* cmd, double& seconds);
// The deadline of a run starting now (nullopt when seconds is 0).
std::optional<std::chrono::steady_clock::time_point> deadline_after(double seconds);

// Element count of `d`, or an error when it overflows (core/checked_size.h's checked_numel), also at
// 16 bytes an element (the largest dtype), naming `what`.
Result<int64_t> checked_numel(const Dims& d, const std::string& what);

int exit_code_for(const Status& s);
int report_error(const Status& s);  // prints "kiln: error: ..." and returns the exit code

// Reads a tensor from .npy or .pb (by extension), or a sequence/optional .pb given the type.
Result<ops::Value> read_value_file(const std::string& path, const ir::TypeInfo* expected);

// Random inputs for every graph input without a value (seeded). Unknown dims use `shapes`
// (NAME -> dims) or 1.
Status fill_random_inputs(const ir::Graph& g, uint64_t seed, const std::map<std::string, Dims>& shapes,
                          std::map<std::string, ops::Value>& inputs);

// A memory size as trtexec writes them: "64M", "512K", "2G" (binary units, an optional trailing B,
// fractions allowed: "1.5G"); a bare number is MiB. Errors name `flag`.
Result<size_t> parse_size(const std::string& text, const std::string& flag);

// "NAME:1x3x224x224,NAME2:1x128" -> map.
Result<std::map<std::string, Dims>> parse_shapes(const std::string& spec);

// "shape, dtype, min, max, mean, NaN, Inf" line for one value.
std::string summarize(const std::string& name, const ops::Value& v);

// Tolerances as ONNX's backend runner uses them: |got - want| <= atol + rtol * |want|.
struct Tolerance {
  double rtol = 1e-3, atol = 1e-7;
};
// Ok when equal within tolerance (dtype, shape and values; NaN equals NaN); the error says how many
// elements differ, the first one, and the max abs error. `max_abs_err` receives the max abs error.
Status compare_tensor(const std::string& name, const Tensor& got, const Tensor& want, const Tolerance& tol,
                      double* max_abs_err = nullptr);
Status compare_value(const std::string& name, const ops::Value& got, const ops::Value& want, const Tolerance& tol);

// File-system-safe version of a value name.
std::string sanitize_name(const std::string& name);

}  // namespace kiln::tools
