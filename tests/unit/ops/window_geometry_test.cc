// ops::resolve_window: exact geometry for auto_pad, ceil_mode, dilations and ConvTranspose's
// output_padding at every spatial rank, errors naming the node, and agreement with the reference
// kernels' output shapes on random windows (the kernels, shape inference and tactics all read it).
#include <gtest/gtest.h>

#include <random>

#include "../graph_builder.h"
#include "ir/attribute_builders.h"
#include "ops/conv_util.h"

namespace kiln::ops {
namespace {

using kiln::testing::GraphBuilder;

ir::Node window_node(const std::string& op, int opset, std::map<std::string, ir::Attribute> attrs) {
  ir::Node n;
  n.name = "win_node";
  n.op_type = op;
  n.opset = opset;
  n.attrs = std::move(attrs);
  return n;
}

ir::Attribute ints(std::vector<int64_t> v) { return ir::attr_ints(std::move(v)); }
ir::Attribute str(const std::string& s) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kString;
  a.s = s;
  return a;
}
ir::Attribute one(int64_t v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kInt;
  a.i = v;
  return a;
}

TEST(WindowGeometry, SamePadsPutTheOddPadWhereTheModeSays) {
  // in 5, kernel 4, stride 1: out 5, total pad 3.
  const Dims x = {1, 1, 5}, w = {1, 1, 4};
  auto upper = resolve_window(window_node("Conv", 11, {{"auto_pad", str("SAME_UPPER")}}), x, &w);
  auto lower = resolve_window(window_node("Conv", 11, {{"auto_pad", str("SAME_LOWER")}}), x, &w);
  ASSERT_TRUE(upper.ok()) << upper.status().to_string();
  ASSERT_TRUE(lower.ok()) << lower.status().to_string();
  EXPECT_EQ(upper->out, Dims{5});
  EXPECT_EQ(upper->pad_begin, Dims{1});
  EXPECT_EQ(upper->pad_end, Dims{2});
  EXPECT_EQ(lower->pad_begin, Dims{2});
  EXPECT_EQ(lower->pad_end, Dims{1});
}

TEST(WindowGeometry, ValidDilationsAndStridesIn3D) {
  const Dims x = {2, 3, 9, 8, 7}, w = {4, 3, 3, 2, 1};
  auto g = resolve_window(
      window_node("Conv", 11,
                  {{"auto_pad", str("VALID")}, {"strides", ints({2, 1, 3})}, {"dilations", ints({2, 3, 1})}}),
      x, &w);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->rank(), 3u);
  EXPECT_EQ(g->kernel, (Dims{3, 2, 1}));
  EXPECT_EQ(g->extent(0), 5);
  EXPECT_EQ(g->out, (Dims{3, 5, 3}));  // (9-5)/2+1, (8-4)/1+1, (7-1)/3+1
  EXPECT_EQ(g->pad_begin, (Dims{0, 0, 0}));
}

TEST(WindowGeometry, CeilModeAddsTheLastWindowOnlyWhenItStartsInside) {
  const Dims x = {1, 1, 6, 5};
  auto g = resolve_window(window_node("MaxPool", 12,
                                      {{"kernel_shape", ints({3, 2})},
                                       {"strides", ints({2, 2})},
                                       {"ceil_mode", one(1)},
                                       {"pads", ints({0, 1, 0, 0})}}),
                          x, nullptr);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  // H: ceil((6-3)/2)+1 = 3 (floor: 2); W: padded 6, ceil((6-2)/2)+1 = 3, the last start 4 < 5+1.
  EXPECT_EQ(g->out, (Dims{3, 3}));
  EXPECT_EQ(g->pad_begin, (Dims{0, 1}));
  EXPECT_EQ(g->pad_end, (Dims{0, 0}));
  // Before opset 10 MaxPool has no ceil_mode: the attribute is not read.
  auto old = resolve_window(
      window_node("MaxPool", 8, {{"kernel_shape", ints({3, 2})}, {"strides", ints({2, 2})}, {"ceil_mode", one(1)}}), x,
      nullptr);
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->out, (Dims{2, 2}));
}

TEST(WindowGeometry, ConvTransposeOutputPaddingIsANegativeEndPad) {
  // in 3, kernel 3, stride 2, output_padding 1: out 2*2+1+3 = 8; pad_end (3-1)*2+3-0-8 = -1.
  const Dims x = {1, 2, 3}, w = {2, 1, 3};
  auto g =
      resolve_window(window_node("ConvTranspose", 11, {{"strides", ints({2})}, {"output_padding", ints({1})}}), x, &w);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->out, Dims{8});
  EXPECT_EQ(g->pad_begin, Dims{0});
  EXPECT_EQ(g->pad_end, Dims{-1});
  // output_shape derives the pads (SAME_UPPER-style split of the surplus).
  auto s =
      resolve_window(window_node("ConvTranspose", 11, {{"strides", ints({2})}, {"output_shape", ints({5})}}), x, &w);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->out, Dims{5});
  EXPECT_EQ(s->pad_begin, Dims{1});  // natural 7, surplus 2: 1 before
  EXPECT_EQ(s->pad_end, Dims{1});
}

TEST(WindowGeometry, ErrorsNameTheNodeAndTheRule) {
  const Dims x = {1, 1, 4, 4}, w = {1, 1, 5, 5};
  auto misfit = resolve_window(window_node("Conv", 11, {}), x, &w);
  ASSERT_FALSE(misfit.ok());
  EXPECT_EQ(misfit.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(misfit.status().message().find("win_node"), std::string::npos) << misfit.status().message();
  EXPECT_NE(misfit.status().message().find("smaller than the (dilated) kernel extent 5"), std::string::npos);
  auto bad_attr = resolve_window(window_node("Conv", 11, {{"strides", ints({1, 0})}}), x, &w);
  ASSERT_FALSE(bad_attr.ok());
  EXPECT_EQ(bad_attr.status().code(), ErrorCode::kInvalidModel);
  EXPECT_NE(bad_attr.status().message().find("win_node"), std::string::npos);
  EXPECT_NE(bad_attr.status().message().find("'strides'"), std::string::npos);
  auto no_kernel = resolve_window(window_node("AveragePool", 19, {}), x, nullptr);
  ASSERT_FALSE(no_kernel.ok());
  EXPECT_NE(no_kernel.status().message().find("kernel_shape"), std::string::npos);
  const Dims flat = {4, 4};
  EXPECT_FALSE(resolve_window(window_node("Conv", 11, {}), flat, &flat).ok());
}

// The reference kernels' output shapes are the resolved ones, for random windows of rank 1 to 3.
TEST(WindowGeometry, MatchesTheReferenceKernelsOnRandomWindows) {
  std::mt19937 rng(7);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const char* kOps[] = {"Conv", "ConvTranspose", "MaxPool", "AveragePool"};
  const char* kPads[] = {"NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"};
  int checked = 0, refused = 0;
  for (int iter = 0; iter < 120; ++iter) {
    const std::string op = kOps[iter % 4];
    const bool pool = op == "MaxPool" || op == "AveragePool";
    const size_t rank = static_cast<size_t>(pick(1, 3));
    Dims x = {1, pick(1, 3)}, w = {pick(1, 3), x[1]}, ks, st, dl, pads(2 * rank);
    if (op == "ConvTranspose") w = {x[1], pick(1, 3)};
    for (size_t d = 0; d < rank; ++d) {
      x.push_back(pick(1, 9));
      ks.push_back(pick(1, 4));
      st.push_back(pick(1, 3));
      dl.push_back(pick(1, 2));
      pads[d] = pick(0, 2), pads[rank + d] = pick(0, 2);
    }
    const std::string auto_pad = kPads[pick(0, 4)];
    GraphBuilder b(19);
    b.input("x", x).output("y");
    std::vector<std::string> in = {"x"};
    if (!pool) {
      w.insert(w.end(), ks.begin(), ks.end());
      b.init("w", kiln::testing::random_tensor(w, static_cast<uint64_t>(iter)));
      in.push_back("w");
    }
    ir::Node& n = b.node(op, in, {"y"});
    if (pool) n.attrs["kernel_shape"] = ints(ks);
    n.attrs["strides"] = ints(st);
    n.attrs["dilations"] = ints(dl);
    if (auto_pad == "NOTSET")
      n.attrs["pads"] = ints(pads);
    else
      n.attrs["auto_pad"] = str(auto_pad);
    if (op == "MaxPool" && pick(0, 1)) n.attrs["ceil_mode"] = one(1);
    const ir::Node node = n;
    auto g = resolve_window(node, x, pool ? nullptr : &w);
    ir::Model m;
    try {
      m = b.finish();  // shape inference
    } catch (const std::exception& e) {
      EXPECT_FALSE(g.ok()) << op << " " << dims_str(x) << ": inference refused what resolve_window took: " << e.what();
      ++refused;
      continue;
    }
    ASSERT_TRUE(g.ok()) << op << " " << dims_str(x) << ": " << g.status().to_string();
    ops::Interpreter interp(m.graph);
    auto r = interp.run(kiln::testing::random_inputs(*m.graph, 3));
    ASSERT_TRUE(r.ok()) << op << " " << dims_str(x) << ": " << r.status().to_string();
    const ir::TypeInfo& inferred = m.graph->value_types.at("y");
    ASSERT_TRUE(inferred.shape.fully_known());
    Dims want = {x[0], pool ? x[1] : op == "ConvTranspose" ? w[1] : w[0]};
    want.insert(want.end(), g->out.begin(), g->out.end());
    EXPECT_EQ(r.value()[0].tensor.shape(), want) << op << " " << dims_str(x);
    EXPECT_EQ(inferred.shape.concrete(), want) << op << " " << dims_str(x);
    ++checked;
  }
  EXPECT_GT(checked, 60);
  EXPECT_GT(refused, 0);  // some windows do not fit: both refuse them
}

}  // namespace
}  // namespace kiln::ops
