// The bandwidth kernels of kiln's own CUDA tactics (cuda_elementwise.cu, cuda_layers.cu) against the
// reference kernels, on the shapes that pick each fast path: 16-byte packs and their tails (rows of 1,
// 3, 17, 129, 1000, 4097 elements), every broadcast pattern through the collapsed 32-bit index space
// (scalar, row, column, middle axes, both operands broadcast), one-warp-per-row Softmax/LayerNorm up to
// 1024 elements and the block kernels past it, the tiled transpose and the widened copies of Transpose;
// kiln.FusedElementwise on CUDA (chains of several lengths, broadcast inputs); an engine built with
// --strict-tactics; and, on the CPU, the FastDiv arithmetic, the collapse and the CUDA target's
// fuse_elementwise. GPU tests skip without a GPU.
//
// Tolerances follow cuda_reduced_test.cc: inputs drawn in float32 and rounded once to the dtype, the
// reference run in float32 on the rounded values; what is left is float32 arithmetic and the one
// rounding of the output (u = 2^-11 float16, 2^-8 bfloat16, 0 float32).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "../engine_util.h"
#include "../graph_builder.h"
#include "backends/cuda/cuda_index.h"
#include "backends/registry.h"
#include "cuda_test_util.h"
#include "engine/engine_impl.h"
#include "engine/storage_dtypes.h"
#include "kiln/kiln.h"
#include "layer_case.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "passes/pass.h"

namespace kiln {
namespace {

using testing::LayerCase;
using testing::make_node;
using testing::random_tensor;
using GB = testing::GraphBuilder;

const DataType kAll[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16};
const int64_t kRowSizes[] = {1, 3, 17, 129, 1000, 4097};

double roundoff(DataType dt) {
  return dt == DataType::kFloat16 ? std::ldexp(1.0, -11) : dt == DataType::kBFloat16 ? std::ldexp(1.0, -8) : 0.0;
}
double subnormal(DataType dt) { return dt == DataType::kFloat16 ? std::ldexp(1.0, -25) : 0.0; }

std::string tactic(const char* base, DataType dt) {
  return std::string(base) + (dt == DataType::kFloat16 ? "_f16" : dt == DataType::kBFloat16 ? "_bf16" : "") + "_cuda";
}

// The case with its float32 inputs rounded to dt (what the tactic reads) and widened back (the reference's).
void split(const LayerCase& lc, DataType dt, LayerCase* reduced, LayerCase* exact) {
  *reduced = lc, *exact = lc;
  for (size_t i = 0; i < lc.inputs.size(); ++i)
    if (lc.inputs[i].defined() && lc.inputs[i].dtype() == DataType::kFloat32) {
      reduced->inputs[i] = lc.inputs[i].cast(dt).value();
      exact->inputs[i] = reduced->inputs[i].cast(DataType::kFloat32).value();
    }
}

// Runs `name` on lc in dt; |got - want| <= atol + rtol |want| per element (NaN where the reference has NaN).
void check(const backends::DeviceRuntime& rt, const std::string& name, const LayerCase& lc, DataType dt, double atol,
           double rtol) {
  const backends::Tactic* t = backends::find_tactic(name);
  ASSERT_NE(t, nullptr) << name;
  LayerCase reduced, exact;
  split(lc, dt, &reduced, &exact);
  std::vector<Tensor> want = testing::reference_outputs(exact);
  ASSERT_FALSE(want.empty()) << "the reference rejects the case " << lc.node.op_type;
  auto got = testing::run_on_gpu(rt, *t, reduced, false, dt);
  ASSERT_TRUE(got.ok()) << name << ": " << got.status().message();
  Tensor g =
      got.value()[0].dtype() == DataType::kFloat32 ? got.value()[0] : got.value()[0].cast(DataType::kFloat32).value();
  ASSERT_EQ(g.shape(), want[0].shape()) << name;
  std::string dims;
  for (const Tensor& x : reduced.inputs) dims += (x.defined() ? x.describe() : std::string("-")) + " ";
  for (int64_t i = 0; i < g.numel(); ++i) {
    double w = want[0].get_f64(i), v = g.get_f64(i);
    if (std::isnan(w)) {
      ASSERT_TRUE(std::isnan(v)) << name << " " << dims << "element " << i << ": got " << v << ", want NaN";
      continue;
    }
    ASSERT_LE(std::fabs(v - w), atol + rtol * std::fabs(w))
        << name << " on " << lc.node.op_type << " " << dims << "element " << i << ": got " << v << ", want " << w;
  }
}

// ---------------------------------------------------------------- CPU: index arithmetic and the pass

TEST(CudaIndex, FastDivMatchesDivision) {
  std::mt19937 rng(5);
  std::vector<uint32_t> divisors = {1,   2,   3,    5,    7,     12,    64,       127,
                                    128, 129, 1000, 4097, 65535, 65536, 1u << 30, (1u << 31) - 1};
  for (int k = 0; k < 200; ++k) divisors.push_back(1 + rng() % ((1u << 31) - 1));
  for (int k = 0; k < 200; ++k) divisors.push_back(1 + rng() % 5000);
  for (uint32_t d : divisors) {
    backends::cuda::FastDiv f(d);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, d + 1, (1u << 31) - 1, (1u << 31) - 1 - ((1u << 31) - 1) % d};
    for (int k = 0; k < 300; ++k) ns.push_back(rng() % (1u << 31));
    for (uint32_t n : ns) {
      if (n >= (1u << 31)) continue;
      ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
    }
  }
}

TEST(CudaIndex, CollapseMergesContiguousAndDropsUnitDims) {
  // [32, 12, 128, 128] + [32, 1, 1, 128] (BERT's mask): [32, 1536, 128], b strides [128, 0, 1].
  int64_t dims[] = {32, 12, 128, 128}, a[] = {196608, 16384, 128, 1}, b[] = {128, 0, 0, 1};
  const int64_t* s[] = {a, b};
  auto c = backends::cuda::collapse<2>(4, dims, s);
  ASSERT_EQ(c.rank, 3);
  EXPECT_EQ(c.dims[0], 32);
  EXPECT_EQ(c.dims[1], 1536);
  EXPECT_EQ(c.dims[2], 128);
  EXPECT_EQ(c.strides[0][0], 196608);
  EXPECT_EQ(c.strides[0][1], 128);
  EXPECT_EQ(c.strides[1][0], 128);
  EXPECT_EQ(c.strides[1][1], 0);
  EXPECT_EQ(c.strides[1][2], 1);
  // A transpose keeps its axes apart; unit dims go.
  int64_t td[] = {3, 1, 5}, ti[] = {1, 99, 3}, to[] = {5, 5, 1};
  const int64_t* ts[] = {ti, to};
  auto t = backends::cuda::collapse<2>(3, td, ts);
  ASSERT_EQ(t.rank, 2);
  EXPECT_EQ(t.dims[0], 3);
  EXPECT_EQ(t.dims[1], 5);
  EXPECT_EQ(t.strides[0][0], 1);
  EXPECT_EQ(t.strides[0][1], 3);
}

int count_op(const ir::Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes) n += node.op_type == op;
  return n;
}

TEST(CudaFusePass, FusesElementwiseChainsForCudaTargets) {
  Target cuda, cpu;
  cuda.device = {DeviceKind::kCUDA, 0};
  cpu.device = {DeviceKind::kCPU, 0};
  {  // Mul by a row, Add a scalar, Sub a column, Relu, Sigmoid: one node for CUDA, as for the CPU.
    GB b(13);
    b.input("x", {2, 3, 4}).input("z", {3, 1}).output("y");
    b.init("scale", random_tensor({4}, 1)).init("shift", Tensor::scalar<float>(DataType::kFloat32, 0.25f));
    b.node("Mul", {"x", "scale"}, {"a"});
    b.node("Add", {"a", "shift"}, {"b"});
    b.node("Sub", {"b", "z"}, {"c"});
    b.node("Relu", {"c"}, {"d"});
    b.node("Sigmoid", {"d"}, {"y"});
    ir::Model m = b.finish();
    auto r = passes::fuse_elementwise_for(*m.graph, cuda);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r.value(), 1);
    ASSERT_EQ(m.graph->nodes.size(), 1u);
    EXPECT_EQ(m.graph->nodes[0].op_type, "FusedElementwise");
    EXPECT_EQ(m.graph->nodes[0].attr("body")->g->nodes.size(), 5u);
  }
  {  // Cos has no CUDA kernel: the chain fuses around it for CUDA, whole for the CPU.
    auto build = [] {
      GB b(13);
      b.input("x", {5, 6}).output("y");
      b.node("Exp", {"x"}, {"e"});
      b.node("Tanh", {"e"}, {"t"});
      b.node("Cos", {"t"}, {"c"});
      b.node("Neg", {"c"}, {"y"});
      return b.finish();
    };
    ir::Model m = build();
    ASSERT_EQ(passes::fuse_elementwise_for(*m.graph, cuda).value(), 1);
    EXPECT_EQ(count_op(*m.graph, "Cos"), 1);
    EXPECT_EQ(count_op(*m.graph, "FusedElementwise"), 1);
    EXPECT_EQ(count_op(*m.graph, "Neg"), 1);  // alone after Cos: a single node does not fuse
    ir::Model c = build();
    ASSERT_EQ(passes::fuse_elementwise_for(*c.graph, cpu).value(), 1);
    EXPECT_EQ(c.graph->nodes.size(), 1u);
  }
  {  // Clip with min/max inputs stays a node of its own on CUDA.
    GB b(13);
    b.input("x", {4, 4}).output("y");
    b.init("lo", Tensor::scalar<float>(DataType::kFloat32, -1.f))
        .init("hi", Tensor::scalar<float>(DataType::kFloat32, 1.f));
    b.node("Relu", {"x"}, {"r"});
    b.node("Clip", {"r", "lo", "hi"}, {"y"});
    ir::Model m = b.finish();
    EXPECT_EQ(passes::fuse_elementwise_for(*m.graph, cuda).value(), 0);
    EXPECT_EQ(count_op(*m.graph, "Clip"), 1);
  }
}

// ---------------------------------------------------------------- GPU: elementwise

TEST(CudaFastKernels, BinaryEveryBroadcastPattern) {
  KILN_SKIP_WITHOUT_GPU();
  const char* ops[] = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu"};
  int c = 0;
  for (DataType dt : kAll) {
    const double u = roundoff(dt);
    for (int64_t n : kRowSizes) {
      const int64_t r = 3;
      // (a, b) pairs: same shape, scalar, rank-0 scalar, row, column, middle axes (BERT's mask), a
      // middle axis only, both broadcast, and the first operand broadcast.
      const std::vector<std::pair<Dims, Dims>> patterns = {{{r, n}, {r, n}},
                                                           {{r, n}, {1}},
                                                           {{r, n}, {}},
                                                           {{2, r, n}, {n}},
                                                           {{r, n}, {r, 1}},
                                                           {{2, r, 2, n}, {2, 1, 1, n}},
                                                           {{2, r, 2, n}, {1, r, 1, 1}},
                                                           {{r, 1}, {1, n}},
                                                           {{2, 1, n}, {1, r, 1}},
                                                           {{n}, {r, 2, n}}};
      for (const auto& pattern : patterns) {
        // Named copies, not a structured binding: clang 14 (the sanitizer tree) cannot capture those.
        const Dims& a = pattern.first;
        const Dims& b = pattern.second;
        const std::string op = ops[c % 8];
        ++c;
        // PRelu's slope broadcasts into X only.
        Dims out;
        const bool prelu_ok = b.size() <= a.size() && [&] {
          for (size_t k = 0; k < b.size(); ++k)
            if (b[k] != 1 && b[k] != a[a.size() - b.size() + k]) return false;
          return true;
        }();
        const std::string use = op == "PRelu" && !prelu_ok ? "Add" : op;
        LayerCase lc;
        lc.node = make_node("", use, 2);
        const bool pow = use == "Pow", div = use == "Div";
        lc.inputs.push_back(random_tensor(a, 100 + c, DataType::kFloat32, pow ? 0.2 : -2, 2));
        lc.inputs.push_back(random_tensor(b, 200 + c, DataType::kFloat32, div ? 0.5 : -2, 2));
        lc.constant = {false, c % 3 == 0};
        check(*gpu, tactic("elementwise_binary", dt), lc, dt, 1e-5 + subnormal(dt), u + 1e-5);
      }
    }
  }
}

TEST(CudaFastKernels, BinaryKeepsNaN) {
  KILN_SKIP_WITHOUT_GPU();
  for (DataType dt : kAll)
    for (const char* op : {"Max", "Min", "Add"}) {
      LayerCase lc;
      lc.node = make_node("", op, 2);
      Tensor a = random_tensor({3, 17}, 7);
      for (int64_t i = 0; i < a.numel(); i += 5) a.data<float>()[i] = NAN;
      lc.inputs = {a, random_tensor({17}, 8)};
      lc.constant = {false, false};
      check(*gpu, tactic("elementwise_binary", dt), lc, dt, 1e-5 + subnormal(dt), roundoff(dt) + 1e-5);
    }
}

TEST(CudaFastKernels, UnaryPacksAndTails) {
  KILN_SKIP_WITHOUT_GPU();
  const char* ops[] = {"Gelu", "Erf", "Relu", "Sigmoid", "Tanh", "Exp"};
  int c = 0;
  for (DataType dt : kAll)
    for (int64_t n : kRowSizes)
      for (const Dims& d : {Dims{n}, Dims{3, n}}) {
        const std::string op = ops[c++ % 6];
        LayerCase lc;
        lc.node = make_node("", op, 1);
        if (op == "Gelu") lc.node.opset = 20;
        lc.inputs = {random_tensor(d, 300 + c, DataType::kFloat32, -3, 3)};
        lc.constant = {false};
        check(*gpu, tactic("elementwise_unary", dt), lc, dt, 1e-5 + subnormal(dt), roundoff(dt) + 1e-5);
      }
}

// ---------------------------------------------------------------- GPU: rows

TEST(CudaFastKernels, SoftmaxAndLayerNormRowSizes) {
  KILN_SKIP_WITHOUT_GPU();
  const int64_t sizes[] = {1, 3, 17, 32, 33, 129, 1000, 1024, 1025, 4097};
  int c = 0;
  for (DataType dt : kAll) {
    const double u = roundoff(dt);
    for (int64_t n : sizes)
      for (int kind = 0; kind < 4; ++kind) {  // Softmax, LogSoftmax, LayerNorm with bias, without
        ++c;
        const Dims d = {2, 5, n};
        LayerCase lc;
        if (kind < 2) {
          lc.node = make_node("", kind ? "LogSoftmax" : "Softmax", 1);
          lc.node.opset = 13;
          GB::set_int(lc.node, "axis", -1);
          lc.inputs = {random_tensor(d, 400 + c, DataType::kFloat32, -4, 4)};
          lc.constant = {false};
        } else {
          lc.node = make_node("", "LayerNormalization", kind == 2 ? 3 : 2);
          lc.node.opset = 17;
          GB::set_int(lc.node, "axis", -1);
          lc.inputs = {random_tensor(d, 400 + c, DataType::kFloat32, -3, 3), random_tensor({n}, 500 + c)};
          if (kind == 2) lc.inputs.push_back(random_tensor({n}, 600 + c));
          lc.constant = std::vector<bool>(lc.inputs.size(), true);
          lc.constant[0] = false;
        }
        const double reduction = static_cast<double>(n) * std::ldexp(1.0, -24) * 16;
        check(*gpu, tactic(kind < 2 ? "softmax" : "layer_norm", dt), lc, dt, 1e-4 + reduction + subnormal(dt),
              u + 1e-4);
      }
    // A strided softmax axis (not the last): the block kernel.
    LayerCase lc;
    lc.node = make_node("", "Softmax", 1);
    lc.node.opset = 13;
    GB::set_int(lc.node, "axis", 1);
    lc.inputs = {random_tensor({3, 129, 17}, 700, DataType::kFloat32, -4, 4)};
    lc.constant = {false};
    check(*gpu, tactic("softmax", dt), lc, dt, 1e-4 + 129 * std::ldexp(1.0, -24) * 16 + subnormal(dt), u + 1e-4);
  }
}

// ---------------------------------------------------------------- GPU: transposes

TEST(CudaFastKernels, TransposeTiledAndWidened) {
  KILN_SKIP_WITHOUT_GPU();
  const backends::Tactic* t = backends::find_tactic("transpose_cuda");
  ASSERT_NE(t, nullptr);
  const std::vector<std::pair<Dims, std::vector<int64_t>>> cases = {{{129, 17}, {1, 0}},
                                                                    {{33, 1000}, {1, 0}},
                                                                    {{1, 4097}, {1, 0}},
                                                                    {{2, 17, 3, 129}, {0, 2, 1, 3}},
                                                                    {{2, 16, 3, 64}, {0, 2, 1, 3}},
                                                                    {{2, 3, 17, 129}, {0, 1, 3, 2}},
                                                                    {{2, 3, 32, 64}, {0, 1, 3, 2}},
                                                                    {{3, 5, 7, 9}, {3, 2, 1, 0}},
                                                                    {{4, 6, 8, 16}, {1, 0, 2, 3}},
                                                                    {{5, 3, 40}, {2, 0, 1}},
                                                                    // narrow output rows (J <= 16)
                                                                    {{2, 3, 17, 19}, {0, 2, 3, 1}},
                                                                    {{3, 16, 5, 7}, {0, 2, 3, 1}},
                                                                    {{2, 17, 5, 7}, {0, 2, 3, 1}},
                                                                    {{1, 2, 3, 4097}, {0, 3, 1, 2}},
                                                                    {{3, 4, 2, 5}, {2, 0, 3, 1}}};
  int c = 0;
  for (DataType dt : {DataType::kFloat32, DataType::kFloat16, DataType::kInt64, DataType::kBool})
    for (const auto& [d, perm] : cases) {
      LayerCase lc;
      lc.node = make_node("", "Transpose", 1);
      GB::set_ints(lc.node, "perm", perm);
      lc.inputs = {random_tensor(d, 800 + c++, DataType::kFloat32, -50, 50).cast(dt).value()};
      lc.constant = {false};
      std::vector<Tensor> want = testing::reference_outputs(lc);
      ASSERT_FALSE(want.empty());
      auto got = testing::run_on_gpu(*gpu, *t, lc);
      ASSERT_TRUE(got.ok()) << got.status().message();
      ASSERT_EQ(got.value()[0].shape(), want[0].shape());
      ASSERT_EQ(got.value()[0].dtype(), dt);
      for (int64_t i = 0; i < want[0].numel(); ++i)
        ASSERT_EQ(got.value()[0].get_f64(i), want[0].get_f64(i)) << lc.inputs[0].describe() << " element " << i;
    }
}

// ---------------------------------------------------------------- GPU: kiln.FusedElementwise

// A FusedElementwise case: a chain of `ops` over x (the first input) where each binary op reads the
// next of `sides` (shapes broadcasting into x's).
LayerCase fused_case(const Dims& x, const std::vector<std::string>& ops, const std::vector<Dims>& sides,
                     uint64_t seed) {
  auto body = std::make_shared<ir::Graph>();
  body->name = "fused_body";
  LayerCase lc;
  lc.node = make_node("kiln", "FusedElementwise", 0);
  auto add_input = [&](const Dims& d, double lo) {
    std::string name = "b" + std::to_string(lc.inputs.size());
    body->inputs.push_back({name, ir::TypeInfo::tensor(DataType::kFloat32, SymShape::from_dims(d))});
    lc.node.inputs.push_back("in" + std::to_string(lc.inputs.size()));
    lc.inputs.push_back(random_tensor(d, seed + lc.inputs.size(), DataType::kFloat32, lo, 2));
    lc.constant.push_back(lc.inputs.size() % 2 == 0);
    return name;
  };
  std::string cur = add_input(x, -2);
  size_t side = 0;
  for (size_t k = 0; k < ops.size(); ++k) {
    ir::Node n;
    n.name = "step" + std::to_string(k);
    n.op_type = ops[k];
    n.opset = 17;
    n.inputs = {cur};
    if (ops[k] == "Add" || ops[k] == "Sub" || ops[k] == "Mul" || ops[k] == "Div" || ops[k] == "Max" ||
        ops[k] == "Min" || ops[k] == "PRelu")
      n.inputs.push_back(add_input(sides[side++ % sides.size()], ops[k] == "Div" ? 0.5 : -2));
    if (ops[k] == "Gelu") n.opset = 20;
    cur = k + 1 == ops.size() ? std::string("fused_out") : "t" + std::to_string(k);
    n.outputs = {cur};
    body->nodes.push_back(n);
  }
  body->outputs.push_back({"fused_out", ir::TypeInfo::tensor(DataType::kFloat32, SymShape::from_dims(x))});
  ir::Attribute a;
  a.type = ir::Attribute::Type::kGraph;
  a.g = body;
  lc.node.attrs["body"] = a;
  return lc;
}

TEST(CudaFastKernels, FusedElementwiseChains) {
  KILN_SKIP_WITHOUT_GPU();
  const std::vector<std::vector<std::string>> chains = {
      {"Mul", "Add"},
      {"Add", "Relu", "Mul"},
      {"Mul", "Add", "Sigmoid", "Mul", "Tanh"},
      {"Sub", "Gelu", "Max", "Mul", "Add", "Abs", "Min", "Div"},
      {"Add", "Mul", "Sub", "Mul", "Add", "Mul", "Sub", "Relu", "Add"},  // 9 inputs: declined
  };
  const std::vector<std::pair<Dims, std::vector<Dims>>> shapes = {
      {{3, 17}, {{17}, {3, 1}, {}}},
      {{2, 3, 129}, {{1, 3, 1}, {2, 1, 129}, {1}}},
      {{4097}, {{4097}, {1}}},
      {{2, 5, 1000}, {{2, 1, 1000}, {5, 1}, {2, 5, 1000}}},
      {{1, 3}, {{3}}},
  };
  int seed = 0;
  for (DataType dt : kAll)
    for (size_t k = 0; k < chains.size(); ++k)
      for (const auto& [x, sides] : shapes) {
        LayerCase lc = fused_case(x, chains[k], sides, 1000 + 10 * seed++);
        const backends::Tactic* t = backends::find_tactic(tactic("fused_elementwise", dt));
        ASSERT_NE(t, nullptr);
        if (lc.inputs.size() > 8) {  // the pass never makes these; the tactic says why it declines
          LayerCase reduced, exact;
          split(lc, dt, &reduced, &exact);
          EXPECT_NE(backends::why_declined(*t, testing::cuda_signature(reduced, false, dt)), "");
          continue;
        }
        check(*gpu, tactic("fused_elementwise", dt), lc, dt, 1e-4 + subnormal(dt), roundoff(dt) + 1e-5);
      }
}

// ---------------------------------------------------------------- GPU: an engine, strict

// x [2, 7, 48]: LayerNorm -> (x * w + b) -> Gelu chain -> Transpose heads -> Softmax -> back.
std::string chain_onnx() {
  GB b(17);
  b.input("x", {2, 7, 48}).output("logits");
  b.init("g", random_tensor({48}, 1)).init("be", random_tensor({48}, 2)).init("w", random_tensor({48}, 3));
  b.init("bias", random_tensor({7, 1}, 4)).init("half", Tensor::scalar<float>(DataType::kFloat32, 0.5f));
  b.init("shape", [] {
    Tensor t(DataType::kInt64, {4});
    int64_t v[] = {2, 7, 4, 12};
    for (int k = 0; k < 4; ++k) t.data<int64_t>()[k] = v[k];
    return t;
  }());
  GB::set_int(b.node("LayerNormalization", {"x", "g", "be"}, {"ln"}), "axis", -1);
  b.node("Mul", {"ln", "w"}, {"m"});
  b.node("Add", {"m", "bias"}, {"a"});
  b.node("Tanh", {"a"}, {"t"});
  b.node("Mul", {"t", "half"}, {"h"});
  b.node("Reshape", {"h", "shape"}, {"r"});
  GB::set_ints(b.node("Transpose", {"r"}, {"tr"}), "perm", {0, 2, 1, 3});
  GB::set_int(b.node("Softmax", {"tr"}, {"s"}), "axis", -1);
  GB::set_ints(b.node("Transpose", {"s"}, {"logits"}), "perm", {0, 1, 3, 2});
  return onnx_import::serialize_model(b.finish()).value();
}

// The GPU tests' FusedElementwise cases and engine model are valid: the reference runs them (no GPU needed).
TEST(CudaFastKernelCases, RunOnTheReference) {
  LayerCase lc = fused_case({2, 3, 129}, {"Sub", "Gelu", "Max", "Mul"}, {{1, 3, 1}, {2, 1, 129}, {1}}, 5);
  std::vector<Tensor> y = testing::reference_outputs(lc);
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].shape(), (Dims{2, 3, 129}));
  BuilderConfig cfg;
  cfg.warn = [](const std::string&) {};
  auto e = Builder(cfg).build_from_memory(chain_onnx());
  std::vector<float> out = testing::run_logits(*e, random_tensor({2, 7, 48}, 9));
  EXPECT_EQ(out.size(), 2u * 7 * 48);
}

// The whole pipeline for a CUDA target (no GPU needed) fuses the engine model's elementwise chain.
TEST(CudaFastKernelCases, CudaPipelineFusesTheChain) {
  const std::string bytes = chain_onnx();
  auto m = onnx_import::parse_model(bytes, ".");
  ASSERT_TRUE(m.ok()) << m.status().message();
  Target cuda;
  cuda.device = {DeviceKind::kCUDA, 0};
  auto stats = passes::optimize(m.value(), {}, cuda);
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  const ir::Node* f = nullptr;
  for (const auto& n : m.value().graph->nodes)
    if (n.op_type == "FusedElementwise") f = &n;
  ASSERT_NE(f, nullptr);
  EXPECT_GE(f->attr("body")->g->nodes.size(), 3u);
  EXPECT_EQ(count_op(*m.value().graph, "Tanh"), 0);
}

// With --fp16, the fused chain stores float16 like the single ops it replaces (its body is private:
// no outer reads to keep float32), and the rewritten graph still gives the float32 graph's outputs.
TEST(CudaFastKernelCases, Fp16StorageReachesTheFusedChain) {
  // Storage dtypes ask the CUDA tactics (why_unsupported, no GPU needed): they must be compiled in.
  if (!backends::device_runtime(DeviceKind::kCUDA)) GTEST_SKIP() << "built without the CUDA backend";
  const std::string bytes = chain_onnx();
  auto m = onnx_import::parse_model(bytes, ".");
  ASSERT_TRUE(m.ok()) << m.status().message();
  Target cuda;
  cuda.device = {DeviceKind::kCUDA, 0};
  ASSERT_TRUE(passes::optimize(m.value(), {}, cuda).ok());
  ir::Model fp32 = m.value();
  fp32.graph = ir::deep_copy(*m.value().graph);
  engine::PrecisionPolicy p;
  p.allowed = {DataType::kFloat32, DataType::kFloat16};
  auto typed = detail::infer_at(*m.value().graph, {});
  ASSERT_TRUE(typed.ok()) << typed.status().to_string();
  auto st = engine::assign_storage_dtypes(*m.value().graph, *typed.value(), cuda, p);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  Status inferred = ops::infer_shapes(*m.value().graph);
  ASSERT_TRUE(inferred.ok()) << inferred.to_string();
  const ir::Node* f = nullptr;
  for (const auto& n : m.value().graph->nodes)
    if (n.op_type == "FusedElementwise") f = &n;
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(m.value().graph->value_types.at(f->outputs[0]).elem, DataType::kFloat16);
  EXPECT_LE(testing::max_abs_diff(fp32, m.value()), 1e-2);
}

TEST(CudaFastKernels, StrictEngineFusesAndMatchesTheCpu) {
  KILN_SKIP_WITHOUT_GPU();
  const std::string onnx = chain_onnx();
  BuilderConfig cfg;
  cfg.device = {DeviceKind::kCUDA, 0};
  cfg.strict_tactics = true;
  cfg.warn = [](const std::string&) {};
  auto gpu_engine = Builder(cfg).build_from_memory(onnx);
  int fused = 0;
  for (const auto& l : gpu_engine->impl().layers) {
    if (l.op_type == "Reshape") continue;  // shape work: exempt from --strict-tactics, may stay on the host
    EXPECT_NE(l.kernel.find("cuda"), std::string::npos) << l.name << ": " << l.kernel;
    fused += l.kernel == "fused_elementwise_cuda";
  }
  EXPECT_GE(fused, 1);  // the Mul/Add/Tanh/Mul chain (a pass may take its first Mul into the LayerNorm)
  BuilderConfig cpu_cfg;
  cpu_cfg.warn = [](const std::string&) {};
  auto cpu_engine = Builder(cpu_cfg).build_from_memory(onnx);
  Tensor x = random_tensor({2, 7, 48}, 9);
  std::vector<float> want = testing::run_logits(*cpu_engine, x);
  auto ctx = gpu_engine->create_context();
  for (int run = 0; run < 2; ++run) {
    ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
    ctx->run();
    HostTensor y = ctx->output("logits");
    testing::expect_close(std::vector<float>(y.as<float>(), y.as<float>() + y.numel()), want);
  }
}

}  // namespace
}  // namespace kiln
