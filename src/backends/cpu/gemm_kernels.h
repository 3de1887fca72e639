// kiln's own single-precision GEMM: C[M,N] = A[M,K] · B[K,N] with a fused epilogue, for the MatMul /
// Gemm tactic and 1x1 convolutions. A register-blocked micro-kernel (AVX-512: 8x32 floats in 16 zmm
// accumulators; AVX2: 6x16 in 12 ymm; scalar: 4x8) runs over cache blocks of K (the B micro-panel
// stays in L1 while the rows of A stream past it) and macro tiles of C split over the threads.
//
// Either operand may be packed once (a constant weight): B into NR-column panels, A into MR-row
// panels, zero-padded, so the micro-kernel reads them contiguously. An unpacked operand is read in
// place through strides (A[i][p] = a[i*rsa + p*csa], B[p][j] = b[p*ldb + j]): activations are
// never copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernel_simd.h"

namespace kiln::backends::cpu {

// 64-byte-aligned float storage (weights packed at prepare time).
class AlignedFloats {
 public:
  AlignedFloats() = default;
  explicit AlignedFloats(size_t n);
  float* data() { return p_.get(); }
  const float* data() const { return p_.get(); }
  size_t size() const { return n_; }

 private:
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  std::unique_ptr<float[], Free> p_;
  size_t n_ = 0;
};

// A growable per-thread scratch buffer of `floats` floats (64-byte aligned); slot k of a thread is
// reused by the next call with the same slot.
float* thread_scratch(int slot, size_t floats);

struct GemmTile {
  int mr, nr;
};
GemmTile gemm_tile(Isa isa);

// An operand packed for the micro-kernel of `isa`.
struct PackedB {  // NR-column panels: panel q is K rows of NR floats (columns q*NR ...), zero past N
  Isa isa = Isa::kScalar;
  int64_t k = 0, n = 0;
  int nr = 0;
  AlignedFloats data;
};
struct PackedA {  // MR-row panels: panel q is K columns of MR floats (rows q*MR ...), zero past M
  Isa isa = Isa::kScalar;
  int64_t m = 0, k = 0;
  int mr = 0;
  AlignedFloats data;
};
// B[p][j] = scale * b[p*rs + j*cs]; A[i][p] = scale * a[i*rs + p*cs].
PackedB pack_b(Isa isa, const float* b, int64_t k, int64_t n, int64_t rs, int64_t cs, float scale);
PackedA pack_a(Isa isa, const float* a, int64_t m, int64_t k, int64_t rs, int64_t cs, float scale);

// Y = act(A·B [+ C] + col_bias[j] + row_bias[i] + residual[i][j]), element by element in this order.
struct GemmEpilogue {
  bool accumulate = false;          // C already holds an addend (added before the biases)
  const float* col_bias = nullptr;  // [N]
  const float* row_bias = nullptr;  // [M]
  const float* residual = nullptr;  // residual[i * ld_residual + j]
  int64_t ld_residual = 0;
  Activation act;
  // Non-temporal stores for C (AVX-512 path): for outputs far larger than the caches, written
  // without reading their lines first (halves the memory traffic of a memory-bound layer).
  bool stream = false;
};

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;  // unpacked A: A[i][p] = a[i*rsa + p*csa]
  int64_t rsa = 0, csa = 0;
  const PackedA* packed_a = nullptr;  // or packed (then `a` is ignored)
  const float* b = nullptr;           // unpacked B: B[p][j] = b[p*ldb + j]
  int64_t ldb = 0;
  const PackedB* packed_b = nullptr;  // or packed
  float* c = nullptr;                 // C[i][j] = c[i*ldc + j]
  int64_t ldc = 0;
  GemmEpilogue epi;
};

// Runs on the thread team (kiln::parallel_for); packed operands must have been packed for `isa`.
// m, n, k > 0.
void gemm(Isa isa, const GemmArgs& g);

// y[j * ldy + i] = act(t[i * ldt + j] + col_bias[j] + residual[j * ldr + i]) for i < rows, j < cols:
// a GEMM computed transposed (1x1 convolutions of small images), back with its epilogue. col_bias
// and residual may be null. Runs on the thread team.
void transpose_epilogue(Isa isa, const float* t, int64_t rows, int64_t cols, int64_t ldt, float* y, int64_t ldy,
                        const float* col_bias, const float* residual, int64_t ldr, const Activation& act);

// Applies the activation to p[0, n) in place (the epilogue of the other kernels of this directory).
void activate_inplace(Isa isa, float* p, int64_t n, const Activation& act);

}  // namespace kiln::backends::cpu
