// kiln inspect: what an engine became (layers, kernels, shapes, memory plan, passes, target), from a
// .kiln file or an ONNX model (built in memory with default options).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>

#include "kiln/kiln.h"
#include "tools/commands.h"

namespace kiln::tools {

namespace {
struct InspectOptions {
  std::string path;
  std::string format = "text";
  bool passes_only = false;
};

std::string mib(double bytes) {
  char b[32];
  if (bytes < 1024.0 * 1024.0)
    std::snprintf(b, sizeof b, "%.1f KiB", bytes / 1024.0);
  else
    std::snprintf(b, sizeof b, "%.2f MiB", bytes / (1024.0 * 1024.0));
  return b;
}

// The auto-tuner's candidates of a layer: times (the winner marked), the ones that could not prepare
// or run with the reason. Nothing for layers without tactics.
void print_candidates(const nlohmann::json& l) {
  if (!l.contains("candidates") || l["candidates"].empty()) return;
  std::string line;
  for (const auto& c : l["candidates"]) {
    std::string tactic = c["tactic"].get<std::string>(), state = c["state"].get<std::string>();
    bool won = tactic == l["kernel"].get<std::string>();
    char b[64] = "";
    if (state == "timed") std::snprintf(b, sizeof b, " %.3f ms", c["ms"].get<double>());
    line += (line.empty() ? "" : ", ") + tactic + (state == "timed" ? std::string(b) : " " + state) +
            (won ? " (won)" : "") + (c.value("cached", false) ? " [cache]" : "");
    if (c.contains("error")) line += ": " + c["error"].get<std::string>();
  }
  std::printf("         candidates: %s\n", line.c_str());
}

// The layers left on reference kernels: findings first (each with its share of the build's estimated
// run time and why no tactic took it), then shape work in one line.
void print_reference(const nlohmann::json& j) {
  if (!j.contains("reference_layers")) return;
  const nlohmann::json& b = j["build"];
  const nlohmann::json rec = b.contains("reference") ? b["reference"] : nlohmann::json::object();
  int findings = 0, shape = 0;
  double shape_ms = 0;
  for (const auto& r : j["reference_layers"]) (r["shape_work"].get<bool>() ? shape : findings)++;
  for (const auto& r : j["reference_layers"])
    if (r["shape_work"].get<bool>() && r.contains("ms")) shape_ms += r["ms"].get<double>();
  std::string estimate;
  if (rec.contains("estimated_ms") && rec["estimated_ms"].get<double>() > 0) {
    char e[160];
    double total = rec["estimated_ms"].get<double>(), ref = rec.value("reference_ms", 0.0);
    std::snprintf(e, sizeof e, ", %.1f%% of the estimated time (%.3f of %.3f ms)", 100 * ref / total, ref, total);
    estimate = e;
  } else if (rec.contains("estimate")) {
    estimate = " (" + rec["estimate"].get<std::string>() + ")";
  }
  const std::string device = j.contains("built_for") ? j["built_for"].value("device", "cpu") : "cpu";
  std::printf("reference %d %s reference kernels%s%s; %d shape-work layer%s\n", findings,
              findings == 1 ? "layer runs" : "layers run",
              device == "cpu" ? "" : (" on the host, with copies to and from " + device).c_str(), estimate.c_str(),
              shape, shape == 1 ? "" : "s");
  for (const auto& r : j["reference_layers"]) {
    if (r["shape_work"].get<bool>()) continue;
    std::string op = r["domain"].get<std::string>().empty()
                         ? r["op"].get<std::string>()
                         : r["domain"].get<std::string>() + "." + r["op"].get<std::string>();
    op += " (opset " + std::to_string(r["opset"].get<int>()) + ")";
    char t[64] = "   not timed";
    if (r.contains("share"))
      std::snprintf(t, sizeof t, "%9.3f ms %5.1f%%", r["ms"].get<double>(), 100 * r["share"].get<double>());
    std::string why;
    for (const auto& x : r["reasons"]) why += (why.empty() ? "" : "; ") + x.get<std::string>();
    std::printf("  %-32s %-28s %s  %s\n", r["layer"].get<std::string>().c_str(), op.c_str(), t, why.c_str());
  }
  if (shape) {
    std::string names;
    for (const auto& r : j["reference_layers"])
      if (r["shape_work"].get<bool>()) names += (names.empty() ? "" : ", ") + r["layer"].get<std::string>();
    if (names.size() > 200) names = names.substr(0, 197) + "...";
    std::printf("  shape work (not counted, %.3f ms): %s\n", shape_ms, names.c_str());
  }
  // Where a split run leaves the bound layer list (engine/executor.h).
  if (b.contains("host_loop")) {
    const nlohmann::json& h = b["host_loop"];
    std::printf(
        "interpreter loop: %lld layers from '%s' (%s) on%s, after %lld bound: %s\n", h["layers"].get<long long>(),
        h["from_layer"].get<std::string>().c_str(), h["op"].get<std::string>().c_str(),
        device == "cpu" ? "" : (" run on the host (reference kernels, inputs copied from " + device + ")").c_str(),
        h["bound_layers"].get<long long>(), h["why"].get<std::string>().c_str());
  }
}

// A control-flow layer's bodies, indented under it: each body's layers with their kernels, nested
// bodies under their own layer.
void print_bodies(const nlohmann::json& bodies, int depth) {
  const int indent = 7 + 2 * depth;
  for (const auto& b : bodies) {
    std::printf("%*s%s '%s': %zu layer%s\n", indent, "", b["attribute"].get<std::string>().c_str(),
                b["graph"].get<std::string>().c_str(), b["layers"].size(), b["layers"].size() == 1 ? "" : "s");
    for (const auto& l : b["layers"]) {
      std::string out = l["outputs"].empty() ? "" : l["outputs"][0]["type"].get<std::string>();
      std::string src;
      for (const auto& s : l["sources"]) src += (src.empty() ? "" : ",") + s.get<std::string>();
      std::printf("%*s%-32s %-24s %-10s %-26s <- %s\n", indent + 2, "", l["name"].get<std::string>().c_str(),
                  l["op"].get<std::string>().c_str(), l["kernel"].get<std::string>().c_str(), out.c_str(), src.c_str());
      if (l.contains("slow")) std::printf("%*sslow: %s\n", indent + 4, "", l["slow"].get<std::string>().c_str());
      if (l.contains("bodies")) print_bodies(l["bodies"], depth + 2);
    }
  }
}

// INT8 calibration (engine/calibration.h): how, and each quantized activation's range and parameters.
void print_int8(const nlohmann::json& q) {
  if (q.value("mode", "") != "calibrated") {
    std::printf("int8     explicit quantization (the model's own QuantizeLinear/DequantizeLinear nodes)\n");
    return;
  }
  std::string how = q.value("from_cache", false) ? "ranges from the calibration cache " + q.value("calib_cache", "")
                                                 : std::to_string(q.value("batches", 0)) + " calibration batches";
  std::printf(
      "int8     calibrator %s%s, %s: Q/DQ on %d nodes, %d int8 weights, %d int32 biases, %zu uint8 "
      "activations, %zu excluded\n",
      q.value("calibrator", "").c_str(),
      q.contains("percentile") ? (" " + std::to_string(q["percentile"].get<double>())).c_str() : "", how.c_str(),
      q.value("quantized_nodes", 0), q.value("weights", 0), q.value("biases", 0), q["tensors"].size(),
      q["excluded"].size());
  for (const auto& t : q["tensors"])
    std::printf("  %-56s range [%.6g, %.6g] scale %.6g zero point %d\n", t["name"].get<std::string>().c_str(),
                t["min"].get<double>(), t["max"].get<double>(), t["scale"].get<double>(), t["zero_point"].get<int>());
}

void print_auto_precision(const nlohmann::json& a) {
  std::string tols;
  for (const auto& t : a["tolerances"]) tols += (tols.empty() ? "" : " and ") + t.get<std::string>();
  std::printf(
      "auto precision  tolerance %s (candidates %s): %.3f ms vs FP32 %.3f ms (layer times at build); held back (%zu "
      "batches): %s\n",
      tols.c_str(), a.value("candidates", "").c_str(), a.value("measured_ms", 0.0), a.value("fp32_measured_ms", 0.0),
      a.value("held_back_batches", size_t{0}), a.value("held_back", "").c_str());
  std::printf("  assignment:\n");
  for (const auto& u : a["assignment"])
    std::printf("    %-44s %-20s %s\n", u.value("layer", "").c_str(), u.value("op", "").c_str(),
                u.value("precision", "").c_str());
  std::printf("  sensitivity ranking (least sensitive first):\n");
  for (const auto& r : a["ranking"])
    std::printf("    %3d  %-44s %-5s error %-10.3g saved %.3f ms\n", r.value("rank", 0), r.value("layer", "").c_str(),
                r.value("precision", "").c_str(), r.value("error", 0.0), r.value("saved_ms", 0.0));
}

void print_text(const nlohmann::json& j, bool passes_only) {
  const auto& b = j["build"];
  if (!passes_only) {
    std::printf("engine   kiln %s, built for %s (%s), %d cores\n", j["kiln_version"].get<std::string>().c_str(),
                j["target"]["cpu_model"].get<std::string>().c_str(), j["target"]["device"].get<std::string>().c_str(),
                j["target"]["cores"].get<int>());
    if (j["target"].contains("gpu")) {
      const auto& gpu = j["target"]["gpu"];
      auto field = [&](const char* k) { return gpu.contains(k) ? gpu[k].get<std::string>() : std::string("?"); };
      std::printf("gpu      %s, compute capability %s, driver %s, CUDA runtime %s, %s\n", field("name").c_str(),
                  field("compute_capability").c_str(), field("driver").c_str(), field("runtime").c_str(),
                  field("cublaslt").c_str());
    }
    if (b.contains("source"))
      std::printf("source   %s, %d nodes, %d BatchNormalization\n", b["source"]["producer"].get<std::string>().c_str(),
                  b["source"]["nodes"].get<int>(), b["source"]["batch_norms"].get<int>());
    // Custom-op plugins the layers use (src/plugin): loading the engine needs each of them.
    if (b.contains("plugins"))
      for (const auto& p : b["plugins"]) {
        std::string layers;
        for (const auto& l : p["layers"]) layers += (layers.empty() ? "" : ", ") + l.get<std::string>();
        std::printf("plugin   %s %s (%s)%s: layers %s\n", p["name"].get<std::string>().c_str(),
                    p["version"].get<std::string>().c_str(), p.value("origin", "").c_str(),
                    p.value("slow", false) ? ", interpreted kernels (slow)" : "", layers.c_str());
      }
    for (const auto& in : j["inputs"])
      std::printf("input    %s %s\n", in["name"].get<std::string>().c_str(), in["type"].get<std::string>().c_str());
    for (const auto& o : j["outputs"])
      std::printf("output   %s %s\n", o["name"].get<std::string>().c_str(), o["type"].get<std::string>().c_str());
  }
  std::printf("passes   (sites changed)\n");
  if (b.contains("passes"))
    for (const auto& p : b["passes"])
      std::printf("  %-36s %6d   %8.1f ms\n", p["name"].get<std::string>().c_str(), p["changed"].get<int>(),
                  p["ms"].get<double>());
  if (passes_only) return;
  std::printf("layers   %zu:", j["layers"].size());
  for (const auto& [op, n] : j["layer_counts"].items()) std::printf(" %s %d,", op.c_str(), n.get<int>());
  std::printf("\n");
  if (j.contains("body_layers") && j["body_layers"]["layers"].get<int>() > 0)
    std::printf("bodies   %d layers in control-flow bodies, %d with a tactic (listed under their layer)\n",
                j["body_layers"]["layers"].get<int>(), j["body_layers"]["with_tactic"].get<int>());
  if (b.contains("tuning")) {
    const auto& t = b["tuning"];
    int threads = t.value("threads", 0);
    std::printf(
        "tuning   tuned for %d thread%s at %s: %d layers with tactics, %d candidates timed, %d cache hits, %.2f s%s\n",
        threads, threads == 1 ? "" : "s", t.value("at", std::string("?")).c_str(), t.value("layers", 0),
        t.value("timed", 0), t.value("cache_hits", 0), t.value("seconds", 0.0),
        t.value("timing_cache", std::string()).empty()
            ? ""
            : (" (timing cache " + t["timing_cache"].get<std::string>() + ")").c_str());
  }
  if (b.contains("int8")) print_int8(b["int8"]);
  if (b.contains("auto_precision")) print_auto_precision(b["auto_precision"]);
  if (b.contains("qdq_unfolded")) {  // engine/qdq_findings.cc
    const auto& q = b["qdq_unfolded"];
    std::printf("int8     %d INT8 layers; %d QuantizeLinear/DequantizeLinear layers that no INT8 layer takes\n",
                q.value("int8_layers", 0), q.value("layers", 0));
    for (const auto& l : q["list"])
      std::printf("  %-40s %-18s %s\n", l["layer"].get<std::string>().c_str(), l["op"].get<std::string>().c_str(),
                  l["reason"].get<std::string>().c_str());
  }
  print_reference(j);
  {  // Layers per precision (engine/precision.h), and the build's precision settings.
    std::map<std::string, int> per;
    for (const auto& l : j["layers"]) per[l.value("precision", std::string("fp32"))]++;
    std::string counts;
    for (const auto& [p, n] : per) counts += (counts.empty() ? "" : ", ") + p + " x" + std::to_string(n);
    std::string allowed;
    if (b.contains("config") && b["config"].contains("precisions"))
      allowed = " (allowed: " + b["config"]["precisions"].dump() + ")";
    std::printf("precision layers: %s%s\n", counts.c_str(), allowed.c_str());
  }
  int i = 0;
  for (const auto& l : j["layers"]) {
    std::string out = l["outputs"].empty() ? "" : l["outputs"][0]["type"].get<std::string>();
    std::string src;
    for (const auto& s : l["sources"]) src += (src.empty() ? "" : ",") + s.get<std::string>();
    const size_t ws = l.value("workspace_bytes", size_t{0});
    std::string wss = ws ? " ws " + mib(static_cast<double>(ws)) : "";
    std::printf("  %4d %-32s %-24s %-10s %-4s %-26s%s <- %s\n", i++, l["name"].get<std::string>().c_str(),
                l["op"].get<std::string>().c_str(), l["kernel"].get<std::string>().c_str(),
                l.value("precision", std::string("fp32")).c_str(), out.c_str(), wss.c_str(), src.c_str());
    if (l.contains("slow")) std::printf("         slow: %s\n", l["slow"].get<std::string>().c_str());
    print_candidates(l);
    if (l.contains("bodies")) print_bodies(l["bodies"], 0);
  }
  if (j.contains("profiles"))
    for (size_t i = 0; i < j["profiles"].size(); ++i) {
      const auto& p = j["profiles"][i];
      std::printf("profile  %zu '%s': activation memory min %s / opt %s / max %s\n", i,
                  p["name"].get<std::string>().c_str(), mib(p["memory"]["min"].get<double>()).c_str(),
                  mib(p["memory"]["opt"].get<double>()).c_str(), mib(p["memory"]["max"].get<double>()).c_str());
      auto d = [](const nlohmann::json& v) {
        std::string s = "[";
        for (size_t k = 0; k < v.size(); ++k) s += (k ? "," : "") + std::to_string(v[k].get<int64_t>());
        return s + "]";
      };
      for (const auto& in : p["inputs"])
        std::printf("  %-12s %-20s min %-18s opt %-18s max %s\n", in["name"].get<std::string>().c_str(),
                    in["dims"].get<std::string>().c_str(), d(in["min"]).c_str(), d(in["opt"]).c_str(),
                    d(in["max"]).c_str());
    }
  const auto& m = j["memory"];
  std::printf(
      "memory   planned arena peak %s (activations and layer workspaces) vs naive activation sum %s (%d in "
      "place); weights %s\n",
      mib(m["arena_bytes"].get<double>()).c_str(), mib(m["naive_bytes"].get<double>()).c_str(),
      m["in_place"].get<int>(), mib(j["weights_bytes"].get<double>()).c_str());
  if (m.contains("workspace") && m["workspace"].is_object()) {
    const auto& w = m["workspace"];
    std::printf(
        "workspace %zu layer(s) with one: largest %s, sum %s, limit %s (kiln build --workspace); planned in "
        "the arena over dead activations\n",
        w["layers"].size(), mib(w["largest_bytes"].get<double>()).c_str(), mib(w["sum_bytes"].get<double>()).c_str(),
        mib(w["limit_bytes"].get<double>()).c_str());
  }
}
}  // namespace

void add_inspect_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show what an engine (or a model, once built) consists of");
  cmd->add_option("path", o->path, "model.kiln or model.onnx")->required();
  cmd->add_option("--format", o->format, "text or json")->check(CLI::IsMember({"text", "json"}));
  cmd->add_flag("--passes", o->passes_only, "only the passes and how many sites each changed");
  cmd->callback([o, &exit_code]() {
    try {
      bool is_engine = o->path.size() > 5 && o->path.compare(o->path.size() - 5, 5, ".kiln") == 0;
      auto engine = is_engine ? Engine::load(o->path) : Builder().build_from_file(o->path);
      auto j = nlohmann::json::parse(engine->inspect_json());
      if (o->format == "json")
        std::printf("%s\n", j.dump(1).c_str());
      else
        print_text(j, o->passes_only);
      exit_code = kExitOk;
    } catch (const Error& e) {
      exit_code = report_error(detail_status(e));
    }
  });
}

}  // namespace kiln::tools
