// kiln.Attention and kiln.MultiHeadAttention on CUDA as one fused kernel (cuda_flash_attention.cu):
// attention_fused_{f16,bf16}_cuda (wmma, the scores in shared memory) and attention_flash2_{f16,bf16}_cuda
// (mma.sync, scores, P and O in registers: FlashAttention-2's loop), for head sizes 32, 64 and 128 with V's head
// size Q's. The signature analysis is the cuBLASLt tactic's (cuda_attention_geometry.h): the heads
// read in place, packed QKV, shared K/V, K transposed, the mask broadcast along any dims. No
// workspace: the scores never leave shared memory. Other head sizes, float32 and V head sizes that
// differ are declined with the reason; the cuBLASLt tactic (cuda_attention_tactics.cc) takes them,
// and where both can run the tuner times them.
#include "backends/cuda/cuda_attention.h"
#include "backends/cuda/cuda_attention_geometry.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_tactics.h"

namespace kiln::backends::cuda {

namespace {

FloatType flash_type(DataType dt) { return dt == DataType::kFloat16 ? FloatType::kF16 : FloatType::kBF16; }

FlashAttentionOperand flash_operand(const AttentionOperand& o) { return {o.base, o.sb, o.sh, o.ld, 1}; }

std::string head_size_reason(int64_t d) {
  return "head size " + std::to_string(d) + " (the fused kernel takes 32, 64 and 128; attention_cublaslt takes it)";
}

// Q's head size from its last dim (MultiHeadAttention: the width over num_heads, packed: a third of
// it), or -1 while that dim is not known.
int64_t head_size_of_width(const LayerSignature& sig) {
  const Dims& q = sig.inputs[0].shape;
  if (q.empty() || q.back() < 0) return -1;
  if (sig.op() != "MultiHeadAttention") return q.back();
  const int64_t h = sig.node->attr_int("num_heads", 0);
  return h < 1 ? -1 : (attention_packed(sig) ? q.back() / 3 : q.back()) / h;
}

class PreparedFlashAttention : public PreparedLayer {
 public:
  Dims out;
  DataType dtype = DataType::kFloat16;
  DeviceConstants consts;
  FlashAttentionParams params;
  size_t sig_k = 1, sig_v = 2;
  bool has_mask = false;
  bool mma = false;
  std::string name;

  std::vector<Dims> output_shapes() const override { return {out}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& outs) const override {
    const void* q = consts.data(0, in);
    const void* k = consts.data(sig_k, in);
    const void* v = consts.data(sig_v, in);
    const void* mask = has_mask ? consts.data(3, in) : nullptr;
    if (!q || !k || !v || (has_mask && !mask) || outs.empty() || !outs[0])
      return Internal(name, ": an input is missing");
    return cuda_status(
        launch_flash_attention(q, k, v, mask, outs[0]->raw(), params, flash_type(dtype), stream_of(ctx), mma),
        mma ? "flash_attention_mma_kernel" : "flash_attention_kernel");
  }
};

class AttentionFused : public Tactic {
 public:
  AttentionFused(DataType dt, bool mma) : dt_(dt), mma_(mma) {}
  std::string name() const override {
    const char* suffix = dt_ == DataType::kFloat16 ? "_f16_cuda" : "_bf16_cuda";
    return std::string(mma_ ? "attention_flash2" : "attention_fused") + suffix;
  }
  TacticInfo info() const override { return {DeviceKind::kCUDA, kIsaPortable, dt_, {dt_}, {dt_}}; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"kiln", "Attention"}, {"kiln", "MultiHeadAttention"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (std::string why = attention_why_unsupported(sig, dt_); !why.empty()) return why;
    if (!sig.fully_known()) {  // the head size where Q's width is known already
      const int64_t d = head_size_of_width(sig);
      return d > 0 && !flash_attention_supports(flash_type(dt_), d) ? head_size_reason(d) : "";
    }
    const AttentionGeometry g = attention_geometry(sig);
    if (!flash_attention_supports(flash_type(dt_), g.d)) return head_size_reason(g.d);
    if (g.dv != g.d)
      return "V's head size " + std::to_string(g.dv) + " is not Q's " + std::to_string(g.d) +
             " (the fused kernel needs them equal; attention_cublaslt takes it)";
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (std::string why = why_unsupported(sig); !why.empty()) return Unsupported(name(), ": ", why);
    auto l = std::make_unique<PreparedFlashAttention>();
    l->name = name();
    l->dtype = dt_;
    const AttentionGeometry g = attention_geometry(sig);
    l->out = g.out;
    const bool packed = attention_packed(sig);
    l->sig_k = packed ? 0 : 1, l->sig_v = packed ? 0 : 2;
    l->has_mask = sig.has_input(3);
    l->mma = mma_;
    KILN_RETURN_IF_ERROR(l->consts.upload(sig));
    FlashAttentionParams& p = l->params;
    p.sq = g.sq, p.sk = g.sk, p.d = g.d;
    p.problems = g.nb * g.nh, p.nh = g.nh;
    p.scale = sig.node->attr_float("scale", 1.f);
    p.q = flash_operand(g.q), p.v = flash_operand(g.v), p.y = flash_operand(g.y);
    p.k = flash_operand(g.k);
    if (g.k_transposed) p.k.row = 1, p.k.col = g.k.ld;  // K stored [d, sk]: key j, dim c at c * ld + j
    p.mask = attention_softmax_params(g, sig, g.sk);
    KILN_CUDA_RETURN_IF_ERROR(flash_attention_configure(flash_type(dt_), g.d));
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }

 private:
  DataType dt_;
  bool mma_;
};

}  // namespace

std::vector<const Tactic*> flash_attention_tactics() {
  static const AttentionFused f16(DataType::kFloat16, false), bf16(DataType::kBFloat16, false),
      f16_mma(DataType::kFloat16, true), bf16_mma(DataType::kBFloat16, true);
  return {&f16, &bf16, &f16_mma, &bf16_mma};
}

}  // namespace kiln::backends::cuda
