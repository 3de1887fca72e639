// Signal processing: DFT (17, 20), STFT (17), HannWindow / HammingWindow / BlackmanWindow (17) and
// MelWeightMatrix (17). Complex values travel as a trailing dim of 2 (real, imaginary); real
// signals have a trailing dim of 1. Transforms are plain O(n^2) sums in double precision with
// exactly reduced twiddle angles.
#include <cmath>
#include <complex>

#include "ops/attention_rnn_util.h"

namespace kiln::ops {
namespace {

using arnn::dim_at;
using cplx = std::complex<double>;

constexpr double kPi = 3.14159265358979323846;
constexpr int64_t kMaxLength = int64_t{1} << 26;  // longest transform / window accepted

// Twiddles e^{sign * 2*pi*i*m/n} for m in [0, n).
std::vector<cplx> twiddles(int64_t n, double sign) {
  std::vector<cplx> w(static_cast<size_t>(n));
  for (int64_t m = 0; m < n; ++m) {
    double a = sign * 2.0 * kPi * static_cast<double>(m) / static_cast<double>(n);
    w[static_cast<size_t>(m)] = cplx(std::cos(a), std::sin(a));
  }
  return w;
}

// out[k] = sum_t in[t] * w[(k*t) mod n] for k < out_len, in zero-padded/truncated to n.
void dft_1d(const std::vector<cplx>& in, const std::vector<cplx>& w, int64_t n, int64_t out_len,
            std::vector<cplx>& out) {
  out.assign(static_cast<size_t>(out_len), cplx(0, 0));
  int64_t len = std::min<int64_t>(n, static_cast<int64_t>(in.size()));
  for (int64_t k = 0; k < out_len; ++k) {
    cplx acc(0, 0);
    for (int64_t t = 0; t < len; ++t) acc += in[static_cast<size_t>(t)] * w[static_cast<size_t>((k * t) % n)];
    out[static_cast<size_t>(k)] = acc;
  }
}

// Reads a scalar integer input, or the default when absent.
Result<int64_t> scalar_int(KernelContext& ctx, size_t i, int64_t dflt, const char* name) {
  if (!ctx.has_input(i)) return dflt;
  const Tensor& t = ctx.input(i);
  if (t.numel() != 1 || !dtype_is_integer(t.dtype()))
    return InvalidArgument(name, " must be a single integer, got ", t.describe());
  return t.get_i64(0);
}

bool constant_scalar(const InferContext& ctx, size_t i, int64_t* v) {
  std::vector<int64_t> vals;
  if (!constant_ints(ctx, i, &vals) || vals.size() != 1) return false;
  *v = vals[0];
  return true;
}

// ---------------------------------------------------------------------------------------------
// DFT

// The DFT axis: attribute before opset 20 (default 1), input 2 from opset 20 (default -2).
Result<int64_t> dft_axis(int64_t axis, int64_t rank) {
  if (rank < 2) return InvalidArgument("input must have rank >= 2 (signal dims + complex dim), got ", rank);
  if (axis < -rank || axis > rank - 2 || axis == -1)
    return InvalidArgument("axis ", axis, " is invalid for rank ", rank, " (valid: [", -rank, ", -2] or [0, ", rank - 2,
                           "])");
  return axis < 0 ? axis + rank : axis;
}

Status infer_dft(InferContext& ctx) {
  const SymShape& x = ctx.input_shape(0);
  DataType dt = ctx.input_dtype(0);
  const bool inverse = ctx.node.attr_int("inverse", 0) != 0;
  const bool onesided = ctx.node.attr_int("onesided", 0) != 0;
  int64_t axis = ctx.opset() >= 20 ? -2 : ctx.node.attr_int("axis", 1);
  if (ctx.opset() >= 20 && ctx.has_input(2) && !constant_scalar(ctx, 2, &axis)) {
    ctx.set_output(0, dt, x.rank_known ? SymShape(std::vector<Dim>(x.rank())) : SymShape());
    return Status::Ok();
  }
  if (!x.rank_known) {
    ctx.set_output(0, dt, SymShape());
    return Status::Ok();
  }
  auto ax = dft_axis(axis, static_cast<int64_t>(x.rank()));
  if (!ax.ok()) return ctx.error(ax.status().message());
  std::vector<Dim> out = x.dims;
  size_t a = static_cast<size_t>(*ax);
  Dim n;
  int64_t len;
  if (ctx.has_input(1)) {
    if (constant_scalar(ctx, 1, &len)) n = Dim(len);
  } else if (inverse && onesided) {
    if (x.dims[a].known()) n = Dim(2 * (x.dims[a].value - 1));
  } else {
    n = x.dims[a];
  }
  // The kernel's checks where the values are known: a build refuses what a run would.
  if (n.known() && (n.value <= 0 || n.value > kMaxLength))
    return ctx.error(str_cat("dft_length must be in [1, ", kMaxLength, "], got ", n.value));
  if (x.fully_known() && x.dims.back().value != 1 && x.dims.back().value != 2)
    return ctx.error(str_cat("last dim must be 1 (real) or 2 (complex), got ", dtype_name(dt), dims_str(x.concrete())));
  if (!inverse && onesided)
    out[a] = n.known() ? Dim(n.value / 2 + 1) : Dim();
  else
    out[a] = n;
  out.back() = Dim(inverse && onesided ? 1 : 2);
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

Status dft_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  DataType dt = x.dtype();
  if (!arnn::is_float_dtype(dt)) return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  const bool inverse = ctx.node.attr_int("inverse", 0) != 0;
  const bool onesided = ctx.node.attr_int("onesided", 0) != 0;
  int64_t axis_v = ctx.node.attr_int("axis", 1);
  if (ctx.opset() >= 20) {
    KILN_ASSIGN_OR_RETURN(axis_v, scalar_int(ctx, 2, -2, "axis"));
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, dft_axis(axis_v, x.rank()));
  const int64_t comp = x.dim(x.rank() - 1);
  if (comp != 1 && comp != 2) return ctx.error(str_cat("last dim must be 1 (real) or 2 (complex), got ", x.describe()));
  const int64_t in_len = x.dim(axis);
  int64_t n = (inverse && onesided) ? 2 * (in_len - 1) : in_len;
  KILN_ASSIGN_OR_RETURN(n, scalar_int(ctx, 1, n, "dft_length"));
  if (n <= 0 || n > kMaxLength) return ctx.error(str_cat("dft_length must be in [1, ", kMaxLength, "], got ", n));
  const int64_t out_len = (!inverse && onesided) ? n / 2 + 1 : n;
  const int64_t out_comp = (inverse && onesided) ? 1 : 2;
  // Iterate over every 1-D signal along `axis`: outer dims before, inner dims between axis and
  // the complex dim.
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x.dim(i);
  for (int64_t i = axis + 1; i < x.rank() - 1; ++i) inner *= x.dim(i);
  Dims out_shape = x.shape();
  out_shape[static_cast<size_t>(axis)] = out_len;
  out_shape.back() = out_comp;
  std::vector<double> xv = arnn::as_f64(x);
  std::vector<double> yv(static_cast<size_t>(dims_numel(out_shape)), 0.0);
  const std::vector<cplx> w = twiddles(n, inverse ? 1.0 : -1.0);
  std::vector<cplx> sig, res;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t in = 0; in < inner; ++in) {
      sig.assign(static_cast<size_t>(std::min(in_len, n)), cplx(0, 0));
      for (int64_t t = 0; t < static_cast<int64_t>(sig.size()); ++t) {
        int64_t base = ((o * in_len + t) * inner + in) * comp;
        sig[static_cast<size_t>(t)] =
            cplx(xv[static_cast<size_t>(base)], comp == 2 ? xv[static_cast<size_t>(base + 1)] : 0.0);
      }
      if (inverse && onesided) {
        // Hermitian extension of the one-sided spectrum (first n/2+1 bins), then a real inverse.
        std::vector<cplx> full(static_cast<size_t>(n), cplx(0, 0));
        for (int64_t k = 0; k <= n / 2 && k < static_cast<int64_t>(sig.size()); ++k) {
          full[static_cast<size_t>(k)] = sig[static_cast<size_t>(k)];
          if (k > 0 && n - k > n / 2) full[static_cast<size_t>(n - k)] = std::conj(sig[static_cast<size_t>(k)]);
        }
        sig = std::move(full);
      }
      dft_1d(sig, w, n, out_len, res);
      for (int64_t k = 0; k < out_len; ++k) {
        cplx v = res[static_cast<size_t>(k)];
        if (inverse) v /= static_cast<double>(n);
        int64_t base = ((o * out_len + k) * inner + in) * out_comp;
        yv[static_cast<size_t>(base)] = v.real();
        if (out_comp == 2) yv[static_cast<size_t>(base + 1)] = v.imag();
      }
    }
  ctx.set_output(0, arnn::from_f64(yv, out_shape, dt));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// STFT: frames of frame_length samples every frame_step, weighted by the window, DFT'd.

Status infer_stft(InferContext& ctx) {
  const SymShape& x = ctx.input_shape(0);
  DataType dt = ctx.input_dtype(0);
  if (x.rank_known && x.rank() != 3)
    return ctx.error(str_cat("signal must be 3-D [batch, length, 1|2], got ", x.str()));
  const bool onesided = ctx.node.attr_int("onesided", 1) != 0;
  int64_t step = 0, fl = 0;
  bool have_step = constant_scalar(ctx, 1, &step);
  bool have_fl = false;
  if (ctx.has_input(3))
    have_fl = constant_scalar(ctx, 3, &fl);
  else if (ctx.has_input(2) && dim_at(ctx.input_shape(2), 0).known())
    have_fl = true, fl = dim_at(ctx.input_shape(2), 0).value;
  else if (!ctx.has_input(2) && dim_at(x, 1).known())
    have_fl = true, fl = dim_at(x, 1).value;
  Dim frames, bins;
  if (have_fl && fl > 0) bins = Dim(onesided ? fl / 2 + 1 : fl);
  Dim len = dim_at(x, 1);
  if (have_fl && have_step && step > 0 && len.known() && len.value >= fl) frames = Dim(1 + (len.value - fl) / step);
  ctx.set_output(0, dt, SymShape({dim_at(x, 0), frames, bins, Dim(2)}));
  return Status::Ok();
}

Status stft_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  DataType dt = x.dtype();
  if (!arnn::is_float_dtype(dt)) return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  if (x.rank() != 3 || (x.dim(2) != 1 && x.dim(2) != 2))
    return ctx.error(str_cat("signal must be [batch, length, 1|2], got ", x.describe()));
  const int64_t B = x.dim(0), L = x.dim(1), comp = x.dim(2);
  const bool onesided = ctx.node.attr_int("onesided", 1) != 0;
  KILN_ASSIGN_OR_RETURN(int64_t step, scalar_int(ctx, 1, 0, "frame_step"));
  if (step <= 0) return ctx.error(str_cat("frame_step must be positive, got ", step));
  std::vector<double> window;
  if (ctx.has_input(2)) {
    const Tensor& w = ctx.input(2);
    if (w.rank() != 1) return ctx.error(str_cat("window must be 1-D, got ", w.describe()));
    window = arnn::as_f64(w);
  }
  int64_t dflt_fl = ctx.has_input(2) ? static_cast<int64_t>(window.size()) : L;
  KILN_ASSIGN_OR_RETURN(int64_t fl, scalar_int(ctx, 3, dflt_fl, "frame_length"));
  if (fl <= 0 || fl > kMaxLength) return ctx.error(str_cat("frame_length must be in [1, ", kMaxLength, "], got ", fl));
  if (!ctx.has_input(2)) window.assign(static_cast<size_t>(fl), 1.0);
  const int64_t wlen = static_cast<int64_t>(window.size());
  if (L < fl) return ctx.error(str_cat("signal length ", L, " is shorter than frame_length ", fl));
  const int64_t frames = 1 + (L - fl) / step;
  const int64_t bins = onesided ? fl / 2 + 1 : fl;
  std::vector<double> xv = arnn::as_f64(x);
  std::vector<double> yv(static_cast<size_t>(B * frames * bins * 2));
  const std::vector<cplx> w = twiddles(fl, -1.0);
  std::vector<cplx> sig(static_cast<size_t>(fl)), res;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t f = 0; f < frames; ++f) {
      for (int64_t m = 0; m < fl; ++m) {
        int64_t t = f * step + m;
        cplx v(0, 0);
        if (m < wlen && t < L) {
          int64_t base = (b * L + t) * comp;
          v = cplx(xv[static_cast<size_t>(base)], comp == 2 ? xv[static_cast<size_t>(base + 1)] : 0.0) *
              window[static_cast<size_t>(m)];
        }
        sig[static_cast<size_t>(m)] = v;
      }
      dft_1d(sig, w, fl, bins, res);
      for (int64_t k = 0; k < bins; ++k) {
        size_t o = static_cast<size_t>(((b * frames + f) * bins + k) * 2);
        yv[o] = res[static_cast<size_t>(k)].real();
        yv[o + 1] = res[static_cast<size_t>(k)].imag();
      }
    }
  ctx.set_output(0, arnn::from_f64(yv, {B, frames, bins, 2}, dt));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Windows and the mel filter bank: generators whose output dtype is the output_datatype attribute.

Result<DataType> output_datatype(const ir::Node& n) {
  int64_t code = n.attr_int("output_datatype", 1);
  if (code < 0 || code > 1000 || !dtype_is_known(static_cast<int32_t>(code)))
    return InvalidModel("output_datatype ", code, " is not a known dtype");
  DataType dt = static_cast<DataType>(code);
  if (!dtype_is_builtin(dt) && !is_low_precision_float(dt))
    return Unsupported("output_datatype ", dtype_name(dt), " is not supported");
  return dt;
}

template <int Kind>
Status infer_window(InferContext& ctx) {
  auto dt = output_datatype(ctx.node);
  if (!dt.ok()) return dt.status().code() == ErrorCode::kUnsupported ? Status::Ok() : ctx.error(dt.status().message());
  int64_t size;
  ctx.set_output(0, *dt, SymShape({constant_scalar(ctx, 0, &size) && size >= 0 ? Dim(size) : ctx.new_symbol()}));
  return Status::Ok();
}

// Kind 0: Hann, 1: Hamming, 2: Blackman.
template <int Kind>
Status window_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(DataType dt, output_datatype(ctx.node));
  KILN_ASSIGN_OR_RETURN(int64_t size, scalar_int(ctx, 0, 0, "size"));
  if (size < 0 || size > kMaxLength) return ctx.error(str_cat("size must be in [0, ", kMaxLength, "], got ", size));
  const bool periodic = ctx.node.attr_int("periodic", 1) != 0;
  const double N = static_cast<double>(periodic ? size : size - 1);
  Tensor out(DataType::kFloat64, {size});
  for (int64_t i = 0; i < size; ++i) {
    double v = 1.0;  // a one-point symmetric window (N = 0)
    if (N > 0) {
      double a = 2.0 * kPi * static_cast<double>(i) / N;
      if (Kind == 0)
        v = std::pow(std::sin(kPi * static_cast<double>(i) / N), 2);
      else if (Kind == 1)
        v = 25.0 / 46.0 - (1.0 - 25.0 / 46.0) * std::cos(a);
      else
        v = 0.42 - 0.5 * std::cos(a) + 0.08 * std::cos(2 * a);
    }
    out.data<double>()[i] = v;
  }
  KILN_ASSIGN_OR_RETURN(Tensor res, out.cast(dt));
  ctx.set_output(0, res);
  return Status::Ok();
}

Status infer_mel(InferContext& ctx) {
  auto dt = output_datatype(ctx.node);
  if (!dt.ok()) return dt.status().code() == ErrorCode::kUnsupported ? Status::Ok() : ctx.error(dt.status().message());
  int64_t bins, dft;
  Dim rows = constant_scalar(ctx, 1, &dft) && dft >= 0 ? Dim(dft / 2 + 1) : ctx.new_symbol();
  Dim cols = constant_scalar(ctx, 0, &bins) && bins >= 0 ? Dim(bins) : ctx.new_symbol();
  ctx.set_output(0, *dt, SymShape({rows, cols}));
  return Status::Ok();
}

Status mel_kernel(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(DataType dt, output_datatype(ctx.node));
  KILN_ASSIGN_OR_RETURN(int64_t num_mel, scalar_int(ctx, 0, 0, "num_mel_bins"));
  KILN_ASSIGN_OR_RETURN(int64_t dft_length, scalar_int(ctx, 1, 0, "dft_length"));
  KILN_ASSIGN_OR_RETURN(int64_t sample_rate, scalar_int(ctx, 2, 0, "sample_rate"));
  const Tensor& lo_t = ctx.input(3);
  const Tensor& hi_t = ctx.input(4);
  if (lo_t.numel() != 1 || hi_t.numel() != 1) return ctx.error("lower_edge_hertz and upper_edge_hertz must be scalars");
  if (num_mel <= 0 || dft_length <= 0 || sample_rate <= 0)
    return ctx.error(str_cat("num_mel_bins (", num_mel, "), dft_length (", dft_length, ") and sample_rate (",
                             sample_rate, ") must be positive"));
  const double lo = lo_t.get_f64(0), hi = hi_t.get_f64(0);
  if (!(lo >= 0) || !(hi > lo))
    return ctx.error(str_cat("need 0 <= lower_edge_hertz (", lo, ") < upper_edge_hertz (", hi, ")"));
  const int64_t spec_bins = dft_length / 2 + 1;
  if (num_mel > (int64_t{1} << 24) || spec_bins * num_mel > (int64_t{1} << 30))
    return ctx.error(str_cat("mel matrix [", spec_bins, ",", num_mel, "] is too large"));
  // Mel edges in the edges' own precision (float32 inputs compute the mel scale in float32).
  auto to_mel = [&](double hz) {
    double m = 2595.0 * std::log10(1.0 + hz / 700.0);
    return lo_t.dtype() == DataType::kFloat64 ? m : static_cast<double>(static_cast<float>(m));
  };
  const double lo_mel = to_mel(lo), hi_mel = to_mel(hi);
  double step = (hi_mel - lo_mel) / static_cast<double>(num_mel + 2);
  if (lo_t.dtype() != DataType::kFloat64)
    step = static_cast<float>(static_cast<float>(hi_mel - lo_mel) / static_cast<float>(num_mel + 2));
  std::vector<int64_t> edge(static_cast<size_t>(num_mel + 2));
  for (int64_t i = 0; i < num_mel + 2; ++i) {
    double hz = 700.0 * (std::pow(10.0, (static_cast<double>(i) * step + lo_mel) / 2595.0) - 1.0);
    double bin = std::floor(static_cast<double>(dft_length + 1) * hz / static_cast<double>(sample_rate));
    edge[static_cast<size_t>(i)] =
        static_cast<int64_t>(std::max(0.0, std::min(bin, static_cast<double>(spec_bins - 1))));
  }
  Tensor out(DataType::kFloat64, {spec_bins, num_mel});
  double* o = out.data<double>();
  for (int64_t i = 0; i < num_mel; ++i) {
    int64_t left = edge[static_cast<size_t>(i)], center = edge[static_cast<size_t>(i + 1)],
            right = edge[static_cast<size_t>(i + 2)];
    if (center == left) {
      o[center * num_mel + i] = 1.0;
    } else {
      for (int64_t j = left; j <= center; ++j)
        o[j * num_mel + i] = static_cast<double>(j - left) / static_cast<double>(center - left);
    }
    for (int64_t j = center; j < right; ++j)
      o[j * num_mel + i] = static_cast<double>(right - j) / static_cast<double>(right - center);
  }
  KILN_ASSIGN_OR_RETURN(Tensor res, out.cast(dt));
  ctx.set_output(0, res);
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", DFT, 17, infer_dft, dft_kernel, 1, 3);
KILN_REGISTER_OP_ARITY("", STFT, 17, infer_stft, stft_kernel, 2, 4);
KILN_REGISTER_OP_ARITY("", HannWindow, 17, infer_window<0>, window_kernel<0>, 1, 1);
KILN_REGISTER_OP_ARITY("", HammingWindow, 17, infer_window<1>, window_kernel<1>, 1, 1);
KILN_REGISTER_OP_ARITY("", BlackmanWindow, 17, infer_window<2>, window_kernel<2>, 1, 1);
KILN_REGISTER_OP_ARITY("", MelWeightMatrix, 17, infer_mel, mel_kernel, 5, 5);

}  // namespace kiln::ops
