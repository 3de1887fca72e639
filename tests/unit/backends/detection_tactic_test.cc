// The detection post-processing tactics (detection_tactic.cc, index_tactic.cc) against the reference
// kernels, on every instruction-set path, on random layers: odd sizes, ties and NaNs for TopK and NMS,
// empty outputs (NMS, NonZero, TopK with k = 0, no rois), every attribute variant. Their results must
// be the reference's exactly (the tactics repeat its arithmetic), so outputs are compared bit for bit
// (-0 and +0 aside, NaN equal to NaN). Outputs whose shape depends on the data are allocated by the
// tactic (engine/executor.h): the harness passes undefined tensors for those.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>

#include "../graph_builder.h"
#include "backends/cpu/kiln_tactics.h"
#include "ir/attribute_builders.h"
#include "layer_case.h"

namespace kiln {
namespace {

using testing::GraphBuilder;
using testing::LayerCase;
using testing::make_node;
using testing::pick;
using testing::set_string;

Tensor ints(const std::vector<int64_t>& v, Dims shape) { return Tensor::from_vector(DataType::kInt64, shape, v); }

// Floats from a few values (ties), sometimes NaN / -0 / +0 / inf.
Tensor tie_floats(std::mt19937& rng, Dims shape, int levels, bool specials) {
  Tensor t(DataType::kFloat32, shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    p[i] = static_cast<float>(static_cast<int>(rng() % static_cast<unsigned>(levels)) - levels / 2) / 4.f;
    if (specials && rng() % 17 == 0) {
      const float s[] = {NAN, -0.f, 0.f, INFINITY, -INFINITY};
      p[i] = s[rng() % 5];
    }
  }
  return t;
}

bool same_bits(const Tensor& want, const Tensor& got, std::string* why) {
  if (want.dtype() != got.dtype() || want.shape() != got.shape()) {
    *why = "want " + want.describe() + ", got " + got.describe();
    return false;
  }
  const size_t es = dtype_size(want.dtype());
  for (int64_t i = 0; i < want.numel(); ++i) {
    const auto* w = static_cast<const uint8_t*>(want.raw()) + static_cast<size_t>(i) * es;
    const auto* g = static_cast<const uint8_t*>(got.raw()) + static_cast<size_t>(i) * es;
    if (std::memcmp(w, g, es) == 0) continue;
    if (want.dtype() == DataType::kFloat32) {
      float a = want.data<float>()[i], b = got.data<float>()[i];
      if (a == b || (std::isnan(a) && std::isnan(b))) continue;
      *why = "element " + std::to_string(i) + ": want " + std::to_string(a) + ", got " + std::to_string(b);
    } else {
      *why = "element " + std::to_string(i) + " differs: want " + std::to_string(want.get_f64(i)) + ", got " +
             std::to_string(got.get_f64(i));
    }
    return false;
  }
  return true;
}

// Runs `tactic` on `cases` layers from `make` against the reference kernel; returns how many it took
// (cases the reference rejects are counted in *rejected: the tactic must then fail too, not crash).
int check(const backends::Tactic* tactic, int cases, uint64_t seed,
          const std::function<LayerCase(std::mt19937&, uint64_t)>& make, int* empty = nullptr) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  int checked = 0;
  for (int iter = 0; iter < cases; ++iter) {
    LayerCase lc = make(rng, seed + 10 * iter);
    backends::LayerSignature sig = testing::layer_signature(lc);
    if (!tactic->supports(sig)) continue;
    bool known = false;
    std::vector<Tensor> want = testing::reference_outputs(lc, &known);
    EXPECT_TRUE(known) << lc.node.op_type;
    auto prepared = tactic->prepare(sig);
    if (want.empty()) {  // the reference rejects the case: the tactic declines or fails cleanly
      if (!prepared.ok()) continue;
    }
    if (!prepared.ok()) {
      ADD_FAILURE() << tactic->name() << " case " << iter << ": " << prepared.status().to_string();
      continue;
    }
    std::vector<Dims> shapes = prepared.value()->output_shapes();
    std::vector<DataType> dtypes = prepared.value()->output_dtypes();
    std::vector<Tensor> got(shapes.size());
    std::vector<Tensor*> ptrs;
    for (size_t o = 0; o < shapes.size(); ++o) {
      bool dynamic = false;
      for (int64_t d : shapes[o]) dynamic |= d < 0;
      if (!dynamic) got[o] = Tensor(dtypes[o], shapes[o]);
      ptrs.push_back(&got[o]);
    }
    std::vector<const Tensor*> ins;
    for (size_t i = 0; i < lc.node.inputs.size(); ++i)
      ins.push_back(lc.node.inputs[i].empty() || !lc.inputs[i].defined() ? nullptr : &lc.inputs[i]);
    Status st = prepared.value()->run_standalone(ins, ptrs);
    if (want.empty()) {
      EXPECT_FALSE(st.ok()) << tactic->name() << " case " << iter << " ran a case the reference rejects";
      continue;
    }
    if (!st.ok() || got.size() != want.size()) {
      ADD_FAILURE() << tactic->name() << " case " << iter << ": " << st.to_string() << ", " << got.size()
                    << " outputs for " << want.size();
      continue;
    }
    for (size_t o = 0; o < want.size(); ++o) {
      if (!got[o].defined()) {
        ADD_FAILURE() << tactic->name() << " case " << iter << " left output " << o << " undefined";
        continue;
      }
      std::string why;
      EXPECT_TRUE(same_bits(want[o], got[o], &why))
          << tactic->name() << " case " << iter << " (" << lc.node.op_type << " " << dims_str(lc.inputs[0].shape())
          << ") output " << o << ": " << why;
      if (empty && o == 0 && want[o].numel() == 0) ++*empty;
    }
    ++checked;
  }
  return checked;
}

class IsaScope {
 public:
  explicit IsaScope(const char* isa) { setenv("KILN_ISA", isa, 1); }
  ~IsaScope() { unsetenv("KILN_ISA"); }
};

// ---- cases

LayerCase nms_case(std::mt19937& rng, uint64_t seed) {
  const int inputs = static_cast<int>(pick(rng, 2, 5));
  LayerCase lc;
  lc.node = make_node("", "NonMaxSuppression", static_cast<size_t>(inputs));
  lc.node.opset = 11;
  const bool center = rng() % 2;
  if (center || rng() % 3 == 0) GraphBuilder::set_int(lc.node, "center_point_box", center);
  const int64_t B = pick(rng, 1, 2), C = pick(rng, 1, 4);
  const int64_t S = rng() % 8 == 0 ? 0 : rng() % 3 ? pick(rng, 1, 40) : pick(rng, 41, 1500);
  // Boxes on a small grid of coordinates (duplicates and exact-threshold IoUs), sometimes offset by
  // class far apart as torchvision's batched NMS does, sometimes with a NaN or a degenerate box.
  Tensor boxes(DataType::kFloat32, {B, S, 4});
  float* pb = boxes.data<float>();
  const bool offset = rng() % 3 == 0;
  for (int64_t i = 0; i < B * S; ++i) {
    float a = static_cast<float>(pick(rng, 0, 20)), b = static_cast<float>(pick(rng, 0, 20));
    float w = static_cast<float>(pick(rng, 0, 12)), h = static_cast<float>(pick(rng, 0, 12));
    float off = offset ? static_cast<float>(rng() % 3) * 100.f : 0.f;
    if (center)
      pb[i * 4] = a + off, pb[i * 4 + 1] = b + off, pb[i * 4 + 2] = w, pb[i * 4 + 3] = h;
    else if (rng() % 2)  // corners in either order
      pb[i * 4] = b + off, pb[i * 4 + 1] = a + off, pb[i * 4 + 2] = b + h + off, pb[i * 4 + 3] = a + w + off;
    else
      pb[i * 4] = b + h + off, pb[i * 4 + 1] = a + w + off, pb[i * 4 + 2] = b + off, pb[i * 4 + 3] = a + off;
    if (rng() % 50 == 0) pb[i * 4 + rng() % 4] = NAN;
  }
  lc.inputs = {boxes, tie_floats(rng, {B, C, S}, 9, true)};
  if (inputs > 2) {
    const int64_t m[] = {0, 1, 3, 1000};
    lc.inputs.push_back(ints({m[rng() % 4]}, {1}));
  }
  if (inputs > 3) {
    const float iou[] = {0.f, 0.3f, 0.5f, 1.f / 3.f, 0.7f, 1.f};
    lc.inputs.push_back(Tensor::from_vector(DataType::kFloat32, {1}, std::vector<float>{iou[rng() % 6]}));
  }
  if (inputs > 4) {
    const float thr[] = {-1.f, 0.f, 0.25f, 5.f};
    lc.inputs.push_back(Tensor::from_vector(DataType::kFloat32, {1}, std::vector<float>{thr[rng() % 4]}));
  }
  if (inputs > 3 && rng() % 6 == 0) lc.node.inputs[2] = "", lc.inputs[2] = Tensor();  // no max: nothing kept
  lc.constant.assign(lc.inputs.size(), false);
  return lc;
}

LayerCase roi_align_case(std::mt19937& rng, uint64_t seed) {
  LayerCase lc;
  lc.node = make_node("", "RoiAlign", 3);
  lc.node.opset = rng() % 3 ? 16 : 10;
  if (lc.node.opset == 16 && rng() % 2)
    set_string(lc.node, "coordinate_transformation_mode", rng() % 2 ? "half_pixel" : "output_half_pixel");
  if (rng() % 2) set_string(lc.node, "mode", rng() % 2 ? "max" : "avg");
  if (rng() % 3) GraphBuilder::set_int(lc.node, "output_height", pick(rng, 1, 7));
  if (rng() % 3) GraphBuilder::set_int(lc.node, "output_width", pick(rng, 1, 5));
  if (rng() % 2) GraphBuilder::set_int(lc.node, "sampling_ratio", pick(rng, 0, 3));
  const float scales[] = {1.f, 0.5f, 0.25f, 0.125f};
  if (rng() % 2) testing::set_float(lc.node, "spatial_scale", scales[rng() % 4]);
  const int64_t N = pick(rng, 1, 3), C = rng() % 2 ? pick(rng, 1, 9) : pick(rng, 10, 37);
  const int64_t H = pick(rng, 1, 17), W = pick(rng, 1, 19), R = rng() % 8 == 0 ? 0 : pick(rng, 1, 9);
  Tensor rois(DataType::kFloat32, {R, 4});
  std::uniform_real_distribution<float> u(-4.f, 40.f);
  for (int64_t i = 0; i < R * 4; ++i) rois.data<float>()[i] = u(rng);
  std::vector<int64_t> bi;
  for (int64_t r = 0; r < R; ++r) bi.push_back(pick(rng, 0, N - 1));
  lc.inputs = {testing::random_tensor({N, C, H, W}, seed), rois, ints(bi, {R})};
  lc.constant = {false, false, false};
  return lc;
}

LayerCase topk_case(std::mt19937& rng, uint64_t seed) {
  LayerCase lc;
  const int opset[] = {1, 10, 11, 11};
  const int op = opset[rng() % 4];
  lc.node = make_node("", "TopK", op < 10 ? 1 : 2);
  lc.node.opset = op;
  lc.node.outputs = {"values", "indices"};
  const size_t rank = static_cast<size_t>(pick(rng, 1, 3));
  Dims shape;
  for (size_t d = 0; d < rank; ++d) shape.push_back(rng() % 4 ? pick(rng, 1, 9) : pick(rng, 10, 300));
  const int64_t axis = pick(rng, -static_cast<int64_t>(rank), static_cast<int64_t>(rank) - 1);
  if (axis != -1 || rng() % 2) GraphBuilder::set_int(lc.node, "axis", axis);
  const int64_t len = shape[static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(rank) : axis)];
  const int64_t k = rng() % 6 == 0 ? 0 : rng() % 5 == 0 ? len : pick(rng, 1, len);
  if (op >= 11 && rng() % 2) GraphBuilder::set_int(lc.node, "largest", rng() % 2);
  if (op >= 11 && rng() % 3 == 0) GraphBuilder::set_int(lc.node, "sorted", 1);
  lc.inputs = {tie_floats(rng, shape, rng() % 2 ? 5 : 1000, rng() % 2)};
  if (op < 10)
    GraphBuilder::set_int(lc.node, "k", k);
  else
    lc.inputs.push_back(ints({k}, {1}));
  lc.constant = {false, rng() % 2 == 0};  // K a constant (static shape) or computed (run-time shape)
  return lc;
}

LayerCase gather_nd_case(std::mt19937& rng, uint64_t seed) {
  LayerCase lc;
  lc.node = make_node("", "GatherND", 2);
  lc.node.opset = 13;
  const int64_t b = rng() % 3 == 0 ? 1 : 0;
  const size_t r = static_cast<size_t>(pick(rng, b + 1, 4));
  Dims data;
  for (size_t d = 0; d < r; ++d) data.push_back(pick(rng, 1, 7));
  const int64_t k = pick(rng, 1, static_cast<int64_t>(r) - b);
  Dims ind(data.begin(), data.begin() + b);
  for (int64_t d = 0, extra = pick(rng, 0, 2); d < extra; ++d) ind.push_back(pick(rng, 0, 5));
  ind.push_back(k);
  if (b) GraphBuilder::set_int(lc.node, "batch_dims", b);
  std::vector<int64_t> iv(static_cast<size_t>(dims_numel(ind)));
  for (size_t i = 0; i < iv.size(); ++i) {
    const int64_t dim = data[static_cast<size_t>(b) + i % static_cast<size_t>(k)];
    iv[i] = pick(rng, -dim, dim - 1);
    if (rng() % 200 == 0) iv[i] = dim;  // out of range: both reject
  }
  const bool as_int = rng() % 3 == 0;
  lc.inputs = {
      as_int ? testing::random_tensor(data, seed, DataType::kInt64, -50, 50) : testing::random_tensor(data, seed),
      ints(iv, ind)};
  lc.constant = {false, false};
  return lc;
}

LayerCase nonzero_case(std::mt19937& rng, uint64_t seed) {
  LayerCase lc;
  lc.node = make_node("", "NonZero", 1);
  lc.node.opset = 13;
  const size_t r = static_cast<size_t>(pick(rng, 0, 3));
  Dims shape;
  for (size_t d = 0; d < r; ++d) shape.push_back(rng() % 6 == 0 ? 0 : pick(rng, 1, 13));
  const DataType dts[] = {DataType::kFloat32, DataType::kBool, DataType::kInt64, DataType::kUInt8, DataType::kInt32};
  const DataType dt = dts[rng() % 5];
  Tensor x(dt, shape);
  const int density = static_cast<int>(rng() % 4);  // 0: all zero
  for (int64_t i = 0; i < x.numel(); ++i) {
    bool hit = density && static_cast<int>(rng() % 4) < density;
    if (dt == DataType::kFloat32)
      x.data<float>()[i] = hit ? (rng() % 9 == 0 ? NAN : 0.5f) : (rng() % 2 ? -0.f : 0.f);
    else
      x.set_f64(i, hit ? 1.0 + static_cast<double>(rng() % 3) : 0.0);
  }
  lc.inputs = {x};
  lc.constant = {false};
  return lc;
}

LayerCase scatter_case(std::mt19937& rng, uint64_t seed) {
  LayerCase lc;
  lc.node = make_node("", "ScatterElements", 3);
  lc.node.opset = 18;
  const char* reds[] = {"none", "add", "mul", "max", "min"};
  const char* red = reds[rng() % 5];
  if (std::string(red) != "none" || rng() % 2) set_string(lc.node, "reduction", red);
  const size_t r = static_cast<size_t>(pick(rng, 1, 4));
  Dims data, ind;
  for (size_t d = 0; d < r; ++d) data.push_back(pick(rng, 1, 8));
  const int64_t axis = pick(rng, -static_cast<int64_t>(r), static_cast<int64_t>(r) - 1);
  size_t a = static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(r) : axis);
  if (axis != 0 || rng() % 2) GraphBuilder::set_int(lc.node, "axis", axis);
  for (size_t d = 0; d < r; ++d) ind.push_back(d == a ? pick(rng, 0, 9) : pick(rng, 0, data[d]));
  std::vector<int64_t> iv(static_cast<size_t>(dims_numel(ind)));
  for (auto& v : iv) v = pick(rng, -data[a], data[a] - 1), v = rng() % 300 == 0 ? data[a] : v;
  if (r >= 2 && rng() % 2) {
    // Whole rows along axis 0, as a detector's multi-level RoI pooling scatters them: one index per row
    // (distinct, or sometimes repeated: the last row wins), the other dims those of data.
    a = 0;
    lc.node.attrs.erase("axis");
    ind = data;
    ind[0] = pick(rng, 0, data[0]);
    const int64_t inner = dims_numel(data) / data[0];
    std::vector<int64_t> rows(static_cast<size_t>(data[0]));
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i) - (rng() % 2 ? data[0] : 0);
    std::shuffle(rows.begin(), rows.end(), rng);
    if (rng() % 4 == 0) rows[0] = rows.back();  // a repeated row
    iv.assign(static_cast<size_t>(dims_numel(ind)), 0);
    for (int64_t j = 0; j < ind[0]; ++j)
      for (int64_t i = 0; i < inner; ++i) iv[static_cast<size_t>(j * inner + i)] = rows[static_cast<size_t>(j)];
    if (rng() % 6 == 0 && !iv.empty()) iv[iv.size() / 2] = data[0] - 1;  // one element off its row's value
  }
  const bool as_int = rng() % 3 == 0;
  DataType dt = as_int ? DataType::kInt64 : DataType::kFloat32;
  lc.inputs = {testing::random_tensor(data, seed, dt, -9, 9), ints(iv, ind),
               testing::random_tensor(ind, seed + 1, dt, -9, 9)};
  lc.constant = {false, false, false};
  return lc;
}

LayerCase fill_case(std::mt19937& rng, uint64_t seed) {
  LayerCase lc;
  const size_t r = static_cast<size_t>(pick(rng, 0, 4));
  Dims target;
  for (size_t d = 0; d < r; ++d) target.push_back(rng() % 7 == 0 ? 0 : pick(rng, 1, 9));
  if (rng() % 2) {
    lc.node = make_node("", "ConstantOfShape", 1);
    lc.node.opset = 20;
    const int v = static_cast<int>(rng() % 4);
    if (v == 1)
      lc.node.attrs["value"] = ir::attr_tensor(Tensor::from_vector(DataType::kFloat32, {1}, std::vector<float>{2.5f}));
    if (v == 2) lc.node.attrs["value"] = ir::attr_tensor(ints({-7}, {1}));
    if (v == 3)
      lc.node.attrs["value"] = ir::attr_tensor(Tensor::from_vector(DataType::kFloat32, {1}, std::vector<float>{0.f}));
    lc.inputs = {ints(target, {static_cast<int64_t>(r)})};
    lc.constant = {false};
    return lc;
  }
  lc.node = make_node("", "Expand", 2);
  lc.node.opset = 13;
  // X broadcasting to the target: each of its dims the target's, 1, or (sometimes) wrong.
  Dims x;
  const size_t xr = static_cast<size_t>(pick(rng, 0, static_cast<int64_t>(r) + 1));
  for (size_t d = 0; d < xr; ++d) {
    const size_t t = d + r >= xr ? d + r - xr : SIZE_MAX;
    const int64_t td = t < r ? target[t] : 1;
    x.push_back(rng() % 3 == 0 ? 1 : rng() % 25 == 0 ? td + 2 : (rng() % 4 == 0 && td == 1 ? pick(rng, 2, 4) : td));
  }
  const bool as_int = rng() % 3 == 0;
  lc.inputs = {testing::random_tensor(x, seed, as_int ? DataType::kInt64 : DataType::kFloat32, -9, 9),
               ints(target, {static_cast<int64_t>(r)})};
  lc.constant = {false, false};
  return lc;
}

class DetectionTactics : public ::testing::TestWithParam<const char*> {};

TEST_P(DetectionTactics, NonMaxSuppressionMatchesTheReferenceKernel) {
  IsaScope isa(GetParam());
  int empty = 0;
  int n = check(backends::cpu::nms_kiln(), 300, 101, nms_case, &empty);
  EXPECT_GT(n, 250);
  EXPECT_GT(empty, 10);  // nothing selected: no max, max 0, a threshold above every score, no boxes
}

TEST_P(DetectionTactics, RoiAlignMatchesTheReferenceKernel) {
  IsaScope isa(GetParam());
  EXPECT_GT(check(backends::cpu::roi_align_kiln(), 200, 202, roi_align_case), 180);
}

TEST_P(DetectionTactics, TopKMatchesTheReferenceKernel) {
  IsaScope isa(GetParam());
  int empty = 0;
  EXPECT_GT(check(backends::cpu::topk_kiln(), 300, 303, topk_case, &empty), 280);
  EXPECT_GT(empty, 10);
}

TEST_P(DetectionTactics, GatherNDMatchesTheReferenceKernel) {
  IsaScope isa(GetParam());
  EXPECT_GT(check(backends::cpu::gather_nd_kiln(), 200, 404, gather_nd_case), 150);
}

TEST_P(DetectionTactics, NonZeroMatchesTheReferenceKernel) {
  IsaScope isa(GetParam());
  int empty = 0;
  EXPECT_GT(check(backends::cpu::nonzero_kiln(), 200, 505, nonzero_case, &empty), 190);
  EXPECT_GT(empty, 10);
}

TEST_P(DetectionTactics, ScatterElementsMatchesTheReferenceKernel) {
  IsaScope isa(GetParam());
  EXPECT_GT(check(backends::cpu::scatter_elements_kiln(), 250, 606, scatter_case), 200);
}

TEST_P(DetectionTactics, ConstantOfShapeAndExpandMatchTheReferenceKernels) {
  IsaScope isa(GetParam());
  EXPECT_GT(check(backends::cpu::fill_kiln(), 250, 707, fill_case), 180);
}

INSTANTIATE_TEST_SUITE_P(Isa, DetectionTactics, ::testing::Values("avx512", "avx2", "scalar"));

}  // namespace
}  // namespace kiln
