// prune_padding_taps: drops the kernel taps of a Conv that, at the graph's static input size, only
// ever read padding. DeepLabV3's ASPP convolves a 20x20 map (320 input, output stride 16) with 3x3
// kernels of dilation 24 and 36: every tap but the centre falls in the padding for every output, so
// the layer is a 1x1 convolution with the centre weights; run as written it costs 9x the FLOPs, and
// oneDNN takes seconds on such dilations. With the taps gone the layer keeps its output size.
//
// Matches plain ONNX Conv with constant weights and a known spatial input size. Per spatial axis the
// live taps are those k for which some output position o reads 0 <= o*stride + k*dilation - pad_begin
// < in; dead taps at both ends are cut (dead taps between live ones stay: they multiply zeros). The
// new begin pad is pad_begin - k0*dilation (the axis is left alone when that would be negative), the
// new end pad keeps the output extent (clamped at 0 when fewer than a stride of rows are left over). An axis reduced to
// one tap gets dilation 1. The weights become a new initializer (the original may be shared). Only after shapes are
// static: with a symbolic input size the set of live taps is unknown, and nothing is done.
#include "ir/attribute_builders.h"
#include "ir/rewrite.h"
#include "ops/conv_util.h"
#include "passes/pass.h"

namespace kiln::passes {

namespace {

struct AxisCut {
  int64_t first = 0, count = 0;  // live taps [first, first + count)
  int64_t pad_begin = 0, pad_end = 0, dilation = 1;
};

// The cut of one spatial axis, or count == kernel when nothing can go.
AxisCut cut_axis(const ops::Window& w, size_t d, int64_t in, int64_t out, int64_t pb) {
  const int64_t k = w.kernel[d], s = w.strides[d], dil = w.dilations[d];
  AxisCut c{0, k, pb, 0, dil};
  int64_t k0 = -1, k1 = -1;
  for (int64_t t = 0; t < k; ++t) {
    int64_t lo, hi;
    ops::valid_output_range(t * dil - pb, s, in, out, &lo, &hi);
    if (hi > lo) {
      if (k0 < 0) k0 = t;
      k1 = t;
    }
  }
  if (k0 < 0 || (k0 == 0 && k1 == k - 1)) return c;  // all taps dead (output = bias) or all live
  const int64_t count = k1 - k0 + 1, new_pb = pb - k0 * dil;
  const int64_t new_dil = count == 1 ? 1 : dil;
  int64_t new_pe = (out - 1) * s + (count - 1) * new_dil + 1 - in - new_pb;
  // A negative end pad means input rows past the last window: with pad 0 the output keeps its
  // extent as long as they are fewer than a stride.
  if (new_pe < 0 && -new_pe < s) new_pe = 0;
  if (new_pb < 0 || new_pe < 0) return c;
  return AxisCut{k0, count, new_pb, new_pe, new_dil};
}

// W[m, c, taps...] restricted to the cut taps (float weights only).
Tensor slice_taps(const Tensor& w, const std::vector<AxisCut>& cuts) {
  Dims shape = w.shape();
  for (size_t d = 0; d < cuts.size(); ++d) shape[2 + d] = cuts[d].count;
  Tensor out(w.dtype(), shape);
  const size_t spatial = cuts.size();
  const int64_t outer = shape[0] * shape[1];
  int64_t in_inner = 1, out_inner = 1;
  for (size_t d = 0; d < spatial; ++d) in_inner *= w.shape()[2 + d], out_inner *= shape[2 + d];
  const float* src = w.data<float>();
  float* dst = out.data<float>();
  std::vector<int64_t> idx(spatial, 0);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < out_inner; ++j) {
      // j -> per-axis index in the cut kernel, then into the original kernel
      int64_t rem = j, src_off = 0, stride = 1;
      for (size_t d = spatial; d-- > 0;) {
        idx[d] = rem % shape[2 + d];
        rem /= shape[2 + d];
      }
      for (size_t d = spatial; d-- > 0;) {
        src_off += (idx[d] + cuts[d].first) * stride;
        stride *= w.shape()[2 + d];
      }
      dst[o * out_inner + j] = src[o * in_inner + src_off];
    }
  }
  return out;
}

}  // namespace

Result<int> prune_padding_taps(ir::Graph& g) {
  int changed = 0;
  for (auto& n : g.nodes) {
    if (!n.domain.empty() || n.op_type != "Conv" || n.inputs.size() < 2) continue;
    const Tensor* w = ir::constant_value(g, n.inputs[1]);
    auto xt = g.value_types.find(n.inputs[0]);
    if (!w || w->dtype() != DataType::kFloat32 || w->rank() < 3 || xt == g.value_types.end() ||
        !xt->second.is_tensor() || !xt->second.shape.fully_known())
      continue;
    const Dims x = xt->second.shape.concrete();
    const size_t spatial = w->rank() - 2;
    if (x.size() != w->rank()) continue;
    auto win = ops::resolve_window(n, x, &w->shape());
    if (!win.ok()) continue;  // shape inference reports it
    const ops::Window& wd = win->window;
    std::vector<AxisCut> cuts(spatial);
    bool any = false;
    for (size_t d = 0; d < spatial; ++d) {
      const int64_t pb = win->pad_begin[d], pe = win->pad_end[d];
      cuts[d] = cut_axis(wd, d, x[2 + d], win->out[d], pb);
      if (cuts[d].count == wd.kernel[d]) {  // unchanged axis: keep its own geometry
        cuts[d] = AxisCut{0, wd.kernel[d], pb, pe, wd.dilations[d]};
      } else {
        any = true;
      }
    }
    if (!any) continue;
    const std::string wname = ir::unique_name(g, n.inputs[1] + "_live_taps");
    g.initializers[wname] = slice_taps(*w, cuts);
    n.inputs[1] = wname;
    std::vector<int64_t> pads(2 * spatial), dil(spatial), ks(spatial);
    for (size_t d = 0; d < spatial; ++d) {
      pads[d] = cuts[d].pad_begin, pads[spatial + d] = cuts[d].pad_end;
      dil[d] = cuts[d].dilation, ks[d] = cuts[d].count;
    }
    n.attrs["pads"] = ir::attr_ints(pads);
    n.attrs["dilations"] = ir::attr_ints(dil);
    n.attrs["kernel_shape"] = ir::attr_ints(ks);
    n.attrs.erase("auto_pad");
    ++changed;  // the original weights, if nothing else reads them, go in remove_dead_nodes (last pass)
  }
  return changed;
}

}  // namespace kiln::passes
