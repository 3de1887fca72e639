// kiln.Attention's fused kernel (cuda_attention.h: launch_flash_attention), FlashAttention-2 style
// in its plainest form. One block of 4 warps per (problem, tile of 64 queries); warp w owns query
// rows 16w..16w+15 of the tile. The K and V tiles of 64 keys are staged in shared memory (zero past
// the sequence ends), then each warp, on its own rows only:
//   1. S = Q K' with wmma (16x16x16, half/bf16 inputs, float accumulators), stored as float to shared
//      memory (its 16 x 64 slice);
//   2. per row, with ordinary lanes: s = scale * S + mask (float32; -inf past the last key), the new
//      running max m' = max(m, max_j s), p_j = exp(s_j - m') rounded once to the dtype into P, the
//      running sum l = l * exp(m - m') + sum_j p_j, and the output row (float, shared memory) scaled
//      by exp(m - m');
//   3. O += P V with wmma, the accumulators loaded from and stored back to the shared float rows.
// Y = O / l, rounded once. A row whose scores are all -inf keeps l = 0 (its exponents use 0 for the
// max, so no NaN arises midway) and gives 0 / 0 = NaN, as the reference's Softmax does. No fragment
// layout is assumed: fragments only move through load_matrix_sync / store_matrix_sync.
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/cuda_attention.h"
#include "backends/cuda/cuda_float_types.cuh"

namespace kiln::backends::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 64;  // queries per block and keys per K/V tile
constexpr int kWarps = kTile / 16;
constexpr int kThreads = kWarps * 32;
constexpr int kPadH = 8;  // row padding (elements) of the 16-bit tiles: rows stay 16-byte aligned
constexpr int kPadF = 4;  // and of the float ones

template <int D>
struct Layout {
  static constexpr int ldh = D + kPadH;      // Q, K, V tiles [64][ldh]
  static constexpr int lds = kTile + kPadF;  // scores [64][lds] float
  static constexpr int ldp = kTile + kPadH;  // P [64][ldp]
  static constexpr int ldo = D + kPadF;      // O [64][ldo] float
  static constexpr size_t tile_bytes = size_t{kTile} * ldh * 2;
  static constexpr size_t q_off = 0, k_off = tile_bytes, v_off = 2 * tile_bytes, s_off = 3 * tile_bytes;
  static constexpr size_t p_off = s_off + size_t{kTile} * lds * 4;
  static constexpr size_t o_off = p_off + size_t{kTile} * ldp * 2;
  static constexpr size_t m_off = o_off + size_t{kTile} * ldo * 4;
  static constexpr size_t l_off = m_off + kTile * 4;
  static constexpr size_t bytes = l_off + kTile * 4;
  // wmma pointers must be 32-byte aligned: every section starts at a multiple of 128 bytes, and the
  // fragment origins (16-row and 16-column steps) keep 32-byte multiples within each.
  static_assert(q_off % 128 == 0 && k_off % 128 == 0 && s_off % 128 == 0 && p_off % 128 == 0 && o_off % 128 == 0 &&
                m_off % 128 == 0);
  static_assert(ldh % 8 == 0 && ldp % 8 == 0 && lds % 4 == 0 && ldo % 4 == 0, "wmma ldm");
};

// Rows [row0, row0 + 64) x columns [0, D) of an operand into a shared tile (row stride ldt); rows at
// or past `rows` are zero. vec: 16-byte loads (the caller checked col 1, and 8-element alignment of
// the pointer and the row stride).
template <typename T, int D>
__device__ void load_tile(T* tile, int ldt, const T* __restrict__ src, int64_t row0, int64_t rows, int64_t row_stride,
                          int64_t col_stride, bool vec) {
  const int tid = static_cast<int>(threadIdx.x);
  if (vec) {
    constexpr int kChunks = D / 8;
    for (int i = tid; i < kTile * kChunks; i += kThreads) {
      const int r = i / kChunks, c = (i % kChunks) * 8;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (row0 + r < rows) val = *reinterpret_cast<const uint4*>(src + (row0 + r) * row_stride + c);
      *reinterpret_cast<uint4*>(tile + r * ldt + c) = val;
    }
  } else {
    for (int i = tid; i < kTile * D; i += kThreads) {
      const int r = i / D, c = i % D;
      tile[r * ldt + c] = row0 + r < rows ? src[(row0 + r) * row_stride + c * col_stride] : to_storage<T>(0.f);
    }
  }
}

// The block's problem (batch b, head h) and first query, and its operands' origins.
template <typename T>
struct BlockOperands {
  bool valid = false;
  int64_t q0 = 0;
  const T *q = nullptr, *k = nullptr, *v = nullptr, *mask = nullptr;
  T* y = nullptr;
};
template <typename T>
__device__ BlockOperands<T> block_operands(const T* q, const T* k, const T* v, const T* mask, T* y,
                                           const FlashAttentionParams& p) {
  BlockOperands<T> o;
  const int64_t qtiles = (p.sq + kTile - 1) / kTile;
  const int64_t problem = static_cast<int64_t>(blockIdx.x) / qtiles;
  if (problem >= p.problems) return o;
  o.valid = true;
  o.q0 = (static_cast<int64_t>(blockIdx.x) % qtiles) * kTile;
  const int64_t b = problem / p.nh, h = problem % p.nh;
  o.q = q + p.q.base + b * p.q.sb + h * p.q.sh;
  o.k = k + p.k.base + b * p.k.sb + h * p.k.sh;
  o.v = v + p.v.base + b * p.v.sb + h * p.v.sh;
  o.y = y + p.y.base + b * p.y.sb + h * p.y.sh;
  o.mask = mask ? mask + attention_mask_problem_offset(p.mask, problem) : nullptr;
  return o;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_attention_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                           const T* __restrict__ mask, T* __restrict__ y, FlashAttentionParams p, bool vec) {
  using L = Layout<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem + L::q_off);
  T* ks = reinterpret_cast<T*>(smem + L::k_off);
  T* vs = reinterpret_cast<T*>(smem + L::v_off);
  float* ss = reinterpret_cast<float*>(smem + L::s_off);
  T* ps = reinterpret_cast<T*>(smem + L::p_off);
  float* os = reinterpret_cast<float*>(smem + L::o_off);
  float* row_m = reinterpret_cast<float*>(smem + L::m_off);
  float* row_l = reinterpret_cast<float*>(smem + L::l_off);

  const BlockOperands<T> op = block_operands(q, k, v, mask, y, p);
  if (!op.valid) return;  // the whole block
  const T *qp = op.q, *kp = op.k, *vp = op.v, *mp = op.mask;
  T* yp = op.y;
  const int64_t q0 = op.q0, mrow = p.mask.mask_row_stride, mcol = p.mask.mask_col_stride;

  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  load_tile<T, D>(qs, L::ldh, qp, q0, p.sq, p.q.row, 1, vec);
  for (int i = tid; i < kTile * L::ldo; i += kThreads) os[i] = 0.f;
  for (int i = tid; i < kTile; i += kThreads) row_m[i] = -INFINITY, row_l[i] = 0.f;
  __syncthreads();

  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[D / 16];
  for (int kk = 0; kk < D / 16; ++kk) wmma::load_matrix_sync(qf[kk], qs + warp * 16 * L::ldh + kk * 16, L::ldh);

  float* my_s = ss + warp * 16 * L::lds;
  T* my_p = ps + warp * 16 * L::ldp;
  float* my_o = os + warp * 16 * L::ldo;
  for (int64_t k0 = 0; k0 < p.sk; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous K and V tiles
    load_tile<T, D>(ks, L::ldh, kp, k0, p.sk, p.k.row, p.k.col, vec);
    load_tile<T, D>(vs, L::ldh, vp, k0, p.sk, p.v.row, 1, vec);
    __syncthreads();

    // 1. S [16 x 64] = Q [16 x D] K' [D x 64]: K' is K's tile read column-major.
    for (int j = 0; j < kTile / 16; ++j) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf;
        wmma::load_matrix_sync(kf, ks + j * 16 * L::ldh + kk * 16, L::ldh);
        wmma::mma_sync(acc, qf[kk], kf, acc);
      }
      wmma::store_matrix_sync(my_s + j * 16, acc, L::lds, wmma::mem_row_major);
    }
    __syncwarp();

    // 2. The online softmax update of the warp's 16 rows; lane handles columns lane and lane + 32.
    for (int rr = 0; rr < 16; ++rr) {
      const int r = warp * 16 + rr;
      const int64_t gq = q0 + r;
      float s[2];
      for (int t = 0; t < 2; ++t) {
        const int c = lane + 32 * t;
        const int64_t gk = k0 + c;
        float x = -INFINITY;
        if (gk < p.sk) {
          x = ss[r * L::lds + c] * p.scale;
          if (mp && gq < p.sq) x += to_f32(mp[gq * mrow + gk * mcol]);
        }
        s[t] = x;
      }
      const float m_old = row_m[r], l_old = row_l[r];
      const float m_new = fmaxf(m_old, attention_warp_max(fmaxf(s[0], s[1])));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // all -inf so far: p = 0, no inf - inf
      float sum = 0.f;
      for (int t = 0; t < 2; ++t) {
        const T pt = to_storage<T>(expf(s[t] - m_use));
        ps[r * L::ldp + lane + 32 * t] = pt;
        sum += to_f32(pt);  // l sums the rounded p that multiply V
      }
      sum = attention_warp_sum(sum);
      const float alpha = expf(m_old - m_use);  // m_old -inf: 0 (the row's O and l are 0 still)
      for (int c = lane; c < D; c += 32) os[r * L::ldo + c] *= alpha;
      __syncwarp();  // every lane has read row_m[r] and row_l[r]
      if (lane == 0) row_m[r] = m_new, row_l[r] = l_old * alpha + sum;
    }
    __syncwarp();

    // 3. O [16 x D] += P [16 x 64] V [64 x D].
    for (int n = 0; n < D / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, my_o + n * 16, L::ldo, wmma::mem_row_major);
      for (int kk = 0; kk < kTile / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pf;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vf;
        wmma::load_matrix_sync(pf, my_p + kk * 16, L::ldp);
        wmma::load_matrix_sync(vf, vs + kk * 16 * L::ldh + n * 16, L::ldh);
        wmma::mma_sync(acc, pf, vf, acc);
      }
      wmma::store_matrix_sync(my_o + n * 16, acc, L::ldo, wmma::mem_row_major);
    }
    __syncwarp();
  }

  for (int rr = 0; rr < 16; ++rr) {
    const int r = warp * 16 + rr;
    const int64_t gq = q0 + r;
    if (gq >= p.sq) break;
    const float l = row_l[r];
    for (int c = lane; c < D; c += 32) yp[gq * p.y.row + c] = to_storage<T>(os[r * L::ldo + c] / l);
  }
}

// The second form (attention_flash2_*): FlashAttention-2's register-resident loop on mma.sync.m16n8k16
// (whose fragment layouts PTX documents), the same tiles and arithmetic as above. Per warp, with
// g = lane / 4 and t = lane % 4: S's accumulators for 8 keys hold rows g and g + 8 at keys 2t, 2t + 1;
// the row max and sum reduce over the 4 lanes of a quad; P goes from S's accumulator layout straight
// into the A operand of P V (keys 16c .. 16c + 15 are S's tiles 2c and 2c + 1); O stays in registers.
// Scores, softmax and O in float32, P rounded once to the dtype (l sums the rounded values), Y = O / l.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two 16-bit values as one register, `lo` in the low half (the element of the lower index).
template <typename T>
__device__ __forceinline__ uint32_t pack2(T lo, T hi) {
  const uint16_t l = *reinterpret_cast<const uint16_t*>(&lo), h = *reinterpret_cast<const uint16_t*>(&hi);
  return static_cast<uint32_t>(l) | (static_cast<uint32_t>(h) << 16);
}
template <typename T>
__device__ __forceinline__ uint32_t load2(const T* p) {  // p 4-byte aligned
  return *reinterpret_cast<const uint32_t*>(p);
}

template <int D>
struct Layout2 {
  static constexpr int ldh = D + kPadH;  // Q, K, V tiles [64][ldh]: rows 16-byte aligned
  static constexpr size_t tile_bytes = size_t{kTile} * ldh * 2;
  static constexpr size_t q_off = 0, k_off = tile_bytes, v_off = 2 * tile_bytes;
  static constexpr size_t bytes = 3 * tile_bytes;
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_attention_mma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                               const T* __restrict__ mask, T* __restrict__ y, FlashAttentionParams p, bool vec) {
  using L = Layout2<D>;
  constexpr int kN = kTile / 8;  // S tiles of 8 keys
  constexpr int kO = D / 8;      // O tiles of 8 columns
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem + L::q_off);
  T* ks = reinterpret_cast<T*>(smem + L::k_off);
  T* vs = reinterpret_cast<T*>(smem + L::v_off);

  const BlockOperands<T> op = block_operands(q, k, v, mask, y, p);
  if (!op.valid) return;
  const T *qp = op.q, *kp = op.k, *vp = op.v, *mp = op.mask;
  T* yp = op.y;
  const int64_t q0 = op.q0, mrow = p.mask.mask_row_stride, mcol = p.mask.mask_col_stride;

  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int r0 = warp * 16 + g;  // the tile's rows of this thread: r0 and r0 + 8
  const int64_t gq[2] = {q0 + r0, q0 + r0 + 8};
  load_tile<T, D>(qs, L::ldh, qp, q0, p.sq, p.q.row, 1, vec);
  __syncthreads();
  uint32_t qf[D / 16][4];
  for (int kk = 0; kk < D / 16; ++kk) {
    const int c = kk * 16 + 2 * t;
    qf[kk][0] = load2(qs + r0 * L::ldh + c);
    qf[kk][1] = load2(qs + (r0 + 8) * L::ldh + c);
    qf[kk][2] = load2(qs + r0 * L::ldh + c + 8);
    qf[kk][3] = load2(qs + (r0 + 8) * L::ldh + c + 8);
  }
  float o[kO][4];
  for (int n = 0; n < kO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float row_m[2] = {-INFINITY, -INFINITY}, row_l[2] = {0.f, 0.f};

  for (int64_t k0 = 0; k0 < p.sk; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous K and V tiles
    load_tile<T, D>(ks, L::ldh, kp, k0, p.sk, p.k.row, p.k.col, vec);
    load_tile<T, D>(vs, L::ldh, vp, k0, p.sk, p.v.row, 1, vec);
    __syncthreads();

    // S [16 x 64] = Q K': B's column n is key n, B's rows are the head dims: K's row, read in pairs.
    float s[kN][4];
    for (int j = 0; j < kN; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
      const T* kr = ks + (j * 8 + g) * L::ldh + 2 * t;
      for (int kk = 0; kk < D / 16; ++kk) mma_16816<T>(s[j], qf[kk], load2(kr + kk * 16), load2(kr + kk * 16 + 8));
    }
    // Scale, mask, -inf past the last key; the online softmax of rows r0 (e = 0, 1) and r0 + 8 (e = 2, 3).
    float mx[2] = {-INFINITY, -INFINITY};
    for (int j = 0; j < kN; ++j)
      for (int e = 0; e < 4; ++e) {
        const int half = e >> 1;
        const int64_t gk = k0 + j * 8 + 2 * t + (e & 1);
        float x = -INFINITY;
        if (gk < p.sk) {
          x = s[j][e] * p.scale;
          if (mp && gq[half] < p.sq) x += to_f32(mp[gq[half] * mrow + gk * mcol]);
        }
        s[j][e] = x;
        mx[half] = fmaxf(mx[half], x);
      }
    float alpha[2], use[2];
    for (int hh = 0; hh < 2; ++hh) {
      mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
      mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
      const float m_new = fmaxf(row_m[hh], mx[hh]);
      use[hh] = m_new == -INFINITY ? 0.f : m_new;  // all -inf so far: p = 0, no inf - inf
      alpha[hh] = expf(row_m[hh] - use[hh]);       // row_m -inf: 0 (O and l are 0 still)
      row_m[hh] = m_new;
    }
    uint32_t pf[kN / 2][4];  // P as the A operand of P V, 16 keys per chunk
    float sum[2] = {0.f, 0.f};
    for (int j = 0; j < kN; ++j) {
      T pt[4];
      for (int e = 0; e < 4; ++e) {
        pt[e] = to_storage<T>(expf(s[j][e] - use[e >> 1]));
        sum[e >> 1] += to_f32(pt[e]);
      }
      pf[j / 2][(j & 1) * 2 + 0] = pack2(pt[0], pt[1]);  // row r0
      pf[j / 2][(j & 1) * 2 + 1] = pack2(pt[2], pt[3]);  // row r0 + 8
    }
    for (int hh = 0; hh < 2; ++hh) {
      sum[hh] += __shfl_xor_sync(0xffffffffu, sum[hh], 1);
      sum[hh] += __shfl_xor_sync(0xffffffffu, sum[hh], 2);
      row_l[hh] = row_l[hh] * alpha[hh] + sum[hh];
    }
    for (int n = 0; n < kO; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    // O [16 x D] += P [16 x 64] V [64 x D]: B's rows are keys, its column n is head dim n; the pair of
    // keys 2t, 2t + 1 of one column comes from two rows of V's tile.
    for (int c = 0; c < kN / 2; ++c) {
      // The A operand's register order: (r0, keys 2t..), (r0 + 8, keys 2t..), (r0, keys 8 + 2t..), (r0 + 8, 8 + 2t..).
      const uint32_t a[4] = {pf[c][0], pf[c][1], pf[c][2], pf[c][3]};
      const T* v0 = vs + (c * 16 + 2 * t) * L::ldh + g;
      for (int n = 0; n < kO; ++n) {
        const T* vc = v0 + n * 8;
        const uint32_t b0 = pack2(vc[0], vc[L::ldh]), b1 = pack2(vc[8 * L::ldh], vc[9 * L::ldh]);
        mma_16816<T>(o[n], a, b0, b1);
      }
    }
  }

  for (int hh = 0; hh < 2; ++hh) {
    if (gq[hh] >= p.sq) continue;
    const float inv_l = row_l[hh];
    T* yr = yp + gq[hh] * p.y.row;
    for (int n = 0; n < kO; ++n) {
      const int col = n * 8 + 2 * t;
      yr[col] = to_storage<T>(o[n][2 * hh] / inv_l);
      yr[col + 1] = to_storage<T>(o[n][2 * hh + 1] / inv_l);
    }
  }
}

template <typename T, int D>
cudaError_t configure_once() {
  static const cudaError_t e = [] {
    cudaError_t a = cudaFuncSetAttribute(flash_attention_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(Layout<D>::bytes));
    if (a != cudaSuccess) return a;
    return cudaFuncSetAttribute(flash_attention_mma_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(Layout2<D>::bytes));
  }();
  return e;
}

// Calls f(T{}, integral_constant<D>) for a supported (t, d); cudaErrorInvalidValue otherwise.
template <typename F>
cudaError_t dispatch_flash(FloatType t, int64_t d, F&& f) {
  auto by_d = [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    switch (d) {
      case 32: return f(T{}, std::integral_constant<int, 32>{});
      case 64: return f(T{}, std::integral_constant<int, 64>{});
      case 128: return f(T{}, std::integral_constant<int, 128>{});
      default: return cudaErrorInvalidValue;
    }
  };
  if (t == FloatType::kF16) return by_d(__half{});
  if (t == FloatType::kBF16) return by_d(__nv_bfloat16{});
  return cudaErrorInvalidValue;
}

bool multiple8(int64_t v) { return v % 8 == 0; }

}  // namespace

bool flash_attention_supports(FloatType t, int64_t d) {
  return (t == FloatType::kF16 || t == FloatType::kBF16) && (d == 32 || d == 64 || d == 128);
}

cudaError_t flash_attention_configure(FloatType t, int64_t d) {
  return dispatch_flash(t, d, [](auto tag, auto dc) { return configure_once<decltype(tag), decltype(dc)::value>(); });
}

cudaError_t launch_flash_attention(const void* q, const void* k, const void* v, const void* mask, void* y,
                                   const FlashAttentionParams& p, FloatType t, cudaStream_t s, bool mma) {
  if (!flash_attention_supports(t, p.d) || p.sq <= 0 || p.sk <= 0 || p.problems <= 0 || p.nh <= 0)
    return cudaErrorInvalidValue;
  if (p.q.col != 1 || p.v.col != 1 || p.y.col != 1) return cudaErrorInvalidValue;
  if (p.mask.batch_rank < 0 || p.mask.batch_rank > kAttentionMaxBatchRank) return cudaErrorInvalidValue;
  for (int i = 0; i < p.mask.batch_rank; ++i)
    if (p.mask.batch_dims[i] <= 0) return cudaErrorInvalidValue;
  const int64_t blocks = p.problems * ((p.sq + kTile - 1) / kTile);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const size_t e = 2;  // float16 and bfloat16
  auto ok8 = [&](const void* base, const FlashAttentionOperand& o) {
    return aligned16(static_cast<const char*>(base) + o.base * e) && multiple8(o.base) && multiple8(o.sb) &&
           multiple8(o.sh) && multiple8(o.row);
  };
  const bool vec = p.k.col == 1 && ok8(q, p.q) && ok8(k, p.k) && ok8(v, p.v);
  return dispatch_flash(t, p.d, [&](auto tag, auto dc) -> cudaError_t {
    using T = decltype(tag);
    constexpr int D = decltype(dc)::value;
    if (cudaError_t c = configure_once<T, D>(); c != cudaSuccess) return c;
    if (mma) {
      flash_attention_mma_kernel<T, D><<<static_cast<unsigned>(blocks), kThreads, Layout2<D>::bytes, s>>>(
          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const T*>(mask),
          static_cast<T*>(y), p, vec);
    } else {
      flash_attention_kernel<T, D><<<static_cast<unsigned>(blocks), kThreads, Layout<D>::bytes, s>>>(
          static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const T*>(mask),
          static_cast<T*>(y), p, vec);
    }
    return cudaGetLastError();
  });
}

}  // namespace kiln::backends::cuda
