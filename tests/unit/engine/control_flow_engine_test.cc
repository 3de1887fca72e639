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

// A Loop (3 trips) whose body is Conv (outer weight) -> BatchNormalization (outer parameters) ->
// Relu -> Add(outer activation) -> Mul(Constant 0.5), the Relu output also a scan output.
ir::Model loop_conv_bn_model() {
  GraphBuilder b(13);
  b.input("x", {1, 16, 7, 9}).output("final").output("relus");
  b.init("w", random_tensor({16, 16, 3, 3}, 41, DataType::kFloat32, -0.1, 0.1));
  b.init("gamma", random_tensor({16}, 42, DataType::kFloat32, 0.5, 1.5)).init("beta", random_tensor({16}, 43));
  b.init("mean", random_tensor({16}, 44)).init("var", random_tensor({16}, 45, DataType::kFloat32, 0.5, 2));
  b.init("trips", Tensor::scalar<int64_t>(DataType::kInt64, 3));
  b.node("Sigmoid", {"x"}, {"xa"});
  auto i64 = ir::TypeInfo::tensor(DataType::kInt64, SymShape(std::vector<Dim>{}));
  auto bl = ir::TypeInfo::tensor(DataType::kBool, SymShape(std::vector<Dim>{}));
  auto f = ir::TypeInfo::tensor(DataType::kFloat32, SymShape::from_dims({1, 16, 7, 9}));
  ir::Node conv = make_node("lb_conv", "Conv", {"st", "w"}, {"c"});
  pads1(conv);
  ir::Node half = make_node("half", "Constant", {}, {"half"});
  half.attrs["value"].type = ir::Attribute::Type::kTensor;
  half.attrs["value"].t = Tensor::scalar<float>(DataType::kFloat32, 0.5f);
  auto loop_body =
      body("loop_body",
           {conv, make_node("lb_bn", "BatchNormalization", {"c", "gamma", "beta", "mean", "var"}, {"n"}),
            make_node("lb_relu", "Relu", {"n"}, {"r"}), make_node("lb_add", "Add", {"r", "xa"}, {"s"}), half,
            make_node("lb_mul", "Mul", {"s", "half"}, {"st2"}), make_node("lb_id", "Identity", {"cond"}, {"co"})},
           {"co", "st2", "r"}, {{"iter", i64}, {"cond", bl}, {"st", f}});
  ir::Node& loop = b.node("Loop", {"trips", "", "x"}, {"final", "relus"});
  loop.attrs["body"] = ir::attr_graph(loop_body);
  ir::Model m = b.finish();
  for (auto& n : m.graph->nodes)
    for (auto& [k, a] : n.attrs)
      if (a.g) a.g->parent = m.graph.get();
  return m;
}

const ir::Graph& first_body(const ir::Graph& g, const std::string& op, const std::string& attr) {
  for (const auto& n : g.nodes)
    if (n.op_type == op) return *n.attr(attr)->g;
  throw std::runtime_error("no " + op);
}

TEST(EngineControlFlow, LoopBodyIsFoldedFusedAndRunsATactic) {
  if (backends::all_tactics().empty()) GTEST_SKIP() << "built without oneDNN: no tactics";
  ir::Model m = loop_conv_bn_model();
  auto e = Builder().build_from_memory(onnx_import::serialize_model(m).value());
  auto loaded = Engine::deserialize(e->serialize());
  for (const Engine* engine : {e.get(), loaded.get()}) {
    const ir::Graph& lb = first_body(*engine->impl().model.graph, "Loop", "body");
    int convs = 0, bns = 0, relus = 0;
    for (const auto& n : lb.nodes) {
      bns += n.op_type == "BatchNormalization", relus += n.op_type == "Relu";
      if (n.domain == "kiln" && n.op_type.find("Conv") != std::string::npos) {
        ++convs;
        EXPECT_NE(n.attr_string(engine::kBodyKernelAttr, "reference"), "reference") << n.name;
      }
    }
    EXPECT_EQ(convs, 1);
    EXPECT_EQ(bns, 0);
    EXPECT_EQ(relus, 0);
  }
  for (uint64_t seed : {51u, 52u}) {
    std::map<std::string, ops::Value> in = {{"x", ops::Value(random_tensor({1, 16, 7, 9}, seed))}};
    auto want = testing::run(m, in);
    expect_same(run_context(*e, in), want, "loop conv-bn seed " + std::to_string(seed));
    expect_same(run_context(*loaded, in), want, "loop conv-bn loaded, seed " + std::to_string(seed));
  }
}

// If(c): each branch y = 0.5 * z * (1 + erf(z / sqrt2)), z = MatMul(x, W) + b (its own outer weights).
ir::Model if_gelu_model() {
  GraphBuilder b(13);
  b.input("x", {5, 24}).input("c", {}, DataType::kBool).output("y");
  b.init("w1", random_tensor({24, 12}, 61, DataType::kFloat32, -0.3, 0.3)).init("b1", random_tensor({12}, 62));
  b.init("w2", random_tensor({24, 12}, 63, DataType::kFloat32, -0.3, 0.3)).init("b2", random_tensor({12}, 64));
  b.init("sqrt2", Tensor::scalar<float>(DataType::kFloat32, 1.41421356f));
  b.init("one", Tensor::scalar<float>(DataType::kFloat32, 1.0f))
      .init("half", Tensor::scalar<float>(DataType::kFloat32, 0.5f));
  auto branch = [](const std::string& p, const std::string& w, const std::string& bias) {
    return body(
        p,
        {make_node(p + "_mm", "MatMul", {"x", w}, {p + "_m"}), make_node(p + "_b", "Add", {p + "_m", bias}, {p + "_z"}),
         make_node(p + "_div", "Div", {p + "_z", "sqrt2"}, {p + "_d"}),
         make_node(p + "_erf", "Erf", {p + "_d"}, {p + "_e"}),
         make_node(p + "_add", "Add", {p + "_e", "one"}, {p + "_a"}),
         make_node(p + "_mul", "Mul", {p + "_z", p + "_a"}, {p + "_za"}),
         make_node(p + "_mul2", "Mul", {p + "_za", "half"}, {p + "_out"})},
        {p + "_out"});
  };
  ir::Node& n = b.node("If", {"c"}, {"y"});
  n.attrs["then_branch"] = ir::attr_graph(branch("then", "w1", "b1"));
  n.attrs["else_branch"] = ir::attr_graph(branch("else", "w2", "b2"));
  ir::Model m = b.finish();
  for (auto& node : m.graph->nodes)
    for (auto& [k, a] : node.attrs)
      if (a.g) a.g->parent = m.graph.get();
  return m;
}

TEST(EngineControlFlow, IfBranchesAreFusedAndRunTactics) {
  if (backends::all_tactics().empty()) GTEST_SKIP() << "built without oneDNN: no tactics";
  ir::Model m = if_gelu_model();
  auto e = Builder().build_from_memory(onnx_import::serialize_model(m).value());
  for (const char* branch : {"then_branch", "else_branch"}) {
    const ir::Graph& g = first_body(*e->impl().model.graph, "If", branch);
    ASSERT_EQ(g.nodes.size(), 1u) << branch;
    EXPECT_EQ(g.nodes[0].op_type, "FusedMatMul") << branch;
    EXPECT_NE(g.nodes[0].attr_string(engine::kBodyKernelAttr, "reference"), "reference") << branch;
  }
  // kiln inspect lists the branches' layers with their kernels under the If, and counts them.
  nlohmann::json j = detail::inspect(e->impl());
  EXPECT_EQ(j["body_layers"]["layers"].get<int>(), 2);
  EXPECT_EQ(j["body_layers"]["with_tactic"].get<int>(), 2);
  int listed = 0;
  for (const auto& l : j["layers"]) {
    if (l["op"] != "If") {
      EXPECT_FALSE(l.contains("bodies")) << l["name"];
      continue;
    }
    ASSERT_EQ(l["bodies"].size(), 2u);
    for (const auto& b : l["bodies"]) {
      ASSERT_EQ(b["layers"].size(), 1u);
      EXPECT_EQ(b["layers"][0]["op"], "kiln.FusedMatMul");
      EXPECT_NE(b["layers"][0]["kernel"], "reference");
      EXPECT_EQ(b["layers"][0]["outputs"][0]["type"], "float32[5,12]");
      ++listed;
    }
  }
  EXPECT_EQ(listed, 2);
  for (bool c : {true, false}) {
    std::map<std::string, ops::Value> in = {{"x", ops::Value(random_tensor({5, 24}, 65))},
                                            {"c", ops::Value(Tensor::scalar<bool>(DataType::kBool, c))}};
    engine::LayerExecutor exec(e->impl().model.graph, e->impl().tactic_runtime());
    auto r = exec.run(in);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(exec.tactic_runs(), 1u);  // the branch's fused layer; the If itself has no tactic
    expect_same(r.value(), testing::run(m, in), std::string("if gelu c=") + (c ? "1" : "0"));
    expect_same(run_context(*e, in), testing::run(m, in), std::string("if gelu context c=") + (c ? "1" : "0"));
  }
}

// A Loop (4 trips) whose body has planned intermediates and views of them (Flatten and Reshape return
// views of their input's bytes):
//   r = Relu(Conv(st, w1)) (also a scan output), c2 = Conv(r, w2), v = Flatten(c2) (a view of c2),
//   s = Conv(r * ReduceMean(v), w3) + xa (outer activation; written after c2 is dead, so it may take
//   c2's slot), t = Flatten(s) + v (reads the view after that), st2 = Reshape(t) (a view of t's slot
//   as the carried value: the next iteration reuses the arena while it reads st2); qf = Flatten(q), a
//   view of a planned slot, is a scan output (kept until the loop ends while every iteration rewrites
//   that slot).
ir::Model loop_planned_model() {
  GraphBuilder b(13);
  b.input("x", {1, 16, 7, 9}).output("final").output("relus").output("qs");
  b.init("w1", random_tensor({16, 16, 3, 3}, 71, DataType::kFloat32, -0.1, 0.1));
  b.init("w2", random_tensor({16, 16, 3, 3}, 72, DataType::kFloat32, -0.1, 0.1));
  b.init("w3", random_tensor({16, 16, 3, 3}, 73, DataType::kFloat32, -0.1, 0.1));
  b.init("trips", Tensor::scalar<int64_t>(DataType::kInt64, 4));
  b.node("Sigmoid", {"x"}, {"xa"});
  auto i64 = ir::TypeInfo::tensor(DataType::kInt64, SymShape(std::vector<Dim>{}));
  auto bl = ir::TypeInfo::tensor(DataType::kBool, SymShape(std::vector<Dim>{}));
  auto f = ir::TypeInfo::tensor(DataType::kFloat32, SymShape::from_dims({1, 16, 7, 9}));
  ir::Node c1 = make_node("lp_c1", "Conv", {"st", "w1"}, {"c1"}), c2 = make_node("lp_c2", "Conv", {"r", "w2"}, {"c2"});
  ir::Node c3 = make_node("lp_c3", "Conv", {"q", "w3"}, {"c3"});
  pads1(c1), pads1(c2), pads1(c3);
  ir::Node mean = make_node("lp_mean", "ReduceMean", {"v"}, {"m"});
  GraphBuilder::set_ints(mean, "axes", {1});
  auto loop_body =
      body("loop_planned",
           {c1, make_node("lp_relu", "Relu", {"c1"}, {"r"}), c2, make_node("lp_flat", "Flatten", {"c2"}, {"v"}), mean,
            make_node("lp_q", "Mul", {"r", "m"}, {"q"}), make_node("lp_qf", "Flatten", {"q"}, {"qf"}), c3,
            make_node("lp_add", "Add", {"c3", "xa"}, {"s"}), make_node("lp_flat_s", "Flatten", {"s"}, {"fs"}),
            make_node("lp_t", "Add", {"fs", "v"}, {"t"}), make_node("lp_back", "Reshape", {"t", "shape4"}, {"st2"}),
            make_node("lp_id", "Identity", {"cond"}, {"co"})},
           {"co", "st2", "r", "qf"}, {{"iter", i64}, {"cond", bl}, {"st", f}});
  loop_body->initializers["shape4"] = Tensor::from_vector<int64_t>(DataType::kInt64, {4}, {1, 16, 7, 9});
  ir::Node& loop = b.node("Loop", {"trips", "", "x"}, {"final", "relus", "qs"});
  loop.attrs["body"] = ir::attr_graph(loop_body);
  ir::Model m = b.finish();
  for (auto& n : m.graph->nodes)
    for (auto& [k, a] : n.attrs)
      if (a.g) a.g->parent = m.graph.get();
  return m;
}

TEST(EngineControlFlow, LoopBodyValuesArePlannedAndReusedAcrossIterations) {
  if (backends::all_tactics().empty()) GTEST_SKIP() << "built without oneDNN: no tactics";
  ir::Model m = loop_planned_model();
  auto e = Builder().build_from_memory(onnx_import::serialize_model(m).value());
  std::map<std::string, ops::Value> in = {{"x", ops::Value(random_tensor({1, 16, 7, 9}, 74))}};
  auto want = testing::run(m, in);
  // Before: every body layer output is a tensor of its own, every iteration.
  engine::LayerExecutor unplanned(e->impl().model.graph, e->impl().tactic_runtime());
  unplanned.set_plan_bodies(false);
  auto r = unplanned.run(in);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_same(r.value(), want, "unplanned");
  const auto& before = unplanned.body_memory();
  EXPECT_EQ(before.runs, 4);
  EXPECT_EQ(before.planned_outputs, 0);
  EXPECT_EQ(before.unplanned_runs, 4);
  ASSERT_GT(before.fresh_outputs, 0);
  // After: one plan for the body's shapes, made once; its intermediates written into the arena.
  engine::LayerExecutor planned(e->impl().model.graph, e->impl().tactic_runtime());
  for (int run = 0; run < 2; ++run) {
    r = planned.run(in);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_same(r.value(), want, "planned, run " + std::to_string(run));
  }
  const auto& after = planned.body_memory();
  EXPECT_EQ(after.runs, 8);
  EXPECT_EQ(after.plans_made, 1);  // reused by the second run
  EXPECT_EQ(after.unplanned_runs, 0);
  EXPECT_GT(after.planned_outputs, 0);
  EXPECT_EQ(after.planned_outputs % 8, 0);  // the same slots every iteration
  // Per iteration, the allocations drop by what the plan holds; every output is accounted for once.
  EXPECT_EQ(after.fresh_outputs + after.planned_outputs, 2 * before.fresh_outputs);
  EXPECT_LT(after.fresh_outputs / 8, before.fresh_outputs / 4);
  std::printf("[ body memory ] per iteration: %lld outputs allocated unplanned; %lld allocated + %lld planned\n",
              static_cast<long long>(before.fresh_outputs / 4), static_cast<long long>(after.fresh_outputs / 8),
              static_cast<long long>(after.planned_outputs / 8));
  expect_same(run_context(*e, in), want, "context");
}

// A Loop whose carried value grows a row per iteration (a new input shape every time): plans are made
// for the first kMaxBodyPlans shapes, the rest run unplanned, and every result matches.
TEST(EngineControlFlow, GrowingLoopStateIsPlannedBoundedAndStaysCorrect) {
  if (backends::all_tactics().empty()) GTEST_SKIP() << "built without oneDNN: no tactics";
  GraphBuilder b(13);
  b.input("x", {2, 16}).output("final");
  b.init("w", random_tensor({16, 16}, 81, DataType::kFloat32, -0.3, 0.3));
  b.init("trips", Tensor::scalar<int64_t>(DataType::kInt64, 12));
  auto i64 = ir::TypeInfo::tensor(DataType::kInt64, SymShape(std::vector<Dim>{}));
  auto bl = ir::TypeInfo::tensor(DataType::kBool, SymShape(std::vector<Dim>{}));
  auto f = ir::TypeInfo::tensor(DataType::kFloat32, SymShape(std::vector<Dim>{Dim(), Dim(16)}));
  ir::Node sum = make_node("g_sum", "ReduceSum", {"t", "ax"}, {"rs"});
  ir::Node cat = make_node("g_cat", "Concat", {"st", "rs"}, {"st2"});
  GraphBuilder::set_int(cat, "axis", 0);
  auto grow = body("grow",
                   {make_node("g_mm", "MatMul", {"st", "w"}, {"mm"}), make_node("g_tanh", "Tanh", {"mm"}, {"t"}), sum,
                    cat, make_node("g_id", "Identity", {"cond"}, {"co"})},
                   {"co", "st2"}, {{"iter", i64}, {"cond", bl}, {"st", f}});
  grow->initializers["ax"] = Tensor::from_vector<int64_t>(DataType::kInt64, {1}, {0});
  ir::Node& loop = b.node("Loop", {"trips", "", "x"}, {"final"});
  loop.attrs["body"] = ir::attr_graph(grow);
  ir::Model m = b.finish();
  for (auto& n : m.graph->nodes)
    for (auto& [k, a] : n.attrs)
      if (a.g) a.g->parent = m.graph.get();
  auto e = Builder().build_from_memory(onnx_import::serialize_model(m).value());
  std::map<std::string, ops::Value> in = {{"x", ops::Value(random_tensor({2, 16}, 82))}};
  engine::LayerExecutor exec(e->impl().model.graph, e->impl().tactic_runtime());
  auto r = exec.run(in);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_same(r.value(), testing::run(m, in), "growing loop");
  ASSERT_EQ(r.value()[0].tensor.dim(0), 14);
  EXPECT_EQ(exec.body_memory().runs, 12);
  EXPECT_EQ(exec.body_memory().plans_made, static_cast<int64_t>(engine::LayerExecutor::kMaxBodyPlans));
  EXPECT_EQ(exec.body_memory().unplanned_runs, 12 - static_cast<int64_t>(engine::LayerExecutor::kMaxBodyPlans));
  expect_same(run_context(*e, in), testing::run(m, in), "growing loop, context");
}

// The body timer (kiln bench's per-layer profile of bodies): every body layer that ran is reported
// once per run with its path through the enclosing layers, the kernel that ran it and its own time;
// the top-level If's time excludes them (last_body_ms).
TEST(EngineControlFlow, BodyLayersAreTimedOnTheirOwn) {
  if (backends::all_tactics().empty()) GTEST_SKIP() << "built without oneDNN: no tactics";
  ir::Model m = if_model();
  auto e = Builder().build_from_memory(onnx_import::serialize_model(m).value());
  const auto& impl = e->impl();
  std::string top_if;
  for (const auto& n : impl.model.graph->nodes)
    if (n.op_type == "If" && n.outputs[0] == "y") top_if = n.name;
  ASSERT_FALSE(top_if.empty());
  for (bool c1 : {true, false}) {
    engine::LayerExecutor ex(impl.model.graph, impl.tactic_runtime());
    std::map<std::string, std::string> seen;  // path -> kernel
    double body_ms = 0;
    ex.body_timer = [&](const engine::LayerExecutor::BodyLayerTime& t) {
      EXPECT_GE(t.self_ms, 0.0);
      EXPECT_TRUE(seen.emplace(t.path, t.kernel).second) << t.path << " reported twice";
      body_ms += t.self_ms;
    };
    double top_body_ms = 0;
    ex.place_outputs = [&](const ir::Node& n, std::vector<ops::Value>&) {
      if (n.name == top_if) top_body_ms = ex.last_body_ms();
    };
    auto r = ex.run(inputs_with(c1, true, 5));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_same(r.value(), testing::run(m, inputs_with(c1, true, 5)), "timed run");
    if (c1) {
      ASSERT_TRUE(seen.count(top_if + "/then_branch/then_conv")) << "paths seen: " << seen.size();
      EXPECT_NE(seen[top_if + "/then_branch/then_conv"], "reference");  // the body Conv's tactic
      EXPECT_FALSE(seen.count(top_if + "/else_branch/inner_if"));
    } else {
      // The nested If is a body layer itself; its then-branch's layers are under its path.
      EXPECT_TRUE(seen.count(top_if + "/else_branch/inner_if"));
      // (its Mul and Add, fused by the body passes into one elementwise layer)
      size_t inner = 0;
      for (const auto& [path, kernel] : seen)
        inner += path.rfind(top_if + "/else_branch/inner_if/then_branch/", 0) == 0;
      EXPECT_GE(inner, 1u);
      EXPECT_FALSE(seen.count(top_if + "/then_branch/then_conv"));
    }
    EXPECT_GT(top_body_ms, 0.0);
    EXPECT_LE(top_body_ms, body_ms + 1e-9);  // the pass-through If's (empty) bodies add nothing
  }
}

// Outputs whose shape depends on the data (NonZero; TopK with a computed K) come from tactics that
// allocate them (engine/executor.h), in the main graph and in an If body, empty ones included.
ir::Model data_shaped_model() {
  GraphBuilder b(13);
  b.input("x", {5, 7}).input("c", {}, DataType::kBool);
  b.output("picked").output("top").output("from_body");
  b.init("zero", Tensor::scalar<float>(DataType::kFloat32, 0.f));
  b.init("one", Tensor::from_vector(DataType::kInt64, {1}, std::vector<int64_t>{1}));
  b.node("Greater", {"x", "zero"}, {"pos"});
  b.node("NonZero", {"pos"}, {"nz"});
  ir::Node& tr = b.node("Transpose", {"nz"}, {"idx"});
  GraphBuilder::set_ints(tr, "perm", {1, 0});
  b.node("GatherND", {"x", "idx"}, {"picked"});
  // K = the number of positive elements of row 0, at most 7: computed at run time.
  ir::Node& row = b.node("Gather", {"pos", "one"}, {"row"});
  GraphBuilder::set_int(row, "axis", 0);
  b.node("Cast", {"row"}, {"row_i"}).attrs["to"] = ir::attr_int(static_cast<int64_t>(DataType::kInt64));
  ir::Node& k = b.node("ReduceSum", {"row_i"}, {"k"});
  GraphBuilder::set_int(k, "keepdims", 0);
  b.node("Reshape", {"k", "one"}, {"k1"});
  ir::Node& topk = b.node("TopK", {"x", "k1"}, {"top", "top_i"});
  GraphBuilder::set_int(topk, "axis", 1);
  auto then_g = body("nz_then", {make_node("b_nz", "NonZero", {"pos"}, {"b_out"})}, {"b_out"});
  auto else_g = body("nz_else", {make_node("b_nz2", "NonZero", {"x"}, {"b_out2"})}, {"b_out2"});
  ir::Node& cond = b.node("If", {"c"}, {"from_body"});
  cond.attrs["then_branch"] = ir::attr_graph(then_g);
  cond.attrs["else_branch"] = ir::attr_graph(else_g);
  ir::Model model = b.finish();
  for (auto& n : model.graph->nodes)
    for (auto& [key, a] : n.attrs)
      if (a.g) a.g->parent = model.graph.get();
  return model;
}

TEST(EngineControlFlow, TacticsAllocateOutputsWhoseShapeDependsOnTheData) {
  if (backends::all_tactics().empty()) GTEST_SKIP() << "built without oneDNN: no tactics";
  ir::Model m = data_shaped_model();
  auto e = Builder().build_from_memory(onnx_import::serialize_model(m).value());
  const auto& impl = e->impl();
  for (const auto& l : impl.layers)
    if (l.op_type == "NonZero" || l.op_type == "TopK" || l.op_type == "GatherND")
      EXPECT_NE(l.kernel, "reference") << l.name << " (" << l.op_type << ")";
  EXPECT_EQ(count_body_tactics(*impl.model.graph), 2);  // both branches' NonZero
  for (uint64_t seed : {1u, 2u, 3u})
    for (bool c : {true, false})
      for (double shift : {0.0, -5.0}) {  // -5: nothing positive, every data-shaped output empty
        Tensor x = random_tensor({5, 7}, seed);
        for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] += static_cast<float>(shift);
        std::map<std::string, ops::Value> in = {{"x", ops::Value(x)},
                                                {"c", ops::Value(Tensor::scalar<bool>(DataType::kBool, c))}};
        auto want = testing::run(m, in);
        std::string what = "seed " + std::to_string(seed) + (c ? " then" : " else") + " shift " + std::to_string(shift);
        expect_same(run_context(*e, in), want, what);
        engine::LayerExecutor ex(impl.model.graph, impl.tactic_runtime());
        auto r = ex.run(in);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        expect_same(r.value(), want, what + " (executor)");
        EXPECT_GE(ex.tactic_runs(), 5u) << what;  // NonZero, GatherND, TopK, the body's NonZero, ...
      }
}

}  // namespace
}  // namespace kiln
