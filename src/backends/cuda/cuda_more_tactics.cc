// CUDA tactics for the layers of the suite's transformers, segmentation and detection models that the
// first CUDA tactics left on the host: Where, comparisons and logic (Equal, Less, Greater, ..., And,
// Or, Xor, Not), Pad, Tile, Resize (nearest through an index-map gather; linear and cubic as a
// weighted sum of taps) and the Reduce* ops over any contiguous group of axes. The geometry is the
// reference's own (ops/movement_geometry.h, ops/resize_plan.h), turned into device tables at prepare
// time; the kernels are in cuda_more_kernels.cu.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_more_kernels.h"
#include "backends/cuda/cuda_tactics.h"
#include "core/shape.h"
#include "ops/common.h"
#include "ops/movement_geometry.h"
#include "ops/resize_plan.h"

namespace kiln::backends::cuda {

namespace {

bool broadcast_all(const std::vector<Dims>& in, Dims* out) {
  size_t r = 0;
  for (const Dims& d : in) r = std::max(r, d.size());
  Dims o(r, 1);
  for (const Dims& d : in)
    for (size_t i = 0; i < d.size(); ++i) {
      int64_t& x = o[r - d.size() + i];
      int64_t y = d[i];
      if (x != y && x != 1 && y != 1) return false;
      if (x == 1) x = y;
    }
  *out = std::move(o);
  return true;
}

// Strides of each input over the broadcast output (0 along broadcast dims).
Broadcast3 broadcast3(const std::vector<Dims>& in, const Dims& out) {
  Broadcast3 p;
  p.rank = static_cast<int>(out.size());
  for (size_t k = 0; k < out.size(); ++k) p.dims[k] = out[k];
  for (size_t j = 0; j < in.size() && j < 3; ++j) {
    Dims s = ops::strides_of(in[j]);
    size_t off = out.size() - in[j].size();
    for (size_t k = 0; k < out.size(); ++k) p.strides[j][k] = k < off || in[j][k - off] == 1 ? 0 : s[k - off];
  }
  return p;
}

TacticInfo cuda_f32() { return {DeviceKind::kCUDA, kIsaPortable, DataType::kFloat32, {DataType::kFloat32}, {}}; }
TacticInfo cuda_any_dtype() { return {DeviceKind::kCUDA, kIsaPortable, DataType::kUndefined, {}, {}}; }

bool movable_size(DataType t) {
  if (t == DataType::kString) return false;
  size_t s = dtype_size(t);
  return s == 1 || s == 2 || s == 4 || s == 8;
}

// The constant int64/int32 values of input i, or false.
bool const_ints(const LayerSignature& sig, size_t i, std::vector<int64_t>* v) {
  if (!sig.has_input(i) || !sig.inputs[i].constant) return false;
  const Tensor& t = *sig.inputs[i].constant;
  if (t.dtype() != DataType::kInt64 && t.dtype() != DataType::kInt32) return false;
  v->clear();
  for (int64_t k = 0; k < t.numel(); ++k) v->push_back(t.get_i64(k));
  return true;
}

std::string ranks_fit(const LayerSignature& sig) {
  for (const auto& t : sig.inputs)
    if (t.present && t.shape.size() > kMaxRank) return "rank above " + std::to_string(kMaxRank);
  return "";
}

// A host table copied to the device (synchronously, at prepare time).
template <typename T>
Result<Tensor> device_table(const std::vector<T>& v, DataType dt, int device) {
  Tensor h(dt, {static_cast<int64_t>(std::max<size_t>(v.size(), 1))});
  if (!v.empty()) std::memcpy(h.raw(), v.data(), v.size() * sizeof(T));
  KILN_ASSIGN_OR_RETURN(Tensor d, to_device(runtime(), device, h, nullptr));
  KILN_RETURN_IF_ERROR(runtime().synchronize(nullptr));
  return d;
}

// ---------------------------------------------------------------- Where

class PreparedWhere : public PreparedLayer {
 public:
  Dims shape;
  DataType dtype = DataType::kFloat32;
  Broadcast3 p;
  DeviceConstants consts;
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return cuda_status(launch_where(consts.data(0, in), consts.data(1, in), consts.data(2, in), out[0]->raw(),
                                    static_cast<int64_t>(dtype_size(dtype)), dims_numel(shape), p, stream_of(ctx)),
                       "where_cuda");
  }
};

class WhereCuda : public Tactic {
 public:
  std::string name() const override { return "where_cuda"; }
  TacticInfo info() const override { return cuda_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Where"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.inputs.size() != 3 || !sig.has_input(0) || !sig.has_input(1) || !sig.has_input(2))
      return "needs three inputs";
    if (sig.inputs[0].dtype != DataType::kBool) return "the condition is not bool";
    if (sig.inputs[1].dtype != sig.inputs[2].dtype || !movable_size(sig.inputs[1].dtype))
      return "X and Y differ in dtype or have elements that cannot be moved";
    return ranks_fit(sig);
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    auto l = std::make_unique<PreparedWhere>();
    std::vector<Dims> in = {sig.inputs[0].shape, sig.inputs[1].shape, sig.inputs[2].shape};
    if (!broadcast_all(in, &l->shape))
      return InvalidArgument("shapes ", dims_str(in[0]), ", ", dims_str(in[1]), " and ", dims_str(in[2]),
                             " do not broadcast");
    l->dtype = sig.inputs[1].dtype;
    l->p = broadcast3(in, l->shape);
    KILN_RETURN_IF_ERROR(l->consts.upload(sig));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

// ---------------------------------------------------------------- comparisons and logic

bool compare_type(DataType t, CompareType* c) {
  switch (t) {
    case DataType::kFloat32: *c = CompareType::kFloat32; return true;
    case DataType::kInt32: *c = CompareType::kInt32; return true;
    case DataType::kInt64: *c = CompareType::kInt64; return true;
    case DataType::kBool: *c = CompareType::kBool; return true;
    default: return false;
  }
}

class PreparedCompare : public PreparedLayer {
 public:
  Dims shape;
  CompareType type = CompareType::kFloat32;
  CompareOp op = CompareOp::kEqual;
  bool unary = false;
  Broadcast3 p;
  DeviceConstants consts;
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {DataType::kBool}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return cuda_status(launch_compare(consts.data(0, in), unary ? nullptr : consts.data(1, in), out[0]->raw(), type, op,
                                      dims_numel(shape), p, stream_of(ctx)),
                       "compare_cuda");
  }
};

class CompareCuda : public Tactic {
 public:
  std::string name() const override { return "compare_cuda"; }
  TacticInfo info() const override { return cuda_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    std::vector<std::pair<std::string, std::string>> v;
    for (const auto& [name, op] : kOps) v.emplace_back("", name);
    return v;
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    CompareOp op = op_of(sig.op());
    const bool unary = op == CompareOp::kNot, logic = op >= CompareOp::kAnd;
    if (!sig.has_input(0) || (!unary && (sig.inputs.size() != 2 || !sig.has_input(1)))) return "missing inputs";
    CompareType t;
    if (!compare_type(sig.inputs[0].dtype, &t)) return std::string(dtype_name(sig.inputs[0].dtype)) + " inputs";
    if (!unary && sig.inputs[1].dtype != sig.inputs[0].dtype) return "the inputs differ in dtype";
    if (logic && t != CompareType::kBool) return "logic ops take bool";
    return ranks_fit(sig);
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    auto l = std::make_unique<PreparedCompare>();
    l->op = op_of(sig.op());
    l->unary = l->op == CompareOp::kNot;
    if (!compare_type(sig.inputs[0].dtype, &l->type)) return Unsupported(dtype_name(sig.inputs[0].dtype), " inputs");
    std::vector<Dims> in = {sig.inputs[0].shape};
    if (!l->unary) in.push_back(sig.inputs[1].shape);
    if (!broadcast_all(in, &l->shape))
      return InvalidArgument("shapes ", dims_str(in[0]), " and ", dims_str(in.back()), " do not broadcast");
    l->p = broadcast3(in, l->shape);
    KILN_RETURN_IF_ERROR(l->consts.upload(sig));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }

 private:
  static constexpr std::pair<const char*, CompareOp> kOps[] = {{"Equal", CompareOp::kEqual},
                                                               {"Less", CompareOp::kLess},
                                                               {"LessOrEqual", CompareOp::kLessOrEqual},
                                                               {"Greater", CompareOp::kGreater},
                                                               {"GreaterOrEqual", CompareOp::kGreaterOrEqual},
                                                               {"And", CompareOp::kAnd},
                                                               {"Or", CompareOp::kOr},
                                                               {"Xor", CompareOp::kXor},
                                                               {"Not", CompareOp::kNot}};
  static CompareOp op_of(const std::string& name) {
    for (const auto& [n, op] : kOps)
      if (name == n) return op;
    return CompareOp::kEqual;
  }
};

// ---------------------------------------------------------------- integer arithmetic

class PreparedIntArith : public PreparedLayer {
 public:
  Dims shape;
  DataType dtype = DataType::kInt64;
  IntOp op = IntOp::kAdd;
  bool unary = false;
  Broadcast3 p;
  DeviceConstants consts;
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return cuda_status(launch_int_arith(consts.data(0, in), unary ? nullptr : consts.data(1, in), out[0]->raw(),
                                        dtype == DataType::kInt64, op, dims_numel(shape), p, stream_of(ctx)),
                       "int_arith_cuda");
  }
};

class IntArithCuda : public Tactic {
 public:
  std::string name() const override { return "int_arith_cuda"; }
  TacticInfo info() const override { return cuda_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    std::vector<std::pair<std::string, std::string>> v;
    for (const auto& [name, op] : kOps) v.emplace_back("", name);
    return v;
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    IntOp op = op_of(sig);
    const bool unary = op == IntOp::kAbs || op == IntOp::kNeg;
    if (!sig.has_input(0) || (!unary && (sig.inputs.size() != 2 || !sig.has_input(1)))) return "missing inputs";
    DataType t = sig.inputs[0].dtype;
    if (t != DataType::kInt64 && t != DataType::kInt32) return "takes int32/int64 (the float kernels take float32)";
    if (!unary && sig.inputs[1].dtype != t) return "the inputs differ in dtype";
    if (sig.node->opset < 7 && !unary) return "legacy broadcasting (opset < 7)";
    if (op == IntOp::kDiv || op == IntOp::kMod || op == IntOp::kFmod) {
      const Tensor* d = sig.inputs[1].constant;
      if (!d) return "an integer divisor computed at run time (division by zero is the reference's error)";
      for (int64_t k = 0; k < d->numel(); ++k)
        if (d->get_i64(k) == 0) return "a zero divisor";
    }
    return ranks_fit(sig);
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (std::string why = why_unsupported(sig); !why.empty()) return Unsupported(why);
    auto l = std::make_unique<PreparedIntArith>();
    l->op = op_of(sig);
    l->unary = l->op == IntOp::kAbs || l->op == IntOp::kNeg;
    l->dtype = sig.inputs[0].dtype;
    std::vector<Dims> in = {sig.inputs[0].shape};
    if (!l->unary) in.push_back(sig.inputs[1].shape);
    if (!broadcast_all(in, &l->shape))
      return InvalidArgument("shapes ", dims_str(in[0]), " and ", dims_str(in.back()), " do not broadcast");
    l->p = broadcast3(in, l->shape);
    KILN_RETURN_IF_ERROR(l->consts.upload(sig));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }

 private:
  static constexpr std::pair<const char*, IntOp> kOps[] = {
      {"Add", IntOp::kAdd}, {"Sub", IntOp::kSub}, {"Mul", IntOp::kMul}, {"Div", IntOp::kDiv}, {"Mod", IntOp::kMod},
      {"Min", IntOp::kMin}, {"Max", IntOp::kMax}, {"Abs", IntOp::kAbs}, {"Neg", IntOp::kNeg}};
  static IntOp op_of(const LayerSignature& sig) {
    const std::string& name = sig.op();
    if (name == "Mod") return sig.node->attr_int("fmod", 0) ? IntOp::kFmod : IntOp::kMod;
    for (const auto& [n, op] : kOps)
      if (name == n) return op;
    return IntOp::kAdd;
  }
};

// ---------------------------------------------------------------- index-map gathers: Pad, Tile, nearest Resize

class PreparedAxisGather : public PreparedLayer {
 public:
  Dims shape;
  DataType dtype = DataType::kFloat32;
  AxisGather p;
  Tensor maps;  // device int64
  DeviceConstants consts;
  const char* kernel = "";
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return cuda_status(launch_axis_gather(consts.data(0, in), out[0]->raw(), static_cast<int64_t>(dtype_size(dtype)),
                                          maps.data<int64_t>(), dims_numel(shape), p, stream_of(ctx)),
                       kernel);
  }
};

// Fills `l` from one source-coordinate table per axis of X (-1: the fill value).
Status finish_gather(PreparedAxisGather& l, const LayerSignature& sig, const std::vector<std::vector<int64_t>>& maps) {
  const Dims& x = sig.inputs[0].shape;
  Dims in_strides = ops::strides_of(x);
  std::vector<int64_t> table;
  l.p.rank = static_cast<int>(x.size());
  for (size_t k = 0; k < x.size(); ++k) {
    l.p.dims[k] = l.shape[k];
    l.p.in_strides[k] = in_strides[k];
    l.p.map_offsets[k] = static_cast<int64_t>(table.size());
    table.insert(table.end(), maps[k].begin(), maps[k].end());
  }
  KILN_ASSIGN_OR_RETURN(l.maps, device_table(table, DataType::kInt64, sig.device.index));
  return l.consts.upload(sig);
}

// The raw bits of a one-element fill tensor of `dt` (zero without one).
uint64_t fill_bits(const Tensor* fill, DataType dt) {
  uint64_t bits = 0;
  if (fill && fill->defined() && fill->numel() > 0 && fill->dtype() == dt)
    std::memcpy(&bits, fill->raw(), dtype_size(dt));
  return bits;
}

class PadCuda : public Tactic {
 public:
  std::string name() const override { return "pad_cuda"; }
  TacticInfo info() const override { return cuda_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Pad"}}; }
  struct Params {
    std::string mode;
    std::vector<int64_t> pads, axes;
    bool has_axes = false;
    const Tensor* fill = nullptr;
    float attr_value = 0.f;
  };
  static std::string params(const LayerSignature& sig, Params* p) {
    const ir::Node& n = *sig.node;
    p->mode = n.attr_string("mode", "constant");
    if (p->mode != "constant" && p->mode != "reflect" && p->mode != "edge" && !(p->mode == "wrap" && n.opset >= 19))
      return "mode '" + p->mode + "'";
    if (n.opset < 11) {
      p->pads = n.attr_ints(ops::pads_attr_name(n.opset));
      p->attr_value = n.attr_float("value", 0.f);
      return "";
    }
    if (!const_ints(sig, 1, &p->pads)) return "pads are not a constant";
    if (sig.has_input(2)) {
      if (!sig.inputs[2].constant) return "constant_value is not a constant";
      p->fill = sig.inputs[2].constant;
      if (p->fill->numel() > 0 && p->fill->dtype() != sig.inputs[0].dtype) return "constant_value's dtype differs";
    }
    if (n.opset >= 18 && sig.has_input(3)) {
      if (!const_ints(sig, 3, &p->axes)) return "axes are not a constant";
      p->has_axes = true;
    }
    return "";
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (!sig.has_input(0) || !movable_size(sig.inputs[0].dtype)) return "no input, or elements that cannot be moved";
    if (auto e = ranks_fit(sig); !e.empty()) return e;
    Params p;
    return params(sig, &p);
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    Params p;
    if (std::string why = params(sig, &p); !why.empty()) return Unsupported(why);
    const Dims& x = sig.inputs[0].shape;
    const int64_t r = static_cast<int64_t>(x.size());
    KILN_ASSIGN_OR_RETURN(ops::PadSpec spec, ops::expand_pads(p.pads, p.has_axes, p.axes, r));
    auto l = std::make_unique<PreparedAxisGather>();
    l->dtype = sig.inputs[0].dtype, l->kernel = "pad_cuda";
    std::vector<std::vector<int64_t>> maps;
    for (int64_t k = 0; k < r; ++k) {
      size_t u = static_cast<size_t>(k);
      KILN_ASSIGN_OR_RETURN(std::vector<int64_t> m, ops::pad_axis_map(x[u], spec.begin[u], spec.end[u], p.mode));
      l->shape.push_back(static_cast<int64_t>(m.size()));
      maps.push_back(std::move(m));
    }
    if (sig.node->opset < 11) {
      Tensor f(l->dtype, {1});
      f.set_f64(0, p.attr_value);
      l->p.fill = fill_bits(&f, l->dtype);
    } else {
      l->p.fill = fill_bits(p.fill, l->dtype);
    }
    KILN_RETURN_IF_ERROR(finish_gather(*l, sig, maps));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

class TileCuda : public Tactic {
 public:
  std::string name() const override { return "tile_cuda"; }
  TacticInfo info() const override { return cuda_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Tile"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (!sig.has_input(0) || !movable_size(sig.inputs[0].dtype)) return "no input, or elements that cannot be moved";
    if (sig.node->opset < 6) return "Tile before opset 6";
    std::vector<int64_t> rep;
    if (!const_ints(sig, 1, &rep)) return "repeats are not a constant";
    return ranks_fit(sig);
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    std::vector<int64_t> rep;
    if (!const_ints(sig, 1, &rep)) return Unsupported("repeats are not a constant");
    const Dims& x = sig.inputs[0].shape;
    if (rep.size() != x.size()) return InvalidArgument("repeats ", dims_str(rep), " for input ", dims_str(x));
    auto l = std::make_unique<PreparedAxisGather>();
    l->dtype = sig.inputs[0].dtype, l->kernel = "tile_cuda";
    std::vector<std::vector<int64_t>> maps;
    for (size_t k = 0; k < x.size(); ++k) {
      if (rep[k] < 0) return InvalidArgument("negative repeat ", rep[k]);
      std::vector<int64_t> m(static_cast<size_t>(x[k] * rep[k]));
      for (size_t o = 0; o < m.size(); ++o) m[o] = static_cast<int64_t>(o) % x[k];
      l->shape.push_back(static_cast<int64_t>(m.size()));
      maps.push_back(std::move(m));
    }
    KILN_RETURN_IF_ERROR(finish_gather(*l, sig, maps));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

// ---------------------------------------------------------------- Resize

class PreparedWeightedResize : public PreparedLayer {
 public:
  Dims shape;
  WeightedResize p;
  Tensor index, weight, extrapolate;  // device tables
  std::vector<Dims> output_shapes() const override { return {shape}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return cuda_status(launch_weighted_resize(
                           in[0]->data<float>(), out[0]->data<float>(), index.data<int64_t>(), weight.data<float>(),
                           static_cast<const unsigned char*>(extrapolate.raw()), dims_numel(shape), p, stream_of(ctx)),
                       "resize_cuda");
  }
};

class ResizeCuda : public Tactic {
 public:
  std::string name() const override { return "resize_cuda"; }
  TacticInfo info() const override { return cuda_f32(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Resize"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (!sig.has_input(0)) return "no X";
    if (sig.inputs[0].dtype != DataType::kFloat32) return "X is not float32";
    for (size_t i = 1; i < sig.inputs.size(); ++i)
      if (sig.has_input(i) && !sig.inputs[i].constant) return "roi/scales/sizes are not constants";
    return ranks_fit(sig);
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (std::string why = why_unsupported(sig); !why.empty()) return Unsupported(why);
    const Dims& x = sig.inputs[0].shape;
    auto input = [&](size_t i) -> const Tensor* {
      return i < sig.inputs.size() && sig.inputs[i].present ? sig.inputs[i].constant : nullptr;
    };
    KILN_ASSIGN_OR_RETURN(ops::ResizeGeometry g, ops::resize_geometry(*sig.node, x, input));
    const int dev = sig.device.index;
    if (g.nearest) {
      auto l = std::make_unique<PreparedAxisGather>();
      l->dtype = DataType::kFloat32, l->kernel = "resize_cuda";
      l->shape = g.out_shape;
      std::vector<std::vector<int64_t>> maps;
      for (size_t k = 0; k < x.size(); ++k) {
        const ops::ResizeAxis& a = g.axes[k];
        std::vector<int64_t> m(static_cast<size_t>(g.out_shape[k]));
        for (size_t o = 0; o < m.size(); ++o) {
          bool outside = o < a.extrapolate.size() && a.extrapolate[o];
          m[o] = outside ? -1 : (a.n >= 1 && o * a.n < a.index.size() ? a.index[o * a.n] : static_cast<int64_t>(o));
        }
        maps.push_back(std::move(m));
      }
      float e = static_cast<float>(g.extrapolation);
      std::memcpy(&l->p.fill, &e, sizeof e);
      if (dims_numel(l->shape) > 0) KILN_RETURN_IF_ERROR(finish_gather(*l, sig, maps));
      return std::unique_ptr<PreparedLayer>(std::move(l));
    }
    auto l = std::make_unique<PreparedWeightedResize>();
    l->shape = g.out_shape;
    Dims in_strides = ops::strides_of(x);
    std::vector<int64_t> index;
    std::vector<float> weight;
    std::vector<unsigned char> extrapolate;
    l->p.rank = static_cast<int>(x.size());
    l->p.extrapolation = static_cast<float>(g.extrapolation);
    for (size_t k = 0; k < x.size(); ++k) {
      const ops::ResizeAxis& a = g.axes[k];
      const int64_t out = g.out_shape[k];
      const bool plain = a.identity || a.n == 0;
      l->p.dims[k] = out, l->p.in_strides[k] = in_strides[k];
      l->p.taps[k] = plain ? 1 : a.n;
      l->p.tap_offsets[k] = static_cast<int64_t>(index.size());
      l->p.coord_offsets[k] = static_cast<int64_t>(extrapolate.size());
      for (int64_t o = 0; o < out; ++o) {
        if (plain) {
          index.push_back(o), weight.push_back(1.f);
        } else {
          for (int64_t t = 0; t < a.n; ++t) {
            size_t e = static_cast<size_t>(o * a.n + t);
            index.push_back(a.index[e]), weight.push_back(static_cast<float>(a.weight[e]));
          }
        }
        bool outside = static_cast<size_t>(o) < a.extrapolate.size() && a.extrapolate[static_cast<size_t>(o)];
        extrapolate.push_back(outside ? 1 : 0);
        l->p.any_extrapolate |= outside;
      }
    }
    if (dims_numel(l->shape) > 0) {
      KILN_ASSIGN_OR_RETURN(l->index, device_table(index, DataType::kInt64, dev));
      KILN_ASSIGN_OR_RETURN(l->weight, device_table(weight, DataType::kFloat32, dev));
      KILN_ASSIGN_OR_RETURN(l->extrapolate, device_table(extrapolate, DataType::kUInt8, dev));
    }
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

// ---------------------------------------------------------------- Reduce*

class PreparedReduce : public PreparedLayer {
 public:
  Dims shape;
  int64_t outer = 1, r = 1, inner = 1;
  ReduceOp op = ReduceOp::kSum;
  std::vector<Dims> output_shapes() const override { return {shape}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return cuda_status(launch_reduce(in[0]->data<float>(), out[0]->data<float>(), outer, r, inner, op, stream_of(ctx)),
                       "reduce_cuda");
  }
};

class ReduceCuda : public Tactic {
 public:
  std::string name() const override { return "reduce_cuda"; }
  TacticInfo info() const override { return cuda_f32(); }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    std::vector<std::pair<std::string, std::string>> v;
    for (const auto& [name, op] : kOps) v.emplace_back("", name);
    return v;
  }
  // The reduced dims' mask, or why not (axes not constant, noop).
  static std::string mask_of(const LayerSignature& sig, std::vector<bool>* mask) {
    const ir::Node& n = *sig.node;
    const int64_t rank = static_cast<int64_t>(sig.inputs[0].shape.size());
    std::vector<int64_t> axes;
    bool noop = false;
    if (n.opset < (n.op_type == "ReduceSum" ? 13 : 18)) {
      axes = n.attr_ints("axes");
    } else {
      if (sig.has_input(1) && !const_ints(sig, 1, &axes)) return "axes are not a constant";
      noop = axes.empty() && n.attr_int("noop_with_empty_axes", 0) != 0;
    }
    if (noop) return "noop_with_empty_axes with no axes (an identity)";
    mask->assign(static_cast<size_t>(rank), axes.empty());
    for (int64_t a : axes) {
      if (a < 0) a += rank;
      if (a < 0 || a >= rank) return "axis out of range";
      (*mask)[static_cast<size_t>(a)] = true;
    }
    return "";
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (!sig.has_input(0)) return "no input";
    if (sig.inputs[0].dtype != DataType::kFloat32) return "input is not float32";
    std::vector<bool> mask;
    if (std::string why = mask_of(sig, &mask); !why.empty()) return why;
    if (!sig.inputs[0].known()) return "";
    const Dims& x = sig.inputs[0].shape;
    // The reduced dims (other than those of extent 1) must be one contiguous run.
    int runs = 0;
    bool in_run = false;
    for (size_t k = 0; k < x.size(); ++k) {
      if (x[k] == 1) continue;
      if (x[k] == 0) return "an empty dim";
      if (mask[k] && !in_run) ++runs;
      in_run = mask[k];
    }
    if (runs > 1) return "the reduced axes are not contiguous";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (std::string why = why_unsupported(sig); !why.empty()) return Unsupported(why);
    std::vector<bool> mask;
    mask_of(sig, &mask);
    const Dims& x = sig.inputs[0].shape;
    const bool keep = sig.node->attr_int("keepdims", 1) != 0;
    auto l = std::make_unique<PreparedReduce>();
    l->op = op_of(sig.op());
    bool seen = false;
    l->outer = l->r = l->inner = 1;
    for (size_t k = 0; k < x.size(); ++k) {
      if (mask[k]) {
        l->r *= x[k];
        seen |= x[k] != 1;
        if (keep) l->shape.push_back(1);
      } else {
        (seen ? l->inner : l->outer) *= x[k];
        l->shape.push_back(x[k]);
      }
    }
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }

 private:
  static constexpr std::pair<const char*, ReduceOp> kOps[] = {
      {"ReduceSum", ReduceOp::kSum},       {"ReduceMean", ReduceOp::kMean},
      {"ReduceMax", ReduceOp::kMax},       {"ReduceMin", ReduceOp::kMin},
      {"ReduceProd", ReduceOp::kProd},     {"ReduceSumSquare", ReduceOp::kSumSquare},
      {"ReduceL1", ReduceOp::kL1},         {"ReduceL2", ReduceOp::kL2},
      {"ReduceLogSum", ReduceOp::kLogSum}, {"ReduceLogSumExp", ReduceOp::kLogSumExp}};
  static ReduceOp op_of(const std::string& name) {
    for (const auto& [n, op] : kOps)
      if (name == n) return op;
    return ReduceOp::kSum;
  }
};

}  // namespace

std::vector<const Tactic*> more_kernel_tactics() {
  static const WhereCuda where;
  static const CompareCuda compare;
  static const PadCuda pad;
  static const TileCuda tile;
  static const ResizeCuda resize;
  static const ReduceCuda reduce;
  static const IntArithCuda int_arith;
  return {&where, &compare, &pad, &tile, &resize, &reduce, &int_arith};
}

}  // namespace kiln::backends::cuda
