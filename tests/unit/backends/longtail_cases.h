// Random layers of the long-tail ops for the tactic test (tactic_test.cc): Resize in every mode,
// coordinate transform and input form (odd sizes, up and down, leading axes resized too, which the
// tactic must decline). Header-only, like layer_case.h.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "layer_case.h"

namespace kiln::testing {

inline Tensor i64_tensor(const std::vector<int64_t>& v) {
  Tensor t(DataType::kInt64, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.data<int64_t>()[i] = v[i];
  return t;
}

inline Tensor f32_tensor(const std::vector<float>& v) {
  Tensor t(DataType::kFloat32, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = v[i];
  return t;
}

inline LayerCase resize_case(std::mt19937& rng, uint64_t seed) {
  const int64_t rank = pick(rng, 1, 4);
  Dims x(static_cast<size_t>(rank));
  for (int64_t d = 0; d < rank; ++d) x[static_cast<size_t>(d)] = d + 2 >= rank ? pick(rng, 1, 13) : pick(rng, 1, 4);
  const bool upsample = rng() % 10 == 0;
  static const int kOpsets[] = {11, 13, 18, 19};
  LayerCase lc;
  lc.node = make_node("", upsample ? "Upsample" : "Resize", upsample ? 2 : 4);
  ir::Node& n = lc.node;
  n.opset = upsample ? 9 : kOpsets[rng() % 4];
  static const char* kModes[] = {"nearest", "linear", "cubic"};
  std::string mode = kModes[rng() % (upsample ? 2 : 3)];
  set_string(n, "mode", mode);
  static const char* kCoords[] = {"half_pixel", "pytorch_half_pixel",   "align_corners",      "asymmetric",
                                  "half_pixel", "tf_half_pixel_for_nn", "tf_crop_and_resize", "half_pixel_symmetric"};
  std::string coord = kCoords[rng() % (n.opset >= 19 ? 8 : 7)];
  static const char* kNearest[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  if (!upsample) {
    set_string(n, "coordinate_transformation_mode", coord);
    if (mode == "nearest") set_string(n, "nearest_mode", kNearest[rng() % 4]);
    if (mode == "cubic" && rng() % 2) set_float(n, "cubic_coeff_a", -0.5f);
    if (mode != "nearest" && rng() % 4 == 0) GraphBuilder::set_int(n, "exclude_outside", 1);
    if (n.opset >= 18 && mode != "nearest" && rng() % 4 == 0) GraphBuilder::set_int(n, "antialias", 1);
    if (coord == "tf_crop_and_resize" && rng() % 2) set_float(n, "extrapolation_value", -7.f);
  }
  // The resized axes: the last two (or fewer) in most cases, sometimes a leading one too.
  std::vector<bool> resized(static_cast<size_t>(rank), false);
  for (int64_t d = std::max<int64_t>(0, rank - 2); d < rank; ++d) resized[static_cast<size_t>(d)] = rng() % 4 != 0;
  if (rank > 2 && rng() % 6 == 0) resized[0] = true;
  bool use_sizes = !upsample && rng() % 2;
  std::vector<float> scales;
  std::vector<int64_t> sizes;
  static const float kScales[] = {0.5f, 0.75f, 1.f, 1.5f, 2.f, 3.f, 8.f / 3.f, 0.4f};
  for (int64_t d = 0; d < rank; ++d) {
    int64_t in = x[static_cast<size_t>(d)];
    if (!resized[static_cast<size_t>(d)]) {
      scales.push_back(1.f), sizes.push_back(in);
      continue;
    }
    scales.push_back(kScales[rng() % 8]);
    sizes.push_back(pick(rng, 1, 2 * in + 3));
  }
  lc.inputs = {random_tensor(x, seed, DataType::kFloat32, -2, 2)};
  lc.constant = {false};
  if (upsample) {
    lc.inputs.push_back(f32_tensor(scales));
    lc.constant.push_back(true);
    return lc;
  }
  // roi: used by tf_crop_and_resize only (starts / ends per axis)
  if (coord == "tf_crop_and_resize") {
    std::vector<float> roi(static_cast<size_t>(2 * rank));
    for (int64_t d = 0; d < rank; ++d) {
      bool r = resized[static_cast<size_t>(d)];
      roi[static_cast<size_t>(d)] = r ? static_cast<float>(pick(rng, 0, 4)) / 10.f : 0.f;
      roi[static_cast<size_t>(rank + d)] = r ? static_cast<float>(pick(rng, 6, 12)) / 10.f : 1.f;
    }
    lc.inputs.push_back(f32_tensor(roi));
  } else {
    lc.inputs.push_back(Tensor());
    n.inputs[1] = "";
  }
  if (use_sizes) {
    lc.inputs.push_back(Tensor());
    n.inputs[2] = "";
    lc.inputs.push_back(i64_tensor(sizes));
  } else {
    lc.inputs.push_back(f32_tensor(scales));
    lc.inputs.push_back(Tensor());
    n.inputs.pop_back();
    lc.inputs.pop_back();
  }
  lc.constant.resize(lc.inputs.size(), true);
  return lc;
}

inline LayerCase longtail_case(std::mt19937& rng, uint64_t seed, int which) {
  switch (which % 1) {
    default: return resize_case(rng, seed);
  }
}

}  // namespace kiln::testing
