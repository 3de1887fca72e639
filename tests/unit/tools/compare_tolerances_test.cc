// kiln compare's default tolerances follow the least precise format the engines compute in
// (default_tolerances, src/tools/compare_stats.cc), and an explicit --atol/--rtol wins over them.
#include <gtest/gtest.h>

#include "tools/compare_internal.h"

namespace kiln::tools::compare {
namespace {

std::unique_ptr<detail::EngineImpl> engine_with(std::vector<std::string> precisions,
                                                DeviceKind device = DeviceKind::kCPU, bool tf32 = false) {
  auto e = std::make_unique<detail::EngineImpl>();
  for (const auto& p : precisions) {
    detail::LayerInfo l;
    l.name = "layer" + std::to_string(e->layers.size());
    l.precision = p;
    e->layers.push_back(l);
  }
  e->built_for.device.kind = device;
  e->built_for.tf32 = tf32;
  return e;
}

TEST(CompareTolerances, FollowTheLeastPreciseFormat) {
  DefaultTolerances none = default_tolerances({nullptr});
  EXPECT_EQ(none.format, "fp32");
  EXPECT_EQ(none.atol, kDefaultAtol);
  EXPECT_EQ(none.rtol, kDefaultRtol);

  auto fp32 = engine_with({"fp32", "fp32"});
  EXPECT_EQ(default_tolerances({fp32.get()}).format, "fp32");
  EXPECT_EQ(default_tolerances({fp32.get()}).atol, kDefaultAtol);

  // One FP16 layer among FP32 ones (a mixed build) makes it an FP16 comparison.
  auto fp16 = engine_with({"fp32", "fp16", "fp32"}, DeviceKind::kCUDA);
  DefaultTolerances t16 = default_tolerances({fp16.get()});
  EXPECT_EQ(t16.format, "fp16");
  EXPECT_DOUBLE_EQ(t16.atol, 1e-2);
  EXPECT_DOUBLE_EQ(t16.rtol, 1e-2);
  EXPECT_TRUE(t16.note.empty());

  auto bf16 = engine_with({"bf16", "fp16"});
  DefaultTolerances tb = default_tolerances({bf16.get()});
  EXPECT_EQ(tb.format, "bf16");
  EXPECT_DOUBLE_EQ(tb.atol, 8e-2);
  EXPECT_GT(tb.atol, t16.atol);  // 3 fewer mantissa bits

  // TF32 rounds FP32 products to 10 mantissa bits on CUDA only; a CPU target's flag means nothing.
  auto tf32 = engine_with({"fp32"}, DeviceKind::kCUDA, true);
  EXPECT_EQ(default_tolerances({tf32.get()}).format, "tf32");
  EXPECT_DOUBLE_EQ(default_tolerances({tf32.get()}).atol, 1e-2);
  auto cpu_tf32 = engine_with({"fp32"}, DeviceKind::kCPU, true);
  EXPECT_EQ(default_tolerances({cpu_tf32.get()}).format, "fp32");

  // Two engines (the precision boundary): the less precise sets them, in either order.
  EXPECT_EQ(default_tolerances({fp32.get(), bf16.get()}).format, "bf16");
  EXPECT_EQ(default_tolerances({bf16.get(), fp32.get()}).format, "bf16");

  // INT8: no default follows from the format; the FP32 defaults stay, with a note saying so.
  auto int8 = engine_with({"int8", "fp32"});
  DefaultTolerances t8 = default_tolerances({int8.get()});
  EXPECT_EQ(t8.format, "fp32");
  EXPECT_EQ(t8.atol, kDefaultAtol);
  EXPECT_NE(t8.note.find("INT8"), std::string::npos);
}

TEST(CompareTolerances, ExplicitFlagsWin) {
  auto fp16 = engine_with({"fp16"}, DeviceKind::kCUDA);
  DefaultTolerances t = default_tolerances({fp16.get()});
  // No flag: the precision's default.
  EXPECT_DOUBLE_EQ(tolerance_for({}, "y", t.atol).value(), 1e-2);
  // A global flag, smaller or larger than the default, wins.
  EXPECT_DOUBLE_EQ(tolerance_for({"1e-6"}, "y", t.atol).value(), 1e-6);
  EXPECT_DOUBLE_EQ(tolerance_for({"0.5"}, "y", t.atol).value(), 0.5);
  // A flag naming another output leaves this one at the precision's default.
  EXPECT_DOUBLE_EQ(tolerance_for({"z:1e-6"}, "y", t.atol).value(), 1e-2);
  EXPECT_DOUBLE_EQ(tolerance_for({"z:1e-6"}, "z", t.atol).value(), 1e-6);
}

}  // namespace
}  // namespace kiln::tools::compare
