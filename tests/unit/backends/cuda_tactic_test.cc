// Every CUDA tactic against the reference kernel on random layers it claims to support, run on the
// GPU: odd sizes, broadcasting, every axis, negative steps and indices, transposed and batched
// products, every epilogue. Skipped (with the reason) without the CUDA backend or a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "../graph_builder.h"
#include "backends/registry.h"
#include "cuda_test_util.h"
#include "layer_case.h"

namespace kiln {
namespace {

using testing::LayerCase;
using testing::make_node;
using testing::pick;
using testing::random_tensor;
using testing::set_string;
using GB = testing::GraphBuilder;

Dims random_dims(std::mt19937& rng, int64_t rank, int64_t hi) {
  Dims d;
  for (int64_t i = 0; i < rank; ++i) d.push_back(pick(rng, 1, hi));
  return d;
}

Tensor ints(const std::vector<int64_t>& v, DataType dt = DataType::kInt64) {
  Tensor t(dt, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.set_i64(static_cast<int64_t>(i), v[i]);
  return t;
}

// Runs every CUDA tactic implementing the case's op on it and compares with the reference; counts
// the runs per tactic in `ran`.
void check(const backends::DeviceRuntime& rt, const LayerCase& lc, double atol, double rtol,
           std::map<std::string, int>& ran, bool tf32 = false) {
  std::vector<Tensor> want = testing::reference_outputs(lc);
  ASSERT_FALSE(want.empty()) << "the reference rejects the case " << lc.node.op_type;
  backends::LayerSignature sig = testing::cuda_signature(lc, tf32);
  for (const backends::Tactic* t : backends::all_tactics()) {
    if (!backends::implements(*t, sig)) continue;
    if (!backends::why_declined(*t, sig).empty()) continue;
    auto got = testing::run_on_gpu(rt, *t, lc, tf32);
    if (!got.ok() && got.status().message().find("heuristic offers") != std::string::npos) continue;
    ASSERT_TRUE(got.ok()) << t->name() << " on " << lc.node.op_type << ": " << got.status().message();
    ASSERT_GE(got.value().size(), 1u);
    std::string where;
    std::string dims;
    for (const Tensor& x : lc.inputs) dims += (x.defined() ? x.describe() : std::string("-")) + " ";
    EXPECT_TRUE(testing::close_to(got.value()[0], want[0], atol, rtol, &where))
        << t->name() << " on " << lc.node.op_type << " " << dims << ": " << where;
    ++ran[t->name()];
  }
}

void expect_ran(const std::map<std::string, int>& ran, const std::string& tactic, int at_least) {
  auto it = ran.find(tactic);
  EXPECT_GE(it == ran.end() ? 0 : it->second, at_least) << tactic << " ran on too few cases";
}

TEST(CudaTactics, UnaryOps) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  std::map<std::string, int> ran;
  const char* ops[] = {"Relu", "Sigmoid",   "Tanh",  "Exp",         "Log",        "Sqrt",     "Neg",
                       "Abs",  "Erf",       "Floor", "Ceil",        "Reciprocal", "Softplus", "HardSwish",
                       "Gelu", "LeakyRelu", "Elu",   "HardSigmoid", "Clip"};
  for (int c = 0; c < 60; ++c) {
    std::string op = ops[c % (sizeof ops / sizeof *ops)];
    LayerCase lc;
    bool kiln_gelu = op == "Gelu" && rng() % 2;
    lc.node = make_node(kiln_gelu ? "kiln" : "", op, 1);
    if (op == "Gelu") lc.node.opset = kiln_gelu ? 1 : 20;
    if (op == "Gelu" && rng() % 2) set_string(lc.node, "approximate", "tanh");
    if (op == "LeakyRelu") GB::set_float(lc.node, "alpha", 0.13f);
    if (op == "Clip") {
      lc.node.inputs = {"in0", "in1", rng() % 2 ? "in2" : ""};
    }
    Dims d = random_dims(rng, pick(rng, 1, 4), 13);
    bool positive = op == "Log" || op == "Sqrt" || op == "Reciprocal";
    lc.inputs.push_back(random_tensor(d, 100 + c, DataType::kFloat32, positive ? 0.1 : -3, 3));
    lc.constant = {false};
    if (op == "Clip") {
      lc.inputs.push_back(Tensor::scalar<float>(DataType::kFloat32, -0.4f));
      lc.inputs.push_back(lc.node.inputs[2].empty() ? Tensor() : Tensor::scalar<float>(DataType::kFloat32, 0.9f));
      lc.constant = {false, true, true};
    }
    check(*gpu, lc, 1e-5, 1e-5, ran);
  }
  expect_ran(ran, "elementwise_unary_cuda", 60);
}

TEST(CudaTactics, BinaryOpsWithBroadcasting) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  std::map<std::string, int> ran;
  const char* ops[] = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu"};
  for (int c = 0; c < 64; ++c) {
    std::string op = ops[c % 8];
    int64_t rank = pick(rng, 1, 5);
    Dims a = random_dims(rng, rank, 9), b = a;
    if (op != "PRelu" && rng() % 3 == 0) std::swap(a, b);
    for (auto& x : b)
      if (rng() % 3 == 0) x = 1;                                                                 // broadcast dims
    if (rng() % 3 == 0) b.erase(b.begin(), b.begin() + static_cast<int64_t>(rng() % b.size()));  // fewer dims
    if (op != "PRelu" && rng() % 2) std::swap(a, b);
    LayerCase lc;
    lc.node = make_node("", op, 2);
    bool pow = op == "Pow";
    lc.inputs.push_back(random_tensor(a, 200 + c, DataType::kFloat32, pow ? 0.2 : -2, 2));
    lc.inputs.push_back(random_tensor(b, 300 + c, DataType::kFloat32, pow ? -2 : -2, 2));
    lc.constant = {rng() % 4 == 0, rng() % 2 == 0};
    if (op == "PRelu") {
      Dims o;
      // PRelu's slope broadcasts to X only.
      bool fits = b.size() <= a.size();
      for (size_t k = 0; fits && k < b.size(); ++k) fits = b[k] == 1 || b[k] == a[a.size() - b.size() + k];
      if (!fits) lc.inputs[1] = random_tensor({a.back()}, 300 + c);
    }
    check(*gpu, lc, 1e-5, 1e-5, ran);
  }
  expect_ran(ran, "elementwise_binary_cuda", 64);
}

TEST(CudaTactics, SoftmaxAndLayerNorm) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  std::map<std::string, int> ran;
  for (int c = 0; c < 40; ++c) {
    LayerCase lc;
    lc.node = make_node("", c % 2 ? "Softmax" : "LogSoftmax", 1);
    lc.node.opset = rng() % 3 ? 13 : 11;
    int64_t rank = pick(rng, 1, 4);
    GB::set_int(lc.node, "axis", pick(rng, -rank, rank - 1));
    Dims d = random_dims(rng, rank, 17);
    if (c % 5 == 0) d.back() = pick(rng, 300, 1500);  // rows longer than a block
    lc.inputs = {random_tensor(d, 400 + c, DataType::kFloat32, -5, 5)};
    lc.constant = {false};
    check(*gpu, lc, 1e-5, 1e-5, ran);
  }
  for (int c = 0; c < 40; ++c) {
    bool kiln_op = c % 2;
    int64_t rank = pick(rng, 1, 4), axis = pick(rng, -rank, rank - 1);
    Dims d = random_dims(rng, rank, 19);
    if (c % 5 == 0) d.back() = pick(rng, 300, 1500);
    Dims block(d.begin() + (axis < 0 ? axis + rank : axis), d.end());
    bool bias = rng() % 2, scale = !kiln_op || rng() % 2;
    LayerCase lc;
    lc.node = make_node(kiln_op ? "kiln" : "", "LayerNormalization", bias ? 3 : 2);
    if (!scale) lc.node.inputs[1] = "";
    GB::set_int(lc.node, "axis", axis);
    GB::set_float(lc.node, "epsilon", c % 3 ? 1e-5f : 1e-3f);
    lc.inputs = {random_tensor(d, 500 + c, DataType::kFloat32, -3, 4),
                 scale ? random_tensor(block, 600 + c) : Tensor()};
    if (bias) lc.inputs.push_back(random_tensor(block, 700 + c));
    lc.constant = {false, rng() % 3 != 0, true};
    lc.constant.resize(lc.inputs.size());
    check(*gpu, lc, 2e-5, 2e-5, ran);
  }
  expect_ran(ran, "softmax_cuda", 40);
  expect_ran(ran, "layer_norm_cuda", 40);
}

TEST(CudaTactics, Movement) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(14);
  std::map<std::string, int> ran;
  for (int c = 0; c < 30; ++c) {  // Transpose, float32 and int64
    int64_t rank = pick(rng, 1, 6);
    std::vector<int64_t> perm(static_cast<size_t>(rank));
    for (int64_t k = 0; k < rank; ++k) perm[static_cast<size_t>(k)] = k;
    std::shuffle(perm.begin(), perm.end(), rng);
    LayerCase lc;
    lc.node = make_node("", "Transpose", 1);
    if (rng() % 4) GB::set_ints(lc.node, "perm", perm);
    lc.inputs = {
        random_tensor(random_dims(rng, rank, 7), 800 + c, c % 3 ? DataType::kFloat32 : DataType::kInt64, -50, 50)};
    lc.constant = {false};
    check(*gpu, lc, 0, 0, ran);
  }
  for (int c = 0; c < 30; ++c) {  // Slice with negative starts, ends past the end, negative steps
    int64_t rank = pick(rng, 1, 4);
    Dims d = random_dims(rng, rank, 11);
    std::vector<int64_t> starts, ends, axes, steps;
    for (int64_t k = 0; k < rank; ++k) {
      if (rng() % 3 == 0) continue;
      int64_t n = d[static_cast<size_t>(k)], step = rng() % 3 == 0 ? -pick(rng, 1, 3) : pick(rng, 1, 3);
      axes.push_back(rng() % 2 ? k : k - rank);
      starts.push_back(pick(rng, -n - 2, n + 2));
      ends.push_back(rng() % 4 == 0 ? (step > 0 ? INT64_MAX : INT64_MIN) : pick(rng, -n - 2, n + 2));
      steps.push_back(step);
    }
    if (axes.empty()) axes = {0}, starts = {0}, ends = {1}, steps = {1};
    LayerCase lc;
    lc.node = make_node("", "Slice", 5);
    lc.node.opset = 13;
    lc.inputs = {random_tensor(d, 900 + c), ints(starts), ints(ends), ints(axes), ints(steps)};
    lc.constant = {false, true, true, true, true};
    check(*gpu, lc, 0, 0, ran);
  }
  for (int c = 0; c < 30; ++c) {  // Concat of 1..4 inputs, some constant
    int64_t rank = pick(rng, 1, 4), axis = pick(rng, 0, rank - 1);
    Dims d = random_dims(rng, rank, 9);
    size_t n = static_cast<size_t>(pick(rng, 1, 4));
    LayerCase lc;
    lc.node = make_node("", "Concat", n);
    GB::set_int(lc.node, "axis", rng() % 2 ? axis : axis - rank);
    for (size_t i = 0; i < n; ++i) {
      Dims x = d;
      x[static_cast<size_t>(axis)] = pick(rng, rng() % 5 ? 1 : 0, 6);
      lc.inputs.push_back(random_tensor(x, 1000 + c * 4 + i));
      lc.constant.push_back(rng() % 3 == 0);
    }
    check(*gpu, lc, 0, 0, ran);
  }
  for (int c = 0; c < 20; ++c) {  // Expand
    int64_t rank = pick(rng, 1, 4);
    Dims out = random_dims(rng, rank, 8), in = out;
    for (auto& x : in)
      if (rng() % 2) x = 1;
    if (rng() % 3 == 0) in.erase(in.begin());
    if (in.empty()) in = {1};
    LayerCase lc;
    lc.node = make_node("", "Expand", 2);
    lc.inputs = {random_tensor(in, 1100 + c), ints(out)};
    lc.constant = {false, true};
    check(*gpu, lc, 0, 0, ran);
  }
  for (int c = 0; c < 30; ++c) {  // Gather: int64/int32 indices, negative ones, constant or not, any axis
    int64_t rank = pick(rng, 1, 4), axis = pick(rng, 0, rank - 1);
    Dims d = random_dims(rng, rank, 9);
    int64_t n = d[static_cast<size_t>(axis)];
    Dims idx_shape = random_dims(rng, pick(rng, 0, 2), 5);
    Tensor idx(c % 2 ? DataType::kInt64 : DataType::kInt32, idx_shape);
    for (int64_t i = 0; i < idx.numel(); ++i) idx.set_i64(i, pick(rng, -n, n - 1));
    LayerCase lc;
    lc.node = make_node("", "Gather", 2);
    GB::set_int(lc.node, "axis", rng() % 2 ? axis : axis - rank);
    lc.inputs = {random_tensor(d, 1200 + c, c % 3 ? DataType::kFloat32 : DataType::kInt64, -9, 9), idx};
    lc.constant = {rng() % 4 == 0, rng() % 2 == 0};
    check(*gpu, lc, 0, 0, ran);
  }
  expect_ran(ran, "transpose_cuda", 30);
  expect_ran(ran, "slice_cuda", 30);
  expect_ran(ran, "concat_cuda", 30);
  expect_ran(ran, "expand_cuda", 20);
  expect_ran(ran, "gather_cuda", 30);
}

TEST(CudaTactics, CastSaturatesTruncatesAndWraps) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(17);
  std::map<std::string, int> ran;
  const DataType types[] = {DataType::kFloat32, DataType::kInt32, DataType::kInt64, DataType::kBool};
  for (int c = 0; c < 32; ++c) {
    DataType from = types[c % 4], to = types[c / 4 % 4];
    LayerCase lc;
    lc.node = make_node("", "Cast", 1);
    GB::set_int(lc.node, "to", static_cast<int64_t>(to));
    Dims d = random_dims(rng, pick(rng, 1, 3), 17);
    // Past int32's range (saturation), fractions (truncation), zeros (bool).
    double range = c % 3 == 0 ? 6e9 : 5;
    Tensor x = random_tensor(d, 1300 + c, from == DataType::kBool ? DataType::kFloat32 : from, -range, range);
    if (from == DataType::kBool) x = x.cast(DataType::kBool).value();
    if (x.numel() > 2) x.set_f64(0, 0), x.set_f64(1, from == DataType::kFloat32 ? -0.75 : 0);
    lc.inputs = {x};
    lc.constant = {false};
    check(*gpu, lc, 0, 0, ran);
  }
  expect_ran(ran, "cast_cuda", 32);
}

// MatMul (B 2-D, same batch, A 2-D), Gemm (transposes, alpha, beta, C vector or matrix) and the kiln
// fused forms (bias, residual, every activation).
LayerCase matmul_case(std::mt19937& rng, uint64_t seed) {
  LayerCase lc;
  int kind = static_cast<int>(rng() % 4);
  int64_t m = pick(rng, 1, 37), k = pick(rng, 1, 70), n = pick(rng, 1, 45);
  if (kind <= 1) {  // MatMul / FusedMatMul
    bool fused = kind == 1;
    int64_t rank = pick(rng, 2, 4);
    Dims batch = random_dims(rng, rank - 2, 3);
    Dims a = batch, b;
    a.push_back(m), a.push_back(k);
    int shape = static_cast<int>(rng() % 3);
    if (shape == 0) b = {k, n};
    if (shape == 1) b = batch, b.push_back(k), b.push_back(n);
    if (shape == 2) a = {m, k}, b = batch, b.push_back(k), b.push_back(n);
    bool bias = fused && rng() % 2, residual = fused && rng() % 3 == 0;
    lc.node = make_node(fused ? "kiln" : "", fused ? "FusedMatMul" : "MatMul", residual ? 4 : bias ? 3 : 2);
    if (residual && !bias) lc.node.inputs[2] = "";
    if (fused) testing::add_epilogue(rng, lc.node);
    lc.inputs = {random_tensor(a, seed), random_tensor(b, seed + 1)};
    lc.constant = {false, shape == 0 ? rng() % 3 != 0 : rng() % 2 == 0};
    lc.inputs.push_back(bias ? random_tensor({n}, seed + 2) : Tensor());
    lc.constant.push_back(true);
    if (residual) {
      Dims out = shape == 0 ? a : b;
      out[out.size() - 2] = m, out.back() = n;
      lc.inputs.push_back(random_tensor(out, seed + 3));
      lc.constant.push_back(false);
    }
  } else {  // Gemm / FusedGemm
    bool fused = kind == 3, ta = rng() % 2, tb = rng() % 2;
    int c_kind = static_cast<int>(rng() % 4);  // none, [N], [1, N], [M, N]
    bool residual = fused && c_kind != 3 && rng() % 3 == 0;
    lc.node = make_node(fused ? "kiln" : "", fused ? "FusedGemm" : "Gemm", residual ? 4 : c_kind ? 3 : 2);
    if (fused) lc.node.opset = 1;
    if (residual && !c_kind) lc.node.inputs[2] = "";
    if (ta) GB::set_int(lc.node, "transA", 1);
    if (tb) GB::set_int(lc.node, "transB", 1);
    if (rng() % 2) GB::set_float(lc.node, "alpha", 0.7f);
    if (rng() % 2) GB::set_float(lc.node, "beta", 1.3f);
    if (fused) testing::add_epilogue(rng, lc.node);
    lc.inputs = {random_tensor(ta ? Dims{k, m} : Dims{m, k}, seed),
                 random_tensor(tb ? Dims{n, k} : Dims{k, n}, seed + 1)};
    lc.constant = {false, rng() % 3 != 0};
    Dims c = c_kind == 1 ? Dims{n} : c_kind == 2 ? Dims{1, n} : Dims{m, n};
    lc.inputs.push_back(c_kind ? random_tensor(c, seed + 2) : Tensor());
    lc.constant.push_back(c_kind != 3 || rng() % 2);
    if (residual) {
      lc.inputs.push_back(random_tensor({m, n}, seed + 3));
      lc.constant.push_back(false);
    }
  }
  return lc;
}

TEST(CudaTactics, CublasLtMatmulEveryHeuristicRank) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(15);
  std::map<std::string, int> ran;
  for (int c = 0; c < 80; ++c) {
    LayerCase lc = matmul_case(rng, 2000 + 4 * c);
    int64_t k = lc.inputs[0].shape().back();
    // Exact float32 products (CUBLAS_COMPUTE_32F): error grows with the reduction length only.
    check(*gpu, lc, 2e-6 * (k + 1), 1e-5, ran);
  }
  expect_ran(ran, "matmul_cublaslt_h0", 80);
  expect_ran(ran, "matmul_cublaslt_h1", 1);
  EXPECT_EQ(ran.count("matmul_cublaslt_tf32_h0"), 0u) << "TF32 without --tf32";
}

TEST(CudaTactics, CublasLtTf32OnlyWhenAllowed) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(16);
  std::map<std::string, int> ran;
  for (int c = 0; c < 20; ++c) {
    LayerCase lc = matmul_case(rng, 3000 + 4 * c);
    int64_t k = lc.inputs[0].shape().back();
    check(*gpu, lc, 2e-3 * (k + 1), 1e-2, ran, /*tf32=*/true);  // inputs rounded to 10-bit mantissas
  }
  expect_ran(ran, "matmul_cublaslt_tf32_h0", 20);
}

}  // namespace
}  // namespace kiln
