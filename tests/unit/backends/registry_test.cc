// The tactic registry: a tactic's TacticInfo (device, instruction set, precision, dtypes) is checked
// against the signature and the target before why_unsupported() is asked, and the first part that
// does not fit is the reason it is declined.
#include <gtest/gtest.h>

#include "backends/device_runtime.h"
#include "backends/registry.h"
#include "engine/tactics.h"

namespace kiln {
namespace {

using backends::LayerSignature;
using backends::Tactic;
using backends::TacticInfo;

// A Relu tactic needing AVX-512 BF16; why_unsupported accepts everything (so any decline is the
// registry's, from the info).
class Bf16Relu : public Tactic {
 public:
  std::string name() const override { return "relu_bf16_test"; }
  TacticInfo info() const override { return TacticInfo::cpu_f32(kIsaAvx2 | kIsaAvx512 | kIsaAvx512Bf16); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Relu"}}; }
  std::string why_unsupported(const LayerSignature&) const override { return ""; }
  Result<std::unique_ptr<backends::PreparedLayer>> prepare(const LayerSignature&) const override {
    return Unsupported("not for running");
  }
};

struct Relu {
  ir::Node node;
  LayerSignature sig;
  Relu() {
    node.op_type = "Relu";
    node.inputs = {"x"};
    node.outputs = {"y"};
    sig.node = &node;
    backends::TensorSig x;
    x.present = true;
    x.dtype = DataType::kFloat32;
    x.shape = {2, 8};
    sig.inputs = {x};
    sig.outputs = {x};
  }
};

TEST(Registry, TacticNeedingAnInstructionSetTheTargetLacksIsDeclinedWithTheReason) {
  Bf16Relu t;
  Relu l;
  l.sig.isa = kIsaAvx2;
  EXPECT_EQ(backends::why_declined(t, l.sig), "needs avx512 avx512_bf16; the target has avx2");
  l.sig.isa = kIsaAvx2 | kIsaAvx512;
  EXPECT_EQ(backends::why_declined(t, l.sig), "needs avx512_bf16; the target has avx2 avx512");
  l.sig.isa = kIsaAll;
  EXPECT_EQ(backends::why_declined(t, l.sig), "");
}

TEST(Registry, PrecisionDtypesAndDeviceAreCheckedFromTheInfo) {
  Bf16Relu t;
  Relu l;
  l.sig.isa = kIsaAll;
  l.sig.compute = DataType::kFloat16;
  EXPECT_EQ(backends::why_declined(t, l.sig), "computes in float32; the layer computes in float16");
  l.sig.compute = DataType::kFloat32;
  l.sig.inputs[0].dtype = DataType::kInt8;
  EXPECT_EQ(backends::why_declined(t, l.sig), "takes float32 input 0; the layer's is int8");
  l.sig.inputs[0].dtype = DataType::kFloat32;
  l.sig.outputs[0].dtype = DataType::kBFloat16;
  EXPECT_EQ(backends::why_declined(t, l.sig), "makes float32 output 0; the layer's is bfloat16");
  l.sig.outputs[0].dtype = DataType::kUndefined;  // not inferred: not held against it
  EXPECT_EQ(backends::why_declined(t, l.sig), "");
  l.sig.device = {DeviceKind::kCUDA, 1};
  EXPECT_FALSE(backends::implements(t, l.sig));  // another device's layer: not even a decline
  EXPECT_EQ(backends::why_declined(t, l.sig), "runs on cpu; the layer is on cuda:1");
  // Tactics that move or compare data take any dtype in any precision.
  TacticInfo any = TacticInfo::cpu_any_dtype();
  l.sig.device = {};
  l.sig.compute = DataType::kInt8;
  l.sig.inputs[0].dtype = DataType::kInt8;
  EXPECT_EQ(backends::info_mismatch(any, l.sig), "");
}

TEST(Registry, OneRegistryOfEveryTacticInfoByName) {
  const auto& all = backends::all_tactics();
  const bool cuda = backends::device_runtime(DeviceKind::kCUDA) != nullptr;
  int cuda_tactics = 0;
  for (const Tactic* t : all) {
    EXPECT_EQ(backends::find_tactic(t->name()), t);
    cuda_tactics += t->info().device == DeviceKind::kCUDA;
    if (!cuda) EXPECT_EQ(t->info().device, DeviceKind::kCPU) << t->name();
  }
  EXPECT_EQ(backends::find_tactic("no_such_tactic"), nullptr);
  // A CUDA layer has candidates only in a kiln with the CUDA backend, and they are CUDA tactics.
  Relu l;
  l.sig.device = {DeviceKind::kCUDA, 0};
  auto candidates = backends::candidate_tactics(l.sig);
  EXPECT_EQ(candidates.empty(), !cuda);
  for (const Tactic* t : candidates) EXPECT_EQ(t->info().device, DeviceKind::kCUDA) << t->name();
  EXPECT_EQ(cuda_tactics > 0, cuda);
}

// The real case: oneDNN's Winograd is AVX-512 only, so a target capped at AVX2 (kiln build --isa avx2)
// declines it with that reason before asking the tactic, and keeps the direct blocked conv.
TEST(Registry, AnAvx2TargetDeclinesOneDnnsWinogradWithTheReason) {
  const Tactic* winograd = backends::find_tactic("conv2d_onednn_nchwc_winograd");
  if (!winograd) GTEST_SKIP() << "built without oneDNN";
  EXPECT_EQ(winograd->info().isa, kIsaAvx512);
  ir::Node n;
  n.domain = "kiln";
  n.op_type = "BlockedConv";
  n.inputs = {"x"};
  n.outputs = {"y"};
  LayerSignature sig;
  sig.node = &n;
  backends::TensorSig x;
  x.present = true;
  x.dtype = DataType::kFloat32;
  x.shape = {1, 4, 8, 8, 8};
  sig.inputs = {x};
  sig.outputs.resize(1);
  sig.isa = kIsaAvx2;
  engine::Candidates c = engine::candidates_for(sig, engine::tactic_filter({}));
  bool declined = false;
  for (const auto& d : c.declined)
    if (d.tactic == "conv2d_onednn_nchwc_winograd") {
      declined = true;
      EXPECT_EQ(d.reason, "needs avx512; the target has avx2");
    }
  EXPECT_TRUE(declined);
  for (const Tactic* t : c.allowed) EXPECT_NE(t->name(), "conv2d_onednn_nchwc_winograd");
}

}  // namespace
}  // namespace kiln
