// The layers a plain-NCHW oneDNN conv took before it left the tactic list (tactic_list.cc: oneDNN
// runs them as [im2col +] SGEMM, slow for a 3-channel stem and narrow grouped convs, and allocating
// inside every run for the 1x1 ones) are taken by conv2d_onednn_blocked and conv2d_kiln_1x1, which
// compute them as the reference kernel does.
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

// `t` takes the layer and computes what the reference kernel does.
void expect_matches_reference(const backends::Tactic& t, const testing::LayerCase& lc) {
  const std::string shape = dims_str(lc.inputs[0].shape());
  backends::LayerSignature sig = testing::layer_signature(lc);
  ASSERT_EQ(t.why_unsupported(sig), "") << t.name() << " " << shape;
  auto prepared = t.prepare(sig);
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
  EXPECT_EQ(bad, 0) << shape << ": " << t.name() << " differs from the reference";
}

TEST(OnednnConvPlain, NoPlainNchwConvInTheList) {
  if (!backends::find_tactic("conv2d_onednn_blocked")) GTEST_SKIP() << "built without oneDNN";
  EXPECT_EQ(backends::find_tactic("conv2d_onednn_nchw"), nullptr);
}

TEST(OnednnConvPlain, TheBlockedVariantComputesStemsAndGroupedConvs) {
  const backends::Tactic* blocked = backends::find_tactic("conv2d_onednn_blocked");
  if (!blocked) GTEST_SKIP() << "built without oneDNN";
  // regnet_y_400mf's stem (3 -> 32, stride 2) and its 48-channel group-6 stride-2 conv, at odd sizes.
  expect_matches_reference(*blocked, conv_case({1, 3, 37, 41}, 32, 1, 2, 3, 11));
  expect_matches_reference(*blocked, conv_case({2, 48, 29, 23}, 48, 6, 2, 3, 21));
}

// regnet_y_400mf's 208 -> 208 1x1 conv at odd sizes, which oneDNN's SGEMM had allocated 72 KiB a run
// for.
TEST(OnednnConvPlain, Kiln1x1ComputesPointwiseConvs) {
  const backends::Tactic* kiln1x1 = backends::find_tactic("conv2d_kiln_1x1");
  ASSERT_NE(kiln1x1, nullptr);
  expect_matches_reference(*kiln1x1, conv_case({1, 208, 13, 15}, 208, 1, 1, 1, 31));
  expect_matches_reference(*kiln1x1, conv_case({3, 104, 9, 11}, 104, 1, 1, 1, 41));
}

}  // namespace
}  // namespace kiln
