// oneDNN matmul tactics for MatMul, Gemm, kiln.FusedMatMul and kiln.FusedGemm (bias, residual sum,
// activation as post-ops). "packed": the right-hand side is a constant 2-D weight, reordered once
// into oneDNN's preferred layout, the left-hand side's leading dims flattened into rows.
// "batched": any other B of rank 2 or more (activations, or constants with batch dims), batch dims
// broadcast as numpy's matmul does (attention scores, MobileNetV3's squeeze-excite as exported by
// the dynamo exporter, T5's relative position terms).
#if defined(KILN_HAVE_ONEDNN)
#include <algorithm>
#include <cstring>

#include "backends/cpu/kiln_tactics.h"
#include "backends/cpu/onednn_common.h"
#include "backends/cpu/onednn_tactics.h"

namespace kiln::backends::cpu::onednn {
namespace {

class PreparedMatmul : public PreparedLayer {
 public:
  std::string name;
  Dims out_shape;
  memory::desc src_md, dst_md, wei_md;
  memory::desc scratch_md;  // pd's scratchpad, asked once at prepare (querying it allocates)
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  memory weights, bias;  // weights only when constant (packed)
  bool has_bias = false, has_residual = false;
  std::vector<float> prefill;  // beta * C broadcast to the output (Gemm's C that is not per-column)

  std::vector<Dims> output_shapes() const override { return {out_shape}; }
  size_t workspace_bytes(int) const override { return workspace_piece(scratch_md.get_size()); }
  std::vector<std::pair<const void*, size_t>> constant_memory() const override {
    if (!weights) return {};
    return {{weights.get_data_handle(), weights.get_desc().get_size()}};
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    return guarded(name, [&]() -> Status {
      auto& eng = cpu_engine();
      float* dst = out[0]->data<float>();
      size_t n = static_cast<size_t>(out[0]->numel());
      fill_accumulator(dst, n, prefill, has_residual ? in[3]->data<float>() : nullptr);
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(src_md, eng, const_cast<void*>(in[0]->raw()))},
                                           {DNNL_ARG_DST, memory(dst_md, eng, dst)}};
      args.emplace(DNNL_ARG_WEIGHTS, weights ? weights : memory(wei_md, eng, const_cast<void*>(in[1]->raw())));
      if (has_bias) args.emplace(DNNL_ARG_BIAS, bias);
      WorkspaceSlicer ws(ctx);
      execute(prim, scratch_md, ws.take(scratch_md.get_size()), std::move(args));
      return Status::Ok();
    });
  }
};

class OnednnMatmul : public Tactic {
 public:
  explicit OnednnMatmul(bool packed) : packed_(packed) {}
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return packed_ ? "matmul_onednn_packed" : "matmul_onednn_batched"; }
  // batched 2: broadcast batch dims, constant B; 3 (packed 2): timed with its weights out of cache when
  // they exceed L2 (tune/tuner.h)
  int revision() const override { return packed_ ? 2 : 3; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    if (!packed_) return {{"", "MatMul"}, {"kiln", "FusedMatMul"}};
    return {{"", "MatMul"}, {"", "Gemm"}, {"kiln", "FusedMatMul"}, {"kiln", "FusedGemm"}};
  }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (!is_matmul_op(sig) || (!packed_ && is_gemm_layer(sig))) return "not a MatMul/Gemm";
    if (auto e = check_f32(sig); !e.empty()) return e;
    if (!sig.has_input(0) || !sig.has_input(1)) return "missing A or B";
    const Dims& a = sig.inputs[0].shape;
    const Dims& b = sig.inputs[1].shape;
    if (sig.domain() == "kiln" && !activation_supported(*sig.node)) return "activation has no oneDNN eltwise";
    if (a.size() < 2 || b.size() < 2) return "1-D operands";
    if (a.size() > 12 || b.size() > 12) return "rank over 12";
    if (packed_) {
      if (!sig.inputs[1].constant || b.size() != 2) return "B is not a 2-D constant";
    } else {
      if (sig.inputs[1].constant && b.size() == 2) return "B is a 2-D constant (the packed variant takes it)";
      // numpy batch broadcasting, aligned from the right: equal dims or 1 (oneDNN broadcasts both sides)
      // Unknown dims (shapes computed at run time, e.g. Swin's window count) are checked at prepare.
      for (size_t i = 2; i < std::max(a.size(), b.size()); ++i) {
        int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1, y = i < b.size() ? b[b.size() - 1 - i] : 1;
        if (x >= 0 && y >= 0 && x != y && x != 1 && y != 1) return "batch dims do not broadcast";
      }
    }
    return gemm_bias_unsupported(sig);
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedMatmul>();
    p->name = name();
    const ir::Node& node = *sig.node;
    const Dims& a = sig.inputs[0].shape;
    const Dims& b = sig.inputs[1].shape;
    auto geo = gemm_geometry(sig, name(), /*batched_b=*/!packed_);
    if (!geo.ok()) return geo.status();
    const GemmGeometry& g = geo.value();
    const bool gemm = g.gemm, ta = g.trans_a, tb = g.trans_b;
    const float alpha = g.alpha, beta = g.beta;
    const int64_t m = g.m, n = g.n, k = g.k;
    p->out_shape = g.out_shape;
    p->has_residual = sig.has_input(3);
    Status st = guarded(name(), [&]() -> Status {
      auto& eng = cpu_engine();
      memory::desc bias_md;
      size_t rank = packed_ ? 2 : p->out_shape.size();
      std::vector<float> bias_values;
      if (sig.has_input(2))
        KILN_RETURN_IF_ERROR(matmul_bias(*sig.inputs[2].constant, gemm, beta, m, n, &bias_values, &p->prefill));
      if (packed_) {
        p->src_md = ta ? memory::desc({m, k}, dt::f32, tag::ba) : memory::desc({m, k}, dt::f32, tag::ab);
        p->dst_md = memory::desc({m, n}, dt::f32, tag::ab);
        p->wei_md = tb ? memory::desc({k, n}, dt::f32, tag::ba) : memory::desc({k, n}, dt::f32, tag::ab);
      } else {
        // Every operand at the output's rank (leading 1s), as oneDNN's batch broadcasting wants.
        auto plain = [&](Dims d) {
          d.insert(d.begin(), rank - d.size(), 1);
          memory::dims strides(d.size());
          int64_t s = 1;
          for (size_t i = d.size(); i-- > 0;) strides[i] = s, s *= d[i];
          return memory::desc(to_dnnl(d), dt::f32, strides);
        };
        p->src_md = plain(a);
        p->wei_md = plain(b);
        p->dst_md = plain(p->out_shape);
      }
      if (!bias_values.empty()) {
        memory::dims bd(rank, 1);
        bd.back() = n;
        memory::dims bs(rank, n);
        bs.back() = 1;
        bias_md = memory::desc(bd, dt::f32, bs);
        p->has_bias = true;
      }
      dnnl::post_ops po;
      if (p->has_residual || !p->prefill.empty()) po.append_sum(1.f);
      append_activation(node, po);
      dnnl::primitive_attr attr;
      attr.set_post_ops(po);
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      memory::desc wei_any = packed_ ? memory::desc({k, n}, dt::f32, tag::any) : p->wei_md;
      auto d = p->has_bias ? dnnl::matmul::desc(p->src_md, wei_any, bias_md, p->dst_md)
                           : dnnl::matmul::desc(p->src_md, wei_any, p->dst_md);
      p->pd = dnnl::matmul::primitive_desc(d, attr, eng);
      p->scratch_md = p->pd.scratchpad_desc();
      p->prim = dnnl::matmul(p->pd);
      if (packed_) {
        const Tensor& w = *sig.inputs[1].constant;
        std::vector<float> scaled;
        const void* wsrc = w.raw();
        if (alpha != 1.f) {
          scaled.assign(w.data<float>(), w.data<float>() + w.numel());
          for (float& v : scaled) v *= alpha;
          wsrc = scaled.data();
        }
        p->weights = memory(p->pd.weights_desc(), eng);
        reorder_into(p->wei_md, wsrc, p->pd.weights_desc(), p->weights.get_data_handle());
      }
      if (p->has_bias) {
        p->bias = memory(bias_md, eng);
        std::memcpy(p->bias.get_data_handle(), bias_values.data(), bias_values.size() * 4);
      }
      return Status::Ok();
    });
    if (!st.ok()) return Unsupported(st.message());
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  bool packed_;
};

}  // namespace

const Tactic* matmul_onednn_packed() {
  static const OnednnMatmul t(true);
  return &t;
}
const Tactic* matmul_onednn_batched() {
  static const OnednnMatmul t(false);
  return &t;
}

}  // namespace kiln::backends::cpu::onednn
#endif  // KILN_HAVE_ONEDNN
