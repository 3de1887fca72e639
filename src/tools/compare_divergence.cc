// kiln compare --find-divergence: the first engine layer (fusions on) whose output leaves tolerance
// against the ONNX reference.
#include <algorithm>

#include "ir/rewrite.h"
#include "ops/interpreter.h"
#include "ops/kiln_layout.h"
#include "ops/quantized_layers.h"
#include "tools/compare_internal.h"

namespace kiln::tools::compare {

namespace {
struct LayerRecord {
  json j;
  double max_abs = -1;  // of its outputs, -1 when none is observable
  bool fail = false;
};
}  // namespace

json find_divergence(const CompareOptions& o, const Runners& r, const std::map<std::string, ops::Value>& inputs,
                     Status* st) {
  // Every reference tensor by name (the unoptimized graph keeps the ONNX names).
  std::map<std::string, Tensor> ref;
  ops::Interpreter interp(r.model.graph);
  interp.on_node = [&](const ir::Node& n, const std::vector<ops::Value>& outs) {
    for (size_t i = 0; i < outs.size() && i < n.outputs.size(); ++i)
      if (outs[i].is_tensor() && !n.outputs[i].empty()) ref[n.outputs[i]] = outs[i].tensor;
  };
  auto ro = interp.run(inputs);
  if (!ro.ok()) {
    *st = ro.status();
    return {};
  }
  const detail::EngineImpl& e = *r.engine;
  std::map<std::string, const detail::LayerInfo*> info;
  for (const auto& l : e.layers) info[l.name] = &l;
  std::map<std::string, json> value_err;  // engine value -> {observable, max_abs, pass}
  for (const auto& [name, v] : inputs) value_err[name] = {{"kind", "graph input"}, {"max_abs", 0.0}, {"pass", true}};
  std::vector<LayerRecord> layers;
  std::string precision = e.build.contains("config") ? e.build["config"].value("precision", "fp32") : "fp32";
  auto eo = detail::run_engine_observed(e, inputs, [&](const ir::Node& n, const std::vector<ops::Value>& outs) {
    LayerRecord rec;
    auto it = info.find(n.name);
    json sources = ir::sources_of(n);
    rec.j = {{"index", layers.size()},
             {"name", n.name},
             {"op_type", (n.domain.empty() ? "" : n.domain + ".") + n.op_type},
             {"kernel", it != info.end() ? it->second->kernel : "reference"},
             {"precision", ops::computes_in_int8(n) ? "int8" : precision},  // the graph quantized it
             {"sources", sources},
             {"fused", sources.size() > 1}};
    json ins = json::array();
    for (const auto& in : n.inputs) {
      if (in.empty()) continue;
      if (ir::is_constant(*e.model.graph, in)) continue;
      auto ve = value_err.find(in);
      json x = ve != value_err.end() ? ve->second : json{{"kind", "not observable"}};
      x["name"] = in;
      ins.push_back(x);
    }
    json os = json::array();
    for (size_t i = 0; i < outs.size() && i < n.outputs.size(); ++i) {
      const std::string& name = n.outputs[i];
      if (name.empty()) continue;
      json x = {{"name", name}};
      auto rt = ref.find(name);
      const Tensor* got = outs[i].is_tensor() ? &outs[i].tensor : nullptr;
      // A channel-blocked layer (layout pass) is checked as the plain value it stands for.
      Tensor unblocked;
      std::string ref_name = name;
      if (rt == ref.end() && got && n.attr("kiln.plain_value") && got->rank() == 5) {
        auto u = ops::from_channel_blocked(*got, n.attr_int("kiln.plain_channels", -1));
        if (u.ok()) {
          unblocked = std::move(u).value();
          got = &unblocked;
          ref_name = n.attr_string("kiln.plain_value", "");
          rt = ref.find(ref_name);
          x["as"] = ref_name;
        }
      }
      if (!got || rt == ref.end()) {
        x["kind"] = "not observable";
        x["why"] = rt == ref.end() ? "no ONNX tensor has this name (internal to a rewrite)" : "not a tensor";
      } else {
        auto atol = tolerance_for(o.atol, ref_name, kDefaultAtol), rtol = tolerance_for(o.rtol, ref_name, kDefaultRtol);
        Stats s = compute_stats(rt->second, *got, atol.ok() ? atol.value() : kDefaultAtol,
                                rtol.ok() ? rtol.value() : kDefaultRtol, o.rel_floor, o.check_error_stat, 3);
        x["kind"] = "observed";
        x["max_abs"] = s.max_abs;
        x["mean_abs"] = s.mean_abs;
        x["pass"] = s.pass;
        x["why"] = s.why;
        x["worst"] = s.worst;
        rec.max_abs = std::max(rec.max_abs, s.max_abs);
        rec.fail |= !s.pass;
      }
      value_err[name] = x;
      os.push_back(x);
    }
    rec.j["inputs"] = ins;
    rec.j["outputs"] = os;
    rec.j["max_abs"] = rec.max_abs;
    rec.j["pass"] = !rec.fail;
    layers.push_back(std::move(rec));
  });
  if (!eo.ok()) {
    *st = eo.status();
    return {};
  }
  json out = {{"layers", json::array()}, {"first", nullptr}};
  int first = -1;
  for (size_t i = 0; i < layers.size(); ++i) {
    out["layers"].push_back(layers[i].j);
    if (first < 0 && layers[i].fail) first = static_cast<int>(i);
  }
  int observed = 0;
  for (const auto& l : layers) observed += l.max_abs >= 0;
  out["observed_layers"] = observed;
  out["total_layers"] = layers.size();
  if (first >= 0) {
    json f = layers[static_cast<size_t>(first)].j;
    bool inputs_ok = true, inputs_observable = true;
    for (const auto& in : f["inputs"]) {
      if (in.value("kind", "") == "not observable")
        inputs_observable = false;
      else if (!in.value("pass", true))
        inputs_ok = false;
    }
    // Layers since the last observed passing layer whose outputs could not be checked.
    json hidden = json::array();
    for (int i = first - 1; i >= 0 && layers[static_cast<size_t>(i)].max_abs < 0; --i)
      hidden.push_back(layers[static_cast<size_t>(i)].j["name"]);
    f["verdict"] = inputs_ok && inputs_observable
                       ? "introduced by this layer: its inputs are within tolerance, its output is not"
                   : inputs_observable ? "its inputs already differ"
                                       : "some inputs are not observable: the divergence may start in the "
                                         "unobservable layers before it";
    f["unobservable_before"] = hidden;
    out["first"] = f;
  }
  return out;
}

}  // namespace kiln::tools::compare
