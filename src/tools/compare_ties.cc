// kiln compare --detections: near ties at TopK layers. A detector ranks proposals by score (the RPN's
// TopK of objectness, a pre-NMS top-k) and keeps the first K: when two candidates' scores lie within
// the compare's tolerance of each other, rounding differences far below that tolerance may rank them
// either way, and a different proposal then reaches the detection head. Both runs are right — the
// reference's scores cannot tell the two apart — but the detections that follow can differ by more
// than any tolerance (a box refined from another proposal). Loosening tolerances would hide real
// faults; instead compare checks the tie and replays it:
//
// 1. A near tie: at a main-graph TopK whose indices the engine observes under the same name, every
//    position where the engine's index differs from the reference's holds, in the reference's own
//    TopK input, a key within the input's atol/rtol of the key the reference chose there (the
//    Polygraphy rule of compare_internal.h). A differing position that is not such a tie is a real
//    divergence: nothing is explained.
// 2. The replay: the reference interpreter runs again with each tied TopK resolved the engine's way
//    (its indices, with the reference's own keys at those indices as values); everything else is the
//    reference's arithmetic. The detections are then compared with the usual rule, unchanged
//    tolerances: they pass only when the engine agrees with the reference everywhere except for the
//    tie's outcome. A fault after the tie still fails.
#include <cmath>
#include <set>

#include "ops/interpreter.h"
#include "tools/compare_internal.h"

namespace kiln::tools::compare {

namespace {
bool within(double test, double ref, double atol, double rtol, double rel_floor) {
  double a = std::fabs(test - ref);
  return a <= atol || a / std::max(std::fabs(ref), rel_floor) <= rtol;
}

struct TopKSite {
  const ir::Node* node = nullptr;
  Tensor keys, indices;  // the reference's input and output 1
  Tensor engine_indices;
  Tensor forced_values;  // the reference's keys at the engine's indices
};

// The TopK's axis, its rows (outer x inner) and the keys' stride along the axis.
struct Geometry {
  int64_t axis = 0, outer = 1, inner = 1, n = 0, k = 0;
};
Geometry geometry(const ir::Node& n, const Tensor& keys, const Tensor& idx) {
  Geometry g;
  g.axis = n.attr_int("axis", -1);
  if (g.axis < 0) g.axis += keys.rank();
  for (int64_t d = 0; d < g.axis; ++d) g.outer *= keys.dim(d);
  for (int64_t d = g.axis + 1; d < keys.rank(); ++d) g.inner *= keys.dim(d);
  g.n = keys.dim(g.axis);
  g.k = idx.dim(g.axis);
  return g;
}
}  // namespace

Result<json> explain_by_near_ties(const CompareOptions& o, const Runners& r,
                                  const std::map<std::string, ops::Value>& inputs,
                                  std::vector<std::pair<std::string, Tensor>>* replayed_out) {
  json report = {{"ties", json::array()}, {"divergences", json::array()}};
  // The reference's TopK layers (main graph): keys and indices.
  std::map<std::string, TopKSite> sites;  // by the indices output's name
  {
    ops::Interpreter interp(r.model.graph);
    std::set<std::string> keys;  // the TopK layers' inputs: kept until their TopK runs
    for (const auto& n : r.model.graph->nodes)
      if (n.op_type == "TopK" && n.domain.empty() && n.has_input(0)) keys.insert(n.inputs[0]);
    std::map<std::string, Tensor> values;
    interp.on_node = [&](const ir::Node& n, const std::vector<ops::Value>& outs) {
      for (size_t i = 0; i < outs.size() && i < n.outputs.size(); ++i)
        if (outs[i].is_tensor() && keys.count(n.outputs[i])) values[n.outputs[i]] = outs[i].tensor;
      if (n.op_type != "TopK" || !n.domain.empty() || outs.size() < 2 || !n.has_output(1) || !outs[1].is_tensor())
        return;
      auto k = values.find(n.inputs[0]);
      if (k == values.end() && r.model.graph->initializers.count(n.inputs[0]))
        k = values.emplace(n.inputs[0], r.model.graph->initializers.at(n.inputs[0])).first;
      if (k == values.end()) {
        if (auto in = inputs.find(n.inputs[0]); in != inputs.end() && in->second.is_tensor())
          k = values.emplace(n.inputs[0], in->second.tensor).first;
      }
      if (k == values.end() || !dtype_is_float(k->second.dtype())) return;
      TopKSite s;
      s.node = &n;
      s.keys = k->second;
      s.indices = outs[1].tensor;
      sites[n.outputs[1]] = std::move(s);
    };
    KILN_RETURN_IF_ERROR(interp.run(inputs).status());
  }
  if (sites.empty()) return report;
  // The engine's indices at those layers (clones: arena slots are reused).
  KILN_RETURN_IF_ERROR(
      detail::run_engine_observed(*r.engine, inputs, [&](const ir::Node& n, const std::vector<ops::Value>& outs) {
        for (size_t i = 0; i < outs.size() && i < n.outputs.size(); ++i)
          if (auto s = sites.find(n.outputs[i]); s != sites.end() && outs[i].is_tensor())
            s->second.engine_indices = outs[i].tensor.clone();
      }).status());
  std::map<std::string, std::pair<Tensor, Tensor>> forced;  // by the TopK node's name: values, indices
  for (auto& [name, s] : sites) {
    const Tensor& ei = s.engine_indices;
    if (!ei.defined() || ei.shape() != s.indices.shape() || ei.dtype() != s.indices.dtype()) continue;
    KILN_ASSIGN_OR_RETURN(double atol, tolerance_for(o.atol, s.node->inputs[0], kDefaultAtol));
    KILN_ASSIGN_OR_RETURN(double rtol, tolerance_for(o.rtol, s.node->inputs[0], kDefaultRtol));
    KILN_ASSIGN_OR_RETURN(TopKDifference d,
                          classify_topk_difference(*s.node, s.keys, s.indices, ei, atol, rtol, o.rel_floor));
    if (d.positions_differing == 0) continue;
    d.site["indices"] = name;
    s.forced_values = std::move(d.forced_values);
    if (d.tie) {
      report["ties"].push_back(d.site);
      forced[s.node->name] = {s.forced_values, ei};
    } else {
      report["divergences"].push_back(d.site);
    }
  }
  if (forced.empty() || !report["divergences"].empty()) return report;
  // The replay: the reference with the ties resolved the engine's way.
  KILN_ASSIGN_OR_RETURN(std::vector<ops::Value> outs, run_reference_with_decisions(r.model.graph, inputs, forced));
  const auto& decl = r.model.graph->outputs;
  replayed_out->clear();
  for (size_t i = 0; i < outs.size() && i < decl.size(); ++i)
    if (outs[i].is_tensor()) replayed_out->emplace_back(decl[i].name, outs[i].tensor);
  return report;
}

Result<TopKDifference> classify_topk_difference(const ir::Node& n, const Tensor& keys, const Tensor& ref_indices,
                                                const Tensor& test_indices, double atol, double rtol,
                                                double rel_floor) {
  if (test_indices.shape() != ref_indices.shape() || !dtype_is_float(keys.dtype()) || ref_indices.rank() != keys.rank())
    return InvalidArgument("TopK '", n.name, "': indices ", test_indices.describe(), " and ", ref_indices.describe(),
                           " of keys ", keys.describe(), " cannot be compared");
  const Geometry g = geometry(n, keys, ref_indices);
  TopKDifference d;
  d.forced_values = Tensor(keys.dtype(), ref_indices.shape());
  int64_t ties = 0;
  json widest = nullptr, bad = nullptr;
  double widest_gap = -1;
  for (int64_t a = 0; a < g.outer; ++a)
    for (int64_t j = 0; j < g.k; ++j)
      for (int64_t b = 0; b < g.inner; ++b) {
        const int64_t at = (a * g.k + j) * g.inner + b;
        const auto ri = static_cast<int64_t>(ref_indices.get_f64(at)),
                   ti = static_cast<int64_t>(test_indices.get_f64(at));
        if (ri < 0 || ri >= g.n || ti < 0 || ti >= g.n)
          return InvalidArgument("TopK '", n.name, "': index ", ri < 0 || ri >= g.n ? ri : ti, " outside [0, ", g.n,
                                 ")");
        const double rk = keys.get_f64((a * g.n + ri) * g.inner + b), tk = keys.get_f64((a * g.n + ti) * g.inner + b);
        d.forced_values.set_f64(at, tk);
        if (ri == ti) continue;
        ++d.positions_differing;
        json p = {{"rank", j},     {"ref_index", ri}, {"test_index", ti},
                  {"ref_key", rk}, {"test_key", tk},  {"gap", std::fabs(tk - rk)}};
        if (!within(tk, rk, atol, rtol, rel_floor)) {
          if (bad.is_null()) bad = p;
          continue;
        }
        ++ties;
        if (std::fabs(tk - rk) > widest_gap) widest_gap = std::fabs(tk - rk), widest = p;
      }
  d.tie = d.positions_differing > 0 && ties == d.positions_differing;
  d.site = {{"layer", n.name}, {"keys", n.has_input(0) ? n.inputs[0] : ""},
            {"k", g.k},        {"positions_differing", d.positions_differing},
            {"atol", atol},    {"rtol", rtol}};
  if (d.tie)
    d.site["widest_tie"] = widest;
  else if (d.positions_differing)
    d.site["first_not_a_tie"] = bad;
  return d;
}

Result<std::vector<ops::Value>> run_reference_with_decisions(
    std::shared_ptr<const ir::Graph> graph, const std::map<std::string, ops::Value>& inputs,
    const std::map<std::string, std::pair<Tensor, Tensor>>& topk) {
  ops::Interpreter interp(graph);
  interp.place_outputs = [&](const ir::Node& n, std::vector<ops::Value>& outs) {
    auto f = topk.find(n.name);
    if (f == topk.end() || n.op_type != "TopK" || outs.size() < 2) return;
    outs[0] = ops::Value(f->second.first);
    outs[1] = ops::Value(f->second.second);
  };
  return interp.run(inputs);
}

}  // namespace kiln::tools::compare
