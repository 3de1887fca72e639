// Index and selection ops of detection post-processing, with the reference kernels' exact results:
// TopK (float32: packed (value, index) keys, partial selection then a sort of the k), GatherND
// (batch_dims, runs of the inner dims copied), NonZero, ScatterElements (every reduction, in the
// reference's order of updates), ConstantOfShape (a fill) and Expand with a shape computed at run
// time (broadcast copies; movement_kiln takes a constant shape).
//
// NonZero, ConstantOfShape, Expand and TopK with a K computed at run time have outputs whose shape
// depends on the data: output_shapes() reports -1 there and run() allocates them (engine/executor.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/thread_slices.h"
#include "backends/tactic.h"
#include "core/checked_size.h"
#include "core/parallel.h"
#include "ops/scatter_reduction.h"

namespace kiln::backends::cpu {
namespace {

constexpr int64_t kGrain = int64_t{1} << 16;  // elements per thread at least

bool plain_size(DataType dt) {
  if (dt == DataType::kString || dt == DataType::kUndefined) return false;
  size_t es = dtype_size(dt);
  return es == 1 || es == 2 || es == 4 || es == 8;
}

Dims strides_of(const Dims& x) {
  Dims s(x.size(), 1);
  for (size_t k = x.size(); k-- > 1;) s[k - 1] = s[k] * x[k];
  return s;
}

int64_t index_at(const Tensor& t, int64_t i) {
  return t.dtype() == DataType::kInt64 ? t.data<int64_t>()[i] : int64_t{t.data<int32_t>()[i]};
}

bool int_indices(DataType dt) { return dt == DataType::kInt64 || dt == DataType::kInt32; }

// A count for a workspace size: 0 for a dim not known (a layer prepared before its shapes are).
size_t known_count(int64_t n) { return n > 0 ? static_cast<size_t>(n) : 0; }
size_t known_numel(const Dims& d) {
  for (int64_t x : d)
    if (x < 0) return 0;
  return known_count(dims_numel(d));
}

// ---- TopK

// A float's bits in an unsigned order: a < b iff key(a) < key(b), -0 taken as +0, NaN above +inf
// (the reference counts NaN as the largest value).
inline uint32_t ordered_bits(float v) {
  if (std::isnan(v)) return 0xffffffffu;
  if (v == 0.f) v = 0.f;
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}

class PreparedTopK : public PreparedLayer {
 public:
  int64_t outer = 1, len = 1, inner = 1, axis = 0;
  int64_t k = -1;  // -1: read from input 1 at run time
  bool largest = true;
  Dims in_shape;

  Dims shape_for(int64_t kk) const {
    Dims d = in_shape;
    d[static_cast<size_t>(axis)] = kk;
    return d;
  }
  std::vector<Dims> output_shapes() const override { return {shape_for(k), shape_for(k)}; }
  std::vector<DataType> output_dtypes() const override { return {DataType::kFloat32, DataType::kInt64}; }
  // Per thread: the keys of one row.
  size_t row_bytes() const { return workspace_piece(known_count(len) * sizeof(uint64_t)); }
  size_t workspace_bytes(int threads) const override { return static_cast<size_t>(std::max(threads, 1)) * row_bytes(); }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    int64_t kk = k;
    if (kk < 0) {
      const Tensor* kt = in.size() > 1 ? in[1] : nullptr;
      if (!kt || !dtype_is_integer(kt->dtype()) || kt->numel() != 1)
        return InvalidArgument("K must be a one-element integer tensor, got ", kt ? kt->describe() : "nothing");
      kk = kt->get_i64(0);
      if (kk < 0 || kk > len) return InvalidArgument("k = ", kk, " is out of range for axis ", axis, " of size ", len);
      // Renewed in place (a kept output's shape vector reused; the shape built in a kept scratch).
      thread_local Dims shape;
      shape = in_shape;
      shape[static_cast<size_t>(axis)] = kk;
      out[0]->renew(DataType::kFloat32, shape);
      out[1]->renew(DataType::kInt64, shape);
    }
    const float* px = in[0]->data<float>();
    float* pv = out[0]->data<float>();
    int64_t* pi = out[1]->data<int64_t>();
    if (kk == 0) return Status::Ok();
    const int64_t rows = outer * inner;
    WorkspaceSlicer ws(ctx);
    auto* keys_of_threads = static_cast<uint8_t*>(ws.take(workspace_bytes(ctx.threads)));
    parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(len, 1)), [&](int64_t r0, int64_t r1) {
      auto* keys = static_cast<uint64_t*>(thread_slice(keys_of_threads, row_bytes(), ctx.threads));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t o = r / inner, c = r % inner;
        const float* x = px + o * len * inner + c;
        for (int64_t a = 0; a < len; ++a) {
          uint32_t b = ordered_bits(x[a * inner]);
          keys[a] = (static_cast<uint64_t>(largest ? ~b : b) << 32) | static_cast<uint64_t>(a);
        }
        if (kk < len) std::nth_element(keys, keys + kk, keys + len);
        std::sort(keys, keys + kk);
        const int64_t base = o * kk * inner + c;
        for (int64_t j = 0; j < kk; ++j) {
          const int64_t a = static_cast<int64_t>(keys[j] & 0xffffffffu);
          pv[base + j * inner] = x[a * inner];
          pi[base + j * inner] = a;
        }
      }
    });
    return Status::Ok();
  }
};

class TopKKiln : public Tactic {
 public:
  std::string name() const override { return "topk_kiln"; }
  TacticInfo info() const override { return TacticInfo::cpu_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "TopK"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.device.kind != DeviceKind::kCPU) return "not a CPU layer";
    if (!sig.has_input(0) || sig.inputs[0].dtype != DataType::kFloat32) return "X is not float32";
    if (sig.node->opset < 10) {
      if (!sig.node->attr("k")) return "no attribute k";
    } else if (!sig.has_input(1) || !int_indices(sig.inputs[1].dtype)) {
      return "K is not an int64 / int32 input";
    }
    const Dims& x = sig.inputs[0].shape;
    if (x.empty()) return "X is a scalar";
    const int64_t r = static_cast<int64_t>(x.size()), axis = sig.node->attr_int("axis", -1);
    if (axis < -r || axis >= r) return "axis out of range";
    if (!sig.fully_known()) return "";
    if (x[static_cast<size_t>(axis < 0 ? axis + r : axis)] >= (int64_t{1} << 32))
      return "axis of 2^32 elements or more";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedTopK>();
    const Dims& x = sig.inputs[0].shape;
    const int64_t r = static_cast<int64_t>(x.size());
    int64_t axis = sig.node->attr_int("axis", -1);
    if (axis < 0) axis += r;
    p->axis = axis;
    p->in_shape = x;
    for (int64_t d = 0; d < r; ++d) {
      int64_t n = x[static_cast<size_t>(d)];
      (d < axis ? p->outer : d == axis ? p->len : p->inner) *= n;
    }
    p->largest = sig.node->opset < 11 || sig.node->attr_int("largest", 1) != 0;
    if (sig.node->opset < 10) {
      p->k = sig.node->attr_int("k", 0);
    } else if (const Tensor* kt = sig.inputs[1].constant; kt && kt->numel() == 1) {
      p->k = kt->get_i64(0);
    }
    if (p->k != -1 && (p->k < 0 || p->k > p->len))
      return Unsupported(name(), ": k = ", p->k, " is out of range for an axis of size ", p->len);
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

// ---- GatherND

class PreparedGatherND : public PreparedLayer {
 public:
  Dims data_shape, out_shape;
  DataType dtype = DataType::kFloat32;
  int64_t b = 0, k = 1, batches = 1, per_batch = 1, inner = 1;

  Dims strides;  // of data

  std::vector<Dims> output_shapes() const override { return {out_shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  // The offset in data of every index tuple.
  size_t workspace_bytes(int) const override {
    return workspace_piece(known_count(batches * per_batch) * sizeof(int64_t));
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    const Tensor& data = *in[0];
    const Tensor& ind = *in[1];
    const int64_t batch_stride = b > 0 ? strides[static_cast<size_t>(b - 1)] : 0;
    const int64_t tuples = batches * per_batch;
    // Offsets first, checked: a bad index is the user's error, nothing is copied.
    WorkspaceSlicer ws(ctx);
    auto* off = static_cast<int64_t*>(ws.take(static_cast<size_t>(tuples) * sizeof(int64_t)));
    for (int64_t t = 0; t < tuples; ++t) {
      int64_t o = (t / per_batch) * batch_stride;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t d = data_shape[static_cast<size_t>(b + j)], x = index_at(ind, t * k + j);
        if (x < -d || x >= d)
          return InvalidArgument("index ", x, " is out of range for dim ", b + j, " of data ", data.describe());
        o += (x < 0 ? x + d : x) * strides[static_cast<size_t>(b + j)];
      }
      off[t] = o;
    }
    const size_t es = dtype_size(dtype), run = static_cast<size_t>(inner) * es;
    const auto* s = static_cast<const uint8_t*>(data.raw());
    auto* d = static_cast<uint8_t*>(out[0]->raw());
    parallel_for(tuples, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        std::memcpy(d + static_cast<size_t>(t) * run, s + static_cast<size_t>(off[t]) * es, run);
    });
    return Status::Ok();
  }
};

class GatherNDKiln : public Tactic {
 public:
  std::string name() const override { return "gather_nd_kiln"; }
  TacticInfo info() const override { return TacticInfo::cpu_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "GatherND"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.device.kind != DeviceKind::kCPU) return "not a CPU layer";
    if (!sig.has_input(0) || !sig.has_input(1)) return "data and indices are required";
    if (!plain_size(sig.inputs[0].dtype)) return std::string("dtype ") + dtype_name(sig.inputs[0].dtype);
    if (!int_indices(sig.inputs[1].dtype)) return "indices are not int64 / int32";
    if (!sig.fully_known()) return "";
    const Dims &data = sig.inputs[0].shape, &ind = sig.inputs[1].shape;
    const int64_t b = sig.node->attr_int("batch_dims", 0), r = static_cast<int64_t>(data.size()),
                  q = static_cast<int64_t>(ind.size());
    if (q < 1) return "indices are a scalar";
    const int64_t k = ind.back();
    if (b < 0 || b >= q || k < 1 || b + k > r) return "indices do not fit data";
    for (int64_t i = 0; i < b; ++i)
      if (ind[static_cast<size_t>(i)] != data[static_cast<size_t>(i)]) return "batch dims differ";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedGatherND>();
    const Dims &data = sig.inputs[0].shape, &ind = sig.inputs[1].shape;
    p->dtype = sig.inputs[0].dtype;
    p->data_shape = data;
    p->strides = strides_of(data);
    p->b = sig.node->attr_int("batch_dims", 0);
    const int64_t r = static_cast<int64_t>(data.size()), q = static_cast<int64_t>(ind.size());
    p->k = ind.back();
    p->out_shape.assign(ind.begin(), ind.end() - 1);
    p->out_shape.insert(p->out_shape.end(), data.begin() + p->b + p->k, data.end());
    for (int64_t i = 0; i < p->b; ++i) p->batches *= data[static_cast<size_t>(i)];
    for (int64_t i = p->b; i < q - 1; ++i) p->per_batch *= ind[static_cast<size_t>(i)];
    for (int64_t i = p->b + p->k; i < r; ++i) p->inner *= data[static_cast<size_t>(i)];
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

// ---- NonZero

class PreparedNonZero : public PreparedLayer {
 public:
  Dims shape;
  DataType dtype = DataType::kFloat32;

  std::vector<Dims> output_shapes() const override { return {{static_cast<int64_t>(shape.size()), -1}}; }
  std::vector<DataType> output_dtypes() const override { return {DataType::kInt64}; }

  Dims strides;  // of the input

  // The flat positions of the non-zero elements (at most all of them); the output, whose size
  // depends on them, is allocated.
  size_t workspace_bytes(int) const override { return workspace_piece(known_numel(shape) * sizeof(int64_t)); }

  template <class T>
  static int64_t hits_of(const T* p, int64_t n, int64_t* hits) {
    int64_t h = 0;
    for (int64_t i = 0; i < n; ++i)
      if (p[i] != T(0)) hits[h++] = i;
    return h;
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    const Tensor& x = *in[0];
    const int64_t total = x.numel(), r = static_cast<int64_t>(shape.size());
    WorkspaceSlicer ws(ctx);
    auto* hits = static_cast<int64_t*>(ws.take(static_cast<size_t>(total) * sizeof(int64_t)));
    int64_t n = 0;
    switch (dtype) {
      case DataType::kFloat32: n = hits_of(x.data<float>(), total, hits); break;
      case DataType::kFloat64: n = hits_of(x.data<double>(), total, hits); break;
      case DataType::kInt64: n = hits_of(x.data<int64_t>(), total, hits); break;
      case DataType::kInt32: n = hits_of(x.data<int32_t>(), total, hits); break;
      case DataType::kInt8: n = hits_of(x.data<int8_t>(), total, hits); break;
      default: n = hits_of(static_cast<const uint8_t*>(x.raw()), total, hits); break;  // bool, uint8
    }
    if (r == 0) {  // a scalar: [0, nnz], as the reference gives it
      *out[0] = Tensor(DataType::kInt64, {0, n});
      return Status::Ok();
    }
    Tensor& y = *out[0];  // renewed in place: a kept output's shape vector is reused
    y.renew(DataType::kInt64, {r, n});
    int64_t* po = y.data<int64_t>();
    for (int64_t k = 0; k < r; ++k) {
      const int64_t st = strides[static_cast<size_t>(k)], d = shape[static_cast<size_t>(k)];
      int64_t* row = po + k * n;
      for (int64_t j = 0; j < n; ++j) row[j] = hits[j] / st % d;
    }
    return Status::Ok();
  }
};

class NonZeroKiln : public Tactic {
 public:
  std::string name() const override { return "nonzero_kiln"; }
  TacticInfo info() const override { return TacticInfo::cpu_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "NonZero"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.device.kind != DeviceKind::kCPU) return "not a CPU layer";
    if (!sig.has_input(0)) return "no input";
    switch (sig.inputs[0].dtype) {
      case DataType::kFloat32:
      case DataType::kFloat64:
      case DataType::kInt64:
      case DataType::kInt32:
      case DataType::kInt8:
      case DataType::kUInt8:
      case DataType::kBool: return "";
      default: return std::string("dtype ") + dtype_name(sig.inputs[0].dtype);
    }
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedNonZero>();
    p->shape = sig.inputs[0].shape;
    p->strides = strides_of(p->shape);
    p->dtype = sig.inputs[0].dtype;
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

// ---- ScatterElements

using Reduction = ops::ScatterReduction;
using ops::scatter_combine;

class PreparedScatter : public PreparedLayer {
 public:
  Dims data_shape, ind_shape, ds;  // ds: data's strides
  DataType dtype = DataType::kFloat32;
  int64_t axis = 0;
  Reduction red = Reduction::kNone;

  std::vector<Dims> output_shapes() const override { return {data_shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  // The walk's position; scatter_rows' destination per index row and which rows of data they take.
  size_t pos_bytes() const { return workspace_piece(data_shape.size() * sizeof(int64_t)); }
  size_t dest_bytes() const { return workspace_piece(known_count(ind_shape.empty() ? 0 : ind_shape[0]) * 8); }
  size_t taken_bytes() const { return workspace_piece(known_count(data_shape.empty() ? 0 : data_shape[0])); }
  size_t workspace_bytes(int) const override { return pos_bytes() + dest_bytes() + taken_bytes(); }

  template <class T>
  Status scatter(const Tensor& ind, const T* pu, T* po, int64_t* pos) const {
    const int64_t rank = static_cast<int64_t>(data_shape.size());
    const int64_t dim = data_shape[static_cast<size_t>(axis)], axis_stride = ds[static_cast<size_t>(axis)];
    const int64_t last = ind_shape.back(), rows = last ? dims_numel(ind_shape) / last : 0;
    const bool on_last = axis == rank - 1;
    // Updates in the reference's order (the last index dim fastest): a row of the index tensor at a
    // time, its offset in data without the axis term walked as an odometer.
    std::fill(pos, pos + rank, int64_t{0});
    int64_t base = 0;
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t j0 = row * last;
      for (int64_t j = 0; j < last; ++j) {
        const int64_t x = index_at(ind, j0 + j);
        if (x < -dim || x >= dim)
          return InvalidArgument("indices[", j0 + j, "] = ", x, " is out of range for axis ", axis, " of size ", dim);
        const int64_t off = base + (on_last ? 0 : j) + (x < 0 ? x + dim : x) * axis_stride;
        po[off] = red == Reduction::kNone ? pu[j0 + j] : scatter_combine(po[off], pu[j0 + j], red);
      }
      for (int64_t k = rank - 2; k >= 0; --k) {
        const size_t uk = static_cast<size_t>(k);
        if (++pos[uk] < ind_shape[uk]) {
          if (k != axis) base += ds[uk];
          break;
        }
        if (k != axis) base -= (pos[uk] - 1) * ds[uk];
        pos[uk] = 0;
      }
    }
    return Status::Ok();
  }

  // Rows along axis 0 (the indices' inner dims those of data): when every index row holds one value,
  // in range, and no two rows share it (a detector's multi-level RoI pooling: indices expanded from one
  // per roi), the scatter with no reduction is a copy of whole rows, in any order, and the rows it does
  // not write are data's. Else false, nothing written.
  bool scatter_rows(const Tensor& data, const Tensor& ind, const Tensor& upd, Tensor& out, int64_t* dest,
                    char* taken) const {
    if (red != Reduction::kNone || axis != 0 || ind_shape.size() < 2) return false;
    for (size_t k = 1; k < ind_shape.size(); ++k)
      if (ind_shape[k] != data_shape[k]) return false;
    const int64_t rows = ind_shape[0], dim = data_shape[0], inner = dims_numel(ind_shape) / std::max<int64_t>(rows, 1);
    if (rows == 0 || inner == 0) return false;
    std::memset(taken, 0, static_cast<size_t>(dim));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t x = index_at(ind, r * inner);
      if (x < -dim || x >= dim) return false;  // the general walk reports it
      for (int64_t i = 1; i < inner; ++i)
        if (index_at(ind, r * inner + i) != x) return false;
      const int64_t d = x < 0 ? x + dim : x;
      if (taken[d]) return false;
      taken[d] = 1;
      dest[r] = d;
    }
    const size_t row_bytes = static_cast<size_t>(inner) * dtype_size(dtype);
    const auto* s = static_cast<const uint8_t*>(data.raw());
    const auto* u = static_cast<const uint8_t*>(upd.raw());
    auto* o = static_cast<uint8_t*>(out.raw());
    const int64_t grain = std::max<int64_t>(1, kGrain / inner);
    parallel_for(dim, grain, [&](int64_t d0, int64_t d1) {
      for (int64_t d = d0; d < d1; ++d)
        if (!taken[d])
          std::memcpy(o + static_cast<size_t>(d) * row_bytes, s + static_cast<size_t>(d) * row_bytes, row_bytes);
    });
    parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        std::memcpy(o + static_cast<size_t>(dest[r]) * row_bytes, u + static_cast<size_t>(r) * row_bytes, row_bytes);
    });
    return true;
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    const Tensor& data = *in[0];
    WorkspaceSlicer ws(ctx);
    auto* pos = static_cast<int64_t*>(ws.take(pos_bytes()));
    auto* dest = static_cast<int64_t*>(ws.take(dest_bytes()));
    auto* taken = static_cast<char*>(ws.take(taken_bytes()));
    if (scatter_rows(data, *in[1], *in[2], *out[0], dest, taken)) return Status::Ok();
    const size_t bytes = data.nbytes();
    const auto* s = static_cast<const uint8_t*>(data.raw());
    auto* d = static_cast<uint8_t*>(out[0]->raw());
    const int64_t chunks = static_cast<int64_t>((bytes + (1 << 18) - 1) >> 18);
    parallel_for(chunks, 4, [&](int64_t c0, int64_t c1) {
      size_t b0 = static_cast<size_t>(c0) << 18, b1 = std::min(bytes, static_cast<size_t>(c1) << 18);
      if (b1 > b0) std::memcpy(d + b0, s + b0, b1 - b0);
    });
    if (dims_numel(ind_shape) == 0) return Status::Ok();
    switch (dtype) {
      case DataType::kFloat32: return scatter(*in[1], in[2]->data<float>(), out[0]->data<float>(), pos);
      case DataType::kFloat64: return scatter(*in[1], in[2]->data<double>(), out[0]->data<double>(), pos);
      case DataType::kInt64: return scatter(*in[1], in[2]->data<int64_t>(), out[0]->data<int64_t>(), pos);
      default: return scatter(*in[1], in[2]->data<int32_t>(), out[0]->data<int32_t>(), pos);
    }
  }
};

class ScatterElementsKiln : public Tactic {
 public:
  std::string name() const override { return "scatter_elements_kiln"; }
  TacticInfo info() const override { return TacticInfo::cpu_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "ScatterElements"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.device.kind != DeviceKind::kCPU) return "not a CPU layer";
    if (sig.inputs.size() != 3 || !sig.has_input(0) || !sig.has_input(1) || !sig.has_input(2))
      return "data, indices and updates are required";
    DataType dt = sig.inputs[0].dtype;
    if (dt != DataType::kFloat32 && dt != DataType::kFloat64 && dt != DataType::kInt64 && dt != DataType::kInt32)
      return std::string("dtype ") + dtype_name(dt);
    if (sig.inputs[2].dtype != dt) return "updates differ in dtype from data";
    if (!int_indices(sig.inputs[1].dtype)) return "indices are not int64 / int32";
    std::string red = sig.node->attr_string("reduction", "none");
    if (!ops::scatter_reduction(red)) return "reduction '" + red + "'";
    const Dims &data = sig.inputs[0].shape, &ind = sig.inputs[1].shape;
    const int64_t r = static_cast<int64_t>(data.size()), axis = sig.node->attr_int("axis", 0);
    if (r == 0) return "data is a scalar";
    if (axis < -r || axis >= r) return "axis out of range";
    if (!sig.fully_known()) return "";
    if (ind != sig.inputs[2].shape) return "indices and updates differ in shape";
    if (ind.size() != data.size()) return "indices differ in rank from data";
    const int64_t a = axis < 0 ? axis + r : axis;
    for (int64_t k = 0; k < r; ++k)
      if (k != a && ind[static_cast<size_t>(k)] > data[static_cast<size_t>(k)]) return "indices larger than data";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedScatter>();
    p->data_shape = sig.inputs[0].shape;
    p->ds = strides_of(p->data_shape);
    p->ind_shape = sig.inputs[1].shape;
    p->dtype = sig.inputs[0].dtype;
    const int64_t r = static_cast<int64_t>(p->data_shape.size());
    p->axis = sig.node->attr_int("axis", 0);
    if (p->axis < 0) p->axis += r;
    p->red = ops::scatter_reduction(sig.node->attr_string("reduction", "none")).value_or(Reduction::kNone);
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

// ---- ConstantOfShape and Expand (run-time shapes)

// Fills n elements of es bytes at d with the value at v.
void fill_elements(uint8_t* d, int64_t n, const uint8_t* v, size_t es) {
  bool zero = true;
  for (size_t i = 0; i < es; ++i) zero &= v[i] == 0;
  parallel_for(n, kGrain * 4, [&](int64_t i0, int64_t i1) {
    if (zero) {
      std::memset(d + static_cast<size_t>(i0) * es, 0, static_cast<size_t>(i1 - i0) * es);
      return;
    }
    for (int64_t i = i0; i < i1; ++i) std::memcpy(d + static_cast<size_t>(i) * es, v, es);
  });
}

// The dims held by a 1-D integer tensor, into `d` (its capacity reused).
Status shape_input_into(const Tensor& s, const char* what, Dims& d) {
  if (!dtype_is_integer(s.dtype()) || s.rank() > 1)
    return InvalidArgument(what, " must be a 1-D integer tensor, got ", s.describe());
  d.clear();
  for (int64_t i = 0; i < s.numel(); ++i) {
    d.push_back(s.get_i64(i));
    if (d.back() < 0) return InvalidArgument(what, " has a negative dim ", d.back());
  }
  return Status::Ok();
}
Result<Dims> shape_input(const Tensor& s, const char* what) {
  Dims d;
  KILN_RETURN_IF_ERROR(shape_input_into(s, what, d));
  return d;
}

class PreparedFill : public PreparedLayer {
 public:
  Tensor value;  // one element
  int64_t rank = 0;
  std::vector<Dims> output_shapes() const override { return {Dims(static_cast<size_t>(rank), -1)}; }
  std::vector<DataType> output_dtypes() const override { return {value.dtype()}; }
  Status run(const RunContext& /*ctx*/, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    thread_local Dims shape;  // kept: its capacity reused from run to run
    KILN_RETURN_IF_ERROR(shape_input_into(*in[0], "the shape", shape));
    if (auto n = checked_numel(shape, "ConstantOfShape's output"); !n.ok()) return n.status();
    Tensor& y = *out[0];  // renewed in place: a kept output's shape vector is reused
    y.renew(value.dtype(), shape);
    fill_elements(static_cast<uint8_t*>(y.raw()), y.numel(), static_cast<const uint8_t*>(value.raw()),
                  dtype_size(value.dtype()));
    return Status::Ok();
  }
};

class PreparedExpand : public PreparedLayer {
 public:
  Dims x_shape;
  DataType dtype = DataType::kFloat32;
  int64_t rank = 0;  // of the output, when the shape input's length is known
  std::vector<Dims> output_shapes() const override { return {Dims(static_cast<size_t>(rank), -1)}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  Status run(const RunContext& /*ctx*/, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    // Kept scratch (capacity reused from run to run) and the output renewed in place: a steady-state
    // run allocates nothing (tests/noalloc). Named by references: the workers below must read this
    // thread's vectors, not their own thread_local ones.
    thread_local Dims t_target, t_o, t_st, t_xs;
    Dims &target = t_target, &o = t_o, &st = t_st, &xs = t_xs;
    KILN_RETURN_IF_ERROR(shape_input_into(*in[1], "Expand's shape", target));
    const Dims& x = x_shape;
    const size_t ro = std::max(x.size(), target.size());
    o.assign(ro, 0), st.assign(ro, 0), xs.assign(x.size(), 1);
    for (size_t k = x.size(); k-- > 1;) xs[k - 1] = xs[k] * x[k];
    for (size_t k = 0; k < ro; ++k) {
      int64_t xd = k + x.size() >= ro ? x[k + x.size() - ro] : 1;
      int64_t td = k + target.size() >= ro ? target[k + target.size() - ro] : 1;
      if (xd != td && xd != 1 && td != 1)
        return InvalidArgument("input ", dims_str(x), " does not broadcast to shape ", dims_str(target));
      o[k] = xd == 1 ? td : xd;
      st[k] = xd == 1 ? 0 : xs[k + x.size() - ro];
    }
    if (auto n = checked_numel(o, "Expand's output"); !n.ok()) return n.status();
    Tensor& y = *out[0];
    y.renew_uninitialized(dtype, o);
    const size_t es = dtype_size(dtype);
    // Rows of the output: the trailing dims that repeat one element (stride 0) are one fill, else the
    // last dim is one run (a copy when contiguous). A row's source offset from the leading dims.
    size_t lead = ro;
    int64_t n = 1;
    while (lead > 0 && st[lead - 1] == 0) n *= o[--lead];
    const bool fill = lead < ro;
    if (!fill && ro > 0) n = o[--lead];
    const int64_t rows = n ? y.numel() / n : 0;
    const int64_t last_stride = !fill && ro ? st.back() : 1;
    const auto* s = static_cast<const uint8_t*>(in[0]->raw());
    auto* d = static_cast<uint8_t*>(y.raw());
    parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        int64_t off = 0;
        for (int64_t rest = r, k = static_cast<int64_t>(lead) - 1; k >= 0; --k) {
          off += rest % o[static_cast<size_t>(k)] * st[static_cast<size_t>(k)];
          rest /= o[static_cast<size_t>(k)];
        }
        uint8_t* dr = d + static_cast<size_t>(r * n) * es;
        const uint8_t* sr = s + static_cast<size_t>(off) * es;
        if (fill) {
          switch (es) {
            case 8: std::fill_n(reinterpret_cast<uint64_t*>(dr), n, *reinterpret_cast<const uint64_t*>(sr)); break;
            case 4: std::fill_n(reinterpret_cast<uint32_t*>(dr), n, *reinterpret_cast<const uint32_t*>(sr)); break;
            case 2: std::fill_n(reinterpret_cast<uint16_t*>(dr), n, *reinterpret_cast<const uint16_t*>(sr)); break;
            default: std::memset(dr, *sr, static_cast<size_t>(n)); break;
          }
        } else if (last_stride == 1) {
          std::memcpy(dr, sr, static_cast<size_t>(n) * es);
        } else {
          for (int64_t i = 0; i < n; ++i)
            std::memcpy(dr + static_cast<size_t>(i) * es, sr + static_cast<size_t>(i * last_stride) * es, es);
        }
      }
    });
    return Status::Ok();
  }
};

class FillKiln : public Tactic {
 public:
  std::string name() const override { return "fill_kiln"; }
  TacticInfo info() const override { return TacticInfo::cpu_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "ConstantOfShape"}, {"", "Expand"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.device.kind != DeviceKind::kCPU) return "not a CPU layer";
    const bool expand = sig.op() == "Expand";
    const size_t shape_in = expand ? 1 : 0;
    if (!sig.has_input(shape_in) || !dtype_is_integer(sig.inputs[shape_in].dtype)) return "the shape is not integers";
    if (sig.inputs[shape_in].shape.size() != 1 || sig.inputs[shape_in].shape[0] < 0)
      return "the shape's length is not known";
    if (expand) {
      if (!sig.has_input(0) || !plain_size(sig.inputs[0].dtype)) return "X's dtype";
      if (sig.inputs[0].shape.size() > 15) return "rank above 15";
      return "";
    }
    const ir::Attribute* a = sig.node->attr("value");
    if (a && (!a->t.defined() || a->t.numel() != 1 || !plain_size(a->t.dtype()))) return "value is not one element";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    if (sig.op() == "Expand") {
      auto p = std::make_unique<PreparedExpand>();
      p->x_shape = sig.inputs[0].shape;
      p->dtype = sig.inputs[0].dtype;
      p->rank = std::max<int64_t>(static_cast<int64_t>(p->x_shape.size()), sig.inputs[1].shape[0]);
      return std::unique_ptr<PreparedLayer>(std::move(p));
    }
    auto p = std::make_unique<PreparedFill>();
    const ir::Attribute* a = sig.node->attr("value");
    p->value = a ? a->t : Tensor::scalar<float>(DataType::kFloat32, 0.0f);
    p->rank = sig.inputs[0].shape[0];
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

}  // namespace

const Tactic* topk_kiln() {
  static const TopKKiln t;
  return &t;
}
const Tactic* gather_nd_kiln() {
  static const GatherNDKiln t;
  return &t;
}
const Tactic* nonzero_kiln() {
  static const NonZeroKiln t;
  return &t;
}
const Tactic* scatter_elements_kiln() {
  static const ScatterElementsKiln t;
  return &t;
}
const Tactic* fill_kiln() {
  static const FillKiln t;
  return &t;
}

}  // namespace kiln::backends::cpu
