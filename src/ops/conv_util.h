// Sliding-window geometry shared by the convolution and pooling ops: reading kernel_shape /
// strides / dilations / pads / auto_pad / ceil_mode, validating them, and computing output extents
// and the pads actually applied.
#pragma once

#include <string>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {

// Attribute values are bounded so that window arithmetic ((k-1)*d + 1, o*s + ...) cannot overflow.
inline constexpr int64_t kMaxWindowAttr = int64_t{1} << 31;
// Largest spatial extent window arithmetic accepts (larger symbolic dims infer as unknown).
inline constexpr int64_t kMaxExtent = int64_t{1} << 40;

struct Window {
  size_t rank = 0;  // number of spatial dims
  Dims kernel, strides, dilations, pad_begin, pad_end;
  std::string auto_pad = "NOTSET";  // NOTSET, SAME_UPPER, SAME_LOWER, VALID
  bool ceil_mode = false;

  int64_t extent(size_t d) const { return (kernel[d] - 1) * dilations[d] + 1; }  // dilated kernel size
};

struct WindowOptions {
  bool has_dilations = true;  // attribute exists in this op/opset
  bool has_ceil_mode = false;
  bool kernel_required = false;  // pooling: kernel_shape is a required attribute
  bool transpose = false;        // ConvTranspose: output_shape / output_padding, scatter geometry
};

// The window attributes ONNX op `op_type` has at `opset`: MaxPool, AveragePool and LpPool (kernel
// required; dilations and ceil_mode from the opsets that added them), MaxUnpool (no dilations),
// ConvTranspose (transpose); anything else is read as Conv (the kiln.Fused*/Blocked* forms too).
WindowOptions window_options(const std::string& op_type, int opset);

// Reads and validates the window attributes of `node` for `rank` spatial dims. `kernel_from_weights`
// (W's spatial dims, for Conv) is used when kernel_shape is absent; when both exist they must agree.
// A null `kernel_from_weights` with no kernel_shape leaves `kernel` empty (unknown).
Result<Window> read_window(const ir::Node& node, size_t rank, const Dims* kernel_from_weights,
                           const WindowOptions& opts);

// Output extent along spatial dim d for input extent `in`; fills the pads actually applied
// (auto_pad SAME_* computes them from `in`). Errors when the window does not fit.
Result<int64_t> window_output(const Window& w, size_t d, int64_t in, int64_t* pad_begin, int64_t* pad_end);

// Same, for shape inference: an unknown input extent (or unknown kernel) gives an unknown dim;
// a definite misfit gives an error.
Result<Dim> window_output_sym(const Window& w, size_t d, const Dim& in);

// The range [lo, hi) of output positions o in [0, out) with 0 <= o * stride + offset < in.
void valid_output_range(int64_t offset, int64_t stride, int64_t in, int64_t out, int64_t* lo, int64_t* hi);

// Integer division rounding toward +infinity / -infinity (b > 0).
inline int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }
inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// ConvTranspose: the spatial part of output_shape (empty when absent; it may list the whole
// shape), output_padding (zeros when absent), validated for `n` spatial dims.
Result<Dims> transpose_output_shape(const ir::Node& node, size_t n);
Result<Dims> transpose_output_padding(const ir::Node& node, size_t n);
// ConvTranspose's output extent and begin pad along spatial dim d for input extent `in`
// (output_shape or auto_pad SAME_* derive the pads; else stride * (in - 1) + output_padding +
// dilated kernel - pads).
Status transpose_dim(const Window& w, size_t d, int64_t in, const Dims& out_shape, const Dims& out_pad, int64_t* out,
                     int64_t* pad_begin);

// A windowed op (Conv and its fused / quantized forms, ConvTranspose, the pools; any spatial rank)
// resolved for concrete shapes: the one place kernel, strides, dilations, pads (auto_pad SAME_UPPER /
// SAME_LOWER / VALID resolved, ceil_mode counted in `out`) and output extents are computed. The
// reference kernels, the kiln and oneDNN tactics and the passes that need concrete geometry read it;
// shape inference runs the same read_window / window_output on symbolic dims.
struct WindowGeometry {
  Window window;  // the attributes as read (kernel from W when kernel_shape is absent)
  Dims in, out;   // spatial extents of X and Y
  Dims kernel, strides, dilations;
  // The pads applied before and after each spatial dim. ConvTranspose: pad_begin is the one the
  // scatter subtracts, and pad_end = (in - 1) * stride + extent - pad_begin - out (negative where
  // output_padding / output_shape reach past the last input's window).
  Dims pad_begin, pad_end;
  size_t rank() const { return in.size(); }
  int64_t extent(size_t d) const { return (kernel[d] - 1) * dilations[d] + 1; }  // dilated kernel size
};

// Resolves `node`'s window on X `input_shape` [N, C, spatial...]; `weight_shape` is W ([M, C/group,
// k...] for Conv, [C, M/group, k...] for ConvTranspose; its spatial dims are the kernel) or null for
// pooling. Options from window_options(node.op_type, node.opset) unless given (kiln.BlockedPool
// passes its source op's). Attribute errors are InvalidModel, shape errors (rank, a window that does
// not fit, an extent out of range) InvalidArgument; both name the node.
Result<WindowGeometry> resolve_window(const ir::Node& node, const Dims& input_shape, const Dims* weight_shape);
Result<WindowGeometry> resolve_window(const ir::Node& node, const Dims& input_shape, const Dims* weight_shape,
                                      const WindowOptions& opts);

// Checks that t has rank >= 3 (N, C, spatial...) for op `what`.
Status check_nchw(const Tensor& t, const char* what, const char* input_name);

// Validated numel of a shape whose dims came from attributes / input values: errors instead of
// overflowing, and caps the total (elements) so a malicious model cannot request huge tensors.
Result<int64_t> checked_numel(const Dims& d);

}  // namespace kiln::ops
