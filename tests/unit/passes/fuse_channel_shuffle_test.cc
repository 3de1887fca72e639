// fuse_channel_shuffle: ShuffleNet's Concat -> Reshape -> Transpose -> Reshape -> Split / Slices
// becomes one kiln.ChannelShuffle computing the same values.
#include "pass_test_util.h"

namespace kiln {
namespace {

using namespace testing;  // NOLINT

// x [n, c, h, w] (or the Concat of a and b, c/2 channels each when `concat`) shuffled in `groups`:
// Reshape -> Transpose -> Reshape, into "y".
void add_shuffle(GraphBuilder& b, const std::string& x, int64_t n, int64_t c, int64_t h, int64_t w, int64_t groups) {
  b.init("s5", i64s({n, groups, c / groups, h, w})).init("s4", i64s({n, c, h, w}));
  b.node("Reshape", {x, "s5"}, {"r5"});
  GraphBuilder::set_ints(b.node("Transpose", {"r5"}, {"t5"}), "perm", {0, 2, 1, 3, 4});
  b.node("Reshape", {"t5", "s4"}, {"y"});
}

TEST(FuseChannelShuffle, ConcatShuffleAndSlicesBecomeOneLayer) {
  GraphBuilder b(13);
  b.input("a", {2, 6, 5, 3}).input("b", {2, 6, 5, 3}).output("lo").output("hi");
  GraphBuilder::set_int(b.node("Concat", {"a", "b"}, {"x"}), "axis", 1);
  add_shuffle(b, "x", 2, 12, 5, 3, 2);
  b.init("z", i64s({0})).init("half", i64s({6})).init("end", i64s({INT64_MAX})).init("ax", i64s({1}));
  b.node("Slice", {"y", "half", "end", "ax"}, {"hi"});  // the upper half first: order does not matter
  b.node("Slice", {"y", "z", "half", "ax"}, {"lo"});
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_channel_shuffle, &changed);
  EXPECT_EQ(changed, 1);
  ASSERT_EQ(after.graph->nodes.size(), 1u);
  const ir::Node& f = after.graph->nodes[0];
  EXPECT_EQ(f.op_type, "ChannelShuffle");
  EXPECT_EQ(f.inputs, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.outputs, (std::vector<std::string>{"lo", "hi"}));
  EXPECT_EQ(f.attr_ints("split"), (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(f.attr_int("groups", 0), 2);
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(FuseChannelShuffle, ThreeGroupsIntoASplitWithoutConcat) {
  GraphBuilder b(13);
  b.input("x", {3, 9, 4, 7}).output("p").output("q").output("r");
  add_shuffle(b, "x", 3, 9, 4, 7, 3);
  b.init("sizes", i64s({2, 3, 4}));
  GraphBuilder::set_int(b.node("Split", {"y", "sizes"}, {"p", "q", "r"}), "axis", 1);
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_channel_shuffle, &changed);
  EXPECT_EQ(changed, 1);
  ASSERT_EQ(after.graph->nodes.size(), 1u);
  EXPECT_EQ(after.graph->nodes[0].inputs, (std::vector<std::string>{"x"}));
  EXPECT_EQ(after.graph->nodes[0].attr_ints("split"), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(FuseChannelShuffle, KeepsTheWholeResultWhenItsReadersAreNotAPartition) {
  GraphBuilder b(13);
  b.input("a", {1, 4, 3, 3}).input("b", {1, 4, 3, 3}).output("y").output("s");
  GraphBuilder::set_int(b.node("Concat", {"a", "b"}, {"x"}), "axis", 1);
  add_shuffle(b, "x", 1, 8, 3, 3, 2);
  b.init("z", i64s({0})).init("e", i64s({3})).init("ax", i64s({1}));
  b.node("Slice", {"y", "z", "e", "ax"}, {"s"});  // channels 0..2 only, and y is an output
  ir::Model before = b.finish();
  int changed = 0;
  ir::Model after = apply_pass(before, passes::fuse_channel_shuffle, &changed);
  EXPECT_EQ(changed, 1);
  EXPECT_EQ(count_kiln(*after.graph, "ChannelShuffle"), 1);
  EXPECT_EQ(count_op(*after.graph, "Slice"), 1);
  EXPECT_EQ(find_op(*after.graph, "ChannelShuffle")->outputs, (std::vector<std::string>{"y"}));
  EXPECT_EQ(max_abs_diff(before, after), 0.0);
}

TEST(FuseChannelShuffle, LeavesOtherTransposesAlone) {
  GraphBuilder b(13);
  b.input("x", {2, 6, 4, 4}).output("y").output("t");
  b.init("s5", i64s({2, 2, 3, 4, 4})).init("s4", i64s({2, 6, 4, 4}));
  b.node("Reshape", {"x", "s5"}, {"r5"});
  GraphBuilder::set_ints(b.node("Transpose", {"r5"}, {"t"}), "perm", {0, 2, 1, 3, 4});  // an output itself
  b.node("Reshape", {"t", "s4"}, {"y"});
  ir::Model m = b.finish();
  EXPECT_EQ(passes::fuse_channel_shuffle(*m.graph).value(), 0);

  GraphBuilder c(13);
  c.input("x", {2, 6, 4, 4}).output("y");
  c.init("s5", i64s({2, 2, 3, 4, 4})).init("s4", i64s({2, 6, 4, 4}));
  c.node("Reshape", {"x", "s5"}, {"r5"});
  GraphBuilder::set_ints(c.node("Transpose", {"r5"}, {"t5"}), "perm", {0, 1, 2, 4, 3});  // not the channel swap
  c.node("Reshape", {"t5", "s4"}, {"y"});
  ir::Model m2 = c.finish();
  EXPECT_EQ(passes::fuse_channel_shuffle(*m2.graph).value(), 0);
}

}  // namespace
}  // namespace kiln
