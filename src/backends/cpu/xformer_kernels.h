// kiln's own vectorized kernels for the transformer path: layer normalization, softmax, fused
// scaled-dot-product attention and compiled elementwise programs (kiln.FusedElementwise, Gelu).
// One implementation (xformer_kernels.inc) is compiled three times, for AVX-512, AVX2 and plain
// C++ (xformer_kernels.cc); kernels(isa) hands out the table of one of them. The tactics
// (attention_tactic.cc, norm_softmax_tactic.cc, elementwise_tactic.cc) take the table of
// cpu_isa() when they are prepared and split the work over threads with kiln::parallel_for.
// Float32 only; every kernel writes outputs that do not overlap its inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/cpu/cpu_features.h"

namespace kiln::backends::cpu::xf {

// ---- attention ----

// softmax(Q K' * scale + mask) V for a batch of independent problems (one per batch index and
// head). Within a problem, rows are contiguous and rows are `*_rs` elements apart; problem p
// starts at `*_off[p]`.
// Per-problem offsets, shared on copy: a run copies its prepared problem to set the data pointers,
// which must not allocate (the offsets are filled once, at prepare time).
class SharedOffsets {
 public:
  void push_back(int64_t v) {
    if (!v_) v_ = std::make_shared<std::vector<int64_t>>();
    v_->push_back(v);
  }
  int64_t operator[](int64_t i) const { return (*v_)[static_cast<size_t>(i)]; }
  size_t size() const { return v_ ? v_->size() : 0; }

 private:
  std::shared_ptr<std::vector<int64_t>> v_;
};

struct AttentionProblem {
  const float *q = nullptr, *k = nullptr, *v = nullptr, *mask = nullptr;
  float* y = nullptr;
  int64_t sq = 0, sk = 0, d = 0, dv = 0;  // query rows, key rows, head size of Q/K and of V
  int64_t q_rs = 0, k_rs = 0, v_rs = 0, y_rs = 0;
  bool k_transposed = false;   // K is [d, sk] (rows of sk keys) instead of [sk, d]
  int64_t mask_rs = 0;         // 0: one mask row for every query row
  bool mask_rows_vary = true;  // false: one mask value per row (broadcast along the keys)
  float scale = 1.f;
  SharedOffsets q_off, k_off, v_off, mask_off, y_off;  // per problem
  int64_t row_block = 0;                               // query rows per work item (a multiple of micro_rows)
  int64_t problems() const { return static_cast<int64_t>(q_off.size()); }
  int64_t row_blocks() const { return row_block ? (sq + row_block - 1) / row_block : 0; }
};

// ---- elementwise programs ----

enum class EltOp : uint8_t {
  // binary (a, b)
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMax,
  kMin,
  kPRelu,
  // unary (a); p0/p1 are the op's parameters
  kCopy,
  kAbs,
  kNeg,
  kExp,
  kSqrt,
  kRecip,
  kRelu,
  kLeakyRelu,
  kSigmoid,
  kTanh,
  kErf,
  kFloor,
  kCeil,
  kRound,
  kSign,
  kSoftsign,
  kElu,
  kSelu,
  kHardSigmoid,
  kHardSwish,
  kGeluErf,
  kGeluTanh,
  kSquare,
  kCube,
  kClip,             // max(p0, min(p1, a)), NaN kept
  kFill,             // p0 (Pow(x, 0))
  kMish,             // a tanh(ln(1 + e^a))
  kCelu,             // p0 = alpha: max(0, a) + min(0, alpha (e^(a / alpha) - 1))
  kThresholdedRelu,  // p0 = alpha: a > alpha ? a : 0
  kSwish,            // p0 = alpha: a sigmoid(alpha a)
  // ternary (a, b, c)
  kMulAdd,  // a b + c, one rounding (a Mul whose only reader is an Add: BatchNormalization's scale and shift)
};
inline bool elt_is_binary(EltOp op) { return op <= EltOp::kPRelu; }

// Operand numbering: [0, n_inputs) the inputs, then temporaries, kEltOut the output.
constexpr int kEltOut = -1;
struct EltInstr {
  EltOp op = EltOp::kCopy;
  int dst = kEltOut, a = 0, b = 0, c = 0;
  float p0 = 0.f, p1 = 0.f;
};

// The output is viewed as `outer` rows (the dims `outer_dims`) of `inner` contiguous elements.
// Input i's row r starts at sum(index_d(r) * in_strides[i][d]); along the row it is contiguous
// (in_varies[i] == 1), one value broadcast (0), or the same in_period[i] values repeated (2; the
// period divides kEltChunk): a per-channel constant against a channel-blocked [N, C/B, H, W, B].
struct EltProgram {
  std::vector<EltInstr> code;
  int n_inputs = 0, n_temps = 0;
  int64_t inner = 1;
  std::vector<int64_t> outer_dims;
  std::vector<std::vector<int64_t>> in_strides;
  std::vector<uint8_t> in_varies;
  std::vector<int64_t> in_period;  // in_varies 2: the period; else 0
  int64_t outer() const {
    int64_t n = 1;
    for (int64_t d : outer_dims) n *= d;
    return n;
  }
};
constexpr int64_t kEltChunk = 512;  // elements per program pass (temporaries stay in L1)

// ---- the table ----

struct Kernels {
  Isa isa;
  int width;       // float lanes of a vector
  int micro_rows;  // attention: query rows of one register tile
  // Rows [row_begin, row_end) of a [rows, len] matrix; scale/bias: len values or nullptr.
  void (*layer_norm)(const float* x, float* y, int64_t row_begin, int64_t row_end, int64_t len, const float* scale,
                     const float* bias, float epsilon);
  void (*softmax)(const float* x, float* y, int64_t row_begin, int64_t row_end, int64_t len, bool log_softmax);
  // Work items [begin, end) of problems() * row_blocks() (problem-major).
  void (*attention)(const AttentionProblem& p, int64_t begin, int64_t end);
  // Units [begin, end) of outer() * ceil(inner / kEltChunk) (row-major).
  void (*eltwise)(const EltProgram& p, const float* const* inputs, float* out, int64_t begin, int64_t end);
};

const Kernels& kernels(Isa isa);

// A per-thread, 64-byte-aligned scratch buffer of at least `floats` floats; slot k of a thread is
// reused by the next kernel asking for slot k on that thread.
float* thread_scratch(int slot, size_t floats);

}  // namespace kiln::backends::cpu::xf
