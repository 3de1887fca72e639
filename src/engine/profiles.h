// Optimization profiles: validation against the model at build time, storage in the engine file, and
// selection at run time (the first profile whose ranges hold every given input shape).
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"
#include "kiln/kiln.h"
#include "ops/value.h"

namespace kiln::detail {

struct EngineImpl;

// Checks `profiles` against the graph's inputs and completes them: default names, ranges of dynamic
// inputs left out but whose symbolic dims (batch, seq) another input of the profile binds, fixed dims.
// Errors name the profile, the input, the dim (and its symbol) and the values.
Result<std::vector<Profile>> validate_profiles(const ir::Graph& g, std::vector<Profile> profiles);

// Pins the dims of graph inputs that every profile fixes (min = max, the same in all profiles) to
// their value, as TensorRT specializes a network built for static shapes: shape computations over
// them (Shape -> Gather -> Concat, Range, position buckets, pads derived from sizes) become
// constants the passes fold. Returns how many dims it pinned; none without profiles.
int specialize_fixed_dims(ir::Graph& g, const std::vector<Profile>& profiles);

nlohmann::json profiles_to_json(const std::vector<Profile>& profiles);
Result<std::vector<Profile>> profiles_from_json(const nlohmann::json& j);

// The index of the profile for these input shapes: `forced` when >= 0 (checked), else the first that
// fits; -1 when there are no profiles. Inputs absent from `shapes` are not checked. The error names the
// input, its dims and every profile's [min, max].
Result<int> select_profile(const ir::Graph& g, const std::vector<Profile>& profiles,
                           const std::map<std::string, Dims>& shapes, int forced);

// "[batch,3,h,w]"-style description of a graph input (symbolic dim names kept).
std::string input_signature(const ir::Graph& g, const std::string& input);

// Per-context shape state: shapes declared ahead of data, the forced profile, the chosen one.
struct ShapeState {
  std::map<std::string, Dims> declared;  // set_input_shape / set_input
  int forced = -1;
  int chosen = -1;
  bool ran_with_current = false;  // outputs of the last run match the declared shapes
};

// ExecutionContext's profile and shape entry points (context.cc delegates here).
void declare_shape(ShapeState& st, const std::string& name, const Dims& dims);
Status set_input_shape(const EngineImpl& e, ShapeState& st, const std::string& name, Dims dims);
Status force_profile(const EngineImpl& e, ShapeState& st, int index);
Result<int> current_profile(const EngineImpl& e, const ShapeState& st);
Status choose_profile(const EngineImpl& e, const std::map<std::string, ops::Value>& inputs, ShapeState& st);
Result<Dims> output_shape(const EngineImpl& e, const ShapeState& st, const std::vector<ops::Value>& outputs,
                          const std::string& name);

// Output dims resolved from the given input shapes by shape inference (-1: data-dependent).
Result<std::map<std::string, Dims>> resolve_output_shapes(const ir::Graph& g,
                                                          const std::map<std::string, Dims>& input_shapes);

}  // namespace kiln::detail
