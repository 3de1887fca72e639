// The CUDA attention tactics (attention_cublaslt{,_f16,_bf16}_cuda and the fused kernel's
// attention_fused_{f16,bf16}_cuda: kiln.Attention and kiln.MultiHeadAttention) against the reference
// kernel on shapes with odd sizes (sequences 1, 7, 77, 128, 129: one to three tiles of 64 keys, the
// last partial; heads 1, 3, 12; head sizes 8, 40, 64 for cuBLASLt, 32, 64, 128 for the fused kernel;
// batch 1 and 3), every mask kind (none, key padding with a large negative value or -inf, a fully
// masked row, causal -inf, full random additive masks, per-row masks, leading keys -inf so that a
// row's first tiles are fully masked), K given transposed, shared K/V and the packed QKV projection;
// and BERT-like encoder layers built for cuda:0 with --strict-tactics whose attention runs as one
// MultiHeadAttention layer (either tactic), against the reference interpreter. Skipped without a GPU.
//
// Tolerances. Each case's inputs are drawn in float32 in [-1, 1] and rounded once to the dtype; the
// reference runs in float32 on those values. The tactic computes the scores and the softmax in
// float32 (errors of order D * 2^-24 * |q||k|, below 1e-5 in the probabilities here) and rounds P
// and then Y once to the dtype (unit roundoff u: 2^-11 float16, 2^-8 bfloat16): |dY| <= u sum_j p_j
// |v_j| + u |Y| <= 2u with |v| <= 1. Bounds: float32 1e-4 (+1e-4 relative), float16/bfloat16
// 3u + 1e-4. A wrong mask offset, head stride or a lost scale moves outputs by O(0.1) or more.
// The fused kernel has the same bound: its P is exp(s - m) for the running max m (<= 1), rounded once
// to the dtype (relative error u; float16 subnormals below 2^-14 add at most 2^-25 each against l >= 1),
// its l sums those rounded values in float32 and its O = sum_j p_j v_j accumulates in float32 (the
// rescaling by exp(m - m') is float32 too), so Y = O / l again carries at most u sum_j p_j |v_j| / l + u |Y|.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>

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
using testing::random_tensor;
using GB = testing::GraphBuilder;

const DataType kDtypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16};
const int64_t kSeqs[] = {1, 7, 77, 128, 129};
const int64_t kHeads[] = {1, 3, 12};

// The tactics under test: their names by dtype, the dtypes and head sizes they take, and whether V's
// head size may differ from Q's.
struct Under {
  std::string (*name)(DataType);
  std::vector<DataType> dtypes;
  std::vector<int64_t> head_dims;
  bool any_dv;
};
std::string cublaslt_name(DataType dt) {
  return dt == DataType::kFloat32   ? "attention_cublaslt_cuda"
         : dt == DataType::kFloat16 ? "attention_cublaslt_f16_cuda"
                                    : "attention_cublaslt_bf16_cuda";
}
std::string fused_name(DataType dt) {
  return dt == DataType::kFloat16 ? "attention_fused_f16_cuda" : "attention_fused_bf16_cuda";
}
const Under kCublasLt = {cublaslt_name, {std::begin(kDtypes), std::end(kDtypes)}, {8, 40, 64}, true};
const Under kFused = {fused_name, {DataType::kFloat16, DataType::kBFloat16}, {32, 64, 128}, false};
std::string flash2_name(DataType dt) {
  return dt == DataType::kFloat16 ? "attention_flash2_f16_cuda" : "attention_flash2_bf16_cuda";
}
const Under kFlash2 = {flash2_name, {DataType::kFloat16, DataType::kBFloat16}, {32, 64, 128}, false};
double tolerance(DataType dt) {
  if (dt == DataType::kFloat32) return 1e-4;
  return 3 * (dt == DataType::kFloat16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8)) + 1e-4;
}

enum class MaskKind {
  kNone,
  kKeyPaddingLarge,
  kKeyPaddingInfFullRow,
  kCausalInf,
  kFullRandom,
  kPerHead,
  kPerRow,
  kLeadingInf
};
const MaskKind kMaskKinds[] = {MaskKind::kNone,      MaskKind::kKeyPaddingLarge, MaskKind::kKeyPaddingInfFullRow,
                               MaskKind::kCausalInf, MaskKind::kFullRandom,      MaskKind::kPerHead,
                               MaskKind::kPerRow,    MaskKind::kLeadingInf};
// Cases 0..13 cycle through the first seven kinds; 14..16 have leading -inf keys (sequences 129, 1, 7
// against 129, 77 or 128, 1 keys: whole tiles of 64 keys fully masked before the visible ones).
constexpr int kCases = 17;
MaskKind mask_kind(int c) { return c < 14 ? kMaskKinds[c % 7] : MaskKind::kLeadingInf; }

// The mask of `kind` for scores [b, h, sq, sk] (undefined for kNone), float32.
Tensor make_mask(MaskKind kind, int64_t b, int64_t h, int64_t sq, int64_t sk, uint64_t seed) {
  const float ninf = -std::numeric_limits<float>::infinity();
  switch (kind) {
    case MaskKind::kNone: return Tensor();
    case MaskKind::kKeyPaddingLarge:
    case MaskKind::kKeyPaddingInfFullRow: {  // [b, 1, 1, sk]: batch i keeps its first sk - i keys, the last none
      const float value = kind == MaskKind::kKeyPaddingInfFullRow ? ninf : -10000.f;
      Tensor m(DataType::kFloat32, {b, 1, 1, sk});
      for (int64_t i = 0; i < b; ++i)
        for (int64_t j = 0; j < sk; ++j)
          m.data<float>()[i * sk + j] = j >= sk - i || (i == b - 1 && b > 1) ? value : 0.f;
      return m;
    }
    case MaskKind::kCausalInf: {  // [sq, sk]: key j visible from row i when j <= i + (sk - sq)
      Tensor m(DataType::kFloat32, {sq, sk});
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t j = 0; j < sk; ++j)
          m.data<float>()[i * sk + j] = j <= i + std::max<int64_t>(sk - sq, 0) ? 0.f : ninf;
      return m;
    }
    case MaskKind::kFullRandom: return random_tensor({b, h, sq, sk}, seed, DataType::kFloat32, -2, 2);
    case MaskKind::kPerHead: return random_tensor({1, h, 1, sk}, seed, DataType::kFloat32, -3, 1);
    case MaskKind::kPerRow: return random_tensor({b, 1, sq, 1}, seed, DataType::kFloat32, -1, 1);
    case MaskKind::kLeadingInf: {  // [b, 1, sq, sk]: row i sees only its last 1 + (i % 5) keys
      Tensor m(DataType::kFloat32, {b, 1, sq, sk});
      for (int64_t n = 0; n < b; ++n)
        for (int64_t i = 0; i < sq; ++i)
          for (int64_t j = 0; j < sk; ++j) m.data<float>()[(n * sq + i) * sk + j] = j >= sk - 1 - i % 5 ? 0.f : ninf;
      return m;
    }
  }
  return Tensor();
}

// The case in dtype `dt` for the GPU and its float32 twin (the same rounded values) for the reference.
struct Pair {
  LayerCase reduced, exact;
};
Pair in_dtype(const LayerCase& lc, DataType dt) {
  Pair p{lc, lc};
  for (size_t i = 0; i < lc.inputs.size(); ++i)
    if (lc.inputs[i].defined()) {
      p.reduced.inputs[i] = lc.inputs[i].cast(dt).value();
      p.exact.inputs[i] = p.reduced.inputs[i].cast(DataType::kFloat32).value();
    }
  return p;
}

// Runs the case on the GPU and checks it against the reference; returns the reference's NaN count.
int64_t check_case(const backends::DeviceRuntime& rt, const Under& u, const LayerCase& lc, DataType dt,
                   const std::string& what) {
  const std::string name = u.name(dt);
  const backends::Tactic* t = backends::find_tactic(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return 0;
  Pair p = in_dtype(lc, dt);
  std::vector<Tensor> want = testing::reference_outputs(p.exact);
  EXPECT_FALSE(want.empty()) << "the reference rejects " << what;
  if (want.empty()) return 0;
  auto got = testing::run_on_gpu(rt, *t, p.reduced, false, dt);
  EXPECT_TRUE(got.ok()) << what << ": " << got.status().message();
  if (!got.ok()) return 0;
  Tensor g = got.value()[0].cast(DataType::kFloat32).value();
  std::string where;
  const double tol = tolerance(dt);
  EXPECT_TRUE(testing::close_to(g, want[0], tol, dt == DataType::kFloat32 ? 1e-4 : 0.0, &where))
      << name << " " << what << ": " << where;
  int64_t nans = 0;
  for (int64_t i = 0; i < want[0].numel(); ++i) nans += std::isnan(want[0].get_f64(i));
  return nans;
}

std::string describe(const LayerCase& lc, MaskKind kind) {
  std::string s = lc.node.op_type + " mask kind " + std::to_string(static_cast<int>(kind));
  for (const Tensor& t : lc.inputs) s += " " + (t.defined() ? t.describe() : std::string("-"));
  for (const auto& [k, a] : lc.node.attrs) s += " " + k;
  return s;
}

void attention_cases(const backends::DeviceRuntime& rt, const Under& u) {
  int64_t nan_rows_seen = 0;
  for (DataType dt : u.dtypes) {
    for (int c = 0; c < kCases; ++c) {
      const int64_t b = 1 + 2 * (c % 2), h = kHeads[c % 3], sq = kSeqs[c % 5], sk = kSeqs[(3 * c + 2) % 5];
      const int64_t d = u.head_dims[(c + 1) % 3], dv = c % 4 == 3 && u.any_dv ? u.head_dims[c % 3] : d;
      const MaskKind kind = mask_kind(c);
      const bool k_transposed = c % 3 == 1, shared_kv = c % 5 == 4;
      const uint64_t seed = 100 + 10 * static_cast<uint64_t>(c);
      LayerCase lc;
      lc.node = make_node("kiln", "Attention", kind == MaskKind::kNone ? 3 : 4);
      lc.node.attrs["scale"] = ir::attr_float(c % 4 == 2 ? 1.f : 1.f / std::sqrt(static_cast<float>(d)));
      lc.node.attrs["k_transposed"] = ir::attr_int(k_transposed ? 1 : 0);
      const Dims kvb = shared_kv ? Dims{1, 1} : Dims{b, h};
      lc.inputs.push_back(random_tensor({b, h, sq, d}, seed));
      lc.inputs.push_back(
          random_tensor(k_transposed ? Dims{kvb[0], kvb[1], d, sk} : Dims{kvb[0], kvb[1], sk, d}, seed + 1));
      lc.inputs.push_back(random_tensor({kvb[0], kvb[1], sk, dv}, seed + 2));
      if (kind != MaskKind::kNone) lc.inputs.push_back(make_mask(kind, b, h, sq, sk, seed + 3));
      lc.constant.assign(lc.inputs.size(), false);
      int64_t nans = check_case(rt, u, lc, dt, describe(lc, kind));
      if (kind == MaskKind::kKeyPaddingInfFullRow && b > 1) EXPECT_GT(nans, 0) << "a fully masked batch: NaN rows";
      nan_rows_seen += nans;
    }
  }
  EXPECT_GT(nan_rows_seen, 0);
}

TEST(CudaAttention, AttentionMatchesTheReference) {
  KILN_SKIP_WITHOUT_GPU();
  attention_cases(*gpu, kCublasLt);
}

TEST(CudaAttention, FusedAttentionMatchesTheReference) {
  KILN_SKIP_WITHOUT_GPU();
  attention_cases(*gpu, kFused);
  attention_cases(*gpu, kFlash2);
}

void multi_head_cases(const backends::DeviceRuntime& rt, const Under& u) {
  for (DataType dt : u.dtypes) {
    for (int c = 0; c < kCases; ++c) {
      const bool packed = c % 3 == 0;
      const int64_t b = 1 + 2 * ((c + 1) % 2), h = kHeads[(c + 2) % 3], sq = kSeqs[c % 5];
      const int64_t sk = packed ? sq : kSeqs[(2 * c + 1) % 5];
      const int64_t d = u.head_dims[c % 3], dv = packed || c % 4 != 1 || !u.any_dv ? d : u.head_dims[(c + 1) % 3];
      const MaskKind kind = mask_kind(c < 14 ? (c + 3) % 7 : c);
      const uint64_t seed = 500 + 10 * static_cast<uint64_t>(c);
      LayerCase lc;
      lc.node = make_node("kiln", "MultiHeadAttention", kind == MaskKind::kNone ? 3 : 4);
      lc.node.attrs["num_heads"] = ir::attr_int(h);
      lc.node.attrs["scale"] = ir::attr_float(1.f / std::sqrt(static_cast<float>(d)));
      if (packed) {
        lc.node.inputs[1] = lc.node.inputs[2] = "";
        lc.inputs = {random_tensor({b, sq, 3 * h * d}, seed), Tensor(), Tensor()};
      } else {
        const Dims kvb = c % 5 == 2 ? Dims{1} : Dims{b};  // K/V shared by the batch
        lc.inputs = {random_tensor({b, sq, h * d}, seed), random_tensor({kvb[0], sk, h * d}, seed + 1),
                     random_tensor({kvb[0], sk, h * dv}, seed + 2)};
      }
      if (kind != MaskKind::kNone) lc.inputs.push_back(make_mask(kind, b, h, sq, sk, seed + 3));
      lc.constant.assign(lc.inputs.size(), false);
      int64_t nans = check_case(rt, u, lc, dt, describe(lc, kind));
      if (kind == MaskKind::kKeyPaddingInfFullRow && b > 1) EXPECT_GT(nans, 0) << "a fully masked batch: NaN rows";
    }
  }
}

TEST(CudaAttention, MultiHeadAttentionMatchesTheReference) {
  KILN_SKIP_WITHOUT_GPU();
  multi_head_cases(*gpu, kCublasLt);
}

TEST(CudaAttention, FusedMultiHeadAttentionMatchesTheReference) {
  KILN_SKIP_WITHOUT_GPU();
  multi_head_cases(*gpu, kFused);
  multi_head_cases(*gpu, kFlash2);
}

TEST(CudaAttention, DeclinesWhatItCannotRunWithTheReason) {
  // Signature checks only: no GPU needed.
  const backends::Tactic* t = backends::find_tactic("attention_cublaslt_cuda");
  if (!t) GTEST_SKIP() << "built without the CUDA backend";
  LayerCase lc;
  lc.node = make_node("kiln", "Attention", 3);
  lc.inputs = {random_tensor({2, 3, 5, 8}, 1), random_tensor({2, 1, 7, 8}, 2), random_tensor({2, 1, 7, 4}, 3)};
  lc.constant.assign(3, false);
  backends::LayerSignature sig = testing::cuda_signature(lc);
  EXPECT_NE(t->why_unsupported(sig).find("broadcasts only partly"), std::string::npos) << t->why_unsupported(sig);
  lc.inputs[1] = random_tensor({1, 1, 7, 8}, 2), lc.inputs[2] = random_tensor({7, 4}, 3);
  sig = testing::cuda_signature(lc);
  EXPECT_EQ(t->why_unsupported(sig), "");
  lc.inputs[0] = lc.inputs[0].cast(DataType::kFloat16).value();
  sig = testing::cuda_signature(lc);
  EXPECT_NE(t->why_unsupported(sig).find("float16"), std::string::npos) << t->why_unsupported(sig);
}

TEST(CudaAttention, FusedDeclinesWhatItCannotRunWithTheReason) {
  // Signature checks only: no GPU needed.
  const backends::Tactic* t = backends::find_tactic("attention_fused_f16_cuda");
  if (!t) GTEST_SKIP() << "built without the CUDA backend";
  ASSERT_NE(backends::find_tactic("attention_fused_bf16_cuda"), nullptr);
  EXPECT_EQ(backends::find_tactic("attention_fused_cuda"), nullptr) << "no float32 fused tactic";
  auto f16 = [](Tensor x) { return x.cast(DataType::kFloat16).value(); };
  LayerCase lc;
  lc.node = make_node("kiln", "Attention", 4);
  lc.inputs = {f16(random_tensor({2, 3, 5, 64}, 1)), f16(random_tensor({2, 3, 7, 64}, 2)),
               f16(random_tensor({1, 1, 7, 64}, 3)), f16(random_tensor({2, 1, 1, 7}, 4))};
  lc.constant.assign(4, false);
  EXPECT_EQ(t->why_unsupported(testing::cuda_signature(lc)), "");
  for (int64_t d : {8, 40, 96, 256}) {  // head sizes the kernel has no instance for
    lc.inputs[0] = f16(random_tensor({2, 3, 5, d}, 1)), lc.inputs[1] = f16(random_tensor({2, 3, 7, d}, 2));
    lc.inputs[2] = f16(random_tensor({1, 1, 7, d}, 3));
    const std::string why = t->why_unsupported(testing::cuda_signature(lc));
    EXPECT_NE(why.find("head size " + std::to_string(d)), std::string::npos) << why;
  }
  lc.inputs[0] = f16(random_tensor({2, 3, 5, 32}, 1)), lc.inputs[1] = f16(random_tensor({2, 3, 7, 32}, 2));
  lc.inputs[2] = f16(random_tensor({1, 1, 7, 64}, 3));  // V's head size 64, Q's 32
  std::string why = t->why_unsupported(testing::cuda_signature(lc));
  EXPECT_NE(why.find("V's head size 64"), std::string::npos) << why;
  lc.inputs[2] = f16(random_tensor({1, 1, 7, 32}, 3));
  EXPECT_EQ(t->why_unsupported(testing::cuda_signature(lc)), "");
  // At build time with a dynamic batch: the head size is known already and checked.
  backends::LayerSignature dyn = testing::cuda_signature(lc);
  for (auto& in : dyn.inputs) in.shape[0] = -1;
  ASSERT_FALSE(dyn.fully_known());
  EXPECT_EQ(t->why_unsupported(dyn), "");
  dyn.inputs[0].shape.back() = 40;
  why = t->why_unsupported(dyn);
  EXPECT_NE(why.find("head size 40"), std::string::npos) << why;
  // The dtype: the bfloat16 tactic declines float16 inputs, and float32 ones are nobody's here.
  why = backends::find_tactic("attention_fused_bf16_cuda")->why_unsupported(testing::cuda_signature(lc));
  EXPECT_NE(why.find("float16"), std::string::npos) << why;
  for (Tensor& x : lc.inputs) x = x.cast(DataType::kFloat32).value();
  why = t->why_unsupported(testing::cuda_signature(lc));
  EXPECT_NE(why.find("float32"), std::string::npos) << why;
  // The shared geometry checks still apply (partial batch broadcasting).
  for (Tensor& x : lc.inputs) x = f16(x);
  lc.inputs[1] = f16(random_tensor({2, 1, 7, 32}, 2));
  why = t->why_unsupported(testing::cuda_signature(lc));
  EXPECT_NE(why.find("broadcasts only partly"), std::string::npos) << why;
}

// A BERT-like encoder layer as torch exports it: packed-able Q/K/V projections (three MatMul + bias),
// heads split by Reshape/Transpose, scores / sqrt(d) + (1 - attention_mask) * -10000, Softmax,
// context merged back, output projection + residual, LayerNormalization, a GELU (Erf) FFN + residual.
// Head size kD (8: only the cuBLASLt tactic; 32: the fused one too); the weights' range shrinks as
// sqrt(32 / hidden) so that both sizes have the same value ranges (kD 8: 0.3).
constexpr int64_t kB = 3, kS = 13, kH = 4, kFfn = 64;

ir::Model bert_layer(int64_t kD) {
  const int64_t kHid = kH * kD;
  const double wr = 0.3 * std::sqrt(32.0 / static_cast<double>(kHid));
  GB b(17);
  b.input("x", {kB, kS, kHid}).input("am", {kB, 1, 1, kS}).output("y");
  uint64_t seed = 900;
  auto linear = [&](const std::string& x, const std::string& y, int64_t in, int64_t out) {
    b.init(y + "_w", random_tensor({in, out}, seed++, DataType::kFloat32, -wr, wr));
    b.init(y + "_b", random_tensor({out}, seed++, DataType::kFloat32, -0.1, 0.1));
    b.node("MatMul", {x, y + "_w"}, {y + "_mm"});
    b.node("Add", {y + "_mm", y + "_b"}, {y});
  };
  auto i64s = [](std::vector<int64_t> v) {
    Tensor t(DataType::kInt64, {static_cast<int64_t>(v.size())});
    for (size_t i = 0; i < v.size(); ++i) t.data<int64_t>()[i] = v[i];
    return t;
  };
  b.init("heads", i64s({kB, kS, kH, kD})).init("merged", i64s({kB, kS, kHid}));
  b.init("sqrt_d", Tensor::scalar<float>(DataType::kFloat32, std::sqrt(static_cast<float>(kD))));
  b.init("one", Tensor::scalar<float>(DataType::kFloat32, 1.f));
  b.init("neg", Tensor::scalar<float>(DataType::kFloat32, -10000.f));
  b.init("sqrt2", Tensor::scalar<float>(DataType::kFloat32, std::sqrt(2.f)));
  b.init("half", Tensor::scalar<float>(DataType::kFloat32, 0.5f));
  b.init("g1", random_tensor({kHid}, seed++, DataType::kFloat32, 0.5, 1.5)).init("be1", random_tensor({kHid}, seed++));
  b.node("Sub", {"one", "am"}, {"inv"});
  b.node("Mul", {"inv", "neg"}, {"mask"});
  for (const char* p : {"q", "k", "v"}) {
    const std::string s = p;
    linear("x", s, kHid, kHid);
    b.node("Reshape", {s, "heads"}, {s + "4"});
    GB::set_ints(b.node("Transpose", {s + "4"}, {s + "h"}), "perm", {0, 2, 1, 3});
  }
  GB::set_ints(b.node("Transpose", {"kh"}, {"kt"}), "perm", {0, 1, 3, 2});
  b.node("MatMul", {"qh", "kt"}, {"scores"});
  b.node("Div", {"scores", "sqrt_d"}, {"scaled"});
  b.node("Add", {"scaled", "mask"}, {"masked"});
  GB::set_int(b.node("Softmax", {"masked"}, {"probs"}), "axis", -1);
  b.node("MatMul", {"probs", "vh"}, {"ctx"});
  GB::set_ints(b.node("Transpose", {"ctx"}, {"ctx_t"}), "perm", {0, 2, 1, 3});
  b.node("Reshape", {"ctx_t", "merged"}, {"ctx_m"});
  linear("ctx_m", "attn", kHid, kHid);
  b.node("Add", {"x", "attn"}, {"r1"});
  GB::set_int(b.node("LayerNormalization", {"r1", "g1", "be1"}, {"ln1"}), "axis", -1);
  linear("ln1", "f1", kHid, kFfn);
  b.node("Div", {"f1", "sqrt2"}, {"g_div"});
  b.node("Erf", {"g_div"}, {"g_erf"});
  b.node("Add", {"g_erf", "one"}, {"g_add"});
  b.node("Mul", {"f1", "g_add"}, {"g_mul"});
  b.node("Mul", {"g_mul", "half"}, {"gelu"});
  linear("gelu", "f2", kFfn, kHid);
  b.node("Add", {"ln1", "f2"}, {"y"});
  return b.finish();
}

void check_bert_layer(int64_t kD) {
  SCOPED_TRACE("head size " + std::to_string(kD));
  const int64_t kHid = kH * kD;
  ir::Model model = bert_layer(kD);
  const std::string onnx = onnx_import::serialize_model(model).value();
  Tensor x = random_tensor({kB, kS, kHid}, 7);
  Tensor am(DataType::kFloat32, {kB, 1, 1, kS});
  for (int64_t i = 0; i < kB; ++i)  // batch i pads its last 3 * i positions
    for (int64_t j = 0; j < kS; ++j) am.data<float>()[i * kS + j] = j < kS - 3 * i ? 1.f : 0.f;
  std::map<std::string, ops::Value> inputs = {{"x", ops::Value(x)}, {"am", ops::Value(am)}};
  const Tensor want = testing::run(model, inputs)[0].tensor;  // the reference interpreter, unoptimized graph
  for (Precision prec : {Precision::kFP32, Precision::kFP16}) {
    BuilderConfig cfg;
    cfg.device = {DeviceKind::kCUDA, 0};
    cfg.precision = prec;
    cfg.strict_tactics = true;
    std::vector<std::string> warnings;
    cfg.warn = [&warnings](const std::string& w) { warnings.push_back(w); };
    auto engine = Builder(cfg).build_from_memory(onnx);
    for (const auto& w : warnings) EXPECT_EQ(w.find("on the host"), std::string::npos) << w;
    int mha = 0;
    for (const auto& l : engine->impl().layers) {
      EXPECT_NE(l.op_type, "Transpose") << l.name << ": the heads are read in place";
      EXPECT_NE(l.op_type, "Softmax") << l.name;
      EXPECT_NE(l.kernel, "reference") << l.name << " (" << l.op_type << ")";
      if (l.op_type != "MultiHeadAttention") continue;
      // Either tactic (the tuner picks the faster); the fused one only where it applies.
      const bool cublaslt = l.kernel.rfind("attention_cublaslt", 0) == 0;
      const bool fused = l.kernel.rfind("attention_fused", 0) == 0 || l.kernel.rfind("attention_flash2", 0) == 0;
      EXPECT_TRUE(cublaslt || fused) << l.kernel;
      EXPECT_FALSE(fused && (kD != 32 || prec != Precision::kFP16)) << l.kernel << " at head size " << kD;
      mha += cublaslt || fused;
      std::cout << "head size " << kD << (prec == Precision::kFP16 ? " fp16: " : " fp32: ") << l.name << " runs "
                << l.kernel << "\n";
    }
    EXPECT_EQ(mha, 1) << engine->inspect_json();
    auto ctx = engine->create_context();
    for (int run = 0; run < 2; ++run) {
      ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
      ctx->set_input("am", HostTensor::f32(am.shape(), am.data<float>()));
      ctx->run();
      HostTensor y = ctx->output("y");
      ASSERT_EQ(y.numel(), want.numel());
      // float32: the CPU engines' 1e-4. float16: every layer rounds its output (u = 2^-11); the FFN's
      // second product sums 64 terms |w| <= 0.3 (head size 32: 0.15) times GELU outputs of a few units, each carrying a
      // few u from upstream (random signs: about sqrt(64) * 0.3 * 3 * 4u ~ 30u); 128u leaves room, while a wrong
      // attention output moves y by O(0.1).
      const double tol = prec == Precision::kFP32 ? 1e-4 : 128 * std::ldexp(1.0, -11);
      for (int64_t i = 0; i < want.numel(); ++i) {
        const double w = want.get_f64(i);
        ASSERT_NEAR(y.as<float>()[i], w, tol * std::max(1.0, std::fabs(w))) << "element " << i;
      }
    }
  }
}

TEST(CudaAttention, BertLikeLayerStrictOnGpuMatchesTheReference) {
  KILN_SKIP_WITHOUT_GPU();
  check_bert_layer(8);   // the cuBLASLt tactic
  check_bert_layer(32);  // float16: either
}

}  // namespace
}  // namespace kiln
