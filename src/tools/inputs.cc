#include "tools/inputs.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "core/npy.h"
#include "engine/engine_impl.h"
#include "tools/cli_common.h"

namespace kiln::tools {

namespace fs = std::filesystem;

void add_input_options(CLI::App* cmd, InputOptions& o, bool with_shapes) {
  cmd->add_option("--inputs", o.inputs, "all inputs from FILE.npz or a directory of NAME.npy / NAME.pb / input_<i>.pb");
  cmd->add_option("--input", o.files, "NAME=FILE (.npy or ONNX .pb), repeatable");
  cmd->add_flag("--random-inputs", o.random,
                "random values for the inputs that --inputs/--input do not give (without it a missing input is an "
                "error; with no input files at all every input is random)");
  if (with_shapes) cmd->add_option("--shapes", o.shapes, "shapes of random inputs: NAME:1x3x224x224,...");
  cmd->add_option("--seed", o.seed, "seed of random inputs");
  cmd->add_option("--input-range", o.ranges,
                  "NAME:LO,HI: random values of that input in [LO, HI] (integers: LO..HI inclusive, e.g. token ids "
                  "below the vocabulary size; default [-1, 1] for floats, 0..9 for integers); repeatable");
}

Result<InputRange> parse_input_range(const std::string& spec) {
  size_t c = spec.rfind(':');
  size_t comma = c == std::string::npos ? std::string::npos : spec.find(',', c);
  if (c == std::string::npos || c == 0 || comma == std::string::npos)
    return InvalidArgument("--input-range '", spec, "' must look like NAME:LO,HI (e.g. input_ids:0,30521)");
  InputRange r;
  r.name = spec.substr(0, c);
  std::string los = spec.substr(c + 1, comma - c - 1), his = spec.substr(comma + 1);
  char *e1 = nullptr, *e2 = nullptr;
  r.lo = std::strtod(los.c_str(), &e1);
  r.hi = std::strtod(his.c_str(), &e2);
  if (los.empty() || his.empty() || *e1 || *e2 || !std::isfinite(r.lo) || !std::isfinite(r.hi) || !(r.lo <= r.hi))
    return InvalidArgument("--input-range '", spec, "': need finite numbers LO <= HI");
  return r;
}

namespace {

std::vector<const ir::ValueInfo*> real_inputs(const ir::Graph& g) {
  std::vector<const ir::ValueInfo*> v;
  for (const auto& in : g.inputs)
    if (!g.initializers.count(in.name)) v.push_back(&in);
  return v;
}

std::string input_list(const ir::Graph& g) {
  std::string s;
  for (const auto* in : real_inputs(g)) s += (s.empty() ? "" : ", ") + in->name + " " + in->type.str();
  return s.empty() ? "none" : s;
}

// Random values rescaled to [lo, hi]: fill_random_inputs draws floats uniformly in [-1, 1] (mapped
// linearly, so a seed gives the same pattern at any range); integers are redrawn uniformly in lo..hi.
void apply_range(Tensor& t, const InputRange& r, uint64_t seed) {
  uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype_is_float(t.dtype())) {
      t.set_f64(i, r.lo + (t.get_f64(i) + 1.0) * 0.5 * (r.hi - r.lo));
    } else {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      double u = static_cast<double>(state >> 11) / 9007199254740992.0;
      t.set_i64(i, static_cast<int64_t>(std::floor(r.lo + u * (r.hi - r.lo + 1))));
    }
  }
}

}  // namespace

Result<LoadedInputs> load_inputs(const InputOptions& o, const ir::Graph& g,
                                 const std::map<std::string, Dims>& default_shapes) {
  LoadedInputs out;
  auto& inputs = out.values;
  // Names in files may be sanitized (kiln writes DIR/NAME.npy with odd characters replaced).
  auto decl_of = [&](const std::string& name) -> const ir::ValueInfo* {
    for (const auto* in : real_inputs(g))
      if (in->name == name) return in;
    for (const auto* in : real_inputs(g))
      if (sanitize_name(in->name) == name) return in;
    return nullptr;
  };
  if (!o.inputs.empty()) {
    std::error_code ec;
    if (fs::is_directory(o.inputs, ec)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(o.inputs, ec))
        if (e.path().extension() == ".npy" || e.path().extension() == ".pb") files.push_back(e.path());
      if (ec) return IOError("cannot list '", o.inputs, "': ", ec.message());
      std::sort(files.begin(), files.end());
      auto ins = real_inputs(g);
      for (const auto& f : files) {
        std::string stem = f.stem().string();
        const ir::ValueInfo* decl = decl_of(stem);
        if (!decl && stem.rfind("input_", 0) == 0) {  // ONNX test-data layout: input_<i>.pb
          char* end = nullptr;
          unsigned long i = std::strtoul(stem.c_str() + 6, &end, 10);
          if (*end == '\0' && i < ins.size()) decl = ins[i];
        }
        if (!decl)
          return InvalidArgument("'", f.string(), "' names no input of the model (its inputs: ", input_list(g), ")");
        KILN_ASSIGN_OR_RETURN(ops::Value v, read_value_file(f.string(), &decl->type));
        inputs[decl->name] = std::move(v);
      }
    } else {
      KILN_ASSIGN_OR_RETURN(auto entries,
                            detail::guarded("reading '" + o.inputs + "'", [&] { return read_npz(o.inputs); }));
      for (auto& [name, t] : entries) {
        const ir::ValueInfo* decl = decl_of(name);
        if (!decl)
          return InvalidArgument("'", o.inputs, "' has '", name,
                                 "', which is not an input of the model (its inputs: ", input_list(g), ")");
        inputs[decl->name] = ops::Value(std::move(t));
      }
    }
  }
  for (const auto& spec : o.files) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) return InvalidArgument("--input '", spec, "' must look like NAME=FILE");
    const ir::ValueInfo* decl = decl_of(spec.substr(0, eq));
    if (!decl)
      return InvalidArgument("--input: '", spec.substr(0, eq),
                             "' is not an input of the model (its inputs: ", input_list(g), ")");
    KILN_ASSIGN_OR_RETURN(ops::Value v, read_value_file(spec.substr(eq + 1), &decl->type));
    inputs[decl->name] = std::move(v);
  }
  for (const auto& [k, v] : inputs) out.given.push_back(k);

  // No guessing: with input files given, every input must come from them unless --random-inputs.
  const bool any_files = !o.inputs.empty() || !o.files.empty();
  if (any_files && !o.random) {
    std::vector<std::string> missing;
    for (const auto* in : real_inputs(g))
      if (!inputs.count(in->name)) missing.push_back("'" + in->name + "' " + in->type.str());
    if (!missing.empty()) {
      std::string m, from;
      for (const auto& s : missing) m += (m.empty() ? "" : ", ") + s;
      for (const auto& s : out.given) from += (from.empty() ? "" : ", ") + s;
      return InvalidArgument(missing.size() == 1 ? "input " : "inputs ", m, " not given (the files give ",
                             from.empty() ? "none" : from, "; the model's inputs are ", input_list(g),
                             "): give every input, or add --random-inputs for random values");
    }
  }

  std::map<std::string, Dims> shapes = default_shapes;
  if (!o.shapes.empty()) {
    KILN_ASSIGN_OR_RETURN(auto given_shapes, parse_shapes(o.shapes));
    for (const auto& [name, d] : given_shapes) {
      if (!decl_of(name))
        return InvalidArgument("--shapes: '", name, "' is not an input of the model (its inputs: ", input_list(g), ")");
      shapes[name] = d;
    }
  }
  std::vector<InputRange> ranges;
  for (const auto& spec : o.ranges) {
    KILN_ASSIGN_OR_RETURN(InputRange r, parse_input_range(spec));
    const ir::ValueInfo* decl = decl_of(r.name);
    if (!decl)
      return InvalidArgument("--input-range: '", r.name, "' is not an input of the model (its inputs: ", input_list(g),
                             ")");
    r.name = decl->name;
    if (inputs.count(r.name))
      return InvalidArgument("--input-range '", spec, "': input '", r.name,
                             "' is given from a file; ranges apply to random inputs");
    ranges.push_back(r);
  }
  KILN_RETURN_IF_ERROR(fill_random_inputs(g, o.seed, shapes, inputs));
  for (const auto& r : ranges)
    if (inputs.count(r.name) && inputs[r.name].is_tensor()) apply_range(inputs[r.name].tensor, r, o.seed);
  for (const auto& [name, v] : inputs)
    if (std::find(out.given.begin(), out.given.end(), name) == out.given.end()) out.generated.push_back(name);
  if (!out.generated.empty()) {
    std::string list;
    for (const auto& name : out.generated) {
      const Tensor& t = inputs[name].tensor;
      std::string range = dtype_is_float(t.dtype()) ? "[-1, 1]" : t.dtype() == DataType::kBool ? "{0, 1}" : "0..9";
      for (const auto& r : ranges)
        if (r.name == name)
          range = (dtype_is_float(t.dtype()) ? "[" : "") + str_cat(r.lo) + (dtype_is_float(t.dtype()) ? ", " : "..") +
                  str_cat(r.hi) + (dtype_is_float(t.dtype()) ? "]" : "");
      list += (list.empty() ? "" : ", ") + name + " " + dims_str(t.shape()) + " " + dtype_name(t.dtype()) + " " + range;
    }
    std::fprintf(stderr, "kiln: note: random inputs (seed %llu): %s%s\n", static_cast<unsigned long long>(o.seed),
                 list.c_str(), any_files ? " (--random-inputs)" : "; give real ones with --inputs or --input");
  }
  return out;
}

}  // namespace kiln::tools
