// kiln compare reports: the text summary and the self-contained HTML report (inline SVG).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "tools/compare_internal.h"

namespace kiln::tools::compare {

namespace {

// What compare_ties.cc found for a failed detection head (near ties at TopK / NonMaxSuppression
// sites, main graph and bodies; the replay).
std::vector<std::string> near_tie_lines(const json& d) {
  std::vector<std::string> out;
  if (!d.contains("near_ties")) return out;
  const json& t = d["near_ties"];
  auto at = [](const json& p) {
    if (p.is_null()) return std::string("no pick differs in score (IoUs or scores near a threshold decided otherwise)");
    return "rank " + std::to_string(p["rank"].get<long long>()) + ": reference index " +
           std::to_string(p["ref_index"].get<long long>()) + " (key " + fmt(p["ref_key"]) + "), engine index " +
           std::to_string(p["test_index"].get<long long>()) + " (key " + fmt(p["test_key"]) + "), gap " + fmt(p["gap"]);
  };
  auto where = [](const json& x) {
    std::string op = x.value("op", std::string("TopK"));
    std::string s = op + " '" + x["layer"].get<std::string>() + "'";
    if (x.contains("site")) s += " (site " + x["site"].get<std::string>() + ")";
    if (x.contains("k")) s += " (k " + std::to_string(x["k"].get<long long>()) + ")";
    return s;
  };
  for (const auto& x : t["ties"])
    out.push_back("near tie at " + where(x) + ": the engine decides " +
                  std::to_string(x["positions_differing"].get<long long>()) +
                  " position(s) differently, each among candidates within atol " + fmt(x["atol"]) + " / rtol " +
                  fmt(x["rtol"]) + " of the reference's choice; widest " + at(x["widest_tie"]));
  for (const auto& x : t["divergences"])
    out.push_back(where(x) + " decides " + std::to_string(x["positions_differing"].get<long long>()) +
                  " position(s) differently, not only at near ties: " +
                  (x.contains("why") ? x["why"].get<std::string>()
                                     : at(x["first_not_a_tie"]) + " (beyond atol " + fmt(x["atol"]) + " / rtol " +
                                           fmt(x["rtol"]) + ")"));
  if (t.contains("note")) out.push_back(t["note"].get<std::string>());
  if (t["ties"].empty() && t["divergences"].empty())
    out.push_back("no TopK or NonMaxSuppression decides differently: no near tie explains the difference");
  if (d.value("replayed", false))
    out.push_back(std::string("replayed: the reference interpreter with the tie(s) resolved the engine's way, compared "
                              "again with the same tolerances: ") +
                  (d["pass"].get<bool>() ? "PASS" : "FAIL") +
                  "; before the replay: " + d["before_replay"]["why"].get<std::string>());
  return out;
}
std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string svg_histogram(const json& out, int id) {
  const json& h = out["stats"]["histogram"];
  std::vector<int64_t> counts = h["counts"].get<std::vector<int64_t>>();
  std::vector<double> edges = h["log10_edges"].get<std::vector<double>>();
  int64_t exact = h["exact"].get<int64_t>();
  size_t nb = counts.size() + 1;  // first bar: exact matches
  int64_t mx = exact;
  for (auto c : counts) mx = std::max(mx, c);
  const int W = 720, H = 260, L = 60, B = 50, T = 20;
  double bw = static_cast<double>(W - L - 10) / static_cast<double>(std::max<size_t>(nb, 1));
  std::ostringstream s;
  s << "<svg id=\"histogram-" << id << "\" class=\"histogram\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W
    << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H << "\">";
  s << "<rect x=\"0\" y=\"0\" width=\"" << W << "\" height=\"" << H << "\" fill=\"#fff\"/>";
  s << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - 10 << "\" y2=\"" << H - B
    << "\" stroke=\"#333\"/><line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << H - B
    << "\" stroke=\"#333\"/>";
  double atol = out["stats"].value("atol", 0.0);
  for (size_t i = 0; i < nb; ++i) {
    int64_t c = i == 0 ? exact : counts[i - 1];
    double bh = mx ? (H - B - T) * std::log1p(static_cast<double>(c)) / std::log1p(static_cast<double>(mx)) : 0;
    double x = L + static_cast<double>(i) * bw;
    bool over = i > 0 && atol > 0 && edges[i - 1] >= std::log10(atol);
    std::string label = i == 0 ? "0" : "1e" + fmt(edges[i - 1]);
    s << "<rect x=\"" << x + 1 << "\" y=\"" << (H - B) - bh << "\" width=\"" << std::max(bw - 2, 1.0) << "\" height=\""
      << bh << "\" fill=\"" << (over ? "#d9534f" : "#4a90d9") << "\"><title>|err| "
      << (i == 0 ? "= 0" : "in [" + label + ", 1e" + fmt(edges[i]) + ")") << ": " << c << "</title></rect>";
    if (i % 2 == 0)
      s << "<text x=\"" << x + bw / 2 << "\" y=\"" << H - B + 14 << "\" font-size=\"9\" text-anchor=\"middle\">"
        << label << "</text>";
  }
  s << "<text x=\"" << (W + L) / 2 << "\" y=\"" << H - 10
    << "\" font-size=\"12\" text-anchor=\"middle\">|test - ref| (log10 bins; red: above atol)</text>";
  s << "<text x=\"14\" y=\"" << (H - B + T) / 2
    << "\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 14 " << (H - B + T) / 2
    << ")\">elements (log scale), max " << mx << "</text></svg>";
  return s.str();
}

std::string svg_layers(const json& div) {
  const json& layers = div["layers"];
  const int W = 900, H = 300, L = 60, B = 40, T = 20;
  size_t n = layers.size();
  double lo = -10, hi = 1;
  for (const auto& l : layers) {
    double m = l["max_abs"].get<double>();
    if (m > 0) hi = std::max(hi, std::ceil(std::log10(m)));
  }
  auto ypos = [&](double m) {
    double l = m > 0 ? std::max(std::log10(m), lo) : lo;
    return (H - B) - (l - lo) / (hi - lo) * (H - B - T);
  };
  double bw = static_cast<double>(W - L - 10) / static_cast<double>(std::max<size_t>(n, 1));
  std::ostringstream s;
  s << "<svg id=\"layer-plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\"><rect width=\"" << W << "\" height=\"" << H << "\" fill=\"#fff\"/>";
  for (int e = static_cast<int>(lo); e <= static_cast<int>(hi); e += 2)
    s << "<line x1=\"" << L << "\" x2=\"" << W - 10 << "\" y1=\"" << ypos(std::pow(10, e)) << "\" y2=\""
      << ypos(std::pow(10, e)) << "\" stroke=\"#eee\"/><text x=\"" << L - 4 << "\" y=\"" << ypos(std::pow(10, e)) + 4
      << "\" font-size=\"10\" text-anchor=\"end\">1e" << e << "</text>";
  int first = div["first"].is_null() ? -1 : div["first"]["index"].get<int>();
  for (size_t i = 0; i < n; ++i) {
    double m = layers[i]["max_abs"].get<double>();
    double x = L + (static_cast<double>(i) + 0.5) * bw;
    std::string name = html_escape(layers[i]["name"].get<std::string>());
    if (m < 0) {
      s << "<circle cx=\"" << x << "\" cy=\"" << H - B << "\" r=\"3\" fill=\"none\" stroke=\"#999\"><title>" << name
        << ": not observable</title></circle>";
      continue;
    }
    std::string color = static_cast<int>(i) == first    ? "#d9534f"
                        : layers[i]["pass"].get<bool>() ? "#4a90d9"
                                                        : "#f0ad4e";
    s << "<circle cx=\"" << x << "\" cy=\"" << ypos(m) << "\" r=\"" << (static_cast<int>(i) == first ? 6 : 3)
      << "\" fill=\"" << color << "\"><title>" << i << " " << name << ": max abs err " << fmt(m) << "</title></circle>";
  }
  s << "<text x=\"" << (W + L) / 2 << "\" y=\"" << H - 10
    << "\" font-size=\"12\" text-anchor=\"middle\">engine layers in topological order (red: first divergence; "
       "hollow: not observable)</text></svg>";
  return s.str();
}

}  // namespace

std::string html_report(const json& rep) {
  std::ostringstream h;
  bool pass = rep["pass"].get<bool>();
  h << "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>kiln compare report</title><style>"
       "body{font-family:sans-serif;margin:20px;color:#222}table{border-collapse:collapse;margin:8px 0}"
       "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}"
       ".pass{color:#2e7d32;font-weight:bold}.fail{color:#c62828;font-weight:bold}code{background:#f4f4f4}"
       "</style></head><body>";
  h << "<h1>kiln compare: <span class=\"" << (pass ? "pass\">PASS" : "fail\">FAIL") << "</span></h1>";
  h << "<p>model <code>" << html_escape(rep["model"].get<std::string>()) << "</code><br>reference: <b>"
    << html_escape(rep["ref"].get<std::string>()) << "</b>, test: <b>" << html_escape(rep["test"].get<std::string>())
    << "</b> (boundary " << html_escape(rep["boundary"].get<std::string>()) << ")</p>";
  int id = 0;
  for (const auto& out : rep["outputs"]) {
    const json& s = out["stats"];
    h << "<h2 id=\"output-" << id << "\">output <code>" << html_escape(out["name"].get<std::string>())
      << "</code> <span class=\"" << (out["pass"].get<bool>() ? "pass\">PASS" : "fail\">FAIL") << "</span></h2>";
    h << "<table><tr><th>ref</th><td>" << html_escape(out["ref_desc"].get<std::string>()) << "</td><th>test</th><td>"
      << html_escape(out["test_desc"].get<std::string>()) << "</td></tr>";
    h << "<tr><th>NaN ref/test</th><td>" << s["nan"]["ref"] << " / " << s["nan"]["test"]
      << "</td><th>Inf ref/test</th><td>" << s["inf"]["ref"] << " / " << s["inf"]["test"] << "</td></tr>";
    h << "<tr><th>abs err max/mean/median</th><td>" << fmt(s["abs_err"]["max"]) << " / " << fmt(s["abs_err"]["mean"])
      << " / " << fmt(s["abs_err"]["median"]) << "</td><th>rel err max/mean/median</th><td>" << fmt(s["rel_err"]["max"])
      << " / " << fmt(s["rel_err"]["mean"]) << " / " << fmt(s["rel_err"]["median"]) << "</td></tr>";
    h << "<tr><th>tolerance</th><td>" << html_escape(rep["check_error_stat"].get<std::string>()) << " atol "
      << fmt(s["atol"]) << " rtol " << fmt(s["rtol"]) << "</td><th>outside</th><td>" << s["outside_tolerance"] << " of "
      << s["elements"] << " " << html_escape(s["why"].get<std::string>()) << "</td></tr></table>";
    h << "<p>percentiles of |err|: ";
    for (const char* k : kPercentiles)
      if (s["abs_err_percentiles"].contains(k)) h << k << " " << fmt(s["abs_err_percentiles"][k]) << " &nbsp; ";
    h << "</p>" << svg_histogram(out, id);
    if (out.contains("classifier")) {
      const json& c = out["classifier"];
      h << "<p>classifier: top-1 agreement " << c["top1_agree"] << "/" << c["rows"] << ", ref top-1 in test top-"
        << c["k"] << ": " << c["ref_top1_in_test_topk"] << "/" << c["rows"] << ", flipped decisions " << c["flipped"]
        << "</p>";
    }
    for (const auto& t : out.value("thresholds", json::array()))
      h << "<p>threshold " << fmt(t["value"]) << ": " << t["crossings"] << " element(s) on different sides</p>";
    h << "<table><tr><th>index</th><th>ref</th><th>test</th><th>abs err</th></tr>";
    for (const auto& w : s["worst"])
      h << "<tr><td>" << w["index"].get<std::string>() << "</td><td>" << w["ref"].dump() << "</td><td>"
        << w["test"].dump() << "</td><td>" << w["abs_err"].dump() << "</td></tr>";
    h << "</table>";
    ++id;
  }
  for (const auto& d : rep.value("detections", json::array())) {
    h << "<h2 class=\"detections\">detections <code>" << html_escape(d["spec"].get<std::string>())
      << "</code> <span class=\"" << (d["pass"].get<bool>() ? "pass\">PASS" : "fail\">FAIL") << "</span></h2>";
    if (d["auto"].get<bool>()) h << "<p>" << html_escape(d["note"].get<std::string>()) << "</p>";
    h << "<table><tr><th>ref / test detections</th><td>" << d["ref_count"] << " / " << d["test_count"]
      << "</td><th>matched</th><td>" << d["matched"] << "</td></tr><tr><th>max IoU deficit</th><td>"
      << fmt(d["max_iou_deficit"]) << " (need IoU &ge; " << fmt(d["det_iou"]) << ")</td><th>max score diff</th><td>"
      << fmt(d["max_score_diff"]) << " (atol " << fmt(d["score_atol"]) << ", rtol " << fmt(d["score_rtol"])
      << ")</td></tr><tr><th>pairs matched by coordinates</th><td colspan=\"3\">" << d["matched_by_coordinates"]
      << " (IoU below the bar, every coordinate within the boxes' atol/rtol)</td></tr><tr><th>score threshold</th><td "
         "colspan=\"3\">"
      << (d["score_threshold"].is_null()
              ? std::string("none known")
              : fmt(d["score_threshold"]) + " (" + html_escape(d["score_threshold_source"].get<std::string>()) + ")")
      << "</td></tr></table>";
    for (const auto& line : near_tie_lines(d)) h << "<p>" << html_escape(line) << "</p>";
    if (!d["why"].get<std::string>().empty())
      h << "<p class=\"fail\">" << html_escape(d["why"].get<std::string>()) << "</p>";
    h << "<table><tr><th>detection</th><th>score</th><th>verdict</th></tr>";
    for (const auto& p : d["failed_pairs"])
      h << "<tr><td>matched ref #" << p["ref"]["index"] << " / test #" << p["test"]["index"] << "</td><td>"
        << fmt(p["ref"]["score"]) << " / " << fmt(p["test"]["score"]) << "</td><td class=\"fail\">"
        << html_escape(p["why"].get<std::string>()) << "</td></tr>";
    for (const auto& u : d["unmatched"])
      h << "<tr><td>unmatched " << html_escape(u["side"].get<std::string>()) << " #" << u["index"] << "</td><td>"
        << fmt(u["score"]) << "</td><td class=\"" << (u["explained"].get<bool>() ? "pass" : "fail") << "\">"
        << html_escape(u["why"].get<std::string>()) << "</td></tr>";
    h << "</table>";
  }
  if (rep.contains("divergence")) {
    const json& d = rep["divergence"];
    h << "<h2>per-layer error (engine vs " << html_escape(rep["ref"].get<std::string>()) << ", fusions on)</h2>"
      << svg_layers(d);
    if (d["first"].is_null()) {
      h << "<p class=\"pass\">no layer leaves tolerance (" << d["observed_layers"] << " of " << d["total_layers"]
        << " layers observable)</p>";
    } else {
      const json& f = d["first"];
      h << "<h3 id=\"first-divergence\">first divergence: layer " << f["index"] << " <code>"
        << html_escape(f["name"].get<std::string>()) << "</code> (" << html_escape(f["op_type"].get<std::string>())
        << ", kernel " << html_escape(f["kernel"].get<std::string>()) << ", "
        << html_escape(f["precision"].get<std::string>()) << ")</h3><p>ONNX nodes: ";
      for (const auto& src : f["sources"]) h << "<code>" << html_escape(src.get<std::string>()) << "</code> ";
      h << "<br>" << html_escape(f["verdict"].get<std::string>())
        << "</p><table><tr><th></th><th>tensor</th><th>max abs err</th></tr>";
      for (const auto& in : f["inputs"])
        h << "<tr><td>before (input)</td><td>" << html_escape(in["name"].get<std::string>()) << "</td><td>"
          << (in.contains("max_abs") ? fmt(in["max_abs"]) : html_escape(in.value("kind", ""))) << "</td></tr>";
      for (const auto& x : f["outputs"])
        h << "<tr><td>after (output)</td><td>" << html_escape(x["name"].get<std::string>()) << "</td><td>"
          << (x.contains("max_abs") ? fmt(x["max_abs"]) : html_escape(x.value("kind", ""))) << "</td></tr>";
      h << "</table>";
    }
  }
  h << "<h2>environment</h2><pre>" << html_escape(rep["versions"].dump(1)) << "</pre></body></html>\n";
  return h.str();
}

void print_text(const json& rep) {
  std::printf("kiln compare: %s\n  reference: %s\n  test:      %s\n  boundary:  %s\n",
              rep["model"].get<std::string>().c_str(), rep["ref"].get<std::string>().c_str(),
              rep["test"].get<std::string>().c_str(), rep["boundary"].get<std::string>().c_str());
  for (const auto& in : rep["inputs"]["values"]) std::printf("input  %s\n", in["summary"].get<std::string>().c_str());
  if (rep.contains("default_tolerances")) {
    const json& d = rep["default_tolerances"];
    if (d["format"] != "fp32")
      std::printf("tolerances for %s %s engine: atol %s rtol %s (outputs no --atol/--rtol names)\n",
                  d["format"] == "fp16" ? "an" : "a", d["format"].get<std::string>().c_str(), fmt(d["atol"]).c_str(),
                  fmt(d["rtol"]).c_str());
    if (!d["note"].get<std::string>().empty()) std::printf("note: %s\n", d["note"].get<std::string>().c_str());
  }
  for (const auto& out : rep["outputs"]) {
    const json& s = out["stats"];
    std::printf("output %s: %s  (ref %s, test %s)\n", out["name"].get<std::string>().c_str(),
                out["pass"].get<bool>() ? "PASS" : "FAIL", out["ref_desc"].get<std::string>().c_str(),
                out["test_desc"].get<std::string>().c_str());
    if (!out["dtype_match"].get<bool>()) std::printf("  dtype differs\n");
    if (!s["comparable"].get<bool>()) {
      std::printf("  %s\n", s["why"].get<std::string>().c_str());
      continue;
    }
    std::printf("  NaN ref %lld test %lld, Inf ref %lld test %lld\n", s["nan"]["ref"].get<long long>(),
                s["nan"]["test"].get<long long>(), s["inf"]["ref"].get<long long>(), s["inf"]["test"].get<long long>());
    std::printf("  abs err: max %s mean %s median %s\n", fmt(s["abs_err"]["max"]).c_str(),
                fmt(s["abs_err"]["mean"]).c_str(), fmt(s["abs_err"]["median"]).c_str());
    std::printf("  rel err (floor %s): max %s mean %s median %s\n", fmt(rep["rel_floor"]).c_str(),
                fmt(s["rel_err"]["max"]).c_str(), fmt(s["rel_err"]["mean"]).c_str(),
                fmt(s["rel_err"]["median"]).c_str());
    std::printf("  |err| percentiles:");
    for (const char* k : kPercentiles)
      if (s["abs_err_percentiles"].contains(k)) std::printf(" %s %s", k, fmt(s["abs_err_percentiles"][k]).c_str());
    std::printf("\n  histogram of |err|: exact %lld", s["histogram"]["exact"].get<long long>());
    const auto& edges = s["histogram"]["log10_edges"];
    const auto& counts = s["histogram"]["counts"];
    for (size_t i = 0; i < counts.size(); ++i)
      if (counts[i].get<int64_t>())
        std::printf(", [1e%s,1e%s) %lld", fmt(edges[i]).c_str(), fmt(edges[i + 1]).c_str(), counts[i].get<long long>());
    std::printf("\n  tolerance (%s, atol %s, rtol %s): %lld of %lld elements outside%s%s\n",
                rep["check_error_stat"].get<std::string>().c_str(), fmt(s["atol"]).c_str(), fmt(s["rtol"]).c_str(),
                s["outside_tolerance"].get<long long>(), s["elements"].get<long long>(),
                s["why"].get<std::string>().empty() ? "" : ": ", s["why"].get<std::string>().c_str());
    for (const auto& w : s["worst"])
      if (w["abs_err"] != json(0.0))
        std::printf("  worst %s: ref %s test %s abs err %s\n", w["index"].get<std::string>().c_str(),
                    w["ref"].dump().c_str(), w["test"].dump().c_str(), w["abs_err"].dump().c_str());
    if (out.contains("classifier")) {
      const json& c = out["classifier"];
      std::printf("  classifier: top-1 agree %lld/%lld, ref top-1 in test top-%d %lld/%lld, flipped decisions %lld\n",
                  c["top1_agree"].get<long long>(), c["rows"].get<long long>(), c["k"].get<int>(),
                  c["ref_top1_in_test_topk"].get<long long>(), c["rows"].get<long long>(),
                  c["flipped"].get<long long>());
    }
    for (const auto& t : out.value("thresholds", json::array()))
      std::printf("  threshold %s: %lld element(s) on different sides\n", fmt(t["value"]).c_str(),
                  t["crossings"].get<long long>());
  }
  for (const auto& d : rep.value("detections", json::array())) {
    std::printf("detections %s: %s  (ref %s, test %s)\n", d["spec"].get<std::string>().c_str(),
                d["pass"].get<bool>() ? "PASS" : "FAIL", d["ref_desc"].get<std::string>().c_str(),
                d["test_desc"].get<std::string>().c_str());
    if (d["auto"].get<bool>()) std::printf("  %s\n", d["note"].get<std::string>().c_str());
    std::printf(
        "  %lld reference, %lld test detections; %lld matched, max IoU deficit %s (need IoU >= %s), "
        "max score diff %s (atol %s, rtol %s)\n",
        d["ref_count"].get<long long>(), d["test_count"].get<long long>(), d["matched"].get<long long>(),
        fmt(d["max_iou_deficit"]).c_str(), fmt(d["det_iou"]).c_str(), fmt(d["max_score_diff"]).c_str(),
        fmt(d["score_atol"]).c_str(), fmt(d["score_rtol"]).c_str());
    if (d["matched_by_coordinates"].get<int64_t>())
      std::printf(
          "  %lld matched pair(s) with IoU below %s accepted because every coordinate is within the boxes' "
          "atol %s / rtol %s (thin boxes; not in the IoU deficit)\n",
          d["matched_by_coordinates"].get<long long>(), fmt(d["det_iou"]).c_str(), fmt(d["box_atol"]).c_str(),
          fmt(d["box_rtol"]).c_str());
    if (d["score_threshold"].is_null())
      std::printf("  score threshold: none known\n");
    else
      std::printf("  score threshold %s (%s)\n", fmt(d["score_threshold"]).c_str(),
                  d["score_threshold_source"].get<std::string>().c_str());
    for (const auto& p : d["failed_pairs"])
      std::printf("  matched pair ref #%lld / test #%lld (score %s / %s, IoU %s): %s\n",
                  p["ref"]["index"].get<long long>(), p["test"]["index"].get<long long>(),
                  fmt(p["ref"]["score"]).c_str(), fmt(p["test"]["score"]).c_str(), fmt(p["iou"]).c_str(),
                  p["why"].get<std::string>().c_str());
    for (const auto& u : d["unmatched"])
      std::printf("  unmatched %s #%lld%s score %s: %s, %s\n", u["side"].get<std::string>().c_str(),
                  u["index"].get<long long>(), u.contains("label") ? (" (label " + fmt(u["label"]) + ")").c_str() : "",
                  fmt(u["score"]).c_str(), u["explained"].get<bool>() ? "accepted" : "NOT accepted",
                  u["why"].get<std::string>().c_str());
    for (const auto& line : near_tie_lines(d)) std::printf("  %s\n", line.c_str());
    if (!d["why"].get<std::string>().empty()) std::printf("  %s\n", d["why"].get<std::string>().c_str());
  }
  if (rep.contains("divergence")) {
    const json& d = rep["divergence"];
    if (d["first"].is_null()) {
      std::printf("first divergence: none (%d of %d layers observable, all within tolerance)\n",
                  d["observed_layers"].get<int>(), d["total_layers"].get<int>());
    } else {
      const json& f = d["first"];
      std::string srcs;
      for (const auto& x : f["sources"]) srcs += (srcs.empty() ? "" : ", ") + x.get<std::string>();
      std::printf("first divergence: layer %d '%s' (%s, kernel %s, %s%s) from ONNX nodes [%s]\n", f["index"].get<int>(),
                  f["name"].get<std::string>().c_str(), f["op_type"].get<std::string>().c_str(),
                  f["kernel"].get<std::string>().c_str(), f["precision"].get<std::string>().c_str(),
                  f["fused"].get<bool>() ? ", fused" : "", srcs.c_str());
      // A channel-blocked value is shown with the plain value it stands for.
      auto label = [](const json& v) {
        return v["name"].get<std::string>() + (v.contains("as") ? " (as " + v["as"].get<std::string>() + ")" : "");
      };
      for (const auto& in : f["inputs"])
        std::printf(
            "  before: input %s %s\n", label(in).c_str(),
            in.contains("max_abs") ? ("max abs err " + fmt(in["max_abs"])).c_str() : in.value("kind", "").c_str());
      for (const auto& x : f["outputs"])
        std::printf("  after:  output %s %s\n", label(x).c_str(),
                    x.contains("max_abs") ? ("max abs err " + fmt(x["max_abs"])).c_str() : x.value("kind", "").c_str());
      std::printf("  %s\n", f["verdict"].get<std::string>().c_str());
      if (!f["unobservable_before"].empty())
        std::printf("  unobservable layers just before it: %s\n", f["unobservable_before"].dump().c_str());
    }
    if (d.contains("ref_only") && !d["ref_only"].empty())
      std::printf("reference-engine tensors the engine under test does not make (fused differently), skipped: %s\n",
                  d["ref_only"].dump().c_str());
  }
  const json dets = rep.value("detections", json::array());
  int det_pass = 0;
  for (const auto& d : dets) det_pass += d["pass"].get<bool>();
  std::string heads = dets.empty() ? ""
                                   : ", " + std::to_string(det_pass) + " of " + std::to_string(dets.size()) +
                                         " detection head(s) matching";
  std::printf("RESULT: %s (%d of %d outputs within tolerance%s)\n", rep["pass"].get<bool>() ? "PASS" : "FAIL",
              rep["outputs_passed"].get<int>(), static_cast<int>(rep["outputs"].size()), heads.c_str());
}

}  // namespace kiln::tools::compare
