// kiln.Attention and kiln.MultiHeadAttention on CUDA (see src/ops/kiln_fused_misc.cc for the ops):
//
//   scores = scale * Q K'          cuBLASLt, strided batched, float32 output (workspace)
//   P      = softmax(scores + mask) one kernel, a warp per row, float32 math (cuda_attention.cu)
//   Y      = P V                   cuBLASLt, strided batched, P in the data's dtype (workspace)
//
// MultiHeadAttention reads the heads in place: head h of row s of a [batch..., S, width] projection
// starts at element s * width + h * D (packed QKV: K and V at columns E and 2E), and Y is written
// as [batch..., S, heads * Dv], so no layout copies. A problem is one (batch index b, head h); Q, K
// and V's offsets are b * stride_b + h * stride_h, which cuBLASLt's single batch stride cannot
// express at once: the products batch the larger of the two axes and loop over the other (BERT at
// batch 32: 12 launches of 32 problems each; at batch 1: one launch of 12 heads).
//
// float32, float16 and bfloat16 data (tactic.h's dtype contract: Q, K, V, the mask and Y all in
// the tactic's dtype), float32 accumulation (CUBLAS_COMPUTE_32F, no TF32 unless sig.tf32), scores
// and softmax in float32, P and Y rounded once to the dtype. The mask is additive and broadcasts
// to the scores [batch..., Sq, Sk] along any dims; Q, K and V's batch dims must each be the
// problems' or all ones (shared), which is what fuse_attention produces for CUDA targets.
#include <cublasLt.h>

#include <algorithm>
#include <numeric>

#include "backends/cuda/cuda_attention.h"
#include "backends/cuda/cuda_attention_geometry.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_tactics.h"
#include "core/shape.h"
#include "ops/common.h"

namespace kiln::backends::cuda {

namespace {

constexpr size_t kGemmWorkspace = size_t{4} << 20;

Status lt_check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Internal("cuBLASLt: ", what, " failed: ", cublasLtGetStatusName(s), " (", cublasLtGetStatusString(s), ")");
}
#define KILN_LT_ATT(call) KILN_RETURN_IF_ERROR(lt_check((call), #call))

cudaDataType_t lt_type(DataType dt) {
  return dt == DataType::kFloat16 ? CUDA_R_16F : dt == DataType::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
}
FloatType kernel_type(DataType dt) {
  return dt == DataType::kFloat16 ? FloatType::kF16 : dt == DataType::kBFloat16 ? FloatType::kBF16 : FloatType::kF32;
}

struct LtDelete {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const { cublasLtMatrixLayoutDestroy(l); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using LayoutPtr = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LtDelete>;

// One strided-batched product D = alpha op(A) B (column-major, cuBLASLt's terms), launched `loops`
// times with the operands moved by their loop strides (elements).
struct Product {
  std::unique_ptr<cublasLtMatmulDescOpaque_t, LtDelete> desc;
  LayoutPtr a, b, d;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  float alpha = 1.f;
  int64_t loops = 1, a_loop = 0, b_loop = 0, d_loop = 0;  // element strides between launches
  size_t a_size = 4, b_size = 4, d_size = 4;              // element bytes
};

// The largest power of two <= 64 dividing every byte offset an operand's pointers take.
uint32_t alignment(size_t elem, std::initializer_list<int64_t> offsets) {
  uint64_t g = 64;
  for (int64_t o : offsets) g = std::gcd(g, static_cast<uint64_t>(o < 0 ? -o : o) * elem);
  uint32_t a = 1;
  while (a * 2 <= g && g % (a * 2) == 0 && a < 64) a *= 2;
  return a;
}

struct MatrixSpec {
  cudaDataType_t type;
  int64_t rows, cols, ld, batch_stride;
  uint32_t align;
};

Status make_layout(LayoutPtr& out, const MatrixSpec& m, int32_t batch) {
  cublasLtMatrixLayout_t l = nullptr;
  KILN_LT_ATT(
      cublasLtMatrixLayoutCreate(&l, m.type, static_cast<uint64_t>(m.rows), static_cast<uint64_t>(m.cols), m.ld));
  out.reset(l);
  if (batch > 1) {
    KILN_LT_ATT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
    int64_t s = m.batch_stride;
    KILN_LT_ATT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s));
  }
  return Status::Ok();
}

Status plan_product(Product* p, bool trans_a, const MatrixSpec& a, const MatrixSpec& b, const MatrixSpec& d,
                    int32_t batch, bool tf32, const char* what) {
  KILN_ASSIGN_OR_RETURN(void* hv, cublaslt_handle());
  cublasLtMatmulDesc_t desc = nullptr;
  KILN_LT_ATT(cublasLtMatmulDescCreate(&desc, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  p->desc.reset(desc);
  cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  KILN_LT_ATT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  KILN_LT_ATT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  KILN_RETURN_IF_ERROR(make_layout(p->a, a, batch));
  KILN_RETURN_IF_ERROR(make_layout(p->b, b, batch));
  KILN_RETURN_IF_ERROR(make_layout(p->d, d, batch));
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_LT_ATT(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, LtDelete> pref_owner(pref);
  size_t max_ws = kGemmWorkspace;
  KILN_LT_ATT(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws));
  // Partial sums only in the float32 compute type, never in a float16/bfloat16 output.
  uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  KILN_LT_ATT(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, a.align},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, b.align},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, d.align},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, d.align}};
  for (const auto& [attr, v] : aligns) KILN_LT_ATT(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof v));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  KILN_LT_ATT(cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(hv), desc, p->a.get(), p->b.get(),
                                             p->d.get(), p->d.get(), pref, 1, &result, &found));
  if (found < 1) return Unsupported("cuBLASLt's heuristic offers no algorithm for ", what);
  p->algo = result.algo;
  p->workspace = result.workspaceSize;
  return Status::Ok();
}

Status run_product(const Product& p, const void* a, const void* b, void* d, void* ws, cudaStream_t s) {
  KILN_ASSIGN_OR_RETURN(void* hv, cublaslt_handle());
  const float beta = 0.f;
  for (int64_t l = 0; l < p.loops; ++l) {
    const void* al = static_cast<const char*>(a) + l * p.a_loop * static_cast<int64_t>(p.a_size);
    const void* bl = static_cast<const char*>(b) + l * p.b_loop * static_cast<int64_t>(p.b_size);
    void* dl = static_cast<char*>(d) + l * p.d_loop * static_cast<int64_t>(p.d_size);
    KILN_LT_ATT(cublasLtMatmul(static_cast<cublasLtHandle_t>(hv), p.desc.get(), &p.alpha, al, p.a.get(), bl, p.b.get(),
                               &beta, dl, p.d.get(), dl, p.d.get(), &p.algo, ws, p.workspace, s));
  }
  return Status::Ok();
}

class PreparedCudaAttention : public PreparedLayer {
 public:
  AttentionGeometry g;
  DataType dtype = DataType::kFloat32;
  DeviceConstants consts;
  Product qk, pv;
  AttentionSoftmaxParams sm;
  size_t scores_bytes = 0, probs_bytes = 0;
  std::string name;

  std::vector<Dims> output_shapes() const override { return {g.out}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  size_t workspace_bytes(int) const override {
    return workspace_piece(scores_bytes) + workspace_piece(probs_bytes) +
           workspace_piece(std::max(qk.workspace, pv.workspace));
  }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    if (ctx.workspace_bytes < workspace_bytes(1)) return Internal(name, ": workspace too small");
    WorkspaceSlicer slice(ctx);
    auto* scores = static_cast<float*>(slice.take(scores_bytes));
    void* probs = slice.take(probs_bytes);
    void* gemm_ws = slice.take(std::max(qk.workspace, pv.workspace));
    const auto* q = static_cast<const char*>(consts.data(0, in));
    const char* k = static_cast<const char*>(consts.data(sig_k_, in));
    const char* v = static_cast<const char*>(consts.data(sig_v_, in));
    const void* mask = has_mask_ ? consts.data(3, in) : nullptr;
    if (!q || !k || !v || (has_mask_ && !mask)) return Internal(name, ": an input is missing");
    const size_t e = dtype_size(dtype);
    const cudaStream_t s = stream_of(ctx);
    // cuBLASLt's A is K (ours transposed), its B is Q: scores^T = K Q^T column-major.
    KILN_RETURN_IF_ERROR(run_product(qk, k + g.k.base * static_cast<int64_t>(e), q + g.q.base * static_cast<int64_t>(e),
                                     scores, gemm_ws, s));
    KILN_RETURN_IF_ERROR(cuda_status(
        launch_attention_softmax(scores, mask, probs, dims_numel(g.batch) * g.sq, sm, kernel_type(dtype), s),
        "attention_softmax_kernel"));
    // Y^T = V^T P^T column-major: cuBLASLt's A is V, its B is P.
    return run_product(pv, v + g.v.base * static_cast<int64_t>(e), probs, out[0]->raw(), gemm_ws, s);
  }

  size_t sig_k_ = 1, sig_v_ = 2;
  bool has_mask_ = false;
};

class AttentionCublasLt : public Tactic {
 public:
  explicit AttentionCublasLt(DataType dt) : dt_(dt) {}
  std::string name() const override {
    return dt_ == DataType::kFloat32   ? "attention_cublaslt_cuda"
           : dt_ == DataType::kFloat16 ? "attention_cublaslt_f16_cuda"
                                       : "attention_cublaslt_bf16_cuda";
  }
  TacticInfo info() const override { return {DeviceKind::kCUDA, kIsaPortable, dt_, {dt_}, {dt_}}; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"kiln", "Attention"}, {"kiln", "MultiHeadAttention"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override { return attention_why_unsupported(sig, dt_); }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (std::string why = why_unsupported(sig); !why.empty()) return Unsupported(name(), ": ", why);
    auto l = std::make_unique<PreparedCudaAttention>();
    l->name = name();
    l->dtype = dt_;
    AttentionGeometry& g = l->g;
    g = attention_geometry(sig);
    const bool packed = attention_packed(sig);
    l->sig_k_ = packed ? 0 : 1, l->sig_v_ = packed ? 0 : 2;
    l->has_mask_ = sig.has_input(3);
    KILN_RETURN_IF_ERROR(l->consts.upload(sig));
    const int64_t problems = g.nb * g.nh;
    // Workspace scores and P: problem (b, h) at (b * nh + h) * sq * ld, rows of sk elements ld apart
    // (ld: sk rounded up to 8, so that rows stay 16-byte aligned for cuBLASLt's faster kernels).
    const int64_t ld = (g.sk + 7) / 8 * 8;
    l->scores_bytes = static_cast<size_t>(problems * g.sq * ld) * sizeof(float);
    l->probs_bytes = static_cast<size_t>(problems * g.sq * ld) * dtype_size(dt_);
    const AttentionOperand sc = {0, g.nh * g.sq * ld, g.sq * ld, ld};
    // Batch the larger of the two problem axes, loop over the other.
    const bool batch_heads = g.nh > g.nb;
    const int64_t count = batch_heads ? g.nh : g.nb, loops = batch_heads ? g.nb : g.nh;
    if (count > 0x7fffffff) return Unsupported(name(), ": more than 2^31 problems in one product");
    auto bstride = [&](const AttentionOperand& o) { return batch_heads ? o.sh : o.sb; };
    auto lstride = [&](const AttentionOperand& o) { return batch_heads ? o.sb : o.sh; };
    const size_t e = dtype_size(dt_);
    const cudaDataType_t t = lt_type(dt_);
    auto spec = [&](cudaDataType_t type, size_t elem, const AttentionOperand& o, int64_t rows, int64_t cols) {
      return MatrixSpec{type, rows, cols, o.ld, bstride(o), alignment(elem, {o.base, o.ld, o.sb, o.sh})};
    };
    const auto n = static_cast<int32_t>(count);
    const bool tf32 = sig.tf32 && dt_ == DataType::kFloat32;  // FP32 math unless the build allows TF32
    // scores^T [sk, sq] = op(K) [sk, d] x Q^T [d, sq]; K stored [sk, d] rows (col-major [d, sk]: transposed)
    // or, k_transposed, [d, sk] rows (col-major [sk, d]).
    MatrixSpec ka = g.k_transposed ? spec(t, e, g.k, g.sk, g.d) : spec(t, e, g.k, g.d, g.sk);
    KILN_RETURN_IF_ERROR(plan_product(&l->qk, !g.k_transposed, ka, spec(t, e, g.q, g.d, g.sq),
                                      spec(CUDA_R_32F, 4, sc, g.sk, g.sq), n, tf32, "Q K'"));
    l->qk.alpha = sig.node->attr_float("scale", 1.f);
    l->qk.loops = loops, l->qk.a_loop = lstride(g.k), l->qk.b_loop = lstride(g.q), l->qk.d_loop = lstride(sc);
    l->qk.a_size = e, l->qk.b_size = e, l->qk.d_size = 4;
    // Y^T [dv, sq] = V^T [dv, sk] x P^T [sk, sq].
    KILN_RETURN_IF_ERROR(plan_product(&l->pv, false, spec(t, e, g.v, g.dv, g.sk), spec(t, e, sc, g.sk, g.sq),
                                      spec(t, e, g.y, g.dv, g.sq), n, tf32, "P V"));
    l->pv.loops = loops, l->pv.a_loop = lstride(g.v), l->pv.b_loop = lstride(sc), l->pv.d_loop = lstride(g.y);
    l->pv.a_size = e, l->pv.b_size = e, l->pv.d_size = e;
    l->sm = attention_softmax_params(g, sig, ld);
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }

 private:
  DataType dt_;
};

}  // namespace

std::vector<const Tactic*> attention_tactics() {
  static const AttentionCublasLt f32(DataType::kFloat32), f16(DataType::kFloat16), bf16(DataType::kBFloat16);
  return {&f32, &f16, &bf16};
}

}  // namespace kiln::backends::cuda
