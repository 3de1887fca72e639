// kiln compare: runs the same inputs through two runners (the reference interpreter on the
// unoptimized model, an engine built with kiln build's options or loaded from a .kiln file, a
// reference engine (--ref-engine FP32.kiln, or the model built in memory at FP32: the precision
// boundary), or saved framework outputs) and compares every output; finds the first engine layer
// that leaves tolerance with fusions still on; runs the numerics guard on each runner
// (--check-numerics); writes and replays repro bundles. This file runs the command;
// compare_internal.h lists the other pieces (statistics, divergence search, reports, bundles).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <tuple>

#include "core/npy.h"
#include "engine/engine_impl.h"
#include "engine/numerics_guard.h"
#include "ir/rewrite.h"
#include "onnx/importer.h"
#include "ops/deadline.h"
#include "ops/interpreter.h"
#include "tools/commands.h"
#include "tools/compare_internal.h"
#include "tools/inputs.h"

namespace kiln::tools {

namespace compare {

void to_json(json& j, const CompareOptions& o) {
  j = static_cast<const CompareSpec&>(o);
  j.update(json(o.build));
}

void from_json(const json& j, CompareOptions& o) {
  static_cast<CompareSpec&>(o) = j.get<CompareSpec>();
  o.build = j.get<BuildFlags>();
}

BuildFlags reference_build_flags(BuildFlags f) {
  // Every precision flag: the in-memory reference is the FP32 engine of the same model and passes.
  f.fp16 = f.bf16 = f.int8 = f.best = f.strongly_typed = false;
  f.fp32 = true;
  f.layer_precisions.clear();
  f.calib_data.clear();
  f.calib_cache.clear();
  return f;
}

std::string engine_precision(const detail::EngineImpl& e) {
  return e.build.contains("config") ? e.build["config"].value("precision", "fp32") : "fp32";
}

namespace {

Result<std::shared_ptr<Engine>> load_engine(const std::string& path) {
  try {
    return Engine::load(path);
  } catch (const Error& e) {
    return detail_status(e);
  }
}

std::shared_ptr<detail::EngineImpl> impl_of(const std::shared_ptr<Engine>& holder) {
  return std::const_pointer_cast<detail::EngineImpl>(
      std::shared_ptr<const detail::EngineImpl>(holder, &holder->impl()));
}

// Random inputs of dynamic dims take an engine's first profile's opt shapes (as kiln run does).
std::map<std::string, Dims> engine_default_shapes(const Runners& r) {
  std::map<std::string, Dims> shapes;
  for (const auto* e : {r.engine.get(), r.ref_engine.get()})
    if (e && shapes.empty() && !e->profiles.empty())
      for (const auto& [name, range] : e->profiles[0].inputs) shapes[name] = range.opt;
  return shapes;
}

Status compare_inputs(const CompareOptions& o, const ir::Graph& g, const std::map<std::string, Dims>& default_shapes,
                      std::map<std::string, ops::Value>& inputs, json& info) {
  InputOptions in;
  in.inputs = o.inputs;
  in.files = o.input_files;
  in.shapes = o.shapes;
  in.ranges = o.input_ranges;
  in.seed = o.seed;
  in.random = o.random_inputs;
  KILN_ASSIGN_OR_RETURN(LoadedInputs loaded, load_inputs(in, g, default_shapes));
  inputs = std::move(loaded.values);
  if (!o.inputs.empty()) info["source"] = o.inputs;
  info["generated"] = loaded.generated;
  info["seed"] = o.seed;
  json list = json::array();
  for (const auto& [name, v] : inputs) list.push_back({{"name", name}, {"summary", summarize(name, v)}});
  info["values"] = list;
  return Status::Ok();
}

Result<std::shared_ptr<detail::EngineImpl>> build_in_memory(const Runners& r, const BuildFlags& flags) {
  KILN_ASSIGN_OR_RETURN(BuilderConfig cfg, builder_config(flags));
  ir::Model copy = r.model;
  copy.graph = ir::deep_copy(*r.model.graph);
  return detail::build_engine(std::move(copy), cfg);
}

Result<Runners> make_runners(const CompareOptions& o, json& build) {
  Runners r;
  if (!o.model.empty()) {
    KILN_ASSIGN_OR_RETURN(r.model, onnx_import::load_model(o.model));
    KILN_RETURN_IF_ERROR(ops::check_supported(*r.model.graph));
    r.have_onnx_model = true;
  }
  if (o.ref == "engine") {
    if (!o.ref_engine_file.empty()) {
      KILN_ASSIGN_OR_RETURN(r.ref_engine_holder, load_engine(o.ref_engine_file));
      r.ref_engine = impl_of(r.ref_engine_holder);
      r.ref_build = r.ref_engine->build;
      r.ref_build["engine_file"] = o.ref_engine_file;
    } else {
      KILN_ASSIGN_OR_RETURN(r.ref_engine, build_in_memory(r, reference_build_flags(o.build)));
      r.ref_build = r.ref_engine->build;
      r.ref_build["engine_file"] = nullptr;
    }
  }
  if (o.test == "engine" || o.find_divergence) {
    if (!o.engine_file.empty()) {
      warn_ignored_build_flags(o.build_flags_given, o.engine_file);
      KILN_ASSIGN_OR_RETURN(r.engine_holder, load_engine(o.engine_file));
      r.engine = impl_of(r.engine_holder);
      build = r.engine->build;
      build["engine_file"] = o.engine_file;
    } else {
      KILN_ASSIGN_OR_RETURN(r.engine, build_in_memory(r, o.build));
      build = r.engine->build;
      build["engine_file"] = nullptr;
    }
  }
  // Two engine files and no model: the reference engine's graph declares the inputs and outputs.
  if (!r.have_onnx_model) r.model = r.ref_engine ? r.ref_engine->model : r.engine->model;
  return r;
}

// The detection heads' verdicts (--detections, or outputs named boxes/scores[/labels]).
Result<json> detection_verdicts(const CompareOptions& o, const ir::Graph& g,
                                const std::vector<std::pair<std::string, Tensor>>& ref_out,
                                const std::vector<std::pair<std::string, Tensor>>& test_out) {
  auto find = [](const std::vector<std::pair<std::string, Tensor>>& v, const std::string& n) -> const Tensor* {
    for (const auto& [k, t] : v)
      if (k == n || sanitize_name(k) == n || k == sanitize_name(n)) return &t;
    return nullptr;
  };
  std::vector<DetectionHead> heads;
  bool none = std::find(o.detections.begin(), o.detections.end(), "none") != o.detections.end();
  if (none && o.detections.size() > 1) return InvalidArgument("--detections none cannot go with other heads");
  for (const auto& spec : o.detections) {
    if (spec == "none") continue;
    KILN_ASSIGN_OR_RETURN(DetectionHead h, parse_detection_head(spec));
    for (const std::string* n : {&h.boxes, &h.scores, &h.labels}) {
      if (n->empty()) continue;
      bool is_output = std::any_of(g.outputs.begin(), g.outputs.end(), [&](const auto& v) { return v.name == *n; });
      if (!is_output) return InvalidArgument("--detections ", spec, ": '", *n, "' is not an output of the model");
    }
    heads.push_back(h);
  }
  if (o.detections.empty()) {
    // torchvision's detection exports name their outputs boxes, scores, labels.
    const Tensor *b = find(ref_out, "boxes"), *s = find(ref_out, "scores"), *l = find(ref_out, "labels");
    if (b && s) {
      DetectionHead h;
      h.boxes = "boxes";
      h.scores = "scores";
      h.labels = l ? "labels" : "";
      h.automatic = true;
      h.note = "compared as detections because the outputs are named boxes, scores" + std::string(l ? ", labels" : "") +
               " (--detections none: elementwise)";
      if (l && !dtype_is_float(s->dtype()) && dtype_is_float(l->dtype())) {
        std::swap(h.scores, h.labels);
        h.note += "; the output named 'scores' holds " + std::string(dtype_name(s->dtype())) + " and 'labels' holds " +
                  dtype_name(l->dtype()) + ": 'labels' taken as the scores, 'scores' as the labels";
      }
      h.spec = h.boxes + "," + h.scores + (h.labels.empty() ? "" : "," + h.labels);
      heads.push_back(h);
    }
  }
  std::optional<double> thr;
  std::string thr_note;
  if (o.det_threshold == "none") {
  } else if (!o.det_threshold.empty()) {
    char* end = nullptr;
    thr = std::strtod(o.det_threshold.c_str(), &end);
    if (*end != '\0') return InvalidArgument("--det-threshold '", o.det_threshold, "' is not a number or none");
    thr_note = "given with --det-threshold";
  } else if (!heads.empty()) {
    if (auto t = read_score_threshold(g)) thr = t->first, thr_note = t->second;
  }
  if (!(o.det_iou > 0 && o.det_iou <= 1)) return InvalidArgument("--det-iou must be in (0, 1]");
  json out = json::array();
  for (const auto& h : heads) {
    DetectionSides rs, ts;
    for (auto [name, slot_r, slot_t] :
         {std::tuple{&h.boxes, &rs.boxes, &ts.boxes}, std::tuple{&h.scores, &rs.scores, &ts.scores},
          std::tuple{&h.labels, &rs.labels, &ts.labels}}) {
      if (name->empty()) continue;
      *slot_r = find(ref_out, *name);
      *slot_t = find(test_out, *name);
      if (!*slot_r) return InvalidArgument("--detections ", h.spec, ": the reference has no output '", *name, "'");
      if (!*slot_t) return InvalidArgument("--detections ", h.spec, ": the test runner has no output '", *name, "'");
    }
    DetTolerances tol{};
    KILN_ASSIGN_OR_RETURN(tol.score_atol, tolerance_for(o.atol, h.scores, o.default_atol));
    KILN_ASSIGN_OR_RETURN(tol.score_rtol, tolerance_for(o.rtol, h.scores, o.default_rtol));
    KILN_ASSIGN_OR_RETURN(tol.box_atol, tolerance_for(o.atol, h.boxes, o.default_atol));
    KILN_ASSIGN_OR_RETURN(tol.box_rtol, tolerance_for(o.rtol, h.boxes, o.default_rtol));
    tol.rel_floor = o.rel_floor;
    Result<json> v = compare_detections(h, rs, ts, tol, o.det_iou, thr);
    if (!v.ok() && h.automatic) {
      std::printf("note: outputs %s not compared as detections (%s); compared elementwise\n", h.spec.c_str(),
                  v.status().message().c_str());
      continue;
    }
    KILN_RETURN_IF_ERROR(v.status());
    json j = std::move(v).value();
    j["score_threshold_source"] = thr ? json(thr_note) : json(nullptr);
    out.push_back(j);
  }
  return out;
}

}  // namespace

Result<int> run_compare(CompareOptions o, const std::string& json_path, const std::string& html_path,
                        const json* replay_of, json* report_out) {
  if (!o.ref_engine_file.empty()) {
    if (o.ref != "onnx" && o.ref != "engine")
      return InvalidArgument("--ref-engine cannot go with --ref ", o.ref, ": the reference is the engine");
    o.ref = "engine";
  }
  if (o.model.empty() && !(o.ref == "engine" && !o.ref_engine_file.empty() && !o.engine_file.empty()))
    return InvalidArgument(
        "give the model (model.onnx), or --replay DIR, or two engine files (--ref-engine A.kiln --engine B.kiln)");
  if (o.model.empty() && (o.test == "onnx" || (o.find_divergence && o.ref != "engine")))
    return InvalidArgument("--test onnx and --find-divergence against the ONNX reference need the model (model.onnx)");
  if (o.test != "engine" && o.test != "onnx") return InvalidArgument("--test must be engine or onnx");
  if (o.ref == o.test && o.ref != "engine")
    return InvalidArgument("--ref and --test are both '", o.ref, "': nothing to compare");
  if (o.check_error_stat != "elemwise" && o.check_error_stat != "max" && o.check_error_stat != "mean" &&
      o.check_error_stat != "median")
    return InvalidArgument("--check-error-stat must be max, mean, median or elemwise");
  bool ref_is_file = o.ref != "onnx" && o.ref != "engine";
  json build = nullptr;
  KILN_ASSIGN_OR_RETURN(Runners r, make_runners(o, build));
  // Outputs no --atol/--rtol names take the tolerances of the least precise engine taking part.
  const DefaultTolerances dtol = default_tolerances({r.engine.get(), r.ref_engine.get()});
  o.default_atol = dtol.atol;
  o.default_rtol = dtol.rtol;
  const ir::Graph& g = *r.model.graph;
  std::map<std::string, ops::Value> inputs;
  json in_info = json::object();
  KILN_RETURN_IF_ERROR(compare_inputs(o, g, engine_default_shapes(r), inputs, in_info));
  NumericsCheck check;
  check.enabled = o.check_numerics;
  check.int8_saturation = o.int8_saturation;
  std::optional<NumericsReport> ref_numerics, test_numerics;
  // An engine's run, through the numerics guard when it is on.
  auto run_engine_side = [&](const detail::EngineImpl& e,
                             std::optional<NumericsReport>& report) -> Result<std::vector<ops::Value>> {
    ops::DeadlineScope deadline(deadline_after(o.deadline_s));
    if (!check.enabled) return detail::run_engine(e, inputs);
    NumericsReport rep;
    KILN_ASSIGN_OR_RETURN(auto outs, detail::run_engine_checked(e, inputs, check, &rep));
    report = std::move(rep);
    return outs;
  };
  if (!o.save_inputs.empty()) {
    std::vector<std::pair<std::string, Tensor>> ins;
    for (const auto& [k, v] : inputs)
      if (v.is_tensor()) ins.emplace_back(k, v.tensor);
    KILN_RETURN_IF_ERROR(write_npz(o.save_inputs, ins));
  }
  // Reference outputs.
  std::vector<std::pair<std::string, Tensor>> ref_out, test_out;
  std::vector<ops::Value> onnx_outs;
  bool have_onnx = false;
  std::optional<NumericsReport> onnx_numerics;
  auto run_onnx = [&]() -> Status {
    if (have_onnx) return Status::Ok();
    ops::Interpreter interp(r.model.graph);
    std::unique_ptr<engine::NumericsGuard> guard;
    if (check.enabled) {
      guard = std::make_unique<engine::NumericsGuard>(r.model.graph, check);
      guard->attach(interp);
      guard->begin_run(inputs);
    }
    ops::DeadlineScope deadline(deadline_after(o.deadline_s));
    KILN_ASSIGN_OR_RETURN(onnx_outs, interp.run(inputs));
    if (guard) onnx_numerics = guard->report();
    have_onnx = true;
    return Status::Ok();
  };
  if (ref_is_file) {
    KILN_ASSIGN_OR_RETURN(ref_out, read_npz(o.ref));
    for (const auto& [name, t] : ref_out) {
      bool found = false;
      for (const auto& out : g.outputs) found |= out.name == name || sanitize_name(out.name) == name;
      if (!found) return InvalidArgument("'", o.ref, "' has '", name, "', which is not an output of the model");
    }
  } else if (o.ref == "engine") {
    KILN_ASSIGN_OR_RETURN(auto routs, run_engine_side(*r.ref_engine, ref_numerics));
    for (size_t i = 0; i < routs.size() && i < g.outputs.size(); ++i)
      if (routs[i].is_tensor()) ref_out.emplace_back(g.outputs[i].name, routs[i].tensor);
  } else {
    KILN_RETURN_IF_ERROR(run_onnx());
    ref_numerics = onnx_numerics;
    for (size_t i = 0; i < onnx_outs.size(); ++i)
      if (onnx_outs[i].is_tensor()) ref_out.emplace_back(g.outputs[i].name, onnx_outs[i].tensor);
  }
  // Test outputs.
  std::vector<ops::Value> touts;
  if (o.test == "onnx") {
    KILN_RETURN_IF_ERROR(run_onnx());
    touts = onnx_outs;
    test_numerics = onnx_numerics;
  } else {
    KILN_ASSIGN_OR_RETURN(touts, run_engine_side(*r.engine, test_numerics));
  }
  for (size_t i = 0; i < touts.size() && i < g.outputs.size(); ++i)
    if (touts[i].is_tensor()) test_out.emplace_back(g.outputs[i].name, touts[i].tensor);

  auto engine_label = [](const detail::EngineImpl& e, const std::string& file) {
    return "engine " + (file.empty() ? std::string("(built in memory, ") : file + " (") + engine_precision(e) + ", " +
           std::to_string(e.layers.size()) + " layers)";
  };
  std::string ref_label = ref_is_file         ? "framework outputs " + o.ref
                          : o.ref == "engine" ? engine_label(*r.ref_engine, o.ref_engine_file)
                                              : "onnx (reference interpreter, unoptimized model)";
  std::string test_label =
      o.test == "onnx" ? "onnx (reference interpreter, unoptimized model)" : engine_label(*r.engine, o.engine_file);
  std::string ref_side = ref_is_file ? "framework" : o.ref == "engine" ? "engine" : "onnx-reference";
  std::string test_side = o.test == "onnx" ? "onnx-reference" : "engine";
  // At the precision boundary both sides are engines: say which precision each runs.
  if (o.ref == "engine" && o.test == "engine") {
    ref_side = engine_precision(*r.ref_engine) + " engine";
    test_side = engine_precision(*r.engine) + " engine";
  }
  json rep = {
      {"model", o.model.empty() ? o.ref_engine_file : o.model},
      {"ref", ref_label},
      {"test", test_label},
      {"boundary", ref_side + " -> " + test_side},
      {"inputs", in_info},
      {"check_error_stat", o.check_error_stat},
      {"rel_floor", o.rel_floor},
      {"default_tolerances", {{"format", dtol.format}, {"atol", dtol.atol}, {"rtol", dtol.rtol}, {"note", dtol.note}}},
      {"build", build},
      {"ref_build", o.ref == "engine" ? r.ref_build : json(nullptr)},
      {"versions", versions_json(r.model)}};
  json outs = json::array();
  int passed = 0;
  bool all = true;
  KILN_ASSIGN_OR_RETURN(json dets, detection_verdicts(o, g, ref_out, test_out));
  // A failed head against the reference interpreter: a near tie at a TopK may explain it, checked by
  // replaying the tie the engine's way on the reference (compare_ties.cc); tolerances stay as given.
  if (o.ref == "onnx" && !ref_is_file && o.test == "engine" && r.engine &&
      std::any_of(dets.begin(), dets.end(), [](const json& d) { return !d["pass"].get<bool>(); })) {
    ops::DeadlineScope deadline(deadline_after(o.deadline_s));
    std::vector<std::pair<std::string, Tensor>> replayed;
    KILN_ASSIGN_OR_RETURN(json ties, explain_by_near_ties(o, r, inputs, &replayed));
    json again = json::array();
    if (!replayed.empty()) {
      KILN_ASSIGN_OR_RETURN(again, detection_verdicts(o, g, replayed, test_out));
    }
    for (size_t i = 0; i < dets.size(); ++i) {
      json& d = dets[i];
      if (d["pass"].get<bool>()) continue;
      d["near_ties"] = ties;
      if (i >= again.size()) continue;
      json a = again[i];
      a["near_ties"] = ties;
      a["score_threshold_source"] = d["score_threshold_source"];
      a["replayed"] = true;
      a["before_replay"] = {{"why", d["why"]},
                            {"failed_pairs", d["failed_pairs"]},
                            {"unmatched", d["unmatched"]},
                            {"max_iou_deficit", d["max_iou_deficit"]},
                            {"max_score_diff", d["max_score_diff"]}};
      if (!a["pass"].get<bool>())
        a["why"] = a["why"].get<std::string>() + " (after replaying the near tie(s) the engine's way on the reference)";
      d = a;
    }
  }
  std::set<std::string> det_outputs;
  for (const auto& d : dets) {
    for (const char* k : {"boxes", "scores", "labels"})
      if (d[k].is_string()) det_outputs.insert(d[k].get<std::string>());
    all &= d["pass"].get<bool>();
  }
  for (const auto& [rname, rt] : ref_out) {
    auto it = std::find_if(test_out.begin(), test_out.end(),
                           [&](const auto& p) { return p.first == rname || sanitize_name(p.first) == rname; });
    if (it == test_out.end()) return InvalidArgument("output '", rname, "' was not produced by the test runner");
    if (det_outputs.count(it->first)) continue;
    const Tensor& tt = it->second;
    KILN_ASSIGN_OR_RETURN(double atol, tolerance_for(o.atol, it->first, o.default_atol));
    KILN_ASSIGN_OR_RETURN(double rtol, tolerance_for(o.rtol, it->first, o.default_rtol));
    Stats s = compute_stats(rt, tt, atol, rtol, o.rel_floor, o.check_error_stat, o.worst);
    bool dtype_ok = rt.dtype() == tt.dtype();
    json jo = {{"name", it->first},
               {"ref_desc", rt.describe()},
               {"test_desc", tt.describe()},
               {"dtype_match", dtype_ok},
               {"shape_match", rt.shape() == tt.shape()},
               {"stats", stats_json(s)}};
    bool ok = s.pass && dtype_ok;
    if (!dtype_ok && s.why.empty()) jo["stats"]["why"] = "dtype differs";
    bool classifier = std::find(o.classifiers.begin(), o.classifiers.end(), it->first) != o.classifiers.end();
    if (!classifier && o.classifiers.empty())
      classifier = rt.rank() == 2 && dtype_is_float(rt.dtype()) && rt.dim(1) > 1;
    if (classifier && s.comparable && rt.rank() >= 1 && rt.dtype() != DataType::kString && rt.numel())
      jo["classifier"] = classifier_json(rt, tt, o.top_k);
    for (const auto& spec : o.thresholds) {
      size_t c = spec.rfind(':');
      if (c == std::string::npos) return InvalidArgument("--threshold '", spec, "' must look like NAME:VALUE");
      if (spec.substr(0, c) != it->first) continue;
      double v = std::strtod(spec.c_str() + c + 1, nullptr);
      int64_t cross = 0;
      if (s.comparable && rt.dtype() != DataType::kString)
        for (int64_t i = 0; i < rt.numel(); ++i) cross += (rt.get_f64(i) > v) != (tt.get_f64(i) > v);
      jo["thresholds"].push_back({{"value", v}, {"crossings", cross}});
    }
    jo["pass"] = ok;
    passed += ok;
    all &= ok;
    outs.push_back(jo);
  }
  for (const auto& spec : o.thresholds) {
    std::string name = spec.substr(0, spec.rfind(':'));
    if (std::none_of(ref_out.begin(), ref_out.end(), [&](const auto& p) { return p.first == name; }))
      return InvalidArgument("--threshold names '", name, "', which is not a compared output");
  }
  rep["outputs"] = outs;
  rep["outputs_passed"] = passed;
  rep["detections"] = dets;
  if (o.find_divergence) {
    Status st = Status::Ok();
    ops::DeadlineScope deadline(deadline_after(o.deadline_s));
    json d = find_divergence(o, r, inputs, &st);
    KILN_RETURN_IF_ERROR(st);
    rep["divergence"] = d;
    all &= d["first"].is_null();
  }
  if (check.enabled) {
    // Fails on an error of the runner under test that the reference does not share (a model that
    // makes Inf on purpose makes it on both sides: not a finding of this boundary).
    json nj = json::object();
    if (ref_numerics) nj["ref"] = engine::numerics_json(*ref_numerics);
    if (test_numerics) nj["test"] = engine::numerics_json(*test_numerics);
    nj["first_new_error"] = nullptr;
    if (test_numerics)
      for (const auto& f : test_numerics->findings) {
        if (f.warning) continue;
        bool shared = ref_numerics && std::any_of(ref_numerics->findings.begin(), ref_numerics->findings.end(),
                                                  [&](const NumericsFinding& x) {
                                                    return !x.warning && x.kind == f.kind && x.output == f.output;
                                                  });
        if (shared) continue;
        nj["first_new_error"] = nj["test"]["findings"][static_cast<size_t>(&f - test_numerics->findings.data())];
        break;
      }
    all &= nj["first_new_error"].is_null();
    rep["numerics"] = nj;
  }
  rep["pass"] = all;
  if (replay_of) {
    // Same numbers as the bundle: per output max/mean abs error and outside counts, and the same
    // first divergent layer.
    bool same = true;
    const json& old = (*replay_of)["report"];
    for (size_t i = 0; i < outs.size(); ++i) {
      const json* prev = nullptr;
      for (const auto& x : old["outputs"])
        if (x["name"] == outs[i]["name"]) prev = &x;
      same &= prev && (*prev)["stats"]["abs_err"] == outs[i]["stats"]["abs_err"] &&
              (*prev)["stats"]["outside_tolerance"] == outs[i]["stats"]["outside_tolerance"];
    }
    const json old_dets = old.value("detections", json::array());
    for (const auto& d : rep["detections"]) {
      const json* prev = nullptr;
      for (const auto& x : old_dets)
        if (x["spec"] == d["spec"]) prev = &x;
      for (const char* k : {"matched", "max_iou_deficit", "max_score_diff", "unexplained", "pass"})
        same &= prev && (*prev)[k] == d[k];
    }
    auto first_name = [](const json& x) {
      return x.contains("divergence") && !x["divergence"]["first"].is_null() ? x["divergence"]["first"]["name"]
                                                                             : json(nullptr);
    };
    same &= first_name(old) == first_name(rep);
    rep["replay"] = {{"bundle_command", (*replay_of)["command"]}, {"reproduced", same}};
  }
  if (report_out) *report_out = rep;
  const bool print = !report_out;
  if (print) print_text(rep);
  if (print && check.enabled) {
    if (ref_numerics)
      for (const auto& line : engine::numerics_lines(*ref_numerics, "reference: " + ref_label))
        std::printf("%s\n", line.c_str());
    if (test_numerics)
      for (const auto& line : engine::numerics_lines(*test_numerics, "test: " + test_label))
        std::printf("%s\n", line.c_str());
    const json& fe = rep["numerics"]["first_new_error"];
    if (!fe.is_null())
      std::printf("numerics: FAIL, the runner under test makes %s at layer '%s' where the reference does not\n",
                  fe["kind"].get<std::string>().c_str(), fe["layer"].get<std::string>().c_str());
  }
  if (print && replay_of)
    std::printf("replay: %s\n", rep["replay"]["reproduced"].get<bool>()
                                    ? "reproduces the bundle's numbers exactly"
                                    : "numbers DIFFER from the bundle (see --json)");
  if (!json_path.empty()) std::ofstream(json_path) << rep.dump(1) << "\n";
  if (!html_path.empty()) std::ofstream(html_path) << html_report(rep);
  if (!all && !o.save_failure.empty()) {
    KILN_RETURN_IF_ERROR(write_bundle(o, o.save_failure, inputs, ref_out, test_out, rep));
    std::printf("repro bundle written to %s (replay: kiln compare --replay %s)\n", o.save_failure.c_str(),
                o.save_failure.c_str());
  }
  if (replay_of && !rep["replay"]["reproduced"].get<bool>()) return kExitMismatch;
  return all ? kExitOk : kExitMismatch;
}

}  // namespace compare

void add_compare_command(CLI::App& app, int& exit_code, compare::CompareResult* result) {
  using compare::CompareOptions;
  auto o = std::make_shared<CompareOptions>();
  CLI::App* cmd = app.add_subcommand(
      "compare", "Compare runners on the same inputs (ONNX reference, engine, saved framework outputs)");
  cmd->add_option("model", o->model, "model.onnx");
  cmd->add_option("--ref", o->ref,
                  "reference: onnx (reference interpreter), engine (the model built in memory at FP32 with the other "
                  "build flags; or --ref-engine FILE) or FILE.npz (framework outputs by name)");
  cmd->add_option("--test", o->test, "runner under test: engine (default) or onnx")
      ->check(CLI::IsMember({"engine", "onnx"}));
  cmd->add_option("--engine", o->engine_file, "test this engine file instead of building one in memory");
  cmd->add_option("--ref-engine", o->ref_engine_file,
                  "reference: this engine file (the precision boundary: --ref-engine FP32.kiln --engine INT8.kiln; "
                  "the model may then be left out)");
  auto build_flags = add_build_flags(cmd, o->build, "--build-shapes");
  cmd->add_option("--inputs", o->inputs, "inputs: FILE.npz or a directory of NAME.npy / NAME.pb / input_<i>.pb");
  cmd->add_option("--input", o->input_files, "NAME=FILE (.npy or .pb), repeatable");
  cmd->add_flag("--random-inputs", o->random_inputs,
                "random values for the inputs that --inputs/--input do not give (without it a missing input is an "
                "error)");
  cmd->add_option("--shapes", o->shapes, "shapes of generated inputs: NAME:1x3x224x224,...");
  cmd->add_option("--seed", o->seed, "seed of generated inputs");
  cmd->add_option("--input-range", o->input_ranges, "NAME:lo,hi range of a generated input (repeatable)");
  add_deadline_option(cmd, o->deadline_s);
  cmd->add_option("--save-inputs", o->save_inputs, "write the inputs used to FILE.npz");
  cmd->add_option("--atol", o->atol,
                  "absolute tolerance: VALUE or NAME:VALUE (repeatable; default by the engine's precision: 1e-4 "
                  "fp32, 1e-2 fp16/tf32, 8e-2 bf16)");
  cmd->add_option("--rtol", o->rtol,
                  "relative tolerance: VALUE or NAME:VALUE (repeatable; default by the engine's precision: 1e-3 "
                  "fp32, 1e-2 fp16/tf32, 8e-2 bf16)");
  cmd->add_option("--rel-floor", o->rel_floor, "relative error is |err| / max(|ref|, floor)");
  cmd->add_option("--check-error-stat", o->check_error_stat, "elemwise (default), max, mean or median")
      ->check(CLI::IsMember({"elemwise", "max", "mean", "median"}));
  cmd->add_option("--top-k", o->top_k, "k of the classifier top-k check (default 5)");
  cmd->add_option("--classifier", o->classifiers,
                  "outputs holding class scores on the last axis (default: every float output of rank 2)");
  cmd->add_option("--threshold", o->thresholds, "NAME:VALUE: count elements on different sides of VALUE");
  cmd->add_option("--worst", o->worst, "how many worst elements to list (default 10)");
  cmd->add_flag("--find-divergence", o->find_divergence,
                "find the first engine layer (fusions on) whose output leaves tolerance vs the ONNX reference");
  cmd->add_flag("--check-numerics", o->check_numerics,
                "run the numerics guard on each runner: the first layer making Inf/NaN, exceeding FP16's range or "
                "saturating INT8; fails on an error of the runner under test the reference does not share");
  cmd->add_option("--int8-saturation", o->int8_saturation,
                  "--check-numerics: share of clipped values that makes an int8/uint8 output a finding (default 0.01)")
      ->check(bounded(0, 1));
  cmd->add_option("--detections", o->detections,
                  "BOXES,SCORES[,LABELS]: compare these outputs as detections, order-insensitive (repeatable; "
                  "default: outputs named boxes,scores[,labels]; none: elementwise)");
  cmd->add_option("--det-iou", o->det_iou, "IoU a matched detection pair needs (default 0.99)");
  cmd->add_option("--det-threshold", o->det_threshold,
                  "the detector's score threshold (default: read from the model's `scores > c` nodes; none: no "
                  "threshold)");
  cmd->add_option("--json", o->json_path, "write the full report as JSON");
  cmd->add_option("--html", o->html_path, "write a self-contained HTML report (histograms, per-layer plot)");
  cmd->add_option("--save-failure", o->save_failure, "on failure, write a repro bundle to DIR");
  cmd->add_option("--replay", o->replay, "rerun a repro bundle written by --save-failure");
  cmd->callback([o, build_flags, &exit_code, result]() {
    o->build_flags_given = given_flags(build_flags);
    if (result) {  // the library's compare (include/kiln/compare.h): the report returned, nothing printed
      if (!o->replay.empty()) {
        result->status = InvalidArgument("--replay is a command-line feature: run `kiln compare --replay DIR`");
        return;
      }
      Result<int> r = compare::run_compare(*o, o->json_path, o->html_path, nullptr, &result->report);
      result->status = r.ok() ? Status::Ok() : r.status();
      exit_code = r.ok() ? r.value() : exit_code_for(r.status());
      return;
    }
    Result<int> r = !o->replay.empty() ? compare::replay(o->replay, o->json_path, o->html_path)
                                       : compare::run_compare(*o, o->json_path, o->html_path, nullptr);
    exit_code = r.ok() ? r.value() : report_error(r.status());
  });
}

}  // namespace kiln::tools
