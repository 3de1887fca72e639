// gemm_kiln_packed: MatMul, Gemm, kiln.FusedMatMul and kiln.FusedGemm with a constant 2-D right-hand
// side, on kiln's own GEMM (gemm_kernels.h). B (times Gemm's alpha, transposed when transB) is
// packed once at prepare time; A is read in place (transA through strides, MatMul's leading dims
// flattened into rows). Gemm's C becomes a column bias, a row bias, or (full [M, N]) a prefill of
// the output; kiln's fused bias, residual and activation run in the micro-kernel's epilogue.
#include <cstring>
#include <vector>

#include "backends/cpu/gemm_kernels.h"
#include "backends/cpu/kiln_tactics.h"
#include "backends/cpu/xformer_tactics.h"

namespace kiln::backends::cpu {

std::string float32_cpu_layer(const LayerSignature& sig) {
  if (sig.device.kind != DeviceKind::kCPU) return "not a CPU layer";
  if (sig.compute != DataType::kFloat32) return std::string("computes in ") + dtype_name(sig.compute) + ", not float32";
  for (size_t i = 0; i < sig.inputs.size(); ++i)
    if (sig.inputs[i].present && sig.inputs[i].dtype != DataType::kFloat32)
      return "input #" + std::to_string(i) + " is " + std::string(dtype_name(sig.inputs[i].dtype)) + ", not float32";
  return "";
}

std::string residual_unsupported(const LayerSignature& sig, const Dims& out) {
  if (sig.has_input(3) && sig.inputs[3].known() && sig.inputs[3].shape != out)
    return "the residual is broadcast (not the output's shape)";
  return "";
}

std::string conv_layer_unsupported(const LayerSignature& sig, size_t spatial) {
  bool fused = sig.domain() == "kiln";
  if (!((sig.domain().empty() && sig.op() == "Conv") || (fused && sig.op() == "FusedConv"))) return "not a Conv";
  if (auto e = float32_cpu_layer(sig); !e.empty()) return e;
  const size_t rank = spatial + 2;
  const std::string r = std::to_string(rank) + "-D";
  if (!sig.has_input(0) || sig.inputs[0].shape.size() != rank)
    return "not a " + std::to_string(spatial) + "-D convolution (X must be " + r + ")";
  if (!sig.has_input(1) || !sig.inputs[1].constant || sig.inputs[1].shape.size() != rank)
    return "W is not a " + r + " constant";
  const Dims& w = sig.inputs[1].shape;
  if (sig.has_input(2) && (!sig.inputs[2].constant || sig.inputs[2].constant->numel() != w[0]))
    return "B is not a constant of M elements";
  if (sig.has_input(3) && sig.inputs[3].shape.size() != rank) return "the residual is not " + r;
  return "";
}

std::string conv2d_layer_unsupported(const LayerSignature& sig) { return conv_layer_unsupported(sig, 2); }

bool is_gemm_layer(const LayerSignature& sig) { return sig.op() == "Gemm" || sig.op() == "FusedGemm"; }

std::string gemm_bias_unsupported(const LayerSignature& sig) {
  const Dims& a = sig.inputs[0].shape;
  if (is_gemm_layer(sig)) {
    if (a.size() != 2) return "Gemm A is not 2-D";
    if (sig.has_input(2) && !sig.inputs[2].constant) return "C is not a constant";
    if (sig.has_input(2) && sig.inputs[2].shape.size() > 2) return "C has rank over 2";
  } else if (sig.has_input(2)) {
    const TensorSig& bias = sig.inputs[2];
    int64_t n = sig.inputs[1].shape.back();
    if (!bias.constant || bias.constant->numel() != n || bias.shape.empty() || bias.shape.back() != n ||
        bias.shape.size() > a.size())
      return "the bias is not a constant of N elements along the last axis";
  }
  return "";
}

Result<GemmGeometry> gemm_geometry(const LayerSignature& sig, const std::string& tactic, bool batched_b) {
  const ir::Node& node = *sig.node;
  const Dims& a = sig.inputs[0].shape;
  const Dims& b = sig.inputs[1].shape;
  GemmGeometry g;
  g.gemm = is_gemm_layer(sig);
  g.trans_a = g.gemm && node.attr_int("transA", 0), g.trans_b = g.gemm && node.attr_int("transB", 0);
  if (g.gemm) g.alpha = node.attr_float("alpha", 1.f), g.beta = node.attr_float("beta", 1.f);
  g.k = g.trans_a ? a[0] : a.back();
  int64_t kb = g.trans_b ? b[1] : b[0];
  g.n = g.trans_b ? b[0] : b[1];
  if (batched_b) g.n = b.back(), kb = b[b.size() - 2];
  if (g.k != kb) return Unsupported(tactic, ": inner dims differ (", g.k, " vs ", kb, ")");
  g.m = 1;
  for (size_t i = 0; i + 1 < a.size(); ++i) g.m *= a[i];
  if (g.gemm) g.m = g.trans_a ? a[1] : a[0];
  if (g.m <= 0 || g.k <= 0 || g.n <= 0) return Unsupported(tactic, ": empty operands");
  if (g.gemm) {
    g.out_shape = {g.m, g.n};
  } else if (batched_b) {  // numpy matmul: the batch dims of A and B broadcast
    Dims batch;
    if (!xf_broadcast(Dims(a.begin(), a.end() - 2), Dims(b.begin(), b.end() - 2), &batch))
      return Unsupported(tactic, ": batch dims ", dims_str(a), " and ", dims_str(b), " do not broadcast");
    g.out_shape = batch;
    g.out_shape.insert(g.out_shape.end(), {a[a.size() - 2], g.n});
  } else {
    g.out_shape = a;
    g.out_shape.back() = g.n;
  }
  if (auto e = residual_unsupported(sig, g.out_shape); !e.empty()) return Unsupported(tactic, ": ", e);
  return g;
}

namespace {

class PreparedGemm : public PreparedLayer {
 public:
  Isa isa = Isa::kScalar;
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, has_residual = false;
  Dims out_shape;
  PackedB b;
  std::vector<float> col_bias, row_bias, prefill;
  Activation act;

  std::vector<Dims> output_shapes() const override { return {out_shape}; }
  std::vector<std::pair<const void*, size_t>> constant_memory() const override {
    return {{b.data.data(), b.data.size() * sizeof(float)}};
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    float* y = out[0]->data<float>();
    GemmArgs g;
    g.m = m, g.n = n, g.k = k;
    g.a = in[0]->data<float>();
    g.rsa = trans_a ? 1 : k;
    g.csa = trans_a ? m : 1;
    g.packed_b = &b;
    g.c = y;
    g.ldc = n;
    if (!prefill.empty()) {
      std::memcpy(y, prefill.data(), prefill.size() * sizeof(float));
      g.epi.accumulate = true;
    }
    g.epi.col_bias = col_bias.empty() ? nullptr : col_bias.data();
    g.epi.row_bias = row_bias.empty() ? nullptr : row_bias.data();
    if (has_residual) g.epi.residual = in[3]->data<float>(), g.epi.ld_residual = n;
    g.epi.act = act;
    gemm(isa, g);
    return Status::Ok();
  }
};

class KilnGemm : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return "gemm_kiln_packed"; }
  // 2: the row tiles of a packed B panel prefetch the next panel; timed with its weights out of cache
  // when they exceed L2 (tune/tuner.h)
  int revision() const override { return 2; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "MatMul"}, {"", "Gemm"}, {"kiln", "FusedMatMul"}, {"kiln", "FusedGemm"}};
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    bool onnx = sig.domain().empty() && (sig.op() == "MatMul" || sig.op() == "Gemm");
    bool fused = sig.domain() == "kiln" && (sig.op() == "FusedMatMul" || sig.op() == "FusedGemm");
    if (!onnx && !fused) return "not a MatMul/Gemm";
    if (auto e = float32_cpu_layer(sig); !e.empty()) return e;
    if (!sig.has_input(0) || !sig.has_input(1)) return "missing A or B";
    Activation act;
    if (auto e = parse_activation(*sig.node, &act); !e.empty()) return e;
    const Dims& a = sig.inputs[0].shape;
    const Dims& b = sig.inputs[1].shape;
    if (a.size() < 2) return "A has rank below 2";
    if (!sig.inputs[1].constant || b.size() != 2) return "B is not a 2-D constant";
    return gemm_bias_unsupported(sig);
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedGemm>();
    const ir::Node& node = *sig.node;
    parse_activation(node, &p->act);
    auto geo = gemm_geometry(sig, name());
    if (!geo.ok()) return geo.status();
    const GemmGeometry& g = geo.value();
    const bool gemm = g.gemm;
    const int64_t m = g.m, n = g.n, k = g.k;
    const Tensor& w = *sig.inputs[1].constant;
    p->out_shape = g.out_shape;
    p->has_residual = sig.has_input(3);
    if (sig.has_input(2)) {
      const Tensor& c = *sig.inputs[2].constant;
      const float* cv = c.data<float>();
      const Dims& cs = c.shape();
      float scale = gemm ? g.beta : 1.f;
      int64_t cr = cs.size() == 2 ? cs[0] : 1, cc = cs.empty() ? 1 : cs.back();
      if (!gemm || (cr == 1 && cc == n)) {  // per column
        p->col_bias.assign(cv, cv + n);
        for (float& v : p->col_bias) v *= scale;
      } else if (cr == 1 && cc == 1) {  // scalar
        p->col_bias.assign(static_cast<size_t>(n), scale * cv[0]);
      } else if (cr == m && cc == 1) {  // per row
        p->row_bias.assign(cv, cv + m);
        for (float& v : p->row_bias) v *= scale;
      } else if (cr == m && cc == n) {
        p->prefill.resize(static_cast<size_t>(m * n));
        for (int64_t i = 0; i < m * n; ++i) p->prefill[i] = scale * cv[i];
      } else {
        return Unsupported(name(), ": C does not broadcast to [M, N]");
      }
    }
    p->isa = cpu_isa(sig.isa);
    p->m = m, p->n = n, p->k = k, p->trans_a = g.trans_a;
    // B[p][j] = W[p][j], or W[j][p] when transposed.
    p->b = pack_b(p->isa, w.data<float>(), k, n, g.trans_b ? 1 : n, g.trans_b ? k : 1, g.alpha);
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }
};

}  // namespace

const Tactic* gemm_kiln_packed() {
  static const KilnGemm t;
  return &t;
}

}  // namespace kiln::backends::cpu
