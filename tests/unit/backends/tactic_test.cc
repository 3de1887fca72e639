// Every tactic of the variant list (backends::all_tactics) against the reference kernel, on random
// layers it claims to support: odd sizes, non-multiples of the vector width, groups, depthwise,
// strides/pads/dilations, 1x1, transposes, every epilogue.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>

#include "../graph_builder.h"
#include "backends/tactic.h"
#include "ops/interpreter.h"

namespace kiln {
namespace {

struct LayerCase {
  ir::Node node;
  std::vector<Tensor> inputs;  // undefined: missing optional input
  std::vector<bool> constant;  // weights (initializers) vs activations
};

void set_string(ir::Node& n, const std::string& a, const std::string& v) {
  ir::Attribute at;
  at.type = ir::Attribute::Type::kString;
  at.s = v;
  n.attrs[a] = at;
}

void add_epilogue(std::mt19937& rng, ir::Node& n) {
  static const char* kActs[] = {"", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSwish", "Clip", "SiLU", "Gelu"};
  std::string act = kActs[rng() % 9];
  if (act.empty()) return;
  set_string(n, "activation", act);
  if (act == "LeakyRelu") testing::GraphBuilder::set_float(n, "activation_alpha", 0.1f);
  if (act == "Gelu" && rng() % 2) set_string(n, "activation_approximate", "tanh");
  if (act == "Clip") {
    if (rng() % 3) testing::GraphBuilder::set_float(n, "activation_min", -0.5f);
    if (rng() % 3) testing::GraphBuilder::set_float(n, "activation_max", 0.7f);
  }
}

ir::Node make_node(const std::string& domain, const std::string& op, size_t n_inputs) {
  ir::Node n;
  n.name = op + "_case";
  n.op_type = op;
  n.domain = domain;
  n.opset = domain.empty() ? 17 : 1;
  for (size_t i = 0; i < n_inputs; ++i) n.inputs.push_back("in" + std::to_string(i));
  n.outputs = {"y"};
  return n;
}

int64_t pick(std::mt19937& rng, int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng() % (hi - lo + 1)); }

// Output spatial size for the residual shape (NOTSET/VALID pads only; SAME keeps ceil(in/stride)).
LayerCase conv_case(std::mt19937& rng, uint64_t seed) {
  bool fused = rng() % 2;
  int64_t n = pick(rng, 1, 2), c, m, group;
  switch (rng() % 3) {
    case 0: group = 1, c = pick(rng, 1, 19), m = pick(rng, 1, 21); break;
    case 1: group = c = m = pick(rng, 1, 24); break;  // depthwise
    default: group = pick(rng, 2, 3), c = group * pick(rng, 1, 5), m = group * pick(rng, 1, 6); break;
  }
  int64_t kh = rng() % 3 == 0 ? 1 : pick(rng, 1, 5), kw = rng() % 3 == 0 ? kh : pick(rng, 1, 4);
  int64_t sh = pick(rng, 1, 3), sw = pick(rng, 1, 2), dh = pick(rng, 1, 2), dw = rng() % 4 ? 1 : 2;
  std::vector<int64_t> pads = {pick(rng, 0, 2), pick(rng, 0, 1), pick(rng, 0, 2), pick(rng, 0, 2)};
  int64_t h = pick(rng, (kh - 1) * dh + 1, 19), w = pick(rng, (kw - 1) * dw + 1, 23);
  std::string auto_pad = std::vector<std::string>{"NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"}[rng() % 5];
  if (auto_pad != "NOTSET") pads = {0, 0, 0, 0};
  if (group == 1 && rng() % 4 == 0) kh = kw = sh = sw = 1, pads = {0, 0, 0, 0};  // pointwise (1x1 GEMM tactics)
  bool bias = rng() % 2, residual = fused && rng() % 2;
  LayerCase lc;
  lc.node = make_node(fused ? "kiln" : "", fused ? "FusedConv" : "Conv", residual ? 4 : (bias ? 3 : 2));
  if (residual && !bias) lc.node.inputs[2] = "";
  auto& nd = lc.node;
  testing::GraphBuilder::set_int(nd, "group", group);
  testing::GraphBuilder::set_ints(nd, "strides", {sh, sw});
  testing::GraphBuilder::set_ints(nd, "dilations", {dh, dw});
  if (auto_pad == "NOTSET")
    testing::GraphBuilder::set_ints(nd, "pads", pads);
  else
    set_string(nd, "auto_pad", auto_pad);
  if (rng() % 2) testing::GraphBuilder::set_ints(nd, "kernel_shape", {kh, kw});
  if (fused) add_epilogue(rng, nd);
  lc.inputs.push_back(testing::random_tensor({n, c, h, w}, seed));
  lc.inputs.push_back(testing::random_tensor({m, c / group, kh, kw}, seed + 1));
  lc.inputs.push_back(bias ? testing::random_tensor({m}, seed + 2) : Tensor());
  lc.constant = {false, true, true, false};
  if (residual) {
    int64_t oh, ow;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER")
      oh = (h + sh - 1) / sh, ow = (w + sw - 1) / sw;
    else
      oh = (h + pads[0] + pads[2] - (kh - 1) * dh - 1) / sh + 1,
      ow = (w + pads[1] + pads[3] - (kw - 1) * dw - 1) / sw + 1;
    lc.inputs.push_back(testing::random_tensor({n, m, oh, ow}, seed + 3));
  }
  return lc;
}

LayerCase matmul_case(std::mt19937& rng, uint64_t seed) {
  bool fused = rng() % 2, constant_b = rng() % 2;
  int64_t rank = pick(rng, 2, 4), m = pick(rng, 1, 37), k = pick(rng, 1, 70), n = pick(rng, 1, 45);
  Dims a(static_cast<size_t>(rank)), b;
  for (int64_t i = 0; i + 2 < rank; ++i) a[i] = pick(rng, 1, 3);
  a[rank - 2] = m, a[rank - 1] = k;
  if (constant_b) {
    b = {k, n};
  } else {
    b = a;
    b[rank - 2] = k, b[rank - 1] = n;
  }
  bool bias = fused && rng() % 2, residual = fused && rng() % 2;
  LayerCase lc;
  lc.node = make_node(fused ? "kiln" : "", fused ? "FusedMatMul" : "MatMul", residual ? 4 : (bias ? 3 : 2));
  if (residual && !bias) lc.node.inputs[2] = "";
  if (fused) add_epilogue(rng, lc.node);
  lc.inputs = {testing::random_tensor(a, seed), testing::random_tensor(b, seed + 1),
               bias ? testing::random_tensor(rng() % 2 ? Dims{n} : Dims{1, n}, seed + 2) : Tensor()};
  lc.constant = {false, constant_b, true, false};
  if (residual) {
    Dims y = a;
    y.back() = n;
    lc.inputs.push_back(testing::random_tensor(y, seed + 3));
  }
  return lc;
}

LayerCase gemm_case(std::mt19937& rng, uint64_t seed) {
  bool fused = rng() % 2, ta = rng() % 2, tb = rng() % 2;
  int64_t m = pick(rng, 1, 33), k = pick(rng, 1, 67), n = pick(rng, 1, 41);
  std::vector<Dims> c_shapes = {{}, {n}, {1, n}, {m, n}, {m, 1}, {1}};
  int which = static_cast<int>(rng() % 7);  // 6: no C
  bool residual = fused && rng() % 2;
  LayerCase lc;
  lc.node = make_node(fused ? "kiln" : "", fused ? "FusedGemm" : "Gemm", residual ? 4 : (which < 6 ? 3 : 2));
  if (residual && which == 6) lc.node.inputs[2] = "";
  auto& nd = lc.node;
  testing::GraphBuilder::set_int(nd, "transA", ta);
  testing::GraphBuilder::set_int(nd, "transB", tb);
  if (rng() % 2) testing::GraphBuilder::set_float(nd, "alpha", 0.75f);
  if (rng() % 2) testing::GraphBuilder::set_float(nd, "beta", 1.5f);
  if (fused) add_epilogue(rng, nd);
  lc.inputs = {testing::random_tensor(ta ? Dims{k, m} : Dims{m, k}, seed),
               testing::random_tensor(tb ? Dims{n, k} : Dims{k, n}, seed + 1),
               which < 6 ? testing::random_tensor(c_shapes[which], seed + 2) : Tensor()};
  lc.constant = {false, true, true, false};
  if (residual) lc.inputs.push_back(testing::random_tensor({m, n}, seed + 3));
  return lc;
}

LayerCase pool_case(std::mt19937& rng, uint64_t seed) {
  static const char* kOps[] = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"};
  std::string op = kOps[rng() % 4];
  LayerCase lc;
  lc.node = make_node("", op, 1);
  lc.node.opset = op == "AveragePool" ? 19 : 12;
  int64_t kh = pick(rng, 1, 4), kw = pick(rng, 1, 3), dh = rng() % 3 ? 1 : 2, dw = 1;
  int64_t h = pick(rng, (kh - 1) * dh + 1, 21), w = pick(rng, kw, 19);
  if (op == "MaxPool" || op == "AveragePool") {
    auto& nd = lc.node;
    testing::GraphBuilder::set_ints(nd, "kernel_shape", {kh, kw});
    testing::GraphBuilder::set_ints(nd, "strides", {pick(rng, 1, 3), pick(rng, 1, 2)});
    if (dh > 1) testing::GraphBuilder::set_ints(nd, "dilations", {dh, dw});
    if (rng() % 3 == 0)
      set_string(nd, "auto_pad", rng() % 2 ? "SAME_UPPER" : "SAME_LOWER");
    else
      testing::GraphBuilder::set_ints(
          nd, "pads", {pick(rng, 0, kh - 1), pick(rng, 0, kw - 1), pick(rng, 0, kh - 1), pick(rng, 0, kw - 1)});
    if (op == "AveragePool") testing::GraphBuilder::set_int(nd, "count_include_pad", rng() % 2);
  }
  lc.inputs = {testing::random_tensor({pick(rng, 1, 2), pick(rng, 1, 19), h, w}, seed)};
  lc.constant = {false};
  return lc;
}

Tensor reference(const LayerCase& lc) {
  const ops::OpSchema* s = ops::OpRegistry::get().find(lc.node.domain, lc.node.op_type, lc.node.opset);
  EXPECT_NE(s, nullptr);
  std::vector<ops::Value> vals;
  vals.reserve(lc.inputs.size());
  for (const auto& t : lc.inputs) vals.emplace_back(t);
  std::vector<const ops::Value*> ins;
  for (size_t i = 0; i < lc.node.inputs.size(); ++i)
    ins.push_back(lc.node.inputs[i].empty() || !lc.inputs[i].defined() ? nullptr : &vals[i]);
  auto r = ops::run_node(lc.node, *s, ins, nullptr);
  if (!r.ok()) return Tensor();
  return r.value()[0].tensor;
}

backends::LayerSignature signature(const LayerCase& lc) {
  backends::LayerSignature sig;
  sig.node = &lc.node;
  for (size_t i = 0; i < lc.node.inputs.size(); ++i) {
    backends::TensorSig t;
    if (!lc.node.inputs[i].empty() && lc.inputs[i].defined()) {
      t.present = true;
      t.dtype = lc.inputs[i].dtype();
      t.shape = lc.inputs[i].shape();
      if (lc.constant[i]) t.constant = &lc.inputs[i];
    }
    sig.inputs.push_back(t);
  }
  sig.outputs.resize(1);
  return sig;
}

TEST(Tactics, EveryTacticMatchesTheReferenceKernel) {
  std::map<std::string, int> checked;
  std::mt19937 rng(1234);
  const char* more = std::getenv("KILN_TACTIC_TEST_CASES");  // longer soak runs
  int cases = more ? std::atoi(more) : 300;
  for (int iter = 0; iter < cases * 4 / 3; ++iter) {
    uint64_t seed = 1000 + 10 * iter;
    LayerCase lc = iter % 4 == 0   ? conv_case(rng, seed)
                   : iter % 4 == 1 ? matmul_case(rng, seed)
                   : iter % 4 == 2 ? gemm_case(rng, seed)
                                   : pool_case(rng, seed);
    Tensor want = reference(lc);
    if (!want.defined()) continue;  // a case the op itself rejects
    backends::LayerSignature sig = signature(lc);
    for (const backends::Tactic* t : backends::all_tactics()) {
      auto ops = t->ops();
      if (std::find(ops.begin(), ops.end(), std::make_pair(lc.node.domain, lc.node.op_type)) == ops.end()) continue;
      if (!t->supports(sig)) continue;
      if (std::getenv("KILN_TACTIC_TEST_TRACE"))
        std::fprintf(stderr, "case %d %s %s %s\n", iter, t->name().c_str(), lc.node.op_type.c_str(),
                     dims_str(lc.inputs[0].shape()).c_str());
      auto prepared = t->prepare(sig);
      ASSERT_TRUE(prepared.ok()) << t->name() << " on case " << iter << ": " << prepared.status().to_string();
      std::vector<Dims> shapes = prepared.value()->output_shapes();
      ASSERT_EQ(shapes.size(), 1u);
      ASSERT_EQ(shapes[0], want.shape()) << t->name() << " on case " << iter << " " << lc.node.op_type;
      Tensor got(DataType::kFloat32, shapes[0]);
      std::vector<const Tensor*> ins;
      for (size_t i = 0; i < lc.node.inputs.size(); ++i)
        ins.push_back(lc.node.inputs[i].empty() || !lc.inputs[i].defined() ? nullptr : &lc.inputs[i]);
      Status st = prepared.value()->run(ins, {&got});
      ASSERT_TRUE(st.ok()) << st.to_string();
      int bad = 0;
      for (int64_t i = 0; i < want.numel(); ++i) {
        float w = want.data<float>()[i], g = got.data<float>()[i];
        if (!(std::fabs(w - g) <= 1e-4f * std::max(1.f, std::fabs(w)))) ++bad;
      }
      EXPECT_EQ(bad, 0) << t->name() << " on case " << iter << " (" << lc.node.op_type << " "
                        << dims_str(lc.inputs[0].shape()) << ")";
      checked[t->name()]++;
    }
  }
  for (const backends::Tactic* t : backends::all_tactics())
    EXPECT_GT(checked[t->name()], 5) << t->name() << " was checked on too few random layers";
}

TEST(Tactics, NamesAreUniqueAndFindable) {
  std::set<std::string> names;
  for (const backends::Tactic* t : backends::all_tactics()) {
    EXPECT_TRUE(names.insert(t->name()).second) << t->name();
    EXPECT_EQ(backends::find_tactic(t->name()), t);
  }
  EXPECT_EQ(backends::find_tactic("no_such_tactic"), nullptr);
}

}  // namespace
}  // namespace kiln
