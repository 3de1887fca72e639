// Engines with the channel-blocked layout (layout_blocked pass + nchwc tactics) compute what an
// engine of reference kernels computes, at the build shape and at other batch sizes, and the pass
// switches off by name.
#include <gtest/gtest.h>

#include <cmath>

#include "../engine_util.h"
#include "../graph_builder.h"
#include "backends/registry.h"
#include "engine/engine_impl.h"
#include "engine/target.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "ops/interpreter.h"
#include "ops/kiln_layout.h"
#include "passes/pass.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::GraphBuilder;
using testing::random_tensor;
using testing::run_logits;

// Image conv (3 channels, 7x7 stride 2) -> maxpool -> a bottleneck with 3x3 convs of 32 channels
// (Winograd-shaped) and a residual -> a conv whose output is read twice, so its Add and Relu stay
// unfused (elementwise on blocked tensors) -> depthwise conv with 20 channels -> global average
// pool -> flatten -> gemm.
std::string blocked_cnn_onnx() {
  GraphBuilder b(13);
  b.input("x", {2, 3, 29, 31}).output("logits");
  b.init("w0", random_tensor({32, 3, 7, 7}, 1)).init("b0", random_tensor({32}, 2));
  b.init("w1", random_tensor({32, 32, 3, 3}, 3)).init("w2", random_tensor({32, 32, 3, 3}, 4));
  b.init("w3", random_tensor({20, 32, 1, 1}, 5)).init("wd", random_tensor({20, 1, 3, 3}, 6));
  b.init("fc", random_tensor({5, 20}, 7));
  b.conv({"x", "w0", "b0"}, "c0", 3, 2);
  b.node("Relu", {"c0"}, {"r0"});
  auto& mp = b.node("MaxPool", {"r0"}, {"p0"});
  GraphBuilder::set_ints(mp, "kernel_shape", {3, 3});
  GraphBuilder::set_ints(mp, "strides", {2, 2});
  GraphBuilder::set_ints(mp, "pads", {1, 1, 1, 1});
  b.conv({"p0", "w1"}, "c1", 1);
  b.node("Relu", {"c1"}, {"r1"});
  b.conv({"r1", "w2"}, "c2", 1);
  b.node("Add", {"c2", "p0"}, {"s2"});
  b.node("Relu", {"s2"}, {"r2"});
  b.conv({"r2", "w3"}, "c3");
  b.node("Add", {"c3", "c3"}, {"s3"});  // c3 read twice: Add and Relu stay separate nodes
  b.node("Relu", {"s3"}, {"r3"});
  b.conv({"r3", "wd"}, "d", 1, 1, 20);
  b.node("GlobalAveragePool", {"d"}, {"g"});
  b.node("Flatten", {"g"}, {"f"});
  b.gemm_t({"f", "fc"}, "logits");
  ir::Model m = b.finish();
  m.graph->inputs[0].type.shape.dims[0] = Dim::symbol("batch");  // dynamic batch
  return onnx_import::serialize_model(m).value();
}

BuilderConfig config(int64_t batch, std::vector<std::string> tactics = {}, std::vector<std::string> disabled = {}) {
  BuilderConfig cfg;
  Profile p;
  p.inputs["x"] = {{1, 3, 29, 31}, {batch, 3, 29, 31}, {4, 3, 29, 31}};
  cfg.profiles = {p};
  cfg.tactics = std::move(tactics);
  cfg.disabled_passes = std::move(disabled);
  return cfg;
}

TEST(BlockedEngine, MatchesReferenceKernelsAtSeveralBatches) {
  if (backends::all_tactics().empty() || engine::host_target().layout_block == 0)
    GTEST_SKIP() << "no oneDNN or no blocked layout on this machine";
  std::string onnx = blocked_cnn_onnx();
  auto fast = Builder(config(2)).build_from_memory(onnx);
  auto ref = Builder(config(2, {"reference"})).build_from_memory(onnx);
  auto plain = Builder(config(2, {}, {"layout_blocked"})).build_from_memory(onnx);
  std::map<std::string, int> kernels;
  for (const auto& l : fast->impl().layers) kernels[l.kernel]++;
  // Every conv runs a blocked tactic. Which one wins on the two 3x3 stride-1 layers is the tuner's
  // timing (Winograd usually, direct on a loaded machine): assert that Winograd was a candidate there.
  // Small layers may run direct on one thread.
  EXPECT_EQ(kernels["conv2d_onednn_nchwc_winograd"] + kernels["conv2d_winograd_f4x3_nchw16c"] +
                kernels["conv2d_onednn_nchwc"] + kernels["conv2d_onednn_nchwc_single_thread"] +
                kernels["conv2d_onednn_nchwc_kiln_act"],
            5);
  int winograd_timed = 0;
  for (const auto& l : fast->impl().layers) {
    bool w = false;
    for (const auto& c : l.candidates) w |= c.tactic.find("winograd") != std::string::npos;
    winograd_timed += w;
  }
  EXPECT_EQ(winograd_timed, 2);
  EXPECT_EQ(kernels["pool2d_onednn_nchwc"] + kernels["pool2d_onednn_nchwc_single_thread"], 2);
  int blocked_adds = 0;
  for (const auto& l : fast->impl().layers)
    blocked_adds +=
        (l.op_type == "Add" || l.op_type == "FusedElementwise") && l.inputs[0].find(".blocked") != std::string::npos;
  EXPECT_EQ(blocked_adds, 1);
  for (const auto& l : plain->impl().layers) EXPECT_NE(l.op_type, "BlockedConv");
  auto loaded = Engine::deserialize(fast->serialize());
  for (int64_t n : {1, 2, 4}) {
    Tensor x = random_tensor({n, 3, 29, 31}, 40 + static_cast<uint64_t>(n));
    auto want = run_logits(*ref, x);
    expect_close(run_logits(*fast, x), want);
    expect_close(run_logits(*loaded, x), want);
    expect_close(run_logits(*plain, x), want);
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// kiln.BlockedConvDw at mobilenet_v2's first expansion shapes, where oneDNN's fused 1x1 + depthwise
// kernel runs (the random cases of tactic_test.cc are too small for it: there oneDNN chains the two
// convolutions, as the tactic's own fallback does), against the reference kernel.
TEST(BlockedEngine, FusedConvDwKernelMatchesReference) {
  const backends::Tactic* t = backends::find_tactic("conv2d_onednn_nchwc_dw");
  if (!t) GTEST_SKIP() << "no oneDNN";
  struct Shape {
    int64_t c, m, h, stride;
  };
  for (Shape s : {Shape{16, 96, 112, 2}, Shape{24, 144, 112, 1}, Shape{32, 192, 56, 2}}) {
    ir::Node n;
    n.name = "dw_case";
    n.op_type = "BlockedConvDw";
    n.domain = "kiln";
    n.opset = 1;
    n.inputs = {"x", "w", "b", "wd", "bd"};
    n.outputs = {"y"};
    GraphBuilder::set_int(n, "block", 16);
    ir::Attribute clip;
    clip.type = ir::Attribute::Type::kString;
    clip.s = "Clip";
    n.attrs["activation"] = clip;
    n.attrs["dw.activation"] = clip;
    GraphBuilder::set_float(n, "activation_min", 0.f);
    GraphBuilder::set_float(n, "activation_max", 6.f);
    GraphBuilder::set_float(n, "dw.activation_min", 0.f);
    GraphBuilder::set_float(n, "dw.activation_max", 6.f);
    GraphBuilder::set_int(n, "dw.group", s.m);
    GraphBuilder::set_ints(n, "dw.strides", {s.stride, s.stride});
    GraphBuilder::set_ints(n, "dw.pads", {1, 1, 1, 1});
    std::vector<Tensor> in = {ops::to_channel_blocked(random_tensor({1, s.c, s.h, s.h}, 1), 16).value(),
                              random_tensor({s.m, s.c, 1, 1}, 2), random_tensor({s.m}, 3),
                              random_tensor({s.m, 1, 3, 3}, 4), random_tensor({s.m}, 5)};
    const ops::OpSchema* schema = ops::OpRegistry::get().find("kiln", "BlockedConvDw", 1);
    ASSERT_NE(schema, nullptr);
    std::vector<ops::Value> vals(in.begin(), in.end());
    std::vector<const ops::Value*> ptrs;
    for (const auto& v : vals) ptrs.push_back(&v);
    auto want = ops::run_node(n, *schema, ptrs, nullptr);
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    const Tensor& w = want.value()[0].tensor;
    backends::LayerSignature sig;
    sig.node = &n;
    for (size_t i = 0; i < in.size(); ++i) {
      backends::TensorSig ts;
      ts.present = true;
      ts.dtype = DataType::kFloat32;
      ts.shape = in[i].shape();
      if (i > 0) ts.constant = &in[i];
      sig.inputs.push_back(ts);
    }
    sig.outputs.resize(1);
    auto p = t->prepare(sig);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    ASSERT_EQ(p.value()->output_shapes()[0], w.shape());
    Tensor got(DataType::kFloat32, w.shape());
    std::vector<const Tensor*> ins;
    for (const auto& x : in) ins.push_back(&x);
    ASSERT_TRUE(p.value()->run_standalone(ins, {&got}).ok());
    int bad = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      float a = w.data<float>()[i], b = got.data<float>()[i];
      bad += !(std::fabs(a - b) <= 1e-4f * std::max(1.f, std::fabs(a)));
    }
    EXPECT_EQ(bad, 0) << "c" << s.c << " m" << s.m << " h" << s.h << " stride " << s.stride;
  }
}

}  // namespace
}  // namespace kiln
