// Every op declaring ops::trait::kEpilogue with a oneDNN post-op (OpTraits::onednn_post_op) is an
// activation the oneDNN convolution takes as that post-op: the trait table and onednn_common.cc's
// mapping agree.
#include <gtest/gtest.h>

#include "backends/registry.h"
#include "layer_case.h"
#include "ops/op_traits.h"

namespace kiln {
namespace {

TEST(EpilogueTraits, OneDnnConvTakesEveryEpilogueWithAPostOp) {
  // The blocked variant: the plain one declines this 3x3 conv (im2col, onednn_conv.cc); both map
  // activations to post-ops with the same code.
  const backends::Tactic* conv = backends::find_tactic("conv2d_onednn_blocked");
  if (!conv) GTEST_SKIP() << "built without oneDNN";
  const ops::OpTraitTable& table = ops::OpTraitTable::get();
  int checked = 0;
  for (const auto& [domain, op] : table.ops()) {
    const ops::OpTraits& t = table.of(domain, op);
    if (!t.has(ops::trait::kEpilogue) || domain.rfind("kiln.test", 0) == 0) continue;
    ASSERT_NE(t.onednn_post_op, nullptr) << domain << "." << op << ": an epilogue names its oneDNN post-op";
    testing::LayerCase lc;
    lc.node = testing::make_node("kiln", "FusedConv", 2);
    lc.node.attrs["pads"] = ir::attr_ints({1, 1, 1, 1});
    testing::set_string(lc.node, "activation", op);  // kiln.Gelu fuses as activation "Gelu"
    testing::add_conv_inputs(lc, 5, {1, 8, 7, 6}, {8, 8, 3, 3}, false, false);
    EXPECT_EQ(conv->why_unsupported(testing::layer_signature(lc)), "")
        << domain << "." << op << " (oneDNN " << t.onednn_post_op << ")";
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

}  // namespace
}  // namespace kiln
