// Test helpers for whole engines: run one input through, compare two runs' outputs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/tensor.h"
#include "kiln/kiln.h"

namespace kiln::testing {

// Runs `e` on input "x" and returns its output "logits".
inline std::vector<float> run_logits(const Engine& e, const Tensor& x) {
  auto ctx = e.create_context();
  ctx->set_input("x", HostTensor::f32(x.shape(), x.data<float>()));
  ctx->run();
  HostTensor y = ctx->output("logits");
  return std::vector<float>(y.as<float>(), y.as<float>() + y.numel());
}

// Equal sizes and each element within 1e-4 relative (absolute below 1).
inline void expect_close(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * std::max(1.f, std::fabs(b[i]))) << i;
}

}  // namespace kiln::testing
