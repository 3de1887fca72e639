// The FP16 and BF16 CUDA tactics (elementwise, softmax, layer norm, cuBLASLt matmul, Cast) against the
// reference kernel on random layers with odd sizes, and an FP16 engine on cuda:0 against the FP32 CPU
// engine. Skipped without a GPU.
//
// The tolerance, per output element. Each case's inputs are drawn in float32 and rounded once to the
// tactic's dtype; the reference runs in float32 on those rounded values (widened back exactly), so
// what is left is the tactic's own error: float32 arithmetic (the FP32 CUDA tests' 1e-5, or 1e-4 for
// the row kernels) and the one rounding of the output to the dtype, a relative error of at most
// u = 2^-11 (float16, 11 significant bits) or 2^-8 (bfloat16), plus 2^-25 absolute below float16's
// smallest normal (2^-14). A matrix product of K terms accumulates in float32 (cuBLASLt's
// CUBLAS_COMPUTE_32F: products of two 11- or 8-bit significands are exact), in any order: at most
// K * 2^-24 * S more, with S = sum_k |a_ik| |b_kj| computed by the reference on |A| and |B|. Gemm's
// beta != 1 scales the bias in the dtype (one more rounding: u * |beta c|), and cuBLASLt's bias epilogue
// adds the bias to alpha A B already rounded to the dtype (one more rounding, u * alpha S: measured on
// the H200, where Gemms whose bias cancels most of the product missed the bound without it). A wrong dtype, a
// half-converted operand or a lost rounding puts errors of order |y| or S far outside these.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "../engine_util.h"
#include "../graph_builder.h"
#include "backends/registry.h"
#include "cuda_test_util.h"
#include "engine/engine_impl.h"
#include "kiln/kiln.h"
#include "layer_case.h"
#include "onnx/exporter.h"

namespace kiln {
namespace {

using testing::LayerCase;
using testing::make_node;
using testing::pick;
using testing::random_tensor;
using GB = testing::GraphBuilder;

const DataType kReduced[] = {DataType::kFloat16, DataType::kBFloat16};

double unit_roundoff(DataType dt) { return dt == DataType::kFloat16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8); }
double subnormal_step(DataType dt) { return dt == DataType::kFloat16 ? std::ldexp(1.0, -25) : 0.0; }

std::string suffix(DataType dt) { return dt == DataType::kFloat16 ? "f16" : "bf16"; }

Dims random_dims(std::mt19937& rng, int64_t rank, int64_t hi) {
  Dims d;
  for (int64_t i = 0; i < rank; ++i) d.push_back(pick(rng, 1, hi));
  return d;
}

Tensor rounded(const Tensor& t, DataType dt) { return t.defined() ? t.cast(dt).value() : Tensor(); }
Tensor widened(const Tensor& t) { return t.defined() ? t.cast(DataType::kFloat32).value() : Tensor(); }

// The case with every float32 input rounded to dt, and the float32 case of the rounded values.
struct Pair {
  LayerCase reduced, exact;
};
Pair split(const LayerCase& lc, DataType dt) {
  Pair p{lc, lc};
  for (size_t i = 0; i < lc.inputs.size(); ++i)
    if (lc.inputs[i].defined() && lc.inputs[i].dtype() == DataType::kFloat32) {
      p.reduced.inputs[i] = rounded(lc.inputs[i], dt);
      p.exact.inputs[i] = widened(p.reduced.inputs[i]);
    }
  return p;
}

// Runs tactic `name` on the reduced case; checks |got - want| <= atol + rtol |want| (+ extra[i]).
void check(const backends::DeviceRuntime& rt, const std::string& name, const Pair& p, DataType dt, double atol,
           double rtol, const std::vector<double>& extra = {}) {
  const backends::Tactic* t = backends::find_tactic(name);
  ASSERT_NE(t, nullptr) << name;
  std::vector<Tensor> want = testing::reference_outputs(p.exact);
  ASSERT_FALSE(want.empty()) << "the reference rejects the case " << p.exact.node.op_type;
  auto got = testing::run_on_gpu(rt, *t, p.reduced, false, dt);
  if (!got.ok() && got.status().message().find("heuristic offers") != std::string::npos) return;
  ASSERT_TRUE(got.ok()) << name << ": " << got.status().message();
  ASSERT_EQ(got.value()[0].dtype(), dt) << name << " wrote " << dtype_name(got.value()[0].dtype());
  Tensor g = widened(got.value()[0]);
  ASSERT_EQ(g.shape(), want[0].shape());
  std::string dims;
  for (const Tensor& x : p.reduced.inputs) dims += (x.defined() ? x.describe() : std::string("-")) + " ";
  for (int64_t i = 0; i < g.numel(); ++i) {
    double w = want[0].get_f64(i), v = g.get_f64(i);
    if (std::isnan(w) && std::isnan(v)) continue;
    double tol = atol + rtol * std::fabs(w) + (extra.empty() ? 0.0 : extra[static_cast<size_t>(i)]);
    ASSERT_LE(std::fabs(v - w), tol) << name << " on " << p.exact.node.op_type << " " << dims << "element " << i
                                     << ": got " << v << ", want " << w;
  }
}

TEST(CudaReduced, UnaryOps) {
  KILN_SKIP_WITHOUT_GPU();
  const char* ops[] = {"Relu", "Sigmoid",   "Tanh",  "Exp",         "Log",        "Sqrt",     "Neg",
                       "Abs",  "Erf",       "Floor", "Ceil",        "Reciprocal", "Softplus", "HardSwish",
                       "Gelu", "LeakyRelu", "Elu",   "HardSigmoid", "Clip"};
  for (DataType dt : kReduced) {
    std::mt19937 rng(21);
    const double u = unit_roundoff(dt);
    for (int c = 0; c < 57; ++c) {
      std::string op = ops[c % (sizeof ops / sizeof *ops)];
      LayerCase lc;
      lc.node = make_node("", op, op == "Clip" ? 3 : 1);
      if (op == "Gelu") lc.node.opset = 20;
      if (op == "LeakyRelu") GB::set_float(lc.node, "alpha", 0.13f);
      bool positive = op == "Log" || op == "Sqrt" || op == "Reciprocal";
      lc.inputs.push_back(
          random_tensor(random_dims(rng, pick(rng, 1, 4), 13), 500 + c, DataType::kFloat32, positive ? 0.1 : -3, 3));
      lc.constant = {false};
      if (op == "Clip") {
        lc.inputs.push_back(Tensor::scalar<float>(DataType::kFloat32, -0.4f));
        lc.inputs.push_back(Tensor::scalar<float>(DataType::kFloat32, 0.9f));
        lc.constant = {false, true, true};
      }
      check(*gpu, "elementwise_unary_" + suffix(dt) + "_cuda", split(lc, dt), dt, 1e-5 + subnormal_step(dt), u + 1e-5);
    }
  }
}

TEST(CudaReduced, BinaryOpsWithBroadcasting) {
  KILN_SKIP_WITHOUT_GPU();
  const char* ops[] = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu"};
  for (DataType dt : kReduced) {
    std::mt19937 rng(22);
    const double u = unit_roundoff(dt);
    for (int c = 0; c < 48; ++c) {
      std::string op = ops[c % 8];
      Dims a = random_dims(rng, pick(rng, 1, 5), 9), b = a;
      for (auto& x : b)
        if (rng() % 3 == 0) x = 1;
      if (op != "PRelu" && rng() % 3 == 0) b.erase(b.begin(), b.begin() + static_cast<int64_t>(rng() % b.size()));
      if (op != "PRelu" && rng() % 2) std::swap(a, b);
      LayerCase lc;
      lc.node = make_node("", op, 2);
      bool pow = op == "Pow", div = op == "Div";
      lc.inputs.push_back(random_tensor(a, 600 + c, DataType::kFloat32, pow ? 0.2 : -2, 2));
      // Div: |b| >= 0.5 keeps quotients far inside float16's range.
      lc.inputs.push_back(random_tensor(b, 700 + c, DataType::kFloat32, div ? 0.5 : -2, 2));
      lc.constant = {false, rng() % 2 == 0};
      if (op == "PRelu") lc.inputs[1] = random_tensor({a.back()}, 700 + c);
      check(*gpu, "elementwise_binary_" + suffix(dt) + "_cuda", split(lc, dt), dt, 1e-5 + subnormal_step(dt), u + 1e-5);
    }
  }
}

TEST(CudaReduced, SoftmaxAndLayerNorm) {
  KILN_SKIP_WITHOUT_GPU();
  for (DataType dt : kReduced) {
    std::mt19937 rng(23);
    const double u = unit_roundoff(dt);
    for (int c = 0; c < 30; ++c) {
      LayerCase lc;
      int64_t rank = pick(rng, 1, 4);
      Dims d = random_dims(rng, rank, 17);
      if (c % 5 == 0) d.back() = pick(rng, 300, 1500);  // rows longer than a block
      const bool ln = c % 3 == 0;
      const int64_t axis = ln ? pick(rng, 0, rank - 1) : pick(rng, -rank, rank - 1);
      int64_t len = 1;  // the reduction length
      if (ln) {
        lc.node = make_node("", "LayerNormalization", 3);
        lc.node.opset = 17;
        GB::set_int(lc.node, "axis", axis);
        Dims nd(d.begin() + axis, d.end());
        for (int64_t x : nd) len *= x;
        lc.inputs = {random_tensor(d, 800 + c, DataType::kFloat32, -3, 3), random_tensor(nd, 900 + c),
                     random_tensor(nd, 1000 + c)};
        lc.constant = {false, true, true};
      } else {
        lc.node = make_node("", c % 2 ? "Softmax" : "LogSoftmax", 1);
        lc.node.opset = 13;
        GB::set_int(lc.node, "axis", axis);
        len = d[static_cast<size_t>(axis < 0 ? axis + rank : axis)];
        lc.inputs = {random_tensor(d, 800 + c, DataType::kFloat32, -4, 4)};
        lc.constant = {false};
      }
      // float32 reductions of `len` terms: len * 2^-24 relative to the terms (|x| <= 4, LayerNorm's
      // normalized values and scale within a few units).
      const double reduction = static_cast<double>(len) * std::ldexp(1.0, -24) * 16;
      check(*gpu, std::string(ln ? "layer_norm_" : "softmax_") + suffix(dt) + "_cuda", split(lc, dt), dt,
            1e-4 + reduction + subnormal_step(dt), u + 1e-4);
    }
  }
}

// MatMul (2-D B, batched, shared A) and Gemm (transposes, alpha, beta, bias row) in FP16/BF16.
TEST(CudaReduced, MatMulAndGemm) {
  KILN_SKIP_WITHOUT_GPU();
  for (DataType dt : kReduced) {
    std::mt19937 rng(24);
    const double u = unit_roundoff(dt);
    int ran = 0;
    for (int c = 0; c < 26; ++c) {
      LayerCase lc, sum;  // sum: the same product on |A|, |B| (no bias): S
      // Cases 24 and 25: BERT-base's shapes (a 768x768 projection, the batched attention product).
      const int64_t m = c >= 24 ? 128 : pick(rng, 1, 37),
                    k = c == 24   ? 768
                        : c == 25 ? 64
                                  : pick(rng, 1, 70),
                    n = c == 24   ? 768
                        : c == 25 ? 128
                                  : pick(rng, 1, 45);
      double beta_c = 0;      // |beta| * max |C| of a scaled bias
      bool has_bias = false;  // cuBLASLt rounds alpha A B to the dtype before its bias epilogue adds C
      if (c % 2 == 0 || c >= 24) {
        lc.node = make_node("", "MatMul", 2);
        Dims a{m, k}, b{k, n};
        if (c % 4 == 2 && c < 24) a.insert(a.begin(), pick(rng, 2, 3)), b.insert(b.begin(), a[0]);  // batched
        if (c == 25) a.insert(a.begin(), 12), b.insert(b.begin(), 12);
        lc.inputs = {random_tensor(a, 1100 + c), random_tensor(b, 1200 + c)};
        lc.constant = {false, c % 4 == 0};
      } else {
        lc.node = make_node("", "Gemm", 3);
        const bool ta = rng() % 2, tb = rng() % 2;
        if (ta) GB::set_int(lc.node, "transA", 1);
        if (tb) GB::set_int(lc.node, "transB", 1);
        const float alpha = 0.75f, beta = c % 3 ? 1.f : 0.5f;
        GB::set_float(lc.node, "alpha", alpha);
        GB::set_float(lc.node, "beta", beta);
        lc.inputs = {random_tensor(ta ? Dims{k, m} : Dims{m, k}, 1100 + c),
                     random_tensor(tb ? Dims{n, k} : Dims{k, n}, 1200 + c), random_tensor({n}, 1300 + c)};
        lc.constant = {false, true, true};
        beta_c = beta != 1.f ? beta : 0;
        has_bias = true;
      }
      Pair p = split(lc, dt);
      sum = p.exact;
      for (size_t i = 0; i < 2; ++i) sum.inputs[i] = sum.inputs[i].clone();  // Tensor copies share storage
      for (size_t i = 0; i < 2; ++i)
        for (int64_t e = 0; e < sum.inputs[i].numel(); ++e)
          sum.inputs[i].set_f64(e, std::fabs(sum.inputs[i].get_f64(e)));
      if (sum.node.op_type == "Gemm") {
        sum.node.inputs.resize(2), sum.inputs.resize(2), sum.constant.resize(2);
        GB::set_float(sum.node, "alpha", 0.75f);
      }
      Tensor s = testing::reference_output(sum);
      ASSERT_TRUE(s.defined());
      std::vector<double> extra(static_cast<size_t>(s.numel()));
      for (int64_t e = 0; e < s.numel(); ++e)
        extra[static_cast<size_t>(e)] = static_cast<double>(k) * std::ldexp(1.0, -24) * s.get_f64(e) * (1 + u) +
                                        u * beta_c * 1.0 /* |C| <= 1 */ * 2 + (has_bias ? u * s.get_f64(e) : 0.0);
      for (int h = 0; h < 4; ++h) {
        check(*gpu, "matmul_cublaslt_" + suffix(dt) + "_h" + std::to_string(h), p, dt, 1e-6 + subnormal_step(dt), u,
              extra);
        ++ran;
      }
    }
    EXPECT_GT(ran, 0);
  }
}

// kiln.FusedMatMul + bias + GELU (erf) in FP16/BF16: by default cuBLASLt's GELU epilogue computes the tanh
// form on the float32 accumulator (|gelu_tanh - gelu_erf| <= 4.74e-4, then one rounding); with
// exact_gelu (kiln build --exact-gelu) the product is rounded, then erf's GELU runs and rounds again.
// Both against erf's GELU on the reference; GELU's slope is at most 1.13. Without the 4.74e-4 term
// the default path fails the bound (the tanh form is what it computes), and a lost or doubled GELU
// is off by order |y|.
TEST(CudaReduced, FusedMatMulGeluBothForms) {
  KILN_SKIP_WITHOUT_GPU();
  for (DataType dt : kReduced) {
    const double u = unit_roundoff(dt);
    for (int c = 0; c < 6; ++c) {
      const int64_t m = 3 + 7 * c, k = c == 5 ? 768 : 5 + 11 * c, n = c == 5 ? 3072 / 8 : 9 + 5 * c;
      LayerCase lc;
      lc.node = make_node("kiln", "FusedMatMul", 3);
      testing::set_string(lc.node, "activation", "Gelu");
      testing::set_string(lc.node, "activation_approximate", "none");
      // Products of a few units: GELU's curved part, where the two forms differ most (|x| ~ 2.7).
      lc.inputs = {random_tensor({m, k}, 1400 + c), random_tensor({k, n}, 1500 + c), random_tensor({n}, 1600 + c)};
      const double scale = 3.0 / std::sqrt(static_cast<double>(k));
      for (int64_t e = 0; e < lc.inputs[1].numel(); ++e) lc.inputs[1].set_f64(e, lc.inputs[1].get_f64(e) * 3 * scale);
      lc.constant = {false, true, true};
      Pair p = split(lc, dt);
      LayerCase sum = p.exact;  // S = sum |a| |b| per element, and |A B + bias| <= S + 1
      sum.node = make_node("", "MatMul", 2);
      sum.inputs.resize(2), sum.constant.resize(2);
      for (size_t i = 0; i < 2; ++i) {
        sum.inputs[i] = sum.inputs[i].clone();
        for (int64_t e = 0; e < sum.inputs[i].numel(); ++e)
          sum.inputs[i].set_f64(e, std::fabs(sum.inputs[i].get_f64(e)));
      }
      Tensor s = testing::reference_output(sum);
      ASSERT_TRUE(s.defined());
      std::vector<double> tanh_extra(static_cast<size_t>(s.numel())), erf_extra(tanh_extra.size());
      for (int64_t e = 0; e < s.numel(); ++e) {
        const double acc = static_cast<double>(k) * std::ldexp(1.0, -24) * s.get_f64(e) * (1 + u);
        // cuBLASLt's bias epilogue adds the bias to the product already rounded to the dtype (MatMulAndGemm
        // above; seen here on the H200 too: 4.20703 for 4.20432): one more rounding, u * (S + 1), through GELU.
        tanh_extra[static_cast<size_t>(e)] = 1.13 * (acc + u * (s.get_f64(e) + 1.0)) + 4.74e-4 * (1 + u);
        erf_extra[static_cast<size_t>(e)] = 1.13 * (acc + u * (s.get_f64(e) + 1.0)) * (1 + u);
      }
      std::vector<Tensor> want = testing::reference_outputs(p.exact);
      ASSERT_FALSE(want.empty());
      for (int h = 0; h < 4; ++h) {
        const std::string name = "matmul_cublaslt_" + suffix(dt) + "_h" + std::to_string(h);
        const backends::Tactic* t = backends::find_tactic(name);
        ASSERT_NE(t, nullptr) << name;
        for (bool exact : {false, true}) {
          auto got = testing::run_on_gpu(*gpu, *t, p.reduced, false, dt, exact);
          if (!got.ok() && got.status().message().find("heuristic offers") != std::string::npos) continue;
          ASSERT_TRUE(got.ok()) << name << ": " << got.status().message();
          Tensor g = widened(got.value()[0]);
          ASSERT_EQ(g.shape(), want[0].shape());
          const std::vector<double>& extra = exact ? erf_extra : tanh_extra;
          for (int64_t e = 0; e < g.numel(); ++e) {
            const double w = want[0].get_f64(e), v = g.get_f64(e);
            ASSERT_LE(std::fabs(v - w), 1e-6 + subnormal_step(dt) + u * std::fabs(w) + extra[static_cast<size_t>(e)])
                << name << (exact ? " exact" : " tanh form") << " case " << c << " element " << e << ": got " << v
                << ", want " << w;
          }
        }
      }
    }
  }
}

// Casts between float32 and float16/bfloat16 both ways: exactly the reference's (round to nearest even,
// overflow to inf, NaN kept).
TEST(CudaReduced, CastsRoundLikeTheReference) {
  KILN_SKIP_WITHOUT_GPU();
  std::mt19937 rng(25);
  for (DataType dt : kReduced) {
    for (int c = 0; c < 6; ++c) {
      const bool down = c % 2 == 0;
      Tensor x = random_tensor({pick(rng, 1, 9), 1 + 37 * c}, 1400 + c, DataType::kFloat32, -7e4, 7e4);
      x.set_f64(0, std::nan(""));
      if (x.numel() > 1) x.set_f64(1, 1e-7);  // a float16 subnormal
      LayerCase lc;
      lc.node = make_node("", "Cast", 1);
      GB::set_int(lc.node, "to", static_cast<int64_t>(down ? dt : DataType::kFloat32));
      lc.inputs = {down ? x : rounded(x, dt)};
      lc.constant = {false};
      std::vector<Tensor> want = testing::reference_outputs(lc);
      ASSERT_FALSE(want.empty());
      auto got = testing::run_on_gpu(*gpu, *backends::find_tactic("cast_cuda"), lc);
      ASSERT_TRUE(got.ok()) << got.status().message();
      const Tensor& g = got.value()[0];
      ASSERT_EQ(g.dtype(), want[0].dtype());
      ASSERT_EQ(g.shape(), want[0].shape());
      for (int64_t i = 0; i < g.numel(); ++i) {  // equal values, infinities included; NaN for NaN
        double a = g.get_f64(i), b = want[0].get_f64(i);
        EXPECT_TRUE(a == b || (std::isnan(a) && std::isnan(b)))
            << dtype_name(dt) << (down ? " down" : " up") << " element " << i << ": got " << a << ", want " << b;
      }
    }
  }
}

// x [3, 29] -> MatMul + bias -> Relu -> Softmax -> LayerNorm -> MatMul: with --fp16 every layer computes
// in float16 between a Cast of the input and a Cast of the output, and the result is the FP32 CPU
// engine's within float16's rounding.
std::string mlp_onnx() {
  GB b(17);
  b.input("x", {3, 29}).output("y");
  b.init("w1", random_tensor({29, 31}, 1, DataType::kFloat32, -0.3, 0.3)).init("b1", random_tensor({31}, 2));
  b.init("g", random_tensor({31}, 3)).init("be", random_tensor({31}, 4));
  b.init("w2", random_tensor({31, 7}, 5, DataType::kFloat32, -0.3, 0.3));
  b.node("MatMul", {"x", "w1"}, {"h"});
  b.node("Add", {"h", "b1"}, {"hb"});
  b.node("Relu", {"hb"}, {"r"});
  GB::set_int(b.node("Softmax", {"r"}, {"s"}), "axis", -1);
  GB::set_int(b.node("LayerNormalization", {"s", "g", "be"}, {"ln"}), "axis", -1);
  b.node("MatMul", {"ln", "w2"}, {"y"});
  return onnx_import::serialize_model(b.finish()).value();
}

TEST(CudaReduced, Fp16EngineMatchesTheFp32Cpu) {
  KILN_SKIP_WITHOUT_GPU();
  for (Precision prec : {Precision::kFP16, Precision::kBF16}) {
    BuilderConfig cfg;
    cfg.device = {DeviceKind::kCUDA, 0};
    cfg.precision = prec;
    cfg.warn = [](const std::string&) {};
    auto engine = Builder(cfg).build_from_memory(mlp_onnx());
    BuilderConfig cpu;
    cpu.warn = [](const std::string&) {};
    auto ref = Builder(cpu).build_from_memory(mlp_onnx());
    const std::string want_precision = prec == Precision::kFP16 ? "fp16" : "bf16";
    int reduced = 0, casts = 0;
    for (const auto& l : engine->impl().layers) {
      reduced += l.precision == want_precision;
      casts += l.op_type == "Cast";
    }
    EXPECT_GE(reduced, 4) << engine->inspect_json();
    EXPECT_EQ(casts, 2) << "one Cast in, one out: " << engine->inspect_json();
    Tensor x = random_tensor({3, 29}, 42);
    auto ref_ctx = ref->create_context();
    ref_ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
    ref_ctx->run();
    HostTensor r = ref_ctx->output("y");
    std::vector<float> want(r.as<float>(), r.as<float>() + r.numel());
    auto ctx = engine->create_context();
    for (int run = 0; run < 2; ++run) {
      ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
      ctx->run();
      HostTensor y = ctx->output("y");
      ASSERT_EQ(y.numel(), static_cast<int64_t>(want.size()));
      // LayerNorm's outputs are within a few units; the last product sums 31 of them times |w| <= 0.3,
      // each carrying the upstream roundings (a few u): 31 * 0.3 * 3 * 8u bounds it.
      const double tol =
          31 * 0.3 * 3 * 8 * unit_roundoff(prec == Precision::kFP16 ? DataType::kFloat16 : DataType::kBFloat16);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(y.as<float>()[i], want[i], tol) << want_precision << " element " << i;
    }
  }
}

}  // namespace
}  // namespace kiln
