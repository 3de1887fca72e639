// Normalizations with learned scale/bias: LayerNormalization, RMSNormalization,
// GroupNormalization, InstanceNormalization, BatchNormalization.
//
// Statistics are computed in double whatever the stash type; results round once to the
// output dtype.
#include <cmath>

#include "ops/op_traits.h"
#include "ops/reduce_util.h"

namespace kiln::ops {
namespace {

// Whether a parameter of shape `p` (described as `desc`) broadcasts (numpy, unidirectionally) to
// `target`: the kernel's check, also run by inference on known shapes.
Status check_broadcast_param(const Dims& p, const std::string& desc, const Dims& target, const char* name) {
  bool ok = p.size() <= target.size();
  for (size_t i = 0; ok && i < p.size(); ++i) {
    int64_t d = p[p.size() - 1 - i], t = target[target.size() - 1 - i];
    ok = d == t || d == 1;
  }
  if (!ok) return InvalidArgument(name, " ", desc, " cannot be broadcast to ", dims_str(target));
  return Status::Ok();
}

// Values of `p` broadcast (numpy, unidirectionally) to `target`.
Result<std::vector<double>> broadcast_param(const Tensor& p, const Dims& target, const char* name) {
  if (!dtype_is_float(p.dtype()) && !dtype_is_integer(p.dtype()))
    return InvalidArgument(name, " must be numeric, got ", p.describe());
  KILN_RETURN_IF_ERROR(check_broadcast_param(p.shape(), p.describe(), target, name));
  std::vector<double> v(static_cast<size_t>(dims_numel(target)));
  BroadcastIndex bi(p.shape(), target);
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) v[static_cast<size_t>(i)] = p.get_f64(bi(i));
  return v;
}

// A float input's values as double (any float dtype).
Result<std::vector<double>> float_values(const KernelContext& ctx, size_t i, const char* name) {
  const Tensor& t = ctx.input(i);
  if (!dtype_is_float(t.dtype())) return InvalidArgument(name, " must be a float tensor, got ", t.describe());
  return to_f64_vector(t);
}

Tensor tensor_from_f64(const std::vector<double>& v, Dims shape, DataType dt) {
  Tensor t(DataType::kFloat64, std::move(shape));
  double* p = t.data<double>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = v[i];
  return dt == DataType::kFloat64 ? t : t.cast(dt).value();
}

DataType stash_dtype(const ir::Node& n) {
  int64_t s = n.attr_int("stash_type", 1);
  if (s == static_cast<int64_t>(DataType::kFloat64)) return DataType::kFloat64;
  if (s == static_cast<int64_t>(DataType::kFloat16)) return DataType::kFloat16;
  if (s == static_cast<int64_t>(DataType::kBFloat16)) return DataType::kBFloat16;
  return DataType::kFloat32;
}

// ---- LayerNormalization / RMSNormalization ----

Status infer_layer_norm(InferContext& ctx) {
  const SymShape& in = ctx.input_shape(0);
  ctx.set_output(0, ctx.input_dtype(0), in);
  SymShape stat;
  if (in.rank_known) {
    int64_t rank = static_cast<int64_t>(in.rank());
    auto axis = normalize_axis(ctx.node.attr_int("axis", -1), rank);
    if (!axis.ok() || rank == 0)
      return ctx.error(str_cat("axis ", ctx.node.attr_int("axis", -1), " is out of range for rank ", rank));
    std::vector<Dim> d(in.dims);
    for (int64_t i = *axis; i < rank; ++i) d[static_cast<size_t>(i)] = Dim(1);
    stat = SymShape(d);
    // Scale and B as the kernel expands them (to the normalized shape, or to X), where known.
    if (in.fully_known()) {
      const Dims x = in.concrete(), norm(x.begin() + *axis, x.end());
      for (size_t i = 1; i < 3; ++i) {
        const SymShape& p = ctx.input_shape(i);
        if (!ctx.has_input(i) || !p.fully_known()) continue;
        const Dims pd = p.concrete();
        Status st = check_broadcast_param(pd, str_cat(dtype_name(ctx.input_dtype(i)), dims_str(pd)),
                                          pd.size() <= norm.size() ? norm : x, i == 1 ? "Scale" : "B");
        if (!st.ok()) return ctx.error(st.message());
      }
    }
  }
  for (size_t o = 1; o < ctx.outputs.size(); ++o) ctx.set_output(o, stash_dtype(ctx.node), stat);
  return Status::Ok();
}

template <bool kRms>
Status layer_norm_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  if (!dtype_is_float(x0.dtype())) return ctx.unsupported(str_cat("X must be a float tensor, got ", x0.describe()));
  int64_t rank = x0.rank();
  auto axis = normalize_axis(ctx.node.attr_int("axis", -1), rank);
  if (!axis.ok() || rank == 0)
    return ctx.error(str_cat("axis ", ctx.node.attr_int("axis", -1), " is out of range for rank ", rank));
  double eps = ctx.node.attr_float("epsilon", 1e-5f);
  Dims norm_shape(x0.shape().begin() + *axis, x0.shape().end());
  AxisSplit sp = split_2d(x0.shape(), *axis);  // outer = rows, len = normalized elements
  // Scale/B broadcast to the normalized shape; failing that, to the whole input.
  auto expand = [&](size_t i, const char* name) -> Result<std::vector<double>> {
    const Tensor& p = ctx.input(i);
    if (p.rank() <= static_cast<int64_t>(norm_shape.size())) return broadcast_param(p, norm_shape, name);
    return broadcast_param(p, x0.shape(), name);
  };
  KILN_ASSIGN_OR_RETURN(std::vector<double> scale, expand(1, "Scale"));
  std::vector<double> bias;
  if (!kRms && ctx.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(bias, expand(2, "B"));
  }
  // Each parameter is expanded either to one row (per_row) or to the whole input.
  bool scale_row = static_cast<int64_t>(scale.size()) == sp.len;
  bool bias_row = static_cast<int64_t>(bias.size()) == sp.len;
  std::vector<double> x = to_f64_vector(x0);
  std::vector<double> y(x.size()), mean(static_cast<size_t>(sp.outer)), inv(static_cast<size_t>(sp.outer));
  for (int64_t r = 0; r < sp.outer; ++r) {
    const double* row = x.data() + r * sp.len;
    double m = 0, v = 0;
    if (!kRms) {
      for (int64_t k = 0; k < sp.len; ++k) m += row[k];
      m /= static_cast<double>(sp.len);
    }
    for (int64_t k = 0; k < sp.len; ++k) v += (row[k] - m) * (row[k] - m);
    v /= static_cast<double>(sp.len);
    double is = 1.0 / std::sqrt(v + eps);
    mean[static_cast<size_t>(r)] = m;
    inv[static_cast<size_t>(r)] = is;
    for (int64_t k = 0; k < sp.len; ++k) {
      size_t full = static_cast<size_t>(r * sp.len + k);
      double out = (row[k] - m) * is * scale[scale_row ? static_cast<size_t>(k) : full];
      if (!bias.empty()) out += bias[bias_row ? static_cast<size_t>(k) : full];
      y[static_cast<size_t>(r * sp.len + k)] = out;
    }
  }
  ctx.set_output(0, tensor_from_f64(y, x0.shape(), x0.dtype()));
  if (!kRms) {
    Dims stat_shape = x0.shape();
    for (int64_t i = *axis; i < rank; ++i) stat_shape[static_cast<size_t>(i)] = 1;
    DataType sdt = stash_dtype(ctx.node);
    if (ctx.wants_output(1)) ctx.set_output(1, tensor_from_f64(mean, stat_shape, sdt));
    if (ctx.wants_output(2)) ctx.set_output(2, tensor_from_f64(inv, stat_shape, sdt));
  }
  return Status::Ok();
}

// ---- Instance / Group normalization ----

// Normalizes x (N, C, ...) over groups of `C / groups` channels times the spatial size, then
// applies per-channel (or per-group) scale and bias.
Status group_norm_common(KernelContext& ctx, int64_t groups, bool per_group_params, double eps) {
  const Tensor& x0 = ctx.input(0);
  if (!dtype_is_float(x0.dtype())) return ctx.unsupported(str_cat("X must be a float tensor, got ", x0.describe()));
  if (x0.rank() < 2) return ctx.error(str_cat("X must have rank >= 2 (N, C, ...), got ", x0.describe()));
  int64_t n = x0.dim(0), c = x0.dim(1);
  int64_t spatial = 1;
  for (int64_t i = 2; i < x0.rank(); ++i) spatial *= x0.dim(i);
  if (groups <= 0 || c % groups != 0)
    return ctx.error(str_cat("num_groups ", groups, " must be positive and divide the channel count ", c));
  int64_t nparam = per_group_params ? groups : c;
  KILN_ASSIGN_OR_RETURN(std::vector<double> scale, float_values(ctx, 1, "scale"));
  KILN_ASSIGN_OR_RETURN(std::vector<double> bias, float_values(ctx, 2, "bias"));
  if (static_cast<int64_t>(scale.size()) != nparam || static_cast<int64_t>(bias.size()) != nparam)
    return ctx.error(str_cat("scale and bias must have ", nparam, per_group_params ? " (num_groups)" : " (channels)",
                             " elements, got ", ctx.input(1).describe(), " and ", ctx.input(2).describe()));
  int64_t cpg = c / groups;
  int64_t block = cpg * spatial;
  std::vector<double> x = to_f64_vector(x0);
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < n * groups; ++b) {
    const double* px = x.data() + b * block;
    double m = 0, v = 0;
    for (int64_t k = 0; k < block; ++k) m += px[k];
    m = block ? m / static_cast<double>(block) : 0;
    for (int64_t k = 0; k < block; ++k) v += (px[k] - m) * (px[k] - m);
    v = block ? v / static_cast<double>(block) : 0;
    double is = 1.0 / std::sqrt(v + eps);
    int64_t g = b % groups;
    for (int64_t k = 0; k < block; ++k) {
      int64_t ch = g * cpg + k / (spatial ? spatial : 1);
      size_t pi = static_cast<size_t>(per_group_params ? g : ch);
      y[static_cast<size_t>(b * block + k)] = (px[k] - m) * is * scale[pi] + bias[pi];
    }
  }
  ctx.set_output(0, tensor_from_f64(y, x0.shape(), x0.dtype()));
  return Status::Ok();
}

// group_norm_common's checks where X's channels and the parameter shapes are known, with its
// messages: a build refuses what a run would.
Status infer_group_norm_common(InferContext& ctx, int64_t groups, bool per_group_params) {
  const SymShape& x = ctx.input_shape(0);
  if (x.rank_known && x.rank() < 2) return ctx.error(str_cat("X must have rank >= 2 (N, C, ...), got ", x.str()));
  if (x.rank_known && x.dims[1].known()) {
    const int64_t c = x.dims[1].value;
    if (groups <= 0 || c % groups != 0)
      return ctx.error(str_cat("num_groups ", groups, " must be positive and divide the channel count ", c));
    const int64_t nparam = per_group_params ? groups : c;
    const SymShape &s = ctx.input_shape(1), &b = ctx.input_shape(2);
    if (s.fully_known() && b.fully_known() &&
        (dims_numel(s.concrete()) != nparam || dims_numel(b.concrete()) != nparam))
      return ctx.error(str_cat("scale and bias must have ", nparam, per_group_params ? " (num_groups)" : " (channels)",
                               " elements, got ", dtype_name(ctx.input_dtype(1)), dims_str(s.concrete()), " and ",
                               dtype_name(ctx.input_dtype(2)), dims_str(b.concrete())));
  }
  return infer_same_as_input0(ctx);
}

Status infer_instance_norm(InferContext& ctx) {
  const SymShape& x = ctx.input_shape(0);
  if (!x.rank_known || x.rank() < 2 || !x.dims[1].known()) return infer_group_norm_common(ctx, 1, true);
  return infer_group_norm_common(ctx, x.dims[1].value, false);
}

Status infer_group_norm(InferContext& ctx) {
  if (!ctx.node.attr("num_groups")) return ctx.error("attribute 'num_groups' is required");
  return infer_group_norm_common(ctx, ctx.node.attr_int("num_groups", 1), ctx.opset() < 21);
}

Status instance_norm_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  int64_t c = x0.rank() >= 2 ? x0.dim(1) : 0;
  return group_norm_common(ctx, c, false, ctx.node.attr_float("epsilon", 1e-5f));
}

Status group_norm_kernel(KernelContext& ctx) {
  if (!ctx.node.attr("num_groups")) return ctx.error("attribute 'num_groups' is required");
  // Opset 18 takes scale and bias per group; opset 21 per channel.
  return group_norm_common(ctx, ctx.node.attr_int("num_groups", 1), ctx.opset() < 21,
                           ctx.node.attr_float("epsilon", 1e-5f));
}

// ---- BatchNormalization ----

// Whether the node computes batch statistics (training) rather than using the running ones.
bool bn_training(const ir::Node& n) {
  if (n.opset >= 14) return n.attr_int("training_mode", 0) != 0;
  int outs = 0;
  for (size_t i = 0; i < n.outputs.size(); ++i) outs += n.has_output(i) ? 1 : 0;
  // Opset 7..13: training is signalled by asking for the statistics outputs. Before 7, is_test=0
  // also means training; models exported for inference that only read Y get inference.
  if (n.opset < 7) return n.attr_int("is_test", 0) == 0 && outs > 1;
  return outs > 1;
}

// Per-channel (spatial) or per-element (spatial=0, opset < 9) statistics layout.
bool bn_spatial(const ir::Node& n) { return n.opset >= 9 || n.attr_int("spatial", 1) != 0; }

Status infer_batch_norm(InferContext& ctx) {
  const SymShape& in = ctx.input_shape(0);
  // The kernel's parameter-count check where the shapes are known, with its message: the engine
  // (fold_batch_norm) must not broadcast a scale of length 1 over C channels that a run refuses.
  if (in.rank_known && in.rank() < 2) return ctx.error(str_cat("X must have rank >= 2 (N, C, ...), got ", in.str()));
  if (in.rank_known) {
    const bool spatial = bn_spatial(ctx.node);
    int64_t nstat = 1;
    bool known = true;
    for (size_t i = 1; i < in.rank() && known; ++i)
      if (i == 1 || !spatial) {
        known = in.dims[i].known();
        if (known && __builtin_mul_overflow(nstat, in.dims[i].value, &nstat)) known = false;
      }
    const char* names[] = {"X", "scale", "B", "mean", "var"};
    for (size_t i = 1; i < 5 && known; ++i) {
      const SymShape& p = ctx.input_shape(i);
      if (!ctx.has_input(i) || !p.fully_known()) continue;
      const Dims d = p.concrete();
      if (dims_numel(d) != nstat)
        return ctx.error(str_cat(names[i], " must have ", nstat, " elements (", spatial ? "channels" : "C x D1 x ...",
                                 "), got ", dtype_name(ctx.input_dtype(i)), dims_str(d)));
    }
  }
  ctx.set_output(0, ctx.input_dtype(0), in);
  for (size_t o = 1; o < ctx.outputs.size(); ++o) {
    size_t src = o % 2 == 1 ? 3 : 4;  // mean-like outputs follow input 'mean', var-like 'var'
    ctx.set_output(o, ctx.input_dtype(src), ctx.input_shape(src));
  }
  return Status::Ok();
}

Status batch_norm_kernel(KernelContext& ctx) {
  const Tensor& x0 = ctx.input(0);
  if (!dtype_is_float(x0.dtype())) return ctx.unsupported(str_cat("X must be a float tensor, got ", x0.describe()));
  if (x0.rank() < 2) return ctx.error(str_cat("X must have rank >= 2 (N, C, ...), got ", x0.describe()));
  bool spatial = bn_spatial(ctx.node);
  bool training = bn_training(ctx.node);
  double eps = ctx.node.attr_float("epsilon", 1e-5f);
  double momentum = ctx.node.attr_float("momentum", 0.9f);
  std::vector<bool> reduced(static_cast<size_t>(x0.rank()), spatial);
  reduced[0] = true;
  reduced[1] = false;
  int64_t nstat = 1;
  Dims stat_shape;
  for (int64_t i = 1; i < x0.rank(); ++i)
    if (!reduced[static_cast<size_t>(i)]) {
      nstat *= x0.dim(i);
      stat_shape.push_back(x0.dim(i));
    }
  const char* names[] = {"X", "scale", "B", "mean", "var"};
  std::vector<double> p[5];
  for (size_t i = 1; i < 5; ++i) {
    KILN_ASSIGN_OR_RETURN(p[i], float_values(ctx, i, names[i]));
    if (static_cast<int64_t>(p[i].size()) != nstat)
      return ctx.error(str_cat(names[i], " must have ", nstat, " elements (", spatial ? "channels" : "C x D1 x ...",
                               "), got ", ctx.input(i).describe()));
  }
  std::vector<double> x = to_f64_vector(x0);
  std::vector<double> mean = p[3], var = p[4];
  if (training) {
    std::vector<double> sum(static_cast<size_t>(nstat), 0.0), sq(static_cast<size_t>(nstat), 0.0);
    int64_t cnt = nstat ? static_cast<int64_t>(x.size()) / nstat : 0;
    for_each_reduced(x0.shape(), reduced, [&](int64_t i, int64_t o) { sum[static_cast<size_t>(o)] += x[i]; });
    for (auto& s : sum) s = cnt ? s / static_cast<double>(cnt) : 0;
    for_each_reduced(x0.shape(), reduced, [&](int64_t i, int64_t o) {
      double d = x[i] - sum[static_cast<size_t>(o)];
      sq[static_cast<size_t>(o)] += d * d;
    });
    for (auto& s : sq) s = cnt ? s / static_cast<double>(cnt) : 0;
    mean = sum;
    var = sq;
  }
  std::vector<double> a(static_cast<size_t>(nstat)), b(static_cast<size_t>(nstat));
  for (size_t c = 0; c < a.size(); ++c) {
    a[c] = p[1][c] / std::sqrt(var[c] + eps);
    b[c] = p[2][c] - mean[c] * a[c];
  }
  std::vector<double> y(x.size());
  for_each_reduced(x0.shape(), reduced, [&](int64_t i, int64_t o) {
    y[static_cast<size_t>(i)] = x[static_cast<size_t>(i)] * a[static_cast<size_t>(o)] + b[static_cast<size_t>(o)];
  });
  ctx.set_output(0, tensor_from_f64(y, x0.shape(), x0.dtype()));
  if (training) {
    std::vector<double> run_mean(mean.size()), run_var(var.size());
    for (size_t c = 0; c < mean.size(); ++c) {
      run_mean[c] = p[3][c] * momentum + mean[c] * (1 - momentum);
      run_var[c] = p[4][c] * momentum + var[c] * (1 - momentum);
    }
    Dims sshape = ctx.input(3).shape();
    DataType mdt = ctx.input(3).dtype(), vdt = ctx.input(4).dtype();
    if (ctx.wants_output(1)) ctx.set_output(1, tensor_from_f64(run_mean, sshape, mdt));
    if (ctx.wants_output(2)) ctx.set_output(2, tensor_from_f64(run_var, sshape, vdt));
    if (ctx.wants_output(3)) ctx.set_output(3, tensor_from_f64(mean, sshape, mdt));
    if (ctx.wants_output(4)) ctx.set_output(4, tensor_from_f64(var, sshape, vdt));
  } else {
    // Inference with statistics outputs requested (legacy): pass the running values through.
    for (size_t o = 1; o < ctx.num_outputs() && o < 5; ++o)
      if (ctx.wants_output(o)) ctx.set_output(o, ctx.input(o <= 2 ? o + 2 : o));
  }
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("", LayerNormalization, 17, infer_layer_norm, layer_norm_kernel<false>, 2, 3);
KILN_REGISTER_OP_ARITY("", RMSNormalization, 23, infer_same_as_input0, layer_norm_kernel<true>, 2, 2);
KILN_REGISTER_OP_ARITY("", GroupNormalization, 18, infer_group_norm, group_norm_kernel, 3, 3);
KILN_REGISTER_OP_ARITY("", InstanceNormalization, 1, infer_instance_norm, instance_norm_kernel, 3, 3);
KILN_REGISTER_OP_ARITY("", BatchNormalization, 1, infer_batch_norm, batch_norm_kernel, 5, 5);

KILN_OP_TRAITS("", BatchNormalization, trait::kInPlace);  // per-element with per-channel constants

}  // namespace kiln::ops
