// kiln's own CUDA tactics: elementwise (unary, binary with broadcasting, kiln.FusedElementwise as one
// kernel interpreting the fused tree), Softmax/LogSoftmax,
// LayerNormalization, Cast, and data movement (Transpose, Slice, Concat, Expand, Gather). Each computes its
// kernel's parameters once at prepare time and launches on the run's stream; constant inputs are
// copied to the device then (DeviceConstants).
//
// The float tactics come once per storage dtype (float32, float16, bfloat16: "elementwise_unary_cuda",
// "elementwise_unary_f16_cuda", "elementwise_unary_bf16_cuda"), following tactic.h's dtype contract:
// every float input and the output in the tactic's dtype (the builder's storage dtypes,
// engine/storage_dtypes.h), arithmetic in float32. The movement tactics take any dtype.
#include <algorithm>
#include <cmath>
#include <map>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_fused_elementwise.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_tactics.h"
#include "core/shape.h"
#include "ops/common.h"
#include "ops/movement_geometry.h"

namespace kiln::backends::cuda {

namespace {

// Why the first `count` inputs are not all of dtype `dt` ("" when they are).
std::string float_inputs(const LayerSignature& sig, size_t count, DataType dt) {
  for (size_t i = 0; i < sig.inputs.size() && i < count; ++i)
    if (sig.inputs[i].present && sig.inputs[i].dtype != dt)
      return "input " + std::to_string(i) + " is " + dtype_name(sig.inputs[i].dtype) + ", not " + dtype_name(dt);
  return "";
}

FloatType float_type(DataType dt) {
  return dt == DataType::kFloat16 ? FloatType::kF16 : dt == DataType::kBFloat16 ? FloatType::kBF16 : FloatType::kF32;
}

// "elementwise_unary_cuda" for float32 (the name engines built before FP16 store), else with the
// dtype before "_cuda": "elementwise_unary_f16_cuda", "elementwise_unary_bf16_cuda".
std::string dtype_name_of(const char* base, DataType dt) {
  std::string b = base;
  if (dt == DataType::kFloat32) return b + "_cuda";
  return b + (dt == DataType::kFloat16 ? "_f16" : "_bf16") + "_cuda";
}

bool broadcast(const Dims& a, const Dims& b, Dims* out) {
  size_t r = std::max(a.size(), b.size());
  Dims o(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t x = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t y = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (x != y && x != 1 && y != 1) return false;
    o[i] = x == 1 ? y : x;
  }
  *out = std::move(o);
  return true;
}

// Strides of `in` (right-aligned) over the broadcast output dims `out`: 0 along broadcast dims.
void broadcast_strides(const Dims& in, const Dims& out, int64_t* strides) {
  Dims s = ops::strides_of(in);
  size_t off = out.size() - in.size();
  for (size_t k = 0; k < out.size(); ++k) strides[k] = k < off || in[k - off] == 1 ? 0 : s[k - off];
}

Status launched(cudaError_t e, const char* kernel) { return cuda_status(e, kernel); }

TacticInfo cuda_float(DataType dt) { return {DeviceKind::kCUDA, kIsaPortable, dt, {dt}, {}}; }
TacticInfo cuda_any_dtype() { return {DeviceKind::kCUDA, kIsaPortable, DataType::kUndefined, {}, {}}; }

// ---------------------------------------------------------------- unary

class PreparedUnary : public PreparedLayer {
 public:
  Dims shape;
  UnaryParams p;
  DataType dtype = DataType::kFloat32;
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return launched(launch_unary(in[0]->raw(), out[0]->raw(), dims_numel(shape), p, float_type(dtype), stream_of(ctx)),
                    "elementwise_unary_cuda");
  }
};

// The kernel's op for a node; false when it has none (or a parameter is not a constant).
bool unary_params(const LayerSignature& sig, UnaryParams* p, std::string* why) {
  const ir::Node& n = *sig.node;
  const std::string& op = n.op_type;
  static const std::pair<const char*, UnaryOp> kPlain[] = {
      {"Relu", UnaryOp::kRelu},         {"Sigmoid", UnaryOp::kSigmoid},
      {"Tanh", UnaryOp::kTanh},         {"Exp", UnaryOp::kExp},
      {"Log", UnaryOp::kLog},           {"Sqrt", UnaryOp::kSqrt},
      {"Neg", UnaryOp::kNeg},           {"Abs", UnaryOp::kAbs},
      {"Erf", UnaryOp::kErf},           {"Floor", UnaryOp::kFloor},
      {"Ceil", UnaryOp::kCeil},         {"Reciprocal", UnaryOp::kReciprocal},
      {"Softplus", UnaryOp::kSoftplus}, {"HardSwish", UnaryOp::kHardSwish}};
  for (const auto& [name, u] : kPlain)
    if (op == name) {
      p->op = u;
      return true;
    }
  if (op == "Gelu") {
    p->op = n.attr_string("approximate", "none") == "tanh" ? UnaryOp::kGeluTanh : UnaryOp::kGelu;
    return true;
  }
  if (op == "LeakyRelu") {
    p->op = UnaryOp::kLeakyRelu, p->alpha = n.attr_float("alpha", 0.01f);
    return true;
  }
  if (op == "Elu") {
    p->op = UnaryOp::kElu, p->alpha = n.attr_float("alpha", 1.f);
    return true;
  }
  if (op == "HardSigmoid") {
    p->op = UnaryOp::kHardSigmoid, p->alpha = n.attr_float("alpha", 0.2f), p->beta = n.attr_float("beta", 0.5f);
    return true;
  }
  if (op == "Clip") {
    p->op = UnaryOp::kClip, p->alpha = -INFINITY, p->beta = INFINITY;
    if (n.opset < 11) {
      p->alpha = n.attr_float("min", -INFINITY), p->beta = n.attr_float("max", INFINITY);
      return true;
    }
    for (size_t i = 1; i <= 2; ++i) {
      if (!sig.has_input(i)) continue;
      const Tensor* c = sig.inputs[i].constant;
      if (!c || c->numel() != 1 || !dtype_is_float(c->dtype())) {
        *why = "Clip's min/max is not a float constant";
        return false;
      }
      (i == 1 ? p->alpha : p->beta) = static_cast<float>(c->get_f64(0));
    }
    return true;
  }
  *why = "no CUDA kernel for " + op;
  return false;
}

class UnaryCuda : public Tactic {
 public:
  explicit UnaryCuda(DataType dt) : dt_(dt) {}
  std::string name() const override { return dtype_name_of("elementwise_unary", dt_); }
  TacticInfo info() const override { return cuda_float(dt_); }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    std::vector<std::pair<std::string, std::string>> v;
    for (const char* op : {"Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Neg", "Abs", "Erf", "Floor", "Ceil",
                           "Reciprocal", "Softplus", "HardSwish", "Gelu", "LeakyRelu", "Elu", "HardSigmoid", "Clip"})
      v.emplace_back("", op);
    v.emplace_back("kiln", "Gelu");
    return v;
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (!sig.has_input(0)) return "no input";
    if (auto e = float_inputs(sig, 1, dt_); !e.empty()) return e;
    UnaryParams p;
    std::string why;
    return unary_params(sig, &p, &why) ? "" : why;
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    auto l = std::make_unique<PreparedUnary>();
    std::string why;
    if (!unary_params(sig, &l->p, &why)) return Unsupported(why);
    l->shape = sig.inputs[0].shape;
    l->dtype = dt_;
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }

 private:
  DataType dt_;
};

// ---------------------------------------------------------------- binary

class PreparedBinary : public PreparedLayer {
 public:
  Dims shape;
  BinaryOp op = BinaryOp::kAdd;
  BroadcastParams p;
  DataType dtype = DataType::kFloat32;
  DeviceConstants consts;
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return launched(launch_binary(consts.data(0, in), consts.data(1, in), out[0]->raw(), dims_numel(shape), op, p,
                                  float_type(dtype), stream_of(ctx)),
                    "elementwise_binary_cuda");
  }
};

class BinaryCuda : public Tactic {
 public:
  explicit BinaryCuda(DataType dt) : dt_(dt) {}
  std::string name() const override { return dtype_name_of("elementwise_binary", dt_); }
  TacticInfo info() const override { return cuda_float(dt_); }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "Add"}, {"", "Sub"}, {"", "Mul"}, {"", "Div"}, {"", "Pow"}, {"", "Max"}, {"", "Min"}, {"", "PRelu"}};
  }
  static BinaryOp op_of(const std::string& op) {
    if (op == "Sub") return BinaryOp::kSub;
    if (op == "Mul") return BinaryOp::kMul;
    if (op == "Div") return BinaryOp::kDiv;
    if (op == "Pow") return BinaryOp::kPow;
    if (op == "Max") return BinaryOp::kMax;
    if (op == "Min") return BinaryOp::kMin;
    if (op == "PRelu") return BinaryOp::kPRelu;
    return BinaryOp::kAdd;
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.inputs.size() != 2 || !sig.has_input(0) || !sig.has_input(1)) return "needs exactly two inputs";
    if (auto e = float_inputs(sig, 2, dt_); !e.empty()) return e;
    if (sig.inputs[0].shape.size() > kMaxRank || sig.inputs[1].shape.size() > kMaxRank)
      return "rank above " + std::to_string(kMaxRank);
    if (sig.fully_known()) {
      Dims o;
      if (!broadcast(sig.inputs[0].shape, sig.inputs[1].shape, &o)) return "shapes do not broadcast";
      if (sig.op() == "PRelu" && o != sig.inputs[0].shape) return "PRelu's slope broadcasts X";
    }
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    auto l = std::make_unique<PreparedBinary>();
    const Dims &a = sig.inputs[0].shape, &b = sig.inputs[1].shape;
    if (!broadcast(a, b, &l->shape))
      return InvalidArgument("shapes ", dims_str(a), " and ", dims_str(b), " do not broadcast");
    l->op = op_of(sig.op());
    l->p.rank = static_cast<int>(l->shape.size());
    for (size_t k = 0; k < l->shape.size(); ++k) l->p.dims[k] = l->shape[k];
    broadcast_strides(a, l->shape, l->p.a_strides);
    broadcast_strides(b, l->shape, l->p.b_strides);
    l->p.same_shape = a == l->shape && b == l->shape;
    l->dtype = dt_;
    KILN_RETURN_IF_ERROR(l->consts.upload(sig));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }

 private:
  DataType dt_;
};

// ---------------------------------------------------------------- cast

bool cast_type(DataType t, CastType* c) {
  switch (t) {
    case DataType::kFloat32: *c = CastType::kFloat32; return true;
    case DataType::kInt32: *c = CastType::kInt32; return true;
    case DataType::kInt64: *c = CastType::kInt64; return true;
    case DataType::kBool: *c = CastType::kBool; return true;
    case DataType::kFloat16: *c = CastType::kFloat16; return true;
    case DataType::kBFloat16: *c = CastType::kBFloat16; return true;
    default: return false;
  }
}

class PreparedCast : public PreparedLayer {
 public:
  Dims shape;
  DataType to_dtype = DataType::kFloat32;
  CastType from = CastType::kFloat32, to = CastType::kFloat32;
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {to_dtype}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return launched(launch_cast(in[0]->raw(), from, out[0]->raw(), to, dims_numel(shape), stream_of(ctx)), "cast_cuda");
  }
};

class CastCuda : public Tactic {
 public:
  std::string name() const override { return "cast_cuda"; }
  TacticInfo info() const override { return cuda_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Cast"}}; }
  static DataType target(const LayerSignature& sig) {
    return static_cast<DataType>(sig.node->attr_int("to", static_cast<int64_t>(DataType::kUndefined)));
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    CastType c;
    if (!sig.has_input(0) || !cast_type(sig.inputs[0].dtype, &c) || !cast_type(target(sig), &c))
      return "casts other than between float32, float16, bfloat16, int32, int64 and bool";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    auto l = std::make_unique<PreparedCast>();
    l->shape = sig.inputs[0].shape;
    l->to_dtype = target(sig);
    if (!cast_type(sig.inputs[0].dtype, &l->from) || !cast_type(l->to_dtype, &l->to))
      return Unsupported("casts other than between float32, float16, bfloat16, int32, int64 and bool");
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

// ---------------------------------------------------------------- softmax

class PreparedSoftmax : public PreparedLayer {
 public:
  Dims shape;
  int64_t outer = 1, axis = 1, inner = 1;
  bool log = false;
  DataType dtype = DataType::kFloat32;
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return launched(
        launch_softmax(in[0]->raw(), out[0]->raw(), outer, axis, inner, log, float_type(dtype), stream_of(ctx)),
        "softmax_cuda");
  }
};

class SoftmaxCuda : public Tactic {
 public:
  explicit SoftmaxCuda(DataType dt) : dt_(dt) {}
  std::string name() const override { return dtype_name_of("softmax", dt_); }
  TacticInfo info() const override { return cuda_float(dt_); }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "Softmax"}, {"", "LogSoftmax"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (!sig.has_input(0)) return "no input";
    if (auto e = float_inputs(sig, 1, dt_); !e.empty()) return e;
    int64_t rank = static_cast<int64_t>(sig.inputs[0].shape.size());
    int64_t axis = sig.node->attr_int("axis", sig.node->opset >= 13 ? -1 : 1);
    if (axis < 0) axis += rank;
    if (rank == 0 || axis < 0 || axis >= rank) return "axis out of range";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    auto l = std::make_unique<PreparedSoftmax>();
    l->shape = sig.inputs[0].shape;
    const int64_t rank = static_cast<int64_t>(l->shape.size());
    int64_t axis = sig.node->attr_int("axis", sig.node->opset >= 13 ? -1 : 1);
    if (axis < 0) axis += rank;
    l->log = sig.op() == "LogSoftmax";
    l->dtype = dt_;
    l->outer = l->axis = l->inner = 1;
    for (int64_t k = 0; k < rank; ++k) {
      int64_t d = l->shape[static_cast<size_t>(k)];
      if (k < axis)
        l->outer *= d;
      else if (k == axis || sig.node->opset < 13)  // before opset 13: the trailing dims as one axis
        l->axis *= d;
      else
        l->inner *= d;
    }
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }

 private:
  DataType dt_;
};

// ---------------------------------------------------------------- layer norm

class PreparedLayerNorm : public PreparedLayer {
 public:
  Dims shape;
  int64_t rows = 0, d = 0;
  float epsilon = 1e-5f;
  bool has_scale = false, has_bias = false;
  DataType dtype = DataType::kFloat32;
  DeviceConstants consts;
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    const void* s = has_scale ? consts.data(1, in) : nullptr;
    const void* b = has_bias ? consts.data(2, in) : nullptr;
    return launched(
        launch_layer_norm(in[0]->raw(), s, b, out[0]->raw(), rows, d, epsilon, float_type(dtype), stream_of(ctx)),
        "layer_norm_cuda");
  }
};

class LayerNormCuda : public Tactic {
 public:
  explicit LayerNormCuda(DataType dt) : dt_(dt) {}
  std::string name() const override { return dtype_name_of("layer_norm", dt_); }
  TacticInfo info() const override { return cuda_float(dt_); }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "LayerNormalization"}, {"kiln", "LayerNormalization"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (!sig.has_input(0)) return "no X";
    if (auto e = float_inputs(sig, 3, dt_); !e.empty()) return e;
    const ir::Node& n = *sig.node;
    if (sig.domain().empty() && !sig.has_input(1)) return "no Scale";
    for (size_t o = 1; o < n.outputs.size(); ++o)
      if (n.has_output(o)) return "Mean/InvStdDev outputs are asked for";
    int64_t rank = static_cast<int64_t>(sig.inputs[0].shape.size());
    int64_t axis = n.attr_int("axis", -1);
    if (axis < 0) axis += rank;
    if (rank == 0 || axis < 0 || axis >= rank) return "axis out of range";
    if (!sig.inputs[0].known()) return "";
    int64_t d = dims_numel(Dims(sig.inputs[0].shape.begin() + axis, sig.inputs[0].shape.end()));
    for (size_t i = 1; i <= 2; ++i)
      if (sig.has_input(i) && (!sig.inputs[i].known() || dims_numel(sig.inputs[i].shape) != d))
        return "Scale/B does not have the normalized block's elements";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    auto l = std::make_unique<PreparedLayerNorm>();
    l->shape = sig.inputs[0].shape;
    int64_t rank = static_cast<int64_t>(l->shape.size());
    int64_t axis = sig.node->attr_int("axis", -1);
    if (axis < 0) axis += rank;
    l->d = dims_numel(Dims(l->shape.begin() + axis, l->shape.end()));
    l->rows = dims_numel(Dims(l->shape.begin(), l->shape.begin() + axis));
    l->epsilon = sig.node->attr_float("epsilon", 1e-5f);
    l->has_scale = sig.has_input(1), l->has_bias = sig.has_input(2);
    l->dtype = dt_;
    KILN_RETURN_IF_ERROR(l->consts.upload(sig));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }

 private:
  DataType dt_;
};

// ---------------------------------------------------------------- movement

// One or more strided copies into the output (Transpose, Slice, Expand: one; Concat: one per input).
class PreparedCopies : public PreparedLayer {
 public:
  Dims shape;
  DataType dtype = DataType::kFloat32;
  std::vector<std::pair<size_t, StridedCopy>> copies;  // (input, copy)
  DeviceConstants consts;
  const char* kernel = "";
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    for (const auto& [i, c] : copies)
      KILN_RETURN_IF_ERROR(launched(launch_strided_copy(consts.data(i, in), out[0]->raw(),
                                                        static_cast<int64_t>(dtype_size(dtype)), c, stream_of(ctx)),
                                    kernel));
    return Status::Ok();
  }
};

std::string movable(const LayerSignature& sig) {
  if (!sig.has_input(0)) return "no input";
  DataType t = sig.inputs[0].dtype;
  size_t s = t == DataType::kString ? 0 : dtype_size(t);
  if (s != 1 && s != 2 && s != 4 && s != 8) return std::string("elements of ") + dtype_name(t) + " cannot be moved";
  if (sig.inputs[0].shape.size() > kMaxRank) return "rank above " + std::to_string(kMaxRank);
  return "";
}

// The constant int64 values of input i, or false.
bool const_ints(const LayerSignature& sig, size_t i, std::vector<int64_t>* v) {
  if (!sig.has_input(i) || !sig.inputs[i].constant) return false;
  const Tensor& t = *sig.inputs[i].constant;
  if (t.dtype() != DataType::kInt64 && t.dtype() != DataType::kInt32) return false;
  v->clear();
  for (int64_t k = 0; k < t.numel(); ++k) v->push_back(t.get_i64(k));
  return true;
}

class TransposeCuda : public Tactic {
 public:
  std::string name() const override { return "transpose_cuda"; }
  int revision() const override { return 2; }  // 2: output rows of up to 16 elements without tiles
  TacticInfo info() const override { return cuda_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Transpose"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override { return movable(sig); }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    const Dims& x = sig.inputs[0].shape;
    const int64_t rank = static_cast<int64_t>(x.size());
    std::vector<int64_t> perm = sig.node->attr_ints("perm");
    if (perm.empty())
      for (int64_t k = rank; k-- > 0;) perm.push_back(k);
    if (static_cast<int64_t>(perm.size()) != rank) return InvalidArgument("perm ", dims_str(perm), " for rank ", rank);
    auto l = std::make_unique<PreparedCopies>();
    l->dtype = sig.inputs[0].dtype, l->kernel = "transpose_cuda";
    Dims in_strides = ops::strides_of(x);
    StridedCopy c;
    c.rank = static_cast<int>(rank);
    for (int64_t k = 0; k < rank; ++k) {
      int64_t p = perm[static_cast<size_t>(k)];
      if (p < 0) p += rank;
      if (p < 0 || p >= rank) return InvalidArgument("perm ", dims_str(perm), " out of range");
      l->shape.push_back(x[static_cast<size_t>(p)]);
      c.in_strides[k] = in_strides[static_cast<size_t>(p)];
    }
    Dims out_strides = ops::strides_of(l->shape);
    for (int64_t k = 0; k < rank; ++k) c.dims[k] = l->shape[static_cast<size_t>(k)], c.out_strides[k] = out_strides[k];
    l->copies.emplace_back(0, c);
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

class SliceCuda : public Tactic {
 public:
  std::string name() const override { return "slice_cuda"; }
  TacticInfo info() const override { return cuda_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Slice"}}; }
  static bool params(const LayerSignature& sig, ops::SliceParams* p) {
    if (sig.node->opset < 10) {
      p->starts = sig.node->attr_ints("starts"), p->ends = sig.node->attr_ints("ends");
      p->has_axes = sig.node->attr("axes") != nullptr;
      if (p->has_axes) p->axes = sig.node->attr_ints("axes");
      return true;
    }
    if (!const_ints(sig, 1, &p->starts) || !const_ints(sig, 2, &p->ends)) return false;
    p->has_axes = sig.has_input(3), p->has_steps = sig.has_input(4);
    if (p->has_axes && !const_ints(sig, 3, &p->axes)) return false;
    if (p->has_steps && !const_ints(sig, 4, &p->steps)) return false;
    return true;
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = movable(sig); !e.empty()) return e;
    ops::SliceParams p;
    return params(sig, &p) ? "" : "starts/ends/axes/steps are not constants";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    ops::SliceParams p;
    if (!params(sig, &p)) return Unsupported("starts/ends/axes/steps are not constants");
    const Dims& x = sig.inputs[0].shape;
    const int64_t rank = static_cast<int64_t>(x.size());
    KILN_RETURN_IF_ERROR(ops::check_slice_params(p, rank));
    Dims in_strides = ops::strides_of(x);
    auto l = std::make_unique<PreparedCopies>();
    l->dtype = sig.inputs[0].dtype, l->kernel = "slice_cuda";
    l->shape = x;
    StridedCopy c;
    c.rank = static_cast<int>(rank);
    for (int64_t k = 0; k < rank; ++k) c.in_strides[k] = in_strides[static_cast<size_t>(k)];
    for (size_t j = 0; j < p.axes.size(); ++j) {
      size_t a = static_cast<size_t>(p.axes[j]);
      KILN_ASSIGN_OR_RETURN(ops::SliceAxis s, ops::slice_axis(x[a], p.starts[j], p.ends[j], p.steps[j]));
      l->shape[a] = s.len;
      c.in_offset += s.start * in_strides[a];
      c.in_strides[a] = in_strides[a] * s.step;
    }
    Dims out_strides = ops::strides_of(l->shape);
    for (int64_t k = 0; k < rank; ++k) c.dims[k] = l->shape[static_cast<size_t>(k)], c.out_strides[k] = out_strides[k];
    l->copies.emplace_back(0, c);
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

class ConcatCuda : public Tactic {
 public:
  std::string name() const override { return "concat_cuda"; }
  TacticInfo info() const override { return cuda_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Concat"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = movable(sig); !e.empty()) return e;
    for (const auto& t : sig.inputs)
      if (!t.present || t.dtype != sig.inputs[0].dtype || t.shape.size() != sig.inputs[0].shape.size())
        return "inputs differ in dtype or rank";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    const int64_t rank = static_cast<int64_t>(sig.inputs[0].shape.size());
    int64_t axis = sig.node->attr_int("axis", 0);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return InvalidArgument("axis out of range");
    auto l = std::make_unique<PreparedCopies>();
    l->dtype = sig.inputs[0].dtype, l->kernel = "concat_cuda";
    l->shape = sig.inputs[0].shape;
    l->shape[static_cast<size_t>(axis)] = 0;
    for (const auto& t : sig.inputs) l->shape[static_cast<size_t>(axis)] += t.shape[static_cast<size_t>(axis)];
    Dims out_strides = ops::strides_of(l->shape);
    int64_t at = 0;
    for (size_t i = 0; i < sig.inputs.size(); ++i) {
      const Dims& x = sig.inputs[i].shape;
      for (int64_t k = 0; k < rank; ++k)
        if (k != axis && x[static_cast<size_t>(k)] != l->shape[static_cast<size_t>(k)])
          return InvalidArgument("input ", i, " ", dims_str(x), " does not fit ", dims_str(sig.inputs[0].shape));
      StridedCopy c;
      c.rank = static_cast<int>(rank);
      Dims in_strides = ops::strides_of(x);
      for (int64_t k = 0; k < rank; ++k)
        c.dims[k] = x[static_cast<size_t>(k)], c.in_strides[k] = in_strides[static_cast<size_t>(k)],
        c.out_strides[k] = out_strides[static_cast<size_t>(k)];
      c.out_offset = at * out_strides[static_cast<size_t>(axis)];
      at += x[static_cast<size_t>(axis)];
      if (dims_numel(x)) l->copies.emplace_back(i, c);
    }
    KILN_RETURN_IF_ERROR(l->consts.upload(sig));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

class ExpandCuda : public Tactic {
 public:
  std::string name() const override { return "expand_cuda"; }
  TacticInfo info() const override { return cuda_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Expand"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = movable(sig); !e.empty()) return e;
    std::vector<int64_t> s;
    if (!const_ints(sig, 1, &s)) return "the shape is not a constant";
    if (s.size() > kMaxRank) return "rank above " + std::to_string(kMaxRank);
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    std::vector<int64_t> s;
    if (!const_ints(sig, 1, &s)) return Unsupported("the shape is not a constant");
    auto l = std::make_unique<PreparedCopies>();
    l->dtype = sig.inputs[0].dtype, l->kernel = "expand_cuda";
    if (!broadcast(sig.inputs[0].shape, s, &l->shape))
      return InvalidArgument("shape ", dims_str(s), " does not broadcast with ", dims_str(sig.inputs[0].shape));
    StridedCopy c;
    c.rank = static_cast<int>(l->shape.size());
    broadcast_strides(sig.inputs[0].shape, l->shape, c.in_strides);
    Dims out_strides = ops::strides_of(l->shape);
    for (size_t k = 0; k < l->shape.size(); ++k) c.dims[k] = l->shape[k], c.out_strides[k] = out_strides[k];
    l->copies.emplace_back(0, c);
    KILN_RETURN_IF_ERROR(l->consts.upload(sig));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

class PreparedGather : public PreparedLayer {
 public:
  Dims shape;
  DataType dtype = DataType::kFloat32;
  bool idx64 = true;
  int64_t outer = 1, axis = 1, count = 1, inner = 1;
  DeviceConstants consts;
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return launched(launch_gather(consts.data(0, in), consts.data(1, in), idx64, out[0]->raw(),
                                  static_cast<int64_t>(dtype_size(dtype)), outer, axis, count, inner, stream_of(ctx)),
                    "gather_cuda");
  }
};

class GatherCuda : public Tactic {
 public:
  std::string name() const override { return "gather_cuda"; }
  TacticInfo info() const override { return cuda_any_dtype(); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"", "Gather"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = movable(sig); !e.empty()) return e;
    if (!sig.has_input(1) || (sig.inputs[1].dtype != DataType::kInt64 && sig.inputs[1].dtype != DataType::kInt32))
      return "indices are not int64/int32";
    int64_t rank = static_cast<int64_t>(sig.inputs[0].shape.size()), axis = sig.node->attr_int("axis", 0);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return "axis out of range";
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    const Dims& x = sig.inputs[0].shape;
    const Dims& idx = sig.inputs[1].shape;
    int64_t rank = static_cast<int64_t>(x.size()), axis = sig.node->attr_int("axis", 0);
    if (axis < 0) axis += rank;
    auto l = std::make_unique<PreparedGather>();
    l->dtype = sig.inputs[0].dtype;
    l->idx64 = sig.inputs[1].dtype == DataType::kInt64;
    l->axis = x[static_cast<size_t>(axis)];
    l->count = dims_numel(idx);
    for (int64_t k = 0; k < axis; ++k) l->outer *= x[static_cast<size_t>(k)];
    for (int64_t k = axis + 1; k < rank; ++k) l->inner *= x[static_cast<size_t>(k)];
    l->shape.assign(x.begin(), x.begin() + axis);
    l->shape.insert(l->shape.end(), idx.begin(), idx.end());
    l->shape.insert(l->shape.end(), x.begin() + axis + 1, x.end());
    if (const Tensor* c = sig.inputs[1].constant)  // the reference rejects these; the kernel would write zeros
      for (int64_t k = 0; k < c->numel(); ++k)
        if (int64_t v = c->get_i64(k); v < -l->axis || v >= l->axis)
          return InvalidArgument("index ", v, " is out of range for an axis of ", l->axis);
    KILN_RETURN_IF_ERROR(l->consts.upload(sig));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }
};

// ---------------------------------------------------------------- kiln.FusedElementwise

class PreparedFused : public PreparedLayer {
 public:
  Dims shape;
  FusedProgram prog;
  DataType dtype = DataType::kFloat32;
  DeviceConstants consts;
  std::vector<Dims> output_shapes() const override { return {shape}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    const void* ptrs[kFusedMaxInputs] = {};
    for (int j = 0; j < prog.num_inputs; ++j) ptrs[j] = consts.data(static_cast<size_t>(j), in);
    return launched(
        launch_fused_elementwise(ptrs, out[0]->raw(), dims_numel(shape), prog, float_type(dtype), stream_of(ctx)),
        "fused_elementwise_cuda");
  }
};

// The fused tree's op program (shapes left to prepare); false with the reason when a node has no step.
bool fused_program(const ir::Node& node, FusedProgram* prog, std::string* why) {
  const ir::Attribute* attr = node.attr("body");
  const ir::Graph* body = attr && attr->g ? attr->g.get() : nullptr;
  if (!body || body->outputs.size() != 1 || body->nodes.empty()) {
    *why = "needs a body of elementwise nodes with one output";
    return false;
  }
  if (body->inputs.size() > static_cast<size_t>(kFusedMaxInputs) || body->inputs.size() != node.inputs.size() ||
      body->nodes.size() > static_cast<size_t>(kFusedMaxSteps)) {
    *why = "takes " + std::to_string(body->inputs.size()) + " inputs and " + std::to_string(body->nodes.size()) +
           " nodes; the kernel runs at most " + std::to_string(kFusedMaxInputs) + " and " +
           std::to_string(kFusedMaxSteps);
    return false;
  }
  std::map<std::string, int> slot;
  for (size_t j = 0; j < body->inputs.size(); ++j) slot[body->inputs[j].name] = static_cast<int>(j);
  prog->num_inputs = static_cast<int>(body->inputs.size());
  prog->num_steps = 0;
  auto operand = [&](const ir::Node& n, size_t i, int* s) {
    auto it = i < n.inputs.size() ? slot.find(n.inputs[i]) : slot.end();
    if (it == slot.end()) return false;
    *s = it->second;
    return true;
  };
  for (const ir::Node& n : body->nodes) {
    FusedStep st;
    const std::string& op = n.op_type;
    const bool bin = n.domain.empty() && (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Pow" ||
                                          op == "Max" || op == "Min" || op == "PRelu");
    if (n.outputs.size() != 1 || !operand(n, 0, &st.a) || (bin && (n.inputs.size() != 2 || !operand(n, 1, &st.b)))) {
      *why = "body node " + n.name + " (" + op + ") reads a value the kernel does not hold";
      return false;
    }
    if (bin) {
      st.binary = true;
      st.bop = BinaryCuda::op_of(op);
    } else {
      if (op == "Clip" && n.opset >= 11 && n.inputs.size() > 1) {
        *why = "body node " + n.name + ": Clip with min/max inputs";
        return false;
      }
      if (n.inputs.size() != 1 && op != "Clip") {
        *why = "body node " + n.name + " (" + op + ") takes " + std::to_string(n.inputs.size()) + " inputs";
        return false;
      }
      LayerSignature one;
      one.node = &n;
      if (!unary_params(one, &st.unary, why)) {
        *why = "body node " + n.name + ": " + *why;
        return false;
      }
    }
    slot[n.outputs[0]] = prog->num_inputs + prog->num_steps;
    prog->steps[prog->num_steps++] = st;
  }
  if (slot.count(body->outputs[0].name) == 0 || slot[body->outputs[0].name] != prog->num_inputs + prog->num_steps - 1) {
    *why = "the body's output is not its last node's";
    return false;
  }
  return true;
}

class FusedElementwiseCuda : public Tactic {
 public:
  explicit FusedElementwiseCuda(DataType dt) : dt_(dt) {}
  std::string name() const override { return dtype_name_of("fused_elementwise", dt_); }
  TacticInfo info() const override { return cuda_float(dt_); }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "FusedElementwise"}}; }
  std::string why_unsupported(const LayerSignature& sig) const override {
    for (size_t i = 0; i < sig.inputs.size(); ++i)
      if (!sig.has_input(i)) return "input " + std::to_string(i) + " is missing";
    if (auto e = float_inputs(sig, sig.inputs.size(), dt_); !e.empty()) return e;
    for (const auto& t : sig.inputs)
      if (t.shape.size() > kMaxRank) return "rank above " + std::to_string(kMaxRank);
    FusedProgram prog;
    std::string why;
    if (!fused_program(*sig.node, &prog, &why)) return why;
    if (sig.fully_known()) {
      Dims o;
      for (const auto& t : sig.inputs)
        if (!broadcast(o, t.shape, &o)) return "input shapes do not broadcast";
    }
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    auto l = std::make_unique<PreparedFused>();
    std::string why;
    if (!fused_program(*sig.node, &l->prog, &why)) return Unsupported(why);
    for (const auto& t : sig.inputs)
      if (!broadcast(l->shape, t.shape, &l->shape))
        return InvalidArgument("input shapes of ", sig.node->name, " do not broadcast: ", dims_str(t.shape), " into ",
                               dims_str(l->shape));
    if (l->shape.size() > kMaxRank) return Unsupported("rank above ", kMaxRank);
    l->prog.rank = static_cast<int>(l->shape.size());
    for (size_t k = 0; k < l->shape.size(); ++k) l->prog.dims[k] = l->shape[k];
    for (size_t j = 0; j < sig.inputs.size(); ++j) broadcast_strides(sig.inputs[j].shape, l->shape, l->prog.strides[j]);
    l->dtype = dt_;
    KILN_RETURN_IF_ERROR(l->consts.upload(sig));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }

 private:
  DataType dt_;
};

}  // namespace

std::vector<const Tactic*> own_kernel_tactics() {
  static const UnaryCuda unary(DataType::kFloat32), unary_f16(DataType::kFloat16), unary_bf16(DataType::kBFloat16);
  static const BinaryCuda binary(DataType::kFloat32), binary_f16(DataType::kFloat16), binary_bf16(DataType::kBFloat16);
  static const SoftmaxCuda softmax(DataType::kFloat32), softmax_f16(DataType::kFloat16),
      softmax_bf16(DataType::kBFloat16);
  static const LayerNormCuda layer_norm(DataType::kFloat32), layer_norm_f16(DataType::kFloat16),
      layer_norm_bf16(DataType::kBFloat16);
  static const TransposeCuda transpose;
  static const SliceCuda slice;
  static const ConcatCuda concat;
  static const ExpandCuda expand;
  static const GatherCuda gather;
  static const CastCuda cast;
  static const FusedElementwiseCuda fused(DataType::kFloat32), fused_f16(DataType::kFloat16),
      fused_bf16(DataType::kBFloat16);
  return {&fused,      &fused_f16,   &fused_bf16,     &unary,      &binary,      &softmax,      &layer_norm,
          &transpose,  &slice,       &concat,         &expand,     &gather,      &cast,         &unary_f16,
          &binary_f16, &softmax_f16, &layer_norm_f16, &unary_bf16, &binary_bf16, &softmax_bf16, &layer_norm_bf16};
}

}  // namespace kiln::backends::cuda
