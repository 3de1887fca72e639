// conv2d_onednn_nchw declines the convolutions oneDNN would run as im2col + GEMM in plain NCHW (a
// network's 3-channel stem, narrow grouped convs: 5-9x slower than the blocked variant), names why,
// and leaves them to conv2d_onednn_blocked, which computes them as the reference kernel does; it keeps
// the pointwise convs (1x1, stride 1, unpadded: a GEMM without im2col).
#include <gtest/gtest.h>

#include <cmath>

#include "backends/registry.h"
#include "layer_case.h"

namespace kiln {
namespace {

// Conv 3x3 (pads 1) of x [N, C, H, W] to M channels in `group` groups, stride `s`, bias.
testing::LayerCase conv_case(const Dims& x, int64_t m, int64_t group, int64_t s, int64_t k, uint64_t seed) {
  testing::LayerCase lc;
  lc.node = testing::make_node("", "Conv", 3);
  const int64_t p = k / 2;
  lc.node.attrs["group"] = ir::attr_int(group);
  lc.node.attrs["strides"] = ir::attr_ints({s, s});
  lc.node.attrs["pads"] = ir::attr_ints({p, p, p, p});
  testing::add_conv_inputs(lc, seed, x, {m, x[1] / group, k, k}, true, false);
  return lc;
}

TEST(OnednnConvPlain, DeclinesIm2colConvsTheBlockedVariantComputesThem) {
  const backends::Tactic* plain = backends::find_tactic("conv2d_onednn_nchw");
  const backends::Tactic* blocked = backends::find_tactic("conv2d_onednn_blocked");
  if (!plain || !blocked) GTEST_SKIP() << "built without oneDNN";
  // regnet_y_400mf's stem (3 -> 32, stride 2) and its 48-channel group-6 stride-2 conv, at odd sizes.
  const testing::LayerCase cases[] = {conv_case({1, 3, 37, 41}, 32, 1, 2, 3, 11),
                                      conv_case({2, 48, 29, 23}, 48, 6, 2, 3, 21)};
  for (const testing::LayerCase& lc : cases) {
    const std::string shape = dims_str(lc.inputs[0].shape());
    backends::LayerSignature sig = testing::layer_signature(lc);
    const std::string why = plain->why_unsupported(sig);
    EXPECT_NE(why.find("im2col + GEMM"), std::string::npos) << shape << ": " << why;
    EXPECT_NE(why.find("conv2d_onednn_blocked takes it"), std::string::npos) << why;
    ASSERT_EQ(blocked->why_unsupported(sig), "") << shape;
    auto prepared = blocked->prepare(sig);
    ASSERT_TRUE(prepared.ok()) << prepared.status().to_string();
    std::vector<Tensor> want = testing::reference_outputs(lc);
    ASSERT_EQ(want.size(), 1u);
    Tensor got(DataType::kFloat32, prepared.value()->output_shapes()[0]);
    ASSERT_EQ(got.shape(), want[0].shape());
    std::vector<const Tensor*> ins = {&lc.inputs[0], &lc.inputs[1], &lc.inputs[2]};
    ASSERT_TRUE(prepared.value()->run_standalone(ins, {&got}).ok());
    int bad = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      const float w = want[0].data<float>()[i], g = got.data<float>()[i];
      bad += !(std::fabs(w - g) <= 1e-4f * std::max(1.f, std::fabs(w)));
    }
    EXPECT_EQ(bad, 0) << shape << ": conv2d_onednn_blocked differs from the reference";
  }
}

TEST(OnednnConvPlain, KeepsPointwiseConvs) {
  const backends::Tactic* plain = backends::find_tactic("conv2d_onednn_nchw");
  if (!plain) GTEST_SKIP() << "built without oneDNN";
  testing::LayerCase lc = conv_case({1, 208, 13, 15}, 208, 1, 1, 1, 31);  // 1x1, stride 1, unpadded
  EXPECT_EQ(plain->why_unsupported(testing::layer_signature(lc)), "");
}

}  // namespace
}  // namespace kiln
