// kiln compare --detections: near ties at NonMaxSuppression (the rule at the top of compare_ties.cc).
// The test side's selection, per batch and class in output order, is replayed on the reference's boxes
// and scores as a greedy pass that may resolve near ties either way:
// - a candidate is in when its score is above score_threshold; within the scores' atol/rtol of the
//   threshold it may be either in or out;
// - a kept box suppresses a candidate at IoU > iou_threshold; within the boxes' atol/rtol of the
//   threshold (applied to the IoU) it may or may not;
// - each pick must be a candidate that is in (or may be), not suppressed for sure, and score within
//   tolerance of (or above) the best candidate that is in and unsuppressed for sure: the reference's
//   next pick up to a near tie;
// - a selection that stops before max_output_boxes_per_class must leave no candidate that is in and
//   unsuppressed for sure.
// The arithmetic is the reference kernel's (ops/detection.cc): boxes read by nms::box_of, overlaps by
// nms::suppression_iou, in double.
#include <cmath>

#include "ops/nms_grid.h"
#include "tools/compare_internal.h"

namespace kiln::tools::compare {

namespace {
bool near(double test, double ref, double atol, double rtol, double rel_floor) {
  double a = std::fabs(test - ref);
  return a <= atol || a / std::max(std::fabs(ref), rel_floor) <= rtol;
}
}  // namespace

Result<TopKDifference> classify_nms_difference(const ir::Node& n, const std::vector<Tensor>& inputs,
                                               const Tensor& ref_selected, const Tensor& test_selected,
                                               const NmsTolerances& tol) {
  auto given = [&](size_t i) { return i < inputs.size() && inputs[i].defined() && inputs[i].numel() == 1; };
  if (inputs.size() < 2 || !inputs[0].defined() || !inputs[1].defined())
    return InvalidArgument("NonMaxSuppression '", n.name, "': boxes and scores are required");
  const Tensor &boxes = inputs[0], &scores = inputs[1];
  if (boxes.rank() != 3 || boxes.dim(2) != 4 || scores.rank() != 3 || scores.dim(0) != boxes.dim(0) ||
      scores.dim(2) != boxes.dim(1))
    return InvalidArgument("NonMaxSuppression '", n.name, "': boxes ", boxes.describe(), " and scores ",
                           scores.describe(), " are not [B, S, 4] and [B, K, S]");
  for (const Tensor* t : {&ref_selected, &test_selected})
    if (t->rank() != 2 || t->dim(1) != 3 || !dtype_is_integer(t->dtype()))
      return InvalidArgument("NonMaxSuppression '", n.name, "': selection ", t->describe(), " is not [M, 3] integers");
  const int64_t max_out = given(2) ? std::max<int64_t>(0, inputs[2].get_i64(0)) : 0;
  const double iou_thr = given(3) ? inputs[3].get_f64(0) : 0.0;
  const bool has_score = given(4);
  const double score_min = has_score ? inputs[4].get_f64(0) : 0.0;
  const bool center = n.attr_int("center_point_box", 0) == 1;
  const int64_t B = boxes.dim(0), K = scores.dim(1), S = boxes.dim(1);
  const int64_t M = test_selected.dim(0), MR = ref_selected.dim(0);

  TopKDifference d;
  d.forced_values = test_selected;
  for (int64_t r = 0; r < std::max(M, MR); ++r) {
    bool same = r < M && r < MR;
    for (int64_t c = 0; same && c < 3; ++c) same = test_selected.get_i64(r * 3 + c) == ref_selected.get_i64(r * 3 + c);
    d.positions_differing += !same;
  }
  d.site = {{"layer", n.name},
            {"keys", n.has_input(1) ? n.inputs[1] : ""},
            {"selected", M},
            {"ref_selected", MR},
            {"positions_differing", d.positions_differing},
            {"atol", tol.score_atol},
            {"rtol", tol.score_rtol},
            {"iou_atol", tol.iou_atol},
            {"iou_rtol", tol.iou_rtol}};
  if (d.positions_differing == 0) return d;

  json widest = nullptr;
  double widest_gap = -1;
  int64_t near_iou = 0, near_score_threshold = 0;
  auto fail = [&](int64_t rank, int64_t test_index, std::string why) {
    d.site["first_not_a_tie"] = {{"rank", rank}, {"test_index", test_index}};
    d.site["why"] = std::move(why);
    return d;
  };
  std::vector<ops::nms::Box> all(static_cast<size_t>(S));
  std::vector<double> key(static_cast<size_t>(S));
  std::vector<uint8_t> selected, sup_sure, sup_maybe;
  int64_t r = 0;  // the next test row
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < S; ++i)
      all[i] = ops::nms::box_of(boxes.get_f64((b * S + i) * 4), boxes.get_f64((b * S + i) * 4 + 1),
                                boxes.get_f64((b * S + i) * 4 + 2), boxes.get_f64((b * S + i) * 4 + 3), center);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t sbase = (b * K + k) * S;
      auto is_near_threshold = [&](int64_t i) {
        return has_score && near(key[i], score_min, tol.score_atol, tol.score_rtol, tol.rel_floor);
      };
      for (int64_t i = 0; i < S; ++i) {
        const double v = scores.get_f64(sbase + i);
        key[i] = std::isnan(v) ? -INFINITY : v;
      }
      auto surely_in = [&](int64_t i) { return !has_score || (key[i] > score_min && !is_near_threshold(i)); };
      selected.assign(S, 0), sup_sure.assign(S, 0), sup_maybe.assign(S, 0);
      int64_t picks = 0;
      for (; r < M && test_selected.get_i64(r * 3) == b && test_selected.get_i64(r * 3 + 1) == k; ++r, ++picks) {
        const int64_t e = test_selected.get_i64(r * 3 + 2);
        const std::string at = "batch " + std::to_string(b) + ", class " + std::to_string(k) + ", selection " +
                               std::to_string(picks) + ": ";
        if (e < 0 || e >= S)
          return fail(r, e, at + "box " + std::to_string(e) + " is outside [0, " + std::to_string(S) + ")");
        if (picks >= max_out)
          return fail(r, e, at + "more than max_output_boxes_per_class " + std::to_string(max_out) + " selections");
        if (selected[e]) return fail(r, e, at + "box " + std::to_string(e) + " is selected twice");
        if (has_score && !(key[e] > score_min) && !is_near_threshold(e))
          return fail(r, e,
                      at + "box " + std::to_string(e) + " scores " + fmt(key[e]) + ", not above score_threshold " +
                          fmt(score_min) + " beyond tolerance");
        if (sup_sure[e])
          return fail(r, e,
                      at + "box " + std::to_string(e) +
                          " overlaps a box selected before it at an IoU above iou_threshold " + fmt(iou_thr) +
                          " beyond tolerance");
        if (has_score && is_near_threshold(e) && !(key[e] > score_min)) ++near_score_threshold;
        int64_t best = -1;
        for (int64_t i = 0; i < S; ++i)
          if (!selected[i] && !sup_maybe[i] && surely_in(i) && (best < 0 || key[i] > key[best])) best = i;
        if (best >= 0 && key[e] < key[best] && !near(key[e], key[best], tol.score_atol, tol.score_rtol, tol.rel_floor))
          return fail(r, e,
                      at + "the engine selects box " + std::to_string(e) + " (score " + fmt(key[e]) +
                          "), the reference's next selection is box " + std::to_string(best) + " (score " +
                          fmt(key[best]) + "): beyond tolerance");
        if (best >= 0 && best != e && key[best] - key[e] > widest_gap) {
          widest_gap = key[best] - key[e];
          widest = {{"rank", picks},        {"ref_index", best},  {"test_index", e},
                    {"ref_key", key[best]}, {"test_key", key[e]}, {"gap", std::fabs(key[best] - key[e])}};
        }
        selected[e] = 1;
        for (int64_t i = 0; i < S; ++i) {
          if (selected[i]) continue;
          const double iou = ops::nms::suppression_iou(all[e], all[i]);
          const bool close = std::isfinite(iou) && near(iou, iou_thr, tol.iou_atol, tol.iou_rtol, tol.rel_floor);
          if (iou > iou_thr || close) sup_maybe[i] = 1;
          if (iou > iou_thr && !close) sup_sure[i] = 1;
          near_iou += close;
        }
      }
      if (picks < max_out)
        for (int64_t i = 0; i < S; ++i)
          if (!selected[i] && !sup_maybe[i] && surely_in(i))
            return fail(r, -1,
                        "batch " + std::to_string(b) + ", class " + std::to_string(k) + ": the engine stops after " +
                            std::to_string(picks) + " selections; the reference would still select box " +
                            std::to_string(i) + " (score " + fmt(key[i]) + ")");
    }
  }
  if (r < M)
    return fail(r, test_selected.get_i64(r * 3 + 2),
                "row " + std::to_string(r) + " is out of batch/class order or names batch " +
                    std::to_string(test_selected.get_i64(r * 3)) + ", class " +
                    std::to_string(test_selected.get_i64(r * 3 + 1)));
  d.tie = true;
  d.site["widest_tie"] = widest;
  d.site["ious_near_threshold"] = near_iou;
  d.site["scores_near_threshold"] = near_score_threshold;
  return d;
}

}  // namespace kiln::tools::compare
