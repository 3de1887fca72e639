// Detection post-processing: NonMaxSuppression and RoiAlign on float32, with the reference kernels'
// exact numbers (src/ops/detection.cc): the same double-precision arithmetic in the same order, only
// vectorized and threaded. This file is compiled with -ffp-contract=off (CMakeLists.txt) so that the
// vector code's products and sums are rounded one by one as the reference's scalar code rounds them.
//
// NonMaxSuppression: per batch, the boxes once as arrays of double; per class one sort of packed
// (score, index) keys, then the reference's greedy pass over a grid of kept boxes, each candidate
// tested against a cell's boxes 8 (AVX-512) or 4 (AVX2) at a time. Its output's row count depends on
// the data: output_shapes() reports -1 and run() allocates it (engine/executor.h).
//
// RoiAlign: each feature map is transposed to channels-last once per call, so that a roi's bilinear
// samples (positions and weights computed as the reference computes them) accumulate every channel
// with contiguous vector loads, in double; rois are split over threads.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernel_simd.h"
#include "backends/cpu/thread_slices.h"
#include "backends/tactic.h"
#include "core/parallel.h"
#include "ops/nms_grid.h"
#include "ops/roi_align_grid.h"

namespace kiln::backends::cpu {
namespace {

std::string cpu_check(const LayerSignature& sig) {
  if (sig.device.kind != DeviceKind::kCPU) return "not a CPU layer";
  return "";
}

// ---- NonMaxSuppression

using ops::nms::Box;

// The kept boxes of a cell, one array per coordinate, padded to whole vectors with boxes that never
// suppress (zero area).
struct Cell {
  std::vector<double> x_min, x_max, y_min, y_max, area;
  size_t n = 0;
};

// Whether any of the n boxes of c suppresses p (area a1 > 0): the reference's test, lane by lane.
// std::min(p, q) is minpd(q, p) and std::max(p, q) is maxpd(q, p), NaNs included.
KILN_TARGET_AVX512 bool suppressed_avx512(const Cell& c, const Box& p, double a1, double iou) {
  const __m512d pxmax = _mm512_set1_pd(p.x_max), pxmin = _mm512_set1_pd(p.x_min);
  const __m512d pymax = _mm512_set1_pd(p.y_max), pymin = _mm512_set1_pd(p.y_min);
  const __m512d va1 = _mm512_set1_pd(a1), viou = _mm512_set1_pd(iou), zero = _mm512_setzero_pd();
  for (size_t j = 0; j < c.n; j += 8) {
    __m512d ix = _mm512_sub_pd(_mm512_min_pd(_mm512_loadu_pd(&c.x_max[j]), pxmax),
                               _mm512_max_pd(_mm512_loadu_pd(&c.x_min[j]), pxmin));
    __m512d iy = _mm512_sub_pd(_mm512_min_pd(_mm512_loadu_pd(&c.y_max[j]), pymax),
                               _mm512_max_pd(_mm512_loadu_pd(&c.y_min[j]), pymin));
    __m512d a2 = _mm512_loadu_pd(&c.area[j]);
    __m512d inter = _mm512_mul_pd(ix, iy);
    __m512d uni = _mm512_sub_pd(_mm512_add_pd(va1, a2), inter);
    __mmask8 m = _mm512_cmp_pd_mask(ix, zero, _CMP_GT_OQ) & _mm512_cmp_pd_mask(iy, zero, _CMP_GT_OQ) &
                 _mm512_cmp_pd_mask(a2, zero, _CMP_GT_OQ) & _mm512_cmp_pd_mask(uni, zero, _CMP_GT_OQ);
    if (!m) continue;
    if (_mm512_mask_cmp_pd_mask(m, _mm512_div_pd(inter, uni), viou, _CMP_GT_OQ)) return true;
  }
  return false;
}

KILN_TARGET_AVX2 bool suppressed_avx2(const Cell& c, const Box& p, double a1, double iou) {
  const __m256d pxmax = _mm256_set1_pd(p.x_max), pxmin = _mm256_set1_pd(p.x_min);
  const __m256d pymax = _mm256_set1_pd(p.y_max), pymin = _mm256_set1_pd(p.y_min);
  const __m256d va1 = _mm256_set1_pd(a1), viou = _mm256_set1_pd(iou), zero = _mm256_setzero_pd();
  for (size_t j = 0; j < c.n; j += 4) {
    __m256d ix = _mm256_sub_pd(_mm256_min_pd(_mm256_loadu_pd(&c.x_max[j]), pxmax),
                               _mm256_max_pd(_mm256_loadu_pd(&c.x_min[j]), pxmin));
    __m256d iy = _mm256_sub_pd(_mm256_min_pd(_mm256_loadu_pd(&c.y_max[j]), pymax),
                               _mm256_max_pd(_mm256_loadu_pd(&c.y_min[j]), pymin));
    __m256d a2 = _mm256_loadu_pd(&c.area[j]);
    __m256d inter = _mm256_mul_pd(ix, iy);
    __m256d uni = _mm256_sub_pd(_mm256_add_pd(va1, a2), inter);
    __m256d ok =
        _mm256_and_pd(_mm256_and_pd(_mm256_cmp_pd(ix, zero, _CMP_GT_OQ), _mm256_cmp_pd(iy, zero, _CMP_GT_OQ)),
                      _mm256_and_pd(_mm256_cmp_pd(a2, zero, _CMP_GT_OQ), _mm256_cmp_pd(uni, zero, _CMP_GT_OQ)));
    if (!_mm256_movemask_pd(ok)) continue;
    if (_mm256_movemask_pd(_mm256_and_pd(ok, _mm256_cmp_pd(_mm256_div_pd(inter, uni), viou, _CMP_GT_OQ)))) return true;
  }
  return false;
}

bool suppressed_scalar(const Cell& c, const Box& p, double a1, double iou) {
  for (size_t j = 0; j < c.n; ++j) {
    const double ix = std::min(p.x_max, c.x_max[j]) - std::max(p.x_min, c.x_min[j]);
    const double iy = std::min(p.y_max, c.y_max[j]) - std::max(p.y_min, c.y_min[j]);
    const double inter = ix * iy, a2 = c.area[j], uni = a1 + a2 - inter;
    if ((ix > 0) & (iy > 0) & (a2 > 0) & (uni > 0) && inter / uni > iou) return true;
  }
  return false;
}

using SuppressedFn = bool (*)(const Cell&, const Box&, double, double);

// The kept boxes in a grid of cells by (x_min, y_min): the reference's KeptBoxes (ops/detection.cc,
// where the argument for it is made), a candidate meeting only the cells that can hold a box
// overlapping it.
//
// Its cells keep their arrays from run to run (one grid per thread, see PreparedNms::run): a cell's
// arrays grow to the most boxes it held and are zeroed, not freed, when it is cleared, so that a run
// at shapes seen before allocates nothing.
class KeptGrid {
 public:
  void reset(SuppressedFn fn, size_t lanes, const Box* all, size_t n) {
    clear();
    if (lanes != lanes_) cells_.clear();  // arrays padded for another vector width
    fn_ = fn, lanes_ = lanes;
    const bool finite = ops::nms::all_finite(all, n);
    x_ = Axis::of(all, n, finite, &Box::x_min, &Box::x_max);
    y_ = Axis::of(all, n, finite, &Box::y_min, &Box::y_max);
    if (cells_.size() < x_.n * y_.n) cells_.resize(x_.n * y_.n);
  }
  bool suppressed(const Box& p, double iou) const {
    const double a1 = (p.x_max - p.x_min) * (p.y_max - p.y_min);
    if (!(a1 > 0)) return false;
    const size_t x0 = x_.cell(p.x_min - x_.reach), x1 = x_.cell(p.x_max + x_.margin);
    const size_t y0 = y_.cell(p.y_min - y_.reach), y1 = y_.cell(p.y_max + y_.margin);
    for (size_t cy = y0; cy <= y1; ++cy)
      for (size_t cx = x0; cx <= x1; ++cx) {
        const Cell& c = cells_[cy * x_.n + cx];
        if (c.n && fn_(c, p, a1, iou)) return true;
      }
    return false;
  }
  void add(const Box& b) {
    const size_t at = y_.cell(b.y_min) * x_.n + x_.cell(b.x_min);
    Cell& c = cells_[at];
    if (c.n == 0) used_.push_back(at);
    if (c.n == c.x_min.size()) {  // grow by a whole vector of padding (zero area never suppresses)
      for (auto* v : {&c.x_min, &c.x_max, &c.y_min, &c.y_max, &c.area}) v->resize(c.n + lanes_, 0.0);
    }
    c.x_min[c.n] = b.x_min, c.x_max[c.n] = b.x_max, c.y_min[c.n] = b.y_min, c.y_max[c.n] = b.y_max;
    c.area[c.n] = (b.x_max - b.x_min) * (b.y_max - b.y_min);
    ++c.n;
  }
  void clear() {
    for (size_t at : used_) {
      Cell& c = cells_[at];
      for (auto* v : {&c.x_min, &c.x_max, &c.y_min, &c.y_max, &c.area}) std::fill(v->begin(), v->end(), 0.0);
      c.n = 0;
    }
    used_.clear();
  }

 private:
  using Axis = ops::nms::Axis;  // the reference's cells (ops/nms_grid.h)
  SuppressedFn fn_ = suppressed_scalar;
  size_t lanes_ = 1;
  Axis x_, y_;
  std::vector<Cell> cells_;
  std::vector<size_t> used_;
};

// A float's bits mapped to an unsigned order: a < b as floats (-0 == +0 taken as +0) iff key(a) < key(b).
inline uint32_t ordered_bits(float v) {
  if (v == 0.f) v = 0.f;
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}

// Sorts keys by their high 32 bits, stably (equal high bits keep their order): three passes of 11 bits
// (LSD radix) for long lists, std::stable_sort's result for short ones.
// The n keys at v end sorted in v; tmp holds n keys of scratch.
void sort_by_high_bits(uint64_t* v, size_t n, uint64_t* tmp) {
  if (n < 512) {
    std::sort(v, v + n);  // the low bits (the index) already break ties in order
    return;
  }
  uint64_t *from = v, *to = tmp;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = 32 + 11 * pass;
    size_t count[2049] = {0};
    for (size_t i = 0; i < n; ++i) ++count[((from[i] >> shift) & 2047) + 1];
    for (size_t b = 1; b < 2049; ++b) count[b] += count[b - 1];
    for (size_t i = 0; i < n; ++i) to[count[(from[i] >> shift) & 2047]++] = from[i];
    std::swap(from, to);
  }
  if (from != v) std::memcpy(v, from, n * sizeof(uint64_t));
}

class PreparedNms : public PreparedLayer {
 public:
  bool center = false;
  SuppressedFn fn = suppressed_scalar;
  size_t lanes = 1;

  int64_t batches = 0, classes = 0, spatial = 0;  // boxes [batches, spatial, 4], scores [batches, classes, spatial]

  std::vector<Dims> output_shapes() const override { return {{-1, 3}}; }
  std::vector<DataType> output_dtypes() const override { return {DataType::kInt64}; }
  // The boxes as doubles, the sort keys and their scratch, and the selected rows (at most every box of
  // every class); the output, whose row count depends on the data, is allocated.
  size_t boxes_bytes() const { return workspace_piece(static_cast<size_t>(spatial) * sizeof(Box)); }
  size_t keys_bytes() const { return workspace_piece(static_cast<size_t>(spatial) * sizeof(uint64_t)); }
  size_t selected_bytes() const {
    return workspace_piece(static_cast<size_t>(batches * classes * spatial) * 3 * sizeof(int64_t));
  }
  size_t workspace_bytes(int) const override { return boxes_bytes() + 2 * keys_bytes() + selected_bytes(); }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    const Tensor& boxes = *in[0];
    const Tensor& scores = *in[1];
    if (boxes.dim(0) != batches || boxes.dim(1) != spatial || scores.dim(1) != classes)
      return Internal("nms_kiln prepared for boxes [", batches, ", ", spatial, ", 4] and ", classes,
                      " classes, run on boxes ", boxes.describe(), " and scores ", scores.describe());
    auto scalar = [&](size_t i, const char* name) -> Result<const Tensor*> {
      if (i >= in.size() || !in[i] || in[i]->numel() == 0) return static_cast<const Tensor*>(nullptr);
      if (in[i]->numel() != 1) return InvalidArgument(name, " must hold one value, got ", in[i]->describe());
      return in[i];
    };
    KILN_ASSIGN_OR_RETURN(const Tensor* max_t, scalar(2, "max_output_boxes_per_class"));
    KILN_ASSIGN_OR_RETURN(const Tensor* iou_t, scalar(3, "iou_threshold"));
    KILN_ASSIGN_OR_RETURN(const Tensor* score_t, scalar(4, "score_threshold"));
    const int64_t max_out = max_t ? std::max<int64_t>(0, max_t->get_i64(0)) : 0;
    const double iou = iou_t ? iou_t->get_f64(0) : 0.0;
    const bool has_score = score_t != nullptr;
    const double score_min = has_score ? score_t->get_f64(0) : 0.0;
    const int64_t B = boxes.dim(0), K = scores.dim(1), S = boxes.dim(1);
    const float* pb = boxes.data<float>();
    const float* ps = scores.data<float>();
    WorkspaceSlicer ws(ctx);
    auto* all = static_cast<Box*>(ws.take(boxes_bytes()));
    auto* order = static_cast<uint64_t*>(ws.take(keys_bytes()));
    auto* scratch = static_cast<uint64_t*>(ws.take(keys_bytes()));
    auto* selected = static_cast<int64_t*>(ws.take(selected_bytes()));
    size_t n_selected = 0;       // int64s written to `selected`
    thread_local KeptGrid kept;  // its cells' arrays are reused by later runs (see KeptGrid)
    for (int64_t b = 0; b < B && max_out > 0; ++b) {
      for (int64_t i = 0; i < S; ++i) {
        const float* q = pb + (b * S + i) * 4;
        all[i] = ops::nms::box_of(q[0], q[1], q[2], q[3], center);
      }
      kept.reset(fn, lanes, all, static_cast<size_t>(S));
      for (int64_t k = 0; k < K; ++k) {
        const float* sc = ps + (b * K + k) * S;
        // Highest score first, ties by lower index (the reference's stable sort); NaN as -inf.
        size_t n_order = 0;
        for (int64_t i = 0; i < S; ++i) {
          const float v = sc[i];
          if (has_score && !(static_cast<double>(v) > score_min)) continue;
          const uint32_t key = std::isnan(v) ? ordered_bits(-INFINITY) : ordered_bits(v);
          order[n_order++] = (static_cast<uint64_t>(~key) << 32) | static_cast<uint64_t>(i);
        }
        sort_by_high_bits(order, n_order, scratch);  // built in index order: ties stay by lower index
        kept.clear();
        int64_t n_kept = 0;
        for (size_t o = 0; o < n_order; ++o) {
          if (n_kept >= max_out) break;
          const int64_t i = static_cast<int64_t>(order[o] & 0xffffffffu);
          const Box& cand = all[i];
          if (kept.suppressed(cand, iou)) continue;
          kept.add(cand);
          ++n_kept;
          selected[n_selected++] = b, selected[n_selected++] = k, selected[n_selected++] = i;
        }
      }
    }
    kept.clear();  // zeroed for the next run
    // Renewed in place: an output tensor kept from the last run (an interpreter frame's) keeps its
    // shape vector.
    Tensor& y = *out[0];
    y.renew(DataType::kInt64, {static_cast<int64_t>(n_selected / 3), 3});
    if (n_selected) std::memcpy(y.raw(), selected, n_selected * sizeof(int64_t));
    return Status::Ok();
  }
};

class NmsKiln : public Tactic {
 public:
  std::string name() const override { return "nms_kiln"; }
  TacticInfo info() const override {
    return {DeviceKind::kCPU, kIsaPortable, DataType::kFloat32, {DataType::kFloat32}, {DataType::kInt64}};
  }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "NonMaxSuppression"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = cpu_check(sig); !e.empty()) return e;
    if (sig.inputs.size() < 2 || !sig.has_input(0) || !sig.has_input(1)) return "boxes and scores are required";
    if (sig.inputs[0].dtype != DataType::kFloat32 || sig.inputs[1].dtype != DataType::kFloat32)
      return "boxes and scores are not float32";
    for (size_t i = 2; i < sig.inputs.size(); ++i) {
      if (!sig.has_input(i)) continue;
      DataType dt = sig.inputs[i].dtype;
      bool ok = i == 2 ? dt == DataType::kInt64 || dt == DataType::kInt32
                       : dt == DataType::kFloat32 || dt == DataType::kFloat64;
      if (!ok) return "input " + std::to_string(i) + " has dtype " + dtype_name(dt);
    }
    const int64_t center = sig.node->attr_int("center_point_box", 0);
    if (center != 0 && center != 1) return "center_point_box is not 0 or 1";
    const Dims& b = sig.inputs[0].shape;
    const Dims& s = sig.inputs[1].shape;
    if (b.size() != 3 || s.size() != 3) return "boxes or scores are not 3-D";
    if (!sig.fully_known()) return "";
    if (b[2] != 4 || s[0] != b[0] || s[2] != b[1]) return "boxes [B, S, 4] and scores [B, C, S] do not match";
    if (b[1] >= (int64_t{1} << 32)) return "more than 2^32 boxes";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedNms>();
    p->center = sig.node->attr_int("center_point_box", 0) == 1;
    if (sig.inputs[0].shape.size() == 3 && sig.inputs[1].shape.size() == 3) {
      p->batches = std::max<int64_t>(sig.inputs[0].shape[0], 0),
      p->spatial = std::max<int64_t>(sig.inputs[0].shape[1], 0);
      p->classes = std::max<int64_t>(sig.inputs[1].shape[1], 0);
    }
    Isa isa = cpu_isa(sig.isa);
    if (isa == Isa::kAvx512)
      p->fn = suppressed_avx512, p->lanes = 8;
    else if (isa == Isa::kAvx2)
      p->fn = suppressed_avx2, p->lanes = 4;
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

// ---- RoiAlign

using ops::roi_align::Sample;

// The pooled values of one bin for c in [0, C), from its n samples on the channels-last plane xp
// ([H * W, C]) as the reference computes it channel by channel: avg sums w * x over the samples and
// their corners in order (from 0), max keeps the largest weighted corner (std::max's choice on ties and
// NaNs: maxpd(b, a) is std::max(a, b)). Products and sums rounded one by one (no fused multiply-add).
// The bin's values are written to out[0, C) as floats: avg divides the sum by `count` first (in double,
// vectorized: the same correctly rounded quotient as the reference's scalar division).
using PoolFn = void (*)(const float* xp, int64_t C, const Sample* s, int64_t n, bool avg, double count, float* out);

inline void pool_tail(const float* xp, int64_t C, int64_t c, const Sample* s, int64_t n, bool avg, double count,
                      float* out) {
  for (; c < C; ++c) {
    double a = 0;
    for (int64_t k = 0; k < n; ++k) {
      const Sample& q = s[k];
      if (avg) {
        for (int t = 0; t < 4; ++t) a += q.w[t] * static_cast<double>(xp[q.pos[t] * C + c]);
      } else {
        double v = std::max(
            {q.w[0] * static_cast<double>(xp[q.pos[0] * C + c]), q.w[1] * static_cast<double>(xp[q.pos[1] * C + c]),
             q.w[2] * static_cast<double>(xp[q.pos[2] * C + c]), q.w[3] * static_cast<double>(xp[q.pos[3] * C + c])});
        a = k == 0 ? v : std::max(a, v);
      }
    }
    out[c] = static_cast<float>(avg ? a / count : a);
  }
}

KILN_TARGET_AVX512 void pool_avx512(const float* xp, int64_t C, const Sample* s, int64_t n, bool avg, double count,
                                    float* out) {
  const __m512d vcount = _mm512_set1_pd(count);
  int64_t c = 0;
  for (; c + 8 <= C; c += 8) {
    __m512d a = _mm512_setzero_pd();
    for (int64_t k = 0; k < n; ++k) {
      const Sample& q = s[k];
      __m512d p[4];
      for (int t = 0; t < 4; ++t)
        p[t] = _mm512_mul_pd(_mm512_set1_pd(q.w[t]), _mm512_cvtps_pd(_mm256_loadu_ps(xp + q.pos[t] * C + c)));
      if (avg) {
        for (int t = 0; t < 4; ++t) a = _mm512_add_pd(a, p[t]);
      } else {
        __m512d m = _mm512_max_pd(p[3], _mm512_max_pd(p[2], _mm512_max_pd(p[1], p[0])));
        a = k == 0 ? m : _mm512_max_pd(m, a);
      }
    }
    if (avg) a = _mm512_div_pd(a, vcount);
    _mm256_storeu_ps(out + c, _mm512_cvtpd_ps(a));
  }
  pool_tail(xp, C, c, s, n, avg, count, out);
}

KILN_TARGET_AVX2 void pool_avx2(const float* xp, int64_t C, const Sample* s, int64_t n, bool avg, double count,
                                float* out) {
  const __m256d vcount = _mm256_set1_pd(count);
  int64_t c = 0;
  for (; c + 4 <= C; c += 4) {
    __m256d a = _mm256_setzero_pd();
    for (int64_t k = 0; k < n; ++k) {
      const Sample& q = s[k];
      __m256d p[4];
      for (int t = 0; t < 4; ++t)
        p[t] = _mm256_mul_pd(_mm256_set1_pd(q.w[t]), _mm256_cvtps_pd(_mm_loadu_ps(xp + q.pos[t] * C + c)));
      if (avg) {
        for (int t = 0; t < 4; ++t) a = _mm256_add_pd(a, p[t]);
      } else {
        __m256d m = _mm256_max_pd(p[3], _mm256_max_pd(p[2], _mm256_max_pd(p[1], p[0])));
        a = k == 0 ? m : _mm256_max_pd(m, a);
      }
    }
    if (avg) a = _mm256_div_pd(a, vcount);
    _mm_storeu_ps(out + c, _mm256_cvtpd_ps(a));
  }
  pool_tail(xp, C, c, s, n, avg, count, out);
}

void pool_scalar(const float* xp, int64_t C, const Sample* s, int64_t n, bool avg, double count, float* out) {
  pool_tail(xp, C, 0, s, n, avg, count, out);
}

class PreparedRoiAlign : public PreparedLayer {
 public:
  int64_t oh = 1, ow = 1, sampling_ratio = 0;
  double scale = 1;
  bool avg = true, half_pixel = true;
  Dims out_shape;
  PoolFn pool = pool_scalar;

  Dims x_shape;  // [N, C, H, W]

  std::vector<Dims> output_shapes() const override { return {out_shape}; }
  // Which feature maps the rois use, those maps channels-last, and per thread a roi's [bins, C] block.
  size_t used_bytes() const { return workspace_piece(static_cast<size_t>(std::max<int64_t>(x_shape[0], 0))); }
  size_t maps_bytes() const {
    int64_t n = 1;
    for (int64_t d : x_shape) n *= std::max<int64_t>(d, 0);
    return workspace_piece(static_cast<size_t>(n) * sizeof(float));
  }
  size_t binned_bytes() const {
    return workspace_piece(static_cast<size_t>(std::max<int64_t>(x_shape[1], 0) * oh * ow) * sizeof(float));
  }
  size_t workspace_bytes(int threads) const override {
    return used_bytes() + maps_bytes() + static_cast<size_t>(std::max(threads, 1)) * binned_bytes();
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    const Tensor& x = *in[0];
    const Tensor& rois = *in[1];
    const Tensor& bidx = *in[2];
    const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), R = rois.dim(0);
    if (x.shape() != x_shape)
      return Internal("roi_align_kiln prepared for X ", dims_str(x_shape), ", run on ", x.describe());
    WorkspaceSlicer ws(ctx);
    auto* used = static_cast<char*>(ws.take(used_bytes()));
    auto* xt = static_cast<float*>(ws.take(maps_bytes()));
    auto* binned_of_threads =
        static_cast<uint8_t*>(ws.take(static_cast<size_t>(std::max(ctx.threads, 1)) * binned_bytes()));
    const float* px = x.data<float>();
    float* py = out[0]->data<float>();
    // Checked first: a bad roi is the user's error, reported as the reference reports it.
    for (int64_t r = 0; r < R; ++r) {
      const int64_t b = bidx.get_i64(r);
      if (b < 0 || b >= N) return InvalidArgument("batch index ", b, " of roi ", r, " is outside [0, ", N, ")");
    }
    if (N) std::memset(used, 0, static_cast<size_t>(N));
    for (int64_t r = 0; r < R; ++r) used[bidx.get_i64(r)] = 1;
    // The feature maps the rois use, channels-last.
    const int64_t HW = H * W;
    for (int64_t b = 0; b < N; ++b) {
      if (!used[b]) continue;
      float* dst = xt + b * HW * C;
      const float* src = px + b * C * HW;
      // Tiles of 64 positions: each channel's run read contiguously, the tile's [64, C] block written
      // while it stays in cache.
      constexpr int64_t kTile = 64;
      parallel_for((HW + kTile - 1) / kTile, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)),
                   [&](int64_t t0, int64_t t1) {
                     for (int64_t t = t0; t < t1; ++t) {
                       const int64_t p0 = t * kTile, p1 = std::min(HW, p0 + kTile);
                       for (int64_t c = 0; c < C; ++c) {
                         const float* s = src + c * HW;
                         for (int64_t p = p0; p < p1; ++p) dst[p * C + c] = s[p];
                       }
                     }
                   });
    }
    const bool rois_f32 = rois.dtype() == DataType::kFloat32;
    auto region_of = [&](int64_t r, ops::roi_align::Region* reg) {
      auto coord = [&](int k) {
        return rois_f32 ? static_cast<double>(rois.data<float>()[r * 4 + k]) : rois.get_f64(r * 4 + k);
      };
      return ops::roi_align::resolve_region(coord(0) * scale, coord(1) * scale, coord(2) * scale, coord(3) * scale,
                                            half_pixel, oh, ow, sampling_ratio, reg);
    };
    std::atomic<int64_t> first_bad{R};  // the lowest roi without a valid region (its error is reported)
    parallel_for(R, 1, [&](int64_t r0, int64_t r1) {
      auto* binned = static_cast<float*>(thread_slice(binned_of_threads, binned_bytes(), ctx.threads));
      // A roi's samples: their count depends on its size when sampling_ratio is 0 (adaptive), so they
      // live in a per-thread buffer that grows to the largest roi seen and is reused by later runs.
      thread_local std::vector<Sample> samples;
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = bidx.get_i64(r);
        ops::roi_align::Region reg;
        if (!region_of(r, &reg).empty()) {
          for (int64_t seen = first_bad.load(); r < seen && !first_bad.compare_exchange_weak(seen, r);) {
          }
          continue;
        }
        const int64_t gh = reg.gh, gw = reg.gw;
        const double count = reg.count;
        ops::roi_align::sample_grid(reg, oh, ow, H, W, samples);
        const float* xp = xt + b * HW * C;
        const int64_t per_bin = gh * gw, bins = oh * ow;
        float* yr = py + r * C * bins;
        if (per_bin == 0) {
          std::fill(yr, yr + C * bins, 0.f);
          continue;
        }
        // [bins, C] first (contiguous vector stores), then transposed into the output's [C, bins].
        for (int64_t bin = 0; bin < bins; ++bin)
          pool(xp, C, samples.data() + bin * per_bin, per_bin, avg, count, binned + bin * C);
        for (int64_t c = 0; c < C; ++c)
          for (int64_t bin = 0; bin < bins; ++bin) yr[c * bins + bin] = binned[static_cast<size_t>(bin * C + c)];
      }
    });
    if (const int64_t r = first_bad.load(); r < R) {
      ops::roi_align::Region reg;
      return InvalidArgument("roi ", r, " ", region_of(r, &reg));
    }
    return Status::Ok();
  }
};

class RoiAlignKiln : public Tactic {
 public:
  std::string name() const override { return "roi_align_kiln"; }
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "RoiAlign"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = cpu_check(sig); !e.empty()) return e;
    if (sig.inputs.size() != 3 || !sig.has_input(0) || !sig.has_input(1) || !sig.has_input(2))
      return "X, rois and batch_indices are required";
    if (sig.inputs[0].dtype != DataType::kFloat32) return "X is not float32";
    if (sig.inputs[1].dtype != DataType::kFloat32 && sig.inputs[1].dtype != DataType::kFloat64)
      return "rois are not float32 / float64";
    if (!dtype_is_integer(sig.inputs[2].dtype)) return "batch_indices are not integers";
    const ir::Node& n = *sig.node;
    const int64_t oh = n.attr_int("output_height", 1), ow = n.attr_int("output_width", 1);
    if (oh < 1 || ow < 1 || oh > 65536 || ow > 65536) return "output_height / output_width out of range";
    const int64_t sr = n.attr_int("sampling_ratio", 0);
    if (sr < 0 || sr > 65536) return "sampling_ratio out of range";
    const std::string mode = n.attr_string("mode", "avg");
    if (mode != "avg" && mode != "max") return "mode '" + mode + "'";
    const std::string ctm =
        n.attr_string("coordinate_transformation_mode", n.opset >= 16 ? "half_pixel" : "output_half_pixel");
    if (ctm != "half_pixel" && ctm != "output_half_pixel") return "coordinate_transformation_mode '" + ctm + "'";
    const Dims& x = sig.inputs[0].shape;
    const Dims& rois = sig.inputs[1].shape;
    const Dims& bi = sig.inputs[2].shape;
    if (x.size() != 4 || rois.size() != 2 || bi.size() != 1) return "X not 4-D, rois not 2-D or batch_indices not 1-D";
    if (!sig.fully_known()) return "";
    if (rois[1] != 4 || bi[0] != rois[0]) return "rois are not [R, 4] with R batch indices";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    const ir::Node& n = *sig.node;
    auto p = std::make_unique<PreparedRoiAlign>();
    p->oh = n.attr_int("output_height", 1), p->ow = n.attr_int("output_width", 1);
    p->sampling_ratio = n.attr_int("sampling_ratio", 0);
    p->scale = n.attr_float("spatial_scale", 1.0f);
    p->avg = n.attr_string("mode", "avg") == "avg";
    p->half_pixel = n.attr_string("coordinate_transformation_mode",
                                  n.opset >= 16 ? "half_pixel" : "output_half_pixel") == "half_pixel";
    const Dims& x = sig.inputs[0].shape;
    p->x_shape = x;
    p->out_shape = {sig.inputs[1].shape[0], x[1], p->oh, p->ow};
    Isa isa = cpu_isa(sig.isa);
    p->pool = isa == Isa::kAvx512 ? pool_avx512 : isa == Isa::kAvx2 ? pool_avx2 : pool_scalar;
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

}  // namespace

const Tactic* nms_kiln() {
  static const NmsKiln t;
  return &t;
}

const Tactic* roi_align_kiln() {
  static const RoiAlignKiln t;
  return &t;
}

}  // namespace kiln::backends::cpu
