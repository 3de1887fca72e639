// LayerNormalization and Softmax/LogSoftmax tactics over rows of a contiguous block
// (xformer_kernels: one pass for the mean, one for the variance, one to write; max, exp-sum and
// scale for softmax), rows split over threads.
#include <algorithm>
#include <cstring>

#include "backends/cpu/longtail_kernels.h"
#include "backends/cpu/xformer_kernels.h"
#include "backends/cpu/xformer_tactics.h"
#include "core/parallel.h"

namespace kiln::backends::cpu {

std::string xf_float32_layer(const LayerSignature& sig) {
  if (sig.device.kind != DeviceKind::kCPU) return "not a CPU layer";
  if (sig.compute != DataType::kFloat32) return "computes in " + std::string(dtype_name(sig.compute));
  for (size_t i = 0; i < sig.inputs.size(); ++i)
    if (sig.inputs[i].present && sig.inputs[i].dtype != DataType::kFloat32)
      return "input " + std::to_string(i) + " is " + dtype_name(sig.inputs[i].dtype) + ", not float32";
  return "";
}

bool xf_broadcast(const Dims& a, const Dims& b, Dims* out) {
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

namespace {

// Elements a thread gets at least (about 0.2 ms of work). These kernels stream memory at a few
// GB/s per core, and measured on BERT (2 threads) a region for one [128, 768] LayerNormalization cost
// 0.1 ms instead of the 0.03 ms of running it on one thread; on a busy machine a region can also wait
// milliseconds for a descheduled worker.
constexpr int64_t kGrainElements = int64_t{1} << 20;

int64_t numel(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

// ---- LayerNormalization ----

class PreparedLayerNorm : public PreparedLayer {
 public:
  const xf::Kernels* k = nullptr;
  Dims shape;
  int64_t rows = 0, len = 0;
  float epsilon = 1e-5f;
  bool has_scale = false, has_bias = false;
  std::vector<float> scale, bias;  // constants (scalars expanded); empty: read at run time

  std::vector<Dims> output_shapes() const override { return {shape}; }
  // A run-time Scale or B given as one value is expanded to a row of `len` floats there.
  size_t workspace_bytes(int) const override {
    const size_t row = workspace_piece(static_cast<size_t>(len) * sizeof(float));
    return (has_scale && scale.empty() ? row : 0) + (has_bias && bias.empty() ? row : 0);
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    WorkspaceSlicer ws(ctx);
    auto param = [&](size_t i, const std::vector<float>& prepared) -> const float* {
      if (!prepared.empty()) return prepared.data();
      auto* row = static_cast<float*>(ws.take(static_cast<size_t>(len) * sizeof(float)));  // taken either way
      const Tensor& t = *in[i];
      if (t.numel() == len) return t.data<float>();
      std::fill(row, row + len, t.data<float>()[0]);
      return row;
    };
    const float* s = has_scale ? param(1, scale) : nullptr;
    const float* b = has_bias ? param(2, bias) : nullptr;
    const float* x = in[0]->data<float>();
    float* y = out[0]->data<float>();
    parallel_for(rows, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(len, 1)),
                 [&](int64_t r0, int64_t r1) { k->layer_norm(x, y, r0, r1, len, s, b, epsilon); });
    return Status::Ok();
  }
};

class LayerNormKiln : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return "layer_norm_kiln"; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "LayerNormalization"}, {"kiln", "LayerNormalization"}};
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = xf_float32_layer(sig); !e.empty()) return e;
    const ir::Node& n = *sig.node;
    if (!sig.has_input(0)) return "no X";
    if (sig.domain().empty() && !sig.has_input(1)) return "no Scale";
    for (size_t o = 1; o < n.outputs.size(); ++o)
      if (n.has_output(o)) return "Mean/InvStdDev outputs are asked for";
    int64_t rank = static_cast<int64_t>(sig.inputs[0].shape.size());
    int64_t axis = n.attr_int("axis", -1);
    if (axis < 0) axis += rank;
    if (rank == 0 || axis < 0 || axis >= rank) return "axis out of range";
    if (!sig.inputs[0].known()) return "";  // the parameters are checked at prepare time
    Dims block(sig.inputs[0].shape.begin() + axis, sig.inputs[0].shape.end());
    for (size_t i = 1; i <= 2; ++i) {
      if (!sig.has_input(i)) continue;
      const Dims& p = sig.inputs[i].shape;
      bool ok = sig.inputs[i].known() && (numel(p) == 1 || p == block);
      // Leading 1s do not change which element a position reads.
      if (!ok && sig.inputs[i].known() && p.size() > block.size()) {
        ok = std::equal(block.begin(), block.end(), p.end() - block.size());
        for (size_t d = 0; ok && d + block.size() < p.size(); ++d) ok = p[d] == 1;
      }
      if (!ok) return "Scale/B is neither a scalar nor of the normalized block's shape";
    }
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedLayerNorm>();
    p->k = &xf::kernels(cpu_isa(sig.isa));
    p->shape = sig.inputs[0].shape;
    int64_t rank = static_cast<int64_t>(p->shape.size());
    int64_t axis = sig.node->attr_int("axis", -1);
    if (axis < 0) axis += rank;
    p->len = 1;
    for (int64_t d = axis; d < rank; ++d) p->len *= p->shape[static_cast<size_t>(d)];
    p->rows = p->len ? numel(p->shape) / p->len : 0;
    p->epsilon = sig.node->attr_float("epsilon", 1e-5f);
    p->has_scale = sig.has_input(1);
    p->has_bias = sig.has_input(2);
    for (size_t i = 1; i <= 2; ++i) {
      if (!sig.has_input(i) || !sig.inputs[i].constant) continue;
      const Tensor& c = *sig.inputs[i].constant;
      std::vector<float>& dst = i == 1 ? p->scale : p->bias;
      if (c.numel() == p->len)
        dst.assign(c.data<float>(), c.data<float>() + p->len);
      else
        dst.assign(static_cast<size_t>(p->len), c.data<float>()[0]);
    }
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

// ---- Softmax / LogSoftmax ----

// Columns of a strided softmax one work item covers (a few vectors: the axis is read once per
// vector, `inner` floats apart).
constexpr int64_t kSoftmaxCols = 128;

class PreparedSoftmax : public PreparedLayer {
 public:
  const xf::Kernels* k = nullptr;
  const lt::Kernels* lk = nullptr;
  Dims shape;
  int64_t rows = 0, len = 0;
  int64_t inner = 1;  // > 1: x is [rows, len, inner], normalized along len (a strided axis)
  bool log = false;

  std::vector<Dims> output_shapes() const override { return {shape}; }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    const float* x = in[0]->data<float>();
    float* y = out[0]->data<float>();
    if (inner > 1) {
      int64_t blocks = (inner + kSoftmaxCols - 1) / kSoftmaxCols;
      parallel_for(rows * blocks, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(len * kSoftmaxCols, 1)),
                   [&](int64_t u0, int64_t u1) {
                     for (int64_t u = u0; u < u1; ++u) {
                       int64_t c0 = (u % blocks) * kSoftmaxCols;
                       lk->softmax_cols(x, y, u / blocks, len, inner, c0, std::min(kSoftmaxCols, inner - c0), log);
                     }
                   });
      return Status::Ok();
    }
    parallel_for(rows, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(len, 1)),
                 [&](int64_t r0, int64_t r1) { k->softmax(x, y, r0, r1, len, log); });
    return Status::Ok();
  }
};

class SoftmaxKiln : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return "softmax_kiln"; }
  int revision() const override { return 2; }  // 2: any axis (strided columns)
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "Softmax"}, {"", "LogSoftmax"}};
  }

  // The first normalized axis; rows are everything before it. *strided: opset 13+ with dims after
  // the axis (normalized along one axis, columns `inner` apart).
  static bool split(const LayerSignature& sig, int64_t* axis_out, bool* strided) {
    *strided = false;
    const ir::Node& n = *sig.node;
    const Dims& s = sig.inputs[0].shape;
    int64_t rank = static_cast<int64_t>(s.size());
    if (n.opset < 13) {  // coerced to 2-D at axis: the block is contiguous whatever the axis
      int64_t axis = n.attr_int("axis", 1);
      if (axis < 0) axis += rank;
      if (axis < 0 || axis > rank) return false;
      *axis_out = axis;
      return true;
    }
    int64_t axis = n.attr_int("axis", -1);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return false;
    for (int64_t d = axis + 1; d < rank; ++d) *strided |= s[static_cast<size_t>(d)] != 1;
    *axis_out = axis;
    return true;
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = xf_float32_layer(sig); !e.empty()) return e;
    if (!sig.has_input(0)) return "no input";
    if (sig.inputs[0].shape.empty()) return "a scalar input";
    int64_t axis;
    bool strided;
    if (!split(sig, &axis, &strided)) return "axis out of range";
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedSoftmax>();
    p->k = &xf::kernels(cpu_isa(sig.isa));
    p->shape = sig.inputs[0].shape;
    int64_t axis = 0;
    bool strided = false;
    split(sig, &axis, &strided);
    p->len = 1;
    if (strided) {
      p->lk = &lt::kernels(cpu_isa(sig.isa));
      p->len = p->shape[static_cast<size_t>(axis)];
      for (size_t d = static_cast<size_t>(axis) + 1; d < p->shape.size(); ++d) p->inner *= p->shape[d];
    } else {
      for (size_t d = static_cast<size_t>(axis); d < p->shape.size(); ++d) p->len *= p->shape[d];
    }
    p->rows = p->len * p->inner != 0 ? numel(p->shape) / (p->len * p->inner) : 0;
    p->log = sig.op() == "LogSoftmax";
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

// ---- GroupNormalization / InstanceNormalization ----

class PreparedGroupNorm : public PreparedLayer {
 public:
  const lt::Kernels* k = nullptr;
  Dims shape;
  int64_t blocks = 0, channels = 0, spatial = 0, groups = 1;  // blocks: N * groups of channels x spatial
  float epsilon = 1e-5f;
  std::vector<float> scale, bias;  // per channel (opset-18 per-group values repeated)

  std::vector<Dims> output_shapes() const override { return {shape}; }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    const float* x = in[0]->data<float>();
    float* y = out[0]->data<float>();
    const int64_t len = channels * spatial;
    parallel_for(blocks, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(len, 1)), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        int64_t c0 = (b % groups) * channels;
        k->group_norm(x + b * len, y + b * len, channels, spatial, scale.data() + c0, bias.data() + c0, epsilon);
      }
    });
    return Status::Ok();
  }
};

class GroupNormKiln : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return "group_norm_kiln"; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "GroupNormalization"}, {"", "InstanceNormalization"}};
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (auto e = xf_float32_layer(sig); !e.empty()) return e;
    if (!sig.has_input(0) || !sig.has_input(1) || !sig.has_input(2)) return "missing X, scale or B";
    if (!sig.inputs[1].constant || !sig.inputs[2].constant) return "scale / B are computed at run time";
    const Dims& x = sig.inputs[0].shape;
    if (x.size() < 2) return "X has rank below 2";
    if (x[1] < 0) return "";
    int64_t groups = 0, nparam = 0;
    if (auto e = geometry(sig, &groups, &nparam); !e.empty()) return e;
    if (sig.inputs[1].constant->numel() != nparam || sig.inputs[2].constant->numel() != nparam)
      return "scale / B do not have " + std::to_string(nparam) + " values";
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedGroupNorm>();
    const Dims& x = sig.inputs[0].shape;
    int64_t nparam = 0;
    geometry(sig, &p->groups, &nparam);
    p->k = &lt::kernels(cpu_isa(sig.isa));
    p->shape = x;
    p->channels = x[1] / p->groups;
    p->spatial = 1;
    for (size_t d = 2; d < x.size(); ++d) p->spatial *= x[d];
    p->blocks = x[0] * p->groups;
    p->epsilon = sig.node->attr_float("epsilon", 1e-5f);
    const float* s = sig.inputs[1].constant->data<float>();
    const float* b = sig.inputs[2].constant->data<float>();
    for (int64_t c = 0; c < x[1]; ++c) {
      int64_t i = nparam == x[1] ? c : c / p->channels;
      p->scale.push_back(s[i]), p->bias.push_back(b[i]);
    }
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  // Groups and the number of scale / bias values: InstanceNormalization one group per channel;
  // GroupNormalization num_groups, values per group before opset 21, per channel from 21.
  static std::string geometry(const LayerSignature& sig, int64_t* groups, int64_t* nparam) {
    const int64_t c = sig.inputs[0].shape[1];
    if (sig.op() == "InstanceNormalization") {
      *groups = *nparam = c;
      return c > 0 ? "" : "no channels";
    }
    if (!sig.node->attr("num_groups")) return "no num_groups";
    *groups = sig.node->attr_int("num_groups", 1);
    if (*groups <= 0 || c % *groups != 0) return "num_groups does not divide the channels";
    *nparam = sig.node->opset < 21 ? *groups : c;
    return "";
  }
};

}  // namespace

const Tactic* group_norm_kiln() {
  static const GroupNormKiln t;
  return &t;
}

const Tactic* layer_norm_kiln() {
  static const LayerNormKiln t;
  return &t;
}
const Tactic* softmax_kiln() {
  static const SoftmaxKiln t;
  return &t;
}

}  // namespace kiln::backends::cpu
