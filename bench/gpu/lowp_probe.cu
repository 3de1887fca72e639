// Probe: how fast are the low-precision paths a resnet50 INT8/FP8 engine could use on this GPU?
// Times, for resnet50's convolution shapes at one batch (NHWC), each of:
//   f16   cuBLASLt FP16 GEMM (1x1) / cuDNN FP16 NHWC convolution (3x3)
//   fp8   cuBLASLt FP8 E4M3 GEMM, FP16 out, bias epilogue (1x1 only)
//   i8    cuBLASLt INT8 GEMM, int32 compute, int8 out (1x1 only)
//   i8x32 cuDNN legacy INT8x32 (NCHW_VECT_C) convolution, int8 out (1x1 and 3x3)
// Build (here) and run (on the GPU machine; ../shared/GPU.md):
//   nvcc -O2 -std=c++17 -gencode arch=compute_90,code=sm_90 bench/gpu/lowp_probe.cu -o lowp_probe -lcublasLt -lcudnn
//   ./lowp_probe 32 [graph]   (graph: 20 calls captured in a CUDA graph and replayed: GPU time)
// Output: one line per shape and path: microseconds per call (the fastest candidate algorithm; per candidate the
// median of 5 x 20 calls) and TFLOP/s; '-' where the library offers no algorithm.
#include <cublasLt.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#define CK(x)                                                           \
  do {                                                                  \
    auto e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                            \
      std::printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                     \
    }                                                                   \
  } while (0)
#define LT(x) ((x) == CUBLAS_STATUS_SUCCESS)
#define DN(x) ((x) == CUDNN_STATUS_SUCCESS)

struct Shape {
  int h, w, cin, cout, k;
};

// Every call goes to this stream, so that it can be captured: with "graph", time_us captures its 20
// calls into a CUDA graph and replays it (GPU time, as kiln's --use-cuda-graph runs), without it the
// calls are launched from the host one by one (small layers then measure cuBLASLt's host overhead).
static cudaStream_t g_stream;
static bool g_graph = false;

// Median microseconds per call of f over 5 x 20 calls; -1 when f fails.
static float time_us(const std::function<bool()>& f) {
  static cudaEvent_t a, b;
  if (!a) {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  if (!f()) return -1;
  cudaStreamSynchronize(g_stream);
  cudaGraphExec_t exec = nullptr;
  if (g_graph) {
    cudaGraph_t graph;
    cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal);
    bool ok = true;
    for (int i = 0; i < 20; ++i) ok = ok && f();
    if (cudaStreamEndCapture(g_stream, &graph) != cudaSuccess || !ok) return -1;
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return -1;
    cudaGraphDestroy(graph);
    cudaGraphLaunch(exec, g_stream);  // warm-up
  }
  std::vector<float> v;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(a, g_stream);
    if (exec) {
      cudaGraphLaunch(exec, g_stream);
    } else {
      for (int i = 0; i < 20; ++i) f();
    }
    cudaEventRecord(b, g_stream);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    v.push_back(ms * 1000 / 20);
  }
  if (exec) cudaGraphExecDestroy(exec);
  std::sort(v.begin(), v.end());
  return v[2];
}

static void* dev(size_t bytes) {
  void* p;
  CK(cudaMalloc(&p, bytes));
  CK(cudaMemset(p, 1, bytes));
  return p;
}

static cublasLtHandle_t lt;
static void* ws;
static size_t ws_bytes = 64 << 20;

// D[n x m] (col-major, ld n) = A^T[n x k] * B[k x m]: NHWC out [m][n] = X[m][k] * W[n][k]^T.
// Microseconds of the fastest of cuBLASLt's heuristic candidates; -1 (and why) when there is none.
static float gemm_us(cudaDataType ab, cudaDataType cd, cublasComputeType_t ct, cudaDataType st, int m, int n, int k,
                     bool bias, const char** why) {
  size_t esz = (ab == CUDA_R_16F) ? 2 : 1, osz = (cd == CUDA_R_16F) ? 2 : 1;
  void* A = dev(size_t(n) * k * esz);
  void* B = dev(size_t(k) * m * esz);
  void* D = dev(size_t(n) * m * osz);
  void* bv = dev(n * 4);
  cublasLtMatmulDesc_t op;
  cublasLtMatmulDescCreate(&op, ct, st);
  cublasOperation_t T = CUBLAS_OP_T, N = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &T, sizeof T);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &N, sizeof N);
  if (bias) {
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_RELU_BIAS;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bv, sizeof bv);
    cudaDataType bt = CUDA_R_16F;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
  }
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatrixLayoutCreate(&la, ab, k, n, k);
  cublasLtMatrixLayoutCreate(&lb, ab, k, m, k);
  cublasLtMatrixLayoutCreate(&lc, cd, n, m, n);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes);
  cublasLtMatmulHeuristicResult_t hr[8];
  int got = 0;
  if (!LT(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 8, hr, &got))) got = 0;
  static float alpha = 1.f, beta = 0.f;
  static int ialpha = 1, ibeta = 0;
  const void* pa = (st == CUDA_R_32I) ? (const void*)&ialpha : (const void*)&alpha;
  const void* pb = (st == CUDA_R_32I) ? (const void*)&ibeta : (const void*)&beta;
  float best = -1;
  for (int i = 0; i < got; ++i) {
    const cublasLtMatmulAlgo_t* algo = &hr[i].algo;
    float t = time_us(
        [=] { return LT(cublasLtMatmul(lt, op, pa, A, la, B, lb, pb, D, lc, D, lc, algo, ws, ws_bytes, g_stream)); });
    if (t > 0 && (best < 0 || t < best)) best = t;
  }
  if (best < 0) *why = "no cuBLASLt algorithm";
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  for (void* q : {A, B, D, bv}) cudaFree(q);
  return best;
}

static cudnnHandle_t dnn;
// Microseconds of the fastest legacy cuDNN algorithm for the convolution; -1 (and why) when none runs.
static float conv_us(int nb, const Shape& s, bool i8x32, const char** why) {
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t c;
  cudnnCreateTensorDescriptor(&x);
  cudnnCreateTensorDescriptor(&y);
  cudnnCreateFilterDescriptor(&w);
  cudnnCreateConvolutionDescriptor(&c);
  int pad = s.k / 2, oh = s.h, ow = s.w;
  cudnnDataType_t dt = i8x32 ? CUDNN_DATA_INT8x32 : CUDNN_DATA_HALF;
  cudnnTensorFormat_t fmt = i8x32 ? CUDNN_TENSOR_NCHW_VECT_C : CUDNN_TENSOR_NHWC;
  if (!DN(cudnnSetTensor4dDescriptor(x, fmt, dt, nb, s.cin, s.h, s.w)) ||
      !DN(cudnnSetTensor4dDescriptor(y, fmt, dt, nb, s.cout, oh, ow)) ||
      !DN(cudnnSetFilter4dDescriptor(w, dt, fmt, s.cout, s.cin, s.k, s.k))) {
    *why = "cuDNN refused a descriptor";
    return -1;
  }
  cudnnSetConvolution2dDescriptor(c, pad, pad, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                  i8x32 ? CUDNN_DATA_INT32 : CUDNN_DATA_FLOAT);
  cudnnSetConvolutionMathType(c, CUDNN_TENSOR_OP_MATH);
  size_t esz = i8x32 ? 1 : 2;
  void* X = dev(size_t(nb) * s.cin * s.h * s.w * esz);
  void* Y = dev(size_t(nb) * s.cout * oh * ow * esz);
  void* W = dev(size_t(s.cout) * s.cin * s.k * s.k * esz);
  static float alpha = 1.f, beta = 0.f;
  float best = -1;
  for (int a = 0; a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; ++a) {
    auto algo = cudnnConvolutionFwdAlgo_t(a);
    size_t need = 0;
    if (!DN(cudnnGetConvolutionForwardWorkspaceSize(dnn, x, w, c, y, algo, &need)) || need > ws_bytes) continue;
    float t = time_us(
        [=] { return DN(cudnnConvolutionForward(dnn, &alpha, x, X, w, W, c, algo, ws, ws_bytes, &beta, y, Y)); });
    if (t > 0 && (best < 0 || t < best)) best = t;
  }
  if (best < 0) *why = "no cuDNN algorithm";
  cudnnDestroyTensorDescriptor(x);
  cudnnDestroyTensorDescriptor(y);
  cudnnDestroyFilterDescriptor(w);
  cudnnDestroyConvolutionDescriptor(c);
  for (void* q : {X, Y, W}) cudaFree(q);
  return best;
}

int main(int argc, char** argv) {
  int nb = argc > 1 ? std::atoi(argv[1]) : 32;
  g_graph = argc > 2 && std::string(argv[2]) == "graph";
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  cublasLtCreate(&lt);
  cudnnCreate(&dnn);
  cudnnSetStream(dnn, g_stream);
  ws = dev(ws_bytes);
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  std::printf("%s, batch %d, cuDNN %zu, cuBLASLt %zu, %s\n", p.name, nb, cudnnGetVersion(), cublasLtGetVersion(),
              g_graph ? "20 calls captured in a CUDA graph, replayed (GPU time)" : "20 calls launched from the host");
  // resnet50's distinct convolution shapes (stride 1 forms; h, w, cin, cout, k) and how often each occurs
  std::vector<std::pair<Shape, int>> shapes = {
      {{56, 56, 64, 64, 1}, 1},    {{56, 56, 64, 256, 1}, 4},  {{56, 56, 256, 64, 1}, 2},  {{56, 56, 64, 64, 3}, 3},
      {{28, 28, 128, 512, 1}, 5},  {{28, 28, 512, 128, 1}, 3}, {{28, 28, 128, 128, 3}, 4}, {{14, 14, 256, 1024, 1}, 7},
      {{14, 14, 1024, 256, 1}, 5}, {{14, 14, 256, 256, 3}, 6}, {{7, 7, 512, 2048, 1}, 4},  {{7, 7, 2048, 512, 1}, 2},
      {{7, 7, 512, 512, 3}, 3}};
  double tot[4] = {0, 0, 0, 0};
  const char* names[4] = {"f16", "fp8", "i8", "i8x32"};
  for (auto& [s, count] : shapes) {
    int m = nb * s.h * s.w;
    double flop = 2.0 * m * s.cout * s.cin * s.k * s.k;
    float t[4] = {-1, -1, -1, -1};
    const char* why = "";
    if (s.k == 1) {
      t[0] = gemm_us(CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, m, s.cout, s.cin, true, &why);
      t[1] = gemm_us(CUDA_R_8F_E4M3, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, m, s.cout, s.cin, true, &why);
      t[2] = gemm_us(CUDA_R_8I, CUDA_R_8I, CUBLAS_COMPUTE_32I, CUDA_R_32F, m, s.cout, s.cin, false, &why);
    } else {
      t[0] = conv_us(nb, s, false, &why);
    }
    t[3] = conv_us(nb, s, true, &why);
    std::printf("%2dx%-2d %4d->%-4d k%d x%d:", s.h, s.w, s.cin, s.cout, s.k, count);
    for (int i = 0; i < 4; ++i) {
      if (t[i] > 0) {
        std::printf("  %s %7.1f us %5.0f TF/s", names[i], t[i], flop / t[i] / 1e6);
        tot[i] += t[i] * count;
      } else
        std::printf("  %s      -              ", names[i]);
    }
    std::printf("  %s\n", why);
  }
  std::printf(
      "sum over resnet50's convolutions (weighted by count, stride-1 forms): f16 %.0f us, fp8 (1x1 only) %.0f, i8 "
      "(1x1) %.0f, i8x32 %.0f\n",
      tot[0], tot[1], tot[2], tot[3]);
}
