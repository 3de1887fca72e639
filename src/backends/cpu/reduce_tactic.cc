// ReduceSum / Mean / Max / Min / Prod / SumSquare / L1 / L2 / LogSum / LogSumExp on float32 along
// any axes that, once size-1 dims are dropped and neighbours of the same kind merged, form one
// block: x viewed as [outer, reduced, inner]. inner == 1 reduces contiguous rows (lt::reduce_rows,
// vector partial sums added in double per block); otherwise columns of the block are reduced a
// vector at a time (lt::reduce_cols). The final mean / sqrt / log is applied per output element.
#include <algorithm>
#include <cmath>

#include "backends/cpu/kiln_tactics.h"
#include "backends/cpu/longtail_kernels.h"
#include "core/parallel.h"

namespace kiln::backends::cpu {
namespace {

constexpr int64_t kGrainElements = int64_t{1} << 19;  // input elements a thread gets at least
constexpr int64_t kCols = 256;                        // columns of one work item (inner > 1)

enum class Final { kNone, kMean, kSqrt, kLog };

struct OpInfo {
  lt::Reduce acc;
  Final final;
};

bool op_info(const std::string& op, OpInfo* info) {
  static const std::pair<const char*, OpInfo> kOps[] = {
      {"ReduceSum", {lt::Reduce::kSum, Final::kNone}},   {"ReduceMean", {lt::Reduce::kSum, Final::kMean}},
      {"ReduceMax", {lt::Reduce::kMax, Final::kNone}},   {"ReduceMin", {lt::Reduce::kMin, Final::kNone}},
      {"ReduceProd", {lt::Reduce::kProd, Final::kNone}}, {"ReduceSumSquare", {lt::Reduce::kSumSquare, Final::kNone}},
      {"ReduceL1", {lt::Reduce::kSumAbs, Final::kNone}}, {"ReduceL2", {lt::Reduce::kSumSquare, Final::kSqrt}},
      {"ReduceLogSum", {lt::Reduce::kSum, Final::kLog}}, {"ReduceLogSumExp", {lt::Reduce::kLogSumExp, Final::kNone}}};
  for (const auto& [name, i] : kOps)
    if (op == name) return *info = i, true;
  return false;
}

class PreparedReduce : public PreparedLayer {
 public:
  const lt::Kernels* k = nullptr;
  OpInfo info{};
  Dims out_shape;
  int64_t outer = 1, len = 1, inner = 1;

  std::vector<Dims> output_shapes() const override { return {out_shape}; }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& outs) const override {
    const float* x = in[0]->data<float>();
    float* y = outs[0]->data<float>();
    if (inner == 1) {
      parallel_for(outer, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(len, 1)),
                   [&](int64_t r0, int64_t r1) {
                     k->reduce_rows(x, y, r0, r1, len, info.acc);
                     finish(y, r0, r1);
                   });
      return Status::Ok();
    }
    const int64_t blocks = (inner + kCols - 1) / kCols;
    parallel_for(outer * blocks, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(len * kCols, 1)),
                 [&](int64_t u0, int64_t u1) {
                   for (int64_t u = u0; u < u1; ++u) {
                     int64_t o = u / blocks, c0 = (u % blocks) * kCols, nc = std::min(kCols, inner - c0);
                     k->reduce_cols(x, y, o, len, inner, c0, nc, info.acc);
                     finish(y, o * inner + c0, o * inner + c0 + nc);
                   }
                 });
    return Status::Ok();
  }

  void finish(float* y, int64_t b, int64_t e) const {
    switch (info.final) {
      case Final::kNone: return;
      case Final::kMean: {
        const double n = static_cast<double>(len);
        for (int64_t i = b; i < e; ++i) y[i] = static_cast<float>(static_cast<double>(y[i]) / n);
        return;
      }
      case Final::kSqrt:
        for (int64_t i = b; i < e; ++i) y[i] = std::sqrt(y[i]);
        return;
      case Final::kLog:
        for (int64_t i = b; i < e; ++i) y[i] = std::log(y[i]);
        return;
    }
  }
};

class ReduceKiln : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return "reduce_kiln"; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    std::vector<std::pair<std::string, std::string>> v;
    for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
                           "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"})
      v.emplace_back("", op);
    return v;
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.device.kind != DeviceKind::kCPU || sig.compute != DataType::kFloat32) return "not a float32 CPU layer";
    if (!sig.has_input(0) || sig.inputs[0].dtype != DataType::kFloat32) return "X is not float32";
    OpInfo info;
    if (!op_info(sig.op(), &info)) return "op " + sig.op();
    std::vector<int64_t> axes;
    bool noop = false;
    if (auto e = read_axes(sig, &axes, &noop); !e.empty()) return e;
    if (noop) return "noop_with_empty_axes with no axes (an identity)";
    if (!sig.inputs[0].known()) return "";
    PreparedReduce p;
    return plan(sig, axes, &p);
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedReduce>();
    std::vector<int64_t> axes;
    bool noop = false;
    read_axes(sig, &axes, &noop);
    if (auto e = plan(sig, axes, p.get()); !e.empty()) return Unsupported(name(), ": ", e);
    op_info(sig.op(), &p->info);
    p->k = &lt::kernels(cpu_isa(sig.isa));
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  // The axes as the reference reads them: an attribute before opset 13 (ReduceSum) / 18 (the
  // others), then a constant input; empty means all axes unless noop_with_empty_axes.
  static std::string read_axes(const LayerSignature& sig, std::vector<int64_t>* axes, bool* noop) {
    const ir::Node& n = *sig.node;
    int since = n.op_type == "ReduceSum" ? 13 : 18;
    if (n.opset < since) {
      *axes = n.attr_ints("axes");
      return "";
    }
    if (sig.has_input(1)) {
      const Tensor* t = sig.inputs[1].constant;
      if (!t) return "axes are computed at run time";
      if (t->dtype() != DataType::kInt64 || t->rank() > 1) return "axes are not a 1-D int64 tensor";
      for (int64_t i = 0; i < t->numel(); ++i) axes->push_back(t->data<int64_t>()[i]);
    }
    *noop = axes->empty() && n.attr_int("noop_with_empty_axes", 0) != 0;
    return "";
  }

  static std::string plan(const LayerSignature& sig, const std::vector<int64_t>& axes, PreparedReduce* p) {
    const Dims& x = sig.inputs[0].shape;
    const int64_t r = static_cast<int64_t>(x.size());
    std::vector<bool> mask(static_cast<size_t>(r), axes.empty());
    for (int64_t a : axes) {
      if (a < -r || a >= r) return "axis " + std::to_string(a) + " out of range";
      size_t k = static_cast<size_t>(a < 0 ? a + r : a);
      if (mask[k] && !axes.empty()) return "axis " + std::to_string(a) + " repeated";
      mask[k] = true;
    }
    bool keepdims = sig.node->attr_int("keepdims", 1) != 0;
    p->out_shape.clear();
    // [outer, len, inner]: the reduced dims (size > 1) must be one run.
    int state = 0;  // 0: before the reduced block, 1: inside it, 2: after it
    p->outer = p->len = p->inner = 1;
    for (int64_t k = 0; k < r; ++k) {
      int64_t d = x[static_cast<size_t>(k)];
      bool red = mask[static_cast<size_t>(k)];
      if (red) {
        if (d == 0) return "reduces an empty axis";
        if (keepdims) p->out_shape.push_back(1);
      } else {
        p->out_shape.push_back(d);
      }
      if (d == 1) continue;
      if (red) {
        if (state == 2) return "the reduced axes are not one block (after dropping size-1 dims)";
        state = 1, p->len *= d;
      } else {
        if (state == 1) state = 2;
        (state == 0 ? p->outer : p->inner) *= d;
      }
    }
    if (dims_numel(p->out_shape) == 0) return "an empty output";
    return "";
  }
};

}  // namespace

const Tactic* reduce_kiln() {
  static const ReduceKiln t;
  return &t;
}

}  // namespace kiln::backends::cpu
