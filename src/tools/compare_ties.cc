// kiln compare --detections: near ties at ranking decisions. A detector ranks candidates by score (the
// RPN's TopK of objectness, a pre-NMS top-k, NonMaxSuppression's greedy pass in score order) and keeps
// the first ones: when two candidates' scores lie within the compare's tolerance of each other,
// rounding differences far below that tolerance may rank them either way, and a different candidate
// then survives. Both runs are right — the reference's scores cannot tell the two apart — but the
// detections that follow can differ by more than any tolerance (a box refined from another proposal).
// Loosening tolerances would hide real faults; instead compare checks the tie and replays it.
//
// Decision sites: every TopK (its indices) and NonMaxSuppression (its selection) the reference runs,
// in the main graph and in If/Loop/Scan bodies (nested too), one site per execution: keyed by the
// decision's output name and its occurrence ("idx#0", the third Loop iteration's "sel#2"). The engine
// is observed under the same keys (its layers and body layers keep those output names).
//
// 1. A near tie: a site whose engine decision differs from the reference's must be explained, in the
//    reference's own inputs of that site, by ties within tolerance (Polygraphy's rule of
//    compare_internal.h):
//    - TopK: at every position where the engine's index differs, the key it chose lies within the
//      keys' atol/rtol of the key the reference chose there;
//    - NonMaxSuppression: the engine's selection is what the greedy pass selects when it may order
//      candidates whose scores are within the scores' atol/rtol either way, and may decide either way
//      a score within tolerance of score_threshold or an IoU within the boxes' atol/rtol of
//      iou_threshold; every other step must be the reference's (a candidate clearly better than the
//      engine's pick, not suppressed, fails it; so does one the engine left out).
//    A difference that is not such a tie is a real divergence: nothing is explained, nothing replayed.
// 2. The replay: the reference interpreter runs again with the tied site resolved the engine's way (its
//    decision; a TopK's values are the reference's keys at the engine's indices); everything else is
//    the reference's arithmetic. A site after a tie sees inputs the tie changed (the proposals NMS
//    ranks come from the RPN's TopK), so sites are checked in execution order, one tie per replay,
//    until no site differs. The detections are then compared with the usual rule, unchanged
//    tolerances: they pass only when the engine agrees with the reference everywhere except for the
//    ties' outcomes. A fault after a tie still fails.
#include <cmath>
#include <set>

#include "ops/interpreter.h"
#include "ops/nms_grid.h"
#include "tools/compare_internal.h"

namespace kiln::tools::compare {

namespace {
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

bool same_tensor(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (a.get_f64(i) != b.get_f64(i)) return false;
  return true;
}

// The reference interpreter that records every decision site it runs (inputs and outputs, in execution
// order) and replaces the outputs of the sites `forced` names.
class DecidingInterpreter : public ops::Interpreter {
 public:
  DecidingInterpreter(std::shared_ptr<const ir::Graph> g, const Decisions* forced, std::vector<DecisionSite>* sites)
      : Interpreter(std::move(g)), forced_(forced), sites_(sites) {}

 protected:
  Status run_layer(const ir::Graph& g, size_t i, const ops::OpSchema& schema,
                   const std::vector<const ops::Value*>& inputs, bool top_level,
                   std::vector<ops::Value>& outs) override {
    const ir::Node& n = g.nodes[i];
    KILN_RETURN_IF_ERROR(Interpreter::run_layer(g, i, schema, inputs, top_level, outs));
    const std::string* out = decision_output(n);
    if (!out) return Status::Ok();
    const std::string key = *out + "#" + std::to_string(occurrences_[*out]++);
    if (forced_)
      if (auto f = forced_->find(key); f != forced_->end())
        for (size_t o = 0; o < f->second.size() && o < outs.size(); ++o)
          if (f->second[o].defined()) outs[o] = ops::Value(f->second[o]);
    if (sites_) {
      DecisionSite s{key, &n, {}, {}};
      for (const ops::Value* v : inputs) s.inputs.push_back(v && v->is_tensor() ? v->tensor : Tensor());
      for (const ops::Value& v : outs) s.outputs.push_back(v.is_tensor() ? v.tensor : Tensor());
      sites_->push_back(std::move(s));
    }
    return Status::Ok();
  }

 private:
  const Decisions* forced_;
  std::vector<DecisionSite>* sites_;
  std::map<std::string, int64_t> occurrences_;
};

void collect_decision_outputs(const ir::Graph& g, std::set<std::string>* names) {
  for (const auto& n : g.nodes) {
    if (const std::string* o = decision_output(n)) names->insert(*o);
    for (const auto& [attr_name, a] : n.attrs) {
      if (a.g) collect_decision_outputs(*a.g, names);
      for (const auto& body : a.graphs)
        if (body) collect_decision_outputs(*body, names);
    }
  }
}

// One site's difference, classified: the decision the replay forces on a tie.
Result<TopKDifference> classify_site(const CompareOptions& o, const DecisionSite& s, const Tensor& test) {
  const ir::Node& n = *s.node;
  auto defined = [&](size_t i) { return i < s.inputs.size() && s.inputs[i].defined(); };
  if (n.op_type == "TopK") {
    if (!defined(0) || s.outputs.size() < 2) return InvalidArgument("TopK '", n.name, "': keys or indices missing");
    if (!dtype_is_float(s.inputs[0].dtype()))
      return InvalidArgument("TopK '", n.name, "': its keys are ", s.inputs[0].describe(),
                             ": integer keys have no near tie");
    if (test.shape() != s.outputs[1].shape() || test.dtype() != s.outputs[1].dtype()) {
      TopKDifference d;
      d.positions_differing = std::max<int64_t>(1, test.numel());
      d.site = {
          {"layer", n.name},
          {"op", n.op_type},
          {"positions_differing", d.positions_differing},
          {"why", "the engine's indices are " + test.describe() + ", the reference's " + s.outputs[1].describe()}};
      return d;
    }
    KILN_ASSIGN_OR_RETURN(double atol, tolerance_for(o.atol, n.inputs[0], o.default_atol));
    KILN_ASSIGN_OR_RETURN(double rtol, tolerance_for(o.rtol, n.inputs[0], o.default_rtol));
    return classify_topk_difference(n, s.inputs[0], s.outputs[1], test, atol, rtol, o.rel_floor);
  }
  if (!defined(0) || !defined(1) || s.outputs.empty())
    return InvalidArgument("NonMaxSuppression '", n.name, "': boxes, scores or selection missing");
  NmsTolerances tol;
  KILN_ASSIGN_OR_RETURN(tol.score_atol, tolerance_for(o.atol, n.inputs[1], o.default_atol));
  KILN_ASSIGN_OR_RETURN(tol.score_rtol, tolerance_for(o.rtol, n.inputs[1], o.default_rtol));
  KILN_ASSIGN_OR_RETURN(tol.iou_atol, tolerance_for(o.atol, n.inputs[0], o.default_atol));
  KILN_ASSIGN_OR_RETURN(tol.iou_rtol, tolerance_for(o.rtol, n.inputs[0], o.default_rtol));
  tol.rel_floor = o.rel_floor;
  return classify_nms_difference(n, s.inputs, s.outputs[0], test, tol);
}
}  // namespace

const std::string* decision_output(const ir::Node& n) {
  if (!n.domain.empty()) return nullptr;
  if (n.op_type == "TopK" && n.has_output(1)) return &n.outputs[1];
  if (n.op_type == "NonMaxSuppression" && n.has_output(0)) return &n.outputs[0];
  return nullptr;
}

Result<json> resolve_near_ties(const CompareOptions& o, std::shared_ptr<const ir::Graph> graph,
                               const std::map<std::string, ops::Value>& inputs,
                               const std::map<std::string, Tensor>& test, std::vector<ops::Value>* replayed_out) {
  json report = {{"ties", json::array()}, {"divergences", json::array()}, {"replays", 0}};
  replayed_out->clear();
  Decisions forced;
  constexpr int kMaxReplays = 64;
  for (int round = 0;; ++round) {
    std::vector<DecisionSite> sites;
    DecidingInterpreter interp(graph, &forced, &sites);
    KILN_ASSIGN_OR_RETURN(std::vector<ops::Value> outs, interp.run(inputs));
    const DecisionSite* differing = nullptr;
    for (const DecisionSite& s : sites) {
      auto t = test.find(s.key);
      if (forced.count(s.key) || t == test.end()) continue;
      const Tensor& ref = s.node->op_type == "TopK" ? s.outputs[1] : s.outputs[0];
      if (!same_tensor(ref, t->second)) {
        differing = &s;
        break;
      }
    }
    if (!differing) {
      if (!forced.empty()) *replayed_out = std::move(outs);
      return report;
    }
    if (round >= kMaxReplays) {
      report["note"] = "stopped after " + std::to_string(kMaxReplays) + " replays: more sites differ";
      return report;
    }
    const Tensor& t = test.at(differing->key);
    // A difference the rule cannot read (integer keys, a malformed selection) explains nothing: a
    // divergence, with why.
    auto classified = classify_site(o, *differing, t);
    TopKDifference d;
    if (classified.ok()) {
      d = std::move(classified).value();
    } else {
      d.site = {{"layer", differing->node->name},
                {"positions_differing", std::max<int64_t>(1, t.numel())},
                {"why", classified.status().message()}};
    }
    d.site["site"] = differing->key;
    d.site["op"] = differing->node->op_type;
    if (!d.tie) {
      report["divergences"].push_back(d.site);
      return report;
    }
    report["ties"].push_back(d.site);
    report["replays"] = round + 1;
    if (differing->node->op_type == "TopK")
      forced[differing->key] = {d.forced_values, t};
    else
      forced[differing->key] = {t};
  }
}

Result<json> explain_by_near_ties(const CompareOptions& o, const Runners& r,
                                  const std::map<std::string, ops::Value>& inputs,
                                  std::vector<std::pair<std::string, Tensor>>* replayed_out) {
  std::set<std::string> names;  // decision outputs of the reference's graph and its bodies
  collect_decision_outputs(*r.model.graph, &names);
  if (names.empty()) return json{{"ties", json::array()}, {"divergences", json::array()}, {"replays", 0}};
  // The engine's decisions under the same keys (clones: arena slots are reused).
  std::map<std::string, Tensor> test;
  std::map<std::string, int64_t> seen;
  KILN_RETURN_IF_ERROR(
      detail::run_engine_observed_layers(*r.engine, inputs,
                                         [&](const ir::Graph&, const ir::Node& n, const std::vector<const ops::Value*>&,
                                             const std::vector<ops::Value>& outs) {
                                           for (size_t i = 0; i < outs.size() && i < n.outputs.size(); ++i)
                                             if (names.count(n.outputs[i]) && outs[i].is_tensor())
                                               test[n.outputs[i] + "#" + std::to_string(seen[n.outputs[i]]++)] =
                                                   outs[i].tensor.clone();
                                         })
          .status());
  std::vector<ops::Value> outs;
  KILN_ASSIGN_OR_RETURN(json report, resolve_near_ties(o, r.model.graph, inputs, test, &outs));
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

Result<std::vector<ops::Value>> run_reference_with_decisions(std::shared_ptr<const ir::Graph> graph,
                                                             const std::map<std::string, ops::Value>& inputs,
                                                             const Decisions& decisions,
                                                             std::vector<DecisionSite>* sites) {
  DecidingInterpreter interp(std::move(graph), &decisions, sites);
  return interp.run(inputs);
}

}  // namespace kiln::tools::compare
