// Custom-op plugins (include/kiln/plugin.h, src/plugin): the examples of examples/plugins built into
// engines, tuned, saved, loaded and checked against their formulas; deliberately broken plugins
// (tests/plugins/test_plugins.c) refused with their fault named; the C++ registration path.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "../graph_builder.h"
#include "engine/engine_impl.h"
#include "kiln/custom_op.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"
#include "ops/interpreter.h"
#include "plugin/custom_ops.h"

namespace kiln {
namespace {

using testing::GraphBuilder;

std::string plugin_path(const std::string& lib) { return std::string(KILN_PLUGIN_DIR) + "/lib" + lib + ".so"; }

// A model of one custom node `domain::op` reading `inputs` (name, dims, dtype) into "y".
struct Input {
  std::string name;
  Dims dims;
  DataType dtype = DataType::kFloat32;
};
ir::Model custom_model(const std::string& domain, const std::string& op, const std::vector<Input>& inputs,
                       const std::function<void(ir::Node&)>& attrs = nullptr) {
  GraphBuilder b;
  std::vector<std::string> names;
  for (const auto& in : inputs) b.input(in.name, in.dims, in.dtype), names.push_back(in.name);
  ir::Node& n = b.node(op, names, {"y"});
  n.domain = domain;
  n.opset = 1;
  n.name = "custom_0";
  if (attrs) attrs(n);
  const int opset = n.opset;  // an attrs callback may change it: the domain's import follows
  b.output("y");
  ir::Model m = b.finish();
  m.opset_imports[domain] = opset;
  m.graph->opset_imports[domain] = opset;
  return m;
}

std::string onnx_bytes(const ir::Model& m) { return onnx_import::serialize_model(m).value(); }

std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -3, float hi = 3) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

std::vector<float> run_engine(const Engine& e, const std::map<std::string, HostTensor>& inputs) {
  auto ctx = e.create_context();
  for (const auto& [name, t] : inputs) ctx->set_input(name, t);
  ctx->run();
  HostTensor y = ctx->output("y");
  return std::vector<float>(y.as<float>(), y.as<float>() + y.numel());
}

void expect_message(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << parts[0];
  } catch (const std::exception& e) {  // kiln::Error, or GraphBuilder's runtime_error of the same message
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(Plugin, SquarePlusBuildsTunesRunsAndSurvivesSaveAndLoad) {
  PluginInfo info = load_plugin(plugin_path("kiln_square_plus"));
  EXPECT_EQ(info.name, "kiln_example_activation");
  EXPECT_EQ(info.version, "1.0.0");
  ASSERT_EQ(info.ops, std::vector<std::string>{"my.domain::SquarePlus"});
  EXPECT_EQ(info.kernels.size(), 2u);
  EXPECT_EQ(load_plugin(plugin_path("kiln_square_plus")).name, info.name);  // a second load: the same plugin

  const float b = 2.5f;
  const Dims dims = {3, 37, 5};  // odd sizes: 555 elements, not a multiple of the blocked kernel's 256
  ir::Model m =
      custom_model("my.domain", "SquarePlus", {{"x", dims}}, [&](ir::Node& n) { GraphBuilder::set_float(n, "b", b); });
  auto engine = Builder().build_from_memory(onnx_bytes(m));
  std::vector<float> x = random_floats(555, 1);
  x[0] = -1e4f, x[1] = 1e4f, x[2] = 0;
  auto y = run_engine(*engine, {{"x", HostTensor::f32(dims, x.data())}});
  ASSERT_EQ(y.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double want = 0.5 * (x[i] + std::sqrt(double(x[i]) * x[i] + b));
    EXPECT_NEAR(y[i], want, 1e-5 * std::max(1.0, std::fabs(want))) << i;
  }

  // Both kernels were timed against each other; the winner is one of them; the plugin is recorded.
  auto j = nlohmann::json::parse(engine->inspect_json());
  const auto& layer = j["layers"][0];
  std::string kernel = layer["kernel"];
  EXPECT_TRUE(kernel == "kiln_example_activation.square_plus_f32_scalar" ||
              kernel == "kiln_example_activation.square_plus_f32_blocked")
      << kernel;
  ASSERT_EQ(layer["candidates"].size(), 2u) << layer.dump();
  EXPECT_FALSE(layer.contains("slow"));  // compiled kernels: only interpreted ones are marked
  for (const auto& c : layer["candidates"]) EXPECT_EQ(c["state"], "timed") << c.dump();
  ASSERT_EQ(j["build"]["plugins"].size(), 1u);
  EXPECT_EQ(j["build"]["plugins"][0]["name"], "kiln_example_activation");
  EXPECT_EQ(j["build"]["plugins"][0]["version"], "1.0.0");
  EXPECT_EQ(j["build"]["plugins"][0]["layers"][0], "custom_0");

  // The saved engine runs the same; its state came from the engine (b is not re-read from attributes).
  auto loaded = Engine::deserialize(engine->serialize());
  EXPECT_EQ(run_engine(*loaded, {{"x", HostTensor::f32(dims, x.data())}}), y);

  // The reference interpreter runs the plugin's CPU kernel.
  ops::Value xv(Tensor::from_vector(DataType::kFloat32, dims, x));
  auto ref = testing::run(m, {{"x", xv}});
  ASSERT_EQ(ref.size(), 1u);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(ref[0].tensor.data<float>()[i], y[i], 1e-6f * std::max(1.f, std::fabs(y[i])));

  // --tactics picks one kernel: the other is declined as left out.
  BuilderConfig only;
  only.tactics = {"kiln_example_activation.square_plus_f32_blocked"};
  auto forced = nlohmann::json::parse(Builder(only).build_from_memory(onnx_bytes(m))->inspect_json());
  EXPECT_EQ(forced["layers"][0]["kernel"], "kiln_example_activation.square_plus_f32_blocked");

  // Attribute errors name the node and the plugin.
  expect_message(
      [&] {
        ir::Model bad = custom_model("my.domain", "SquarePlus", {{"x", dims}},
                                     [&](ir::Node& n) { GraphBuilder::set_float(n, "b", -1.f); });
        Builder().build_from_memory(onnx_bytes(bad));
      },
      {"custom_0", "kiln_example_activation", "'b' must be >= 0"});
}

TEST(Plugin, RotaryEmbeddingMatchesItsFormulaAndStoresItsTable) {
  load_plugin(plugin_path("kiln_rotary"));
  void* lib = ::dlopen(plugin_path("kiln_rotary").c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  auto counters = reinterpret_cast<void (*)(int*, int*)>(::dlsym(lib, "kiln_example_rope_counters"));
  ASSERT_NE(counters, nullptr);

  const int64_t B = 2, S = 5, H = 3, D = 10, kMaxPos = 64;
  const double base = 500;
  ir::Model m = custom_model("my.domain", "RotaryEmbedding", {{"x", {B, S, H, D}}, {"pos", {B, S}, DataType::kInt64}},
                             [&](ir::Node& n) {
                               GraphBuilder::set_int(n, "head_dim", D);
                               GraphBuilder::set_int(n, "max_positions", kMaxPos);
                               GraphBuilder::set_float(n, "base", static_cast<float>(base));
                             });
  auto engine = Builder().build_from_memory(onnx_bytes(m));
  std::vector<float> x = random_floats(B * S * H * D, 2);
  std::vector<int64_t> pos(B * S);
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int64_t>((i * 13 + 7) % kMaxPos);
  auto inputs = [&](const std::vector<int64_t>& p) {
    return std::map<std::string, HostTensor>{
        {"x", HostTensor::f32({B, S, H, D}, x.data())},
        {"pos", HostTensor::borrow(kInt64, {B, S}, p.data(), p.size() * sizeof(int64_t))}};
  };
  auto y = run_engine(*engine, inputs(pos));
  const int64_t half = D / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < half; ++i) {
          double a = pos[b * S + s] * std::pow(base, -2.0 * i / D);
          size_t at = ((b * S + s) * H + h) * D;
          double x1 = x[at + i], x2 = x[at + i + half];
          EXPECT_NEAR(y[at + i], x1 * std::cos(a) - x2 * std::sin(a), 1e-5);
          EXPECT_NEAR(y[at + i + half], x2 * std::cos(a) + x1 * std::sin(a), 1e-5);
        }

  // A loaded engine reads the table back instead of recomputing it from the attributes.
  int made_before = 0, read_before = 0, made_after = 0, read_after = 0;
  counters(&made_before, &read_before);
  auto loaded = Engine::deserialize(engine->serialize());
  EXPECT_EQ(run_engine(*loaded, inputs(pos)), y);
  counters(&made_after, &read_after);
  EXPECT_EQ(made_after, made_before);
  EXPECT_GT(read_after, read_before);
  auto j = nlohmann::json::parse(loaded->inspect_json());
  EXPECT_EQ(j["build"]["plugins"][0]["name"], "kiln_example_rotary");

  // Contexts on two threads share the layer's prepared kernel and its state.
  std::vector<float> y_threads[2];
  std::thread t0([&] { y_threads[0] = run_engine(*loaded, inputs(pos)); });
  std::thread t1([&] { y_threads[1] = run_engine(*loaded, inputs(pos)); });
  t0.join(), t1.join();
  EXPECT_EQ(y_threads[0], y);
  EXPECT_EQ(y_threads[1], y);

  // A kernel's failure is an error naming the layer, the plugin and the kernel.
  std::vector<int64_t> far = pos;
  far[3] = kMaxPos;
  expect_message([&] { run_engine(*loaded, inputs(far)); },
                 {"custom_0", "kiln_example_rotary", "rotary_embedding_f32", "outside [0, max_positions = 64)"});
  // Inference errors name the node: X's last dim against head_dim.
  expect_message(
      [&] {
        ir::Model wrong =
            custom_model("my.domain", "RotaryEmbedding", {{"x", {1, 2, 1, 6}}, {"pos", {1, 2}, DataType::kInt64}},
                         [&](ir::Node& n) { GraphBuilder::set_int(n, "head_dim", 8); });
        Builder().build_from_memory(onnx_bytes(wrong));
      },
      {"custom_0", "X's last dim is 6"});
  ::dlclose(lib);
}

// The engine's bytes after replacing the state stored for node `node` (kiln.plugin_state) by `state`: a
// corrupt or truncated state in an engine whose checksums are right (an older plugin's layout, a bug).
// (The engine's graph is edited in place and restored: EngineImpl does not copy.)
std::string with_stored_state(const Engine& e, const std::string& node, const std::string& state) {
  auto& impl = const_cast<detail::EngineImpl&>(e.impl());
  for (auto& n : impl.model.graph->nodes)
    if (n.name == node && n.attrs.count(plugin::kStateAttr)) {
      std::string& stored = n.attrs[plugin::kStateAttr].s;
      std::string saved = stored;
      stored = state;
      auto bytes = detail::serialize_engine(impl);
      stored = saved;
      return bytes.value();
    }
  ADD_FAILURE() << "no stored state for " << node;
  return "";
}

TEST(Plugin, AStoredStateIsCheckedWhenTheEngineLoads) {
  load_plugin(plugin_path("kiln_square_plus"));
  load_plugin(plugin_path("kiln_rotary"));
  ir::Model sp = custom_model("my.domain", "SquarePlus", {{"x", {4}}});
  auto sp_engine = Builder().build_from_memory(onnx_bytes(sp));
  ir::Model rope = custom_model("my.domain", "RotaryEmbedding",
                                {{"x", {1, 2, 1, 4}}, {"pos", {1, 2}, DataType::kInt64}}, [](ir::Node& n) {
                                  GraphBuilder::set_int(n, "head_dim", 4);
                                  GraphBuilder::set_int(n, "max_positions", 8);
                                });
  auto rope_engine = Builder().build_from_memory(onnx_bytes(rope));
  const std::string good = rope_engine->impl().model.graph->nodes[0].attrs.at(plugin::kStateAttr).s;
  ASSERT_GT(good.size(), 28u);
  // Unchanged bytes load (the helper itself is sound).
  EXPECT_NO_THROW(Engine::deserialize(with_stored_state(*rope_engine, "custom_0", good)));
  struct Case {
    const Engine* engine;
    std::string state, fault;
  };
  std::string wrong_dims = good;
  wrong_dims[12] = 9;  // max_positions 8 -> 9: the table no longer has its size
  for (const Case& c : std::vector<Case>{
           {sp_engine.get(), "SQP", "not a SquarePlus state (SQP1)"},
           {sp_engine.get(), "", "not a SquarePlus state (SQP1)"},
           {rope_engine.get(), good.substr(0, good.size() - 5), "stored table has the wrong size"},
           {rope_engine.get(), good.substr(0, 10), "not a RotaryEmbedding state (ROP1)"},
           {rope_engine.get(), wrong_dims, "stored table has the wrong size"},
       }) {
    SCOPED_TRACE(c.fault);
    std::string bytes = with_stored_state(*c.engine, "custom_0", c.state);
    // At load, not at the first run: the error names the node, the plugin, the fault and the fix.
    expect_message([&] { Engine::deserialize(bytes); },
                   {"custom_0", "cannot read the state stored in the engine", c.fault, "rebuild the engine"});
  }
}

TEST(Plugin, BrokenPluginsAreRefusedNamingTheFault) {
  struct Case {
    std::string lib, expected;
  };
  for (const Case& c : std::vector<Case>{
           {"kiln_test_plugin_no_init", "exports no 'kiln_plugin_init'"},
           {"kiln_test_plugin_abi_major", "built for kiln plugin ABI 2.0; this kiln"},
           {"kiln_test_plugin_small", "struct_size 12 is smaller"},
           {"kiln_test_plugin_null_infer", "infer is NULL"},
           {"kiln_test_plugin_null_compute", "compute is NULL"},
           {"no_such_plugin", "no such file"},
       }) {
    SCOPED_TRACE(c.lib);
    expect_message([&] { load_plugin(plugin_path(c.lib)); }, {c.expected});
  }
  // Nothing of a refused plugin is registered.
  EXPECT_FALSE(ops::OpRegistry::get().knows("test.domain", "Identity_null_infer"));
  EXPECT_FALSE(ops::OpRegistry::get().knows("test.domain", "NullCompute"));
  // Not a shared library at all.
  expect_message([&] { load_plugin(std::string(KILN_PLUGIN_DIR) + "/../CMakeCache.txt"); },
                 {"cannot be loaded as a shared library"});
}

TEST(Plugin, APluginOfANewerMinorVersionLoadsIgnoringFieldsKilnDoesNotKnow) {
  PluginInfo info = load_plugin(plugin_path("kiln_test_plugin_future"));
  EXPECT_EQ(info.version, "1.4.0");
  ir::Model m = custom_model("test.domain", "Identity_future", {{"x", {7}}});
  auto engine = Builder().build_from_memory(onnx_bytes(m));
  std::vector<float> x = random_floats(7, 3);
  EXPECT_EQ(run_engine(*engine, {{"x", HostTensor::f32({7}, x.data())}}), x);
}

TEST(Plugin, AFailingKernelIsAnErrorNotACrash) {
  load_plugin(plugin_path("kiln_test_plugin_failing"));
  ir::Model m = custom_model("test.domain", "AlwaysFails", {{"x", {4}}});
  std::vector<float> x(4, 1.f);
  expect_message(
      [&] {
        auto engine = Builder().build_from_memory(onnx_bytes(m));
        run_engine(*engine, {{"x", HostTensor::f32({4}, x.data())}});
      },
      {"test_failing", "kernel 'test_failing.copy' failed: the widget overflowed"});
}

TEST(Plugin, EnginesNameAMissingOrIncompatiblePlugin) {
  nlohmann::json missing = nlohmann::json::parse(
      R"([{"name": "not_loaded_ops", "version": "1.2.0", "origin": "/opt/ops/libnot_loaded.so",
           "ops": ["acme::Warp"], "layers": ["warp_1"]}])");
  Status s = plugin::check_engine_plugins(missing);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  for (const char* part : {"plugin 'not_loaded_ops' 1.2.0", "acme::Warp", "'warp_1'", "not loaded",
                           "--plugin /opt/ops/libnot_loaded.so", "KILN_PLUGIN_PATH", "examples/plugins"})
    EXPECT_NE(s.message().find(part), std::string::npos) << part << "\n" << s.message();
  load_plugin(plugin_path("kiln_square_plus"));
  nlohmann::json other_major =
      nlohmann::json::parse(R"([{"name": "kiln_example_activation", "version": "2.1.0", "layers": ["a"]}])");
  s = plugin::check_engine_plugins(other_major);
  EXPECT_NE(s.message().find("another major version"), std::string::npos) << s.message();
  nlohmann::json same_major =
      nlohmann::json::parse(R"([{"name": "kiln_example_activation", "version": "1.7.3", "layers": ["a"]}])");
  EXPECT_TRUE(plugin::check_engine_plugins(same_major).ok());
}

TEST(Plugin, UnknownOpsPointToThePluginExamples) {
  ir::Model m = custom_model("nobody.domain", "Warp", {{"x", {2}}});  // no schema: inference leaves it
  Status s = ops::check_supported(*m.graph);
  EXPECT_NE(s.message().find("examples/plugins"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--plugin"), std::string::npos) << s.message();
}

// The C++ entry point (Python's @kiln.custom_op registers through it): std::function callbacks, two
// kernels the tuner times against each other, a kernel that declines some inputs.
TEST(Plugin, CppRegisteredOpRunsThroughTheSamePath) {
  const kiln_host_api* host = plugin_host_api();
  CustomOpDesc d;
  d.plugin = "cpp_test_ops", d.plugin_version = "0.3.0", d.origin = "plugin_test.cc";
  d.domain = "cpp.domain", d.op_type = "Scale";
  d.min_inputs = d.max_inputs = 1;
  d.create_state = [host](const kiln_attrs* a, CustomOpDesc::State* st) -> std::string {
    float k = 1;
    if (host->attr_float(a, "k", &k) < 0) return "k must be a float";
    *st = std::make_shared<float>(k);
    return "";
  };
  d.infer = [host](const void*, kiln_shape_ctx* s) -> std::string {
    return host->copy_input_type(s, 0, 0) == KILN_OK ? "" : "cannot copy";
  };
  auto compute = [](const void* st, const kiln_kernel_io& io) -> std::string {
    float k = *static_cast<const float*>(st);
    size_t n = io.inputs[0].nbytes / sizeof(float);
    for (size_t i = 0; i < n; ++i)
      static_cast<float*>(io.outputs[0].data)[i] = k * static_cast<const float*>(io.inputs[0].data)[i];
    return "";
  };
  d.kernels.push_back({"cpp_test_ops.scale_a", KILN_DEVICE_CPU, 1, nullptr, nullptr, compute});
  d.kernels.push_back({"cpp_test_ops.scale_rank1_only", KILN_DEVICE_CPU, 1,
                       [host](const void*, const kiln_shape_ctx* s) -> std::string {
                         return host->input_rank(s, 0) == 1 ? "" : "rank 1 inputs only";
                       },
                       nullptr, compute});
  register_custom_op(d);
  expect_message([&] { register_custom_op(d); }, {"registered it already"});

  ir::Model m =
      custom_model("cpp.domain", "Scale", {{"x", {2, 3}}}, [](ir::Node& n) { GraphBuilder::set_float(n, "k", -2.f); });
  auto engine = Builder().build_from_memory(onnx_bytes(m));
  std::vector<float> x = random_floats(6, 4), want(6);
  for (int i = 0; i < 6; ++i) want[i] = -2.f * x[i];
  EXPECT_EQ(run_engine(*engine, {{"x", HostTensor::f32({2, 3}, x.data())}}), want);
  auto j = nlohmann::json::parse(engine->inspect_json());
  EXPECT_EQ(j["layers"][0]["kernel"], "cpp_test_ops.scale_a");
  bool declined = false;
  for (const auto& p : loaded_plugins()) declined |= p.name == "cpp_test_ops";
  EXPECT_TRUE(declined);

  // An opset past the op's range is an error naming the range.
  CustomOpDesc ranged = d;
  ranged.op_type = "ScaleV1", ranged.until_opset = 1;
  ranged.kernels = {{"cpp_test_ops.scale_v1", KILN_DEVICE_CPU, 1, nullptr, nullptr, compute}};
  register_custom_op(ranged);
  expect_message(
      [&] {
        ir::Model v2 = custom_model("cpp.domain", "ScaleV1", {{"x", {2}}}, [](ir::Node& n) { n.opset = 2; });
        Builder().build_from_memory(onnx_bytes(v2));
      },
      {"implements opsets 1-1; this node has opset 2"});

  // Registering over a built-in op is refused.
  CustomOpDesc relu = d;
  relu.domain = "", relu.op_type = "Relu", relu.plugin = "cpp_test_ops";
  relu.kernels = {{"cpp_test_ops.relu", KILN_DEVICE_CPU, 1, nullptr, nullptr, compute}};
  expect_message([&] { register_custom_op(relu); }, {"built in"});
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// ABI 1.1's attribute enumeration (what Python's custom ops read a node's attributes with), and a slow
// provider's layers marked in inspect.
TEST(Plugin, HostListsANodesAttributesAndSlowLayersAreMarked) {
  const kiln_host_api* host = plugin_host_api();
  ASSERT_TRUE(KILN_HOST_HAS(host, attr_strings));
  static std::vector<std::string> seen;  // "name:type" per attribute, as create_state saw them
  CustomOpDesc d;
  d.plugin = "slow_test_ops", d.plugin_version = "1.0.0", d.origin = "plugin_test.cc", d.slow = true;
  d.domain = "slow.domain", d.op_type = "Copy";
  d.create_state = [host](const kiln_attrs* a, CustomOpDesc::State*) -> std::string {
    seen.clear();
    for (int32_t i = 0; i < host->num_attrs(a); ++i) {
      const char* name = host->attr_name(a, i);
      std::string entry = std::string(name) + ":" + std::to_string(host->attr_type(a, name));
      size_t count = 0;
      const char* s = nullptr;
      size_t size = 0;
      if (host->attr_strings(a, name, 1, &s, &size, &count) == 1)
        entry += "=" + std::to_string(count) + std::string(s, size);
      seen.push_back(entry);
    }
    if (host->attr_name(a, host->num_attrs(a)) != nullptr) return "attr_name past the end is not NULL";
    return "";
  };
  d.infer = [host](const void*, kiln_shape_ctx* s) -> std::string {
    return host->copy_input_type(s, 0, 0) == KILN_OK ? "" : "cannot copy";
  };
  d.kernels.push_back({"slow_test_ops.copy", KILN_DEVICE_CPU, 1, nullptr, nullptr,
                       [](const void*, const kiln_kernel_io& io) -> std::string {
                         std::memcpy(io.outputs[0].data, io.inputs[0].data, io.inputs[0].nbytes);
                         return "";
                       }});
  register_custom_op(d);
  ir::Model m = custom_model("slow.domain", "Copy", {{"x", {3}}}, [](ir::Node& n) {
    GraphBuilder::set_int(n, "k", 2);
    GraphBuilder::set_float(n, "f", 0.5f);
    ir::Attribute names;
    names.type = ir::Attribute::Type::kStrings;
    names.strings = {"ab", "cde"};
    n.attrs["names"] = names;
  });
  auto engine = Builder().build_from_memory(onnx_bytes(m));
  // Sorted names, ONNX's type codes (FLOAT 1, INT 2, STRINGS 8); kiln's own attributes are not listed.
  EXPECT_EQ(seen, (std::vector<std::string>{"f:1", "k:2", "names:8=2cde"}));
  std::vector<float> x = {1, -2, 3};
  EXPECT_EQ(run_engine(*engine, {{"x", HostTensor::f32({3}, x.data())}}), x);
  auto j = nlohmann::json::parse(engine->inspect_json());
  ASSERT_TRUE(j["layers"][0].contains("slow")) << j["layers"][0].dump();
  EXPECT_NE(j["layers"][0]["slow"].get<std::string>().find("slow interpreted kernel of plugin 'slow_test_ops'"),
            std::string::npos);
  EXPECT_TRUE(j["build"]["plugins"][0]["slow"].get<bool>());
}

}  // namespace
}  // namespace kiln
