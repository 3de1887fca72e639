// Einsum and Det.
#include <algorithm>
#include <cctype>
#include <cmath>

#include "ops/common.h"

namespace kiln::ops {
namespace {

// ---- Einsum ----
//
// Labels are the letters' character codes; the dims an ellipsis stands for get labels
// kEllipsisBase + j, right-aligned across inputs (numpy broadcasting of the ellipsis dims).
constexpr int kEllipsisMarker = -1;
constexpr int kEllipsisBase = 256;

struct EinsumTerm {
  std::vector<int> labels;  // letters and at most one kEllipsisMarker
  bool has_ellipsis() const { return std::count(labels.begin(), labels.end(), kEllipsisMarker) > 0; }
  int64_t letters() const { return static_cast<int64_t>(labels.size()) - (has_ellipsis() ? 1 : 0); }
};

struct EinsumEquation {
  std::vector<EinsumTerm> inputs;
  bool explicit_output = false;
  EinsumTerm output;
};

Result<EinsumTerm> parse_term(const std::string& s) {
  EinsumTerm t;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (std::isalpha(static_cast<unsigned char>(c))) {
      t.labels.push_back(static_cast<unsigned char>(c));
    } else if (c == '.') {
      if (s.compare(i, 3, "...") != 0 || t.has_ellipsis())
        return InvalidArgument("bad ellipsis in einsum term '", s, "'");
      t.labels.push_back(kEllipsisMarker);
      i += 2;
    } else {
      return InvalidArgument("unexpected character '", c, "' in einsum term '", s, "'");
    }
  }
  return t;
}

Result<EinsumEquation> parse_equation(const std::string& raw, size_t n_inputs) {
  std::string eq;
  for (char c : raw)
    if (!std::isspace(static_cast<unsigned char>(c))) eq += c;
  EinsumEquation e;
  size_t arrow = eq.find("->");
  std::string lhs = arrow == std::string::npos ? eq : eq.substr(0, arrow);
  size_t start = 0;
  while (true) {
    size_t comma = lhs.find(',', start);
    KILN_ASSIGN_OR_RETURN(EinsumTerm t, parse_term(lhs.substr(start, comma - start)));
    e.inputs.push_back(t);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (e.inputs.size() != n_inputs)
    return InvalidArgument("equation '", raw, "' has ", e.inputs.size(), " input terms but the node has ", n_inputs,
                           " inputs");
  if (arrow != std::string::npos) {
    e.explicit_output = true;
    KILN_ASSIGN_OR_RETURN(e.output, parse_term(eq.substr(arrow + 2)));
  }
  return e;
}

// The equation resolved against input ranks: each input axis's label, and the output labels.
struct EinsumPlan {
  std::vector<std::vector<int>> axis_labels;  // per input
  std::vector<int> out_labels;
  std::vector<int> sum_labels;
};

Result<EinsumPlan> plan_einsum(const EinsumEquation& e, const std::vector<int64_t>& ranks) {
  EinsumPlan p;
  int64_t ell_rank = 0;
  for (size_t i = 0; i < e.inputs.size(); ++i) {
    const EinsumTerm& t = e.inputs[i];
    int64_t ell = ranks[i] - t.letters();
    if (ell < 0 || (!t.has_ellipsis() && ell != 0))
      return InvalidArgument("input ", i, " has rank ", ranks[i], " but its einsum term has ", t.letters(), " labels",
                             t.has_ellipsis() ? " and an ellipsis" : "");
    ell_rank = std::max(ell_rank, ell);
  }
  std::vector<int> count(kEllipsisBase + 64, 0);
  if (ell_rank > 64) return InvalidArgument("einsum ellipsis covers too many dims (", ell_rank, ")");
  for (size_t i = 0; i < e.inputs.size(); ++i) {
    std::vector<int> labels;
    int64_t ell = ranks[i] - e.inputs[i].letters();
    for (int l : e.inputs[i].labels) {
      if (l == kEllipsisMarker) {
        for (int64_t j = 0; j < ell; ++j) labels.push_back(kEllipsisBase + static_cast<int>(ell_rank - ell + j));
      } else {
        labels.push_back(l);
      }
    }
    for (int l : labels) count[static_cast<size_t>(l)]++;
    p.axis_labels.push_back(labels);
  }
  if (e.explicit_output) {
    for (int l : e.output.labels) {
      if (l == kEllipsisMarker) {
        for (int64_t j = 0; j < ell_rank; ++j) p.out_labels.push_back(kEllipsisBase + static_cast<int>(j));
        continue;
      }
      if (count[static_cast<size_t>(l)] == 0)
        return InvalidArgument("output label '", static_cast<char>(l), "' does not appear in any input");
      if (std::count(p.out_labels.begin(), p.out_labels.end(), l) > 0)
        return InvalidArgument("output label '", static_cast<char>(l), "' is repeated");
      p.out_labels.push_back(l);
    }
  } else {
    for (int64_t j = 0; j < ell_rank; ++j) p.out_labels.push_back(kEllipsisBase + static_cast<int>(j));
    for (int l = 0; l < kEllipsisBase; ++l)
      if (count[static_cast<size_t>(l)] == 1) p.out_labels.push_back(l);
  }
  for (int l = 0; l < static_cast<int>(count.size()); ++l)
    if (count[static_cast<size_t>(l)] > 0 && std::count(p.out_labels.begin(), p.out_labels.end(), l) == 0)
      p.sum_labels.push_back(l);
  return p;
}

std::string label_name(int l) { return l >= kEllipsisBase ? "..." : std::string(1, static_cast<char>(l)); }

Status infer_einsum(InferContext& ctx) {
  DataType dt = ctx.input_dtype(0);
  std::vector<int64_t> ranks;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.input_shape(i).rank_known) {
      ctx.set_output(0, dt, SymShape());
      return Status::Ok();
    }
    ranks.push_back(static_cast<int64_t>(ctx.input_shape(i).rank()));
  }
  auto eq = parse_equation(ctx.node.attr_string("equation", ""), ctx.num_inputs());
  if (!eq.ok()) return ctx.error(eq.status().message());
  auto plan = plan_einsum(*eq, ranks);
  if (!plan.ok()) return ctx.error(plan.status().message());
  std::vector<Dim> dim(kEllipsisBase + 64);
  std::vector<bool> seen(dim.size(), false);
  for (size_t i = 0; i < plan->axis_labels.size(); ++i) {
    for (size_t a = 0; a < plan->axis_labels[i].size(); ++a) {
      size_t l = static_cast<size_t>(plan->axis_labels[i][a]);
      const Dim& d = ctx.input_shape(i).dims[a];
      if (!seen[l]) {
        dim[l] = d;
        seen[l] = true;
        continue;
      }
      // Sizes must agree, except that a size of 1 broadcasts (numpy einsum semantics).
      if (dim[l].known() && d.known() && dim[l].value != d.value && dim[l].value != 1 && d.value != 1)
        return ctx.error(
            str_cat("label '", label_name(static_cast<int>(l)), "' has size ", dim[l].value, " and size ", d.value));
      dim[l] = broadcast_sym(SymShape({dim[l]}), SymShape({d})).dims[0];
    }
  }
  std::vector<Dim> out;
  for (int l : plan->out_labels) out.push_back(dim[static_cast<size_t>(l)]);
  ctx.set_output(0, dt, SymShape(out));
  return Status::Ok();
}

Status einsum_kernel(KernelContext& ctx) {
  size_t n_in = ctx.num_inputs();
  if (n_in == 0) return ctx.error("Einsum needs at least one input");
  DataType dt = ctx.input(0).dtype();
  if (dt == DataType::kBool || (!dtype_is_builtin(dt) && !is_low_precision_float(dt)))
    return ctx.unsupported(str_cat("dtype ", dtype_name(dt), " is not supported"));
  std::vector<Tensor> in;
  std::vector<int64_t> ranks;
  for (size_t i = 0; i < n_in; ++i) {
    if (!ctx.has_input(i)) return ctx.error(str_cat("input ", i, " is missing"));
    if (ctx.input(i).dtype() != dt)
      return ctx.error(str_cat("input dtypes differ: ", ctx.input(0).describe(), " vs ", ctx.input(i).describe()));
    in.push_back(upcast_float(ctx.input(i)));
    ranks.push_back(in.back().rank());
  }
  auto eq = parse_equation(ctx.node.attr_string("equation", ""), n_in);
  if (!eq.ok()) return ctx.error(eq.status().message());
  auto plan_r = plan_einsum(*eq, ranks);
  if (!plan_r.ok()) return ctx.error(plan_r.status().message());
  const EinsumPlan& plan = *plan_r;
  // Label sizes (ellipsis dims broadcast) and per-input strides per label.
  std::vector<int64_t> size(kEllipsisBase + 64, -1);
  for (size_t i = 0; i < n_in; ++i) {
    for (size_t a = 0; a < plan.axis_labels[i].size(); ++a) {
      int l = plan.axis_labels[i][a];
      int64_t d = in[i].dim(static_cast<int64_t>(a));
      int64_t& s = size[static_cast<size_t>(l)];
      if (s < 0 || s == 1)
        s = d;  // a size of 1 broadcasts (numpy einsum semantics)
      else if (s != d && d != 1)
        return ctx.error(str_cat("label '", label_name(l), "' has size ", s, " and size ", d, " (input ", i, " ",
                                 in[i].describe(), ")"));
    }
  }
  std::vector<int> loop = plan.out_labels;
  loop.insert(loop.end(), plan.sum_labels.begin(), plan.sum_labels.end());
  size_t nl = loop.size();
  std::vector<int64_t> loop_size(nl);
  std::vector<std::vector<int64_t>> stride(n_in, std::vector<int64_t>(nl, 0));
  for (size_t p = 0; p < nl; ++p) loop_size[p] = size[static_cast<size_t>(loop[p])];
  for (size_t i = 0; i < n_in; ++i) {
    Dims st = strides_of(in[i].shape());
    for (size_t a = 0; a < plan.axis_labels[i].size(); ++a) {
      size_t p = static_cast<size_t>(std::find(loop.begin(), loop.end(), plan.axis_labels[i][a]) - loop.begin());
      if (in[i].dim(static_cast<int64_t>(a)) != 1 || loop_size[p] == 1) stride[i][p] += st[a];
    }
  }
  Dims out_shape;
  for (int l : plan.out_labels) out_shape.push_back(size[static_cast<size_t>(l)]);
  int64_t out_n = dims_numel(out_shape);
  int64_t sum_n = 1;
  for (size_t p = plan.out_labels.size(); p < nl; ++p) sum_n *= loop_size[p];
  Tensor out(in[0].dtype(), out_shape);
  dispatch_builtin(in[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      using Acc = std::conditional_t<std::is_floating_point_v<T>, double, uint64_t>;
      auto acc_of = [](T v) -> Acc {
        if constexpr (std::is_floating_point_v<T>)
          return v;
        else if constexpr (std::is_signed_v<T>)
          return static_cast<uint64_t>(static_cast<int64_t>(v));
        else
          return static_cast<uint64_t>(v);
      };
      T* po = out.data<T>();
      if (out_n == 0) return;
      std::vector<int64_t> idx(nl, 0), off(n_in, 0);
      for (int64_t o = 0; o < out_n; ++o) {
        Acc total = 0;
        for (int64_t s = 0; s < sum_n; ++s) {
          Acc prod = 1;
          for (size_t i = 0; i < n_in; ++i) prod *= acc_of(in[i].data<T>()[off[i]]);
          total += prod;
          // Advance the odometer (innermost label last).
          for (size_t p = nl; p-- > 0;) {
            if (++idx[p] < loop_size[p]) {
              for (size_t i = 0; i < n_in; ++i) off[i] += stride[i][p];
              break;
            }
            for (size_t i = 0; i < n_in; ++i) off[i] -= stride[i][p] * (loop_size[p] - 1);
            idx[p] = 0;
          }
        }
        po[o] = static_cast<T>(total);
        if (sum_n == 0) {
          // No summed element: the odometer did not move; step the output labels by hand.
          for (size_t p = plan.out_labels.size(); p-- > 0;) {
            if (++idx[p] < loop_size[p]) {
              for (size_t i = 0; i < n_in; ++i) off[i] += stride[i][p];
              break;
            }
            for (size_t i = 0; i < n_in; ++i) off[i] -= stride[i][p] * (loop_size[p] - 1);
            idx[p] = 0;
          }
        }
      }
    }
  });
  ctx.set_output(0, downcast_float(out, dt));
  return Status::Ok();
}

// ---- Det: determinant of the trailing square matrices, by LU with partial pivoting ----

Status infer_det(InferContext& ctx) {
  const SymShape& in = ctx.input_shape(0);
  if (!in.rank_known) {
    ctx.set_output(0, ctx.input_dtype(0), SymShape());
    return Status::Ok();
  }
  if (in.rank() < 2) return ctx.error(str_cat("input must have rank >= 2, got ", in.str()));
  const Dim& r = in.dims[in.rank() - 2];
  const Dim& c = in.dims[in.rank() - 1];
  if (r.known() && c.known() && r.value != c.value)
    return ctx.error(str_cat("matrices must be square, got ", in.str()));
  ctx.set_output(0, ctx.input_dtype(0), SymShape(std::vector<Dim>(in.dims.begin(), in.dims.end() - 2)));
  return Status::Ok();
}

Status det_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (!dtype_is_float(x.dtype())) return ctx.unsupported(str_cat("Det needs a float input, got ", x.describe()));
  if (x.rank() < 2 || x.dim(x.rank() - 1) != x.dim(x.rank() - 2))
    return ctx.error(str_cat("input must be (..., M, M), got ", x.describe()));
  int64_t m = x.dim(x.rank() - 1);
  Dims out_shape(x.shape().begin(), x.shape().end() - 2);
  int64_t batches = dims_numel(out_shape);
  std::vector<double> v = to_f64_vector(x);
  Tensor out(DataType::kFloat64, out_shape);
  double* po = out.data<double>();
  for (int64_t b = 0; b < batches; ++b) {
    double* a = v.data() + b * m * m;
    double det = 1;
    for (int64_t col = 0; col < m; ++col) {
      int64_t piv = col;
      for (int64_t r = col + 1; r < m; ++r)
        if (std::fabs(a[r * m + col]) > std::fabs(a[piv * m + col])) piv = r;
      if (a[piv * m + col] == 0) {
        det = 0;
        break;
      }
      if (piv != col) {
        for (int64_t j = 0; j < m; ++j) std::swap(a[col * m + j], a[piv * m + j]);
        det = -det;
      }
      double d = a[col * m + col];
      det *= d;
      for (int64_t r = col + 1; r < m; ++r) {
        double f = a[r * m + col] / d;
        for (int64_t j = col; j < m; ++j) a[r * m + j] -= f * a[col * m + j];
      }
    }
    po[b] = det;
  }
  ctx.set_output(0, out.cast(x.dtype()).value());
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", Einsum, 12, infer_einsum, einsum_kernel, 1, -1);
KILN_REGISTER_OP_ARITY("", Det, 11, infer_det, det_kernel, 1, 1);

}  // namespace kiln::ops
