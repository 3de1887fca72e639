// The INT8 linear-layer tactics (src/backends/cpu/int8_matmul_onednn.cc) against the reference
// kernels of MatMulInteger and kiln.DynQMatMul on random shapes, odd sizes included (K and N not
// multiples of 4, 16 or 64, one-row and batched A, row blocks with a tail), every zero-point form, on each CPU path of
// kiln's quantizer and epilogue. The comparison is bit for bit: the int32 accumulators, and the
// float output too (the epilogue does the reference's Cast, Mul and Add steps with the same
// roundings), except after GELU, whose vector erf is an approximation (1e-5 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "backends/registry.h"
#include "layer_case.h"

namespace kiln {
namespace {

using testing::LayerCase;
using testing::make_node;
using testing::pick;

Tensor random_int8(Dims d, std::mt19937& rng, DataType dt, int lo, int hi) {
  Tensor t(dt, std::move(d));
  for (int64_t i = 0; i < t.numel(); ++i) t.set_f64(i, static_cast<double>(pick(rng, lo, hi)));
  return t;
}

Dims a_shape(std::mt19937& rng, int64_t k) {
  // 130 with a batch dim: blocks of 128 rows and a tail block
  static const int64_t kRows[] = {1, 2, 3, 7, 16, 33, 128, 130};
  int64_t m = kRows[rng() % 8];
  switch (rng() % 3) {
    case 0: return {m, k};
    case 1: return {pick(rng, 1, 3), m, k};
    default: return {2, pick(rng, 1, 2), m, k};
  }
}

int64_t odd_dim(std::mt19937& rng) {
  static const int64_t kDims[] = {1, 3, 4, 5, 15, 16, 17, 63, 64, 65, 100, 129, 257};
  return kDims[rng() % 13];
}

// The b zero point: none, scalar 0, a random scalar, or per column.
Tensor b_zero_point(std::mt19937& rng, int64_t n) {
  switch (rng() % 4) {
    case 0: return Tensor();
    case 1: return Tensor::scalar<int8_t>(DataType::kInt8, 0);
    case 2: return Tensor::scalar<int8_t>(DataType::kInt8, static_cast<int8_t>(pick(rng, -128, 127)));
    default: return random_int8({n}, rng, DataType::kInt8, -128, 127);
  }
}

LayerCase matmul_integer_case(std::mt19937& rng) {
  const int64_t k = odd_dim(rng), n = odd_dim(rng);
  LayerCase lc;
  lc.inputs.push_back(random_int8(a_shape(rng, k), rng, DataType::kUInt8, 0, 255));
  lc.inputs.push_back(random_int8({k, n}, rng, DataType::kInt8, -128, 127));
  lc.inputs.push_back(rng() % 4 ? Tensor::scalar<uint8_t>(DataType::kUInt8, static_cast<uint8_t>(pick(rng, 0, 255)))
                                : Tensor());
  lc.inputs.push_back(b_zero_point(rng, n));
  lc.constant = {false, true, rng() % 2 == 0, true};
  lc.node = make_node("", "MatMulInteger", 4);
  lc.node.opset = 10;
  for (size_t i = 2; i < 4; ++i)
    if (!lc.inputs[i].defined()) lc.node.inputs[i] = "";
  return lc;
}

LayerCase qlinear_matmul_case(std::mt19937& rng, uint64_t seed) {
  const int64_t k = odd_dim(rng), n = odd_dim(rng);
  LayerCase lc;
  lc.inputs.push_back(random_int8(a_shape(rng, k), rng, DataType::kUInt8, 0, 255));
  lc.inputs.push_back(Tensor::scalar<float>(DataType::kFloat32, 0.02f + 0.01f * static_cast<float>(rng() % 5)));
  lc.inputs.push_back(Tensor::scalar<uint8_t>(DataType::kUInt8, static_cast<uint8_t>(pick(rng, 0, 255))));
  lc.inputs.push_back(random_int8({k, n}, rng, DataType::kInt8, -128, 127));
  lc.inputs.push_back(rng() % 2 ? Tensor::scalar<float>(DataType::kFloat32, 0.007f)
                                : testing::random_tensor({n}, seed, DataType::kFloat32, 0.001, 0.01));
  lc.inputs.push_back(b_zero_point(rng, n));
  // y's scale so that the outputs span the range and some saturate
  lc.inputs.push_back(Tensor::scalar<float>(DataType::kFloat32, 0.05f * std::sqrt(static_cast<float>(k))));
  lc.inputs.push_back(rng() % 2 ? Tensor::scalar<uint8_t>(DataType::kUInt8, static_cast<uint8_t>(pick(rng, 0, 255)))
                                : Tensor::scalar<int8_t>(DataType::kInt8, static_cast<int8_t>(pick(rng, -128, 127))));
  lc.constant = {false, rng() % 2 == 0, rng() % 2 == 0, true, true, true, true, true};
  lc.node = make_node("", "QLinearMatMul", 8);
  lc.node.opset = 10;
  if (!lc.inputs[5].defined()) lc.node.inputs[5] = "";
  return lc;
}

LayerCase dyn_q_matmul_case(std::mt19937& rng, uint64_t seed) {
  const int64_t k = odd_dim(rng), n = odd_dim(rng);
  Dims a = a_shape(rng, k);
  LayerCase lc;
  // Ranges: around zero, all positive (zero point 0), all negative (255), all zero (scale 1/255).
  int range = static_cast<int>(rng() % 5);
  double lo = range == 1 ? 0.5 : range == 2 ? -3.0 : -2.0, hi = range == 1 ? 4.0 : range == 2 ? -0.1 : 1.5;
  Tensor x = testing::random_tensor(a, seed, DataType::kFloat32, lo, hi);
  if (range == 3)
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 0.f;
  lc.inputs.push_back(x);
  lc.inputs.push_back(random_int8({k, n}, rng, DataType::kInt8, -128, 127));
  lc.inputs.push_back(b_zero_point(rng, n));
  lc.inputs.push_back(rng() % 2 ? Tensor::scalar<float>(DataType::kFloat32, 0.0123f)
                                : testing::random_tensor({n}, seed + 1, DataType::kFloat32, 0.001, 0.05));
  lc.inputs.push_back(rng() % 3 ? testing::random_tensor({n}, seed + 2) : Tensor());
  Dims y = a;
  y.back() = n;
  lc.inputs.push_back(rng() % 3 == 0 ? testing::random_tensor(y, seed + 3) : Tensor());
  lc.constant = {false, true, true, true, true, false};
  lc.node = make_node("kiln", "DynQMatMul", 6);
  for (size_t i = 0; i < 6; ++i)
    if (!lc.inputs[i].defined()) lc.node.inputs[i] = "";
  static const char* kAct[] = {"", "Relu", "Gelu"};
  if (std::string act = kAct[rng() % 3]; !act.empty()) testing::set_string(lc.node, "activation", act);
  return lc;
}

// kiln.QMatMul: X float32 (quantized by the layer with its fixed scale and zero point; values beyond
// the range saturate, a NaN becomes the zero point) or uint8 (read as it is).
LayerCase q_matmul_case(std::mt19937& rng, uint64_t seed) {
  const int64_t k = odd_dim(rng), n = odd_dim(rng);
  Dims a = a_shape(rng, k);
  LayerCase lc;
  const bool float_x = rng() % 3 != 0;
  if (float_x) {
    Tensor x = testing::random_tensor(a, seed, DataType::kFloat32, -3.0, 3.0);
    if (x.numel() > 2) x.data<float>()[x.numel() / 2] = NAN;
    lc.inputs.push_back(x);
  } else {
    lc.inputs.push_back(random_int8(a, rng, DataType::kUInt8, 0, 255));
  }
  lc.inputs.push_back(random_int8({k, n}, rng, DataType::kInt8, -128, 127));
  lc.inputs.push_back(b_zero_point(rng, n));
  lc.inputs.push_back(rng() % 2 ? Tensor::scalar<float>(DataType::kFloat32, 0.0123f)
                                : testing::random_tensor({n}, seed + 1, DataType::kFloat32, 0.001, 0.05));
  lc.inputs.push_back(rng() % 3 ? testing::random_tensor({n}, seed + 2) : Tensor());
  Dims y = a;
  y.back() = n;
  lc.inputs.push_back(rng() % 3 == 0 ? testing::random_tensor(y, seed + 3) : Tensor());
  lc.constant = {false, true, true, true, true, false};
  lc.node = make_node("kiln", "QMatMul", 6);
  for (size_t i = 0; i < 6; ++i)
    if (!lc.inputs[i].defined()) lc.node.inputs[i] = "";
  // A range narrower than X's (some values saturate at 0 or 255).
  testing::set_float(lc.node, "x_scale", 0.01f + 0.003f * static_cast<float>(rng() % 5));
  lc.node.attrs["x_zero_point"] = ir::attr_int(pick(rng, 0, 255));
  static const char* kAct[] = {"", "Relu", "Gelu"};
  if (std::string act = kAct[rng() % 3]; !act.empty()) testing::set_string(lc.node, "activation", act);
  return lc;
}

std::vector<std::string> cpu_paths() {
  std::vector<std::string> p = {"portable"};
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    p.push_back("avx512");
  return p;
}

// Runs every tactic taking `lc` on each CPU path; returns how many ran. `tol` 0: bit for bit.
int check_against_reference(const LayerCase& lc, int iter, float tol) {
  Tensor want = testing::reference_output(lc);
  EXPECT_TRUE(want.defined()) << "the reference rejects case " << iter;
  if (!want.defined()) return 0;
  backends::LayerSignature sig = testing::layer_signature(lc);
  sig.compute = DataType::kInt8;
  int ran = 0;
  for (const backends::Tactic* t : backends::all_tactics()) {
    if (!backends::implements(*t, sig)) continue;
    std::string why = backends::why_declined(*t, sig);
    EXPECT_EQ(why, "") << t->name() << " declines case " << iter;
    if (!why.empty()) continue;
    for (const std::string& path : cpu_paths()) {
      EXPECT_TRUE(parse_isa_level(path, &sig.isa));
      auto prepared = t->prepare(sig);
      EXPECT_TRUE(prepared.ok()) << prepared.status().to_string();
      if (!prepared.ok()) continue;
      EXPECT_EQ(prepared.value()->output_shapes()[0], want.shape());
      EXPECT_EQ(prepared.value()->output_dtypes()[0], want.dtype());
      Tensor got(want.dtype(), want.shape());
      std::vector<const Tensor*> ins;
      for (size_t i = 0; i < lc.node.inputs.size(); ++i)
        ins.push_back(lc.node.inputs[i].empty() ? nullptr : &lc.inputs[i]);
      Status st = prepared.value()->run_standalone(ins, {&got});
      EXPECT_TRUE(st.ok()) << st.to_string();
      int bad = 0;
      for (int64_t i = 0; i < want.numel(); ++i) {
        bool same;
        if (tol > 0) {
          float w = want.data<float>()[i], g = got.data<float>()[i];
          same = std::fabs(w - g) <= tol * std::max(1.f, std::fabs(w));
        } else {
          const size_t es = dtype_size(want.dtype());
          same = std::memcmp(static_cast<const char*>(want.raw()) + i * es,
                             static_cast<const char*>(got.raw()) + i * es, es) == 0;
        }
        if (!same && bad++ < 3)
          ADD_FAILURE() << t->name() << " [" << path << "] case " << iter << " element " << i << ": want "
                        << want.get_f64(i) << ", got " << got.get_f64(i);
      }
      EXPECT_EQ(bad, 0) << t->name() << " [" << path << "] case " << iter << " A " << dims_str(lc.inputs[0].shape())
                        << " B " << dims_str(lc.inputs[1].shape());
      ++ran;
    }
  }
  return ran;
}

TEST(Int8Matmul, MatMulIntegerIsBitExact) {
  if (!backends::find_tactic("dyn_q_matmul_onednn_u8s8s32")) GTEST_SKIP() << "built without oneDNN";
  std::mt19937 rng(7);
  int ran = 0;
  for (int iter = 0; iter < 60; ++iter) ran += check_against_reference(matmul_integer_case(rng), iter, 0.f);
  EXPECT_GE(ran, 60);  // the tactic took every case
}

TEST(Int8Matmul, QLinearMatMulIsBitExact) {
  if (!backends::find_tactic("dyn_q_matmul_onednn_u8s8s32")) GTEST_SKIP() << "built without oneDNN";
  std::mt19937 rng(9);
  int ran = 0;
  for (int iter = 0; iter < 60; ++iter)
    ran += check_against_reference(qlinear_matmul_case(rng, 300 + static_cast<uint64_t>(iter)), iter, 0.f);
  EXPECT_GE(ran, 60);
}

TEST(Int8Matmul, DynQMatMulEqualsTheUnfusedOps) {
  if (!backends::find_tactic("dyn_q_matmul_onednn_u8s8s32")) GTEST_SKIP() << "built without oneDNN";
  std::mt19937 rng(11);
  int ran = 0;
  for (int iter = 0; iter < 80; ++iter) {
    LayerCase lc = dyn_q_matmul_case(rng, 500 + 10 * static_cast<uint64_t>(iter));
    const bool gelu = lc.node.attr_string("activation", "") == "Gelu";
    ran += check_against_reference(lc, iter, gelu ? 1e-5f : 0.f);
  }
  EXPECT_GE(ran, 80);
}

TEST(Int8Matmul, QMatMulEqualsTheUnfusedOps) {
  if (!backends::find_tactic("q_matmul_onednn_u8s8s32")) GTEST_SKIP() << "built without oneDNN";
  std::mt19937 rng(13);
  int ran = 0;
  for (int iter = 0; iter < 80; ++iter) {
    LayerCase lc = q_matmul_case(rng, 900 + 10 * static_cast<uint64_t>(iter));
    const bool gelu = lc.node.attr_string("activation", "") == "Gelu";
    ran += check_against_reference(lc, iter, gelu ? 1e-5f : 0.f);
  }
  EXPECT_GE(ran, 80);
}

TEST(Int8Matmul, InfiniteActivationIsAnError) {
  if (!backends::find_tactic("dyn_q_matmul_onednn_u8s8s32")) GTEST_SKIP() << "built without oneDNN";
  std::mt19937 rng(3);
  LayerCase lc;
  do lc = dyn_q_matmul_case(rng, 77);
  while (lc.inputs[0].numel() < 2);
  lc.inputs[0].data<float>()[1] = INFINITY;
  backends::LayerSignature sig = testing::layer_signature(lc);
  sig.compute = DataType::kInt8;
  const backends::Tactic* t = backends::find_tactic("dyn_q_matmul_onednn_u8s8s32");
  ASSERT_NE(t, nullptr);
  auto prepared = t->prepare(sig);
  ASSERT_TRUE(prepared.ok()) << prepared.status().to_string();
  Dims y = lc.inputs[0].shape();
  y.back() = lc.inputs[1].dim(1);
  Tensor got(DataType::kFloat32, y);
  std::vector<const Tensor*> ins;
  for (size_t i = 0; i < lc.node.inputs.size(); ++i) ins.push_back(lc.node.inputs[i].empty() ? nullptr : &lc.inputs[i]);
  Status st = prepared.value()->run_standalone(ins, {&got});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("infinite"), std::string::npos) << st.to_string();
}

TEST(Int8Matmul, DeclinesWhatItDoesNotImplementWithAReason) {
  if (!backends::find_tactic("dyn_q_matmul_onednn_u8s8s32")) GTEST_SKIP() << "built without oneDNN";
  std::mt19937 rng(5);
  LayerCase lc = matmul_integer_case(rng);
  lc.constant[1] = false;  // activation x activation
  backends::LayerSignature sig = testing::layer_signature(lc);
  sig.compute = DataType::kInt8;
  const backends::Tactic* t = backends::find_tactic("matmul_integer_onednn_u8s8s32");
  ASSERT_NE(t, nullptr);
  EXPECT_NE(backends::why_declined(*t, sig).find("2-D constant"), std::string::npos);
  sig.compute = DataType::kFloat32;  // a layer the graph does not quantize is not an int8 layer
  EXPECT_NE(backends::why_declined(*t, sig).find("computes in int8"), std::string::npos);
}

}  // namespace
}  // namespace kiln
