// kiln compare --find-divergence: the first engine layer (fusions on) whose output leaves tolerance
// against the ONNX reference, or against a reference engine (--ref-engine: layers matched by their
// output tensors' names).
#include <algorithm>
#include <set>

#include "engine/numerics_guard.h"
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

// Output i of engine layer n as the value the reference knows: a channel-blocked layer (layout
// pass) as the plain value it stands for. Returns the name it goes by (empty: unchanged).
// A channels-last layer (layout_nhwc, kiln.plain_layout "nhwc") likewise, transposed back to NCHW.
std::string as_plain(const ir::Node& n, const Tensor*& got, Tensor& unblocked) {
  const bool nhwc = n.attr_string("kiln.plain_layout", "") == "nhwc";
  if (!got || !n.attr("kiln.plain_value") || got->rank() != (nhwc ? 4 : 5)) return "";
  auto u = nhwc ? ops::nhwc_to_nchw(*got) : ops::from_channel_blocked(*got, n.attr_int("kiln.plain_channels", -1));
  if (!u.ok()) return "";
  unblocked = std::move(u).value();
  got = &unblocked;
  return n.attr_string("kiln.plain_value", "");
}
}  // namespace

json find_divergence(const CompareOptions& o, const Runners& r, const std::map<std::string, ops::Value>& inputs,
                     Status* st) {
  // Every reference tensor by name (the unoptimized graph keeps the ONNX names; a reference
  // engine's layers keep them where a layer stands for an ONNX node's output).
  std::map<std::string, Tensor> ref;
  std::vector<std::string> ref_order;            // reference engine: its tensors in execution order
  std::map<std::string, std::string> ref_alias;  // a blocked tensor's name -> the plain value it stands for
  if (r.ref_engine) {
    auto ro =
        detail::run_engine_observed(*r.ref_engine, inputs, [&](const ir::Node& n, const std::vector<ops::Value>& outs) {
          for (size_t i = 0; i < outs.size() && i < n.outputs.size(); ++i) {
            if (!outs[i].is_tensor() || n.outputs[i].empty()) continue;
            // Clones: the context's arena slots are reused by later layers. A channel-blocked tensor goes
            // by both names: as it is (the engine under test may have the same blocked layer) and as the
            // plain value it stands for.
            const Tensor* got = &outs[i].tensor;
            ref[n.outputs[i]] = got->clone();
            Tensor unblocked;
            std::string plain = as_plain(n, got, unblocked);
            if (!plain.empty()) {
              ref[plain] = got->clone();
              ref_alias[n.outputs[i]] = plain;
            }
            ref_order.push_back(plain.empty() ? n.outputs[i] : plain);
          }
        });
    if (!ro.ok()) {
      *st = ro.status();
      return {};
    }
  } else {
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
  }
  std::set<std::string> matched;
  const detail::EngineImpl& e = *r.engine;
  std::map<std::string, const detail::LayerInfo*> info;
  for (const auto& l : e.layers) info[l.name] = &l;
  std::map<std::string, json> value_err;  // engine value -> {observable, max_abs, pass}
  for (const auto& [name, v] : inputs) value_err[name] = {{"kind", "graph input"}, {"max_abs", 0.0}, {"pass", true}};
  std::vector<LayerRecord> layers;
  auto eo = detail::run_engine_observed(e, inputs, [&](const ir::Node& n, const std::vector<ops::Value>& outs) {
    LayerRecord rec;
    auto it = info.find(n.name);
    json sources = ir::sources_of(n);
    rec.j = {{"index", layers.size()},
             {"name", n.name},
             {"op_type", (n.domain.empty() ? "" : n.domain + ".") + n.op_type},
             {"kernel", it != info.end() ? it->second->kernel : "reference"},
             {"precision",
              ops::computes_in_int8(n) ? "int8" : engine::layer_precision(n, outs)},  // int8: the graph quantized it
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
      if (rt == ref.end()) {
        std::string plain = as_plain(n, got, unblocked);
        if (!plain.empty()) {
          ref_name = plain;
          rt = ref.find(ref_name);
          x["as"] = ref_name;
        }
      }
      if (!got || rt == ref.end()) {
        x["kind"] = "not observable";
        x["why"] = rt != ref.end() ? "not a tensor"
                   : r.ref_engine  ? "the reference engine has no tensor of this name (fused differently): skipped"
                                   : "no ONNX tensor has this name (internal to a rewrite)";
      } else {
        matched.insert(ref_name);
        if (auto a = ref_alias.find(ref_name); a != ref_alias.end()) matched.insert(a->second);
        auto atol = tolerance_for(o.atol, ref_name, o.default_atol),
             rtol = tolerance_for(o.rtol, ref_name, o.default_rtol);
        Stats s = compute_stats(rt->second, *got, atol.ok() ? atol.value() : o.default_atol,
                                rtol.ok() ? rtol.value() : o.default_rtol, o.rel_floor, o.check_error_stat, 3);
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
  if (r.ref_engine) {
    json ref_only = json::array();
    std::set<std::string> inputs_given;
    for (const auto& [k, v] : inputs) inputs_given.insert(k);
    for (const auto& name : ref_order)
      if (!matched.count(name) && !inputs_given.count(name)) ref_only.push_back(name);
    out["ref_only"] = ref_only;
  }
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
