// Control flow inside the engine: a top-level If/Loop/Scan keeps the other layers on their tactics
// and memory plan, bodies run their own tactics, bodies read outer-scope values that the executor and
// the memory planner must keep alive, and every output matches the reference interpreter.
#include <gtest/gtest.h>

#include "ir/attribute_builders.h"

#include <cmath>

#include "../graph_builder.h"
#include "backends/registry.h"
#include "engine/engine_impl.h"
#include "engine/executor.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"

namespace kiln {
namespace {

using testing::GraphBuilder;
using testing::random_tensor;

ir::Node make_node(const std::string& name, const std::string& op, std::vector<std::string> in,
                   std::vector<std::string> out) {
  ir::Node n;
  n.name = name;
  n.op_type = op;
  n.opset = 13;
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

std::shared_ptr<ir::Graph> body(const std::string& name, std::vector<ir::Node> nodes, std::vector<std::string> outs,
                                std::vector<ir::ValueInfo> ins = {}) {
  auto g = std::make_shared<ir::Graph>();
  g->name = name;
  g->nodes = std::move(nodes);
  g->inputs = std::move(ins);
  for (auto& o : outs) g->outputs.push_back({o, ir::TypeInfo()});
  return g;
}

void pads1(ir::Node& n) { GraphBuilder::set_ints(n, "pads", {1, 1, 1, 1}); }

// x -> conv -> relu -> conv "a" (read only inside the If's bodies), then layers of a's size that
// would take a's arena slot if the body's read were not counted, then
//   If(c1): then  = conv(a, w4) + d                        (a tactic inside the body)
//           else  = If(c2) [then: relu(a * c) + a   (reads `a` two scopes up)
//                           else: -d]
//   If(c1): then  = a itself (an outer value as the branch output), else flatten(c): its output has
//           no static shape, so it is not planned and would alias a's slot
// then layers after the Ifs (reusing the freed slots) and a Gemm.
ir::Model if_model() {
  GraphBuilder b(13);
  b.input("x", {2, 5, 13, 11}).input("c1", {}, DataType::kBool).input("c2", {}, DataType::kBool);
  b.output("logits").output("passed");
  // Weights scaled by about 1/sqrt(fan-in), so activations stay near 1 through the chain of convs.
  const auto w = [](Dims d, uint64_t seed, double scale) {
    return random_tensor(std::move(d), seed, DataType::kFloat32, -scale, scale);
  };
  b.init("w1", w({12, 5, 3, 3}, 1, 0.3)).init("b1", random_tensor({12}, 2));
  b.init("w2", w({12, 12, 3, 3}, 3, 0.2)).init("w3", w({12, 12, 3, 3}, 4, 0.2));
  b.init("w4", w({12, 12, 3, 3}, 5, 0.2)).init("w5", w({12, 48, 1, 1}, 8, 0.15));
  b.init("fc", w({7, 12 * 13 * 11}, 6, 0.05)).init("fcb", random_tensor({7}, 7));
  b.conv({"x", "w1", "b1"}, "h", 1);
  b.node("Relu", {"h"}, {"r1"});
  b.conv({"r1", "w2"}, "a", 1);
  b.node("Sigmoid", {"r1"}, {"s"});
  b.node("Add", {"s", "r1"}, {"c"});
  b.conv({"c", "w3"}, "d", 1);

  ir::Node conv_in_body = make_node("then_conv", "Conv", {"a", "w4"}, {"t1"});
  pads1(conv_in_body);
  auto then_g = body("then", {conv_in_body, make_node("then_add", "Add", {"t1", "d"}, {"t2"})}, {"t2"});
  auto inner_then = body("inner_then",
                         {make_node("in_mul", "Mul", {"a", "c"}, {"m"}), make_node("in_relu", "Relu", {"m"}, {"mr"}),
                          make_node("in_add", "Add", {"mr", "a"}, {"ia"})},
                         {"ia"});
  auto inner_else = body("inner_else", {make_node("in_neg", "Neg", {"d"}, {"nd"})}, {"nd"});
  ir::Node inner_if = make_node("inner_if", "If", {"c2"}, {"e"});
  inner_if.attrs["then_branch"] = ir::attr_graph(inner_then);
  inner_if.attrs["else_branch"] = ir::attr_graph(inner_else);
  auto else_g = body("else", {inner_if}, {"e"});
  ir::Node& top_if = b.node("If", {"c1"}, {"y"});
  top_if.attrs["then_branch"] = ir::attr_graph(then_g);
  top_if.attrs["else_branch"] = ir::attr_graph(else_g);

  ir::Node& pass_if = b.node("If", {"c1"}, {"passed"});
  pass_if.attrs["then_branch"] = ir::attr_graph(body("pass_then", {}, {"a"}));
  pass_if.attrs["else_branch"] =
      ir::attr_graph(body("pass_else", {make_node("fl", "Flatten", {"c"}, {"fc_"})}, {"fc_"}));

  // After the Ifs: new values of a's size, written into freed slots.
  b.conv({"y", "w3"}, "z1", 1);
  b.conv({"z1", "w2"}, "z2", 1);
  ir::Node& cat = b.node("Concat", {"z1", "z2", "y", "z1"}, {"cat"});  // large: lands in a's slot
  GraphBuilder::set_int(cat, "axis", 1);
  b.conv({"cat", "w5"}, "z3");
  b.node("Sigmoid", {"z3"}, {"sy"});
  b.node("Mul", {"sy", "z1"}, {"my"});
  b.node("Flatten", {"my"}, {"flat"});
  b.gemm_t({"flat", "fc", "fcb"}, "logits");
  ir::Model m = b.finish();
  for (auto& n : m.graph->nodes)
    for (auto& [k, a] : n.attrs)
      if (a.g) {
        a.g->parent = m.graph.get();
        for (auto& bn : a.g->nodes)
          for (auto& [k2, a2] : bn.attrs)
            if (a2.g) a2.g->parent = a.g.get();
      }
  return m;
}

std::map<std::string, ops::Value> inputs_with(bool c1, bool c2, uint64_t seed) {
  return {{"x", ops::Value(random_tensor({2, 5, 13, 11}, seed))},
          {"c1", ops::Value(Tensor::scalar<bool>(DataType::kBool, c1))},
          {"c2", ops::Value(Tensor::scalar<bool>(DataType::kBool, c2))}};
}

void expect_same(const std::vector<ops::Value>& got, const std::vector<ops::Value>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const Tensor& g = got[i].tensor;
    const Tensor& w = want[i].tensor;
    ASSERT_EQ(g.shape(), w.shape()) << what << " output " << i;
    for (int64_t k = 0; k < w.numel(); ++k)
      ASSERT_NEAR(g.get_f64(k), w.get_f64(k), 1e-4 * std::max(1.0, std::fabs(w.get_f64(k))))
          << what << " output " << i << " element " << k;
  }
}

// Runs a fresh ExecutionContext (the memory-planned path) on `in`.
std::vector<ops::Value> run_context(const Engine& e, const std::map<std::string, ops::Value>& in) {
  auto ctx = e.create_context();
  for (const auto& [name, v] : in)
    ctx->set_input(name, HostTensor::borrow(static_cast<DataTypeCode>(v.tensor.dtype()), v.tensor.shape(),
                                            v.tensor.raw(), v.tensor.nbytes()));
  ctx->run();
  std::vector<ops::Value> out;
  for (const auto& name : ctx->output_names()) {
    HostTensor h = ctx->output(name);
    Tensor t(static_cast<DataType>(h.dtype), h.shape);
    if (h.nbytes) std::memcpy(t.raw(), h.data.get(), h.nbytes);
    out.push_back(ops::Value(std::move(t)));
  }
  return out;
}

int count_body_tactics(const ir::Graph& g) {
  int n = 0;
  for (const auto& node : g.nodes)
    for (const auto& [k, a] : node.attrs)
      if (a.g) {
        for (const auto& bn : a.g->nodes) n += bn.attr_string(engine::kBodyKernelAttr, "reference") != "reference";
        n += count_body_tactics(*a.g);
      }
  return n;
}

TEST(EngineControlFlow, TopLevelIfKeepsTacticsAndBodiesReadOuterValues) {
  if (backends::all_tactics().empty()) GTEST_SKIP() << "built without oneDNN: no tactics";
  ir::Model m = if_model();
  std::string onnx = onnx_import::serialize_model(m).value();
  auto e = Builder().build_from_memory(onnx);
  auto loaded = Engine::deserialize(e->serialize());

  // The layers around the Ifs run tactics (not the whole graph through reference kernels).
  int convs = 0, gemms = 0;
  for (const auto& l : e->impl().layers) {
    bool conv = l.op_type.find("Conv") != std::string::npos, gemm = l.op_type.find("Gemm") != std::string::npos;
    if (conv || gemm) {
      EXPECT_NE(l.kernel, "reference") << l.name << " (" << l.op_type << ")";
    }
    convs += conv, gemms += gemm;
  }
  EXPECT_EQ(convs, 6);
  EXPECT_EQ(gemms, 1);
  // The Conv inside the then-branch has its tactic, recorded on the body node and kept by the file.
  EXPECT_GE(count_body_tactics(*e->impl().model.graph), 1);
  EXPECT_EQ(count_body_tactics(*loaded->impl().model.graph), count_body_tactics(*e->impl().model.graph));
  // The arena holds `a` while the bodies read it: it cannot share bytes with c, d (alive with it).
  const auto& plan = e->impl().plan;
  ASSERT_TRUE(plan.offsets.count("a"));

  for (bool c1 : {true, false})
    for (bool c2 : {true, false})
      for (uint64_t seed : {11u, 12u}) {
        auto in = inputs_with(c1, c2, seed);
        auto want = testing::run(m, in);
        std::string what = std::string("c1=") + (c1 ? "1" : "0") + " c2=" + (c2 ? "1" : "0");
        expect_same(run_context(*e, in), want, what + " built");
        expect_same(run_context(*loaded, in), want, what + " loaded");
      }
}

TEST(EngineControlFlow, ExecutorRunsTacticsAroundAndInsideControlFlow) {
  if (backends::all_tactics().empty()) GTEST_SKIP() << "built without oneDNN: no tactics";
  ir::Model m = if_model();
  auto e = Builder().build_from_memory(onnx_import::serialize_model(m).value());
  const auto& impl = e->impl();
  size_t top_tactics = 0;
  for (const auto& l : impl.layers) top_tactics += l.kernel != "reference";
  ASSERT_GE(top_tactics, 4u);
  // The then-branch of the first If holds a Conv (and an Add) with tactics: they run too.
  size_t then_tactics = 0;
  for (const auto& n : impl.model.graph->nodes)
    if (n.op_type == "If" && n.outputs[0] == "y")
      for (const auto& bn : n.attr("then_branch")->g->nodes)
        then_tactics += bn.attr_string(engine::kBodyKernelAttr, "reference") != "reference";
  ASSERT_GE(then_tactics, 1u);
  engine::LayerExecutor then_run(impl.model.graph, impl.tactic_runtime());
  auto r = then_run.run(inputs_with(true, true, 3));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(then_run.tactic_runs(), top_tactics + then_tactics);
  expect_same(r.value(), testing::run(m, inputs_with(true, true, 3)), "executor, then");
  engine::LayerExecutor else_run(impl.model.graph, impl.tactic_runtime());
  r = else_run.run(inputs_with(false, true, 3));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_GE(else_run.tactic_runs(), top_tactics);
  expect_same(r.value(), testing::run(m, inputs_with(false, true, 3)), "executor, else");
}

// Loop (3 trips) whose body multiplies its carried state by an outer weight (a MatMul with a tactic)
// and adds an outer activation `a` that nothing after the Loop reads; a Scan over the rows of `a`
// accumulating with outer `bias`.
ir::Model loop_model() {
  GraphBuilder b(13);
  b.input("x", {5, 16}).output("out").output("scan_sum").output("scan_rows");
  b.init("w", random_tensor({16, 16}, 21)).init("wb", random_tensor({16, 16}, 22));
  b.init("bias", random_tensor({16}, 23));
  b.init("trips", Tensor::scalar<int64_t>(DataType::kInt64, 3));
  b.node("MatMul", {"x", "w"}, {"a"});
  b.node("Relu", {"a"}, {"ra"});
  b.node("Tanh", {"ra"}, {"ta"});
  b.node("Sigmoid", {"x"}, {"sx"});
  auto i64 = ir::TypeInfo::tensor(DataType::kInt64, SymShape(std::vector<Dim>{}));
  auto bl = ir::TypeInfo::tensor(DataType::kBool, SymShape(std::vector<Dim>{}));
  auto f = ir::TypeInfo::tensor(DataType::kFloat32, SymShape::from_dims({5, 16}));
  auto loop_body =
      body("loop_body",
           {make_node("lb_mm", "MatMul", {"st", "wb"}, {"mm"}), make_node("lb_add", "Add", {"mm", "a"}, {"s1"}),
            make_node("lb_tanh", "Tanh", {"s1"}, {"s2"}), make_node("lb_id", "Identity", {"cond"}, {"co"})},
           {"co", "s2"}, {{"iter", i64}, {"cond", bl}, {"st", f}});
  ir::Node& loop = b.node("Loop", {"trips", "", "ta"}, {"out"});
  loop.attrs["body"] = ir::attr_graph(loop_body);
  auto row = ir::TypeInfo::tensor(DataType::kFloat32, SymShape::from_dims({16}));
  auto scan_body = body(
      "scan_body",
      {make_node("sb_add", "Add", {"acc", "row"}, {"acc2"}), make_node("sb_mul", "Mul", {"acc2", "bias"}, {"acc3"}),
       make_node("sb_out", "Add", {"acc3", "row"}, {"rowo"})},
      {"acc3", "rowo"}, {{"acc", row}, {"row", row}});
  b.init("zero", Tensor(DataType::kFloat32, {16}));
  ir::Node& scan = b.node("Scan", {"zero", "sx"}, {"scan_sum", "scan_rows"});
  scan.attrs["body"] = ir::attr_graph(scan_body);
  GraphBuilder::set_int(scan, "num_scan_inputs", 1);
  ir::Model m = b.finish();
  for (auto& n : m.graph->nodes)
    for (auto& [k, a] : n.attrs)
      if (a.g) a.g->parent = m.graph.get();
  return m;
}

TEST(EngineControlFlow, LoopAndScanBodiesMatchTheInterpreter) {
  if (backends::all_tactics().empty()) GTEST_SKIP() << "built without oneDNN: no tactics";
  ir::Model m = loop_model();
  auto e = Builder().build_from_memory(onnx_import::serialize_model(m).value());
  int top_tactics = 0;
  for (const auto& l : e->impl().layers) top_tactics += l.kernel != "reference";
  EXPECT_GE(top_tactics, 1);                                 // the MatMul before the Loop
  EXPECT_GE(count_body_tactics(*e->impl().model.graph), 1);  // the MatMul in the Loop's body
  for (uint64_t seed : {31u, 32u, 33u}) {
    std::map<std::string, ops::Value> in = {{"x", ops::Value(random_tensor({5, 16}, seed))}};
    expect_same(run_context(*e, in), testing::run(m, in), "loop/scan seed " + std::to_string(seed));
  }
}

}  // namespace
}  // namespace kiln
