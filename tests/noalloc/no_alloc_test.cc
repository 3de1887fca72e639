// A steady-state ExecutionContext::run allocates nothing (issue 11): every heap allocation of the
// process is counted around runs of a context whose shapes do not change. Its own executable, since
// it replaces malloc and friends (glibc lets the executable interpose them; libstdc++'s operator new
// goes through them too), which would slow and disturb the other tests.
//
// kiln's allocations must be zero. Allocations inside a LibraryCallScope (core/library_scope.h: the
// oneDNN API's per-call memory objects and argument maps) or made by oneDNN's own code (its OpenMP
// workers, outside that scope: told by the backtrace) are counted apart and must be small (no
// buffer: scratch comes from the workspace); their count is reported. KILN_NOALLOC_TRACE=1
// prints a backtrace of each kiln allocation (to find where one comes from).
#include <dlfcn.h>
#include <execinfo.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <sstream>

#include "../unit/backends/layer_case.h"
#include "../unit/graph_builder.h"
#include "backends/registry.h"
#include "core/library_scope.h"
#include "core/parallel.h"
#include "engine/engine_impl.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "ops/interpreter.h"
#include "passes/pass.h"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);
}

namespace {
std::atomic<bool> g_armed{false};
std::atomic<long> g_kiln{0}, g_library{0};
std::atomic<size_t> g_largest_library{0};
// kiln's allocations of buffers (4 KiB and more: tensor bytes, not bookkeeping), their bytes and the largest.
constexpr size_t kBufferBytes = 4096;
std::atomic<long> g_kiln_buffers{0};
std::atomic<size_t> g_kiln_bytes{0}, g_largest_kiln{0};
thread_local bool t_tracing = false;
const bool g_trace = [] {
  const char* s = std::getenv("KILN_NOALLOC_TRACE");
  return s && *s && *s != '0';
}();

// Whether the allocating call comes from oneDNN's own code: its OpenMP workers allocate small
// per-call objects inside a primitive's parallel region, on threads outside the LibraryCallScope.
bool from_onednn() {
  void* frames[32];
  t_tracing = true;
  int k = backtrace(frames, 32);
  t_tracing = false;
  for (int i = 2; i < k; ++i) {
    Dl_info info;
    if (dladdr(frames[i], &info) && info.dli_fname && std::strstr(info.dli_fname, "libdnnl")) return true;
  }
  return false;
}
// backtrace() loads libgcc on its first call: done before any run is counted.
const bool g_backtrace_ready = [] {
  void* f[2];
  return backtrace(f, 2) > 0;
}();

void trace(const char* what, size_t n) {
  t_tracing = true;
  void* frames[24];
  int k = backtrace(frames, 24);
  std::fprintf(stderr, "---- %s of %zu bytes during a steady-state run:\n", what, n);
  backtrace_symbols_fd(frames, k, 2);
  t_tracing = false;
}

void note(size_t n) {
  if (!g_armed.load(std::memory_order_relaxed) || t_tracing) return;
  if (kiln::library_call_depth() > 0 || from_onednn()) {
    ++g_library;
    size_t prev = g_largest_library.load();
    while (n > prev && !g_largest_library.compare_exchange_weak(prev, n)) {
    }
    if (g_trace && n > kBufferBytes) trace("library allocation", n);
    return;
  }
  ++g_kiln;
  g_kiln_bytes += n;
  if (n >= kBufferBytes) ++g_kiln_buffers;
  size_t prev = g_largest_kiln.load();
  while (n > prev && !g_largest_kiln.compare_exchange_weak(prev, n)) {
  }
  if (g_trace) trace("kiln allocation", n);
}
}  // namespace

extern "C" {
void* malloc(size_t n) {
  note(n);
  return __libc_malloc(n);
}
void free(void* p) { __libc_free(p); }
void* calloc(size_t a, size_t b) {
  note(a * b);
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  note(n);
  return __libc_realloc(p, n);
}
void* memalign(size_t align, size_t n) {
  note(n);
  return __libc_memalign(align, n);
}
void* aligned_alloc(size_t align, size_t n) {
  note(n);
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, size_t align, size_t n) {
  note(n);
  void* p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
}

namespace kiln {
namespace {

using testing::GraphBuilder;
using testing::random_tensor;

struct Counts {
  long kiln = 0, library = 0;
  size_t largest_library = 0;
  long kiln_buffers = 0;  // of `kiln`, those of kBufferBytes or more
  size_t kiln_bytes = 0, largest_kiln = 0;
};

template <typename F>
Counts count(F&& f) {
  g_kiln = 0, g_library = 0, g_largest_library = 0, g_kiln_buffers = 0, g_kiln_bytes = 0, g_largest_kiln = 0;
  g_armed = true;
  f();
  g_armed = false;
  return {g_kiln.load(),         g_library.load(),    g_largest_library.load(),
          g_kiln_buffers.load(), g_kiln_bytes.load(), g_largest_kiln.load()};
}

// Inputs for every engine input: random floats, zeros for integers (valid indices and masks), dims of
// -1 taken as `dynamic_dim`.
std::vector<std::pair<std::string, HostTensor>> inputs_for(const Engine& e, int64_t dynamic_dim = 1) {
  std::vector<std::pair<std::string, HostTensor>> out;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const TensorDesc& d : e.inputs()) {
    std::vector<int64_t> shape = d.shape;
    for (auto& x : shape)
      if (x < 0) x = dynamic_dim;
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    const size_t es = dtype_size(static_cast<DataType>(d.dtype));
    auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[std::max<size_t>(1, static_cast<size_t>(n) * es)]());
    if (d.dtype == kFloat32)
      for (int64_t i = 0; i < n; ++i) reinterpret_cast<float*>(buf.get())[i] = u(rng);
    HostTensor t = HostTensor::borrow(d.dtype, shape, buf.get(), static_cast<size_t>(n) * es);
    t.data = std::shared_ptr<const void>(buf, buf.get());
    out.emplace_back(d.name, std::move(t));
  }
  return out;
}

// The second and third runs of one context at the same shapes: no kiln allocation; the library's
// per-call objects few, small and the same each run. Returns the second run's counts.
Counts expect_steady_state_free(const Engine& e, const std::string& what, int64_t dynamic_dim = 1) {
  auto ctx = e.create_context();
  for (auto& [name, t] : inputs_for(e, dynamic_dim)) ctx->set_input(name, t);
  ctx->run();  // the first run at these shapes binds the steady-state path
  Counts second = count([&] { ctx->run(); });
  Counts third = count([&] { ctx->run(); });
  const std::string blocker = detail::steady_state_blocker(ctx->impl());
  std::printf(
      "[noalloc] %s: steady-state run: %ld kiln allocation(s) (%ld of >= %zu bytes; %zu bytes in all, largest %zu), "
      "%ld inside oneDNN calls (largest %zu bytes)%s\n",
      what.c_str(), second.kiln, second.kiln_buffers, kBufferBytes, second.kiln_bytes, second.largest_kiln,
      second.library, second.largest_library, blocker.empty() ? "" : ("; interpreter loop: " + blocker).c_str());
  EXPECT_EQ(second.kiln, 0) << what << ": rerun with KILN_NOALLOC_TRACE=1 to see where";
  EXPECT_EQ(third.kiln, 0) << what;
  // oneDNN's workers allocate a varying few per run (which thread takes which chunk): bounded, not equal.
  EXPECT_LE(third.library, 2 * second.library + 64) << what << ": the library's allocations grow from run to run";
  EXPECT_LE(second.largest_library, size_t{4096}) << what << ": a buffer allocated inside a library call";
  return second;
}

std::shared_ptr<Engine> build(const ir::Model& m, std::vector<std::string> tactics = {}) {
  BuilderConfig cfg;
  cfg.tactics = std::move(tactics);
  cfg.warn = [](const std::string&) {};
  return Builder(cfg).build_from_memory(onnx_import::serialize_model(m).value());
}

void set_pool(ir::Node& n, int64_t k, int64_t s, int64_t p) {
  GraphBuilder::set_ints(n, "kernel_shape", {k, k});
  GraphBuilder::set_ints(n, "strides", {s, s});
  if (p) GraphBuilder::set_ints(n, "pads", {p, p, p, p});
}

// A small ResNet/Inception-like CNN: 7x7 stride-2 stem, max pool, a residual block of 3x3 convs,
// two branches (1x1 and 3x3) concatenated, a depthwise conv, average pool, global pool, classifier.
// With the layout pass these become blocked convs, blocked pooling and a blocked concat.
ir::Model cnn() {
  GraphBuilder b(13);
  b.input("x", {1, 3, 33, 35}).output("logits");
  b.init("w0", random_tensor({32, 3, 7, 7}, 1)).init("b0", random_tensor({32}, 2));
  b.init("w1", random_tensor({32, 32, 3, 3}, 3)).init("w2", random_tensor({32, 32, 3, 3}, 4));
  b.init("wa", random_tensor({16, 32, 1, 1}, 5)).init("wb", random_tensor({24, 32, 3, 3}, 6));
  b.init("wd", random_tensor({40, 1, 3, 3}, 7)).init("fc", random_tensor({10, 40}, 8));
  b.init("fcb", random_tensor({10}, 9));
  b.conv({"x", "w0", "b0"}, "c0", 3, 2);
  b.node("Relu", {"c0"}, {"r0"});
  set_pool(b.node("MaxPool", {"r0"}, {"p0"}), 3, 2, 1);
  b.conv({"p0", "w1"}, "c1", 1);
  b.node("Relu", {"c1"}, {"r1"});
  b.conv({"r1", "w2"}, "c2", 1);
  b.node("Add", {"c2", "p0"}, {"s2"});
  b.node("Relu", {"s2"}, {"r2"});
  b.conv({"r2", "wa"}, "ba");
  b.conv({"r2", "wb"}, "bb", 1);
  GraphBuilder::set_int(b.node("Concat", {"ba", "bb"}, {"cat"}), "axis", 1);
  b.node("Relu", {"cat"}, {"rc"});
  b.conv({"rc", "wd"}, "d", 1, 1, 40);
  set_pool(b.node("AveragePool", {"d"}, {"ap"}), 2, 2, 0);
  b.node("GlobalAveragePool", {"ap"}, {"g"});
  b.node("Flatten", {"g"}, {"f"});
  b.gemm_t({"f", "fc", "fcb"}, "logits");
  return b.finish();
}

// An MLP and a self-attention block: MatMul+Add+Relu layers, LayerNormalization, Q/K/V projections,
// scaled scores, Softmax, the weighted sum, an output projection and a residual.
ir::Model mlp_attention() {
  const int64_t s = 12, d = 32, h = 4, dh = d / h;
  GraphBuilder b(17);
  b.input("x", {1, s, d}).output("y");
  b.init("w1", random_tensor({d, 64}, 1)).init("b1", random_tensor({64}, 2));
  b.init("w2", random_tensor({64, d}, 3)).init("b2", random_tensor({d}, 4));
  b.init("ln_s", random_tensor({d}, 5)).init("ln_b", random_tensor({d}, 6));
  for (const char* p : {"q", "k", "v", "o"})
    b.init(std::string("w") + p, random_tensor({d, d}, 10 + p[0]))
        .init(std::string("b") + p, random_tensor({d}, 20 + p[0]));
  b.init("heads", Tensor::from_vector<int64_t>(DataType::kInt64, {4}, {1, s, h, dh}));
  b.init("merged", Tensor::from_vector<int64_t>(DataType::kInt64, {3}, {1, s, d}));
  b.init("scale", Tensor::scalar<float>(DataType::kFloat32, 1.0f / std::sqrt(static_cast<float>(dh))));
  b.node("MatMul", {"x", "w1"}, {"m1"});
  b.node("Add", {"m1", "b1"}, {"a1"});
  b.node("Relu", {"a1"}, {"r1"});
  b.node("MatMul", {"r1", "w2"}, {"m2"});
  b.node("Add", {"m2", "b2"}, {"a2"});
  b.node("Add", {"a2", "x"}, {"res1"});
  auto& ln = b.node("LayerNormalization", {"res1", "ln_s", "ln_b"}, {"n"});
  GraphBuilder::set_int(ln, "axis", -1);
  for (const char* p : {"q", "k", "v"}) {
    std::string P = p;
    b.node("MatMul", {"n", "w" + P}, {P + "m"});
    b.node("Add", {P + "m", "b" + P}, {P + "a"});
    b.node("Reshape", {P + "a", "heads"}, {P + "r"});
    GraphBuilder::set_ints(b.node("Transpose", {P + "r"}, {P + "t"}), "perm",
                           P == "k" ? std::vector<int64_t>{0, 2, 3, 1} : std::vector<int64_t>{0, 2, 1, 3});
  }
  b.node("MatMul", {"qt", "kt"}, {"sc"});
  b.node("Mul", {"sc", "scale"}, {"scs"});
  GraphBuilder::set_int(b.node("Softmax", {"scs"}, {"p"}), "axis", -1);
  b.node("MatMul", {"p", "vt"}, {"ctx"});
  GraphBuilder::set_ints(b.node("Transpose", {"ctx"}, {"ctxt"}), "perm", {0, 2, 1, 3});
  b.node("Reshape", {"ctxt", "merged"}, {"cm"});
  b.node("MatMul", {"cm", "wo"}, {"om"});
  b.node("Add", {"om", "bo"}, {"oa"});
  b.node("Add", {"oa", "n"}, {"y"});
  return b.finish();
}

TEST(NoAlloc, TheCounterSeesAllocations) {
  Counts c = count([] {
    auto* v = new std::vector<int>(100);
    delete v;
  });
  EXPECT_GE(c.kiln, 1);
  Counts lib = count([] {
    LibraryCallScope scope;
    auto* v = new std::vector<int>(100);
    delete v;
  });
  EXPECT_EQ(lib.kiln, 0);
  EXPECT_GE(lib.library, 1);
}

TEST(NoAlloc, CnnSteadyStateRunAllocatesNothing) { expect_steady_state_free(*build(cnn()), "cnn"); }

TEST(NoAlloc, MlpAttentionSteadyStateRunAllocatesNothing) {
  expect_steady_state_free(*build(mlp_attention()), "mlp+attention");
}

// The plane kernels of plain NCHW layers (padded_plane.h): a 7x7 depthwise conv (ConvNeXt's) and
// padded average and max pools, each made to run its kiln kernel. Their plane layout is made in every
// run; it held its taps in a vector (4 allocations per layer and run in convnext_tiny) before.
TEST(NoAlloc, PlaneKernelsAllocateNothing) {
  GraphBuilder b(13);
  b.input("x", {1, 24, 19, 21}).output("y");
  b.init("wd", random_tensor({24, 1, 7, 7}, 1)).init("bd", random_tensor({24}, 2));
  b.conv({"x", "wd", "bd"}, "d", 3, 1, 24);
  set_pool(b.node("AveragePool", {"d"}, {"ap"}), 3, 2, 1);
  set_pool(b.node("MaxPool", {"ap"}, {"y"}), 3, 1, 1);
  auto e = build(b.finish(), {"conv2d_kiln_depthwise", "pool2d_kiln_nchw"});
  std::set<std::string> tactics;
  for (const auto& l : e->impl().layers) tactics.insert(l.kernel);
  EXPECT_TRUE(tactics.count("conv2d_kiln_depthwise")) << "the depthwise conv ran another kernel";
  EXPECT_TRUE(tactics.count("pool2d_kiln_nchw")) << "the pools ran another kernel";
  expect_steady_state_free(*e, "plane kernels");
}

// BF16 layers (backends/cpu/onednn_bf16.cc) convert their input to bf16 inside the workspace: a BF16
// engine's steady-state run allocates nothing either. Every layer that has a BF16 kernel is asked to
// use it (--layer-precisions '*:bf16', prefer), so the check does not depend on timings.
TEST(NoAlloc, Bf16SteadyStateRunAllocatesNothing) {
  if (!(host_isa() & kIsaAvx512Bf16)) GTEST_SKIP() << "this CPU lacks AVX-512 BF16";
  for (const auto& [m, what] : {std::pair{cnn(), "cnn bf16"}, std::pair{mlp_attention(), "mlp+attention bf16"}}) {
    BuilderConfig cfg;
    cfg.precision = Precision::kBF16;
    cfg.layer_precisions = {{"*", Precision::kBF16}};
    cfg.warn = [](const std::string&) {};
    auto e = Builder(cfg).build_from_memory(onnx_import::serialize_model(m).value());
    int bf16 = 0;
    for (const auto& l : e->impl().layers) bf16 += l.precision == "bf16";
    EXPECT_GT(bf16, 0) << what;
    expect_steady_state_free(*e, what);
  }
}

// The check can fail: reference kernels (the interpreter's loop) allocate their outputs and frames.
TEST(NoAlloc, ReferenceKernelsDoAllocate) {
  auto e = build(cnn(), {"reference"});
  auto ctx = e->create_context();
  for (auto& [name, t] : inputs_for(*e)) ctx->set_input(name, t);
  ctx->run();
  const long n = count([&] { ctx->run(); }).kiln;
  std::printf("[noalloc] cnn on reference kernels: %ld kiln allocation(s) per steady-state run\n", n);
  EXPECT_GT(n, 0);
}

// A new shape allocates (a plan, a binding); going back to a shape seen before rebinds (a binding
// only), and the run after that is free again.
TEST(NoAlloc, ShapeChangesAllocateThenSettle) {
  ir::Model m = cnn();
  m.graph->inputs[0].type.shape.dims[0] = Dim::symbol("batch");
  BuilderConfig cfg;
  Profile p;
  p.inputs["x"] = {{1, 3, 33, 35}, {1, 3, 33, 35}, {3, 3, 33, 35}};
  cfg.profiles = {p};
  cfg.warn = [](const std::string&) {};
  auto e = Builder(cfg).build_from_memory(onnx_import::serialize_model(m).value());
  auto ctx = e->create_context();
  for (int64_t batch : {1, 3, 1}) {
    for (auto& [name, t] : inputs_for(*e, batch)) ctx->set_input(name, t);
    ctx->run();
    EXPECT_EQ(count([&] { ctx->run(); }).kiln, 0) << "batch " << batch;
  }
}

// A detector's post-processing layers with shapes known before the run (kiln's own tactics, which
// declare their scratch as workspace): RoiAlign over rois, TopK of scores with a constant K, GatherND
// and ScatterElements (a rows update, then an elementwise one with a reduction).
ir::Model detector_head() {
  GraphBuilder b(17);
  b.input("x", {2, 8, 12, 12}).input("s", {1, 40}).input("d", {40, 3});
  b.output("pooled").output("top").output("top_i").output("scattered").output("reduced");
  b.init("rois", Tensor::from_vector<float>(DataType::kFloat32, {5, 4},
                                            {0, 0, 5, 5, 1, 2, 9, 11, 3.5f, 1, 7, 6.5f, 0, 0, 11, 11, 2, 2, 2.5f, 8}));
  b.init("bidx", Tensor::from_vector<int64_t>(DataType::kInt64, {5}, {0, 1, 1, 0, 1}));
  b.init("k", Tensor::from_vector<int64_t>(DataType::kInt64, {1}, {8}));
  b.init("gi", Tensor::from_vector<int64_t>(DataType::kInt64, {6, 1}, {3, 0, 39, 7, 7, 12}));
  b.init("si", Tensor::from_vector<int64_t>(DataType::kInt64, {2, 3}, {5, 5, 5, 1, 1, 1}));
  b.init("su", random_tensor({2, 3}, 3));
  b.init("ei", Tensor::from_vector<int64_t>(DataType::kInt64, {2, 3}, {0, 2, 1, 2, 0, 0}));
  auto& ra = b.node("RoiAlign", {"x", "rois", "bidx"}, {"pooled"});
  GraphBuilder::set_int(ra, "output_height", 3);
  GraphBuilder::set_int(ra, "output_width", 2);
  GraphBuilder::set_int(ra, "sampling_ratio", 2);
  b.node("TopK", {"s", "k"}, {"top", "top_i"});
  b.node("GatherND", {"d", "gi"}, {"g"});
  b.node("ScatterElements", {"g", "si", "su"}, {"scattered"});
  auto& se = b.node("ScatterElements", {"scattered", "ei", "su"}, {"reduced"});
  GraphBuilder::set_int(se, "axis", 1);
  testing::set_string(se, "reduction", "add");
  return b.finish();
}

TEST(NoAlloc, DetectorHeadSteadyStateRunAllocatesNothing) {
  auto e = build(detector_head());
  // The layers run kiln's tactics (their scratch in the plan's workspace), not reference kernels.
  std::vector<std::string> kernels;
  for (const auto& l : e->impl().layers) kernels.push_back(l.kernel);
  for (const char* want : {"roi_align_kiln", "topk_kiln", "gather_nd_kiln", "scatter_elements_kiln"})
    EXPECT_NE(std::find(kernels.begin(), kernels.end(), want), kernels.end()) << want;
  expect_steady_state_free(*e, "detector head");
}

// NonMaxSuppression and NonZero write outputs whose size depends on the data, so they allocate those
// (engine/executor.h); their scratch is workspace: a run allocates what the output tensor alone does.
// (Called here outside a context; inside one, the output's bytes come from the context's buffer cache:
// IfLoopNmsDetectorSteadyStateRunAllocatesNothing.)
TEST(NoAlloc, DataDependentTacticsAllocateOnlyTheirOutput) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0, 10);
  auto run_counted = [&](const char* tactic_name, testing::LayerCase lc) {
    const backends::Tactic* tactic = backends::find_tactic(tactic_name);
    ASSERT_NE(tactic, nullptr) << tactic_name;
    backends::LayerSignature sig = testing::layer_signature(lc);
    auto prepared = tactic->prepare(sig);
    ASSERT_TRUE(prepared.ok()) << prepared.status().to_string();
    backends::RunContext ctx;
    ctx.threads = kiln::max_threads();
    ctx.workspace_bytes = prepared.value()->workspace_bytes(ctx.threads);
    std::vector<uint8_t> ws(ctx.workspace_bytes + 64);
    ctx.workspace = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 63) / 64 * 64);
    std::vector<const Tensor*> ins;
    for (const Tensor& t : lc.inputs) ins.push_back(t.defined() ? &t : nullptr);
    Tensor y;
    std::vector<Tensor*> outs = {&y};
    ASSERT_TRUE(prepared.value()->run(ctx, ins, outs).ok());  // warms per-thread buffers
    const Dims shape = y.shape();
    Tensor again;
    outs = {&again};
    Counts run = count([&] { EXPECT_TRUE(prepared.value()->run(ctx, ins, outs).ok()); });
    Counts output_alone = count([&] { Tensor t(DataType::kInt64, shape); });
    EXPECT_EQ(again.shape(), shape) << tactic_name;
    EXPECT_EQ(run.kiln, output_alone.kiln) << tactic_name << ": allocations besides its output";
    std::printf("[noalloc] %s: %ld allocation(s) in run(), %ld for its output %s alone\n", tactic_name, run.kiln,
                output_alone.kiln, dims_str(shape).c_str());
  };
  testing::LayerCase nms{testing::make_node("", "NonMaxSuppression", 5), {}, {false, false, true, true, true}};
  Tensor boxes(DataType::kFloat32, {1, 300, 4}), scores(DataType::kFloat32, {1, 3, 300});
  for (int64_t i = 0; i < boxes.numel(); i += 4) {
    float x = u(rng) * 10, y = u(rng) * 10;
    float* q = boxes.data<float>() + i;
    q[0] = y, q[1] = x, q[2] = y + u(rng) + 1, q[3] = x + u(rng) + 1;
  }
  for (int64_t i = 0; i < scores.numel(); ++i) scores.data<float>()[i] = u(rng);
  nms.inputs = {boxes, scores, Tensor::from_vector<int64_t>(DataType::kInt64, {1}, {40}),
                Tensor::scalar<float>(DataType::kFloat32, 0.5f), Tensor::scalar<float>(DataType::kFloat32, 1.0f)};
  run_counted("nms_kiln", nms);
  testing::LayerCase nz{testing::make_node("", "NonZero", 1), {}, {false}};
  Tensor x(DataType::kFloat32, {7, 9});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = rng() % 3 ? 0.f : u(rng);
  nz.inputs = {x};
  run_counted("nonzero_kiln", nz);
}

// A detector's post-processing the way torchvision exports it, small: a conv head gives class scores
// over anchors; a data-dependent If (any score above a threshold) runs NonMaxSuppression, then gathers
// the kept boxes and their scores (sizes known only at run time) in its then-branch; the else-branch
// passes an empty detection list through; TopK of the best scores runs beside it. Every buffer these
// layers create outside the arena (NMS's selection, the gathers, the If's results, the graph outputs)
// comes from the context's buffer cache (core/buffer_cache.h) from the second run on.
ir::Node plain_node(const std::string& name, const std::string& op, std::vector<std::string> in,
                    std::vector<std::string> out, int opset = 13) {
  ir::Node n;
  n.name = name, n.op_type = op, n.opset = opset;
  n.inputs = std::move(in), n.outputs = std::move(out);
  return n;
}

ir::Model if_nms_detector() {
  const int64_t classes = 4, side = 20, per_cell = 3, anchors = side * side * per_cell;  // 1200 anchors
  GraphBuilder b(13);
  b.input("x", {1, 6, side, side}).output("dets").output("det_scores").output("best");
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0, 1);
  Tensor boxes(DataType::kFloat32, {1, anchors, 4});
  for (int64_t i = 0; i < anchors; ++i) {
    float y = u(rng) * 300, x = u(rng) * 300, h = 4 + u(rng) * 30, w = 4 + u(rng) * 30;
    float* q = boxes.data<float>() + 4 * i;
    q[0] = y, q[1] = x, q[2] = y + h, q[3] = x + w;
  }
  b.init("boxes", boxes).init("w", random_tensor({classes * per_cell, 6, 3, 3}, 21));
  b.init("to_scores", Tensor::from_vector<int64_t>(DataType::kInt64, {3}, {1, classes, anchors}));
  b.init("max_out", Tensor::from_vector<int64_t>(DataType::kInt64, {1}, {300}));
  b.init("iou", Tensor::scalar<float>(DataType::kFloat32, 0.5f));
  b.init("score_thr", Tensor::scalar<float>(DataType::kFloat32, 0.3f));
  b.init("any_thr", Tensor::scalar<float>(DataType::kFloat32, 0.05f));
  b.init("col", Tensor::scalar<int64_t>(DataType::kInt64, 2));
  b.init("cls_col", Tensor::scalar<int64_t>(DataType::kInt64, 1));
  b.init("flat", Tensor::from_vector<int64_t>(DataType::kInt64, {2}, {anchors, 4}));
  b.init("flat_scores", Tensor::from_vector<int64_t>(DataType::kInt64, {1}, {classes * anchors}));
  b.init("no_dets", Tensor(DataType::kFloat32, {0, 4})).init("no_scores", Tensor(DataType::kFloat32, {0}));
  b.init("k", Tensor::from_vector<int64_t>(DataType::kInt64, {1}, {50}));
  b.conv({"x", "w"}, "head", 1);
  b.node("Reshape", {"head", "to_scores"}, {"logits"});
  b.node("Sigmoid", {"logits"}, {"scores"});
  GraphBuilder::set_int(b.node("ReduceMax", {"scores"}, {"top_score"}), "keepdims", 0);
  b.node("Greater", {"top_score", "any_thr"}, {"any"});
  b.node("Reshape", {"boxes", "flat"}, {"boxes2d"});
  b.node("Reshape", {"scores", "flat_scores"}, {"scores1d"});
  // then: NMS -> kept (batch, class, box) triples -> their boxes and scores (box + class * anchors).
  ir::Node nms = plain_node("nms", "NonMaxSuppression", {"boxes", "scores", "max_out", "iou", "score_thr"}, {"sel"});
  ir::Node pick = plain_node("pick", "Gather", {"sel", "col"}, {"box_i"});
  GraphBuilder::set_int(pick, "axis", 1);
  ir::Node pick_cls = plain_node("pick_cls", "Gather", {"sel", "cls_col"}, {"cls_i"});
  GraphBuilder::set_int(pick_cls, "axis", 1);
  ir::Node kept = plain_node("kept", "Gather", {"boxes2d", "box_i"}, {"then_dets"});
  b.init("n_anchors", Tensor::scalar<int64_t>(DataType::kInt64, anchors));
  auto then_g = std::make_shared<ir::Graph>();
  then_g->name = "then";
  then_g->nodes = {nms,
                   pick,
                   pick_cls,
                   kept,
                   plain_node("cls_off", "Mul", {"cls_i", "n_anchors"}, {"off"}),
                   plain_node("flat_i", "Add", {"off", "box_i"}, {"score_i"}),
                   plain_node("kept_scores", "Gather", {"scores1d", "score_i"}, {"then_scores"})};
  then_g->outputs = {{"then_dets", ir::TypeInfo()}, {"then_scores", ir::TypeInfo()}};
  auto else_g = std::make_shared<ir::Graph>();
  else_g->name = "else";
  else_g->nodes = {plain_node("pass_dets", "Identity", {"no_dets"}, {"else_dets"}),
                   plain_node("pass_scores", "Identity", {"no_scores"}, {"else_scores"})};
  else_g->outputs = {{"else_dets", ir::TypeInfo()}, {"else_scores", ir::TypeInfo()}};
  ir::Node& cf = b.node("If", {"any"}, {"dets", "det_scores"});
  cf.attrs["then_branch"] = ir::attr_graph(then_g);
  cf.attrs["else_branch"] = ir::attr_graph(else_g);
  b.node("TopK", {"scores1d", "k"}, {"best", "best_i"});
  // A Loop over the classes (a fixed trip count): each iteration takes one class's scores (Gather of an
  // outer value by the iteration number), its TopK, and carries the running maximum of their best;
  // the per-class top scores are a scan output.
  b.init("classes", Tensor::scalar<int64_t>(DataType::kInt64, classes));
  b.init("by_class", Tensor::from_vector<int64_t>(DataType::kInt64, {2}, {classes, anchors}));
  b.init("acc0", Tensor(DataType::kFloat32, {1}));
  b.node("Reshape", {"scores", "by_class"}, {"scores2d"});
  auto loop_g = std::make_shared<ir::Graph>();
  loop_g->name = "per_class";
  loop_g->inputs = {{"iter", ir::TypeInfo::tensor(DataType::kInt64, SymShape(std::vector<Dim>{}))},
                    {"cond", ir::TypeInfo::tensor(DataType::kBool, SymShape(std::vector<Dim>{}))},
                    {"acc", ir::TypeInfo::tensor(DataType::kFloat32, SymShape::from_dims({1}))}};
  ir::Node row = plain_node("row", "Gather", {"scores2d", "iter"}, {"class_scores"});
  ir::Node top = plain_node("class_top", "TopK", {"class_scores", "k"}, {"class_best", "class_best_i"}, 11);
  ir::Node most = plain_node("class_max", "ReduceMax", {"class_best"}, {"class_most"});
  GraphBuilder::set_int(most, "keepdims", 1);
  loop_g->nodes = {row, top, most, plain_node("running", "Max", {"acc", "class_most"}, {"acc_out"}),
                   plain_node("keep_going", "Identity", {"cond"}, {"cond_out"})};
  loop_g->outputs = {{"cond_out", ir::TypeInfo()}, {"acc_out", ir::TypeInfo()}, {"class_best", ir::TypeInfo()}};
  b.node("Loop", {"classes", "", "acc0"}, {"loop_max", "per_class_best"}).attrs["body"] = ir::attr_graph(loop_g);
  b.output("loop_max").output("per_class_best");
  ir::Model m = b.finish();
  for (auto& node : m.graph->nodes)
    for (auto& [k, a] : node.attrs)
      if (a.g) a.g->parent = m.graph.get();
  return m;
}

// What a steady-state run of a detector may still allocate: no buffer (4 KiB or more) — tensors take
// the context's cached buffers, so no page is touched for the first time — and, when `most_small` is
// given, at most that many small allocations, the same number every run. The interpreter loop's own
// bookkeeping (frames, per-layer output lists, shape and dtype lists, kernel names, signatures, views
// of arena slots, the vectors bodies fill, tactic outputs renewed in place) allocates nothing; what
// remains is what reference kernels allocate inside (see executor.h).
void expect_no_buffers(const Engine& e, const std::string& what, long most_small = -1) {
  auto ctx = e.create_context();
  for (auto& [name, t] : inputs_for(e)) ctx->set_input(name, t);
  ctx->run();
  Counts second = count([&] { ctx->run(); });
  Counts third = count([&] { ctx->run(); });
  std::printf(
      "[noalloc] %s: steady-state run: %ld buffer allocation(s) of >= %zu bytes; %ld small ones (%zu bytes); "
      "the run after: %ld buffer(s), %ld small\n",
      what.c_str(), second.kiln_buffers, kBufferBytes, second.kiln, second.kiln_bytes, third.kiln_buffers, third.kiln);
  EXPECT_EQ(second.kiln_buffers, 0) << what << ": a buffer allocated in a steady-state run (largest "
                                    << second.largest_kiln << " bytes); rerun with KILN_NOALLOC_TRACE=1 to see where";
  EXPECT_EQ(third.kiln_buffers, 0) << what;
  EXPECT_LT(second.largest_kiln, kBufferBytes) << what;
  EXPECT_EQ(second.kiln_bytes, third.kiln_bytes) << what << ": what a run allocates changes from run to run";
  if (most_small >= 0) {
    EXPECT_LE(second.kiln, most_small) << what << ": rerun with KILN_NOALLOC_TRACE=1 to see where";
    EXPECT_EQ(second.kiln, third.kiln) << what;
  }
}

TEST(NoAlloc, IfLoopNmsDetectorSteadyStateRunAllocatesNothing) {
  ir::Model m = if_nms_detector();
  auto e = build(m);
  auto ctx = e->create_context();
  for (auto& [name, t] : inputs_for(*e)) ctx->set_input(name, t);
  ctx->run();
  // The then-branch ran (NMS kept boxes: data-dependent outputs of kilobytes) and matches the
  // reference interpreter.
  HostTensor dets = ctx->output("dets");
  ASSERT_EQ(dets.shape.size(), 2u);
  EXPECT_GT(dets.shape[0] * 4 * 4, static_cast<int64_t>(kBufferBytes)) << "too few boxes kept to test buffers";
  std::map<std::string, ops::Value> in;
  for (auto& [name, t] : inputs_for(*e)) {
    Tensor x(static_cast<DataType>(t.dtype), t.shape);
    std::memcpy(x.raw(), t.data.get(), t.nbytes);
    in[name] = ops::Value(std::move(x));
  }
  ops::Interpreter ref(m.graph);
  auto want = ref.run(in);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  for (size_t o = 0; o < m.graph->outputs.size(); ++o) {
    const Tensor& w = want.value()[o].tensor;
    HostTensor got = ctx->output(m.graph->outputs[o].name);
    ASSERT_EQ(got.shape, w.shape()) << m.graph->outputs[o].name;
    // Boxes are gathered (exact); scores went through the conv head (a tactic: float rounding differs).
    for (int64_t i = 0; i < w.numel(); ++i)
      ASSERT_NEAR(got.as<float>()[i], w.data<float>()[i], 1e-5) << m.graph->outputs[o].name << " at " << i;
  }
  // Nothing allocates (413 per run before the loop reused its bookkeeping, 85 before the then-branch's
  // int64 Mul and Add ran a tactic, 35 before tensors made per run outside an arena were renewed in
  // place (Tensor::renew) and bodies filled the If/Loop kernels' kept result vectors
  // (SubgraphRunner::run_subgraph_into) instead of returning fresh ones).
  expect_steady_state_free(*e, "if+loop+nms detector");
}

// The suite's detectors (skipped when not exported): SSDlite's and RetinaNet's If around their
// post-processing, Faster R-CNN's RPN and RoI heads with NMS and TopK. Their small allocations are
// bounded by the counts measured (2 threads, this export): SSDlite and RetinaNet allocate nothing;
// Faster R-CNN's 7 are 4 from oneDNN's primitive_desc_base::query_md (called by the matmul tactic
// outside a LibraryCallScope) and 3 from a reference kernel in activation.cc (its fresh output). Small allocations were
// 2407 / 683 / 1136 before tactic outputs were renewed in place and bodies filled kept vectors; then
// 2 / 8 / 17 buffers of >= 4 KiB and 1214 / 518 / 878 small ones before view layers remembered their
// output shape instead of the tensor (which held its input's buffer into the next run: the buffers),
// integer and float reductions, binary elementwise, Slice and the fused elementwise layer ran without
// heap allocations, Expand and ConstantOfShape kept their scratch (16 for Faster R-CNN before float
// unary kernels renewed their output in place).
struct SuiteDetectorCase {
  const char* model;
  long most_small;
};
void PrintTo(const SuiteDetectorCase& c, std::ostream* os) { *os << c.model; }
class SuiteDetector : public ::testing::TestWithParam<SuiteDetectorCase> {};
TEST_P(SuiteDetector, SteadyStateAllocatesNoBuffers) {
  const std::string path = std::string(KILN_SUITE_MODELS) + "/" + GetParam().model + ".onnx";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not exported";
  BuilderConfig cfg;
  cfg.warn = [](const std::string&) {};
  expect_no_buffers(*Builder(cfg).build_from_file(path), GetParam().model, GetParam().most_small);
}
INSTANTIATE_TEST_SUITE_P(Suite, SuiteDetector,
                         ::testing::Values(SuiteDetectorCase{"ssdlite320_mobilenet_v3_large", 0},
                                           SuiteDetectorCase{"fasterrcnn_mobilenet_v3_large_320_fpn", 0},
                                           SuiteDetectorCase{"retinanet_resnet50_fpn", 0}),
                         [](const auto& info) {
                           std::string n = info.param.model;
                           return n.substr(0, n.find('_'));
                         });

// Suite models (bench/out/suite/models, exported by bench/export_suite.py): skipped when absent.
// By default five classifiers of the suite (a second or so each to build at batch 1); they allocate
// nothing. regnet_y_400mf (a 1x1 conv oneDNN ran as SGEMM, allocating 72 KiB a run) and convnext_tiny
// (the depthwise plane layout's vector) did not, in a run over the whole suite. KILN_NOALLOC_MODELS=a,b picks others
// (vit_b_32, resnext50_32x4d, ...).
class SuiteModel : public ::testing::TestWithParam<std::string> {};

TEST_P(SuiteModel, SteadyStateRun) {
  const std::string path = std::string(KILN_SUITE_MODELS) + "/" + GetParam() + ".onnx";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not exported";
  BuilderConfig cfg;
  cfg.warn = [](const std::string&) {};
  // Dynamic dims (batch, sequence) fixed at 1 by a profile: the shapes of a typical single request.
  auto m = onnx_import::load_model(path);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  Profile p;
  for (const auto& in : m.value().graph->inputs) {
    if (m.value().graph->initializers.count(in.name) || !in.type.is_tensor() || in.type.shape.fully_known()) continue;
    std::vector<int64_t> d;
    for (const Dim& x : in.type.shape.dims) d.push_back(x.known() ? x.value : 1);
    p.inputs[in.name] = {d, d, d};
  }
  if (!p.inputs.empty()) cfg.profiles = {p};
  auto e = Builder(cfg).build_from_file(path);
  expect_steady_state_free(*e, GetParam());
}

std::vector<std::string> suite_models() {
  const char* env = std::getenv("KILN_NOALLOC_MODELS");
  std::stringstream ss(env && *env ? env : "squeezenet1_0,efficientnet_b0,regnet_x_400mf,regnet_y_400mf,convnext_tiny");
  std::vector<std::string> out;
  for (std::string m; std::getline(ss, m, ',');)
    if (!m.empty()) out.push_back(m);
  return out;
}
INSTANTIATE_TEST_SUITE_P(Suite, SuiteModel, ::testing::ValuesIn(suite_models()));

}  // namespace
}  // namespace kiln
