#include "backends/cpu/gemm_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backends/cpu/simd_vec.h"
#include "backends/cpu/test_hooks.h"
#include "core/parallel.h"

namespace kiln::backends::cpu {

AlignedFloats::AlignedFloats(size_t n)
    : p_(static_cast<float*>(::operator new[](std::max<size_t>(n, 16) * sizeof(float), std::align_val_t(64)))), n_(n) {}

float* thread_scratch(int slot, size_t floats) {
  thread_local AlignedFloats bufs[4];
  AlignedFloats& b = bufs[slot];
  if (b.size() < floats) b = AlignedFloats(floats + floats / 4);
  return b.data();
}

namespace {

// What a micro-kernel adds before it stores its tile (pointers already offset to the tile).
struct TileEpi {
  bool accumulate;
  const float* col_bias;
  const float* row_bias;
  const float* res;
  int64_t ldr;
  const Activation* act;  // applied in registers (cheap kinds only, see in_kernel); null: none
  bool stream;            // non-temporal stores (AVX-512: full tiles of 64-byte-aligned rows)
  // Cache lines to prefetch into L2 while the tile is computed: pf_lines lines from pf on, spread over
  // its k steps (a share of the next packed B micro-panel, see run_block); null: none.
  const float* pf = nullptr;
  int64_t pf_lines = 0;
};

// Activations cheap enough to apply on the accumulators (a few instructions); the others run as a
// pass over the stored tile, which keeps the micro-kernels small.
bool in_kernel(ActKind k) {
  return k == ActKind::kRelu || k == ActKind::kLeakyRelu || k == ActKind::kClip || k == ActKind::kHardSwish;
}

// The activation runs as a pass over the stored tile (see in_kernel).
bool act_after_store(const GemmEpilogue& epi) { return epi.act.kind != ActKind::kNone && !in_kernel(epi.act.kind); }

// The epilogue of the tile at row ir, column jr, computed over the K block [first .. last].
TileEpi tile_epi(const GemmEpilogue& epi, bool first, bool last, int64_t ir, int64_t jr) {
  return TileEpi{!first || epi.accumulate,
                 first && epi.col_bias ? epi.col_bias + jr : nullptr,
                 first && epi.row_bias ? epi.row_bias + ir : nullptr,
                 first && epi.residual ? epi.residual + ir * epi.ld_residual + jr : nullptr,
                 epi.ld_residual,
                 last && in_kernel(epi.act.kind) ? &epi.act : nullptr,
                 last && epi.stream && !act_after_store(epi)};
}

// C tile [mr x nv] = A micro-panel [mr x k] · B micro-panel [k x nv] (+ TileEpi). nv <= NR; kTail:
// nv < NR, so B is loaded and C stored under a mask (an unpacked B has nothing past nv).
using Ukernel = void (*)(int64_t k, const float* a, int64_t rsa, int64_t csa, const float* b, int64_t ldb, float* c,
                         int64_t ldc, int nv, const TileEpi& e);

// ---- AVX-512 (MR x 32) and AVX2 (MR x 16): isa_avx512::ukernel, isa_avx2::ukernel ----

#define KILN_ISA_BODY "backends/cpu/gemm_ukernel.inc"
#include "backends/cpu/isa_paths.inc"
#undef KILN_ISA_BODY

// ---- AVX2 ----

// 8 x 8 blocks: rows of t become columns of y.
KILN_TARGET_AVX2 void transpose_epilogue_avx2(const float* t, int64_t rows, int64_t cols, int64_t ldt, float* y,
                                              int64_t ldy, const float* col_bias, const float* res, int64_t ldr,
                                              const Activation& act, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; j += 8) {
    const int64_t nj = std::min<int64_t>(8, j1 - j);
    for (int64_t i = 0; i < rows; i += 8) {
      const int64_t ni = std::min<int64_t>(8, rows - i);
      const __m256i jm = avx2::tail_mask(static_cast<int>(nj)), im = avx2::tail_mask(static_cast<int>(ni));
      __m256 r[8];
      // (AMD's masked stores are slow: plain loads and stores for the full blocks)
      const bool full = ni == 8 && nj == 8;
      for (int k = 0; k < 8; ++k)
        r[k] = full     ? _mm256_loadu_ps(t + (i + k) * ldt + j)
               : k < ni ? _mm256_maskload_ps(t + (i + k) * ldt + j, jm)
                        : _mm256_setzero_ps();
      __m256 a0 = _mm256_unpacklo_ps(r[0], r[1]), a1 = _mm256_unpackhi_ps(r[0], r[1]);
      __m256 a2 = _mm256_unpacklo_ps(r[2], r[3]), a3 = _mm256_unpackhi_ps(r[2], r[3]);
      __m256 a4 = _mm256_unpacklo_ps(r[4], r[5]), a5 = _mm256_unpackhi_ps(r[4], r[5]);
      __m256 a6 = _mm256_unpacklo_ps(r[6], r[7]), a7 = _mm256_unpackhi_ps(r[6], r[7]);
      __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE);
      __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE);
      __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xEE);
      __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xEE);
      __m256 c[8] = {_mm256_permute2f128_ps(b0, b4, 0x20), _mm256_permute2f128_ps(b1, b5, 0x20),
                     _mm256_permute2f128_ps(b2, b6, 0x20), _mm256_permute2f128_ps(b3, b7, 0x20),
                     _mm256_permute2f128_ps(b0, b4, 0x31), _mm256_permute2f128_ps(b1, b5, 0x31),
                     _mm256_permute2f128_ps(b2, b6, 0x31), _mm256_permute2f128_ps(b3, b7, 0x31)};
      for (int k = 0; k < nj; ++k) {  // c[k]: column j + k of t, rows i .. i + 7
        __m256 v = c[k];
        if (col_bias) v = _mm256_add_ps(v, _mm256_set1_ps(col_bias[j + k]));
        if (res)
          v = _mm256_add_ps(
              v, ni == 8 ? _mm256_loadu_ps(res + (j + k) * ldr + i) : _mm256_maskload_ps(res + (j + k) * ldr + i, im));
        v = avx2::activate(v, act);
        if (ni == 8) {
          _mm256_storeu_ps(y + (j + k) * ldy + i, v);
        } else {
          alignas(32) float lanes[8];
          _mm256_store_ps(lanes, v);
          for (int64_t q = 0; q < ni; ++q) y[(j + k) * ldy + i + q] = lanes[q];
        }
      }
    }
  }
}

// ---- scalar: MR x 8 ----

template <int MR, bool kTail>
void ukernel_scalar(int64_t k, const float* a, int64_t rsa, int64_t csa, const float* b, int64_t ldb, float* c,
                    int64_t ldc, int nv, const TileEpi& e) {
  constexpr int NR = 8;
  const int n = kTail ? nv : NR;
  float acc[MR][NR] = {};
  for (int64_t p = 0; p < k; ++p) {
    for (int i = 0; i < MR; ++i) {
      float av = a[i * rsa];
      for (int j = 0; j < n; ++j) acc[i][j] += av * b[j];
    }
    a += csa;
    b += ldb;
  }
  // unrolled: the accumulators stay in registers (a rolled loop would index them in memory)
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    float* ci = c + i * ldc;
    for (int j = 0; j < n; ++j) {
      float x = acc[i][j];
      if (e.accumulate) x += ci[j];
      if (e.col_bias) x += e.col_bias[j];
      if (e.row_bias) x += e.row_bias[i];
      if (e.res) x += e.res[i * e.ldr + j];
      ci[j] = e.act ? activate_scalar(x, *e.act) : x;
    }
  }
}

void activate_scalar_row(float* p, int64_t n, const Activation& act) {
  for (int64_t i = 0; i < n; ++i) p[i] = activate_scalar(p[i], act);
}

#define KILN_UK(f, mr) \
  { f<mr, false>, f<mr, true> }
const Ukernel kAvx512Kernels[8][2] = {KILN_UK(isa_avx512::ukernel, 1), KILN_UK(isa_avx512::ukernel, 2),
                                      KILN_UK(isa_avx512::ukernel, 3), KILN_UK(isa_avx512::ukernel, 4),
                                      KILN_UK(isa_avx512::ukernel, 5), KILN_UK(isa_avx512::ukernel, 6),
                                      KILN_UK(isa_avx512::ukernel, 7), KILN_UK(isa_avx512::ukernel, 8)};
const Ukernel kAvx2Kernels[6][2] = {KILN_UK(isa_avx2::ukernel, 1), KILN_UK(isa_avx2::ukernel, 2),
                                    KILN_UK(isa_avx2::ukernel, 3), KILN_UK(isa_avx2::ukernel, 4),
                                    KILN_UK(isa_avx2::ukernel, 5), KILN_UK(isa_avx2::ukernel, 6)};
const Ukernel kScalarKernels[4][2] = {KILN_UK(ukernel_scalar, 1), KILN_UK(ukernel_scalar, 2),
                                      KILN_UK(ukernel_scalar, 3), KILN_UK(ukernel_scalar, 4)};
#undef KILN_UK

struct IsaGemm {
  GemmTile tile;
  int64_t kc, mc, nc;  // cache blocks: K, rows of A per B micro-panel pass, columns of B per K block
  const Ukernel (*kernels)[2];
  void (*activate)(float*, int64_t, const Activation&);
};

// A test hook's value when set (>= 0), else `v`.
int64_t hook_or(int64_t hook, int64_t v) { return hook >= 0 ? hook : v; }

// Cache blocks (measured on Zen 4: BERT's and the convolutions' shapes): KC = 1024, the B micro-panel
// (KC x NR) streams from L2 and a long K block saves passes over C; MC rows of A per pass; NC columns
// per K block. Tests and experiments change them through kernel_test_hooks() (test_hooks.h).
IsaGemm isa_gemm(Isa isa) {
  const KernelTestHooks& h = kernel_test_hooks();
  const int64_t kc = std::max<int64_t>(1, hook_or(h.gemm_kc, 1024)),
                mc = std::max<int64_t>(32, hook_or(h.gemm_mc, 192)),
                nc = std::max<int64_t>(32, hook_or(h.gemm_nc, 1024));
  switch (isa) {
    case Isa::kAvx512: return {{8, 32}, kc, mc / 8 * 8, nc / 32 * 32, kAvx512Kernels, isa_avx512::activate_row};
    case Isa::kAvx2: return {{6, 16}, kc, mc / 6 * 6, nc / 16 * 16, kAvx2Kernels, isa_avx2::activate_row};
    case Isa::kScalar: break;
  }
  return {{4, 8}, 256, 64, 512, kScalarKernels, activate_scalar_row};
}

constexpr int64_t kLineFloats = 16;  // a 64-byte cache line

// C rows [m0, m1) x columns [n0, n1); m0 a multiple of MR, n0 of NR.
void run_block(const GemmArgs& g, const IsaGemm& ig, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int MR = ig.tile.mr, NR = ig.tile.nr;
  const bool act_after = act_after_store(g.epi);
  for (int64_t jc = n0; jc < n1; jc += ig.nc) {
    const int64_t jn = std::min(n1, jc + ig.nc);
    for (int64_t pc = 0; pc < g.k; pc += ig.kc) {
      const int64_t kc = std::min(ig.kc, g.k - pc);
      const bool first = pc == 0, last = pc + kc == g.k;
      for (int64_t ic = m0; ic < m1; ic += ig.mc) {
        const int64_t im = std::min(m1, ic + ig.mc);
        for (int64_t jr = jc; jr < jn; jr += NR) {
          const int nv = static_cast<int>(std::min<int64_t>(NR, jn - jr));
          const float* bp;
          int64_t ldb;
          if (g.packed_b) {
            bp = g.packed_b->data.data() + (jr / NR) * g.k * NR + pc * NR;
            ldb = NR;
          } else {
            bp = g.b + pc * g.ldb + jr;
            ldb = g.ldb;
          }
          // Packed A comes in MR-row panels; unpacked A takes the rows in near-equal tiles (49 rows:
          // seven tiles of 7, not six of 8 and a slow one of 1).
          const int64_t tiles = (im - ic + MR - 1) / MR;
          // Packed B: the row tiles of this panel prefetch the next one (KC x NR, contiguous) into L2,
          // each its share. The first tile of a panel otherwise waits on memory for weights that do
          // not stay cached between runs (a transformer's at batch 1: 28 MB a layer in vit_b_32).
          const float* next_panel = g.packed_b && jr + NR < jn ? bp + g.k * NR : nullptr;
          const int64_t panel_lines = kc * NR / kLineFloats;
          for (int64_t t = 0, ir = ic; t < tiles; ++t) {
            const int mr =
                static_cast<int>(g.packed_a ? std::min<int64_t>(MR, im - ir) : ic + (im - ic) * (t + 1) / tiles - ir);
            const float* ap;
            int64_t rsa, csa;
            if (g.packed_a) {
              ap = g.packed_a->data.data() + (ir / MR) * g.k * MR + pc * MR;
              rsa = 1, csa = MR;
            } else {
              ap = g.a + ir * g.rsa + pc * g.csa;
              rsa = g.rsa, csa = g.csa;
            }
            float* ct = g.c + ir * g.ldc + jr;
            TileEpi e = tile_epi(g.epi, first, last, ir, jr);
            if (next_panel) {  // tile t fetches its share of the next B micro-panel
              const int64_t share = (panel_lines + tiles - 1) / tiles, begin = std::min(panel_lines, t * share);
              e.pf = next_panel + begin * kLineFloats, e.pf_lines = std::min(share, panel_lines - begin);
            }
            ig.kernels[mr - 1][nv < NR](kc, ap, rsa, csa, bp, ldb, ct, g.ldc, nv, e);
            if (last && act_after)
              for (int i = 0; i < mr; ++i) ig.activate(ct + i * g.ldc, nv, g.epi.act);
            ir += mr;
          }
        }
      }
    }
  }
}

}  // namespace

GemmTile gemm_tile(Isa isa) { return isa_gemm(isa).tile; }

namespace {

// `scale` * x in panels of `width` along an axis of `len`: panel q holds, for each kk < k, the
// elements i = q * width .. q * width + width - 1 (zero past len) of x[i * stride + kk * k_stride].
AlignedFloats pack_panels(const float* x, int64_t len, int64_t k, int64_t width, int64_t stride, int64_t k_stride,
                          float scale) {
  const int64_t panels = (len + width - 1) / width;
  AlignedFloats data(static_cast<size_t>(panels * k * width));
  float* d = data.data();
  for (int64_t q = 0; q < panels; ++q)
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t j = 0; j < width; ++j) {
        int64_t i = q * width + j;
        *d++ = i < len ? scale * x[i * stride + kk * k_stride] : 0.f;
      }
  return data;
}

}  // namespace

PackedB pack_b(Isa isa, const float* b, int64_t k, int64_t n, int64_t rs, int64_t cs, float scale) {
  PackedB p;
  p.isa = isa, p.k = k, p.n = n, p.nr = gemm_tile(isa).nr;
  p.data = pack_panels(b, n, k, p.nr, cs, rs, scale);  // panels of columns
  return p;
}

PackedA pack_a(Isa isa, const float* a, int64_t m, int64_t k, int64_t rs, int64_t cs, float scale) {
  PackedA p;
  p.isa = isa, p.m = m, p.k = k, p.mr = gemm_tile(isa).mr;
  p.data = pack_panels(a, m, k, p.mr, rs, cs, scale);  // panels of rows
  return p;
}

void transpose_epilogue(Isa isa, const float* t, int64_t rows, int64_t cols, int64_t ldt, float* y, int64_t ldy,
                        const float* col_bias, const float* residual, int64_t ldr, const Activation& act) {
  const int64_t blocks = (cols + 7) / 8;
  parallel_for(blocks, 4, [&](int64_t begin, int64_t end) {
    const int64_t j0 = begin * 8, j1 = std::min(cols, end * 8);
    if (isa != Isa::kScalar) {
      transpose_epilogue_avx2(t, rows, cols, ldt, y, ldy, col_bias, residual, ldr, act, j0, j1);
      return;
    }
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t i = 0; i < rows; ++i) {
        float v = t[i * ldt + j] + (col_bias ? col_bias[j] : 0.f) + (residual ? residual[j * ldr + i] : 0.f);
        y[j * ldy + i] = activate_scalar(v, act);
      }
  });
}

void activate_inplace(Isa isa, float* p, int64_t n, const Activation& act) {
  if (act.kind == ActKind::kNone) return;
  isa_gemm(isa).activate(p, n, act);
}

namespace {

using Gemv = void (*)(int64_t k, const float* a, int64_t csa, const float* b, float* c, int nv, const TileEpi& e);

// M = 1 against a packed B: panel by panel over the whole K (no K blocks: C is one row, and the
// product is bound by reading B once), the panels split evenly over the threads.
void gemv_packed(Isa isa, const GemmArgs& g, const IsaGemm& ig) {
  const Gemv kernels[2] = {isa == Isa::kAvx512 ? isa_avx512::gemv_panel<false> : isa_avx2::gemv_panel<false>,
                           isa == Isa::kAvx512 ? isa_avx512::gemv_panel<true> : isa_avx2::gemv_panel<true>};
  const int64_t NR = ig.tile.nr, np = (g.n + NR - 1) / NR;
  const bool act_after = act_after_store(g.epi);
  const int64_t grain = g.n * g.k < (int64_t{1} << 16) ? np : 1;
  parallel_for(np, grain, [&](int64_t begin, int64_t end) {
    for (int64_t q = begin; q < end; ++q) {
      const int64_t j = q * NR;
      const int nv = static_cast<int>(std::min<int64_t>(NR, g.n - j));
      kernels[nv < NR](g.k, g.a, g.csa, g.packed_b->data.data() + q * g.k * NR, g.c + j, nv,
                       tile_epi(g.epi, true, true, 0, j));
      if (act_after) ig.activate(g.c + j, nv, g.epi.act);
    }
    if (g.epi.stream) _mm_sfence();
  });
}

}  // namespace

void gemm(Isa isa, const GemmArgs& g) {
  const IsaGemm ig = isa_gemm(isa);
  if (g.m == 1 && g.packed_b && !g.packed_a && isa != Isa::kScalar) return gemv_packed(isa, g, ig);
  const int64_t MR = ig.tile.mr, NR = ig.tile.nr;
  const int64_t nm = (g.m + MR - 1) / MR, np = (g.n + NR - 1) / NR;
  int64_t threads = max_threads();
  if (g.m * g.n * g.k < (int64_t{1} << 16)) threads = 1;
  // Split C into gm x gn macro tiles, one per thread: fewest micro-tiles on the busiest thread,
  // then the least A + B each thread reads.
  int64_t gm = 1, gn = 1;
  double best = -1;
  for (int64_t tm = 1; tm <= std::min(threads, nm); ++tm) {
    int64_t tn = std::min(np, threads / tm);
    int64_t rows = (nm + tm - 1) / tm, cols = (np + tn - 1) / tn;
    double cost = static_cast<double>(rows * cols * MR * NR) + 4.0 * static_cast<double>(rows * MR + cols * NR);
    if (best < 0 || cost < best) best = cost, gm = tm, gn = tn;
  }
  parallel_for(gm * gn, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      int64_t im = t % gm, jn = t / gm;
      int64_t m0 = nm * im / gm * MR, m1 = std::min(g.m, nm * (im + 1) / gm * MR);
      int64_t n0 = np * jn / gn * NR, n1 = std::min(g.n, np * (jn + 1) / gn * NR);
      if (m0 < m1 && n0 < n1) run_block(g, ig, m0, m1, n0, n1);
      if (g.epi.stream) _mm_sfence();  // the streamed stores are visible before the barrier
    }
  });
}

}  // namespace kiln::backends::cpu
