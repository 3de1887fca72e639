// Optimization profiles (see profiles.h).
#include "engine/profiles.h"

#include <optional>
#include <set>
#include <stdexcept>

#include "engine/engine_impl.h"

namespace kiln::detail {

namespace {

const ir::ValueInfo* find_input(const ir::Graph& g, const std::string& name) {
  for (const auto& in : g.inputs)
    if (in.name == name && !g.initializers.count(name)) return &in;
  return nullptr;
}

// "dim 2 ('h')" or "dim 2".
std::string dim_label(const ir::ValueInfo* decl, size_t i) {
  std::string s = str_cat("dim ", i);
  if (decl && decl->type.shape.rank_known && i < decl->type.shape.rank() && !decl->type.shape.dims[i].param.empty())
    s += " ('" + decl->type.shape.dims[i].param + "')";
  return s;
}

bool is_dynamic(const ir::ValueInfo& in) {
  if (!in.type.is_tensor() || !in.type.shape.rank_known) return in.type.is_tensor();
  for (const Dim& d : in.type.shape.dims)
    if (!d.known()) return true;
  return false;
}

std::string profile_label(const std::vector<Profile>& ps, size_t i) {
  std::string s = str_cat("profile ", i);
  if (!ps[i].name.empty() && ps[i].name != str_cat("profile", i)) s += " '" + ps[i].name + "'";
  return s;
}

struct SymRange {
  int64_t min, opt, max;
  std::string from;  // "input 'x' dim 0"
};

}  // namespace

std::string input_signature(const ir::Graph& g, const std::string& input) {
  const ir::ValueInfo* d = find_input(g, input);
  return d ? d->type.shape.str() : "?";
}

int specialize_fixed_dims(ir::Graph& g, const std::vector<Profile>& profiles) {
  if (profiles.empty()) return 0;
  int pinned = 0;
  for (auto& in : g.inputs) {
    if (!in.type.is_tensor() || !in.type.shape.rank_known) continue;
    for (size_t d = 0; d < in.type.shape.dims.size(); ++d) {
      if (in.type.shape.dims[d].known()) continue;
      std::optional<int64_t> value;
      bool fixed = true;
      for (const Profile& p : profiles) {
        auto it = p.inputs.find(in.name);
        if (it == p.inputs.end() || d >= it->second.min.size() || d >= it->second.max.size() ||
            it->second.min[d] != it->second.max[d] || (value && *value != it->second.min[d])) {
          fixed = false;
          break;
        }
        value = it->second.min[d];
      }
      if (fixed && value && *value >= 0) {
        in.type.shape.dims[d] = Dim(*value);
        ++pinned;
      }
    }
  }
  return pinned;
}

Result<std::vector<Profile>> validate_profiles(const ir::Graph& g, std::vector<Profile> profiles) {
  std::set<std::string> names;
  for (size_t pi = 0; pi < profiles.size(); ++pi) {
    Profile& p = profiles[pi];
    if (p.name.empty()) p.name = str_cat("profile", pi);
    if (!names.insert(p.name).second) return InvalidArgument("two profiles are named '", p.name, "'");
    std::string where = profile_label(profiles, pi);
    if (p.inputs.empty()) return InvalidArgument(where, " gives no input shapes");
    std::map<std::string, SymRange> syms;  // symbolic dim -> range, to check and derive across inputs
    for (auto& [name, r] : p.inputs) {
      const ir::ValueInfo* decl = find_input(g, name);
      if (!decl) {
        std::string known;
        for (const auto& in : g.inputs)
          if (!g.initializers.count(in.name))
            known += (known.empty() ? "" : ", ") + in.name + " " + in.type.shape.str();
        return InvalidArgument(where, " names input '", name, "', which the model does not have (inputs: ", known, ")");
      }
      if (!decl->type.is_tensor()) return InvalidArgument(where, ": input '", name, "' is not a tensor");
      if (r.min.size() != r.opt.size() || r.max.size() != r.opt.size())
        return InvalidArgument(where, ": input '", name, "': min ", dims_str(r.min), ", opt ", dims_str(r.opt),
                               " and max ", dims_str(r.max), " differ in rank");
      const SymShape& s = decl->type.shape;
      if (s.rank_known && s.rank() != r.opt.size())
        return InvalidArgument(where, ": input '", name, "' has rank ", s.rank(), " ", s.str(), " in the model, the ",
                               "profile gives rank ", r.opt.size(), " ", dims_str(r.opt));
      for (size_t i = 0; i < r.opt.size(); ++i) {
        if (r.min[i] < 0 || !(r.min[i] <= r.opt[i] && r.opt[i] <= r.max[i]))
          return InvalidArgument(where, ": input '", name, "' ", dim_label(decl, i),
                                 ": need 0 <= min <= opt <= max, got min ", r.min[i], ", opt ", r.opt[i], ", max ",
                                 r.max[i]);
        if (s.rank_known && s.dims[i].known() &&
            (r.min[i] != s.dims[i].value || r.max[i] != s.dims[i].value || r.opt[i] != s.dims[i].value))
          return InvalidArgument(where, ": input '", name, "' ", dim_label(decl, i), " is fixed to ", s.dims[i].value,
                                 " in the model ", s.str(), ", the profile gives min ", r.min[i], " opt ", r.opt[i],
                                 " max ", r.max[i], " — a fixed dim cannot be overridden");
        if (s.rank_known && !s.dims[i].param.empty()) {
          std::string here = str_cat("input '", name, "' ", dim_label(decl, i));
          auto [it, fresh] = syms.emplace(s.dims[i].param, SymRange{r.min[i], r.opt[i], r.max[i], here});
          const SymRange& o = it->second;
          if (!fresh && (o.min != r.min[i] || o.opt != r.opt[i] || o.max != r.max[i]))
            return InvalidArgument(where, ": the model names both ", o.from, " and ", here, " '", s.dims[i].param,
                                   "', so they must be equal, but their ranges differ: min/opt/max ", o.min, "/", o.opt,
                                   "/", o.max, " vs ", r.min[i], "/", r.opt[i], "/", r.max[i]);
        }
      }
    }
    // Dynamic inputs left out: derived from the symbols other inputs bind, else an error.
    for (const auto& in : g.inputs) {
      if (g.initializers.count(in.name) || p.inputs.count(in.name) || !is_dynamic(in)) continue;
      const SymShape& s = in.type.shape;
      std::string hint = str_cat(" — add ", in.name, ":MINxDIMS/OPTxDIMS/MAXxDIMS to the profile");
      if (!s.rank_known)
        return InvalidArgument(where, " gives no range for input '", in.name, "', whose rank is unknown", hint);
      ShapeRange r;
      for (size_t i = 0; i < s.rank(); ++i) {
        if (s.dims[i].known()) {
          r.min.push_back(s.dims[i].value), r.opt.push_back(s.dims[i].value), r.max.push_back(s.dims[i].value);
          continue;
        }
        auto it = s.dims[i].param.empty() ? syms.end() : syms.find(s.dims[i].param);
        if (it == syms.end())
          return InvalidArgument(where, " gives no range for dynamic input '", in.name, "' ", s.str(), " (",
                                 dim_label(&in, i), " is not bound by another input of the profile)", hint);
        r.min.push_back(it->second.min), r.opt.push_back(it->second.opt), r.max.push_back(it->second.max);
      }
      p.inputs[in.name] = r;
    }
  }
  return profiles;
}

nlohmann::json profiles_to_json(const std::vector<Profile>& profiles) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& p : profiles) {
    nlohmann::json ins = nlohmann::json::object();
    for (const auto& [name, r] : p.inputs) ins[name] = {{"min", r.min}, {"opt", r.opt}, {"max", r.max}};
    a.push_back({{"name", p.name},
                 {"inputs", ins},
                 {"memory", {{"min", p.memory_min}, {"opt", p.memory_opt}, {"max", p.memory_max}}}});
  }
  return a;
}

namespace {
// Dims from JSON: integers only (a float such as 3.8e35 converted to int64 is undefined behaviour).
Dims dims_from_json(const nlohmann::json& j) {
  if (!j.is_array()) throw std::runtime_error("profile dims are not an array");
  Dims d;
  for (const auto& v : j) {
    if (!v.is_number_integer()) throw std::runtime_error("profile dim " + v.dump() + " is not an integer");
    d.push_back(v.get<int64_t>());
  }
  return d;
}
}  // namespace

Result<std::vector<Profile>> profiles_from_json(const nlohmann::json& j) {
  std::vector<Profile> out;
  try {
    for (const auto& jp : j) {
      Profile p;
      p.name = jp.at("name").get<std::string>();
      for (const auto& [name, r] : jp.at("inputs").items())
        p.inputs[name] = {dims_from_json(r.at("min")), dims_from_json(r.at("opt")), dims_from_json(r.at("max"))};
      // Byte counts must be JSON unsigned integers: a float such as 6.7e25 converted to size_t is
      // undefined behaviour (fuzz_shapes found one).
      auto bytes = [&](const char* which) -> size_t {
        const nlohmann::json& v = jp.at("memory").at(which);
        if (!v.is_number_unsigned()) throw std::runtime_error(std::string("memory.") + which + " is not a byte count");
        return v.get<size_t>();
      };
      p.memory_min = bytes("min");
      p.memory_opt = bytes("opt");
      p.memory_max = bytes("max");
      out.push_back(std::move(p));
    }
  } catch (const std::exception& ex) {
    return InvalidModel("engine profiles are malformed (", ex.what(), ")");
  }
  return out;
}

Result<int> select_profile(const ir::Graph& g, const std::vector<Profile>& profiles,
                           const std::map<std::string, Dims>& shapes, int forced) {
  if (profiles.empty()) return -1;
  if (forced >= static_cast<int>(profiles.size()))
    return InvalidArgument("profile index ", forced, " is out of range: the engine has ", profiles.size(),
                           " profile(s)");
  // Why `shapes` do not fit profile i: "" when they do.
  bool over = false, under = false;
  std::string first_input;
  auto misfit = [&](size_t i) -> std::pair<std::string, std::string> {  // (input, detail)
    for (const auto& [name, r] : profiles[i].inputs) {
      auto it = shapes.find(name);
      if (it == shapes.end()) continue;
      const Dims& d = it->second;
      if (d.size() != r.min.size()) return {name, str_cat("rank ", d.size(), " instead of ", r.min.size())};
      for (size_t k = 0; k < d.size(); ++k) {
        if (d[k] > r.max[k]) {
          over = true;
          return {name, str_cat(dim_label(find_input(g, name), k), " = ", d[k], " > max ", r.max[k])};
        }
        if (d[k] < r.min[k]) {
          under = true;
          return {name, str_cat(dim_label(find_input(g, name), k), " = ", d[k], " < min ", r.min[k])};
        }
      }
    }
    return {"", ""};
  };
  auto range = [&](size_t i, const std::string& name) {
    const ShapeRange& r = profiles[i].inputs.at(name);
    return str_cat(profile_label(profiles, i), " (min ", dims_str(r.min), " max ", dims_str(r.max), ")");
  };
  std::vector<size_t> candidates;
  if (forced >= 0)
    candidates.push_back(static_cast<size_t>(forced));
  else
    for (size_t i = 0; i < profiles.size(); ++i) candidates.push_back(i);
  std::string msg, last_input;
  for (size_t i : candidates) {
    auto [name, detail] = misfit(i);
    if (name.empty()) return static_cast<int>(i);
    if (name == last_input) {
      msg += str_cat(", ", range(i, name), ": ", detail);
    } else {
      msg += str_cat(msg.empty() ? "" : "; ", "input '", name, "' ", input_signature(g, name), " has shape ",
                     dims_str(shapes.at(name)), " outside ", range(i, name), ": ", detail);
      last_input = name;
    }
  }
  std::string fix = over && under ? "--min-shapes/--max-shapes"
                    : over        ? "--max-shapes"
                    : under       ? "--min-shapes"
                                  : "shapes";
  std::string which = forced >= 0           ? str_cat(" (profile ", forced, " was forced)")
                      : profiles.size() > 1 ? " (fits no profile)"
                                            : "";
  // kOutOfRange: a shape outside every profile (status.h; Python's kiln.ShapeError), exit code 3.
  return OutOfRange(msg, which, " — build with a wider ", fix,
                    forced >= 0           ? " or let kiln pick the profile"
                    : profiles.size() > 1 ? " or add a --profile that covers it"
                                          : "");
}

Result<std::map<std::string, Dims>> resolve_output_shapes(const ir::Graph& g,
                                                          const std::map<std::string, Dims>& input_shapes) {
  KILN_ASSIGN_OR_RETURN(auto copy, infer_at(g, input_shapes));
  std::map<std::string, Dims> out;
  for (const auto& o : copy->outputs) {
    auto it = copy->value_types.find(o.name);
    Dims d;
    if (it != copy->value_types.end() && it->second.is_tensor() && it->second.shape.rank_known)
      for (const Dim& dim : it->second.shape.dims) d.push_back(dim.known() ? dim.value : -1);
    out[o.name] = d;
  }
  return out;
}

void declare_shape(ShapeState& st, const std::string& name, const Dims& dims) {
  st.declared[name] = dims;
  st.ran_with_current = false;
}

Status set_input_shape(const EngineImpl& e, ShapeState& st, const std::string& name, Dims dims) {
  const ir::ValueInfo* decl = find_input(*e.model.graph, name);
  if (!decl) return InvalidArgument("'", name, "' is not an input of the engine");
  for (int64_t d : dims)
    if (d < 0) return InvalidArgument("input '", name, "': negative dimension ", d, " in ", dims_str(dims));
  const SymShape& s = decl->type.shape;
  if (s.rank_known) {
    if (s.rank() != dims.size())
      return OutOfRange("input '", name, "' expects rank ", s.rank(), " ", s.str(), ", got ", dims_str(dims));
    for (size_t i = 0; i < dims.size(); ++i)
      if (s.dims[i].known() && s.dims[i].value != dims[i])
        return OutOfRange("input '", name, "' expects shape ", s.str(), ", got ", dims_str(dims), " (",
                          dim_label(decl, i), " must be ", s.dims[i].value, ")");
  }
  std::map<std::string, Dims> probe = st.declared;
  probe[name] = dims;
  KILN_ASSIGN_OR_RETURN(int chosen, select_profile(*e.model.graph, e.profiles, probe, st.forced));
  declare_shape(st, name, dims);
  st.chosen = chosen;
  return Status::Ok();
}

Status force_profile(const EngineImpl& e, ShapeState& st, int index) {
  if (index < -1 || index >= static_cast<int>(e.profiles.size()))
    return InvalidArgument("profile index ", index, " is out of range: the engine has ", e.profiles.size(),
                           " profile(s) (-1 picks the first that fits)");
  st.forced = index;
  return Status::Ok();
}

Result<int> current_profile(const EngineImpl& e, const ShapeState& st) {
  if (st.ran_with_current) return st.chosen;
  return select_profile(*e.model.graph, e.profiles, st.declared, st.forced);
}

Status choose_profile(const EngineImpl& e, const std::map<std::string, ops::Value>& inputs, ShapeState& st) {
  std::map<std::string, Dims> given;
  for (const auto& [k, v] : inputs)
    if (v.is_tensor()) given[k] = v.tensor.shape();
  KILN_ASSIGN_OR_RETURN(st.chosen, select_profile(*e.model.graph, e.profiles, given, st.forced));
  return Status::Ok();
}

Result<Dims> output_shape(const EngineImpl& e, const ShapeState& st, const std::vector<ops::Value>& outputs,
                          const std::string& name) {
  const auto& outs = e.model.graph->outputs;
  size_t i = 0;
  while (i < outs.size() && outs[i].name != name) ++i;
  if (i == outs.size()) return InvalidArgument("'", name, "' is not an output of the engine");
  if (st.ran_with_current && i < outputs.size() && outputs[i].is_tensor()) return outputs[i].tensor.shape();
  KILN_ASSIGN_OR_RETURN(auto shapes, resolve_output_shapes(*e.model.graph, st.declared));
  return shapes[name];
}

}  // namespace kiln::detail

namespace kiln {
std::vector<Profile> Engine::profiles() const { return impl_->profiles; }
}  // namespace kiln
