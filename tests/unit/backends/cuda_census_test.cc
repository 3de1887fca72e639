// A census of the layers of real models that would run on the host in a cuda:0 engine, without a GPU:
// each model is optimized for a cuda:0 target (the builder's passes), inferred at the given shapes,
// and every layer's signature is offered to the CUDA tactics (why_unsupported only: nothing runs).
// A layer no tactic accepts, and that is not shape work, is listed with each tactic's reason. It is a
// development tool over model files that are not in the repository: KILN_CUDA_CENSUS names a file of
// lines "MODEL.onnx NAME:DIMS,NAME:DIMS"; skipped without it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "backends/registry.h"
#include "engine/engine_impl.h"
#include "engine/tactics.h"
#include "onnx/importer.h"
#include "passes/pass.h"

namespace kiln {
namespace {

std::map<std::string, Dims> parse_shapes(const std::string& s) {
  std::map<std::string, Dims> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    size_t colon = item.rfind(':');
    Dims d;
    std::stringstream dims(item.substr(colon + 1));
    for (std::string x; std::getline(dims, x, 'x');) d.push_back(std::stoll(x));
    out[item.substr(0, colon)] = d;
  }
  return out;
}

TEST(CudaCensus, HostFallbackLayersOfModels) {
  const char* list = std::getenv("KILN_CUDA_CENSUS");
  if (!list) GTEST_SKIP() << "KILN_CUDA_CENSUS names no model list";
  if (!backends::device_runtime(DeviceKind::kCUDA)) GTEST_SKIP() << "built without the CUDA backend";
  std::ifstream f(list);
  ASSERT_TRUE(f) << list;
  Target target;
  target.device = {DeviceKind::kCUDA, 0};
  for (std::string line; std::getline(f, line);) {
    std::stringstream ls(line);
    std::string path, shapes;
    ls >> path >> shapes;
    if (path.empty()) continue;
    auto model = onnx_import::load_model(path);
    if (!model.ok()) {
      std::printf("=== %s: load: %s\n", path.c_str(), model.status().message().c_str());
      continue;
    }
    auto stats = passes::optimize(model.value(), {}, target);
    if (!stats.ok()) {
      std::printf("=== %s: passes: %s\n", path.c_str(), stats.status().message().c_str());
      continue;
    }
    auto typed = detail::infer_at(*model.value().graph, parse_shapes(shapes));
    if (!typed.ok()) {
      std::printf("=== %s: infer: %s\n", path.c_str(), typed.status().message().c_str());
      continue;
    }
    const ir::Graph& g = *typed.value();
    std::map<std::string, int> host, shape_work;
    std::map<std::string, std::string> why;
    for (const ir::Node& n : g.nodes) {
      backends::LayerSignature sig = engine::signature_of(g, n, target);
      engine::Candidates c = engine::candidates_for(sig, {});
      if (!c.allowed.empty()) continue;
      std::string op = (n.domain.empty() ? "" : n.domain + ".") + n.op_type;
      if (engine::is_shape_work(g, n)) {
        ++shape_work[op];
        continue;
      }
      ++host[op];
      std::string r;
      for (const auto& d : c.declined) r += " [" + d.tactic + ": " + d.reason + "]";
      if (r.empty()) r = " [no CUDA tactic]";
      std::string in;
      for (const auto& t : sig.inputs) in += " " + std::string(dtype_name(t.dtype)) + dims_str(t.shape);
      if (!why.count(op)) why[op] = n.name + in + r;
    }
    int total = 0;
    for (const auto& [op, k] : host) total += k;
    std::printf("=== %s: %zu layers, %d on the host\n", path.c_str(), g.nodes.size(), total);
    for (const auto& [op, k] : host) std::printf("  host %s x%d: e.g. %s\n", op.c_str(), k, why[op].c_str());
    std::string sw;
    for (const auto& [op, k] : shape_work) sw += " " + op + " x" + std::to_string(k);
    if (!sw.empty()) std::printf("  shape work:%s\n", sw.c_str());
  }
}

}  // namespace
}  // namespace kiln
