// layout_nhwc: on CUDA float16/bfloat16 targets (and CPU bfloat16 ones with AMX), convs and the pools after them become
// channels-last kiln ops (1x1 convs matrix products), with one Transpose per boundary value; the rewritten graph
// computes what the original did (reference interpreter).
#include <tuple>

#include "backends/cpu/tactic_list.h"
#include "engine/target.h"
#include "ops/kiln_layout.h"
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

Result<int> nhwc(ir::Graph& g) { return passes::layout_nhwc_always(g); }

int count_onnx(const ir::Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes) n += node.domain.empty() && node.op_type == op;
  return n;
}

ir::Node& conv(GraphBuilder& b, const std::string& x, const std::string& w, const std::string& y, int64_t pad) {
  ir::Node& n = b.node("Conv", {x, w}, {y});
  GraphBuilder::set_ints(n, "pads", {pad, pad, pad, pad});
  return n;
}

TEST(LayoutNhwc, ResnetStaysChannelsLastBetweenLayers) {
  ir::Model before = small_resnet();
  int changed = 0;
  ir::Model after = apply_pass(before, nhwc, &changed);
  EXPECT_EQ(changed, 5);  // 3 convs, 2 pools
  const ir::Graph& g = *after.graph;
  EXPECT_EQ(count_kiln(g, "NhwcConv"), 2);
  EXPECT_EQ(count_kiln(g, "FusedMatMul"), 1);  // the 1x1 conv with its residual and ReLU
  EXPECT_EQ(count_kiln(g, "NhwcPool"), 2);
  EXPECT_EQ(count_kiln(g, "FusedConv"), 0);
  EXPECT_EQ(count_onnx(g, "Transpose"), 1);  // the image in
  EXPECT_EQ(count_onnx(g, "Reshape"), 1);    // the pooled [2,1,1,20] out: a view
  const ir::Node* to = find_op(g, "Transpose");
  ASSERT_NE(to, nullptr);
  EXPECT_EQ(to->inputs[0], "x");
  EXPECT_EQ(to->attr_ints("perm"), (std::vector<int64_t>{0, 2, 3, 1}));
  const ir::Node* from = find_op(g, "Reshape");
  ASSERT_NE(from, nullptr);
  EXPECT_EQ(from->outputs[0], "g");  // the escaping value keeps its name
  const ir::Node* mm = find_op(g, "FusedMatMul");
  ASSERT_NE(mm, nullptr);
  EXPECT_EQ(mm->attr_string("activation", ""), "Relu");
  ASSERT_EQ(mm->inputs.size(), 4u);
  EXPECT_EQ(mm->inputs[3], find_op(g, "NhwcPool")->outputs[0]);  // the residual read channels-last
  EXPECT_EQ(mm->attr_string("kiln.plain_value", ""), "r2");      // the fused conv's output
  EXPECT_EQ(mm->attr_string("kiln.plain_layout", ""), "nhwc");
  auto y = g.value_types.find(mm->outputs[0]);
  ASSERT_NE(y, g.value_types.end());
  EXPECT_EQ(y->second.shape.str(), "[2,8,7,20]");
  EXPECT_LT(max_abs_diff(before, after), 1e-4);  // the matmul sums in another order than the conv
}

TEST(LayoutNhwc, OneTransposePerBoundaryValueAndKeptNames) {
  // x read by two convs: one shared Transpose in. c1 read by a conv, by a Flatten and as a graph
  // output: one Transpose out, which produces "c1". Add(c2, c3) -> Relu stay channels-last (and a
  // Sigmoid of c2 would too: elementwise ops compute the same on either layout).
  GraphBuilder b(13);
  b.input("x", {1, 32, 7, 9}).output("c1").output("s").output("y");
  b.init("wa", random_tensor({24, 32, 3, 3}, 1)).init("wb", random_tensor({8, 32, 3, 3}, 2));
  b.init("wc", random_tensor({8, 24, 1, 1}, 3));
  conv(b, "x", "wa", "c1", 1);
  conv(b, "x", "wb", "c2", 1);
  b.node("Flatten", {"c1"}, {"s"});
  conv(b, "c1", "wc", "c3", 0);
  b.node("Add", {"c2", "c3"}, {"y0"});
  b.node("Relu", {"y0"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, nhwc, &changed);
  const ir::Graph& g = *after.graph;
  EXPECT_EQ(changed, 5);                     // 3 convs, Add, Relu
  EXPECT_EQ(count_onnx(g, "Transpose"), 3);  // x in; c1 and y out
  int readers_of_x = 0;
  for (const auto& n : g.nodes)
    if (n.op_type == "Transpose" && n.inputs[0] == "x")
      for (const auto& r : g.nodes) readers_of_x += r.op_type == "NhwcConv" && r.inputs[0] == n.outputs[0];
  EXPECT_EQ(readers_of_x, 2);
  int made_c1 = 0;
  for (const auto& n : g.nodes)
    for (const auto& o : n.outputs) made_c1 += o == "c1";
  EXPECT_EQ(made_c1, 1);
  EXPECT_EQ(find_op(g, "Flatten")->inputs[0], "c1");
  EXPECT_NE(find_op(g, "Add")->inputs[0], "c2");  // its channels-last form
  EXPECT_LT(max_abs_diff(before, after), 1e-4);
}

TEST(LayoutNhwc, ChannelConcatBecomesALastAxisConcat) {
  GraphBuilder b(13);
  b.input("x", {2, 6, 9, 7}).output("y");
  b.init("wa", random_tensor({5, 6, 3, 3}, 1)).init("wb", random_tensor({17, 6, 3, 3}, 2));
  b.init("wc", random_tensor({4, 22, 3, 3}, 3));
  conv(b, "x", "wa", "a", 1);
  conv(b, "x", "wb", "bb", 1);
  auto& cat = b.node("Concat", {"a", "bb"}, {"cat"});
  GraphBuilder::set_int(cat, "axis", 1);
  conv(b, "cat", "wc", "y", 1);
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, nhwc, &changed);
  const ir::Graph& g = *after.graph;
  EXPECT_EQ(changed, 4);
  const ir::Node* c = find_op(g, "Concat");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->attr_int("axis", 1), 3);
  EXPECT_EQ(count_onnx(g, "Transpose"), 2);  // x in, y out
  EXPECT_LT(max_abs_diff(before, after), 1e-4);
}

TEST(LayoutNhwc, GroupedDepthwiseStridedDilatedConvsAndPools) {
  GraphBuilder b(13);
  b.input("x", {1, 17, 13, 11}).output("y");
  b.init("wd", random_tensor({17, 1, 3, 3}, 1));
  b.init("w2", random_tensor({6, 17, 1, 1}, 3)).init("b2", random_tensor({6}, 4));
  auto& dw = b.node("Conv", {"x", "wd"}, {"d"});
  GraphBuilder::set_int(dw, "group", 17);
  GraphBuilder::set_ints(dw, "pads", {1, 0, 2, 1});
  GraphBuilder::set_ints(dw, "strides", {2, 1});
  GraphBuilder::set_ints(dw, "dilations", {1, 2});
  auto& ap = b.node("AveragePool", {"d"}, {"p"});
  GraphBuilder::set_ints(ap, "kernel_shape", {2, 3});
  GraphBuilder::set_ints(ap, "pads", {0, 1, 1, 1});
  GraphBuilder::set_int(ap, "count_include_pad", 1);
  GraphBuilder::set_int(ap, "ceil_mode", 1);
  auto& s1 = b.node("Conv", {"p", "w2", "b2"}, {"q"});  // 1x1 but strided: not a matmul
  GraphBuilder::set_ints(s1, "strides", {2, 2});
  GraphBuilder::set_int(s1, "group", 1);
  b.node("GlobalMaxPool", {"q"}, {"y"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, nhwc, &changed);
  const ir::Graph& g = *after.graph;
  EXPECT_EQ(changed, 4);
  EXPECT_EQ(count_kiln(g, "NhwcConv"), 2);
  EXPECT_EQ(count_kiln(g, "NhwcPool"), 2);
  EXPECT_EQ(count_kiln(g, "FusedMatMul"), 0);
  EXPECT_LT(max_abs_diff(before, after), 1e-4);
}

TEST(LayoutNhwc, ConvsThatCannotGoChannelsLastStayPlain) {
  // A runtime W, a 3-D conv and a pool on a plain value are left alone.
  GraphBuilder b(13);
  b.input("x", {1, 4, 6, 6}).input("w", {3, 4, 3, 3}).input("v", {1, 2, 4, 4, 4}).output("y").output("z").output("p");
  b.init("w3", random_tensor({2, 2, 3, 3, 3}, 1));
  conv(b, "x", "w", "y", 1);
  auto& c3 = b.node("Conv", {"v", "w3"}, {"z"});
  GraphBuilder::set_ints(c3, "pads", {1, 1, 1, 1, 1, 1});
  auto& mp = b.node("MaxPool", {"x"}, {"p"});
  GraphBuilder::set_ints(mp, "kernel_shape", {2, 2});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, nhwc, &changed);
  EXPECT_EQ(changed, 0);
  EXPECT_EQ(count_onnx(*after.graph, "Transpose"), 0);
}

// Target::channels_last is what engine::target_for resolves from BuilderConfig::channels_last (by
// default: CUDA builds allowing fp16/bf16; on: every CUDA float build; the CPU: bf16 builds on AMX).
// The pass runs wherever the target says so, CPU or CUDA.
TEST(LayoutNhwc, RunsOnlyForChannelsLastTargets) {
  ir::Model before = small_resnet();
  Target t;
  for (auto [kind, channels_last, want] :
       {std::tuple{DeviceKind::kCPU, false, false}, std::tuple{DeviceKind::kCPU, true, true},
        std::tuple{DeviceKind::kCUDA, false, false}, std::tuple{DeviceKind::kCUDA, true, true}}) {
    t.device.kind = kind;
    t.channels_last = channels_last;
    ir::Model m = clone(before);
    auto r = passes::layout_nhwc(*m.graph, t);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r.value() > 0, want);
  }
}

// The CPU: channels-last is the AMX bfloat16 path. FP32 builds never take it (--channels-last on is
// refused, naming the path); --bf16 takes it by default exactly when the CPU has AMX, and
// --channels-last off keeps the blocked layout.
TEST(LayoutNhwc, CpuChannelsLastIsTheAmxBf16Path) {
  // (AMX, and oneDNN to run it: a tree without oneDNN has no blocked or channels-last kernels)
  const bool amx = (host_isa() & kIsaAmx) != 0 && backends::cpu::preferred_layout_block(kIsaAll) != 0;
  BuilderConfig cfg;
  cfg.channels_last = 1;
  auto t = engine::target_for(cfg);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("the AMX bfloat16 path"), std::string::npos) << t.status().message();
  cfg.channels_last = -1;
  t = engine::target_for(cfg);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_FALSE(t.value().channels_last);
  cfg.precision = Precision::kBF16;
  t = engine::target_for(cfg);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t.value().channels_last, amx);
  cfg.channels_last = 0;
  t = engine::target_for(cfg);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_FALSE(t.value().channels_last);
  cfg.channels_last = 1;
  EXPECT_EQ(engine::target_for(cfg).ok(), amx);
  cfg.channels_last = 2;
  EXPECT_FALSE(engine::target_for(cfg).ok());
}

// The reference kernels of the channels-last ops themselves: NhwcConv and NhwcPool equal the
// plain op between transposes (the layout helpers round-trip).
TEST(LayoutNhwc, LayoutHelpersRoundTrip) {
  Tensor x = random_tensor({2, 5, 3, 7}, 9);
  auto l = ops::nchw_to_nhwc(x);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l.value().shape(), (Dims{2, 3, 7, 5}));
  // x[1, 4, 2, 6] at [1, 2, 6, 4].
  EXPECT_EQ(l.value().data<float>()[((1 * 3 + 2) * 7 + 6) * 5 + 4], x.data<float>()[((1 * 5 + 4) * 3 + 2) * 7 + 6]);
  auto back = ops::nhwc_to_nchw(l.value());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back.value().shape(), x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(back.value().data<float>()[i], x.data<float>()[i]);
}

}  // namespace
}  // namespace kiln
