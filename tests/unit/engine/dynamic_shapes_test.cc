// Dynamic shapes: optimization profiles (validation, storage, selection), shape matrices against the
// reference interpreter, memory that follows the actual shapes, and data-dependent outputs.
#include <gtest/gtest.h>

#include "../graph_builder.h"
#include "engine/engine_impl.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"

namespace kiln {
namespace {

using testing::GraphBuilder;
using testing::random_tensor;

// Gives graph input `name` symbolic dims: -1 in `dims` becomes the symbol of the same position in `syms`.
void make_dynamic(ir::Model& m, const std::string& name, const std::vector<std::string>& syms) {
  for (auto& in : m.graph->inputs)
    if (in.name == name)
      for (size_t i = 0; i < syms.size(); ++i)
        if (!syms[i].empty()) in.type.shape.dims[i] = Dim::symbol(syms[i]);
  m.graph->value_types.clear();
  Status s = ops::infer_shapes(*m.graph);
  if (!s.ok()) throw std::runtime_error(s.to_string());
}

std::string to_onnx(const ir::Model& m) { return onnx_import::serialize_model(m).value(); }

// conv(pad 1) -> relu -> conv(stride 2) -> add bias -> relu -> global pool -> gemm; x is [batch,3,h,w].
std::string cnn_onnx() {
  GraphBuilder b(13);
  b.input("x", {1, 3, 16, 16}).output("logits");
  b.init("w1", random_tensor({8, 3, 3, 3}, 1)).init("b1", random_tensor({8}, 2));
  b.init("w2", random_tensor({8, 8, 3, 3}, 3)).init("fc", random_tensor({5, 8}, 4)).init("fcb", random_tensor({5}, 5));
  auto& c1 = b.node("Conv", {"x", "w1", "b1"}, {"c1"});
  GraphBuilder::set_ints(c1, "pads", {1, 1, 1, 1});
  b.node("Relu", {"c1"}, {"r1"});
  auto& c2 = b.node("Conv", {"r1", "w2"}, {"c2"});
  GraphBuilder::set_ints(c2, "strides", {2, 2});
  b.node("Relu", {"c2"}, {"r2"});
  b.node("GlobalAveragePool", {"r2"}, {"pool"});
  b.node("Flatten", {"pool"}, {"flat"});
  auto& gemm = b.node("Gemm", {"flat", "fc", "fcb"}, {"logits"});
  GraphBuilder::set_int(gemm, "transB", 1);
  ir::Model m = b.finish();
  make_dynamic(m, "x", {"batch", "", "height", "width"});
  return to_onnx(m);
}

// Single-head self-attention block on x [batch,seq,16]: softmax(x Wq (x Wk)^T / 4) x Wv + x.
std::string attention_onnx() {
  GraphBuilder b(13);
  b.input("x", {1, 8, 16}).output("y");
  b.init("wq", random_tensor({16, 16}, 11)).init("wk", random_tensor({16, 16}, 12));
  b.init("wv", random_tensor({16, 16}, 13)).init("scale", Tensor::from_vector<float>(DataType::kFloat32, {}, {0.25f}));
  b.node("MatMul", {"x", "wq"}, {"q"});
  b.node("MatMul", {"x", "wk"}, {"k"});
  b.node("MatMul", {"x", "wv"}, {"v"});
  auto& t = b.node("Transpose", {"k"}, {"kt"});
  GraphBuilder::set_ints(t, "perm", {0, 2, 1});
  b.node("MatMul", {"q", "kt"}, {"s"});
  b.node("Mul", {"s", "scale"}, {"ss"});
  auto& sm = b.node("Softmax", {"ss"}, {"p"});
  GraphBuilder::set_int(sm, "axis", -1);
  b.node("MatMul", {"p", "v"}, {"o"});
  b.node("Add", {"o", "x"}, {"y"});
  ir::Model m = b.finish();
  make_dynamic(m, "x", {"batch", "seq", ""});
  return to_onnx(m);
}

Profile profile(const std::string& input, Dims mn, Dims opt, Dims mx, const std::string& name = "") {
  Profile p;
  p.name = name;
  p.inputs[input] = {std::move(mn), std::move(opt), std::move(mx)};
  return p;
}

std::shared_ptr<Engine> build(const std::string& onnx, std::vector<Profile> profiles) {
  BuilderConfig cfg;
  cfg.profiles = std::move(profiles);
  return Builder(cfg).build_from_memory(onnx);
}

std::string build_error(const std::string& onnx, std::vector<Profile> profiles) {
  try {
    build(onnx, std::move(profiles));
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInvalidArgument) << e.what();
    return e.what();
  }
  return "built";
}

// Runs the engine and the reference interpreter (unoptimized model) on the same random input; returns
// the max abs difference and checks shapes.
double diff_vs_reference(const Engine& e, const std::string& onnx, const std::string& in, const std::string& out,
                         const Dims& shape, uint64_t seed, int* profile = nullptr, size_t* act = nullptr) {
  Tensor x = random_tensor(shape, seed);
  auto ctx = e.create_context();
  ctx->set_input(in, HostTensor::f32(shape, x.data<float>()));
  ctx->run();
  HostTensor y = ctx->output(out);
  if (profile) *profile = ctx->profile_index();
  if (act) *act = ctx->activation_bytes();
  auto model = onnx_import::parse_model(onnx, "").value();
  auto ref = testing::run(model, {{in, ops::Value(x)}})[0].tensor;
  EXPECT_EQ(y.shape, ref.shape()) << dims_str(shape);
  EXPECT_EQ(ctx->output_shape(out), ref.shape());
  if (y.shape != ref.shape()) return INFINITY;
  double worst = 0;
  for (int64_t i = 0; i < ref.numel(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(y.as<float>()[i]) - ref.data<float>()[i]));
  return worst;
}

std::string run_error(const Engine& e, const std::string& in, const Dims& shape) {
  Tensor x = random_tensor(shape, 1);
  auto ctx = e.create_context();
  ctx->set_input(in, HostTensor::f32(shape, x.data<float>()));
  try {
    ctx->run();
  } catch (const Error& err) {
    EXPECT_EQ(err.category(), ErrorCategory::kOutOfRange);  // a shape outside the profiles
    return err.what();
  }
  return "ran";
}

TEST(DynamicShapes, CnnShapeMatrixMatchesReference) {
  std::string onnx = cnn_onnx();
  auto e = build(onnx, {profile("x", {1, 3, 8, 8}, {2, 3, 16, 16}, {4, 3, 32, 32})});
  auto loaded = Engine::deserialize(e->serialize());
  std::vector<Dims> points = {{1, 3, 8, 8},  {2, 3, 16, 16}, {4, 3, 32, 32}, {3, 3, 17, 25},
                              {1, 3, 9, 31}, {4, 3, 8, 32},  {2, 3, 31, 9},  {1, 3, 25, 25}};
  uint64_t seed = 100;
  for (const auto& s : points)
    EXPECT_LT(diff_vs_reference(*loaded, onnx, "x", "logits", s, seed++), 1e-4) << dims_str(s);
  std::string msg = run_error(*loaded, "x", {1, 3, 33, 16});
  EXPECT_EQ(msg,
            "input 'x' [batch,3,height,width] has shape [1,3,33,16] outside profile 0 (min [1,3,8,8] max [4,3,32,32]): "
            "dim 2 ('height') = 33 > max 32 — build with a wider --max-shapes");
  msg = run_error(*loaded, "x", {1, 3, 7, 16});
  EXPECT_NE(msg.find("dim 2 ('height') = 7 < min 8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--min-shapes"), std::string::npos) << msg;
}

TEST(DynamicShapes, AttentionShapeMatrixMatchesReference) {
  std::string onnx = attention_onnx();
  auto e = build(onnx, {profile("x", {1, 1, 16}, {2, 16, 16}, {4, 128, 16})});
  std::vector<Dims> points = {{1, 1, 16}, {2, 16, 16}, {4, 128, 16}, {3, 127, 16}, {1, 2, 16}, {4, 33, 16}};
  uint64_t seed = 7;
  for (const auto& s : points) EXPECT_LT(diff_vs_reference(*e, onnx, "x", "y", s, seed++), 1e-4) << dims_str(s);
  std::string msg = run_error(*e, "x", {1, 129, 16});
  EXPECT_NE(msg.find("input 'x' [batch,seq,16] has shape [1,129,16] outside profile 0 (min [1,1,16] max [4,128,16])"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("dim 1 ('seq') = 129 > max 128"), std::string::npos) << msg;
}

TEST(DynamicShapes, TwoProfilesPickTheOneThatFits) {
  std::string onnx = cnn_onnx();
  auto e = build(onnx, {profile("x", {1, 3, 16, 16}, {2, 3, 16, 16}, {4, 3, 16, 16}, "small"),
                        profile("x", {8, 3, 16, 16}, {16, 3, 16, 16}, {32, 3, 16, 16}, "large")});
  auto loaded = Engine::deserialize(e->serialize());
  ASSERT_EQ(loaded->profiles().size(), 2u);
  EXPECT_EQ(loaded->profiles()[1].name, "large");
  int p = -2;
  EXPECT_LT(diff_vs_reference(*loaded, onnx, "x", "logits", {3, 3, 16, 16}, 1, &p), 1e-4);
  EXPECT_EQ(p, 0);
  EXPECT_LT(diff_vs_reference(*loaded, onnx, "x", "logits", {16, 3, 16, 16}, 2, &p), 1e-4);
  EXPECT_EQ(p, 1);
  // set_input_shape selects before any data and resolves output shapes.
  auto ctx = loaded->create_context();
  ctx->set_input_shape("x", {16, 3, 16, 16});
  EXPECT_EQ(ctx->profile_index(), 1);
  EXPECT_EQ(ctx->output_shape("logits"), (std::vector<int64_t>{16, 5}));
  ctx->set_input_shape("x", {2, 3, 16, 16});
  EXPECT_EQ(ctx->profile_index(), 0);
  // Between the profiles: the error lists both ranges.
  try {
    ctx->set_input_shape("x", {6, 3, 16, 16});
    ADD_FAILURE() << "batch 6 accepted";
  } catch (const Error& err) {
    std::string m = err.what();
    EXPECT_NE(m.find("input 'x' [batch,3,16,16] has shape [6,3,16,16] outside profile 0 'small' (min [1,3,16,16] max "
                     "[4,3,16,16]): dim 0 ('batch') = 6 > max 4, profile 1 'large' (min [8,3,16,16] max "
                     "[32,3,16,16]): dim 0 ('batch') = 6 < min 8 (fits no profile) — build with a wider "
                     "--min-shapes/--max-shapes or add a --profile that covers it"),
              std::string::npos)
        << m;
  }
  // A forced profile is checked.
  ctx->set_profile(1);
  EXPECT_THROW(ctx->set_input_shape("x", {3, 3, 16, 16}), Error);
  EXPECT_THROW(ctx->set_profile(2), Error);
  ctx->set_profile(-1);
  ctx->set_input_shape("x", {3, 3, 16, 16});
  EXPECT_EQ(ctx->profile_index(), 0);
}

TEST(DynamicShapes, ProfilesAreValidatedAgainstTheModel) {
  std::string onnx = cnn_onnx();
  std::string m = build_error(onnx, {profile("y", {1, 3, 8, 8}, {1, 3, 8, 8}, {1, 3, 8, 8})});
  EXPECT_NE(m.find("names input 'y', which the model does not have (inputs: x [batch,3,height,width])"),
            std::string::npos)
      << m;
  m = build_error(onnx, {profile("x", {1, 8, 8}, {1, 8, 8}, {1, 8, 8})});
  EXPECT_NE(m.find("input 'x' has rank 4 [batch,3,height,width] in the model, the profile gives rank 3"),
            std::string::npos)
      << m;
  m = build_error(onnx, {profile("x", {1, 1, 8, 8}, {1, 3, 8, 8}, {1, 3, 8, 8})});
  EXPECT_NE(m.find("dim 1 is fixed to 3 in the model"), std::string::npos) << m;
  m = build_error(onnx, {profile("x", {1, 3, 8, 8}, {4, 3, 8, 8}, {2, 3, 8, 8})});
  EXPECT_NE(m.find("dim 0 ('batch'): need 0 <= min <= opt <= max, got min 1, opt 4, max 2"), std::string::npos) << m;

  // Two inputs sharing the symbols batch/seq: one range binds both; conflicting ranges are refused;
  // an input with an unbound symbol needs its own range.
  GraphBuilder b(13);
  b.input("a", {1, 4}).input("m", {1, 4}).input("z", {1, 2}).output("s").output("t");
  b.node("Add", {"a", "m"}, {"s"});
  b.node("Identity", {"z"}, {"t"});
  ir::Model mm = b.finish();
  make_dynamic(mm, "a", {"batch", "seq"});
  make_dynamic(mm, "m", {"batch", "seq"});
  make_dynamic(mm, "z", {"", "other"});
  std::string two = to_onnx(mm);
  Profile p = profile("a", {1, 1}, {2, 8}, {4, 16});
  p.inputs["z"] = {{1, 1}, {1, 1}, {1, 3}};
  auto e = build(two, {p});
  ASSERT_EQ(e->profiles()[0].inputs.count("m"), 1u);
  EXPECT_EQ(e->profiles()[0].inputs.at("m").max, (Dims{4, 16}));
  Profile bad = p;
  bad.inputs["m"] = {{1, 1}, {2, 8}, {4, 32}};
  m = build_error(two, {bad});
  EXPECT_NE(m.find("'seq', so they must be equal"), std::string::npos) << m;
  Profile missing = profile("a", {1, 1}, {2, 8}, {4, 16});
  m = build_error(two, {missing});
  EXPECT_NE(m.find("gives no range for dynamic input 'z' [1,other] (dim 1 ('other') is not bound"), std::string::npos)
      << m;
}

TEST(DynamicShapes, AttentionMemoryFollowsTheSequenceLength) {
  std::string onnx = attention_onnx();
  auto e = build(onnx, {profile("x", {1, 1, 16}, {1, 16, 16}, {1, 512, 16})});
  auto j = nlohmann::json::parse(e->inspect_json());
  size_t opt = j["profiles"][0]["memory"]["opt"], mx = j["profiles"][0]["memory"]["max"];
  EXPECT_EQ(j["profiles"][0]["inputs"][0]["dims"], "[1,seq,16]");  // batch is 1 in the profile: pinned
  EXPECT_LE(opt * 10, mx) << opt << " vs " << mx;
  size_t at16 = 0, at512 = 0;
  diff_vs_reference(*e, onnx, "x", "y", {1, 16, 16}, 1, nullptr, &at16);
  diff_vs_reference(*e, onnx, "x", "y", {1, 512, 16}, 2, nullptr, &at512);
  EXPECT_EQ(at16, opt);
  EXPECT_EQ(at512, mx);
  EXPECT_LE(at16 * 10, at512) << at16 << " vs " << at512;
}

// boxes [1,n,4], scores [1,1,n] -> NonMaxSuppression (no fixed bound on the result) -> Gather of the
// kept boxes; NonZero of scores > 0.5, Unique of the kept box indices, TopK with k given at run time.
std::string detection_onnx() {
  GraphBuilder b(13);
  b.input("boxes", {1, 4, 4}).input("scores", {1, 1, 4}).input("k", {1}, DataType::kInt64);
  b.output("selected").output("kept_boxes").output("nz").output("uniq").output("top").output("top_idx");
  b.init("max_out", Tensor::from_vector<int64_t>(DataType::kInt64, {1}, {1000000}));
  b.init("iou", Tensor::from_vector<float>(DataType::kFloat32, {1}, {0.5f}));
  b.init("thr", Tensor::from_vector<float>(DataType::kFloat32, {1}, {0.3f}));
  b.init("half", Tensor::from_vector<float>(DataType::kFloat32, {}, {0.5f}));
  b.init("col2", Tensor::from_vector<int64_t>(DataType::kInt64, {1}, {2}));
  b.node("NonMaxSuppression", {"boxes", "scores", "max_out", "iou", "thr"}, {"selected"});
  auto& g1 = b.node("Gather", {"selected", "col2"}, {"sel_col"});
  GraphBuilder::set_int(g1, "axis", 1);
  b.node("Flatten", {"sel_col"}, {"sel_flat2"});
  auto& sq = b.node("Squeeze", {"sel_flat2"}, {"sel_idx"});
  (void)sq;
  auto& g2 = b.node("Gather", {"boxes", "sel_idx"}, {"kept_boxes"});
  GraphBuilder::set_int(g2, "axis", 1);
  b.node("Greater", {"scores", "half"}, {"gt"});
  b.node("NonZero", {"gt"}, {"nz"});
  b.node("Unique", {"sel_idx"}, {"uniq"});
  b.node("Flatten", {"scores"}, {"sflat"});
  auto& tk = b.node("TopK", {"sflat", "k"}, {"top", "top_idx"});
  GraphBuilder::set_int(tk, "axis", 1);
  ir::Model m = b.finish();
  make_dynamic(m, "boxes", {"", "n", ""});
  make_dynamic(m, "scores", {"", "", "n"});
  return to_onnx(m);
}

TEST(DynamicShapes, DataDependentOutputsMatchReference) {
  std::string onnx = detection_onnx();
  auto e = build(onnx, {profile("boxes", {1, 0, 4}, {1, 16, 4}, {1, 64, 4})});
  ASSERT_EQ(e->profiles()[0].inputs.count("scores"), 1u);  // derived from the shared symbol n
  auto model = onnx_import::parse_model(onnx, "").value();
  struct Case {
    int n;
    float score;  // all scores (below thr -> 0 boxes)
    bool overlap;
    int64_t k;
    size_t want_boxes;
  };
  for (Case c : {Case{8, 0.1f, false, 3, 0}, Case{8, 0.9f, true, 1, 1}, Case{40, 0.9f, false, 40, 40},
                 Case{1, 0.8f, false, 1, 1}, Case{64, 0.6f, false, 10, 64}}) {
    Tensor boxes(DataType::kFloat32, {1, c.n, 4}), scores(DataType::kFloat32, {1, 1, c.n});
    for (int i = 0; i < c.n; ++i) {
      float off = c.overlap ? 0.01f * i : 2.0f * i;  // overlapping boxes collapse to one
      float v[4] = {off, off, off + 1, off + 1};
      for (int k = 0; k < 4; ++k) boxes.data<float>()[i * 4 + k] = v[k];
      scores.data<float>()[i] = c.score + 0.001f * i;
    }
    Tensor k = Tensor::from_vector<int64_t>(DataType::kInt64, {1}, {c.k});
    auto ctx = e->create_context();
    ctx->set_input("boxes", HostTensor::borrow(kFloat32, boxes.shape(), boxes.raw(), boxes.nbytes()));
    ctx->set_input("scores", HostTensor::borrow(kFloat32, scores.shape(), scores.raw(), scores.nbytes()));
    ctx->set_input("k", HostTensor::borrow(kInt64, {1}, k.raw(), k.nbytes()));
    // Before the run, the data-dependent dims are unknown (-1); after it, the actual ones.
    EXPECT_EQ(ctx->output_shape("selected"), (std::vector<int64_t>{-1, 3}));
    ctx->run();
    auto ref =
        testing::run(model, {{"boxes", ops::Value(boxes)}, {"scores", ops::Value(scores)}, {"k", ops::Value(k)}});
    auto names = ctx->output_names();
    for (size_t i = 0; i < names.size(); ++i) {
      HostTensor got = ctx->output(names[i]);
      const Tensor& want = ref[i].tensor;
      ASSERT_EQ(got.shape, want.shape()) << names[i] << " n=" << c.n;
      EXPECT_EQ(ctx->output_shape(names[i]), want.shape());
      ASSERT_EQ(got.nbytes, want.nbytes());
      EXPECT_EQ(std::memcmp(got.data.get(), want.raw(), want.nbytes()), 0) << names[i] << " n=" << c.n;
    }
    EXPECT_EQ(ctx->output("selected").shape[0], static_cast<int64_t>(c.want_boxes)) << "n=" << c.n;
    EXPECT_EQ(ctx->output("top").shape[1], c.k);
  }
}

}  // namespace
}  // namespace kiln
