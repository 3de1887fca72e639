// Where a run's inputs come from, shared by run, bench and compare: files (--inputs, --input), or
// random values (--random-inputs, --shapes, --seed, --input-range). kiln never guesses: an input
// missing from the files given is an error unless --random-inputs asks for random values, and
// random values are announced on stderr (issue 15, item 4).
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"
#include "ops/value.h"

namespace kiln::tools {

struct InputOptions {
  std::string inputs;               // --inputs: FILE.npz, or a directory of NAME.npy / NAME.pb / input_<i>.pb
  std::vector<std::string> files;   // --input NAME=FILE (.npy or .pb), repeatable
  std::string shapes;               // --shapes NAME:1x3x224x224,... of random inputs
  std::vector<std::string> ranges;  // --input-range NAME:LO,HI of random inputs
  uint64_t seed = 0;                // --seed
  bool random = false;              // --random-inputs: random values for inputs the files lack
};

// Adds --inputs, --input, --random-inputs, --seed and --input-range to `cmd` (and --shapes unless
// `with_shapes` is false: bench and compare describe theirs).
void add_input_options(CLI::App* cmd, InputOptions& o, bool with_shapes = true);

struct LoadedInputs {
  std::map<std::string, ops::Value> values;
  std::vector<std::string> given, generated;  // names, from files / random
};

// Reads the input files and makes random values where allowed (see the top of this file).
// `default_shapes` (an engine profile's opt shapes, bench's --batch) size random inputs not in --shapes.
Result<LoadedInputs> load_inputs(const InputOptions& o, const ir::Graph& g,
                                 const std::map<std::string, Dims>& default_shapes = {});

// --input-range NAME:LO,HI -> (name, lo, hi), checked (numbers, finite, lo <= hi).
struct InputRange {
  std::string name;
  double lo = 0, hi = 0;
};
Result<InputRange> parse_input_range(const std::string& spec);

}  // namespace kiln::tools
