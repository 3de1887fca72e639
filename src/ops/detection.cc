// Detection ops: RoiAlign (opsets 10, 16, 22), MaxRoiPool (opsets 1, 22) and NonMaxSuppression
// (opsets 10, 11).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/conv_util.h"
#include "ops/nms_grid.h"
#include "ops/roi_align_grid.h"

namespace kiln::ops {
namespace {

// Largest per-bin sampling grid accepted (rois come from data; this bounds the work).

// ---- RoiAlign: average (or max) of bilinear samples on a regular grid inside each output bin.
// half_pixel (the default from opset 16) shifts roi coordinates by -0.5 pixel; output_half_pixel
// (opset 10 behaviour) does not, and forces rois to at least 1x1.

Status infer_roi_align(InferContext& ctx) {
  const SymShape& xs = ctx.input_shape(0);
  const SymShape& rs = ctx.input_shape(1);
  const SymShape& bs = ctx.input_shape(2);
  Dim rois = bs.rank_known && bs.rank() == 1 ? bs.dims[0] : rs.rank_known && rs.rank() == 2 ? rs.dims[0] : Dim();
  Dim c = xs.rank_known && xs.rank() == 4 ? xs.dims[1] : Dim();
  if (xs.rank_known && xs.rank() != 4) return ctx.error(str_cat("X must be 4-D [N, C, H, W], got ", xs.str()));
  ctx.set_output(
      0, ctx.input_dtype(0),
      SymShape({rois, c, Dim(ctx.node.attr_int("output_height", 1)), Dim(ctx.node.attr_int("output_width", 1))}));
  return Status::Ok();
}

using roi_align::Sample;

Status roi_align_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  const Tensor& rois0 = ctx.input(1);
  const Tensor& bidx = ctx.input(2);
  if (!dtype_is_float(x0.dtype())) return ctx.unsupported(str_cat("RoiAlign on ", x0.describe()));
  if (x0.rank() != 4) return ctx.error(str_cat("X must be 4-D [N, C, H, W], got ", x0.describe()));
  if (rois0.rank() != 2 || rois0.dim(1) != 4 || !dtype_is_float(rois0.dtype()))
    return ctx.error(str_cat("rois must be float [num_rois, 4], got ", rois0.describe()));
  if (bidx.rank() != 1 || bidx.dim(0) != rois0.dim(0) || !dtype_is_integer(bidx.dtype()))
    return ctx.error(str_cat("batch_indices must be integer [", rois0.dim(0), "], got ", bidx.describe()));
  const int64_t oh = ctx.node.attr_int("output_height", 1), ow = ctx.node.attr_int("output_width", 1);
  if (oh < 1 || ow < 1 || oh > kMaxWindowAttr || ow > kMaxWindowAttr)
    return ctx.error(str_cat("output_height ", oh, " and output_width ", ow, " must be positive"));
  const int64_t sampling_ratio = ctx.node.attr_int("sampling_ratio", 0);
  if (sampling_ratio < 0 || sampling_ratio > 65536)
    return ctx.error(str_cat("sampling_ratio must be in [0, 65536], got ", sampling_ratio));
  const double scale = ctx.node.attr_float("spatial_scale", 1.0f);
  const std::string mode = ctx.node.attr_string("mode", "avg");
  if (mode != "avg" && mode != "max") return ctx.error(str_cat("mode '", mode, "' is not avg or max"));
  const std::string ctm =
      ctx.node.attr_string("coordinate_transformation_mode", ctx.opset() >= 16 ? "half_pixel" : "output_half_pixel");
  if (ctm != "half_pixel" && ctm != "output_half_pixel")
    return ctx.error(str_cat("coordinate_transformation_mode '", ctm, "' is not half_pixel or output_half_pixel"));
  const bool half_pixel = ctm == "half_pixel";
  const int64_t N = x0.dim(0), C = x0.dim(1), H = x0.dim(2), W = x0.dim(3), R = rois0.dim(0);
  Dims out_shape = {R, C, oh, ow};
  auto numel = checked_numel(out_shape);
  if (!numel.ok()) return ctx.error(numel.status().message());
  // float32 is read and written as is (each value exactly a double, the sums in double as for other
  // types, one rounding at the store): the same numbers as casting X to float64 first, without a
  // copy of every feature map at each call (a detector pools from four FPN levels).
  const bool f32 = x0.dtype() == DataType::kFloat32;
  Tensor x = f32 || x0.dtype() == DataType::kFloat64 ? x0 : x0.cast(DataType::kFloat64).value();
  Tensor y(f32 ? DataType::kFloat32 : DataType::kFloat64, out_shape);
  const bool avg = mode == "avg";
  std::vector<Sample> samples;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t b = bidx.get_i64(r);
    if (b < 0 || b >= N) return ctx.error(str_cat("batch index ", b, " of roi ", r, " is outside [0, ", N, ")"));
    roi_align::Region reg;
    if (std::string e = roi_align::resolve_region(rois0.get_f64(r * 4 + 0) * scale, rois0.get_f64(r * 4 + 1) * scale,
                                                  rois0.get_f64(r * 4 + 2) * scale, rois0.get_f64(r * 4 + 3) * scale,
                                                  half_pixel, oh, ow, sampling_ratio, &reg);
        !e.empty())
      return ctx.error(str_cat("roi ", r, " ", e));
    const int64_t gh = reg.gh, gw = reg.gw;
    const double count = reg.count;
    // Bilinear sample positions and weights, shared by all channels.
    roi_align::sample_grid(reg, oh, ow, H, W, samples);
    auto pool = [&](const auto* px, auto* py) {
      using Out = std::remove_pointer_t<decltype(py)>;
      for (int64_t c = 0; c < C; ++c) {
        const auto* xp = px + (b * C + c) * H * W;
        size_t si = 0;
        for (int64_t pbin = 0; pbin < oh * ow; ++pbin) {
          double acc = 0;
          bool first = true;
          for (int64_t k = 0; k < gh * gw; ++k, ++si) {
            const Sample& s = samples[si];
            if (avg) {
              for (int q = 0; q < 4; ++q) acc += s.w[q] * static_cast<double>(xp[s.pos[q]]);
            } else {  // max of the weighted corners (as ONNX's reference and onnxruntime do)
              double v =
                  std::max({s.w[0] * static_cast<double>(xp[s.pos[0]]), s.w[1] * static_cast<double>(xp[s.pos[1]]),
                            s.w[2] * static_cast<double>(xp[s.pos[2]]), s.w[3] * static_cast<double>(xp[s.pos[3]])});
              acc = first ? v : std::max(acc, v);
              first = false;
            }
          }
          py[(r * C + c) * oh * ow + pbin] = static_cast<Out>(avg ? acc / count : acc);
        }
      }
    };
    if (f32)
      pool(x.data<float>(), y.data<float>());
    else
      pool(x.data<double>(), y.data<double>());
  }
  ctx.set_output(0, f32 || x0.dtype() == DataType::kFloat64 ? y : y.cast(x0.dtype()).value());
  return Status::Ok();
}

// ---- MaxRoiPool: max over integer-aligned bins of each roi (batch, x1, y1, x2, y2).

Status infer_max_roi_pool(InferContext& ctx) {
  const SymShape& xs = ctx.input_shape(0);
  const SymShape& rs = ctx.input_shape(1);
  Dims ps = ctx.node.attr_ints("pooled_shape");
  if (ps.size() != 2) return ctx.error(str_cat("pooled_shape ", dims_str(ps), " must have 2 values"));
  Dim rois = rs.rank_known && rs.rank() == 2 ? rs.dims[0] : Dim();
  Dim c = xs.rank_known && xs.rank() == 4 ? xs.dims[1] : Dim();
  ctx.set_output(0, ctx.input_dtype(0), SymShape({rois, c, Dim(ps[0]), Dim(ps[1])}));
  return Status::Ok();
}

Status max_roi_pool_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& rois = ctx.input(1);
  if (!dtype_is_float(x.dtype())) return ctx.unsupported(str_cat("MaxRoiPool on ", x.describe()));
  if (x.rank() != 4) return ctx.error(str_cat("X must be 4-D [N, C, H, W], got ", x.describe()));
  if (rois.rank() != 2 || rois.dim(1) != 5 || !dtype_is_float(rois.dtype()))
    return ctx.error(str_cat("rois must be float [num_rois, 5], got ", rois.describe()));
  Dims ps = ctx.node.attr_ints("pooled_shape");
  if (ps.size() != 2 || ps[0] < 1 || ps[1] < 1 || ps[0] > kMaxWindowAttr || ps[1] > kMaxWindowAttr)
    return ctx.error(str_cat("pooled_shape ", dims_str(ps), " must be two positive values"));
  const double scale = ctx.node.attr_float("spatial_scale", 1.0f);
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), R = rois.dim(0);
  Dims out_shape = {R, C, ps[0], ps[1]};
  auto numel = checked_numel(out_shape);
  if (!numel.ok()) return ctx.error(numel.status().message());
  Tensor y(x.dtype(), out_shape);
  auto coord = [&](int64_t r, int k) {  // rounded, scaled roi coordinate, clamped to a sane range
    double v = std::round(rois.get_f64(r * 5 + k) * scale);
    if (!std::isfinite(v)) v = 0;
    return static_cast<int64_t>(std::clamp(v, -1e12, 1e12));
  };
  for (int64_t r = 0; r < R; ++r) {
    double bd = rois.get_f64(r * 5);
    int64_t b = std::isfinite(bd) ? static_cast<int64_t>(std::clamp(bd, -1.0, 1e12)) : -1;
    if (b < 0 || b >= N) return ctx.error(str_cat("roi ", r, " has batch index ", bd, " outside [0, ", N, ")"));
    int64_t x1 = coord(r, 1), y1 = coord(r, 2), x2 = coord(r, 3), y2 = coord(r, 4);
    double rh = static_cast<double>(std::max<int64_t>(y2 - y1 + 1, 1));
    double rw = static_cast<double>(std::max<int64_t>(x2 - x1 + 1, 1));
    double bh = rh / static_cast<double>(ps[0]), bw = rw / static_cast<double>(ps[1]);
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t ph = 0; ph < ps[0]; ++ph) {
        int64_t hs = std::clamp<int64_t>(static_cast<int64_t>(std::floor(static_cast<double>(ph) * bh)) + y1, 0, H);
        int64_t he = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(static_cast<double>(ph + 1) * bh)) + y1, 0, H);
        for (int64_t pw = 0; pw < ps[1]; ++pw) {
          int64_t ws = std::clamp<int64_t>(static_cast<int64_t>(std::floor(static_cast<double>(pw) * bw)) + x1, 0, W);
          int64_t we =
              std::clamp<int64_t>(static_cast<int64_t>(std::ceil(static_cast<double>(pw + 1) * bw)) + x1, 0, W);
          double m = 0;
          bool empty = true;
          for (int64_t h = hs; h < he; ++h)
            for (int64_t w = ws; w < we; ++w) {
              double v = x.get_f64(((b * C + c) * H + h) * W + w);
              if (empty || v > m) m = v;
              empty = false;
            }
          y.set_f64(((r * C + c) * ps[0] + ph) * ps[1] + pw, empty ? 0.0 : m);
        }
      }
    }
  }
  ctx.set_output(0, y);
  return Status::Ok();
}

// ---- NonMaxSuppression: per batch and class, greedily keeps the highest-scoring boxes whose IoU
// with every kept box is <= iou_threshold. Output rows: [batch, class, box].

using nms::Box;

Box read_box(const Tensor& boxes, int64_t at, bool center) {
  return nms::box_of(boxes.get_f64(at), boxes.get_f64(at + 1), boxes.get_f64(at + 2), boxes.get_f64(at + 3), center);
}

// The boxes kept so far, in a grid of cells by (x_min, y_min), so that a candidate meets only those
// that can overlap it: a box without overlap never suppresses (see suppressed()), so the answer
// is the one comparing with every kept box. A kept box q overlapping candidate p on x has
// q.x_min in (p.x_min - max_width, p.x_max) (max_width: the widest box of the batch), and so on y:
// the cells of that range, widened by a margin far above rounding, hold every such q. torchvision's
// batched NMS runs one NMS over every class, the boxes of each class offset apart (on both axes):
// a candidate then meets about the kept boxes of its own class only.
class KeptBoxes {
 public:
  // `all`: every box of the batch (the candidates are among them).
  void reset(const std::vector<Box>& all) {
    const bool finite = nms::all_finite(all.data(), all.size());
    x_ = Axis::of(all.data(), all.size(), finite, &Box::x_min, &Box::x_max);
    y_ = Axis::of(all.data(), all.size(), finite, &Box::y_min, &Box::y_max);
    cells_.assign(x_.n * y_.n, {});
  }
  bool suppressed(const Box& p, double iou) const {
    const size_t x0 = x_.cell(p.x_min - x_.reach), x1 = x_.cell(p.x_max + x_.margin);
    const size_t y0 = y_.cell(p.y_min - y_.reach), y1 = y_.cell(p.y_max + y_.margin);
    // Kept box q suppresses p when they intersect (ix, iy > 0), both have positive areas and a
    // positive union, and IoU > iou. Evaluated over a cell's boxes without a branch per box: the
    // boxes of one class mostly overlap, so most comparisons compute the whole IoU anyway.
    const double a1 = (p.x_max - p.x_min) * (p.y_max - p.y_min);
    if (!(a1 > 0)) return false;
    for (size_t cy = y0; cy <= y1; ++cy)
      for (size_t cx = x0; cx <= x1; ++cx) {
        const Cell& c = cells_[cy * x_.n + cx];
        const size_t n = c.x_min.size();
        for (size_t i = 0; i < n; i += 16) {
          const size_t e = std::min(n, i + 16);
          int any = 0;
#pragma omp simd reduction(| : any)
          for (size_t j = i; j < e; ++j) {
            const double ix = std::min(p.x_max, c.x_max[j]) - std::max(p.x_min, c.x_min[j]);
            const double iy = std::min(p.y_max, c.y_max[j]) - std::max(p.y_min, c.y_min[j]);
            const double inter = ix * iy, a2 = c.area[j], uni = a1 + a2 - inter;
            any |= (ix > 0) & (iy > 0) & (a2 > 0) & (uni > 0) & (inter / uni > iou);
          }
          if (any) return true;
        }
      }
    return false;
  }
  void add(const Box& b) {
    Cell& c = cells_[y_.cell(b.y_min) * x_.n + x_.cell(b.x_min)];
    c.x_min.push_back(b.x_min), c.x_max.push_back(b.x_max), c.y_min.push_back(b.y_min), c.y_max.push_back(b.y_max);
    c.area.push_back((b.x_max - b.x_min) * (b.y_max - b.y_min));
  }
  void clear() {
    for (auto& c : cells_)
      for (auto* v : {&c.x_min, &c.x_max, &c.y_min, &c.y_max, &c.area}) v->clear();
  }

 private:
  struct Cell {  // the kept boxes of a cell, one array per coordinate
    std::vector<double> x_min, x_max, y_min, y_max, area;
  };
  using Axis = nms::Axis;
  Axis x_, y_;
  std::vector<Cell> cells_;
};

Status infer_nms(InferContext& ctx) {
  ctx.set_output(0, DataType::kInt64, SymShape({ctx.new_symbol(), Dim(3)}));
  return Status::Ok();
}

Status nms_kernel(KernelContext& ctx) {
  const Tensor& boxes = ctx.input(0);
  const Tensor& scores = ctx.input(1);
  if (!dtype_is_float(boxes.dtype()) || !dtype_is_float(scores.dtype()))
    return ctx.unsupported(str_cat("NonMaxSuppression on boxes ", boxes.describe(), ", scores ", scores.describe()));
  if (boxes.rank() != 3 || boxes.dim(2) != 4)
    return ctx.error(str_cat("boxes must be [batches, boxes, 4], got ", boxes.describe()));
  if (scores.rank() != 3 || scores.dim(0) != boxes.dim(0) || scores.dim(2) != boxes.dim(1))
    return ctx.error(str_cat("scores ", scores.describe(), " must be [", boxes.dim(0), ", classes, ", boxes.dim(1),
                             "] for boxes ", boxes.describe()));
  auto scalar = [&](size_t i, const char* name, Tensor* out) -> Status {
    if (!ctx.has_input(i) || ctx.input(i).numel() == 0) return Status::Ok();
    if (ctx.input(i).numel() != 1)
      return ctx.error(str_cat(name, " must hold one value, got ", ctx.input(i).describe()));
    *out = ctx.input(i);
    return Status::Ok();
  };
  Tensor max_t, iou_t, score_t;
  KILN_RETURN_IF_ERROR(scalar(2, "max_output_boxes_per_class", &max_t));
  KILN_RETURN_IF_ERROR(scalar(3, "iou_threshold", &iou_t));
  KILN_RETURN_IF_ERROR(scalar(4, "score_threshold", &score_t));
  const int64_t max_out = max_t.defined() ? std::max<int64_t>(0, max_t.get_i64(0)) : 0;
  const double iou = iou_t.defined() ? iou_t.get_f64(0) : 0.0;
  const bool has_score = score_t.defined();
  const double score_min = has_score ? score_t.get_f64(0) : 0.0;
  const int64_t center = ctx.node.attr_int("center_point_box", 0);
  if (center != 0 && center != 1) return ctx.error(str_cat("center_point_box must be 0 or 1, got ", center));
  const int64_t B = boxes.dim(0), K = scores.dim(1), S = boxes.dim(1);
  std::vector<int64_t> selected;  // triples
  std::vector<int64_t> order;
  std::vector<double> key;
  std::vector<Box> all(static_cast<size_t>(S));
  KeptBoxes kept;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < S; ++i) all[static_cast<size_t>(i)] = read_box(boxes, (b * S + i) * 4, center == 1);
    kept.reset(all);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t sbase = (b * K + k) * S;
      order.clear();
      key.assign(static_cast<size_t>(S), 0.0);
      for (int64_t i = 0; i < S; ++i) {
        double v = scores.get_f64(sbase + i);
        key[static_cast<size_t>(i)] = std::isnan(v) ? -INFINITY : v;  // NaN sorts last (strict weak order)
        if (!has_score || v > score_min) order.push_back(i);
      }
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t p, int64_t q) { return key[static_cast<size_t>(p)] > key[static_cast<size_t>(q)]; });
      kept.clear();
      int64_t n_kept = 0;
      for (int64_t i : order) {
        if (n_kept >= max_out) break;
        const Box& cand = all[static_cast<size_t>(i)];
        if (kept.suppressed(cand, iou)) continue;
        kept.add(cand);
        ++n_kept;
        selected.insert(selected.end(), {b, k, i});
      }
    }
  }
  ctx.set_output(0, make_i64_tensor(selected, {static_cast<int64_t>(selected.size() / 3), 3}));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", RoiAlign, 10, infer_roi_align, roi_align_kernel, 3, 3);
KILN_REGISTER_OP_ARITY("", MaxRoiPool, 1, infer_max_roi_pool, max_roi_pool_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", NonMaxSuppression, 10, infer_nms, nms_kernel, 2, 5);

}  // namespace kiln::ops
