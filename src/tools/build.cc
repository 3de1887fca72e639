// kiln build: ONNX model -> optimized engine file (trtexec-like options).
#include <chrono>
#include <cstdio>

#include "engine/engine_impl.h"
#include "kiln/kiln.h"
#include "tools/build_flags.h"
#include "tools/commands.h"

namespace kiln::tools {

namespace {
struct Options {
  std::string model, output;
  BuildFlags flags;
};
}  // namespace

void add_build_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("build", "Build an optimized engine from an ONNX model");
  cmd->add_option("model", o->model, "model.onnx")->required();
  cmd->add_option("-o,--output", o->output, "engine file to write (model.kiln)")->required();
  add_build_flags(cmd, o->flags, "--shapes");
  cmd->callback([o, &exit_code]() {
    auto config = builder_config(o->flags);
    if (!config.ok()) {
      exit_code = report_error(config.status());
      return;
    }
    BuilderConfig cfg = std::move(config).value();
    cfg.log = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
    try {
      using Clock = std::chrono::steady_clock;
      auto seconds = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double>(b - a).count();
      };
      auto t0 = Clock::now();
      auto engine = Builder(cfg).build_from_file(o->model);
      auto t1 = Clock::now();
      engine->save(o->output);
      auto t2 = Clock::now();
      int reference = 0;
      for (const auto& l : engine->impl().layers) reference += l.finding();
      const detail::BodyLayerCount bodies = detail::count_body_layers(*engine->impl().model.graph);
      std::string in_bodies;
      if (bodies.layers)
        in_bodies = " + " + std::to_string(bodies.layers) + " in control-flow bodies (" +
                    std::to_string(bodies.with_tactic) + " with a tactic)";
      // INT8 engines: the Q/DQ layers no INT8 layer took (engine/qdq_findings.cc).
      std::string qdq;
      if (engine->impl().build.contains("qdq_unfolded")) {
        const int n = engine->impl().build["qdq_unfolded"]["layers"].get<int>();
        qdq = "; " + std::to_string(n) + " Q/DQ layer" + (n == 1 ? "" : "s") + " no INT8 layer takes";
      }
      std::printf(
          "[kiln build] wrote %s: %.2f s in all (loading and building %.2f s, writing %.2f s); %zu layers%s; %d %s "
          "reference kernels%s\n",
          o->output.c_str(), seconds(t0, t2), seconds(t0, t1), seconds(t1, t2), engine->impl().layers.size(),
          in_bodies.c_str(), reference, reference == 1 ? "layer runs" : "layers run", qdq.c_str());
      exit_code = kExitOk;
    } catch (const Error& e) {
      exit_code = report_error(detail_status(e));
    }
  });
}

}  // namespace kiln::tools
