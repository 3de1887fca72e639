// kiln compare's pieces (internal to src/tools/compare*.cc): options, per-output statistics
// (compare_stats.cc), detector outputs compared as detections (compare_detections.cc), the
// first-divergence search (compare_divergence.cc), text and HTML reports
// (compare_report.cc), repro bundles and --replay (compare_bundle.cc); compare.cc runs the command.
//
// Tolerances follow Polygraphy: an element (elemwise) or a statistic (max/mean/median) fails only
// when both its absolute error exceeds atol and its relative error exceeds rtol, with the relative
// error |test - ref| / max(|ref|, rel_floor).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "engine/engine_impl.h"
#include "ir/graph.h"
#include "ops/value.h"
#include "tools/build_flags.h"

namespace kiln::tools::compare {

// |test - ref| within atol, or within rtol of max(|ref|, rel_floor) (the detections' and the ties'
// closeness of two scores or coordinates).
inline bool within(double test, double ref, double atol, double rtol, double rel_floor) {
  double a = std::fabs(test - ref);
  return a <= atol || a / std::max(std::fabs(ref), rel_floor) <= rtol;
}

using nlohmann::json;

constexpr double kDefaultAtol = 1e-4, kDefaultRtol = 1e-3;  // an FP32 engine's (default_tolerances)

// What a bundle records (bundle.json "options") and --replay reruns.
struct CompareSpec {
  std::string model;
  std::string ref = "onnx";     // onnx | engine | FILE.npz (framework outputs)
  std::string test = "engine";  // engine | onnx
  std::string engine_file;      // test this .kiln instead of building in memory
  // ref "engine": this .kiln (--ref-engine), or, empty, the model built in memory at FP32 with the
  // test's other build flags (reference_build_flags).
  std::string ref_engine_file;
  // Inputs.
  std::string inputs;                    // .npz or a directory of .npy / .pb
  std::vector<std::string> input_files;  // NAME=FILE
  std::string shapes;                    // shapes of generated inputs
  uint64_t seed = 0;
  std::vector<std::string> input_ranges;  // NAME:lo,hi
  bool random_inputs = false;             // --random-inputs: fill inputs the files lack
  std::string save_inputs;
  // Checks.
  std::vector<std::string> atol, rtol;  // VALUE or NAME:VALUE
  double rel_floor = 1e-6;
  std::string check_error_stat = "elemwise";
  int top_k = 5;
  std::vector<std::string> classifiers;
  std::vector<std::string> thresholds;  // NAME:VALUE
  int worst = 10;
  bool find_divergence = false;
  // Detector heads compared as detections (compare_detections.cc): BOXES,SCORES[,LABELS] each;
  // "none" turns off the automatic boxes/scores/labels head.
  std::vector<std::string> detections;
  double det_iou = 0.99;
  std::string det_threshold;  // score threshold: VALUE, or empty to read it from the model
  // The numerics guard on every runner that runs (engine/numerics_guard.h).
  bool check_numerics = false;
  double int8_saturation = 0.01;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(CompareSpec, model, ref, test, engine_file, inputs, input_files, shapes,
                                                seed, input_ranges, random_inputs, save_inputs, atol, rtol, rel_floor,
                                                check_error_stat, top_k, classifiers, thresholds, worst,
                                                find_divergence, detections, det_iou, det_threshold, ref_engine_file,
                                                check_numerics, int8_saturation)

struct CompareOptions : CompareSpec {
  // The tolerances of an output no --atol/--rtol names: the engines' precision's (default_tolerances),
  // set by run_compare before anything is compared.
  double default_atol = kDefaultAtol, default_rtol = kDefaultRtol;
  BuildFlags build;                            // as kiln build (build_flags.h)
  std::vector<std::string> build_flags_given;  // on the command line (warned about with --engine)
  double deadline_s = 0;                       // --deadline: per run (reference, engine, divergence search)
  // Reports.
  std::string json_path, html_path, save_failure, replay;
};
// The spec's fields and the build flags side by side in one object (the keys bundles always had).
void to_json(json& j, const CompareOptions& o);
void from_json(const json& j, CompareOptions& o);

// The default atol/rtol of a comparison, from the least precise float format the engines taking part
// compute in (their layers' precisions, TF32 from the target): FP32 keeps kDefaultAtol/kDefaultRtol;
// see compare_stats.cc for the reduced formats' values and why.
struct DefaultTolerances {
  double atol = kDefaultAtol, rtol = kDefaultRtol;
  std::string format = "fp32";  // fp32, tf32, fp16, bf16
  std::string note;             // a caveat printed with them (INT8 layers), or empty
};
DefaultTolerances default_tolerances(const std::vector<const detail::EngineImpl*>& engines);
constexpr const char* kPercentiles[] = {"p50", "p90", "p99", "p99.9", "max"};

// ---- statistics of one output (compare_stats.cc)

// "VALUE" applies to every output, "NAME:VALUE" to one (the last colon splits).
Result<double> tolerance_for(const std::vector<std::string>& specs, const std::string& name, double dflt);

struct Stats {
  bool comparable = false;  // same dtype class and shape
  int64_t n = 0, ref_nan = 0, ref_inf = 0, test_nan = 0, test_inf = 0, nonfinite_mismatch = 0, outside = 0;
  double max_abs = 0, mean_abs = 0, median_abs = 0, max_rel = 0, mean_rel = 0, median_rel = 0;
  std::vector<std::pair<std::string, double>> percentiles;
  int64_t zero_err = 0;              // elements with exactly no error
  std::vector<double> hist_edges;    // log10(|err|) bin edges
  std::vector<int64_t> hist_counts;  // one per bin (edges.size() - 1)
  json worst = json::array();
  double atol = 0, rtol = 0;
  bool pass = false;
  std::string why;
};

std::string fmt(double v);  // %.4g
// Statistics of test vs ref under atol/rtol (Polygraphy's rule above), `stat` the checked error
// statistic (elemwise, max, mean, median), listing the `worst_n` worst elements.
Stats compute_stats(const Tensor& ref, const Tensor& test, double atol, double rtol, double rel_floor,
                    const std::string& stat, int worst_n);
json stats_json(const Stats& s);
// Classifier checks over the last axis: top-1 agreement, ref's top-1 within test's top-k, flips.
json classifier_json(const Tensor& ref, const Tensor& test, int k);

// ---- detections (compare_detections.cc)

struct DetectionHead {
  std::string spec;                   // as given, or "boxes,scores,labels" when found by name
  std::string boxes, scores, labels;  // labels empty: none
  bool automatic = false;
  std::string note;  // what automatic detection did
};
struct DetectionSides {
  const Tensor* boxes = nullptr;
  const Tensor* scores = nullptr;
  const Tensor* labels = nullptr;  // null without labels
};
Result<DetectionHead> parse_detection_head(const std::string& spec);
// The single float constant c of every `x > c` (Greater) in the model and its subgraphs, with a
// sentence saying where it came from; none when there is no such node or their constants differ.
std::optional<std::pair<double, std::string>> read_score_threshold(const ir::Graph& g);
// Matches the two sides' detections (see compare_detections.cc) and returns the verdict: matched
// count, max IoU deficit, max score difference, unmatched detections and why each was accepted or not.
struct DetTolerances {
  double score_atol, score_rtol, box_atol, box_rtol, rel_floor;  // the scores and boxes outputs' atol/rtol
};
Result<json> compare_detections(const DetectionHead& h, const DetectionSides& ref, const DetectionSides& test,
                                const DetTolerances& tol, double min_iou, std::optional<double> threshold);

// ---- runners (compare.cc)

struct Runners {
  ir::Model model;  // unoptimized, for the reference; an engine's graph when compare got no model
  bool have_onnx_model = false;
  std::shared_ptr<detail::EngineImpl> engine;  // built or loaded, when the test side is an engine
  std::shared_ptr<Engine> engine_holder;
  json build;                                      // build record
  std::shared_ptr<detail::EngineImpl> ref_engine;  // --ref engine / --ref-engine
  std::shared_ptr<Engine> ref_engine_holder;
  json ref_build;
};

// The build flags of the reference engine built in memory (--ref engine without --ref-engine): the
// test's, at FP32. Every flag that lowers precision (or chooses it per layer) is cleared here.
BuildFlags reference_build_flags(BuildFlags f);
// An engine's precision as its build record states it ("fp32", "int8", ...).
std::string engine_precision(const detail::EngineImpl& e);

// ---- first divergence (compare_divergence.cc)

// Runs the reference (the unoptimized model on the reference interpreter, or the reference engine)
// and the engine layer by layer, comparing every engine value that the reference has by name (an
// ONNX name; a channel-blocked value as the plain value it stands for): "layers" (each layer's
// inputs and outputs), "first" (the first layer that leaves tolerance, with a verdict), or null;
// with a reference engine also "ref_only": its tensors the engine under test does not produce
// (fused differently), skipped. An error of either run goes to *st.
json find_divergence(const CompareOptions& o, const Runners& r, const std::map<std::string, ops::Value>& inputs,
                     Status* st);

// Near ties at ranking decisions (compare_ties.cc, the rule at its top): TopK and NonMaxSuppression
// in the main graph and in control-flow bodies, for a detection head that failed against the reference
// interpreter: "ties" (sites where the engine decided differently only among candidates within
// tolerance of each other), "divergences" (a site where it decided differently otherwise), "replays".
// With ties and no divergence, *replayed_out receives the reference's outputs with the ties resolved
// the engine's way (else it is left empty).
Result<json> explain_by_near_ties(const CompareOptions& o, const Runners& r,
                                  const std::map<std::string, ops::Value>& inputs,
                                  std::vector<std::pair<std::string, Tensor>>* replayed_out);

// A decision site's output (TopK: its indices; NonMaxSuppression: its selection), nullptr for other
// layers. A site is keyed by that name and its occurrence in the run: "NAME#0", "NAME#1" (a Loop).
const std::string* decision_output(const ir::Node& n);
// One execution of a decision site on the reference: the layer, its inputs (undefined: omitted) and outputs.
struct DecisionSite {
  std::string key;
  const ir::Node* node = nullptr;
  std::vector<Tensor> inputs, outputs;
};
// Outputs that replace a site's, by site key (an undefined tensor keeps the reference's output).
using Decisions = std::map<std::string, std::vector<Tensor>>;

// The core of explain_by_near_ties, given the test side's decisions by site key: checks the sites in
// execution order, replaying each tie before looking further; *replayed_out: the last replay's graph
// outputs when ties explained every differing site, else empty. Tolerances are o.atol / o.rtol.
Result<json> resolve_near_ties(const CompareOptions& o, std::shared_ptr<const ir::Graph> graph,
                               const std::map<std::string, ops::Value>& inputs,
                               const std::map<std::string, Tensor>& test, std::vector<ops::Value>* replayed_out);

// One site's decision on the test side against the reference's: how many positions differ, whether
// each difference is a near tie, `site` describing it for the report ("widest_tie", or "first_not_a_tie"
// and "why"), `forced_values` what the replay forces besides the test's decision (a TopK's values: the
// reference's keys at the test's indices).
struct TopKDifference {
  int64_t positions_differing = 0;
  bool tie = false;
  json site;
  Tensor forced_values;
};
// A TopK (keys: the reference's input): each differing position is a near tie when the test's key is
// within atol/rtol of the reference's choice, both read in the reference's keys.
Result<TopKDifference> classify_topk_difference(const ir::Node& n, const Tensor& keys, const Tensor& ref_indices,
                                                const Tensor& test_indices, double atol, double rtol, double rel_floor);
// A NonMaxSuppression (inputs: the reference's boxes, scores and optional scalars): the test's
// selection is a near tie when the greedy pass, on the reference's boxes and scores, could have made
// it with scores within score_atol/rtol ordered either way and scores near score_threshold, IoUs near
// iou_threshold (within iou_atol/rtol) decided either way (compare_nms_ties.cc).
struct NmsTolerances {
  double score_atol = kDefaultAtol, score_rtol = kDefaultRtol, iou_atol = kDefaultAtol, iou_rtol = kDefaultRtol;
  double rel_floor = 1e-6;
};
Result<TopKDifference> classify_nms_difference(const ir::Node& n, const std::vector<Tensor>& inputs,
                                               const Tensor& ref_selected, const Tensor& test_selected,
                                               const NmsTolerances& tol);
// The reference interpreter on `graph` with the sites `decisions` names (main graph and bodies)
// resolved as given: a tie resolved the test's way, the rest the reference's arithmetic. `sites`, when
// given, receives every decision site the run met.
Result<std::vector<ops::Value>> run_reference_with_decisions(std::shared_ptr<const ir::Graph> graph,
                                                             const std::map<std::string, ops::Value>& inputs,
                                                             const Decisions& decisions,
                                                             std::vector<DecisionSite>* sites = nullptr);

// ---- reports (compare_report.cc)

std::string html_report(const json& rep);  // self-contained: inline SVG, no script
void print_text(const json& rep);

// ---- bundles (compare_bundle.cc)

// kiln version, compiler, CPU, the model's opsets and producer.
json versions_json(const ir::Model& m);
Status write_bundle(const CompareOptions& o, const std::string& dir, const std::map<std::string, ops::Value>& inputs,
                    const std::vector<std::pair<std::string, Tensor>>& ref_out,
                    const std::vector<std::pair<std::string, Tensor>>& test_out, const json& rep);
Result<int> replay(const std::string& dir, const std::string& json_path, const std::string& html_path);

// ---- the command (compare.cc)

// What the library's compare (compare_library.cc) gets back from the command: the report, or the error.
struct CompareResult {
  json report;
  Status status = Status::Ok();
};

// Compares and reports; `replay_of`: the bundle being replayed (its numbers are checked).
// `report_out`: the report is stored there and nothing is printed (the library's compare).
Result<int> run_compare(CompareOptions o, const std::string& json_path, const std::string& html_path,
                        const json* replay_of, json* report_out = nullptr);

}  // namespace kiln::tools::compare
