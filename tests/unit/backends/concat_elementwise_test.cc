// kiln.BlockedConcatElementwise's two variants (concat_elementwise_blocked_kiln, split over the
// threads from 32K elements a thread, and ..._single_thread) against the reference kernel on layers
// large enough for the threaded one to split (DenseNet-sized maps at batch 1: odd H and W, 1-4 pieces
// of 1-4 channel blocks, per-channel and one-value operands), on every instruction-set path.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backends/cpu/xformer_tactics.h"
#include "core/parallel.h"
#include "core/target.h"
#include "layer_case.h"

namespace kiln {
namespace {

using testing::LayerCase;
using testing::make_node;
using testing::pick;

ir::Node body_node(const std::string& op, std::vector<std::string> ins, const std::string& out) {
  ir::Node nd;
  nd.name = out;
  nd.op_type = op;
  nd.opset = 17;
  nd.inputs = std::move(ins);
  nd.outputs = {out};
  return nd;
}

// Pieces [N, Cb_i, H, W, 16] concatenated, then Relu(x * scale + shift) (DenseNet's BatchNorm +
// ReLU) or Sigmoid(x + shift), per channel or by one value.
LayerCase large_case(std::mt19937& rng, uint64_t seed) {
  const int64_t n = pick(rng, 1, 2), h = pick(rng, 17, 45) | 1, w = pick(rng, 19, 47) | 1, block = 16;
  const int64_t pieces = pick(rng, 1, 4);
  LayerCase lc;
  int64_t blocks = 0;
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t cb = pick(rng, 1, 4);
    blocks += cb;
    lc.inputs.push_back(testing::random_tensor({n, cb, h, w, block}, seed + static_cast<uint64_t>(p)));
    lc.constant.push_back(false);
  }
  auto body = std::make_shared<ir::Graph>();
  body->name = "body";
  for (const char* in : {"c", "scale", "shift"}) body->inputs.push_back({in, ir::TypeInfo::tensor(DataType::kFloat32)});
  for (int k = 0; k < 2; ++k) {
    lc.inputs.push_back(rng() % 3 == 0 ? Tensor::scalar<float>(DataType::kFloat32, 0.5f)
                                       : testing::random_tensor({1, blocks, 1, 1, block}, seed + 50 + k));
    lc.constant.push_back(true);
  }
  if (rng() % 2) {
    body->nodes = {body_node("Mul", {"c", "scale"}, "t0"), body_node("Add", {"t0", "shift"}, "t1"),
                   body_node("Relu", {"t1"}, "t2")};
  } else {
    body->nodes = {body_node("Mul", {"scale", "c"}, "t0"), body_node("Add", {"t0", "shift"}, "t1"),
                   body_node("Sigmoid", {"t1"}, "t2")};
  }
  body->outputs.push_back({"t2", ir::TypeInfo::tensor(DataType::kFloat32)});
  lc.node = make_node("kiln", "BlockedConcatElementwise", lc.inputs.size());
  testing::GraphBuilder::set_int(lc.node, "block", block);
  testing::GraphBuilder::set_int(lc.node, "pieces", pieces);
  ir::Attribute at;
  at.type = ir::Attribute::Type::kGraph;
  at.g = body;
  lc.node.attrs["body"] = at;
  return lc;
}

TEST(ConcatElementwise, BothVariantsMatchTheReferenceOnLargeLayers) {
  std::vector<std::string> isas = {"scalar"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isas.push_back("avx2");
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    isas.push_back("avx512");
  std::mt19937 rng(4242);
  int checked = 0;
  for (int iter = 0; iter < 12; ++iter) {
    LayerCase lc = large_case(rng, 7000 + 10 * iter);
    Tensor want = testing::reference_output(lc);
    ASSERT_TRUE(want.defined());
    for (const backends::Tactic* t : {backends::cpu::concat_elementwise_blocked_kiln(),
                                      backends::cpu::concat_elementwise_blocked_kiln_single_thread()}) {
      for (const std::string& isa : isas) {
        backends::LayerSignature sig = testing::layer_signature(lc);
        ASSERT_TRUE(parse_isa_level(isa == "scalar" ? "portable" : isa, &sig.isa));
        ASSERT_EQ(t->why_unsupported(sig), "") << t->name();
        auto prepared = t->prepare(sig);
        ASSERT_TRUE(prepared.ok()) << prepared.status().to_string();
        Tensor got(DataType::kFloat32, want.shape());
        std::vector<const Tensor*> ins;
        for (const Tensor& x : lc.inputs) ins.push_back(&x);
        ASSERT_TRUE(prepared.value()->run_standalone(ins, {&got}).ok());
        int bad = 0;
        for (int64_t i = 0; i < want.numel(); ++i) {
          const float wv = want.data<float>()[i], gv = got.data<float>()[i];
          if (!(std::fabs(wv - gv) <= 1e-5f * std::max(1.f, std::fabs(wv))) && bad++ < 3)
            ADD_FAILURE() << t->name() << " [" << isa << "] case " << iter << " element " << i << ": want " << wv
                          << ", got " << gv;
        }
        EXPECT_EQ(bad, 0) << t->name() << " [" << isa << "] case " << iter << " " << dims_str(want.shape());
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 12 * 2 * static_cast<int>(isas.size()));
}

}  // namespace
}  // namespace kiln
