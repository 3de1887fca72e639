// kiln compare's near-tie rule (src/tools/compare_ties.cc): a TopK that ranks differently only among
// keys within tolerance of each other is a near tie, and the reference replayed with the test's choice
// must then give the test's detections under the usual, unchanged tolerances; any other difference
// still fails.
#include <gtest/gtest.h>

#include "../graph_builder.h"
#include "tools/compare_internal.h"

namespace kiln::tools::compare {
namespace {

using testing::GraphBuilder;

// objectness [1,8] -> TopK(k=2) -> the kept anchors' boxes [1,2,4] and their scores [1,2] from a second
// head (as an RPN's proposals are rescored by the RoI head): a tie in objectness changes which box and
// score come out, far from any cut in the outputs (so the output-level cut rule cannot explain it).
ir::Model topk_head() {
  GraphBuilder b(13);
  b.input("s", {1, 8}).output("boxes").output("scores");
  std::vector<float> anchors;
  for (int i = 0; i < 8; ++i)
    for (float v : {40.f * i, 10.f, 40.f * i + 30, 50.f}) anchors.push_back(v);  // disjoint boxes
  b.init("anchors", Tensor::from_vector<float>(DataType::kFloat32, {8, 4}, anchors));
  b.init("k", Tensor::from_vector<int64_t>(DataType::kInt64, {1}, {2}));
  b.init("rescored",
         Tensor::from_vector<float>(DataType::kFloat32, {8}, {0.95f, 0.3f, 0.8f, 0.6f, 0.5f, 0.4f, 0.2f, 0.1f}));
  b.node("TopK", {"s", "k"}, {"objectness", "idx"});
  b.node("Gather", {"anchors", "idx"}, {"boxes"});
  b.node("Gather", {"rescored", "idx"}, {"scores"});
  return b.finish();
}

std::map<std::string, ops::Value> scores_input(std::vector<float> s) {
  return {{"s", ops::Value(Tensor::from_vector<float>(DataType::kFloat32, {1, 8}, s))}};
}

Tensor indices(std::vector<int64_t> v) { return Tensor::from_vector<int64_t>(DataType::kInt64, {1, 2}, v); }

struct Case {
  TopKDifference diff;
  json before, after;  // detections of the test vs the reference, and vs the reference replayed
};

// The reference's run, a test side that chose `test_idx` at the TopK (its detections: the reference's
// arithmetic with that choice, then `perturb` applied to its boxes: a fault after the tie), compared.
Case run_case(const ir::Model& m, const std::vector<float>& s, const Tensor& test_idx, float perturb = 0) {
  auto in = scores_input(s);
  ops::Interpreter ref(m.graph);
  std::map<std::string, Tensor> ref_values;
  ref.on_node = [&](const ir::Node& n, const std::vector<ops::Value>& outs) {
    for (size_t i = 0; i < outs.size(); ++i) ref_values[n.outputs[i]] = outs[i].tensor;
  };
  auto r = ref.run(in);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  const ir::Node& topk = m.graph->nodes[0];
  auto d =
      classify_topk_difference(topk, in["s"].tensor, ref_values.at("idx"), test_idx, kDefaultAtol, kDefaultRtol, 1e-6);
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  Case c{std::move(d).value(), {}, {}};
  auto test = run_reference_with_decisions(m.graph, in, {{"idx#0", {c.diff.forced_values, test_idx}}});
  EXPECT_TRUE(test.ok());
  Tensor test_boxes = test.value()[0].tensor.clone();
  test_boxes.data<float>()[0] += perturb;
  DetectionHead h;
  h.spec = "boxes,scores", h.boxes = "boxes", h.scores = "scores";
  DetTolerances tol{kDefaultAtol, kDefaultRtol, kDefaultAtol, kDefaultRtol, 1e-6};
  DetectionSides rs{&r.value()[0].tensor, &r.value()[1].tensor, nullptr};  // boxes, scores
  DetectionSides ts{&test_boxes, &test.value()[1].tensor, nullptr};
  c.before = compare_detections(h, rs, ts, tol, 0.99, std::nullopt).value();
  if (c.diff.tie) {
    auto replay = run_reference_with_decisions(m.graph, in, {{"idx#0", {c.diff.forced_values, test_idx}}});
    EXPECT_TRUE(replay.ok());
    DetectionSides ps{&replay.value()[0].tensor, &replay.value()[1].tensor, nullptr};
    c.after = compare_detections(h, ps, ts, tol, 0.99, std::nullopt).value();
  }
  return c;
}

// Anchors 2 and 3 score 0.7 and 0.70004 (4e-5 apart, within atol 1e-4): the reference keeps 0 and 3,
// a test that keeps 0 and 2 broke the tie the other way. Its detections differ from the reference's
// (anchor 2's box is not anchor 3's), but replaying its choice on the reference gives them exactly.
TEST(CompareNearTies, ATieAtTheCutIsExplainedByTheReplay) {
  ir::Model m = topk_head();
  Case c = run_case(m, {0.9f, 0.5f, 0.7f, 0.70004f, 0.1f, 0.2f, 0.3f, 0.4f}, indices({0, 2}));
  EXPECT_EQ(c.diff.positions_differing, 1);
  EXPECT_TRUE(c.diff.tie) << c.diff.site.dump();
  EXPECT_EQ(c.diff.site["widest_tie"]["ref_index"], 3);
  EXPECT_EQ(c.diff.site["widest_tie"]["test_index"], 2);
  EXPECT_FALSE(c.before["pass"].get<bool>()) << "the detections differ before the replay: " << c.before.dump();
  EXPECT_TRUE(c.after["pass"].get<bool>()) << c.after.dump();
}

// Two tied keys swapped in order within the kept set are a tie too (ranks 0 and 1).
TEST(CompareNearTies, ASwapInsideTheKeptSetIsATie) {
  ir::Model m = topk_head();
  Case c = run_case(m, {0.9f, 0.90005f, 0.7f, 0.6f, 0.1f, 0.2f, 0.3f, 0.4f}, indices({0, 1}));
  EXPECT_EQ(c.diff.positions_differing, 2);
  EXPECT_TRUE(c.diff.tie);
  EXPECT_TRUE(c.after["pass"].get<bool>()) << c.after.dump();
}

// Keeping anchor 6 (0.3) instead of anchor 3 (0.7) is no tie: a real divergence, never replayed.
TEST(CompareNearTies, AChoiceBeyondToleranceIsNotATie) {
  ir::Model m = topk_head();
  Case c = run_case(m, {0.9f, 0.5f, 0.7f, 0.70004f, 0.1f, 0.2f, 0.3f, 0.4f}, indices({0, 6}));
  EXPECT_EQ(c.diff.positions_differing, 1);
  EXPECT_FALSE(c.diff.tie);
  EXPECT_EQ(c.diff.site["first_not_a_tie"]["test_index"], 6);
  EXPECT_FALSE(c.before["pass"].get<bool>());
}

// A legitimate tie followed by a fault (a box off by 2 pixels after the TopK): the replay explains the
// tie, not the fault, so the detections still fail.
TEST(CompareNearTies, AFaultAfterATieStillFails) {
  ir::Model m = topk_head();
  Case c = run_case(m, {0.9f, 0.5f, 0.7f, 0.70004f, 0.1f, 0.2f, 0.3f, 0.4f}, indices({0, 2}), 2.f);
  EXPECT_TRUE(c.diff.tie);
  EXPECT_FALSE(c.after["pass"].get<bool>()) << c.after.dump();
}

TEST(CompareNearTies, IndicesOfAnotherShapeAreAnError) {
  ir::Model m = topk_head();
  auto in = scores_input({0.9f, 0.5f, 0.7f, 0.6f, 0.1f, 0.2f, 0.3f, 0.4f});
  auto d =
      classify_topk_difference(m.graph->nodes[0], in["s"].tensor, indices({0, 2}),
                               Tensor::from_vector<int64_t>(DataType::kInt64, {1, 3}, {0, 2, 3}), 1e-4, 1e-3, 1e-6);
  EXPECT_FALSE(d.ok());
  auto out_of_range =
      classify_topk_difference(m.graph->nodes[0], in["s"].tensor, indices({0, 2}), indices({0, 9}), 1e-4, 1e-3, 1e-6);
  EXPECT_FALSE(out_of_range.ok());
}

}  // namespace
}  // namespace kiln::tools::compare
