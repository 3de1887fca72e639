// conv2d_winograd_f4x3_nchw16c: kiln's own Winograd F(4x4, 3x3) convolution on nChw16c activations
// (kiln.BlockedConv, block 16): 3x3, stride 1, any dilation, group 1, channels multiples of 16.
//
// Each 4x4 output tile needs a 6x6 input tile: V = B' d B (input transform), then for each of the 36
// positions of the transform domain a GEMM over channels, M_p[tiles x M] = V_p[tiles x C] U_p[C x M]
// with U = G g G' the transformed weights (made once, at prepare), then Y = A' M A + bias (+ residual)
// and the activation (output transform). 36 * 16 = 576 multiplies per 16 outputs
// per channel pair instead of 9 * 16 * 16 = 2304: 4x fewer. Tiles are processed in blocks whose transformed inputs and
// GEMM results stay in L2; blocks are split over the threads (one parallel region per layer).
//
// Dilated convs (DeepLab's and FCN's backbones, whose last stages keep a 28x28 map at dilations 2
// and 4 instead of striding) are tiled per residue class of the dilation (see Geometry): the same
// kernels with strided tiles, about 2-3.5x faster than oneDNN's direct dilated conv here.
//
// Large transformed weights (4x the 3x3 ones, past 16 MB: 512 x 512 channels make 38 MB, FCN's
// 2048 -> 512 head 151 MB) would come from DRAM again for each block of tiles: such layers take the
// chunked order instead (PreparedWinograd::chunk), which streams U once per chunk of up to 96 tiles.
// The tuner times this tactic against oneDNN's, so maps of few tiles (resnet's 7x7 stages: 4 an
// image) keep oneDNN where it is faster; on FCN's 28x28 maps it wins 2-3x. Rounding: the
// interpolation points are 0, +-5/8, +-3/2 (rather than the usual 0, +-1, +-2): measured against a
// double-precision reference, 2e-5 (32 channels) to 2e-4 (256) absolute on outputs up to 60, like
// oneDNN's own F(4x4, 3x3) and 3-4x below the usual points.
//
// Paths: AVX-512 (the one that pays: 6 tiles x 64 channels of accumulators), AVX2 and scalar (the
// same code over simd_vec.h's vectors; on AVX2 machines the layout pass makes 8-channel blocks, which
// this tactic does not take, so those paths serve tests and --isa builds). Epilogue: bias, residual,
// every activation of kiln's fused layers.
#include <algorithm>
#include <cstring>
#include <memory>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kiln_tactics.h"
#include "backends/cpu/nchwc_tactics.h"
#include "backends/cpu/simd_vec.h"
#include "backends/cpu/test_hooks.h"
#include "core/parallel.h"
#include "ops/conv_util.h"

namespace kiln::backends::cpu {
namespace {

constexpr int64_t kNr = 64;  // output channels per GEMM micro-tile

// A dilated conv (dilation dh x dw) is dh * dw interleaved undilated ones: the outputs whose row is
// ry mod dh and column rx mod dw read only the inputs of the same residues. Each residue class is
// tiled on its own (th x tw tiles of 4x4 of its outputs, so a tile spans 4 * dh rows), and a tile's
// 6x6 input tile and 4x4 outputs are taken at strides dh, dw; with dilation 1 this is the plain tiling.
struct Geometry {
  int64_t n, c, h, w, m, oh, ow, pt, pl, dh, dw, th, tw, tiles;
};

// What a run needs: geometry, transformed weights, bias, epilogue.
struct WinoPlan {
  Geometry g;
  const float* u = nullptr;     // [mb64][36][C][64]
  const float* bias = nullptr;  // [M]
  int64_t mb64 = 0;             // 64-channel column blocks of U (M rounded up)
  Activation act;
};

// Tile t's image and its first output row and column (tiles: image, residue row, residue column,
// tile row, tile column).
inline void tile_origin(const Geometry& g, int64_t t, int64_t* n, int64_t* oy0, int64_t* ox0) {
  const int64_t per_residue = g.th * g.tw, per_image = g.dh * g.dw * per_residue;
  *n = t / per_image;
  int64_t rest = t % per_image;
  const int64_t residue = rest / per_residue;
  rest %= per_residue;
  *oy0 = residue / g.dw + (rest / g.tw) * 4 * g.dh;
  *ox0 = residue % g.dw + (rest % g.tw) * 4 * g.dw;
}

#define KILN_ISA_BODY "backends/cpu/winograd_body.inc"
#include "backends/cpu/isa_paths.inc"
#undef KILN_ISA_BODY

struct AlignedDelete {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t(64)); }
};
using AlignedFloats = std::unique_ptr<float[], AlignedDelete>;
AlignedFloats aligned_floats(size_t n) {
  return AlignedFloats(static_cast<float*>(::operator new[](std::max<size_t>(n, 16) * 4, std::align_val_t(64))));
}

// Per-thread scratch (a thread runs one layer at a time).
float* scratch(size_t floats) {
  thread_local AlignedFloats buf;
  thread_local size_t have = 0;
  if (have < floats) buf = aligned_floats(floats), have = floats;
  return buf.get();
}

class PreparedWinograd : public PreparedLayer {
 public:
  WinoPlan plan;
  Isa isa = Isa::kScalar;
  bool has_residual = false;
  int64_t tb_max = 18;  // tiles per block at most (transformed inputs of a block within ~512 KB)
  // Transformed weights past 16 MB: the tiles are taken `chunk` at a time, the input transform of a
  // whole chunk made first (into the workspace, split over the threads), then each 64-channel
  // column block of U is streamed once per chunk (the threads split the column blocks). 0: the
  // blocked order above, which streams U once per block of tb_max tiles.
  int64_t chunk = 0;
  AlignedFloats u, bias;

  size_t workspace_bytes(int threads) const override {
    (void)threads;
    return chunk ? workspace_piece(sizeof(float) * 36 * static_cast<size_t>(chunk * plan.g.c)) : 0;
  }

  std::vector<Dims> output_shapes() const override {
    const Geometry& g = plan.g;
    return {{g.n, g.m / 16, g.oh, g.ow, 16}};
  }

  Status run(const RunContext& ctx, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out) const override {
    const Geometry& g = plan.g;
    const float* x = in[0]->data<float>();
    const float* r = has_residual ? in[3]->data<float>() : nullptr;
    float* y = out[0]->data<float>();
    // Work: tile blocks, split evenly over the threads (their count a multiple of the thread count
    // when tiles allow). With fewer blocks than twice the threads (small images at batch 1), the
    // threads split the output channels of each block instead, so that each streams only its share
    // of the transformed weights (the input transform is then made once per thread).
    const int64_t threads = std::max(1, max_threads());
    if (chunk) {
      float* v = static_cast<float*>(WorkspaceSlicer(ctx).take(sizeof(float) * 36 * chunk * g.c));
      for (int64_t t0 = 0; t0 < g.tiles; t0 += chunk) {
        const int64_t nt = std::min(chunk, g.tiles - t0);
        parallel_for(nt, 1, [&](int64_t a, int64_t b) {
          switch (isa) {
            case Isa::kAvx512: isa_avx512::input_transform(plan, x, v + a * 36 * g.c, t0 + a, b - a); break;
            case Isa::kAvx2: isa_avx2::input_transform(plan, x, v + a * 36 * g.c, t0 + a, b - a); break;
            case Isa::kScalar: isa_scalar::input_transform(plan, x, v + a * 36 * g.c, t0 + a, b - a); break;
          }
        });
        parallel_for(plan.mb64, 1, [&](int64_t m0, int64_t m1) {
          float* mo = scratch(static_cast<size_t>(36 * nt * kNr));
          for (int64_t mb = m0; mb < m1; ++mb) {
            switch (isa) {
              case Isa::kAvx512:
                isa_avx512::gemm(plan, v, mo, nt, mb), isa_avx512::output_transform(plan, mo, t0, nt, mb, r, y);
                break;
              case Isa::kAvx2:
                isa_avx2::gemm(plan, v, mo, nt, mb), isa_avx2::output_transform(plan, mo, t0, nt, mb, r, y);
                break;
              case Isa::kScalar:
                isa_scalar::gemm(plan, v, mo, nt, mb), isa_scalar::output_transform(plan, mo, t0, nt, mb, r, y);
                break;
            }
          }
        });
      }
      return Status::Ok();
    }
    int64_t nblk = (g.tiles + tb_max - 1) / tb_max, msplit = 1;
    if (threads > 1 && nblk < 2 * threads && plan.mb64 >= threads) {
      msplit = threads;
    } else {
      nblk = std::min(g.tiles, (nblk + threads - 1) / threads * threads);
    }
    const int64_t tb = (g.tiles + nblk - 1) / nblk;
    nblk = (g.tiles + tb - 1) / tb;
    parallel_for(nblk * msplit, 1, [&](int64_t w0, int64_t w1) {
      float* v = scratch(static_cast<size_t>(36 * tb * (g.c + kNr)));
      float* mo = v + 36 * tb * g.c;
      switch (isa) {
        case Isa::kAvx512: isa_avx512::run_items(plan, x, r, y, tb, msplit, w0, w1, v, mo); break;
        case Isa::kAvx2: isa_avx2::run_items(plan, x, r, y, tb, msplit, w0, w1, v, mo); break;
        case Isa::kScalar: isa_scalar::run_items(plan, x, r, y, tb, msplit, w0, w1, v, mo); break;
      }
    });
    return Status::Ok();
  }
};

// U[mb][p][c][j] = (G g G')_p of weights [M][C][3][3], output channel mb * 64 + j (zero past M): a
// column block's 36 panels adjacent, so each thread streams one contiguous stretch.
void transform_weights(const float* w, int64_t m, int64_t c, int64_t mb64, float* u) {
  // Toom-Cook with the points 0, +-a, +-b, infinity; a = 5/8, b = 3/2 keep the rounding error of
  // float32 transforms near that of the direct convolution's sums (measured 3-4x below the usual
  // 0, +-1, +-2 of Lavin & Gray, which miss the tactic test's tolerance from 32 channels on).
  const double a = 0.625, b = 1.5, f0 = a * a * b * b, fa = 2 * a * a * (a * a - b * b),
               fb = 2 * b * b * (b * b - a * a);
  const double kG[6][3] = {{1 / f0, 0, 0},
                           {1 / fa, a / fa, a * a / fa},
                           {1 / fa, -a / fa, a * a / fa},
                           {1 / fb, b / fb, b * b / fb},
                           {1 / fb, -b / fb, b * b / fb},
                           {0, 0, 1}};
  std::memset(u, 0, sizeof(float) * 36 * mb64 * c * kNr);
  for (int64_t om = 0; om < m; ++om)
    for (int64_t ic = 0; ic < c; ++ic) {
      const float* k = w + (om * c + ic) * 9;
      double gk[6][3], t[6][6];
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 3; ++j) gk[i][j] = kG[i][0] * k[j] + kG[i][1] * k[3 + j] + kG[i][2] * k[6 + j];
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 6; ++j) t[i][j] = gk[i][0] * kG[j][0] + gk[i][1] * kG[j][1] + gk[i][2] * kG[j][2];
      for (int p = 0; p < 36; ++p)
        u[((static_cast<size_t>(om / kNr) * 36 + p) * c + ic) * kNr + om % kNr] = static_cast<float>(t[p / 6][p % 6]);
    }
}

class WinogradTactic : public Tactic {
 public:
  TacticInfo info() const override { return TacticInfo::cpu_f32(); }
  std::string name() const override { return "conv2d_winograd_f4x3_nchw16c"; }
  std::vector<std::pair<std::string, std::string>> ops() const override { return {{"kiln", "BlockedConv"}}; }

  std::string why_unsupported(const LayerSignature& sig) const override {
    if (sig.domain() != "kiln" || sig.op() != "BlockedConv") return "not a kiln.BlockedConv";
    if (auto e = float32_cpu_layer(sig); !e.empty()) return e;
    const ir::Node& n = *sig.node;
    if (n.attr_int("block", 0) != 16) return "block is not 16";
    if (!sig.has_input(1) || !sig.inputs[1].constant || sig.inputs[1].shape.size() != 4)
      return "W is not a 4-D constant";
    const Dims& w = sig.inputs[1].shape;
    if (w[2] != 3 || w[3] != 3 || n.attr_int("group", 1) != 1) return "not a 3x3 group-1 conv";
    if (w[0] % 16 != 0 || w[1] % 16 != 0) return "channels not multiples of 16";
    if (n.attr_ints("strides", {1, 1}) != std::vector<int64_t>{1, 1}) return "stride is not 1";
    if (sig.has_input(2) && (!sig.inputs[2].constant || sig.inputs[2].constant->numel() != w[0]))
      return "B is not a constant of M elements";
    Activation act;
    if (auto e = parse_activation(n, &act); !e.empty()) return e;
    const Dims& x = sig.inputs[0].shape;
    if (x.size() != 5 || x[4] != 16 || (x[1] >= 0 && x[1] != w[1] / 16)) return "X is not blocked by 16";
    if (sig.has_input(3) && (sig.inputs[3].shape.size() != 5 || sig.inputs[3].shape[4] != 16))
      return "the residual is not blocked";
    if (sig.inputs[0].known()) {
      Geometry g;
      if (auto e = resolve(n, x, w, &g); !e.empty()) return e;
      if (sig.has_input(3) && sig.inputs[3].known() && sig.inputs[3].shape != Dims{g.n, g.m / 16, g.oh, g.ow, 16})
        return "the residual is not the output's blocked shape";
    }
    return "";
  }

  Result<std::unique_ptr<PreparedLayer>> prepare(const LayerSignature& sig) const override {
    if (auto e = why_unsupported(sig); !e.empty()) return Unsupported(name(), ": ", e);
    auto p = std::make_unique<PreparedWinograd>();
    const ir::Node& n = *sig.node;
    const Dims& w = sig.inputs[1].shape;
    Geometry& g = p->plan.g;
    resolve(n, sig.inputs[0].shape, w, &g);
    parse_activation(n, &p->plan.act);
    p->isa = cpu_isa(sig.isa);
    p->has_residual = sig.has_input(3);
    p->plan.mb64 = (g.m + kNr - 1) / kNr;
    p->tb_max = std::clamp<int64_t>(512 * 1024 / (36 * g.c * 4), 6, 18);
    // Past 16 MB of transformed weights (4x the 3x3 ones: 512 x 512 channels make 38 MB), the
    // blocked order would bring them from DRAM once per block of tiles; the chunked one brings them
    // once per chunk of up to 96 tiles (a 28x28 map has 49), whose GEMM results (36 x 96 x 64 floats,
    // 864 KB per thread) stay in L2.
    const int64_t streamed = kernel_test_hooks().winograd_chunked_bytes;
    const double u_bytes = 36.0 * static_cast<double>(p->plan.mb64 * kNr * g.c) * 4;
    if (u_bytes > (streamed >= 0 ? static_cast<double>(streamed) : 16.0 * 1024 * 1024))
      p->chunk = std::min<int64_t>(
          g.tiles, kernel_test_hooks().winograd_chunk_tiles > 0 ? kernel_test_hooks().winograd_chunk_tiles : 96);
    p->u = aligned_floats(static_cast<size_t>(36 * p->plan.mb64 * g.c * kNr));
    transform_weights(sig.inputs[1].constant->data<float>(), g.m, g.c, p->plan.mb64, p->u.get());
    p->bias = aligned_floats(static_cast<size_t>(g.m));
    for (int64_t i = 0; i < g.m; ++i) p->bias[i] = sig.has_input(2) ? sig.inputs[2].constant->data<float>()[i] : 0.f;
    p->plan.u = p->u.get();
    p->plan.bias = p->bias.get();
    return std::unique_ptr<PreparedLayer>(std::move(p));
  }

 private:
  // x: [N, C/16, H, W, 16] (dims may be -1), w: [M, C, 3, 3].
  static std::string resolve(const ir::Node& n, const Dims& x, const Dims& w, Geometry* g) {
    g->n = x[0], g->c = w[1], g->h = x[2], g->w = x[3], g->m = w[0];
    if (g->n <= 0 || g->h <= 0 || g->w <= 0) return "empty tensors";
    const Dims plain = {x[0], w[1], x[2], x[3]};
    auto win = ops::resolve_window(n, plain, &w);
    if (!win.ok()) return win.status().message();
    g->dh = win->dilations[0], g->dw = win->dilations[1];
    if (g->dh < 1 || g->dw < 1) return "dilations below 1";
    // Pads up to 2 * dilation (as large as the kernel): output rows of padding only are what oneDNN
    // rejects.
    for (int d = 0; d < 2; ++d)
      for (int64_t q : {win->pad_begin[d], win->pad_end[d]})
        if (q < 0 || q > 2 * (d ? g->dw : g->dh)) return "pads outside 0..2 x dilation";
    g->pt = win->pad_begin[0], g->pl = win->pad_begin[1];
    g->oh = win->out[0], g->ow = win->out[1];
    // Tiles per residue class: those of the largest class (residue 0), ceil(oh / dh) outputs.
    g->th = ((g->oh + g->dh - 1) / g->dh + 3) / 4, g->tw = ((g->ow + g->dw - 1) / g->dw + 3) / 4;
    g->tiles = g->n * g->dh * g->dw * g->th * g->tw;
    return "";
  }
};

}  // namespace

const Tactic* conv2d_winograd_f4x3_nchw16c() {
  static const WinogradTactic t;
  return &t;
}

}  // namespace kiln::backends::cpu
