// kiln compare --detections: detector outputs (boxes, scores, labels) compared as sets of
// detections, not elementwise. Detections with near-equal scores may come out of NMS/TopK in a
// different order, and one may cross a score threshold or a top-k cut, under rounding differences
// of a few ulp in the backbone; the order and the length of such a list are not a fault.
//
// Per image: reference detections, highest score first, are matched greedily to the unmatched test
// detection of the same label (when labels are given) with the highest IoU (> 0). A matched pair
// passes with IoU >= --det-iou (or every coordinate within the boxes output's atol/rtol, for boxes
// too thin for IoU to mean much) and a score difference within the score output's atol/rtol (the
// Polygraphy rule of compare_internal.h). An unmatched detection on either side passes only when
// a cut explains it: its score is within tolerance of the lowest score kept on the other side
// (a top-k cut drops detections below it, and a score threshold lies at or below it, so a detection
// dropped by either has a score near it), or of the model's score threshold.
#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <set>

#include "tools/compare_internal.h"

namespace kiln::tools::compare {

namespace {

struct Det {
  double box[4];
  double score;
  double label;
  int64_t index;  // within its image
};

bool boxes_close(const Det& a, const Det& b, const DetTolerances& tol) {
  for (int k = 0; k < 4; ++k)
    if (!within(b.box[k], a.box[k], tol.box_atol, tol.box_rtol, tol.rel_floor)) return false;
  return true;
}

// IoU of boxes [x1,y1,x2,y2]. A box clipped to the image border can have zero width or height
// (torchvision keeps those): for a pair where one has, the overlap is taken axis by axis, the 1-D IoU
// along an axis where both have extent, and along an axis where one has none 1 when both ends agree
// within the boxes' tolerance (else 0).
double iou(const Det& a, const Det& b, const DetTolerances& tol) {
  auto ext = [](const double* x, int k) { return std::max(0.0, x[k + 2] - x[k]); };
  double inter_axis[2], ea[2], eb[2];
  for (int k = 0; k < 2; ++k) {
    ea[k] = ext(a.box, k);
    eb[k] = ext(b.box, k);
    inter_axis[k] = std::max(0.0, std::min(a.box[k + 2], b.box[k + 2]) - std::max(a.box[k], b.box[k]));
  }
  if (ea[0] * ea[1] > 0 && eb[0] * eb[1] > 0) {
    double inter = inter_axis[0] * inter_axis[1];
    return inter / (ea[0] * ea[1] + eb[0] * eb[1] - inter);
  }
  double v = 1;
  for (int k = 0; k < 2; ++k) {
    if (ea[k] > 0 && eb[k] > 0) {
      v *= inter_axis[k] / (ea[k] + eb[k] - inter_axis[k]);
    } else {
      bool same = within(b.box[k], a.box[k], tol.box_atol, tol.box_rtol, tol.rel_floor) &&
                  within(b.box[k + 2], a.box[k + 2], tol.box_atol, tol.box_rtol, tol.rel_floor);
      v *= same ? 1 : 0;
    }
  }
  return v;
}

// Images (outer vector) of detections, from [N,4]/[N]/[N] or [B,N,4]/[B,N]/[B,N].
Result<std::vector<std::vector<Det>>> read_side(const DetectionHead& h, const Tensor& boxes, const Tensor& scores,
                                                const Tensor* labels, const char* side) {
  auto bad = [&](const std::string& name, const Tensor& t, const std::string& want) {
    return InvalidArgument("--detections ", h.spec, ": ", side, " output '", name, "' is ", t.describe(),
                           "; detections need ", want, " (boxes [N,4] with scores/labels [N], or [B,N,4] with [B,N])");
  };
  if (!dtype_is_float(boxes.dtype()) || (boxes.rank() != 2 && boxes.rank() != 3) || boxes.dim(boxes.rank() - 1) != 4)
    return bad(h.boxes, boxes, "float boxes of shape [N,4] or [B,N,4]");
  Dims lead(boxes.shape().begin(), boxes.shape().end() - 1);
  if (!dtype_is_float(scores.dtype()) && labels && dtype_is_float(labels->dtype()))
    return InvalidArgument("--detections ", h.spec, ": ", side, " output '", h.scores, "' is ", scores.describe(),
                           " and '", h.labels, "' is ", labels->describe(), ": the scores are float; did you mean ",
                           "--detections ", h.boxes, ",", h.labels, ",", h.scores, "?");
  if (!dtype_is_float(scores.dtype()) || scores.shape() != lead)
    return bad(h.scores, scores, "float scores of shape " + dims_str(lead));
  if (labels && (labels->dtype() == DataType::kString || labels->shape() != lead))
    return bad(h.labels, *labels, "labels of shape " + dims_str(lead));
  int64_t b = boxes.rank() == 3 ? boxes.dim(0) : 1, n = lead.back();
  std::vector<std::vector<Det>> out(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < n; ++j) {
      int64_t k = i * n + j;
      Det d{};
      for (int c = 0; c < 4; ++c) d.box[c] = boxes.get_f64(k * 4 + c);
      d.score = scores.get_f64(k);
      d.label = labels ? labels->get_f64(k) : 0;
      d.index = j;
      out[static_cast<size_t>(i)].push_back(d);
    }
  return out;
}

json det_json(const Det& d, int64_t image, bool batched) {
  json j = {{"index", d.index}, {"score", d.score}, {"box", {d.box[0], d.box[1], d.box[2], d.box[3]}}};
  if (batched) j["image"] = image;
  return j;
}

}  // namespace

Result<DetectionHead> parse_detection_head(const std::string& spec) {
  DetectionHead h;
  h.spec = spec;
  std::vector<std::string> parts;
  size_t p = 0;
  while (true) {
    size_t c = spec.find(',', p);
    parts.push_back(spec.substr(p, c == std::string::npos ? std::string::npos : c - p));
    if (c == std::string::npos) break;
    p = c + 1;
  }
  if (parts.size() < 2 || parts.size() > 3 ||
      std::any_of(parts.begin(), parts.end(), [](auto& s) { return s.empty(); }))
    return InvalidArgument("--detections '", spec, "' must be BOXES,SCORES or BOXES,SCORES,LABELS (output names)");
  h.boxes = parts[0];
  h.scores = parts[1];
  if (parts.size() == 3) h.labels = parts[2];
  return h;
}

std::optional<std::pair<double, std::string>> read_score_threshold(const ir::Graph& g) {
  // `scores > c` (torchvision's score_thresh) with c a float scalar constant, anywhere in the model
  // (If/Loop bodies included); used only when every such comparison has the same c.
  std::set<double> values;
  int count = 0;
  std::function<void(const ir::Graph&, std::map<std::string, Tensor>)> walk = [&](const ir::Graph& gr,
                                                                                  std::map<std::string, Tensor> cs) {
    for (const auto& [k, t] : gr.initializers) cs[k] = t;
    for (const auto& n : gr.nodes)
      if (n.op_type == "Constant" && n.domain.empty() && n.attr("value") && n.has_output(0))
        cs[n.outputs[0]] = n.attr("value")->t;
    for (const auto& n : gr.nodes) {
      for (const auto& [k, a] : n.attrs) {
        if (a.g) walk(*a.g, cs);
        for (const auto& sg : a.graphs) walk(*sg, cs);
      }
      if (n.op_type != "Greater" || !n.domain.empty() || !n.has_input(1)) continue;
      auto it = cs.find(n.inputs[1]);
      if (it == cs.end() || it->second.numel() != 1 || !dtype_is_float(it->second.dtype())) continue;
      values.insert(it->second.get_f64(0));
      ++count;
    }
  };
  walk(g, {});
  if (values.size() != 1) return std::nullopt;
  return std::make_pair(*values.begin(), "read from the model: " + std::to_string(count) +
                                             " Greater node(s) compare with the constant " + fmt(*values.begin()));
}

Result<json> compare_detections(const DetectionHead& h, const DetectionSides& ref, const DetectionSides& test,
                                const DetTolerances& tol, double min_iou, std::optional<double> threshold) {
  double atol = tol.score_atol, rtol = tol.score_rtol, rel_floor = tol.rel_floor;
  KILN_ASSIGN_OR_RETURN(auto rimgs, read_side(h, *ref.boxes, *ref.scores, ref.labels, "reference"));
  KILN_ASSIGN_OR_RETURN(auto timgs, read_side(h, *test.boxes, *test.scores, test.labels, "test"));
  if (rimgs.size() != timgs.size())
    return InvalidArgument("--detections ", h.spec, ": the reference has ", rimgs.size(), " image(s), the test ",
                           timgs.size());
  bool batched = ref.boxes->rank() == 3;
  int64_t matched = 0, bad_pairs = 0, unexplained = 0, by_coords = 0;
  double max_deficit = 0, max_score_diff = 0;
  json worst_pair = nullptr, unmatched = json::array(), failed_pairs = json::array();
  for (size_t im = 0; im < rimgs.size(); ++im) {
    std::vector<Det> r = rimgs[im], t = timgs[im];
    std::stable_sort(r.begin(), r.end(), [](const Det& a, const Det& b) { return a.score > b.score; });
    std::vector<bool> tused(t.size(), false), rused(r.size(), false);
    for (size_t i = 0; i < r.size(); ++i) {
      // A candidate overlaps (IoU > 0) or has every coordinate within the boxes' atol/rtol (a sliver a
      // few hundredths of a pixel high can be off by more than its height and still be the same box);
      // the closest candidate wins, then the highest IoU.
      int best = -1;
      double best_iou = 0;
      bool best_close = false;
      for (size_t j = 0; j < t.size(); ++j) {
        if (tused[j] || (ref.labels && t[j].label != r[i].label)) continue;
        double v = iou(r[i], t[j], tol);
        bool close = boxes_close(r[i], t[j], tol);
        if ((v > 0 || close) && (best < 0 || std::make_pair(close, v) > std::make_pair(best_close, best_iou)))
          best_iou = v, best_close = close, best = static_cast<int>(j);
      }
      if (best < 0) continue;
      by_coords += best_close && best_iou < min_iou;
      tused[static_cast<size_t>(best)] = rused[i] = true;
      ++matched;
      const Det& td = t[static_cast<size_t>(best)];
      double sd = std::fabs(td.score - r[i].score);
      bool ok = (best_iou >= min_iou || best_close) && within(td.score, r[i].score, atol, rtol, rel_floor);
      json pj = {{"ref", det_json(r[i], static_cast<int64_t>(im), batched)},
                 {"test", det_json(td, static_cast<int64_t>(im), batched)},
                 {"iou", best_iou},
                 {"coords_within_tolerance", best_close},
                 {"score_diff", sd}};
      if (ref.labels) pj["label"] = r[i].label;
      if (1 - best_iou > max_deficit || sd > max_score_diff || worst_pair.is_null()) worst_pair = pj;
      // Pairs accepted by their coordinates (thin boxes) are counted apart, not in the IoU deficit.
      if (!(best_close && best_iou < min_iou)) max_deficit = std::max(max_deficit, 1 - best_iou);
      max_score_diff = std::max(max_score_diff, sd);
      if (!ok) {
        ++bad_pairs;
        pj["why"] = best_iou < min_iou && !best_close
                        ? "IoU " + fmt(best_iou) + " < " + fmt(min_iou) + " and coordinates beyond the boxes' atol/rtol"
                        : "score differs by " + fmt(sd) + " (beyond atol and rtol)";
        if (failed_pairs.size() < 20) failed_pairs.push_back(pj);
      }
    }
    // Unmatched: explained by a cut (the other side's lowest kept score, or the score threshold).
    auto lowest = [](const std::vector<Det>& v) {
      double m = INFINITY;
      for (const auto& d : v) m = std::min(m, d.score);
      return m;
    };
    double rlow = lowest(r), tlow = lowest(t);
    auto explain = [&](const Det& d, const char* side, double other_low, const char* other) {
      json j = det_json(d, static_cast<int64_t>(im), batched);
      j["side"] = side;
      if (ref.labels) j["label"] = d.label;
      std::string why;
      bool ok = false;
      if (std::isfinite(other_low) && within(d.score, other_low, atol, rtol, rel_floor)) {
        ok = true;
        why = std::string("at the cut: within tolerance of the lowest ") + other + " score " + fmt(other_low);
      } else if (threshold && within(d.score, *threshold, atol, rtol, rel_floor)) {
        ok = true;
        why = "at the score threshold " + fmt(*threshold);
      } else {
        why = std::string("not explained by a cut: ") +
              (std::isfinite(other_low) ? std::string("the lowest ") + other + " score is " + fmt(other_low)
                                        : std::string("the ") + other + " has no detections") +
              (threshold ? ", the score threshold " + fmt(*threshold) : std::string(", no score threshold known"));
      }
      j["explained"] = ok;
      j["why"] = why;
      unexplained += !ok;
      unmatched.push_back(j);
    };
    for (size_t i = 0; i < r.size(); ++i)
      if (!rused[i]) explain(r[i], "reference", tlow, "test");
    for (size_t j = 0; j < t.size(); ++j)
      if (!tused[j]) explain(t[j], "test", rlow, "reference");
  }
  int64_t nref = 0, ntest = 0;
  for (const auto& v : rimgs) nref += static_cast<int64_t>(v.size());
  for (const auto& v : timgs) ntest += static_cast<int64_t>(v.size());
  bool pass = bad_pairs == 0 && unexplained == 0;
  std::string why;
  if (bad_pairs) why = std::to_string(bad_pairs) + " matched pair(s) outside tolerance";
  if (unexplained)
    why += (why.empty() ? "" : "; ") + std::to_string(unexplained) + " unmatched detection(s) not explained by a cut";
  json j = {{"spec", h.spec},
            {"boxes", h.boxes},
            {"scores", h.scores},
            {"labels", h.labels.empty() ? json(nullptr) : json(h.labels)},
            {"auto", h.automatic},
            {"note", h.note},
            {"images", rimgs.size()},
            {"ref_count", nref},
            {"test_count", ntest},
            {"ref_desc", ref.boxes->describe()},
            {"test_desc", test.boxes->describe()},
            {"matched", matched},
            {"max_iou_deficit", max_deficit},
            {"max_score_diff", max_score_diff},
            {"matched_by_coordinates", by_coords},
            {"worst_pair", worst_pair},
            {"failed_pairs", failed_pairs},
            {"unmatched", unmatched},
            {"unexplained", unexplained},
            {"det_iou", min_iou},
            {"score_atol", atol},
            {"score_rtol", rtol},
            {"box_atol", tol.box_atol},
            {"box_rtol", tol.box_rtol},
            {"score_threshold", threshold ? json(*threshold) : json(nullptr)},
            {"pass", pass},
            {"why", why}};
  return j;
}

}  // namespace kiln::tools::compare
