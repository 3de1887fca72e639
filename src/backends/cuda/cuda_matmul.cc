// cuBLASLt matrix products: MatMul, Gemm, kiln.FusedMatMul and kiln.FusedGemm in float32 (TF32
// tensor cores only when the build allows them: kiln build --tf32), with the bias and ReLU/GELU(tanh)
// epilogues fused (in FP16/BF16 GELU(erf) too, as its tanh form, unless kiln build --exact-gelu), a residual added
// through cuBLASLt's C matrix (beta = 1), and any other activation run by kiln's unary kernel over the output. The
// heuristic's candidates are tactics of their own (matmul_cublaslt_h<k>: its k-th algorithm), so the tuner times them
// on the real shape.
//
// FP16 and BF16 (matmul_cublaslt_f16_h<k>, matmul_cublaslt_bf16_h<k>): A, B, the bias, C/Residual and
// Y all in that dtype (tactic.h's dtype contract), accumulation and the epilogue in float32
// (CUBLAS_COMPUTE_32F with float alpha/beta), the output rounded once.
//
// Row-major Y[M, N] = op(A)[M, K] op(B)[K, N] is column-major Y^T = op(B)^T op(A)^T: cuBLASLt is
// called with the operands swapped and each stored matrix read as its own transpose.
#include <cublasLt.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_tactics.h"
#include "core/shape.h"

namespace kiln::backends::cuda {

namespace {

constexpr size_t kMaxWorkspace = size_t{32} << 20;
constexpr int kHeuristicRanks = 4;

Status lt_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Internal("cuBLASLt: ", what, " failed: ", cublasLtGetStatusName(s), " (", cublasLtGetStatusString(s), ")");
}
#define KILN_LT(call) KILN_RETURN_IF_ERROR(lt_status((call), #call))

// What the layer computes, in row-major terms.
struct Geometry {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool trans_a = false, trans_b = false;
  int64_t stride_a = 0, stride_b = 0;  // batch strides in elements (0: shared)
  float alpha = 1.f, beta = 0.f;       // beta: for the C matrix (Gemm C or the residual)
  int bias = -1;                       // input holding a bias vector of N (epilogue), or -1
  int c_matrix = -1;                   // input holding a matrix of Y's shape (C), or -1
  float bias_scale = 1.f;              // Gemm's beta when C is a bias vector
  Dims out;
  UnaryParams act;                  // the activation, when not fused into the epilogue
  bool relu = false, gelu = false;  // fused into the epilogue
};

bool is_fused(const LayerSignature& sig) { return sig.domain() == "kiln"; }
bool is_gemm(const LayerSignature& sig) { return sig.op() == "Gemm" || sig.op() == "FusedGemm"; }

cudaDataType_t cuda_dtype(DataType dt) {
  return dt == DataType::kFloat16 ? CUDA_R_16F : dt == DataType::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
}
FloatType float_type(DataType dt) {
  return dt == DataType::kFloat16 ? FloatType::kF16 : dt == DataType::kBFloat16 ? FloatType::kBF16 : FloatType::kF32;
}

// The geometry of the layer, or why cuBLASLt is not used for it; every input of dtype `dt`.
std::string geometry(const LayerSignature& sig, DataType dt, Geometry* g) {
  const ir::Node& n = *sig.node;
  for (size_t i = 0; i < sig.inputs.size(); ++i)
    if (sig.inputs[i].present && sig.inputs[i].dtype != dt)
      return "input " + std::to_string(i) + " is " + dtype_name(sig.inputs[i].dtype) + ", not " + dtype_name(dt);
  if (!sig.has_input(0) || !sig.has_input(1)) return "no A or B";
  const Dims &a = sig.inputs[0].shape, &b = sig.inputs[1].shape;
  if (a.size() < 2 || b.size() < 2) return "a 1-D operand";
  if (!sig.fully_known()) return "";  // checked at prepare time
  std::string act = is_fused(sig) ? n.attr_string("activation", "") : "";
  if (is_gemm(sig)) {
    if (a.size() != 2 || b.size() != 2) return "Gemm operands are not 2-D";
    g->trans_a = n.attr_int("transA", 0) != 0, g->trans_b = n.attr_int("transB", 0) != 0;
    g->m = g->trans_a ? a[1] : a[0], g->k = g->trans_a ? a[0] : a[1];
    int64_t kb = g->trans_b ? b[1] : b[0];
    g->n = g->trans_b ? b[0] : b[1];
    if (kb != g->k) return "inner dimensions differ";
    g->alpha = n.attr_float("alpha", 1.f);
    float beta = n.attr_float("beta", 1.f);
    g->out = {g->m, g->n};
    if (sig.has_input(2)) {
      const Dims& c = sig.inputs[2].shape;
      if (dims_numel(c) == g->n && (c.size() == 1 || (c.size() == 2 && c[0] == 1))) {
        if (!sig.inputs[2].constant) return "the bias C is not a constant";
        g->bias = 2, g->bias_scale = beta;
      } else if (c == g->out) {
        g->c_matrix = 2, g->beta = beta;
      } else {
        return "C broadcasts other than as a row vector";
      }
    }
  } else {
    // MatMul: B 2-D (A's batch folded into M), or A and B with the same batch dims, or A 2-D (shared).
    g->m = a[a.size() - 2], g->k = a.back(), g->n = b.back();
    if (b[b.size() - 2] != g->k) return "inner dimensions differ";
    Dims ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
    if (bb.empty()) {
      g->m *= dims_numel(ab);
      g->out = ab;
    } else if (ab == bb) {
      g->batch = dims_numel(ab), g->stride_a = g->m * g->k, g->stride_b = g->k * g->n;
      g->out = ab;
    } else if (ab.empty()) {
      g->batch = dims_numel(bb), g->stride_a = 0, g->stride_b = g->k * g->n;
      g->out = bb;
    } else {
      return "batch dims broadcast";
    }
    g->out.push_back(a[a.size() - 2]);
    g->out.push_back(g->n);
    if (is_fused(sig) && sig.has_input(2)) {
      const Dims& c = sig.inputs[2].shape;
      if (dims_numel(c) != g->n || c.empty() || c.back() != g->n) return "Bias is not a vector of N";
      if (!sig.inputs[2].constant) return "Bias is not a constant";
      g->bias = 2;
    }
  }
  if (is_fused(sig) && sig.has_input(3)) {
    if (sig.inputs[3].shape != g->out) return "Residual does not have the output's shape";
    if (g->c_matrix >= 0) return "both C and Residual";
    g->c_matrix = 3, g->beta = 1.f;
  }
  if (act == "Relu") {
    g->relu = true;
  } else if (act == "Gelu" && n.attr_string("activation_approximate", "none") == "tanh") {
    g->gelu = true;
  } else if (act == "Gelu" && dt != DataType::kFloat32 && !sig.exact_gelu) {
    // Reduced precision: erf's GELU in cuBLASLt's epilogue as its tanh form (|difference| <= 4.7e-4,
    // under half a float16 step for |y| >= 1), a pass over the output saved; kiln build counts these
    // layers (gelu_as_tanh) and --exact-gelu keeps erf.
    g->gelu = true;
  } else if (act == "Gelu") {
    g->act.op = UnaryOp::kGelu;
  } else if (act == "Sigmoid") {
    g->act.op = UnaryOp::kSigmoid;
  } else if (act == "Tanh") {
    g->act.op = UnaryOp::kTanh;
  } else if (act == "SiLU") {
    g->act.op = UnaryOp::kSilu;
  } else if (act == "HardSwish") {
    g->act.op = UnaryOp::kHardSwish;
  } else if (act == "LeakyRelu") {
    g->act = {UnaryOp::kLeakyRelu, n.attr_float("activation_alpha", 0.01f), 0};
  } else if (act == "HardSigmoid") {
    g->act = {UnaryOp::kHardSigmoid, n.attr_float("activation_alpha", 0.2f), n.attr_float("activation_beta", 0.5f)};
  } else if (act == "Clip") {
    g->act = {UnaryOp::kClip, n.attr_float("activation_min", -INFINITY), n.attr_float("activation_max", INFINITY)};
  } else if (!act.empty()) {
    return "activation " + act + " has no CUDA kernel";
  }
  if (g->m * g->n == 0) return "an empty output";
  return "";
}

struct LtDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const { cublasLtMatrixLayoutDestroy(l); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};

class PreparedLtMatmul : public PreparedLayer {
 public:
  Geometry g;
  DeviceConstants consts;
  std::unique_ptr<cublasLtMatmulDescOpaque_t, LtDeleter> desc;
  std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LtDeleter> la, lb, lc;  // cuBLASLt's A (our B), B (our A), C/D
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  Tensor bias;  // scaled copy on the device (Gemm beta != 1), else consts' copy
  std::string name;
  DataType dtype = DataType::kFloat32;

  std::vector<Dims> output_shapes() const override { return {g.out}; }
  std::vector<DataType> output_dtypes() const override { return {dtype}; }
  size_t workspace_bytes(int) const override { return workspace; }
  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    KILN_ASSIGN_OR_RETURN(void* h, cublaslt_handle());
    const void* a = consts.data(0, in);
    const void* b = consts.data(1, in);
    void* y = out[0]->raw();
    const void* c = g.c_matrix >= 0 ? consts.data(static_cast<size_t>(g.c_matrix), in) : y;
    if (workspace && ctx.workspace_bytes < workspace) return Internal(name, ": workspace too small");
    const cublasStatus_t st =
        cublasLtMatmul(static_cast<cublasLtHandle_t>(h), desc.get(), &g.alpha, b, la.get(), a, lb.get(), &g.beta, c,
                       lc.get(), y, lc.get(), &algo, ctx.workspace, workspace, stream_of(ctx));
    if (st != CUBLAS_STATUS_SUCCESS) {
      // What the algorithm was given: the heuristic assumed 64-byte aligned operands.
      auto mis = [](const void* p) { return std::to_string(reinterpret_cast<uintptr_t>(p) % 256); };
      return Internal(name, ": cublasLtMatmul failed: ", cublasLtGetStatusName(st), " (", cublasLtGetStatusString(st),
                      "); m ", g.m, " n ", g.n, " k ", g.k, " batch ", g.batch, ", pointer offsets mod 256: A ", mis(a),
                      " B ", mis(b), " C ", mis(c), " Y ", mis(y), " workspace ", mis(ctx.workspace), " (", workspace,
                      " bytes of ", ctx.workspace_bytes, "), C ", c == y ? "is" : "is not", " Y");
    }
    if (g.act.op != UnaryOp::kIdentity)
      KILN_RETURN_IF_ERROR(cuda_status(
          launch_unary(out[0]->raw(), out[0]->raw(), dims_numel(g.out), g.act, float_type(dtype), stream_of(ctx)),
          name.c_str()));
    return Status::Ok();
  }
};

class LtMatmul : public Tactic {
 public:
  LtMatmul(int rank, bool tf32, DataType dt = DataType::kFloat32) : rank_(rank), tf32_(tf32), dt_(dt) {}
  std::string name() const override {
    const char* prefix = tf32_                        ? "tf32_"
                         : dt_ == DataType::kFloat16  ? "f16_"
                         : dt_ == DataType::kBFloat16 ? "bf16_"
                                                      : "";
    return std::string("matmul_cublaslt_") + prefix + "h" + std::to_string(rank_);
  }
  TacticInfo info() const override { return {DeviceKind::kCUDA, kIsaPortable, dt_, {dt_}, {dt_}}; }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{"", "MatMul"}, {"", "Gemm"}, {"kiln", "FusedMatMul"}, {"kiln", "FusedGemm"}};
  }
  std::string why_unsupported(const LayerSignature& sig) const override {
    if (tf32_ && !sig.tf32) return "TF32 is not allowed (kiln build --tf32)";
    Geometry g;
    return geometry(sig, dt_, &g);
  }
  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    auto l = std::make_unique<PreparedLtMatmul>();
    l->name = name();
    l->dtype = dt_;
    Geometry& g = l->g;
    if (std::string why = geometry(sig, dt_, &g); !why.empty()) return Unsupported(why);
    KILN_RETURN_IF_ERROR(l->consts.upload(sig));
    KILN_ASSIGN_OR_RETURN(void* hv, cublaslt_handle());
    auto h = static_cast<cublasLtHandle_t>(hv);

    cublasLtMatmulDesc_t desc = nullptr;
    KILN_LT(cublasLtMatmulDescCreate(&desc, tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
    l->desc.reset(desc);
    const cudaDataType_t type = cuda_dtype(dt_);
    // cuBLASLt's first operand is our B^T [N, K]: stored B [K, N] row-major is exactly that, column-major.
    cublasOperation_t op_first = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_second = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    KILN_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
    KILN_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (g.bias >= 0)
      epi = g.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : g.gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    else
      epi = g.relu ? CUBLASLT_EPILOGUE_RELU : g.gelu ? CUBLASLT_EPILOGUE_GELU : CUBLASLT_EPILOGUE_DEFAULT;
    KILN_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (g.bias >= 0) {
      const void* bias = l->consts.data(static_cast<size_t>(g.bias), {});
      if (g.bias_scale != 1.f) {  // Gemm's beta scales its C: a scaled copy
        Tensor scaled = sig.inputs[static_cast<size_t>(g.bias)].constant->clone();
        for (int64_t i = 0; i < scaled.numel(); ++i) scaled.set_f64(i, scaled.get_f64(i) * g.bias_scale);
        KILN_ASSIGN_OR_RETURN(l->bias, to_device(runtime(), sig.device.index, scaled, nullptr));
        KILN_RETURN_IF_ERROR(runtime().synchronize(nullptr));
        bias = l->bias.raw();
      }
      KILN_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
      KILN_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type));
    }
    auto layout = [&](std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LtDeleter>& out, int64_t rows, int64_t cols,
                      int64_t ld, int64_t stride) -> Status {
      cublasLtMatrixLayout_t m = nullptr;
      KILN_LT(cublasLtMatrixLayoutCreate(&m, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
      out.reset(m);
      if (g.batch > 1) {
        int32_t count = static_cast<int32_t>(g.batch);
        KILN_LT(cublasLtMatrixLayoutSetAttribute(m, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
        KILN_LT(
            cublasLtMatrixLayoutSetAttribute(m, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
      }
      return Status::Ok();
    };
    // Column-major shapes as stored (before the op): B stored [K, N] row-major is [N, K] column-major.
    KILN_RETURN_IF_ERROR(g.trans_b ? layout(l->la, g.k, g.n, g.k, g.stride_b)
                                   : layout(l->la, g.n, g.k, g.n, g.stride_b));
    KILN_RETURN_IF_ERROR(g.trans_a ? layout(l->lb, g.m, g.k, g.m, g.stride_a)
                                   : layout(l->lb, g.k, g.m, g.k, g.stride_a));
    KILN_RETURN_IF_ERROR(layout(l->lc, g.n, g.m, g.n, g.m * g.n));

    cublasLtMatmulPreference_t pref = nullptr;
    KILN_LT(cublasLtMatmulPreferenceCreate(&pref));
    std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, LtDeleter> pref_owner(pref);
    size_t max_ws = kMaxWorkspace;
    KILN_LT(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws));
    // FP32 accumulation throughout: a split-K algorithm must not add its partial sums in an FP16/BF16
    // output (CUBLASLT_REDUCTION_SCHEME_INPLACE / OUTPUT_TYPE), only in the compute type.
    if (dt_ != DataType::kFloat32) {
      uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      KILN_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                   sizeof schemes));
    }
    // The arena gives tensors 64-byte alignment (memory_planner.h), not the 256 the heuristic assumes.
    uint32_t align = 64;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      KILN_LT(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align));
    cublasLtMatmulHeuristicResult_t results[kHeuristicRanks] = {};
    int found = 0;
    KILN_LT(cublasLtMatmulAlgoGetHeuristic(h, desc, l->la.get(), l->lb.get(), l->lc.get(), l->lc.get(), pref,
                                           kHeuristicRanks, results, &found));
    if (found <= rank_)
      return Unsupported("cuBLASLt's heuristic offers ", found, " algorithm(s) for this layer, not a rank-", rank_,
                         " one");
    l->algo = results[rank_].algo;
    l->workspace = results[rank_].workspaceSize;
    return std::unique_ptr<PreparedLayer>(std::move(l));
  }

 private:
  int rank_;
  bool tf32_;
  DataType dt_;
};

}  // namespace

std::vector<const Tactic*> matmul_tactics() {
  static const LtMatmul fp32[kHeuristicRanks] = {{0, false}, {1, false}, {2, false}, {3, false}};
  static const LtMatmul tf32[kHeuristicRanks] = {{0, true}, {1, true}, {2, true}, {3, true}};
  static const LtMatmul f16[kHeuristicRanks] = {{0, false, DataType::kFloat16},
                                                {1, false, DataType::kFloat16},
                                                {2, false, DataType::kFloat16},
                                                {3, false, DataType::kFloat16}};
  static const LtMatmul bf16[kHeuristicRanks] = {{0, false, DataType::kBFloat16},
                                                 {1, false, DataType::kBFloat16},
                                                 {2, false, DataType::kBFloat16},
                                                 {3, false, DataType::kBFloat16}};
  std::vector<const Tactic*> v;
  for (const auto& t : fp32) v.push_back(&t);
  for (const auto& t : tf32) v.push_back(&t);
  for (const auto& t : f16) v.push_back(&t);
  for (const auto& t : bf16) v.push_back(&t);
  return v;
}

}  // namespace kiln::backends::cuda
