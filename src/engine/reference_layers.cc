// Layers that run their reference kernel in an engine are findings, never silent (issue 11): the
// builder warns per layer with its op and the tactics that declined it, counts them in its summary,
// records them in the engine (LayerInfo::reference, build["reference"]) with their share of an
// estimated run time, and under BuilderConfig::strict_tactics fails instead.
//
// Shape work (engine::is_shape_work: Shape, Reshape and the other ops that move no elements, and
// layers whose tensors are all small) runs reference kernels too, by design: it is counted apart and
// neither warned about nor failed on.
//
// The estimate is measured, not modelled: one run of the engine (its chosen kernels, every layer
// prepared ahead) at profile 0's opt shapes on random inputs, layer by layer, then two more when the
// first took under a second, keeping each layer's fastest. It happens only when there is a finding.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "engine/engine_impl.h"
#include "engine/executor.h"

namespace kiln::detail {

namespace {

using Clock = std::chrono::steady_clock;

std::string op_of(const ir::Node& n) {
  return (n.domain.empty() ? n.op_type : n.domain + "." + n.op_type) + ", opset " + std::to_string(n.opset);
}

std::string joined(const std::vector<std::string>& reasons) {
  std::string s;
  for (const auto& r : reasons) s += (s.empty() ? "" : "; ") + r;
  return s;
}

// Each layer's time in ms in runs of `e` at `shapes` (the fastest of up to three runs); with `bodies`,
// the body layers' own times by path too (a control-flow layer's time then leaves them out).
Result<std::vector<double>> time_layers(const std::shared_ptr<EngineImpl>& e, const std::map<std::string, Dims>& shapes,
                                        std::map<std::string, double>* bodies) {
  const ir::Graph& g = *e->model.graph;
  std::mt19937_64 rng(0x6b696c6e);
  std::vector<Tensor> inputs;
  auto engine = std::make_shared<Engine>(e);
  std::vector<double> best(g.nodes.size(), -1), now(g.nodes.size(), 0);
  try {
    auto ctx = engine->create_context();
    for (const auto& in : g.inputs) {
      auto it = shapes.find(in.name);
      if (it == shapes.end()) continue;
      inputs.push_back(tune::random_activation(in.type.elem, it->second, rng));
      const Tensor& t = inputs.back();
      ctx->set_input(in.name, HostTensor::borrow(static_cast<DataTypeCode>(t.dtype()), t.shape(), t.raw(), t.nbytes()));
    }
    set_layer_timer(ctx->impl(), [&](size_t layer, const ir::Node&, Clock::time_point b, Clock::time_point end) {
      if (layer < now.size()) now[layer] = std::chrono::duration<double, std::milli>(end - b).count();
    });
    std::map<std::string, double> body_now;
    if (bodies)
      set_body_layer_timer(ctx->impl(), [&](const engine::LayerExecutor::BodyLayerTime& t) {
        body_now[t.path] += t.self_ms;  // summed over a Loop's iterations
      });
    for (int run = 0; run < 3; ++run) {
      auto t0 = Clock::now();
      body_now.clear();
      ctx->run();
      for (size_t l = 0; l < now.size(); ++l) best[l] = best[l] < 0 ? now[l] : std::min(best[l], now[l]);
      if (bodies)
        for (const auto& [path, ms] : body_now) {
          auto [it, fresh] = bodies->emplace(path, ms);
          if (!fresh) it->second = std::min(it->second, ms);
        }
      if (std::chrono::duration<double>(Clock::now() - t0).count() > 1.0) break;
    }
  } catch (const Error& err) {
    return status_of(err);
  }
  return best;
}

}  // namespace

void record_body_reference(EngineImpl& e, const engine::BodyTuning& bodies) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& r : bodies.reference)
    list.push_back({{"layer", r.path},
                    {"op", r.op_type},
                    {"domain", r.domain},
                    {"opset", r.opset},
                    {"reasons", r.reasons},
                    {"shape_work", r.shape_work}});
  e.build["body_reference"] = list;
}

Status report_reference_layers(const std::shared_ptr<EngineImpl>& e, const BuilderConfig& cfg, bool reference_only,
                               const std::function<void(const std::string&)>& log) {
  const ir::Graph& g = *e->model.graph;
  std::vector<size_t> findings;
  int shape_layers = 0;
  for (size_t i = 0; i < e->layers.size(); ++i) {
    if (e->layers[i].finding()) findings.push_back(i);
    shape_layers += e->layers[i].kernel == "reference" && e->layers[i].reference.shape_work;
  }
  // Body layers (If/Loop/Scan, nested too) left on reference kernels: findings like the main graph's.
  nlohmann::json& body_ref = e->build["body_reference"];
  if (!body_ref.is_array()) body_ref = nlohmann::json::array();
  std::vector<size_t> body_findings;
  for (size_t b = 0; b < body_ref.size(); ++b) {
    if (body_ref[b]["shape_work"].get<bool>())
      ++shape_layers;
    else
      body_findings.push_back(b);
  }
  auto body_name = [&](size_t b) {
    const nlohmann::json& r = body_ref[b];
    std::string op = r["domain"].get<std::string>().empty()
                         ? r["op"].get<std::string>()
                         : r["domain"].get<std::string>() + "." + r["op"].get<std::string>();
    return "'" + r["layer"].get<std::string>() + "' (" + op + ", opset " + std::to_string(r["opset"].get<int>()) + ")";
  };
  auto body_reasons = [&](size_t b) {
    std::vector<std::string> v;
    for (const auto& x : body_ref[b]["reasons"]) v.push_back(x.get<std::string>());
    return joined(v);
  };
  auto name_of = [&](size_t i) { return "'" + e->layers[i].name + "' (" + op_of(g.nodes[i]) + ")"; };
  const size_t n_findings = findings.size() + body_findings.size();
  if (cfg.strict_tactics && n_findings) {
    std::string list;
    for (size_t i : findings) list += "\n  layer " + name_of(i) + ": " + joined(e->layers[i].reference.reasons);
    for (size_t b : body_findings) list += "\n  body layer " + body_name(b) + ": " + body_reasons(b);
    return Unsupported("--strict-tactics: ", n_findings, " layer", n_findings == 1 ? "" : "s",
                       " would run reference kernels:", list,
                       "\n— add tactics for these layers, or build without --strict-tactics to accept them");
  }
  auto warn = warner(cfg);
  // The layers the bound layer list leaves to the interpreter loop (engine/executor.h, split runs): from
  // the first one with a body or an output of data-dependent size on. On a device engine they run on
  // the host, after the device prefix.
  const bool on_device = e->built_for.device.kind != DeviceKind::kCPU;
  e->build.erase("host_loop");
  for (size_t i = 0; i < g.nodes.size() && i < e->layers.size(); ++i) {
    std::string why = engine::split_point_reason(g.nodes[i], e->layers[i].kernel != "reference", e->plan);
    if (why.empty()) continue;
    const size_t n = g.nodes.size() - i;
    e->build["host_loop"] = {{"from_layer", e->layers[i].name},
                             {"op", g.nodes[i].op_type},
                             {"index", i},
                             {"layers", n},
                             {"bound_layers", i},
                             {"why", why},
                             {"device", device_name(e->built_for.device)}};
    std::string what = std::to_string(n) + " of " + std::to_string(g.nodes.size()) + " layers, from " + name_of(i) +
                       " on, run through the interpreter loop" +
                       (on_device ? " on the host (reference kernels; the values they read copied from " +
                                        device_name(e->built_for.device) + " once per run)"
                                  : "") +
                       " after the " + std::to_string(i) + " bound layers: " + why;
    // A dim of an input the build had no shape for is unknown to every layer after it: say so, and how
    // to bind them (a dynamic batch without --shapes left all of mobilenet_v2 on the host on cuda).
    std::string unshaped;
    if (on_device && cfg.profiles.empty())
      for (const auto& in : g.inputs)
        if (!g.initializers.count(in.name) && in.type.is_tensor() && !in.type.shape.fully_known())
          unshaped += (unshaped.empty() ? "" : ", ") + ("'" + in.name + "' " + in.type.shape.str());
    if (!unshaped.empty())
      what += "; the build was given no shapes for input " + unshaped +
              ": give them (--shapes NAME:1x3x224x224,... or --min/--opt/--max) to bind every layer to " +
              device_name(e->built_for.device);
    if (on_device)
      warn(what);
    else
      log("[kiln build] " + what);
    break;
  }
  // On a device engine a reference kernel is a host fallback: its inputs come to the host and its outputs
  // go back to the device around it (engine/executor.h).
  const std::string where = e->built_for.device.kind == DeviceKind::kCPU
                                ? ""
                                : " on the host (copies to and from " + device_name(e->built_for.device) + ")";
  if (reference_only)
    warn("every layer runs its reference kernel: reference kernels were requested");
  else
    for (size_t i : findings)
      warn("layer " + name_of(i) + " runs its reference kernel" + where + ": " +
           joined(e->layers[i].reference.reasons));
  if (!reference_only)
    for (size_t b : body_findings)
      warn("body layer " + body_name(b) + " runs its reference kernel: " + body_reasons(b));

  nlohmann::json rec = {{"layers", n_findings}, {"body_layers", body_findings.size()}, {"shape_layers", shape_layers}};
  std::string share;
  if (reference_only) {
    rec["estimate"] = "not measured: reference kernels were requested";
  } else if (n_findings) {
    auto shapes = e->typical_shapes();
    std::map<std::string, double> body_ms;
    auto times = shapes.ok() ? time_layers(e, shapes.value(), &body_ms) : Result<std::vector<double>>(shapes.status());
    if (times.ok()) {
      double total = 0, ref = 0, shape_ms = 0;
      for (size_t i = 0; i < e->layers.size() && i < times.value().size(); ++i) {
        double ms = times.value()[i];
        total += ms;
        LayerInfo& l = e->layers[i];
        if (l.kernel != "reference") continue;
        l.reference.ms = ms;
        (l.reference.shape_work ? shape_ms : ref) += ms;
      }
      // Body layers: their own times (a control-flow layer's time above leaves them out). A body that
      // did not run at these shapes (the other If branch) has no time.
      for (const auto& [path, ms] : body_ms) total += ms;
      for (auto& r : body_ref) {
        auto it = body_ms.find(r["layer"].get<std::string>());
        if (it == body_ms.end()) continue;
        r["ms"] = it->second;
        (r["shape_work"].get<bool>() ? shape_ms : ref) += it->second;
      }
      rec["estimated_ms"] = total, rec["reference_ms"] = ref, rec["shape_ms"] = shape_ms;
      std::string at = "the build's shapes";
      if (e->build.contains("tuning") && e->build["tuning"].contains("at")) at = e->build["tuning"]["at"];
      rec["estimate"] = "measured: fastest of up to 3 runs at " + at;
      char b[160];
      std::snprintf(b, sizeof b, " (%.1f%% of the estimated time: %.3f of %.3f ms)", total > 0 ? 100 * ref / total : 0,
                    ref, total);
      share = b;
    } else {
      rec["estimate"] = "not measured: " + times.status().message();
      share = " (time not estimated: " + times.status().message() + ")";
    }
  }
  e->build["reference"] = rec;
  log("[kiln build] " + std::to_string(n_findings) + (n_findings == 1 ? " layer runs" : " layers run") +
      " reference kernels" + share + "; " + std::to_string(shape_layers) + " shape-work layer" +
      (shape_layers == 1 ? "" : "s") + " not counted" +
      (body_findings.empty() ? "" : " (" + std::to_string(body_findings.size()) + " in control-flow bodies)") +
      (n_findings ? "; kiln inspect lists them with their reasons" : ""));
  return Status::Ok();
}

}  // namespace kiln::detail
