// ai.onnx.ml ops: LabelEncoder, Binarizer, ArrayFeatureExtractor, TreeEnsemble.
#include <cmath>
#include <limits>
#include <map>

#include "ops/common.h"

namespace kiln::ops {
namespace {

// ---------------------------------------------------------------------------------------------
// LabelEncoder: maps each element through a key -> value table, with a default for unknown keys.
// Opset 1 maps strings to their index in `classes_strings` and back; opset 2+ uses keys_* and
// values_* lists (opset 4 also keys_tensor / values_tensor / default_tensor).

Tensor strings_tensor(const std::vector<std::string>& v) {
  Tensor t(DataType::kString, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.strings()[i] = v[i];
  return t;
}

Tensor floats_tensor(const std::vector<float>& v) {
  return Tensor::from_vector<float>(DataType::kFloat32, {static_cast<int64_t>(v.size())}, v);
}

struct LabelTable {
  Tensor keys, values, dflt;  // dflt: one element of the values' dtype
};

// Opset 2+: the first non-empty keys_* / values_* attribute.
Result<LabelTable> label_table(const ir::Node& node) {
  LabelTable t;
  auto pick = [&](const char* prefix, Tensor& out) -> Status {
    std::string p = prefix;
    if (const ir::Attribute* a = node.attr(p + "_strings"); a && !a->strings.empty())
      out = strings_tensor(a->strings);
    else if (const ir::Attribute* a = node.attr(p + "_int64s"); a && !a->ints.empty())
      out = make_i64_1d(a->ints);
    else if (const ir::Attribute* a = node.attr(p + "_floats"); a && !a->floats.empty())
      out = floats_tensor(a->floats);
    else if (const ir::Attribute* a = node.attr(p + "_tensor"); a && a->t.defined())
      out = a->t.reshaped({a->t.numel()});
    else
      return InvalidModel(node.where(), "no ", p, "_* attribute is given");
    return Status::Ok();
  };
  KILN_RETURN_IF_ERROR(pick("keys", t.keys));
  KILN_RETURN_IF_ERROR(pick("values", t.values));
  if (t.keys.numel() != t.values.numel())
    return InvalidModel(node.where(), "has ", t.keys.numel(), " keys but ", t.values.numel(), " values");
  DataType vt = t.values.dtype();
  const ir::Attribute* dt = node.attr("default_tensor");
  if (dt && dt->t.defined()) {
    if (dt->t.numel() != 1 || dt->t.dtype() != vt)
      return InvalidModel(node.where(), "default_tensor must hold one ", dtype_name(vt), ", got ", dt->t.describe());
    t.dflt = dt->t.reshaped({});
  } else if (vt == DataType::kString) {
    t.dflt = Tensor(DataType::kString, {});
    t.dflt.strings()[0] = node.attr_string("default_string", "_Unused");
  } else if (dtype_is_float(vt)) {
    t.dflt = Tensor(vt, {});
    t.dflt.set_f64(0, node.attr("default_float") ? node.attr_float("default_float", 0) : -0.0);
  } else {
    t.dflt = Tensor(vt, {});
    t.dflt.set_i64(0, node.attr_int("default_int64", -1));
  }
  return t;
}

Status infer_label_encoder(InferContext& ctx) {
  DataType out = DataType::kUndefined;
  if (ctx.opset() < 2) {
    DataType in = ctx.input_dtype(0);
    out = in == DataType::kString  ? DataType::kInt64
          : in == DataType::kInt64 ? DataType::kString
                                   : DataType::kUndefined;
  } else {
    auto t = label_table(ctx.node);
    if (!t.ok()) return t.status();
    out = t->values.dtype();
  }
  ctx.set_output(0, out, ctx.input_shape(0));
  return Status::Ok();
}

Status label_encoder_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  LabelTable table;
  if (ctx.opset() < 2) {
    const ir::Attribute* cls = ctx.node.attr("classes_strings");
    Tensor classes = strings_tensor(cls ? cls->strings : std::vector<std::string>{});
    Tensor index = make_i64_1d(std::vector<int64_t>());
    std::vector<int64_t> idx(static_cast<size_t>(classes.numel()));
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i);
    index = make_i64_1d(idx);
    if (x.dtype() == DataType::kString) {
      table.keys = classes, table.values = index;
      table.dflt = Tensor::scalar<int64_t>(DataType::kInt64, ctx.node.attr_int("default_int64", -1));
    } else if (x.dtype() == DataType::kInt64) {
      table.keys = index, table.values = classes;
      table.dflt = Tensor(DataType::kString, {});
      table.dflt.strings()[0] = ctx.node.attr_string("default_string", "_Unused");
    } else {
      return ctx.error(str_cat("input must be string or int64, got ", x.describe()));
    }
  } else {
    auto t = label_table(ctx.node);
    if (!t.ok()) return ctx.error(t.status().message());
    table = std::move(t).value();
  }
  const Tensor& keys = table.keys;
  bool str_keys = keys.dtype() == DataType::kString;
  if (str_keys != (x.dtype() == DataType::kString))
    return ctx.error(str_cat("input ", x.describe(), " does not match the ", dtype_name(keys.dtype()), " keys"));
  bool float_keys = dtype_is_float(keys.dtype()) || dtype_is_float(x.dtype());
  std::map<std::string, int64_t> by_string;
  std::map<int64_t, int64_t> by_int;
  std::map<double, int64_t> by_float;
  int64_t nan_key = -1;
  for (int64_t i = keys.numel() - 1; i >= 0; --i) {  // the first occurrence of a key wins
    if (str_keys)
      by_string[keys.strings()[i]] = i;
    else if (float_keys && std::isnan(keys.get_f64(i)))
      nan_key = i;
    else if (float_keys)
      by_float[keys.get_f64(i)] = i;
    else
      by_int[keys.get_i64(i)] = i;
  }
  Tensor out(table.values.dtype(), x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t hit = -1;
    if (str_keys) {
      auto it = by_string.find(x.strings()[i]);
      if (it != by_string.end()) hit = it->second;
    } else if (float_keys) {
      double v = x.get_f64(i);
      if (std::isnan(v)) {
        hit = nan_key;
      } else {
        auto it = by_float.find(v);
        if (it != by_float.end()) hit = it->second;
      }
    } else {
      auto it = by_int.find(x.get_i64(i));
      if (it != by_int.end()) hit = it->second;
    }
    if (hit >= 0)
      copy_elements(table.values, hit, out, i, 1);
    else
      copy_elements(table.dflt, 0, out, i, 1);
  }
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Binarizer: 1 where x > threshold, else 0, in x's dtype.

Status binarizer_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (!dtype_is_float(x.dtype()) && !dtype_is_integer(x.dtype()))
    return ctx.error(str_cat("input must be numeric, got ", x.describe()));
  double th = ctx.node.attr_float("threshold", 0.0f);
  Tensor out(x.dtype(), x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) out.set_f64(i, x.get_f64(i) > th ? 1.0 : 0.0);
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// ArrayFeatureExtractor: selects entries of the last axis of X by the indices in Y. A 1-D X
// gives a [1, len(Y)] result (as onnxruntime does).

Status infer_array_feature_extractor(InferContext& ctx) {
  const SymShape& x = ctx.input_shape(0);
  const SymShape& y = ctx.input_shape(1);
  Dim n = y.fully_known() ? Dim(dims_numel(y.concrete())) : ctx.new_symbol();
  if (!x.rank_known || x.rank() == 0) {
    ctx.set_output(0, ctx.input_dtype(0), SymShape());
    return Status::Ok();
  }
  std::vector<Dim> d = x.rank() == 1 ? std::vector<Dim>{Dim(1)} : std::vector<Dim>(x.dims.begin(), x.dims.end() - 1);
  d.push_back(n);
  ctx.set_output(0, ctx.input_dtype(0), SymShape(d));
  return Status::Ok();
}

Status array_feature_extractor_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& y = ctx.input(1);
  if (x.rank() == 0) return ctx.error("X must have rank >= 1");
  if (!dtype_is_integer(y.dtype())) return ctx.error(str_cat("Y must hold integer indices, got ", y.describe()));
  int64_t last = x.dim(x.rank() - 1);
  std::vector<int64_t> idx = to_i64_vector(y);
  for (int64_t v : idx)
    if (v < 0 || v >= last)
      return ctx.error(str_cat("index ", v, " is out of range for the last axis of ", x.describe()));
  int64_t k = static_cast<int64_t>(idx.size());
  Dims shape = x.rank() == 1 ? Dims{1} : Dims(x.shape().begin(), x.shape().end() - 1);
  shape.push_back(k);
  Tensor out(x.dtype(), shape);
  int64_t rows = last == 0 ? dims_numel(shape) / std::max<int64_t>(k, 1) : x.numel() / last;
  for (int64_t r = 0; r < rows && last > 0; ++r)
    for (int64_t j = 0; j < k; ++j) copy_elements(x, r * last + idx[static_cast<size_t>(j)], out, r * k + j, 1);
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// TreeEnsemble (ai.onnx.ml opset 5): X [N, F] -> Y [N, n_targets].

enum TreeMode { kLeq = 0, kLt, kGte, kGt, kEq, kNeq, kMember };
enum Aggregate { kAverage = 0, kSum, kMin, kMax };
enum PostTransform { kNone = 0, kSoftmax, kLogistic, kSoftmaxZero, kProbit };

struct Forest {
  std::vector<int64_t> features, true_ids, false_ids, true_leaf, false_leaf, missing_true, roots, leaf_targets;
  std::vector<int> modes;
  std::vector<double> splits, leaf_weights;
  std::vector<std::vector<double>> members;  // per node (MEMBER nodes only)
  int64_t n_targets = 0;
  int aggregate = kSum, post = kNone;
};

std::vector<double> tensor_attr_f64(const ir::Node& node, const char* name) {
  const ir::Attribute* a = node.attr(name);
  if (!a) return {};
  if (a->t.defined()) return to_f64_vector(a->t);
  return std::vector<double>(a->floats.begin(), a->floats.end());
}

Result<Forest> read_forest(const ir::Node& node) {
  Forest f;
  f.features = node.attr_ints("nodes_featureids");
  f.true_ids = node.attr_ints("nodes_truenodeids");
  f.false_ids = node.attr_ints("nodes_falsenodeids");
  f.true_leaf = node.attr_ints("nodes_trueleafs");
  f.false_leaf = node.attr_ints("nodes_falseleafs");
  f.missing_true = node.attr_ints("nodes_missing_value_tracks_true");
  f.roots = node.attr_ints("tree_roots");
  f.leaf_targets = node.attr_ints("leaf_targetids");
  f.splits = tensor_attr_f64(node, "nodes_splits");
  f.leaf_weights = tensor_attr_f64(node, "leaf_weights");
  for (double m : tensor_attr_f64(node, "nodes_modes"))
    f.modes.push_back(m >= static_cast<double>(kLeq) && m <= static_cast<double>(kMember) ? static_cast<int>(m)
                                                                                          : -1);  // -1: reported below
  f.n_targets = node.attr_int("n_targets", 0);
  int64_t aggregate = node.attr_int("aggregate_function", kSum), post = node.attr_int("post_transform", kNone);
  f.aggregate = aggregate >= kAverage && aggregate <= kMax ? static_cast<int>(aggregate) : -1;
  f.post = post >= kNone && post <= kProbit ? static_cast<int>(post) : -1;
  size_t n = f.features.size();
  auto bad = [&](const std::string& what) { return InvalidModel(node.where(), what); };
  if (f.true_ids.size() != n || f.false_ids.size() != n || f.true_leaf.size() != n || f.false_leaf.size() != n ||
      f.modes.size() != n || f.splits.size() != n)
    return bad(str_cat("the nodes_* attributes must all have one entry per node (", n, " featureids)"));
  if (!f.missing_true.empty() && f.missing_true.size() != n)
    return bad("nodes_missing_value_tracks_true must have one entry per node");
  if (f.leaf_targets.size() != f.leaf_weights.size()) return bad("leaf_targetids and leaf_weights differ in length");
  if (f.n_targets <= 0) return bad(str_cat("n_targets must be positive, got ", f.n_targets));
  if (f.aggregate < 0) return bad(str_cat("unknown aggregate_function ", aggregate));
  if (f.post < 0) return bad(str_cat("unknown post_transform ", post));
  for (int64_t t : f.leaf_targets)
    if (t < 0 || t >= f.n_targets)
      return bad(str_cat("leaf target ", t, " is out of range for ", f.n_targets, " targets"));
  for (size_t i = 0; i < n; ++i) {
    if (f.modes[i] < kLeq || f.modes[i] > kMember) return bad(str_cat("node ", i, " has unknown mode ", f.modes[i]));
    for (auto [id, leaf] : {std::pair{f.true_ids[i], f.true_leaf[i]}, std::pair{f.false_ids[i], f.false_leaf[i]}}) {
      size_t limit = leaf ? f.leaf_weights.size() : n;
      if (id < 0 || static_cast<size_t>(id) >= limit)
        return bad(str_cat("node ", i, " points to ", leaf ? "leaf " : "node ", id, ", out of range"));
    }
  }
  for (int64_t r : f.roots)
    if (r < 0 || static_cast<size_t>(r) >= n) return bad(str_cat("tree root ", r, " is out of range"));
  // Set members: runs of membership_values delimited by NaN, one per MEMBER node in node order.
  std::vector<double> mv = tensor_attr_f64(node, "membership_values");
  f.members.resize(n);
  size_t pos = 0;
  for (size_t i = 0; i < n; ++i) {
    if (f.modes[i] != kMember) continue;
    while (pos < mv.size() && !std::isnan(mv[pos])) f.members[i].push_back(mv[pos++]);
    if (pos >= mv.size()) return bad("membership_values has fewer NaN-delimited sets than MEMBER nodes");
    ++pos;
  }
  return f;
}

// Returns the leaf reached from `root` for one row of features.
Result<int64_t> walk_tree(const Forest& f, int64_t root, const double* x, int64_t n_features) {
  size_t r = static_cast<size_t>(root);
  // A root whose both branches lead to the same leaf is itself that leaf entry (as the reference).
  if (f.true_leaf[r] && f.false_leaf[r] && f.true_ids[r] == f.false_ids[r]) return f.true_ids[r];
  int64_t node = root;
  for (size_t steps = 0; steps <= f.features.size(); ++steps) {
    size_t i = static_cast<size_t>(node);
    int64_t feat = f.features[i];
    if (feat < 0 || feat >= n_features)
      return InvalidArgument("tree node ", i, " reads feature ", feat, " of ", n_features);
    double v = x[feat], s = f.splits[i];
    bool go_true = false;
    if (std::isnan(v) && !f.missing_true.empty() && f.missing_true[i]) {
      go_true = true;
    } else {
      switch (f.modes[i]) {
        case kLeq: go_true = v <= s; break;
        case kLt: go_true = v < s; break;
        case kGte: go_true = v >= s; break;
        case kGt: go_true = v > s; break;
        case kEq: go_true = v == s; break;
        case kNeq: go_true = v != s; break;
        case kMember:
          for (double m : f.members[i]) go_true |= m == v;
          break;
      }
    }
    int64_t next = go_true ? f.true_ids[i] : f.false_ids[i];
    if (go_true ? f.true_leaf[i] : f.false_leaf[i]) return next;
    node = next;
  }
  return InvalidArgument("tree rooted at node ", root, " has a cycle");
}

// Inverse of the error function: a rational first guess refined by Newton steps.
double erfinv(double y) {
  if (y <= -1) return -std::numeric_limits<double>::infinity();
  if (y >= 1) return std::numeric_limits<double>::infinity();
  double w = -std::log((1.0 - y) * (1.0 + y));
  double x = std::copysign(
      std::sqrt(std::sqrt(std::pow(2 / (M_PI * 0.147) + w / 2, 2) - w / 0.147) - (2 / (M_PI * 0.147) + w / 2)), y);
  for (int i = 0; i < 3; ++i) x -= (std::erf(x) - y) / (2 / std::sqrt(M_PI) * std::exp(-x * x));
  return x;
}

void post_transform(int post, std::vector<double>& row) {
  switch (post) {
    case kSoftmax:
    case kSoftmaxZero: {
      double mx = -std::numeric_limits<double>::infinity();
      for (double v : row)
        if (post == kSoftmax || v != 0) mx = std::max(mx, v);
      double sum = 0;
      for (double& v : row) {
        if (post == kSoftmaxZero && v == 0) continue;
        v = std::exp(v - mx);
        sum += v;
      }
      for (double& v : row)
        if (sum > 0 && (post == kSoftmax || v != 0)) v /= sum;
      break;
    }
    case kLogistic:
      for (double& v : row) v = 1.0 / (1.0 + std::exp(-v));
      break;
    case kProbit:
      for (double& v : row) v = std::sqrt(2.0) * erfinv(2 * v - 1);
      break;
    default: break;
  }
}

Status infer_tree_ensemble(InferContext& ctx) {
  const SymShape& x = ctx.input_shape(0);
  Dim n = x.rank_known && x.rank() >= 1 ? x.dims[0] : ctx.new_symbol();
  int64_t targets = ctx.node.attr_int("n_targets", 0);
  ctx.set_output(0, ctx.input_dtype(0), SymShape({n, targets > 0 ? Dim(targets) : ctx.new_symbol()}));
  return Status::Ok();
}

Status tree_ensemble_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (!dtype_is_float(x.dtype())) return ctx.error(str_cat("X must be a float tensor, got ", x.describe()));
  if (x.rank() != 2) return ctx.error(str_cat("X must be [N, features], got ", x.describe()));
  auto fr = read_forest(ctx.node);
  if (!fr.ok()) return fr.status();
  const Forest& f = fr.value();
  int64_t rows = x.dim(0), feats = x.dim(1);
  if (f.n_targets > (int64_t{1} << 40) / std::max<int64_t>(rows, 1))
    return ctx.error(str_cat("output [", rows, ", ", f.n_targets, "] is too large"));
  double big = x.dtype() == DataType::kFloat64   ? std::numeric_limits<double>::max()
               : x.dtype() == DataType::kFloat32 ? std::numeric_limits<float>::max()
                                                 : 65504.0;
  double init = f.aggregate == kMin ? big : f.aggregate == kMax ? -big : 0.0;
  Tensor out(x.dtype(), {rows, f.n_targets});
  std::vector<double> row(static_cast<size_t>(feats)), acc(static_cast<size_t>(f.n_targets));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < feats; ++c) row[static_cast<size_t>(c)] = x.get_f64(r * feats + c);
    std::fill(acc.begin(), acc.end(), init);
    for (int64_t root : f.roots) {
      auto leaf = walk_tree(f, root, row.data(), feats);
      if (!leaf.ok()) return ctx.error(leaf.status().message());
      size_t l = static_cast<size_t>(leaf.value());
      if (l >= f.leaf_weights.size()) return ctx.error(str_cat("tree reaches leaf ", l, ", out of range"));
      double w = f.leaf_weights[l];
      double& a = acc[static_cast<size_t>(f.leaf_targets[l])];
      switch (f.aggregate) {
        case kSum: a += w; break;
        case kAverage: a += w / static_cast<double>(f.roots.size()); break;
        case kMin: a = std::min(a, w); break;
        case kMax: a = std::max(a, w); break;
      }
    }
    post_transform(f.post, acc);
    for (int64_t t = 0; t < f.n_targets; ++t) out.set_f64(r * f.n_targets + t, acc[static_cast<size_t>(t)]);
  }
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

}  // namespace

KILN_REGISTER_OP_ARITY("ai.onnx.ml", LabelEncoder, 1, infer_label_encoder, label_encoder_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("ai.onnx.ml", Binarizer, 1, infer_same_as_input0, binarizer_kernel, 1, 1);
KILN_REGISTER_OP_ARITY("ai.onnx.ml", ArrayFeatureExtractor, 1, infer_array_feature_extractor,
                       array_feature_extractor_kernel, 2, 2);
KILN_REGISTER_OP_ARITY("ai.onnx.ml", TreeEnsemble, 5, infer_tree_ensemble, tree_ensemble_kernel, 1, 1);

}  // namespace kiln::ops
