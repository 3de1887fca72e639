// The build target: made from BuilderConfig and this machine (defaults, limits, clear errors), carried
// into every layer signature (device, instruction set, precision, dtypes), recorded in the engine file,
// and honoured by the kernel choice.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../graph_builder.h"
#include "backends/cpu/tactic_list.h"
#include "backends/device_runtime.h"
#include "backends/registry.h"
#include "engine/engine_impl.h"
#include "engine/tactics.h"
#include "engine/target.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"
#include "ops/shape_inference.h"

namespace kiln {
namespace {

using testing::GraphBuilder;
using testing::random_tensor;

ir::Model conv_model() {
  GraphBuilder b(13);
  b.input("x", {1, 16, 12, 12}).output("y");
  b.init("w1", random_tensor({16, 16, 3, 3}, 1)).init("w2", random_tensor({16, 16, 3, 3}, 2));
  b.conv({"x", "w1"}, "c1", 1);
  b.node("Relu", {"c1"}, {"r1"});
  b.conv({"r1", "w2"}, "y", 1);
  return b.finish();
}

TEST(Target, DefaultsToThisMachine) {
  auto t = engine::target_for(BuilderConfig{});
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t.value().device, Device{});
  EXPECT_EQ(t.value().isa, host_isa());
  EXPECT_EQ(t.value().layout_block, backends::cpu::preferred_layout_block(host_isa()));
  EXPECT_EQ(t.value().precision, DataType::kFloat32);
  EXPECT_EQ(engine::host_target(), t.value());
}

TEST(Target, OptionsCapTheInstructionSetAndSetTheBlockAndPrecision) {
  BuilderConfig cfg;
  cfg.isa = "portable";
  auto portable = engine::target_for(cfg);
  ASSERT_TRUE(portable.ok());
  EXPECT_EQ(portable.value().isa, kIsaPortable);
  EXPECT_EQ(portable.value().layout_block, 0);  // no vector width to block for
  if (host_isa() & kIsaAvx2) {
    cfg.isa = "avx2";
    auto avx2 = engine::target_for(cfg);
    ASSERT_TRUE(avx2.ok());
    EXPECT_EQ(avx2.value().isa, kIsaAvx2);
    EXPECT_EQ(avx2.value().layout_block, backends::cpu::preferred_layout_block(kIsaAvx2));
  }
  cfg.isa = "";
  cfg.layout_block = 0;
  EXPECT_EQ(engine::target_for(cfg).value().layout_block, 0);
  cfg.layout_block = -1;
  // Reduced precisions are resolved per layer (engine/precision.h): the default stays float32.
  cfg.precision = Precision::kBF16;
  EXPECT_EQ(engine::target_for(cfg).value().precision, DataType::kFloat32);
}

TEST(Target, BadOptionsAreClearErrors) {
  auto message = [](const BuilderConfig& cfg) {
    auto t = engine::target_for(cfg);
    EXPECT_FALSE(t.ok());
    return t.ok() ? std::string() : t.status().message();
  };
  BuilderConfig cfg;
  cfg.isa = "sse9";
  EXPECT_NE(message(cfg).find("unknown --isa 'sse9' (one of: native, portable, avx2, avx512"), std::string::npos);
  cfg.isa = "";
  cfg.layout_block = 7;
  EXPECT_NE(message(cfg).find("--layout-block 7"), std::string::npos);
  cfg.layout_block = -1;
  cfg.device = {DeviceKind::kCUDA, 0};
  if (const backends::DeviceRuntime* rt = backends::device_runtime(DeviceKind::kCUDA)) {
    // A CUDA build refuses only when the GPU is missing (its kernels are timed on it).
    if (std::string why = rt->why_unavailable(0); !why.empty()) {
      EXPECT_NE(message(cfg).find("device cuda:0: " + why), std::string::npos) << message(cfg);
    }
  } else {
    EXPECT_NE(message(cfg).find("device cuda:0: this kiln was built without the CUDA backend"), std::string::npos);
  }
  cfg.device = {DeviceKind::kCUDA, 99};
  EXPECT_NE(message(cfg).find("device cuda:99: "), std::string::npos) << message(cfg);
  cfg.device = {};
  cfg.tf32 = true;
  EXPECT_NE(message(cfg).find("--tf32 applies to CUDA builds"), std::string::npos) << message(cfg);
  cfg.tf32 = false;
  cfg.device = {};
  if (!(host_isa() & kIsaAmx)) {
    cfg.isa = "amx";
    std::string m = message(cfg);
    EXPECT_NE(m.find("--isa amx asks for"), std::string::npos) << m;
    EXPECT_NE(m.find("which this machine lacks"), std::string::npos) << m;
  }
}

TEST(Target, SignaturesCarryTheTargetsDeviceInstructionSetPrecisionAndDtypes) {
  ir::Model m = conv_model();
  ASSERT_TRUE(ops::infer_shapes(*m.graph).ok());
  Target t;
  t.isa = kIsaAvx2;
  t.precision = DataType::kFloat16;
  const ir::Node& conv = m.graph->nodes.front();
  backends::LayerSignature sig = engine::signature_of(*m.graph, conv, t);
  EXPECT_EQ(sig.device, Device{});
  EXPECT_EQ(sig.isa, kIsaAvx2);
  EXPECT_EQ(sig.compute, DataType::kFloat16);
  ASSERT_EQ(sig.inputs.size(), 2u);
  EXPECT_EQ(sig.inputs[0].dtype, DataType::kFloat32);
  EXPECT_EQ(sig.inputs[0].shape, (Dims{1, 16, 12, 12}));
  ASSERT_EQ(sig.outputs.size(), 1u);
  EXPECT_TRUE(sig.outputs[0].present);
  EXPECT_EQ(sig.outputs[0].dtype, DataType::kFloat32);
  EXPECT_EQ(sig.outputs[0].shape, (Dims{1, 16, 12, 12}));
  // An FP16 layer: every FP32 tactic declines it, saying so.
  engine::Candidates c = engine::candidates_for(sig, engine::tactic_filter({}));
  EXPECT_TRUE(c.allowed.empty());
  for (const auto& d : c.declined)
    EXPECT_EQ(d.reason, "computes in float32; the layer computes in float16") << d.tactic;
}

TEST(Target, EngineRecordsItsTargetAndItsKernelsFitIt) {
  BuilderConfig cfg;
  cfg.isa = "portable";
  cfg.layout_block = 0;
  auto e = Builder(cfg).build_from_memory(onnx_import::serialize_model(conv_model()).value());
  const Target& t = e->impl().built_for;
  EXPECT_EQ(t.isa, kIsaPortable);
  EXPECT_EQ(t.layout_block, 0);
  for (const auto& l : e->impl().layers) {
    if (const backends::Tactic* tactic = backends::find_tactic(l.kernel)) {
      EXPECT_EQ(tactic->info().isa, kIsaPortable) << l.name << " runs " << l.kernel;
    }
  }
  EXPECT_TRUE(e->impl().required_isa.empty());
  auto j = nlohmann::json::parse(e->inspect_json());
  EXPECT_EQ(j["built_for"]["isa"], nlohmann::json::array());
  EXPECT_EQ(j["built_for"]["layout_block"], 0);
  EXPECT_EQ(j["built_for"]["device"], "cpu");
  EXPECT_EQ(j["build"]["config"]["isa"], "portable");
  auto loaded = Engine::deserialize(e->serialize());
  EXPECT_EQ(loaded->impl().built_for, t);

  if ((host_isa() & kIsaAvx512) && backends::find_tactic("conv2d_onednn_nchwc_winograd")) {
    // Native on AVX-512: the target keeps AVX-512, and loading keeps it too.
    auto native = Builder().build_from_memory(onnx_import::serialize_model(conv_model()).value());
    EXPECT_TRUE(native->impl().built_for.isa & kIsaAvx512);
    EXPECT_EQ(native->impl().built_for.layout_block, 16);
    EXPECT_EQ(Engine::deserialize(native->serialize())->impl().built_for, native->impl().built_for);
  }
}

}  // namespace
}  // namespace kiln
