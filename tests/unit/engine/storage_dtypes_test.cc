// engine/storage_dtypes.h on graphs the CUDA tactics take: which values become float16/bfloat16, where
// the Casts go, constants converted, engine inputs and outputs kept float32, --layer-precisions
// honoured; the rewritten graph runs in the reference interpreter and gives the original's outputs
// within the dtype's rounding. Needs the CUDA backend compiled in (its tactics' why_unsupported), not a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "../graph_builder.h"
#include "backends/device_runtime.h"
#include "engine/engine_impl.h"
#include "engine/storage_dtypes.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"

namespace kiln {
namespace {

using testing::GraphBuilder;
using testing::random_tensor;

// x [3, 29] -> MatMul w1 -> Add b1 -> Relu -> Cos (no CUDA kernel) -> LayerNorm -> Softmax -> MatMul w2 -> y;
// the Relu's output is also an engine output.
ir::Model mlp() {
  GraphBuilder b(17);
  b.input("x", {3, 29}).output("y").output("r");
  b.init("w1", random_tensor({29, 31}, 1, DataType::kFloat32, -0.3, 0.3)).init("b1", random_tensor({31}, 2));
  b.init("g", random_tensor({31}, 3)).init("be", random_tensor({31}, 4));
  b.init("w2", random_tensor({31, 7}, 5, DataType::kFloat32, -0.3, 0.3));
  b.node("MatMul", {"x", "w1"}, {"h"}).name = "mm1";
  b.node("Add", {"h", "b1"}, {"hb"}).name = "add";
  b.node("Relu", {"hb"}, {"r"}).name = "relu";
  b.node("Cos", {"r"}, {"c"}).name = "cos";
  GraphBuilder::set_int(b.node("LayerNormalization", {"c", "g", "be"}, {"ln"}), "axis", -1);
  GraphBuilder::set_int(b.node("Softmax", {"ln"}, {"s"}), "axis", -1);
  b.node("MatMul", {"s", "w2"}, {"y"}).name = "mm2";
  return b.finish();
}

struct Rewritten {
  ir::Model model;
  engine::StorageDtypeStats stats;
};

Rewritten rewrite(DataType reduced, std::vector<engine::PrecisionPolicy::Rule> rules = {}) {
  Rewritten r{mlp(), {}};
  r.model.graph = ir::deep_copy(*r.model.graph);
  Target t;
  t.device = {DeviceKind::kCUDA, 0};
  engine::PrecisionPolicy p;
  p.allowed = {DataType::kFloat32, reduced};
  p.rules = std::move(rules);
  auto typed = detail::infer_at(*r.model.graph, {});
  EXPECT_TRUE(typed.ok()) << typed.status().to_string();
  auto st = engine::assign_storage_dtypes(*r.model.graph, *typed.value(), t, p);
  EXPECT_TRUE(st.ok()) << st.status().to_string();
  r.stats = st.value();
  EXPECT_TRUE(ops::infer_shapes(*r.model.graph).ok());
  return r;
}

DataType dtype_of(const ir::Graph& g, const std::string& v) {
  auto it = g.value_types.find(v);
  return it == g.value_types.end() ? DataType::kUndefined : it->second.elem;
}

const ir::Node* producer(const ir::Graph& g, const std::string& v) {
  for (const auto& n : g.nodes)
    for (const auto& o : n.outputs)
      if (o == v) return &n;
  return nullptr;
}

bool have_cuda_tactics() { return backends::device_runtime(DeviceKind::kCUDA) != nullptr; }

TEST(StorageDtypes, ReducedRegionsBetweenCasts) {
  if (!have_cuda_tactics()) GTEST_SKIP() << "built without the CUDA backend";
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    Rewritten r = rewrite(dt);
    const ir::Graph& g = *r.model.graph;
    EXPECT_EQ(r.stats.reduced, dt);
    // mm1, add, relu, layer norm, softmax, mm2: six layers; Cos stays float32.
    EXPECT_EQ(r.stats.reduced_layers, 6);
    // Casts: x in; relu's output back to float32 for the engine output "r" (which Cos reads as it is);
    // Cos -> LayerNorm; mm2's output back to "y".
    EXPECT_EQ(r.stats.casts, 4);
    // Cos has no CUDA kernel at all (a host layer, reported by the builder), so it is not a computing
    // layer that the reduced precision missed.
    EXPECT_TRUE(r.stats.float32_ops.empty());
    EXPECT_EQ(dtype_of(g, "h"), dt);
    EXPECT_EQ(dtype_of(g, "s"), dt);
    EXPECT_EQ(dtype_of(g, "c"), DataType::kFloat32);
    // Engine inputs and outputs keep their dtypes; "r" and "y" come from Casts.
    EXPECT_EQ(g.inputs[0].type.elem, DataType::kFloat32);
    for (const char* out : {"y", "r"}) {
      const ir::Node* p = producer(g, out);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(p->op_type, "Cast") << out;
      EXPECT_EQ(dtype_of(g, out), DataType::kFloat32) << out;
    }
    // Weights are converted copies; the float32 originals are gone.
    const ir::Node* mm1 = nullptr;
    for (const auto& n : g.nodes) mm1 = n.name == "mm1" ? &n : mm1;
    ASSERT_NE(mm1, nullptr);
    ASSERT_TRUE(g.initializers.count(mm1->inputs[1]));
    EXPECT_EQ(g.initializers.at(mm1->inputs[1]).dtype(), dt);
    EXPECT_FALSE(g.initializers.count("w1"));
    // The graph computes what the original does, within the dtype's rounding: inputs of |x| <= 1, a few
    // roundings of relative size u per value along the chain.
    const double u = dt == DataType::kFloat16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    ir::Model orig = mlp();
    auto in = testing::random_inputs(*orig.graph, 7);
    auto want = testing::run(orig, in);
    auto got = testing::run(r.model, in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t o = 0; o < want.size(); ++o) {
      ASSERT_EQ(got[o].tensor.dtype(), DataType::kFloat32);
      for (int64_t i = 0; i < want[o].tensor.numel(); ++i)
        EXPECT_NEAR(got[o].tensor.get_f64(i), want[o].tensor.get_f64(i), 64 * u) << "output " << o << " element " << i;
    }
  }
}

// The engine file stores the rewritten graph as ONNX: its float16/bfloat16 constants and Casts come back
// bit for bit.
TEST(StorageDtypes, TheRewrittenGraphSurvivesSerialization) {
  if (!have_cuda_tactics()) GTEST_SKIP() << "built without the CUDA backend";
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    Rewritten r = rewrite(dt);
    auto bytes = onnx_import::serialize_model(r.model);
    ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
    auto back = onnx_import::parse_model(bytes.value(), "");
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    const ir::Graph& a = *r.model.graph;
    const ir::Graph& b = *back.value().graph;
    ASSERT_EQ(a.initializers.size(), b.initializers.size());
    for (const auto& [name, t] : a.initializers) {
      ASSERT_TRUE(b.initializers.count(name)) << name;
      const Tensor& u = b.initializers.at(name);
      ASSERT_EQ(u.dtype(), t.dtype()) << name;
      ASSERT_EQ(u.nbytes(), t.nbytes()) << name;
      EXPECT_EQ(std::memcmp(u.raw(), t.raw(), t.nbytes()), 0) << name;
    }
    // Layer for layer in the same order: an engine stores its kernels by layer index.
    ASSERT_EQ(a.nodes.size(), b.nodes.size());
    for (size_t i = 0; i < a.nodes.size(); ++i) {
      EXPECT_EQ(b.nodes[i].name, a.nodes[i].name) << "layer " << i;
      if (a.nodes[i].op_type == "Cast") EXPECT_EQ(b.nodes[i].attr_int("to", 0), a.nodes[i].attr_int("to", 0));
    }
  }
}

TEST(StorageDtypes, LayerPrecisionKeepsALayerInFloat32) {
  if (!have_cuda_tactics()) GTEST_SKIP() << "built without the CUDA backend";
  Rewritten r = rewrite(DataType::kFloat16, {{"mm2", DataType::kFloat32}});
  const ir::Graph& g = *r.model.graph;
  EXPECT_EQ(r.stats.reduced_layers, 5);
  const ir::Node* mm2 = producer(g, "y");
  ASSERT_NE(mm2, nullptr);
  EXPECT_EQ(mm2->op_type, "MatMul");  // float32 already: no Cast after it
  EXPECT_EQ(dtype_of(g, mm2->inputs[0]), DataType::kFloat32);
  EXPECT_EQ(g.initializers.at(mm2->inputs[1]).dtype(), DataType::kFloat32);
  // ... and a bfloat16 layer in an FP16 build: its own dtype, Casts around it.
  Rewritten b = rewrite(DataType::kFloat16, {{"relu", DataType::kBFloat16}});
  EXPECT_EQ(dtype_of(*b.model.graph, "r::bf16"), DataType::kBFloat16);
}

// A CNN (Conv -> Relu -> MaxPool -> GlobalAveragePool -> Flatten -> Gemm): cuDNN's convolution and the
// pooling kernels compute in whichever float precision the layer has (TacticInfo::any_float_compute),
// so under --fp16 / --bf16 they are reduced layers, not data movement that follows the float32 image
// (which kept every convolution of resnet50 in float32 under --fp16).
TEST(StorageDtypes, ConvolutionsAndPoolsTakeTheReducedPrecision) {
  if (!have_cuda_tactics()) GTEST_SKIP() << "built without the CUDA backend";
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    GraphBuilder b(17);
    b.input("x", {2, 3, 17, 17}).output("y");
    b.init("w", random_tensor({8, 3, 3, 3}, 1, DataType::kFloat32, -0.3, 0.3)).init("cb", random_tensor({8}, 2));
    b.init("gw", random_tensor({5, 8}, 3, DataType::kFloat32, -0.3, 0.3)).init("gb", random_tensor({5}, 4));
    b.conv({"x", "w", "cb"}, "c", 1).name = "conv";
    b.node("Relu", {"c"}, {"r"}).name = "relu";
    ir::Node& mp = b.node("MaxPool", {"r"}, {"p"});
    mp.name = "pool";
    GraphBuilder::set_ints(mp, "kernel_shape", {3, 3});
    GraphBuilder::set_ints(mp, "strides", {2, 2});
    b.node("GlobalAveragePool", {"p"}, {"g"}).name = "gap";
    b.node("Flatten", {"g"}, {"f"}).name = "flatten";
    b.gemm_t({"f", "gw", "gb"}, "y").name = "fc";
    ir::Model m = b.finish();
    Target t;
    t.device = {DeviceKind::kCUDA, 0};
    engine::PrecisionPolicy p;
    p.allowed = {DataType::kFloat32, dt};
    auto typed = detail::infer_at(*m.graph, {});
    ASSERT_TRUE(typed.ok()) << typed.status().to_string();
    auto st = engine::assign_storage_dtypes(*m.graph, *typed.value(), t, p);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    ASSERT_TRUE(ops::infer_shapes(*m.graph).ok());
    const ir::Graph& g = *m.graph;
    for (const char* v : {"c", "r", "p", "g", "f"}) EXPECT_EQ(dtype_of(g, v), dt) << v;
    const ir::Node* conv = producer(g, "c");
    ASSERT_NE(conv, nullptr);
    EXPECT_EQ(dtype_of(g, conv->inputs[0]), dt);  // the image through a Cast
    EXPECT_EQ(g.initializers.at(conv->inputs[1]).dtype(), dt);
    // conv, relu, pool, gap, flatten (a view: follows), fc; a Cast in, a Cast out.
    EXPECT_GE(st.value().reduced_layers, 5);
    EXPECT_EQ(st.value().casts, 2);
    EXPECT_TRUE(st.value().float32_ops.empty()) << st.value().float32_example;
  }
}

// A computing layer no reduced-precision kernel takes stays float32 and is recorded with a reason (the
// builder prints it as a warning: a --fp16 build that silently computed in float32 looked fine before).
TEST(StorageDtypes, ComputingLayersLeftInFloat32AreRecorded) {
  if (!have_cuda_tactics()) GTEST_SKIP() << "built without the CUDA backend";
  GraphBuilder b(17);
  b.input("x", {1, 4, 9, 9}).input("bias", {6}).output("y");
  b.init("w", random_tensor({6, 4, 3, 3}, 1, DataType::kFloat32, -0.3, 0.3));
  b.conv({"x", "w", "bias"}, "c").name = "conv_runtime_bias";  // B is not a constant: cuDNN's tactic declines
  b.node("Relu", {"c"}, {"y"}).name = "relu";
  ir::Model m = b.finish();
  Target t;
  t.device = {DeviceKind::kCUDA, 0};
  engine::PrecisionPolicy p;
  p.allowed = {DataType::kFloat32, DataType::kFloat16};
  auto typed = detail::infer_at(*m.graph, {});
  ASSERT_TRUE(typed.ok()) << typed.status().to_string();
  auto st = engine::assign_storage_dtypes(*m.graph, *typed.value(), t, p);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  ASSERT_EQ(st.value().float32_ops.size(), 1u);
  EXPECT_EQ(st.value().float32_ops.at("Conv"), 1);
  EXPECT_NE(st.value().float32_example.find("conv_runtime_bias"), std::string::npos) << st.value().float32_example;
  EXPECT_NE(st.value().float32_example.find("B is not a float constant"), std::string::npos)
      << st.value().float32_example;
  EXPECT_EQ(dtype_of(*m.graph, "c"), DataType::kFloat32);
}

TEST(StorageDtypes, CpuTargetsAndFp32BuildsAreLeftAlone) {
  ir::Model m = mlp();
  Target cpu;
  engine::PrecisionPolicy p;
  p.allowed = {DataType::kFloat32, DataType::kBFloat16};
  auto typed = detail::infer_at(*m.graph, {});
  ASSERT_TRUE(typed.ok());
  size_t nodes = m.graph->nodes.size();
  auto st = engine::assign_storage_dtypes(*m.graph, *typed.value(), cpu, p);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st.value().reduced, DataType::kUndefined);
  EXPECT_EQ(m.graph->nodes.size(), nodes);
  Target gpu;
  gpu.device = {DeviceKind::kCUDA, 0};
  p.allowed = {DataType::kFloat32};
  st = engine::assign_storage_dtypes(*m.graph, *typed.value(), gpu, p);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st.value().reduced, DataType::kUndefined);
  EXPECT_EQ(m.graph->nodes.size(), nodes);
}

}  // namespace
}  // namespace kiln
