// GridSample (opsets 16, 20, 22) and AffineGrid (opset 20).
//
// GridSample reads X [N, C, D1..Dr] at the normalized coordinates of grid [N, O1..Or, r] (the
// last grid dim lists coordinates innermost-first: x (width), then y, then z). Coordinates in
// [-1, 1] map to pixel centers (align_corners=0: edges of the outer pixels). Sampling is nearest
// (round half to even), linear (2^r taps) or cubic (4^r taps, Keys a=-0.75); out-of-range taps
// read zero, the clamped border pixel, or the reflected pixel per padding_mode.
#include <cmath>

#include "ops/conv_util.h"

namespace kiln::ops {
namespace {

enum class SampleMode { kNearest, kLinear, kCubic };
enum class Padding { kZeros, kBorder, kReflection };

struct GridSampleAttrs {
  SampleMode mode = SampleMode::kLinear;
  Padding padding = Padding::kZeros;
  bool align_corners = false;
};

Result<GridSampleAttrs> read_grid_attrs(const ir::Node& node) {
  GridSampleAttrs a;
  std::string mode = node.attr_string("mode", node.opset >= 20 ? "linear" : "bilinear");
  if (mode == "bilinear" || mode == "linear")
    a.mode = SampleMode::kLinear;
  else if (mode == "nearest")
    a.mode = SampleMode::kNearest;
  else if (mode == "bicubic" || mode == "cubic")
    a.mode = SampleMode::kCubic;
  else
    return InvalidModel(node.where(), "mode '", mode, "' is not one of linear, nearest, cubic");
  std::string pad = node.attr_string("padding_mode", "zeros");
  if (pad == "zeros")
    a.padding = Padding::kZeros;
  else if (pad == "border")
    a.padding = Padding::kBorder;
  else if (pad == "reflection")
    a.padding = Padding::kReflection;
  else
    return InvalidModel(node.where(), "padding_mode '", pad, "' is not one of zeros, border, reflection");
  a.align_corners = node.attr_int("align_corners", 0) != 0;
  return a;
}

// Reflects x into [lo, hi] by folding at the borders as many times as needed.
double reflect(double x, double lo, double hi) {
  double range = hi - lo;
  if (!(range > 0)) return lo;
  if (x < lo) {
    double dx = lo - x;
    double n = std::floor(dx / range), r = dx - n * range;
    return std::fmod(n, 2.0) == 0 ? lo + r : hi - r;
  }
  if (x > hi) {
    double dx = x - hi;
    double n = std::floor(dx / range), r = dx - n * range;
    return std::fmod(n, 2.0) == 0 ? hi - r : lo + r;
  }
  return x;
}

double cubic_coeff(double t, int k) {  // Keys cubic, a = -0.75, tap k in {0,1,2,3} at offsets -1..2
  const double A = -0.75;
  switch (k) {
    case 0: return ((A * (t + 1) - 5 * A) * (t + 1) + 8 * A) * (t + 1) - 4 * A;
    case 1: return ((A + 2) * t - (A + 3)) * t * t + 1;
    case 2: return ((A + 2) * (1 - t) - (A + 3)) * (1 - t) * (1 - t) + 1;
    default: return ((A * (2 - t) - 5 * A) * (2 - t) + 8 * A) * (2 - t) - 4 * A;
  }
}

struct GridSampler {
  GridSampleAttrs a;
  Dims in;  // spatial extents D1..Dr
  Dims in_stride;

  double lo(size_t d) const { return a.align_corners ? 0.0 : -0.5; }
  double hi(size_t d) const {
    return a.align_corners ? static_cast<double>(in[d]) - 1 : static_cast<double>(in[d]) - 0.5;
  }

  // Integer tap index along dim d -> in-range index, or -1 for a zero (padding) tap.
  int64_t tap_index(size_t d, int64_t i) const {
    const int64_t n = in[d];
    if (i >= 0 && i < n) return i;
    if (a.padding == Padding::kZeros) return -1;
    if (a.padding == Padding::kBorder) return std::clamp<int64_t>(i, 0, n - 1);
    double r = reflect(static_cast<double>(i), lo(d), hi(d));
    return std::clamp<int64_t>(static_cast<int64_t>(r), 0, n - 1);  // truncation, as the reference
  }

  // Fills the taps (index or -1, weight) of dim d for normalized coordinate g.
  void taps(size_t d, double g, std::vector<int64_t>& idx, std::vector<double>& w) const {
    idx.clear();
    w.clear();
    const double len = static_cast<double>(in[d]);
    double x = a.align_corners ? (g + 1) / 2 * (len - 1) : ((g + 1) * len - 1) / 2;
    if (!std::isfinite(x)) x = -1e9;
    x = std::clamp(x, -1e9, 1e9);
    if (a.mode == SampleMode::kNearest) x = std::nearbyint(x);
    if (x < lo(d) || x > hi(d)) {
      if (a.padding == Padding::kBorder)
        x = std::clamp(x, 0.0, len - 1);
      else if (a.padding == Padding::kReflection)
        x = reflect(x, lo(d), hi(d));
    }
    if (a.mode == SampleMode::kNearest) {
      idx.push_back(tap_index(d, static_cast<int64_t>(x)));
      w.push_back(1.0);
      return;
    }
    const double x0 = std::floor(x), t = x - x0;
    const int64_t i0 = static_cast<int64_t>(x0);
    if (a.mode == SampleMode::kLinear) {
      idx.push_back(tap_index(d, i0));
      w.push_back(1 - t);
      idx.push_back(tap_index(d, i0 + 1));
      w.push_back(t);
    } else {
      for (int k = 0; k < 4; ++k) {
        idx.push_back(tap_index(d, i0 - 1 + k));
        w.push_back(cubic_coeff(t, k));
      }
    }
  }
};

Status infer_grid_sample(InferContext& ctx) {
  const SymShape& xs = ctx.input_shape(0);
  const SymShape& gs = ctx.input_shape(1);
  DataType dt = ctx.input_dtype(0);
  size_t rank = xs.rank_known ? xs.rank() : gs.rank_known ? gs.rank() : 0;
  if (rank == 0) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  if (rank < 3) return ctx.error(str_cat("X must have rank >= 3 (N, C, spatial...), got ", xs.str()));
  if (xs.rank_known && gs.rank_known && xs.rank() != gs.rank())
    return ctx.error(str_cat("grid ", gs.str(), " must have the rank of X ", xs.str()));
  std::vector<Dim> out(rank);
  out[0] = xs.rank_known ? xs.dims[0] : gs.dims[0];
  if (xs.rank_known) out[1] = xs.dims[1];
  for (size_t d = 2; d < rank; ++d)
    if (gs.rank_known) out[d] = gs.dims[d - 1];
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

Status grid_sample_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  const Tensor& grid0 = ctx.input(1);
  if (!dtype_is_float(x0.dtype()) || !dtype_is_float(grid0.dtype()))
    return ctx.unsupported(str_cat("GridSample on X ", x0.describe(), ", grid ", grid0.describe(), " (floats only)"));
  KILN_RETURN_IF_ERROR(check_nchw(x0, "GridSample", "X"));
  KILN_ASSIGN_OR_RETURN(GridSampleAttrs a, read_grid_attrs(ctx.node));
  const size_t r = static_cast<size_t>(x0.rank() - 2);
  if (grid0.rank() != x0.rank() || grid0.dim(0) != x0.dim(0) || grid0.dim(grid0.rank() - 1) != static_cast<int64_t>(r))
    return ctx.error(str_cat("grid ", grid0.describe(), " must be [N, spatial..., ", r, "] for X ", x0.describe()));
  if (a.mode == SampleMode::kCubic && r != 2)
    return ctx.unsupported(str_cat("cubic GridSample on ", r, "-D data (only 2-D)"));
  Tensor x = x0.dtype() == DataType::kFloat64 ? x0 : x0.cast(DataType::kFloat64).value();
  Tensor grid = grid0.dtype() == DataType::kFloat64 ? grid0 : grid0.cast(DataType::kFloat64).value();
  GridSampler s{a, Dims(x.shape().begin() + 2, x.shape().end()), {}};
  s.in_stride = strides_of(s.in);
  const int64_t N = x.dim(0), C = x.dim(1);
  const int64_t in_plane = dims_numel(s.in);
  Dims out_shape = {N, C};
  for (int64_t d = 1; d + 1 < grid.rank(); ++d) out_shape.push_back(grid.dim(d));
  const int64_t out_plane = dims_numel(Dims(out_shape.begin() + 2, out_shape.end()));
  Tensor y(DataType::kFloat64, out_shape);
  const double* px = x.data<double>();
  const double* pg = grid.data<double>();
  double* py = y.data<double>();
  if (in_plane == 0 && a.padding != Padding::kZeros && out_plane > 0 && C > 0)
    return ctx.error(str_cat("cannot sample the empty input ", x0.describe(), " with padding_mode border/reflection"));
  std::vector<std::vector<int64_t>> idx(r);
  std::vector<std::vector<double>> w(r);
  std::vector<size_t> k(r);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < out_plane; ++o) {
      const double* g = pg + (n * out_plane + o) * static_cast<int64_t>(r);
      // grid lists coordinates innermost-first: dim d of X uses g[r - 1 - d]
      for (size_t d = 0; d < r; ++d) s.taps(d, g[r - 1 - d], idx[d], w[d]);
      for (int64_t c = 0; c < C; ++c) {
        const double* xp = px + (n * C + c) * in_plane;
        double acc = 0;
        std::fill(k.begin(), k.end(), 0);
        while (true) {  // every combination of taps
          double wt = 1;
          int64_t off = 0;
          bool zero = false;
          for (size_t d = 0; d < r; ++d) {
            int64_t i = idx[d][k[d]];
            if (i < 0)
              zero = true;
            else
              off += i * s.in_stride[d];
            wt *= w[d][k[d]];
          }
          if (!zero) acc += wt * xp[off];
          size_t d = r;
          while (d > 0 && ++k[d - 1] == idx[d - 1].size()) k[--d] = 0;
          if (d == 0) break;
        }
        py[(n * C + c) * out_plane + o] = acc;
      }
    }
  }
  Tensor out = x0.dtype() == DataType::kFloat64 ? y : y.cast(x0.dtype()).value();
  ctx.set_output(0, out);
  return Status::Ok();
}

// ---- AffineGrid: grid[n, ..., :] = theta[n] @ (x, y[, z], 1) over a normalized base grid.

Status infer_affine_grid(InferContext& ctx) {
  const SymShape& ts = ctx.input_shape(0);
  DataType dt = ctx.input_dtype(0);
  std::vector<int64_t> size;
  if (constant_ints(ctx, 1, &size)) {
    if (size.size() != 4 && size.size() != 5)
      return ctx.error(str_cat("size ", dims_str(size), " must have 4 or 5 values"));
    Dims out = {size[0]};
    out.insert(out.end(), size.begin() + 2, size.end());
    out.push_back(static_cast<int64_t>(size.size()) - 2);
    ctx.set_output(0, dt, SymShape::from_dims(out));
    return Status::Ok();
  }
  const SymShape& ss = ctx.input_shape(1);
  if (ss.rank_known && ss.rank() == 1 && ss.dims[0].known()) {
    int64_t n = ss.dims[0].value;
    if (n != 4 && n != 5) return ctx.error(str_cat("size must have 4 or 5 values, got ", n));
    std::vector<Dim> out = {ts.rank_known ? ts.dims[0] : ctx.new_symbol()};
    for (int64_t i = 2; i < n; ++i) out.push_back(ctx.new_symbol());
    out.push_back(Dim(n - 2));
    ctx.set_output(0, dt, SymShape(out));
    return Status::Ok();
  }
  ctx.set_output(0, dt, SymShape());
  return Status::Ok();
}

Status affine_grid_kernel(KernelContext& ctx) {
  const Tensor& theta0 = ctx.input(0);
  const Tensor& size_t_ = ctx.input(1);
  if (!dtype_is_float(theta0.dtype())) return ctx.unsupported(str_cat("AffineGrid on ", theta0.describe()));
  if (!dtype_is_integer(size_t_.dtype())) return ctx.error(str_cat("size must be int64, got ", size_t_.describe()));
  Dims size = to_i64_vector(size_t_);
  if (size.size() != 4 && size.size() != 5)
    return ctx.error(str_cat("size ", dims_str(size), " must be [N, C, H, W] or [N, C, D, H, W]"));
  const int64_t r = static_cast<int64_t>(size.size()) - 2;
  if (theta0.rank() != 3 || theta0.dim(0) != size[0] || theta0.dim(1) != r || theta0.dim(2) != r + 1)
    return ctx.error(str_cat("theta ", theta0.describe(), " must be [", size[0], ", ", r, ", ", r + 1, "] for size ",
                             dims_str(size)));
  const bool align = ctx.node.attr_int("align_corners", 0) != 0;
  Dims out_shape = {size[0]};
  out_shape.insert(out_shape.end(), size.begin() + 2, size.end());
  out_shape.push_back(r);
  auto numel = checked_numel(out_shape);
  if (!numel.ok()) return ctx.error(numel.status().message());
  const Dims spatial(size.begin() + 2, size.end());  // D?, H, W
  auto base = [&](size_t d, int64_t i) {             // normalized coordinate of index i along spatial dim d
    const double len = static_cast<double>(spatial[d]);
    if (spatial[d] <= 1) return 0.0;
    return align ? -1 + 2 * static_cast<double>(i) / (len - 1) : -1 + (2 * static_cast<double>(i) + 1) / len;
  };
  Tensor y(theta0.dtype(), out_shape);
  const int64_t points = dims_numel(spatial);
  const Dims sp_stride = strides_of(spatial);
  std::vector<double> v(static_cast<size_t>(r) + 1);  // (x, y[, z], 1)
  for (int64_t n = 0; n < size[0]; ++n) {
    for (int64_t p = 0; p < points; ++p) {
      for (int64_t d = 0; d < r; ++d) {
        int64_t i = (p / sp_stride[static_cast<size_t>(d)]) % spatial[static_cast<size_t>(d)];
        v[static_cast<size_t>(r - 1 - d)] = base(static_cast<size_t>(d), i);  // x is the last spatial dim
      }
      v[static_cast<size_t>(r)] = 1.0;
      for (int64_t row = 0; row < r; ++row) {
        double acc = 0;
        for (int64_t col = 0; col <= r; ++col)
          acc += theta0.get_f64((n * r + row) * (r + 1) + col) * v[static_cast<size_t>(col)];
        y.set_f64((n * points + p) * r + row, acc);
      }
    }
  }
  ctx.set_output(0, y);
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", GridSample, 16, infer_grid_sample, grid_sample_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("", AffineGrid, 20, infer_affine_grid, affine_grid_kernel, 2, 2);

}  // namespace kiln::ops
