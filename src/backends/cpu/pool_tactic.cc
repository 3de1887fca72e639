// pool2d_kiln_nchw: MaxPool (without its Indices output), AveragePool, GlobalAveragePool and
// GlobalMaxPool on 4-D NCHW, on kiln's own kernels (pool_kernels.h). The window, ceil_mode
// included, is resolved by the reference kernel's own code, so shapes and edge windows match it.
#include "backends/cpu/kiln_tactics.h"
#include "backends/cpu/pool_kernels.h"
#include "ops/conv_util.h"

namespace kiln::backends::cpu {
namespace {

bool is_global(const ir::Node& n) { return n.op_type == "GlobalAveragePool" || n.op_type == "GlobalMaxPool"; }
bool is_max(const ir::Node& n) { return n.op_type == "MaxPool" || n.op_type == "GlobalMaxPool"; }

// The pooling attributes for a concrete input shape; "" or why not.
std::string resolve(const ir::Node& node, const Dims& x, Pool2d& p) {
  if (x[0] <= 0 || x[1] <= 0 || x[2] <= 0 || x[3] <= 0) return "empty tensors";
  p.planes = x[0] * x[1];
  p.max = is_max(node);
  p.global = is_global(node);
  PlaneGeometry& g = p.g;
  g.h = x[2], g.w = x[3];
  if (p.global) {
    g.oh = g.ow = 1, g.kh = g.h, g.kw = g.w;
    return "";
  }
  auto win = ops::resolve_window(node, x, nullptr);
  if (!win.ok()) return win.status().message();
  g.pad_top = win->pad_begin[0], p.pad_bottom = win->pad_end[0], g.pad_left = win->pad_begin[1];
  p.pad_right = win->pad_end[1];
  g.oh = win->out[0], g.ow = win->out[1];
  if (g.oh <= 0 || g.ow <= 0) return "empty output";
  g.kh = win->kernel[0], g.kw = win->kernel[1];
  g.sh = win->strides[0], g.sw = win->strides[1], g.dh = win->dilations[0], g.dw = win->dilations[1];
  p.count_include_pad = node.attr_int("count_include_pad", 0) != 0;
  return "";
}

class PreparedPool : public PreparedLayer {
 public:
  Isa isa = Isa::kScalar;
  Pool2d p;
  Dims out_shape;
  std::vector<float> reciprocals;

  std::vector<Dims> output_shapes() const override { return {out_shape}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    pool2d(isa, p, reciprocals.data(), in[0]->data<float>(), out[0]->data<float>());
    return Status::Ok();
  }
};

class KilnPool : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return "pool2d_kiln_nchw"; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "MaxPool"}, {"", "AveragePool"}, {"", "GlobalAveragePool"}, {"", "GlobalMaxPool"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    const ir::Node& n = *sig.node;
    if (!sig.domain().empty()) return "not an ONNX pooling op";
    if (auto e = float32_cpu_layer(sig); !e.empty()) return e;
    if (!sig.has_input(0) || sig.inputs[0].shape.size() != 4) return "not 2-D pooling (X must be 4-D)";
    if (n.outputs.size() > 1 && !n.outputs[1].empty()) return "MaxPool's Indices output";
    if (sig.inputs[0].known()) {
      Pool2d p;
      return resolve(n, sig.inputs[0].shape, p);
    }
    return "";
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto pp = std::make_unique<PreparedPool>();
    pp->isa = cpu_isa(sig.isa);
    const Dims& x = sig.inputs[0].shape;
    resolve(*sig.node, x, pp->p);
    pp->out_shape = {x[0], x[1], pp->p.g.oh, pp->p.g.ow};
    pp->reciprocals = pool_reciprocals(pp->p);
    return std::unique_ptr<PreparedLayer>(std::move(pp));
  }
};

}  // namespace

const Tactic* pool2d_kiln_nchw() {
  static const KilnPool t;
  return &t;
}

}  // namespace kiln::backends::cpu
