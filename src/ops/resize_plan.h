// Resize's geometry as the reference kernel (resize.cc) computes it, shared with the CPU tactic
// (backends/cpu/resize_tactic.cc) so that both read the attributes and the roi / scales / sizes
// inputs, and place their interpolation taps, the same way.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln::ops {

// One axis of X: for output coordinate o, taps [o * n, (o + 1) * n) of (index, weight), or the
// extrapolation value where extrapolate[o] (tf_crop_and_resize outside the roi).
struct ResizeAxis {
  int64_t in = 0, out = 0;
  bool identity = false;  // linear / cubic skip it (out == in, scale 1, no crop); nearest still gathers
  int64_t n = 0;
  std::vector<int64_t> index;
  std::vector<double> weight;
  std::vector<char> extrapolate;
};

struct ResizeGeometry {
  bool nearest = false;  // else linear or cubic: a weighted sum per axis, axes that shrink first
  double extrapolation = 0.0;
  Dims out_shape;
  std::vector<ResizeAxis> axes;  // one per dim of X (taps filled only when out_shape has elements)
};

// The geometry of a Resize / Upsample node for X of shape `x`. `input(i)` gives node input i
// (nullptr when missing); InvalidArgument / InvalidModel / Unsupported as the kernel reports them.
Result<ResizeGeometry> resize_geometry(const ir::Node& node, const Dims& x,
                                       const std::function<const Tensor*(size_t)>& input);

}  // namespace kiln::ops
