// kiln compare's near-tie rule inside control flow (src/tools/compare_ties.cc, compare_nms_ties.cc): a
// detector's post-processing If ranks proposals (TopK) and suppresses overlaps (NonMaxSuppression) in
// its branch. A test side that broke a near tie there the other way is explained by replaying its
// decisions on the reference, site after site; a decision beyond tolerance is a real divergence.
#include <gtest/gtest.h>

#include "../graph_builder.h"
#include "engine/engine_impl.h"
#include "ir/attribute_builders.h"
#include "kiln/kiln.h"
#include "tools/compare_internal.h"

namespace kiln::tools::compare {
namespace {

using testing::GraphBuilder;

Tensor i64(Dims d, std::vector<int64_t> v) { return Tensor::from_vector<int64_t>(DataType::kInt64, d, v); }

// If(c): then = TopK(s, 4) -> the 4 best anchors and their scores -> NonMaxSuppression (max 3, IoU 0.5)
// -> boxes [M, 4] of the kept and their scores [M] from a second head (as a detector's RoI head rescores
// its proposals, so that the output-level cut rule cannot explain a changed proposal); else = no
// detection. Anchors 0 and 1 overlap (IoU 0.82),
// the others are disjoint.
ir::Model if_topk_nms() {
  GraphBuilder b(13);
  b.input("s", {1, 8}).input("c", {}, DataType::kBool).output("boxes").output("scores");
  std::vector<float> anchors = {0, 0, 10, 10, 0, 1, 10, 11};
  for (int i = 2; i < 8; ++i)
    for (float v : {0.f, 20.f * i, 10.f, 20.f * i + 10}) anchors.push_back(v);
  b.init("anchors", Tensor::from_vector<float>(DataType::kFloat32, {8, 4}, anchors));
  b.init("rescored",
         Tensor::from_vector<float>(DataType::kFloat32, {8}, {0.95f, 0.3f, 0.8f, 0.6f, 0.5f, 0.4f, 0.2f, 0.1f}));
  auto then = std::make_shared<ir::Graph>();
  then->name = "then";
  auto add = [&](const std::string& op, std::vector<std::string> in, std::vector<std::string> out) -> ir::Node& {
    ir::Node n;
    n.name = "then/" + op + "_" + std::to_string(then->nodes.size());
    n.op_type = op, n.opset = 13, n.inputs = std::move(in), n.outputs = std::move(out);
    then->nodes.push_back(std::move(n));
    return then->nodes.back();
  };
  then->initializers["k"] = i64({1}, {4});
  then->initializers["ax1"] = i64({1}, {1});
  then->initializers["max_out"] = i64({1}, {3});
  then->initializers["iou"] = Tensor::from_vector<float>(DataType::kFloat32, {1}, {0.5f});
  then->initializers["col2"] = Tensor::scalar<int64_t>(DataType::kInt64, 2);
  add("TopK", {"s", "k"}, {"vals", "idx"});
  add("Gather", {"anchors", "idx"}, {"cand"});  // [1, 4, 4]
  add("Unsqueeze", {"vals", "ax1"}, {"cand_scores"});
  add("NonMaxSuppression", {"cand", "cand_scores", "max_out", "iou"}, {"sel"});
  ir::Node& g = add("Gather", {"sel", "col2"}, {"kept"});
  GraphBuilder::set_int(g, "axis", 1);
  add("Squeeze", {"cand", "ax0"}, {"cand2"});
  then->initializers["ax0"] = i64({1}, {0});
  add("Gather", {"rescored", "idx"}, {"cand_rescored"});  // [1, 4]
  add("Squeeze", {"cand_rescored", "ax0"}, {"rescored1"});
  add("Gather", {"cand2", "kept"}, {"tb"});
  add("Gather", {"rescored1", "kept"}, {"ts"});
  then->outputs = {{"tb", ir::TypeInfo()}, {"ts", ir::TypeInfo()}};
  auto els = std::make_shared<ir::Graph>();
  els->name = "else";
  els->initializers["nb"] = Tensor(DataType::kFloat32, {0, 4});
  els->initializers["ns"] = Tensor(DataType::kFloat32, {0});
  for (auto [from, to] : {std::pair{"nb", "eb"}, std::pair{"ns", "es"}}) {
    ir::Node n;
    n.name = std::string("else/") + to, n.op_type = "Identity", n.opset = 13, n.inputs = {from}, n.outputs = {to};
    els->nodes.push_back(n);
    els->outputs.push_back({to, ir::TypeInfo()});
  }
  ir::Node& n = b.node("If", {"c"}, {"boxes", "scores"});
  n.name = "postprocess";
  n.attrs["then_branch"] = ir::attr_graph(then);
  n.attrs["else_branch"] = ir::attr_graph(els);
  return b.finish();
}

std::map<std::string, ops::Value> inputs_of(std::vector<float> s) {
  return {{"s", ops::Value(Tensor::from_vector<float>(DataType::kFloat32, {1, 8}, s))},
          {"c", ops::Value(Tensor::scalar<bool>(DataType::kBool, true))}};
}

// A test side: the reference's arithmetic with `forced` decisions (what an engine that broke ties
// otherwise computes), its decisions by site key, and its outputs.
struct Side {
  std::map<std::string, Tensor> decisions;
  std::vector<ops::Value> outs;
};
Side test_side(const ir::Model& m, const std::map<std::string, ops::Value>& in, const Decisions& forced) {
  std::vector<DecisionSite> sites;
  auto r = run_reference_with_decisions(m.graph, in, forced, &sites);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  Side s;
  s.outs = r.value();
  for (const auto& site : sites)
    s.decisions[site.key] = site.node->op_type == "TopK" ? site.outputs[1] : site.outputs[0];
  return s;
}

// A TopK decision of the test side: `idx` with its keys from `s`.
std::vector<Tensor> topk_choice(const std::vector<float>& s, std::vector<int64_t> idx) {
  std::vector<float> v;
  for (int64_t i : idx) v.push_back(s[i]);
  return {Tensor::from_vector<float>(DataType::kFloat32, {1, 4}, v), i64({1, 4}, idx)};
}

json detections(const std::vector<ops::Value>& ref, const std::vector<ops::Value>& test) {
  DetectionHead h;
  h.spec = "boxes,scores", h.boxes = "boxes", h.scores = "scores";
  DetTolerances tol{kDefaultAtol, kDefaultRtol, kDefaultAtol, kDefaultRtol, 1e-6};
  DetectionSides rs{&ref[0].tensor, &ref[1].tensor, nullptr}, ts{&test[0].tensor, &test[1].tensor, nullptr};
  return compare_detections(h, rs, ts, tol, 0.99, std::nullopt).value();
}

struct Outcome {
  json report, before, after;
  bool replayed = false;
};
Outcome check(const ir::Model& m, const std::vector<float>& s, const Decisions& engine) {
  auto in = inputs_of(s);
  Side t = test_side(m, in, engine);
  Outcome o;
  o.before = detections(testing::run(m, in), t.outs);
  std::vector<ops::Value> replayed;
  CompareOptions opt;
  auto r = resolve_near_ties(opt, m.graph, in, t.decisions, &replayed);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  o.report = r.value();
  o.replayed = !replayed.empty();
  if (o.replayed) o.after = detections(replayed, t.outs);
  return o;
}

// Anchors 3 and 4 score 0.6 and 0.60004 (within atol 1e-4) at the TopK's cut inside the branch: the
// test keeps 3, the reference 4. NMS then ranks other candidates: the replay forces the TopK the test's
// way, runs NMS on the candidates that follow from it (no difference left), and the detections agree.
constexpr float kTie = 0.60004f;
const std::vector<float> kScores = {0.9f, 0.90004f, 0.8f, 0.6f, kTie, 0.1f, 0.2f, 0.3f};

TEST(CompareNearTiesControlFlow, ATopKTieInsideAnIfIsReplayedBeforeTheNmsAfterIt) {
  ir::Model m = if_topk_nms();
  Outcome o = check(m, kScores, {{"idx#0", topk_choice(kScores, {1, 0, 2, 3})}});
  EXPECT_FALSE(o.before["pass"].get<bool>()) << "anchor 3's box is not anchor 4's: " << o.before.dump();
  ASSERT_EQ(o.report["ties"].size(), 1u) << o.report.dump();
  EXPECT_EQ(o.report["ties"][0]["site"], "idx#0");
  EXPECT_EQ(o.report["ties"][0]["widest_tie"]["test_index"], 3);
  EXPECT_TRUE(o.report["divergences"].empty());
  ASSERT_TRUE(o.replayed);
  EXPECT_TRUE(o.after["pass"].get<bool>()) << o.after.dump();
}

// Candidates 0 and 1 (anchors 1 and 0, IoU 0.82) score 0.90004 and 0.9: NMS keeps one and suppresses
// the other. A test side that keeps anchor 0 broke that tie the other way: its boxes differ (IoU 0.82
// < 0.99), the replay of its selection on the reference explains them.
TEST(CompareNearTiesControlFlow, AnNmsTieInsideAnIfIsExplainedByTheReplay) {
  ir::Model m = if_topk_nms();
  Outcome o = check(m, kScores, {{"sel#0", {i64({3, 3}, {0, 0, 1, 0, 0, 2, 0, 0, 3})}}});
  EXPECT_FALSE(o.before["pass"].get<bool>()) << o.before.dump();
  ASSERT_EQ(o.report["ties"].size(), 1u) << o.report.dump();
  const json& t = o.report["ties"][0];
  EXPECT_EQ(t["op"], "NonMaxSuppression");
  EXPECT_EQ(t["site"], "sel#0");
  EXPECT_EQ(t["widest_tie"]["ref_index"], 0);
  EXPECT_EQ(t["widest_tie"]["test_index"], 1);
  EXPECT_NEAR(t["widest_tie"]["gap"].get<double>(), 4e-5, 1e-6);
  ASSERT_TRUE(o.replayed);
  EXPECT_TRUE(o.after["pass"].get<bool>()) << o.after.dump();
}

// Both at once: the TopK tie first, then, on the candidates it leads to, the NMS tie: two replays.
TEST(CompareNearTiesControlFlow, TiesInSequenceAreReplayedInExecutionOrder) {
  ir::Model m = if_topk_nms();
  Outcome o =
      check(m, kScores,
            {{"idx#0", topk_choice(kScores, {1, 0, 2, 3})}, {"sel#0", {i64({3, 3}, {0, 0, 1, 0, 0, 2, 0, 0, 3})}}});
  ASSERT_EQ(o.report["ties"].size(), 2u) << o.report.dump();
  EXPECT_EQ(o.report["ties"][0]["site"], "idx#0");
  EXPECT_EQ(o.report["ties"][1]["site"], "sel#0");
  EXPECT_EQ(o.report["replays"], 2);
  ASSERT_TRUE(o.replayed);
  EXPECT_TRUE(o.after["pass"].get<bool>()) << o.after.dump();
}

// Without the near tie (anchor 0 scores 0.85, 0.05 below anchor 1: far beyond atol 1e-4 and rtol 1e-3),
// the same selection is a real divergence: reported, never replayed.
TEST(CompareNearTiesControlFlow, AnNmsChoiceBeyondToleranceIsADivergence) {
  ir::Model m = if_topk_nms();
  std::vector<float> s = kScores;
  s[0] = 0.85f;
  Outcome o = check(m, s, {{"sel#0", {i64({3, 3}, {0, 0, 1, 0, 0, 2, 0, 0, 3})}}});
  EXPECT_FALSE(o.before["pass"].get<bool>());
  EXPECT_TRUE(o.report["ties"].empty()) << o.report.dump();
  ASSERT_EQ(o.report["divergences"].size(), 1u);
  EXPECT_EQ(o.report["divergences"][0]["site"], "sel#0");
  EXPECT_NE(o.report["divergences"][0]["why"].get<std::string>().find("beyond tolerance"), std::string::npos);
  EXPECT_FALSE(o.replayed);
}

// NMS selections that no near tie explains: a lower score picked first (0.60004 before 0.8), a box
// dropped (the selection stops while a candidate is left), a suppressed box kept (IoU 0.82 > 0.5).
TEST(CompareNearTiesControlFlow, NmsSelectionsNoTieExplainsAreDivergences) {
  ir::Model m = if_topk_nms();
  for (const Tensor& sel : {i64({3, 3}, {0, 0, 0, 0, 0, 3, 0, 0, 2}), i64({2, 3}, {0, 0, 0, 0, 0, 2}),
                            i64({3, 3}, {0, 0, 0, 0, 0, 1, 0, 0, 2})}) {
    Outcome o = check(m, kScores, {{"sel#0", {sel}}});
    EXPECT_TRUE(o.report["ties"].empty()) << o.report.dump();
    ASSERT_EQ(o.report["divergences"].size(), 1u) << sel.describe();
    EXPECT_FALSE(o.replayed);
  }
}

// A TopK choice inside the branch beyond tolerance (anchor 6, 0.2, kept instead of anchor 4, 0.60004).
TEST(CompareNearTiesControlFlow, ATopKChoiceBeyondToleranceInsideAnIfIsADivergence) {
  ir::Model m = if_topk_nms();
  Outcome o = check(m, kScores, {{"idx#0", topk_choice(kScores, {1, 0, 2, 6})}});
  EXPECT_FALSE(o.before["pass"].get<bool>());
  ASSERT_EQ(o.report["divergences"].size(), 1u) << o.report.dump();
  EXPECT_EQ(o.report["divergences"][0]["first_not_a_tie"]["test_index"], 6);
  EXPECT_FALSE(o.replayed);
}

// A selection the rule cannot read (rows of 2, not [M, 3]) explains nothing: a divergence saying why,
// not an error that ends the compare.
TEST(CompareNearTiesControlFlow, AMalformedSelectionIsADivergenceNotAnError) {
  ir::Model m = if_topk_nms();
  auto in = inputs_of(kScores);
  std::vector<ops::Value> replayed;
  auto r = resolve_near_ties(CompareOptions{}, m.graph, in, {{"sel#0", i64({2, 2}, {0, 0, 0, 1})}}, &replayed);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r.value()["divergences"].size(), 1u) << r.value().dump();
  EXPECT_NE(r.value()["divergences"][0]["why"].get<std::string>().find("[M, 3]"), std::string::npos);
  EXPECT_TRUE(replayed.empty());
}

// Loop(2 trips): the body ranks s (TopK, k 2) and emits the kept anchors' second-head scores as a scan
// output, one row per iteration: a TopK site per iteration, "idx#0" and "idx#1".
ir::Model loop_topk() {
  GraphBuilder b(13);
  b.input("s", {1, 8}).output("rows");
  b.init("trips", i64({}, {2}));
  b.init("go", Tensor::scalar<bool>(DataType::kBool, true));
  b.init("v0", Tensor::from_vector<float>(DataType::kFloat32, {1}, {0.f}));
  b.init("rescored",
         Tensor::from_vector<float>(DataType::kFloat32, {8}, {0.95f, 0.3f, 0.8f, 0.6f, 0.5f, 0.4f, 0.2f, 0.1f}));
  auto body = std::make_shared<ir::Graph>();
  body->name = "body";
  body->inputs = {{"i", ir::TypeInfo()}, {"c", ir::TypeInfo()}, {"v", ir::TypeInfo()}};
  body->initializers["k"] = i64({1}, {2});
  auto add = [&](const std::string& op, std::vector<std::string> in, std::vector<std::string> out) {
    ir::Node n;
    n.name = "body/" + op + "_" + std::to_string(body->nodes.size());
    n.op_type = op, n.opset = 13, n.inputs = std::move(in), n.outputs = std::move(out);
    body->nodes.push_back(std::move(n));
  };
  add("Identity", {"c"}, {"c_out"});
  add("Identity", {"v"}, {"v_out"});
  add("TopK", {"s", "k"}, {"vals", "idx"});
  add("Gather", {"rescored", "idx"}, {"row"});
  body->outputs = {{"c_out", ir::TypeInfo()}, {"v_out", ir::TypeInfo()}, {"row", ir::TypeInfo()}};
  ir::Node& n = b.node("Loop", {"trips", "go", "v0"}, {"v_final", "rows"});
  n.name = "loop";
  n.attrs["body"] = ir::attr_graph(body);
  return b.finish();
}

// The test side breaks the tie of anchors 2 and 3 (0.7, 0.70004) the other way in the second
// iteration only: the site "idx#1" is the tie, "idx#0" agrees, and the replay gives the test's rows.
TEST(CompareNearTiesControlFlow, ATieInALoopsSecondIterationIsReplayedThere) {
  ir::Model m = loop_topk();
  const std::vector<float> s = {0.9f, 0.5f, 0.7f, 0.70004f, 0.1f, 0.2f, 0.3f, 0.4f};
  std::map<std::string, ops::Value> in{{"s", ops::Value(Tensor::from_vector<float>(DataType::kFloat32, {1, 8}, s))}};
  Decisions engine{
      {"idx#1", {Tensor::from_vector<float>(DataType::kFloat32, {1, 2}, {0.9f, 0.7f}), i64({1, 2}, {0, 2})}}};
  Side t = test_side(m, in, engine);
  ASSERT_EQ(t.decisions.count("idx#0"), 1u);
  ASSERT_EQ(t.decisions.count("idx#1"), 1u);
  std::vector<ops::Value> replayed;
  auto r = resolve_near_ties(CompareOptions{}, m.graph, in, t.decisions, &replayed);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r.value()["ties"].size(), 1u) << r.value().dump();
  EXPECT_EQ(r.value()["ties"][0]["site"], "idx#1");
  ASSERT_EQ(replayed.size(), 1u);
  const Tensor ref_rows = testing::run(m, in)[0].tensor;  // a copy: the returned vector is a temporary
  const Tensor &test_rows = t.outs[0].tensor, &rows = replayed[0].tensor;
  ASSERT_EQ(rows.shape(), (Dims{2, 1, 2}));
  EXPECT_NE(ref_rows.get_f64(3), test_rows.get_f64(3)) << "anchor 3's score is not anchor 2's";
  for (int64_t i = 0; i < rows.numel(); ++i) EXPECT_EQ(rows.get_f64(i), test_rows.get_f64(i)) << i;
}

// The same decisions as the reference: nothing to explain, nothing replayed.
TEST(CompareNearTiesControlFlow, TheReferencesOwnDecisionsNeedNoReplay) {
  ir::Model m = if_topk_nms();
  Outcome o = check(m, kScores, {});
  EXPECT_TRUE(o.before["pass"].get<bool>());
  EXPECT_TRUE(o.report["ties"].empty());
  EXPECT_TRUE(o.report["divergences"].empty());
  EXPECT_FALSE(o.replayed);
}

// An engine runs the branch with its own layers: its TopK and NonMaxSuppression inside the If are
// observed under the reference's site keys (run_engine_observed_layers), decide as the reference does
// on these inputs, and explain_by_near_ties finds nothing to replay.
TEST(CompareNearTiesControlFlow, AnEnginesBodyDecisionsAreObservedUnderTheSameKeys) {
  ir::Model m = if_topk_nms();
  auto built = detail::build_engine(testing::clone(m), BuilderConfig{});
  ASSERT_TRUE(built.ok()) << built.status().to_string();
  auto in = inputs_of(kScores);
  std::map<std::string, int> seen;
  auto r =
      detail::run_engine_observed_layers(*built.value(), in,
                                         [&](const ir::Graph& g, const ir::Node& n,
                                             const std::vector<const ops::Value*>&, const std::vector<ops::Value>&) {
                                           if (const std::string* o = decision_output(n))
                                             seen[*o] += &g != built.value()->model.graph.get();
                                         });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(seen["idx"], 1) << "the branch's TopK, as a body layer";
  EXPECT_EQ(seen["sel"], 1) << "the branch's NonMaxSuppression, as a body layer";
  Runners runners;
  runners.model = m;
  runners.engine = built.value();
  std::vector<std::pair<std::string, Tensor>> replayed;
  auto rep = explain_by_near_ties(CompareOptions{}, runners, in, &replayed);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_TRUE(rep.value()["ties"].empty()) << rep.value().dump();
  EXPECT_TRUE(rep.value()["divergences"].empty()) << rep.value().dump();
  EXPECT_TRUE(replayed.empty());
}

}  // namespace
}  // namespace kiln::tools::compare
