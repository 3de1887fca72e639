// kiln's own CUDA tactics for the CNN layers besides the convolution: MaxPool / AveragePool (one
// thread per output over a window resolved by ops::resolve_window, so ceil_mode, auto_pad, asymmetric
// pads, dilations and count_include_pad follow the reference), GlobalAveragePool / GlobalMaxPool and
// ReduceMean / ReduceMax over trailing axes (one warp per plane), with float32, float16 and bfloat16
// data accumulated in float32; and Split (ShuffleNet's channel split: one strided copy per output,
// elements of any size).
#include "backends/cuda/cuda_cnn_kernels.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cudnn_tactics.h"
#include "core/shape.h"
#include "ops/common.h"
#include "ops/conv_util.h"
#include "ops/movement_geometry.h"

namespace kiln::backends::cuda {
namespace {

bool cnn_dtype(DataType t, CnnDtype* c) {
  switch (t) {
    case DataType::kFloat32: *c = CnnDtype::kFloat32; return true;
    case DataType::kFloat16: *c = CnnDtype::kFloat16; return true;
    case DataType::kBFloat16: *c = CnnDtype::kBFloat16; return true;
    default: return false;
  }
}

TacticInfo cuda_float_data() {
  return {DeviceKind::kCUDA,
          kIsaPortable,
          DataType::kUndefined,
          {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16},
          {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16},
          /*any_float_compute=*/true};
}

// Float data computed in a float precision (float32 accumulation serves all three).
std::string float_data(const LayerSignature& sig) {
  CnnDtype c;
  if (!sig.has_input(0)) return "no input";
  if (!cnn_dtype(sig.inputs[0].dtype, &c)) return std::string("X is ") + dtype_name(sig.inputs[0].dtype);
  if (!cnn_dtype(sig.compute, &c)) return std::string("computes in ") + dtype_name(sig.compute);
  if (sig.inputs[0].dtype == DataType::kFloat32 && sig.compute != DataType::kFloat32)
    return "float32 data computed in " + std::string(dtype_name(sig.compute));
  if (!sig.outputs.empty() && sig.outputs[0].dtype != DataType::kUndefined &&
      sig.outputs[0].dtype != sig.inputs[0].dtype)
    return "Y's dtype differs from X's";
  return "";
}

// ---------------------------------------------------------------- windowed pooling

class PreparedPool : public PreparedLayer {
 public:
  Dims shape;
  DataType dtype = DataType::kFloat32;
  CnnDtype cnn = CnnDtype::kFloat32;
  PoolWindow w;
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return cuda_status(launch_pool(in[0]->raw(), out[0]->raw(), cnn, w, stream_of(ctx)), "pool_cuda");
  }
};

class PoolCuda : public Tactic {
 public:
  std::string name() const override { return "pool_cuda"; }
  TacticInfo info() const override { return cuda_float_data(); }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "MaxPool"}, {"", "AveragePool"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = float_data(sig); !e.empty()) return e;
    if (sig.node->outputs.size() > 1 && sig.node->has_output(1)) return "MaxPool's Indices output is asked for";
    size_t rank = sig.inputs[0].shape.size();
    if (rank < 3 || rank > 5) return "not 1 to 3 spatial dims";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    const Dims& x = sig.inputs[0].shape;
    KILN_ASSIGN_OR_RETURN(ops::WindowGeometry g, ops::resolve_window(*sig.node, x, nullptr));
    auto l = std::make_unique<PreparedPool>();
    l->dtype = sig.inputs[0].dtype;
    cnn_dtype(l->dtype, &l->cnn);
    l->shape = {x[0], x[1]};
    l->shape.insert(l->shape.end(), g.out.begin(), g.out.end());
    PoolWindow& w = l->w;
    w.planes = x[0] * x[1];
    w.max = sig.op() == "MaxPool";
    w.include_pad = sig.node->attr_int("count_include_pad", 0) != 0;
    const size_t off = 3 - g.rank();  // leading unit dims
    for (size_t d = 0; d < g.rank(); ++d) {
      w.in[off + d] = g.in[d], w.out[off + d] = g.out[d], w.kernel[off + d] = g.kernel[d];
      w.stride[off + d] = g.strides[d], w.dilation[off + d] = g.dilations[d];
      w.pad_begin[off + d] = g.pad_begin[d], w.pad_end[off + d] = g.pad_end[d];
    }
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

// ---------------------------------------------------------------- channels-last pooling (kiln.NhwcPool)

class PreparedPoolNhwc : public PreparedPool {
 public:
  int64_t channels = 0;
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return cuda_status(launch_pool_nhwc(in[0]->raw(), out[0]->raw(), cnn, w, channels, stream_of(ctx)),
                       "pool_nhwc_cuda");
  }
};

// kiln.NhwcPool of MaxPool / AveragePool (the window pool_cuda resolves, the pool's own options) or
// GlobalAveragePool / GlobalMaxPool (a window of the whole plane) over [N, H, W, C].
class PoolNhwcCuda : public Tactic {
 public:
  std::string name() const override { return "pool_nhwc_cuda"; }
  int revision() const override { return 2; }  // 2: 32-bit indices, channel packs, a global-pool kernel
  TacticInfo info() const override { return cuda_float_data(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "NhwcPool"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = float_data(sig); !e.empty()) return e;
    const std::string pool = sig.node->attr_string("pool", "");
    if (pool != "MaxPool" && pool != "AveragePool" && pool != "GlobalAveragePool" && pool != "GlobalMaxPool")
      return "pool '" + pool + "' has no kernel";
    if (sig.inputs[0].shape.size() != 4) return "X is not 4-D channels-last";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    const Dims& xg = sig.inputs[0].shape;  // [N, H, W, C]
    const Dims x = {xg[0], xg[3], xg[1], xg[2]};
    const std::string pool = sig.node->attr_string("pool", "");
    auto l = std::make_unique<PreparedPoolNhwc>();
    l->dtype = sig.inputs[0].dtype;
    cnn_dtype(l->dtype, &l->cnn);
    l->channels = x[1];
    PoolWindow& w = l->w;
    w.planes = x[0];
    w.max = pool == "MaxPool" || pool == "GlobalMaxPool";
    if (pool == "GlobalAveragePool" || pool == "GlobalMaxPool") {
      w.in[1] = w.kernel[1] = x[2], w.in[2] = w.kernel[2] = x[3];
      w.nan_wins = w.max;
      l->shape = {x[0], 1, 1, x[1]};
    } else {
      const int opset = static_cast<int>(sig.node->attr_int("pool_opset", 12));
      KILN_ASSIGN_OR_RETURN(ops::WindowGeometry g,
                            ops::resolve_window(*sig.node, x, nullptr, ops::window_options(pool, opset)));
      if (g.rank() != 2) return Unsupported("not 2 spatial dims");
      w.include_pad = sig.node->attr_int("count_include_pad", 0) != 0;
      for (size_t d = 0; d < 2; ++d) {
        w.in[1 + d] = g.in[d], w.out[1 + d] = g.out[d], w.kernel[1 + d] = g.kernel[d];
        w.stride[1 + d] = g.strides[d], w.dilation[1 + d] = g.dilations[d];
        w.pad_begin[1 + d] = g.pad_begin[d], w.pad_end[1 + d] = g.pad_end[d];
      }
      l->shape = {x[0], g.out[0], g.out[1], x[1]};
    }
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

// ---------------------------------------------------------------- global pooling, trailing reductions

class PreparedGlobalPool : public PreparedLayer {
 public:
  Dims shape;
  DataType dtype = DataType::kFloat32;
  CnnDtype cnn = CnnDtype::kFloat32;
  int64_t planes = 0, inner = 0;
  bool max = false;
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return cuda_status(launch_global_pool(in[0]->raw(), out[0]->raw(), cnn, planes, inner, max, stream_of(ctx)),
                       "global_pool_cuda");
  }
};

class GlobalPoolCuda : public Tactic {
 public:
  std::string name() const override { return "global_pool_cuda"; }
  TacticInfo info() const override { return cuda_float_data(); }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "GlobalAveragePool"}, {"", "GlobalMaxPool"}, {"", "ReduceMean"}, {"", "ReduceMax"}};
  }
  // The first reduced axis (the reduced axes are it and every one after it), or why not.
  static std::string first_axis(const LayerSignature& sig, int64_t* first) {
    const int64_t rank = static_cast<int64_t>(sig.inputs[0].shape.size());
    if (sig.op() == "GlobalAveragePool" || sig.op() == "GlobalMaxPool") {
      if (rank < 3) return "rank below 3";
      *first = 2;
      return "";
    }
    const ir::Node& n = *sig.node;
    std::vector<int64_t> axes;
    if (n.opset >= 18) {
      if (sig.has_input(1)) {
        const Tensor* c = sig.inputs[1].constant;
        if (!c) return "axes are not a constant";
        for (int64_t k = 0; k < c->numel(); ++k) axes.push_back(c->get_i64(k));
      }
    } else {
      axes = n.attr_ints("axes");
    }
    if (axes.empty()) {
      if (n.attr_int("noop_with_empty_axes", 0)) return "noop_with_empty_axes";
      *first = 0;
      return "";
    }
    std::vector<bool> reduced(static_cast<size_t>(rank), false);
    for (int64_t a : axes) {
      if (a < 0) a += rank;
      if (a < 0 || a >= rank) return "an axis out of range";
      reduced[static_cast<size_t>(a)] = true;
    }
    int64_t f = rank;
    while (f > 0 && reduced[static_cast<size_t>(f - 1)]) --f;
    for (int64_t a = 0; a < f; ++a)
      if (reduced[static_cast<size_t>(a)]) return "the reduced axes are not the trailing ones";
    *first = f;
    return "";
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = float_data(sig); !e.empty()) return e;
    int64_t first;
    return first_axis(sig, &first);
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    int64_t first = 0;
    if (std::string why = first_axis(sig, &first); !why.empty()) return Unsupported(why);
    const Dims& x = sig.inputs[0].shape;
    auto l = std::make_unique<PreparedGlobalPool>();
    l->dtype = sig.inputs[0].dtype;
    cnn_dtype(l->dtype, &l->cnn);
    l->max = sig.op() == "GlobalMaxPool" || sig.op() == "ReduceMax";
    const bool global = sig.op().rfind("Global", 0) == 0;
    const bool keep = global || sig.node->attr_int("keepdims", 1) != 0;
    l->planes = dims_numel(Dims(x.begin(), x.begin() + first));
    l->inner = dims_numel(Dims(x.begin() + first, x.end()));
    if (l->inner == 0) return Unsupported("an empty reduction");
    l->shape.assign(x.begin(), x.begin() + first);
    if (keep) l->shape.resize(x.size(), 1);
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

// ---------------------------------------------------------------- split

class PreparedSplit : public PreparedLayer {
 public:
  std::vector<Dims> shapes;
  DataType dtype = DataType::kFloat32;
  std::vector<StridedCopy> copies;  // one per output
  std::vector<Dims> output_shapes() const override { return shapes; }
  std::vector<DataType> output_dtypes() const override { return std::vector<DataType>(shapes.size(), dtype); }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    for (size_t o = 0; o < copies.size(); ++o) {
      if (!out[o] || dims_numel(shapes[o]) == 0) continue;  // an output nothing reads
      KILN_RETURN_IF_ERROR(
          cuda_status(launch_strided_copy(in[0]->raw(), out[o]->raw(), static_cast<int64_t>(dtype_size(dtype)),
                                          copies[o], stream_of(ctx)),
                      "split_cuda"));
    }
    return Status::Ok();
  }
};

class SplitCuda : public Tactic {
 public:
  std::string name() const override { return "split_cuda"; }
  TacticInfo info() const override { return {DeviceKind::kCUDA, kIsaPortable, DataType::kUndefined, {}, {}}; }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Split"}}; }
  // The output sizes along the axis (axis resolved), or why not.
  static std::string sizes(const LayerSignature& sig, int64_t* axis, std::vector<int64_t>* out) {
    const ir::Node& n = *sig.node;
    const int64_t r = static_cast<int64_t>(sig.inputs[0].shape.size());
    if (r == 0 || r > kMaxRank) return "rank 0 or above " + std::to_string(kMaxRank);
    *axis = n.attr_int("axis", 0);
    if (*axis < -r || *axis >= r) return "axis out of range";
    if (*axis < 0) *axis += r;
    bool has_split = false;
    std::vector<int64_t> split;
    int64_t num_outputs = n.opset >= 18 && n.attr("num_outputs") ? n.attr_int("num_outputs", -1) : -1;
    if ((n.opset >= 2 && n.opset < 13) || (n.opset < 2 && n.attr("split"))) {
      has_split = n.attr("split") != nullptr, split = n.attr_ints("split");
    } else if (sig.has_input(1)) {
      const Tensor* c = sig.inputs[1].constant;
      if (!c) return "split is not a constant";
      for (int64_t k = 0; k < c->numel(); ++k) split.push_back(c->get_i64(k));
      has_split = true;
    }
    auto s = ops::split_sizes(has_split, split, num_outputs, static_cast<int64_t>(n.outputs.size()),
                              sig.inputs[0].shape[static_cast<size_t>(*axis)]);
    if (!s.ok()) return s.status().message();
    *out = *s;
    return "";
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (!sig.has_input(0)) return "no input";
    DataType t = sig.inputs[0].dtype;
    size_t e = t == DataType::kString ? 0 : dtype_size(t);
    if (e != 1 && e != 2 && e != 4 && e != 8) return std::string("elements of ") + dtype_name(t) + " cannot be moved";
    if (!sig.inputs[0].known()) return "";
    int64_t axis;
    std::vector<int64_t> s;
    return sizes(sig, &axis, &s);
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    int64_t axis = 0;
    std::vector<int64_t> lens;
    if (std::string why = sizes(sig, &axis, &lens); !why.empty()) return Unsupported(why);
    const Dims& x = sig.inputs[0].shape;
    const Dims xs = ops::strides_of(x);
    auto l = std::make_unique<PreparedSplit>();
    l->dtype = sig.inputs[0].dtype;
    int64_t begin = 0;
    for (int64_t len : lens) {
      Dims o = x;
      o[static_cast<size_t>(axis)] = len;
      Dims os = ops::strides_of(o);
      StridedCopy c;
      c.rank = static_cast<int>(x.size());
      for (size_t k = 0; k < x.size(); ++k) c.dims[k] = o[k], c.in_strides[k] = xs[k], c.out_strides[k] = os[k];
      c.in_offset = begin * xs[static_cast<size_t>(axis)];
      begin += len;
      l->shapes.push_back(o);
      l->copies.push_back(c);
    }
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

}  // namespace

std::vector<const Tactic*> cnn_kernel_tactics() {
  static const PoolCuda pool;
  static const PoolNhwcCuda pool_nhwc;
  static const GlobalPoolCuda global_pool;
  static const SplitCuda split;
  return {&pool, &pool_nhwc, &global_pool, &split};
}

}  // namespace kiln::backends::cuda
