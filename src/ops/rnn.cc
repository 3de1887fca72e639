// Recurrent layers: RNN, GRU and LSTM (all versions). One engine runs each direction step by step
// with per-batch sequence lengths; the cell equations differ per op. Layout 0 is
// [seq, batch, ...], layout 1 (opset 14+) is [batch, seq, ...].
#include <algorithm>
#include <cctype>
#include <cmath>

#include "ops/attention_rnn_util.h"

namespace kiln::ops {
namespace {

using arnn::dim_at;
using arnn::dim_merge;

enum class Cell { kRnn, kGru, kLstm };

int gates_of(Cell c) { return c == Cell::kRnn ? 1 : (c == Cell::kGru ? 3 : 4); }
int activations_of(Cell c) { return c == Cell::kRnn ? 1 : (c == Cell::kGru ? 2 : 3); }

// One activation function with its alpha/beta.
struct Activation {
  std::string name;  // lowercase
  double alpha = 0, beta = 0;
  double operator()(double x) const {
    if (name == "sigmoid") return arnn::sigmoid(x);
    if (name == "tanh") return std::tanh(x);
    if (name == "relu") return std::max(0.0, x);
    if (name == "affine") return alpha * x + beta;
    if (name == "leakyrelu") return x >= 0 ? x : alpha * x;
    if (name == "thresholdedrelu") return x > alpha ? x : 0.0;
    if (name == "scaledtanh") return alpha * std::tanh(beta * x);
    if (name == "hardsigmoid") return std::max(0.0, std::min(1.0, alpha * x + beta));
    if (name == "elu") return x >= 0 ? x : alpha * (std::exp(x) - 1);
    if (name == "softsign") return x / (1 + std::fabs(x));
    if (name == "softplus") return std::log1p(std::exp(-std::fabs(x))) + std::max(x, 0.0);
    return x;
  }
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The activations of every direction (f, g[, h] per direction), alpha/beta consumed in order by
// the functions that take them, defaults as in the corresponding ONNX operators.
Result<std::vector<Activation>> parse_activations(const ir::Node& n, Cell cell, int num_dir) {
  std::vector<std::string> names;
  if (const ir::Attribute* a = n.attr("activations")) names = a->strings;
  const int per_dir = activations_of(cell);
  if (names.empty()) {
    std::vector<std::string> dflt = cell == Cell::kRnn   ? std::vector<std::string>{"Tanh"}
                                    : cell == Cell::kGru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                         : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
    for (int d = 0; d < num_dir; ++d) names.insert(names.end(), dflt.begin(), dflt.end());
  } else if (static_cast<int>(names.size()) == per_dir && num_dir == 2) {
    names.insert(names.end(), names.begin(), names.end());  // one set shared by both directions
  }
  if (static_cast<int>(names.size()) != per_dir * num_dir)
    return InvalidModel("activations has ", names.size(), " entries, expected ", per_dir * num_dir);
  std::vector<float> alphas = n.attr_floats("activation_alpha"), betas = n.attr_floats("activation_beta");
  size_t ai = 0, bi = 0;
  std::vector<Activation> out;
  for (const std::string& raw : names) {
    Activation a;
    a.name = lower(raw);
    double da = 0, db = 0;
    bool na = false, nb = false;
    if (a.name == "affine")
      na = nb = true, da = 1.0, db = 0.0;
    else if (a.name == "leakyrelu")
      na = true, da = 0.01;
    else if (a.name == "thresholdedrelu")
      na = true, da = 1.0;
    else if (a.name == "scaledtanh")
      na = nb = true, da = 1.0, db = 1.0;
    else if (a.name == "hardsigmoid")
      na = nb = true, da = 0.2, db = 0.5;
    else if (a.name == "elu")
      na = true, da = 1.0;
    else if (a.name != "sigmoid" && a.name != "tanh" && a.name != "relu" && a.name != "softsign" &&
             a.name != "softplus")
      return Unsupported("activation '", raw, "' is not supported");
    a.alpha = na && ai < alphas.size() ? alphas[ai++] : da;
    a.beta = nb && bi < betas.size() ? betas[bi++] : db;
    out.push_back(a);
  }
  return out;
}

Result<int> num_directions(const ir::Node& n) {
  std::string d = n.attr_string("direction", "forward");
  if (d == "forward" || d == "reverse") return 1;
  if (d == "bidirectional") return 2;
  return InvalidModel("direction must be forward, reverse or bidirectional, got '", d, "'");
}

// The kernel's weight-shape checks (with its messages) where the shapes are known at build time, so
// that a build refuses what a run would (hidden_size against R, W, B, P).
template <Cell C>
Status check_weight_shapes(const InferContext& ctx, int64_t ND, const Dim& input_size) {
  auto fixed = [&](size_t i, Dims* d) {
    if (!ctx.has_input(i) || !ctx.input(i).is_tensor() || !ctx.input_shape(i).fully_known()) return false;
    *d = ctx.input_shape(i).concrete();
    return true;
  };
  auto desc = [&](size_t i, const Dims& d) { return str_cat(dtype_name(ctx.input_dtype(i)), dims_str(d)); };
  Dims R, W, B, P;
  if (!fixed(2, &R)) return Status::Ok();
  if (R.size() != 3) return ctx.error(str_cat("R must be 3-D, got ", desc(2, R)));
  const int64_t G = gates_of(C);
  const int64_t H = ctx.node.attr_int("hidden_size", R[2]);
  if (H <= 0 || H > (int64_t{1} << 31)) return ctx.error(str_cat("hidden_size must be in [1, 2^31], got ", H));
  if (fixed(1, &W) && input_size.known() && W != Dims{ND, G * H, input_size.value})
    return ctx.error(str_cat("W ", desc(1, W), " must be [", ND, ",", G * H, ",", input_size.value, "]"));
  if (R != Dims{ND, G * H, H}) return ctx.error(str_cat("R ", desc(2, R), " must be [", ND, ",", G * H, ",", H, "]"));
  if (fixed(3, &B) && B != Dims{ND, 2 * G * H})
    return ctx.error(str_cat("B ", desc(3, B), " must be [", ND, ",", 2 * G * H, "]"));
  if (C == Cell::kLstm && fixed(7, &P) && P != Dims{ND, 3 * H})
    return ctx.error(str_cat("P ", desc(7, P), " must be [", ND, ",", 3 * H, "]"));
  return Status::Ok();
}

template <Cell C>
Status infer_rnn(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int num_dir, num_directions(ctx.node));
  const bool layout1 = ctx.opset() >= 14 && ctx.node.attr_int("layout", 0) == 1;
  const SymShape& x = ctx.input_shape(0);
  if (x.rank_known && x.rank() != 3) return ctx.error(str_cat("X must be 3-D, got ", x.str()));
  Dim seq = dim_at(x, layout1 ? 1 : 0), batch = dim_at(x, layout1 ? 0 : 1);
  Dim hidden;
  if (const ir::Attribute* h = ctx.node.attr("hidden_size")) {
    if (h->i <= 0) return ctx.error(str_cat("hidden_size must be positive, got ", h->i));
    hidden = Dim(h->i);
  }
  hidden = dim_merge(hidden, dim_at(ctx.input_shape(2), 2));
  const SymShape& w = ctx.input_shape(1);
  if (w.rank_known && w.rank() == 3 && w.dims[0].known() && w.dims[0].value != num_dir)
    return ctx.error(
        str_cat("W ", w.str(), " has ", w.dims[0].value, " directions, the direction attribute says ", num_dir));
  KILN_RETURN_IF_ERROR(check_weight_shapes<C>(ctx, num_dir, dim_at(x, 2)));
  DataType dt = ctx.input_dtype(0);
  Dim nd(num_dir);
  if (ctx.outputs.size() > 0)
    ctx.set_output(0, dt, layout1 ? SymShape({batch, seq, nd, hidden}) : SymShape({seq, nd, batch, hidden}));
  for (size_t i = 1; i < ctx.outputs.size() && i < 3; ++i)
    ctx.set_output(i, dt, layout1 ? SymShape({batch, nd, hidden}) : SymShape({nd, batch, hidden}));
  return Status::Ok();
}

// Reads an optional [num_dir, batch, hidden] state (or [batch, num_dir, hidden] in layout 1)
// into [num_dir][batch][hidden] order.
Result<std::vector<double>> read_state(KernelContext& ctx, size_t idx, const char* name, int64_t nd, int64_t batch,
                                       int64_t hidden, bool layout1) {
  std::vector<double> out(static_cast<size_t>(nd * batch * hidden), 0.0);
  if (!ctx.has_input(idx)) return out;
  const Tensor& t = ctx.input(idx);
  Dims want = layout1 ? Dims{batch, nd, hidden} : Dims{nd, batch, hidden};
  if (t.shape() != want) return InvalidArgument(name, " ", t.describe(), " must be ", dims_str(want));
  std::vector<double> v = arnn::as_f64(t);
  for (int64_t d = 0; d < nd; ++d)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < hidden; ++h)
        out[static_cast<size_t>((d * batch + b) * hidden + h)] =
            v[static_cast<size_t>(layout1 ? (b * nd + d) * hidden + h : (d * batch + b) * hidden + h)];
  return out;
}

template <Cell C>
Status rnn_kernel(KernelContext& ctx) {
  const ir::Node& n = ctx.node;
  KILN_ASSIGN_OR_RETURN(int num_dir, num_directions(n));
  const bool reverse_only = n.attr_string("direction", "forward") == "reverse";
  const bool layout1 = ctx.opset() >= 14 && n.attr_int("layout", 0) == 1;
  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(1);
  const Tensor& R = ctx.input(2);
  DataType dt = X.dtype();
  if (!arnn::is_float_dtype(dt)) return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  if (X.rank() != 3) return ctx.error(str_cat("X must be 3-D, got ", X.describe()));
  const int64_t S = layout1 ? X.dim(1) : X.dim(0), Bn = layout1 ? X.dim(0) : X.dim(1), I = X.dim(2);
  const int64_t G = gates_of(C);
  if (R.rank() != 3) return ctx.error(str_cat("R must be 3-D, got ", R.describe()));
  const int64_t H = n.attr_int("hidden_size", R.dim(2));
  if (H <= 0 || H > (int64_t{1} << 31)) return ctx.error(str_cat("hidden_size must be in [1, 2^31], got ", H));
  const int64_t ND = num_dir;
  if (W.shape() != Dims{ND, G * H, I})
    return ctx.error(str_cat("W ", W.describe(), " must be [", ND, ",", G * H, ",", I, "]"));
  if (R.shape() != Dims{ND, G * H, H})
    return ctx.error(str_cat("R ", R.describe(), " must be [", ND, ",", G * H, ",", H, "]"));
  std::vector<double> w = arnn::as_f64(W), r = arnn::as_f64(R);
  std::vector<double> bias(static_cast<size_t>(ND * 2 * G * H), 0.0);
  if (ctx.has_input(3)) {
    const Tensor& Bt = ctx.input(3);
    if (Bt.shape() != Dims{ND, 2 * G * H})
      return ctx.error(str_cat("B ", Bt.describe(), " must be [", ND, ",", 2 * G * H, "]"));
    bias = arnn::as_f64(Bt);
  }
  std::vector<int64_t> lens(static_cast<size_t>(Bn), S);
  if (ctx.has_input(4)) {
    const Tensor& sl = ctx.input(4);
    if (sl.numel() != Bn || !dtype_is_integer(sl.dtype()))
      return ctx.error(str_cat("sequence_lens ", sl.describe(), " must hold ", Bn, " integers"));
    lens = to_i64_vector(sl);
    for (int64_t l : lens)
      if (l < 0 || l > S) return ctx.error(str_cat("sequence length ", l, " is outside [0, ", S, "]"));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<double> h0, read_state(ctx, 5, "initial_h", ND, Bn, H, layout1));
  std::vector<double> c0(static_cast<size_t>(ND * Bn * H), 0.0), peep(static_cast<size_t>(ND * 3 * H), 0.0);
  if (C == Cell::kLstm) {
    KILN_ASSIGN_OR_RETURN(c0, read_state(ctx, 6, "initial_c", ND, Bn, H, layout1));
    if (ctx.has_input(7)) {
      const Tensor& P = ctx.input(7);
      if (P.shape() != Dims{ND, 3 * H})
        return ctx.error(str_cat("P ", P.describe(), " must be [", ND, ",", 3 * H, "]"));
      peep = arnn::as_f64(P);
    }
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Activation> acts, parse_activations(n, C, num_dir));
  const ir::Attribute* clip_attr = n.attr("clip");
  const double clip = clip_attr ? clip_attr->f : 0.0;
  if (clip_attr && !(clip > 0)) return ctx.error(str_cat("clip must be positive, got ", clip));
  auto clipped = [&](double v) { return clip_attr ? std::max(-clip, std::min(clip, v)) : v; };
  const bool lbr = C == Cell::kGru && n.attr_int("linear_before_reset", 0) != 0;
  const bool input_forget = C == Cell::kLstm && n.attr_int("input_forget", 0) != 0;
  std::vector<double> xv = arnn::as_f64(X);
  auto x_at = [&](int64_t t, int64_t b, int64_t i) {
    return xv[static_cast<size_t>(layout1 ? (b * S + t) * I + i : (t * Bn + b) * I + i)];
  };

  // Y as [S][ND][B][H]; states as [ND][B][H].
  std::vector<double> y(static_cast<size_t>(S * ND * Bn * H), 0.0);
  std::vector<double> hT = h0, cT = c0;
  std::vector<double> xw(static_cast<size_t>(G * H)), hr(static_cast<size_t>(G * H)), hprev(static_cast<size_t>(H)),
      cprev(static_cast<size_t>(H)), hnew(static_cast<size_t>(H)), cnew(static_cast<size_t>(H)),
      reset(static_cast<size_t>(H));
  for (int64_t d = 0; d < ND; ++d) {
    const bool backward = d == 1 || reverse_only;
    const double* wd = &w[static_cast<size_t>(d * G * H * I)];
    const double* rd = &r[static_cast<size_t>(d * G * H * H)];
    const double* wb = &bias[static_cast<size_t>(d * 2 * G * H)];
    const double* rb = wb + G * H;
    const double* pd = &peep[static_cast<size_t>(d * 3 * H)];
    const Activation& f = acts[static_cast<size_t>(d * activations_of(C))];
    const Activation& g = acts[static_cast<size_t>(d * activations_of(C) + (C == Cell::kRnn ? 0 : 1))];
    const Activation& hact = acts[static_cast<size_t>(d * activations_of(C) + (C == Cell::kLstm ? 2 : 0))];
    for (int64_t b = 0; b < Bn; ++b) {
      double* hs = &hT[static_cast<size_t>((d * Bn + b) * H)];
      double* cs = &cT[static_cast<size_t>((d * Bn + b) * H)];
      const int64_t len = lens[static_cast<size_t>(b)];
      for (int64_t step = 0; step < len; ++step) {
        const int64_t t = backward ? len - 1 - step : step;
        std::copy(hs, hs + H, hprev.begin());
        std::copy(cs, cs + H, cprev.begin());
        // xw = W x + Wb, hr = R h + Rb, per gate row.
        for (int64_t gi = 0; gi < G * H; ++gi) {
          double a = wb[gi], c = rb[gi];
          for (int64_t i = 0; i < I; ++i) a += wd[gi * I + i] * x_at(t, b, i);
          for (int64_t k = 0; k < H; ++k) c += rd[gi * H + k] * hprev[static_cast<size_t>(k)];
          xw[static_cast<size_t>(gi)] = a;
          hr[static_cast<size_t>(gi)] = c;
        }
        if (C == Cell::kGru)
          for (int64_t k = 0; k < H; ++k)
            reset[static_cast<size_t>(k)] = f(clipped(xw[static_cast<size_t>(H + k)] + hr[static_cast<size_t>(H + k)]));
        for (int64_t k = 0; k < H; ++k) {
          auto X_ = [&](int64_t gate) { return xw[static_cast<size_t>(gate * H + k)]; };
          auto R_ = [&](int64_t gate) { return hr[static_cast<size_t>(gate * H + k)]; };
          if (C == Cell::kRnn) {
            hnew[static_cast<size_t>(k)] = f(clipped(X_(0) + R_(0)));
          } else if (C == Cell::kGru) {
            double z = f(clipped(X_(0) + R_(0)));
            double rr = reset[static_cast<size_t>(k)];
            double hh;
            if (lbr) {
              hh = g(clipped(X_(2) + rr * R_(2)));
            } else {
              // (r . h_prev) R_h^T + Rb_h: the reset gate applies before the recurrent matmul.
              double acc = rb[2 * H + k];
              for (int64_t m = 0; m < H; ++m)
                acc += rd[(2 * H + k) * H + m] * reset[static_cast<size_t>(m)] * hprev[static_cast<size_t>(m)];
              hh = g(clipped(X_(2) + acc));
            }
            hnew[static_cast<size_t>(k)] = (1 - z) * hh + z * hprev[static_cast<size_t>(k)];
          } else {
            // Gate order i, o, f, c; peepholes i, o, f.
            const double cp = cprev[static_cast<size_t>(k)];
            double ig = f(clipped(X_(0) + R_(0) + pd[k] * cp));
            double fg = input_forget ? 1 - ig : f(clipped(X_(2) + R_(2) + pd[2 * H + k] * cp));
            double cc = g(clipped(X_(3) + R_(3)));
            double cn = fg * cp + ig * cc;
            double og = f(clipped(X_(1) + R_(1) + pd[H + k] * cn));
            cnew[static_cast<size_t>(k)] = cn;
            hnew[static_cast<size_t>(k)] = og * hact(cn);
          }
        }
        std::copy(hnew.begin(), hnew.end(), hs);
        if (C == Cell::kLstm) std::copy(cnew.begin(), cnew.end(), cs);
        std::copy(hnew.begin(), hnew.end(), &y[static_cast<size_t>(((t * ND + d) * Bn + b) * H)]);
      }
    }
  }

  if (ctx.wants_output(0)) {
    if (!layout1) {
      ctx.set_output(0, arnn::from_f64(y, {S, ND, Bn, H}, dt));
    } else {
      std::vector<double> y1(y.size());
      for (int64_t t = 0; t < S; ++t)
        for (int64_t d = 0; d < ND; ++d)
          for (int64_t b = 0; b < Bn; ++b)
            for (int64_t k = 0; k < H; ++k)
              y1[static_cast<size_t>(((b * S + t) * ND + d) * H + k)] =
                  y[static_cast<size_t>(((t * ND + d) * Bn + b) * H + k)];
      ctx.set_output(0, arnn::from_f64(y1, {Bn, S, ND, H}, dt));
    }
  }
  auto state_out = [&](const std::vector<double>& s) {
    if (!layout1) return arnn::from_f64(s, {ND, Bn, H}, dt);
    std::vector<double> s1(s.size());
    for (int64_t d = 0; d < ND; ++d)
      for (int64_t b = 0; b < Bn; ++b)
        for (int64_t k = 0; k < H; ++k)
          s1[static_cast<size_t>((b * ND + d) * H + k)] = s[static_cast<size_t>((d * Bn + b) * H + k)];
    return arnn::from_f64(s1, {Bn, ND, H}, dt);
  };
  if (ctx.wants_output(1)) ctx.set_output(1, state_out(hT));
  if (C == Cell::kLstm && ctx.wants_output(2)) ctx.set_output(2, state_out(cT));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", RNN, 1, infer_rnn<Cell::kRnn>, rnn_kernel<Cell::kRnn>, 3, 6);
KILN_REGISTER_OP_ARITY("", GRU, 1, infer_rnn<Cell::kGru>, rnn_kernel<Cell::kGru>, 3, 6);
KILN_REGISTER_OP_ARITY("", LSTM, 1, infer_rnn<Cell::kLstm>, rnn_kernel<Cell::kLstm>, 3, 8);

}  // namespace kiln::ops
