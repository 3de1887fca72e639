// String ops (StringNormalizer, StringConcat, StringSplit, RegexFullMatch) and the ai.onnx.ml
// ops (LabelEncoder, Binarizer, ArrayFeatureExtractor, TreeEnsemble).
#include "cf_test_util.h"

namespace kiln::ops {
namespace {

using namespace cftest;  // NOLINT

TEST(StringNormalizer, CaseInsensitiveStopwordsAndUtf8Case) {
  ir::Node n = make_node("StringNormalizer", {"x"}, {"y"}, 10,
                         {{"stopwords", strs_attr({"MONDAY"})}, {"case_change_action", str_attr("UPPER")}});
  Tensor y = run1(n, {strs({"monday", "Straße", "éclair", "Ωmega"}, {1, 4})});
  EXPECT_EQ(y.shape(), (Dims{1, 3}));
  EXPECT_EQ(strings_of(y), (std::vector<std::string>{"STRAßE", "ÉCLAIR", "ΩMEGA"}));
  n.attrs["case_change_action"] = str_attr("LOWER");
  EXPECT_EQ(strings_of(run1(n, {strs({"ÀB", "Ж"})})), (std::vector<std::string>{"àb", "ж"}));
}

TEST(StringNormalizer, EverythingDroppedGivesOneEmptyString) {
  ir::Node n = make_node("StringNormalizer", {"x"}, {"y"}, 10,
                         {{"stopwords", strs_attr({"a"})}, {"is_case_sensitive", int_attr(1)}});
  Tensor y = run1(n, {strs({"a", "a"})});
  EXPECT_EQ(y.shape(), (Dims{1}));
  EXPECT_EQ(strings_of(y), (std::vector<std::string>{""}));
  auto bad = run(n, {strs({"a", "b"}, {2, 1})});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status().message(), "[C] or [1, C]")) << bad.status().to_string();
}

TEST(StringConcat, Broadcasts) {
  Tensor y = run1(make_node("StringConcat", {"a", "b"}, {"y"}, 20), {strs({"x", "y"}, {2, 1}), strs({"1", "2", "3"})});
  EXPECT_EQ(y.shape(), (Dims{2, 3}));
  EXPECT_EQ(strings_of(y), (std::vector<std::string>{"x1", "x2", "x3", "y1", "y2", "y3"}));
}

TEST(StringSplit, PythonSemantics) {
  ir::Node n = make_node("StringSplit", {"x"}, {"s", "n"}, 20, {{"delimiter", str_attr("--")}});
  auto r = run(n, {strs({"a--b----c", "", "x"})});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value()[0].tensor.shape(), (Dims{3, 4}));
  EXPECT_EQ(strings_of(r.value()[0].tensor),
            (std::vector<std::string>{"a", "b", "", "c", "", "", "", "", "x", "", "", ""}));
  EXPECT_EQ(values(r.value()[1].tensor), (std::vector<double>{4, 1, 1}));
  // No delimiter: runs of whitespace, leading ones skipped; maxsplit keeps the rest whole.
  ir::Node w = make_node("StringSplit", {"x"}, {"s", "n"}, 20, {{"maxsplit", int_attr(1)}});
  auto r2 = run(w, {strs({"  one two  three ", "   "})});
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(strings_of(r2.value()[0].tensor), (std::vector<std::string>{"one", "two  three ", "", ""}));
  EXPECT_EQ(values(r2.value()[1].tensor), (std::vector<double>{2, 0}));
}

TEST(StringSplit, InferenceAddsAnAxis) {
  ir::Graph g;
  g.inputs = {{"x", ir::TypeInfo::tensor(DataType::kString, SymShape({Dim::symbol("B")}))}};
  g.nodes.push_back(make_node("StringSplit", {"x"}, {"s", "n"}, 20));
  ASSERT_TRUE(infer_shapes(g).ok());
  EXPECT_EQ(g.value_types.at("s").shape.rank(), 2u);
  EXPECT_EQ(g.value_types.at("n").str(), "int64[B]");
}

TEST(RegexFullMatch, MatchesWholeStringsAndReportsBadPatterns) {
  ir::Node n = make_node("RegexFullMatch", {"x"}, {"y"}, 20, {{"pattern", str_attr(R"(\w+@(a|b)\.com)")}});
  Tensor y = run1(n, {strs({"me@a.com", "me@c.com", "xme@b.com!"})});
  EXPECT_EQ(values(y), (std::vector<double>{1, 0, 0}));
  n.attrs["pattern"] = str_attr("(unclosed");
  auto bad = run(n, {strs({"a"})});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status().message(), "invalid pattern")) << bad.status().to_string();
  n.attrs["pattern"] = str_attr("(?i)abc");
  auto re2 = run(n, {strs({"a"})});
  ASSERT_FALSE(re2.ok());
  EXPECT_EQ(re2.status().code(), ErrorCode::kUnsupported);
}

// --- ai.onnx.ml ---------------------------------------------------------------------------------

ir::Node ml_node(const std::string& op, std::vector<std::string> ins, std::map<std::string, ir::Attribute> attrs,
                 int opset = 4) {
  return make_node(op, std::move(ins), {"y"}, opset, std::move(attrs), "ai.onnx.ml");
}

TEST(LabelEncoder, MapsWithDefault) {
  ir::Node n = ml_node("LabelEncoder", {"x"},
                       {{"keys_int64s", ints_attr({1, 2})},
                        {"values_strings", strs_attr({"one", "two"})},
                        {"default_string", str_attr("?")}});
  EXPECT_EQ(strings_of(run1(n, {i64({2, 7, 1})})), (std::vector<std::string>{"two", "?", "one"}));
  ir::Node f = ml_node("LabelEncoder", {"x"}, {{"keys_floats", ir::Attribute()}, {"values_int64s", ints_attr({5})}});
  f.attrs["keys_floats"].type = ir::Attribute::Type::kFloats;
  f.attrs["keys_floats"].floats = {0.5f};
  EXPECT_EQ(values(run1(f, {f32({0.5f, 1})})), (std::vector<double>{5, -1}));
  auto bad = run(n, {strs({"a"})});
  ASSERT_FALSE(bad.ok());
  ir::Node v1 = ml_node("LabelEncoder", {"x"}, {{"classes_strings", strs_attr({"a", "b"})}}, 1);
  EXPECT_EQ(values(run1(v1, {strs({"b", "z"})})), (std::vector<double>{1, -1}));
  EXPECT_EQ(strings_of(run1(v1, {i64({0, 5})})), (std::vector<std::string>{"a", "_Unused"}));
}

TEST(Binarizer, Threshold) {
  Tensor y = run1(ml_node("Binarizer", {"x"}, {{"threshold", float_attr(0.5f)}}, 1), {f32({0.2f, 0.5f, 0.7f})});
  EXPECT_EQ(values(y), (std::vector<double>{0, 0, 1}));
}

TEST(ArrayFeatureExtractor, SelectsLastAxis) {
  ir::Node n = ml_node("ArrayFeatureExtractor", {"x", "i"}, {}, 1);
  Tensor y = run1(n, {f32({1, 2, 3, 4, 5, 6}, {2, 3}), i64({2, 0})});
  EXPECT_EQ(y.shape(), (Dims{2, 2}));
  EXPECT_EQ(values(y), (std::vector<double>{3, 1, 6, 4}));
  EXPECT_EQ(run1(n, {f32({1, 2, 3}), i64({1})}).shape(), (Dims{1, 1}));
  auto bad = run(n, {f32({1, 2, 3}), i64({3})});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status().message(), "index 3 is out of range")) << bad.status().to_string();
}

// One tree: node 0 tests x0 <= 1 -> leaf 0 (target 0, w 10) else node 1; node 1 tests x1 in
// {3, 4} -> leaf 1 (target 1, w 20) else leaf 2 (target 0, w 30).
ir::Node tree_node(std::vector<int64_t> true_ids) {
  std::map<std::string, ir::Attribute> a = {
      {"n_targets", int_attr(2)},
      {"tree_roots", ints_attr({0})},
      {"nodes_featureids", ints_attr({0, 1})},
      {"nodes_truenodeids", ints_attr(std::move(true_ids))},
      {"nodes_trueleafs", ints_attr({1, 1})},
      {"nodes_falsenodeids", ints_attr({1, 2})},
      {"nodes_falseleafs", ints_attr({0, 1})},
      {"nodes_modes", tensor_attr(Tensor::from_vector<uint8_t>(DataType::kUInt8, {2}, {0, 6}))},
      {"nodes_splits", tensor_attr(f32({1, 0}))},
      {"membership_values", tensor_attr(f32({3, 4, NAN}))},
      {"leaf_targetids", ints_attr({0, 1, 0})},
      {"leaf_weights", tensor_attr(f32({10, 20, 30}))},
  };
  return ml_node("TreeEnsemble", {"x"}, std::move(a), 5);
}

TEST(TreeEnsemble, ModesMembershipAndTargets) {
  Tensor y = run1(tree_node({0, 1}), {f32({0, 0, 5, 3, 5, 9}, {3, 2})});
  EXPECT_EQ(y.shape(), (Dims{3, 2}));
  EXPECT_EQ(values(y), (std::vector<double>{10, 0, 0, 20, 30, 0}));
}

TEST(TreeEnsemble, MalformedTreesAreErrors) {
  auto r = run(tree_node({0, 7}), {f32({5, 3}, {1, 2})});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "out of range")) << r.status().to_string();
  ir::Node cyc = tree_node({0, 1});
  cyc.attrs["nodes_falseleafs"] = ints_attr({0, 0});
  cyc.attrs["nodes_falsenodeids"] = ints_attr({1, 0});  // node 1 falls back to node 0
  auto c = run(cyc, {f32({5, 9}, {1, 2})});
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(contains(c.status().message(), "cycle")) << c.status().to_string();
}

}  // namespace
}  // namespace kiln::ops
