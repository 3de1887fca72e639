// fuse_attention: scaled dot-product attention written out with ONNX ops
//
//   s = MatMul(Q', Kt)                       Q' = Q, or Mul(Q, c) / Div(Q, c) (scale on Q first)
//   s = Mul(s, c) | Div(s, c)                optional scale (scalar constant)
//   s = Add(s, mask)                         optional mask (either operand order)
//   p = Softmax(s) over the last axis
//   y = MatMul(p, V)
//
// becomes kiln.Attention(Q, K, V, mask?) with scale = the product of the scale factors and
// k_transposed = 0 when Kt is a Transpose swapping K's last two axes (the Transpose goes too),
// else 1 (Kt is passed as it is: e.g. torch's head split and k.transpose(-2, -1) merged into one
// Transpose by remove_noop_ops).
//
// Preconditions: every intermediate has exactly one reader; scores, probabilities and output are
// float; the mask does not broadcast the scores up (the Add's output has the scores' shape); the
// Softmax axis is the last (rank known; opset < 13 coerces to 2-D, which equals the last axis only
// then). Scale factors move from Q or from Div to one multiplication of the scores: equal up to
// float rounding (exactly equal for powers of two such as 1/sqrt(64)). Leaves alone: Softmax over
// another axis, probabilities read elsewhere (returned attention weights), non-constant scales,
// dropout between Softmax and MatMul that remove_noop_ops could not drop.
//
// For a CUDA target (fuse_attention_for), only what the CUDA tactic (backends/cuda/
// cuda_attention_tactics.cc) takes is fused: float32/float16/bfloat16 values, at most 6 batch dims,
// and Q, K and V each with the output's batch dims or all ones (shared); anything else stays the
// plain ops, which have CUDA kernels, rather than become a layer only the host runs.
#include "passes/fusion_util.h"

namespace kiln::passes {

namespace {

using fusion::is_onnx;

// A Mul/Div by a scalar constant: the operand it scales and the factor.
bool scalar_scale(const ir::Graph& g, const ir::Node& n, std::string* in, double* factor) {
  double c;
  if (n.inputs.size() != 2 || n.outputs.size() != 1) return false;
  if (is_onnx(n, "Mul")) {
    for (size_t k = 0; k < 2; ++k)
      if (ir::constant_scalar(g, n.inputs[k], &c) && !ir::is_constant(g, n.inputs[1 - k])) {
        *in = n.inputs[1 - k];
        *factor = c;
        return fusion::same_type(g, n.outputs[0], *in);  // the constant does not broadcast it up
      }
    return false;
  }
  if (is_onnx(n, "Div") && ir::constant_scalar(g, n.inputs[1], &c) && c != 0 && !ir::is_constant(g, n.inputs[0])) {
    *in = n.inputs[0];
    *factor = 1.0 / c;
    return fusion::same_type(g, n.outputs[0], *in);
  }
  return false;
}

struct Scores {
  int matmul = -1;
  double scale = 1;
  std::set<int> nodes;
};

// Walks up from `s` through an optional scalar scale to the Q Kt MatMul.
bool walk_scores(const ir::Graph& g, const ir::UseIndex& uses, std::string s, Scores* out) {
  for (int step = 0; step < 2; ++step) {
    int p = uses.producer(s);
    if (p < 0 || !uses.single_use(s)) return false;
    const ir::Node& n = g.nodes[static_cast<size_t>(p)];
    if (fusion::is_onnx(n, "MatMul") && n.inputs.size() == 2 && n.inputs[0] != n.inputs[1]) {
      out->matmul = p;
      out->nodes.insert(p);
      return true;
    }
    double f;
    if (step > 0 || !scalar_scale(g, n, &s, &f)) return false;
    out->scale *= f;
    out->nodes.insert(p);
  }
  return false;
}

bool softmax_over_last_axis(const ir::Graph& g, const ir::Node& sm) {
  if (!is_onnx(sm, "Softmax") || sm.inputs.size() != 1 || sm.outputs.size() != 1) return false;
  const ir::TypeInfo* t = fusion::type_of(g, sm.inputs[0]);
  if (!t || !t->shape.rank_known || t->shape.rank() < 2) return false;
  int64_t rank = static_cast<int64_t>(t->shape.rank());
  int64_t axis = sm.attr_int("axis", sm.opset >= 13 ? -1 : 1);
  if (axis < 0) axis += rank;
  return axis == rank - 1;
}

bool is_last_two_swap(const ir::Graph& g, const ir::Node& t) {
  if (!is_onnx(t, "Transpose") || t.inputs.size() != 1) return false;
  const ir::TypeInfo* ti = fusion::type_of(g, t.inputs[0]);
  if (!ti || !ti->shape.rank_known || ti->shape.rank() < 2) return false;
  size_t r = ti->shape.rank();
  std::vector<int64_t> perm = t.attr_ints("perm");
  if (perm.empty()) return r == 2;  // default: reversed axes
  if (perm.size() != r) return false;
  for (size_t i = 0; i + 2 < r; ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return perm[r - 2] == static_cast<int64_t>(r - 1) && perm[r - 1] == static_cast<int64_t>(r - 2);
}

// Whether the CUDA attention tactic takes Attention(q, k, v) -> y (see the header comment).
bool cuda_takes(const ir::Graph& g, const std::string& q, const std::string& k, const std::string& v,
                const std::string& y) {
  const ir::TypeInfo* yt = fusion::type_of(g, y);
  if (!yt || !yt->shape.rank_known || yt->shape.rank() < 2 || yt->shape.rank() > 8) return false;
  if (yt->elem != DataType::kFloat32 && yt->elem != DataType::kFloat16 && yt->elem != DataType::kBFloat16) return false;
  const size_t nb = yt->shape.rank() - 2;
  for (const std::string* x : {&q, &k, &v}) {
    const ir::TypeInfo* t = fusion::type_of(g, *x);
    if (!t || !t->shape.rank_known || t->shape.rank() < 2 || t->elem != yt->elem) return false;
    const size_t xb = t->shape.rank() - 2;
    bool ones = true, same = xb == nb;
    for (size_t i = 0; i < xb; ++i) {
      const Dim& d = t->shape.dims[i];
      ones = ones && d.known() && d.value == 1;
      same = same && fusion::same_dim(d, yt->shape.dims[i]);
    }
    if (!ones && !same) return false;
  }
  return true;
}

bool try_attention(ir::Graph& g, const ir::UseIndex& uses, int smi, bool cuda) {
  auto node = [&](int i) -> const ir::Node& { return g.nodes[static_cast<size_t>(i)]; };
  const ir::Node& sm = node(smi);
  if (!softmax_over_last_axis(g, sm)) return false;
  int mm2 = fusion::sole_consumer(uses, sm.outputs[0]);
  if (mm2 < 0 || !is_onnx(node(mm2), "MatMul") || node(mm2).inputs.size() != 2 ||
      node(mm2).inputs[0] != sm.outputs[0] || node(mm2).inputs[1] == sm.outputs[0])
    return false;
  std::set<int> group = {smi, mm2};
  const std::string v = node(mm2).inputs[1];
  // Up from the Softmax input: [Add(mask)] <- [Mul/Div(scale)] <- MatMul.
  const std::string scores_out = sm.inputs[0];
  std::string mask;
  Scores sc;
  if (!walk_scores(g, uses, scores_out, &sc)) {
    int p = uses.producer(scores_out);
    if (p < 0 || !uses.single_use(scores_out)) return false;
    const ir::Node& add = node(p);
    if (!is_onnx(add, "Add") || add.inputs.size() != 2 || add.inputs[0] == add.inputs[1]) return false;
    for (size_t k = 0; k < 2 && mask.empty(); ++k) {
      sc = Scores{};
      // The mask must not broadcast the scores up.
      if (walk_scores(g, uses, add.inputs[k], &sc) && fusion::same_type(g, add.outputs[0], add.inputs[k]))
        mask = add.inputs[1 - k];
    }
    if (mask.empty()) return false;
    group.insert(p);
  }
  group.insert(sc.nodes.begin(), sc.nodes.end());
  double scale = sc.scale;
  std::string q = node(sc.matmul).inputs[0], kt = node(sc.matmul).inputs[1];
  // Scale applied to Q before the product.
  int qp = uses.producer(q);
  std::string q_in;
  double f;
  if (qp >= 0 && uses.single_use(q) && scalar_scale(g, node(qp), &q_in, &f)) {
    scale *= f;
    group.insert(qp);
    q = q_in;
  }
  // K given transposed by a last-two-axes Transpose: take K itself.
  int k_transposed = 1;
  std::string k = kt;
  int tp = uses.producer(kt);
  if (tp >= 0 && uses.single_use(kt) && is_last_two_swap(g, node(tp))) {
    k = node(tp).inputs[0];
    k_transposed = 0;
    group.insert(tp);
  }
  if (!fusion::is_float_value(g, scores_out) || !fusion::is_float_value(g, node(mm2).outputs[0]) ||
      !fusion::in_float_range(scale))
    return false;
  if (cuda && !cuda_takes(g, q, k, v, node(mm2).outputs[0])) return false;
  ir::Node att = fusion::kiln_node("Attention", node(mm2).name);
  att.inputs = {q, k, v};
  if (!mask.empty()) att.inputs.push_back(mask);
  att.outputs = {node(mm2).outputs[0]};
  fusion::set_float(att, "scale", static_cast<float>(scale));
  fusion::set_int(att, "k_transposed", k_transposed);
  fusion::replace_group(g, group, std::move(att));
  return true;
}

}  // namespace

Result<int> fuse_attention(ir::Graph& g) {
  return fusion::rewrite_until_fixpoint(
      g, [](ir::Graph& gr, const ir::UseIndex& uses, int i) { return try_attention(gr, uses, i, false); });
}

Result<int> fuse_attention_for(ir::Graph& g, const Target& target) {
  const bool cuda = target.device.kind == DeviceKind::kCUDA;
  return fusion::rewrite_until_fixpoint(
      g, [cuda](ir::Graph& gr, const ir::UseIndex& uses, int i) { return try_attention(gr, uses, i, cuda); });
}

// fuse_attention_heads: kiln.Attention whose Q, K and V are heads split off [B, S, H*D]
// projections and whose output is merged back the same way:
//
//   Xq -> Reshape [B, S, H, D] -> Transpose(0, 2, 1, 3) -> Q
//   Xk -> Reshape [B, S, H, D] -> Transpose(0, 2, 1, 3) -> K   (k_transposed = 0)
//                              or Transpose(0, 2, 3, 1) -> K'  (k_transposed = 1)
//   Xv -> Reshape [B, S, H, Dv] -> Transpose(0, 2, 1, 3) -> V
//   Attention(Q, K, V, mask?) -> Transpose(0, 2, 1, 3) -> Reshape [B, S, H*Dv] -> Y
//
// becomes kiln.MultiHeadAttention(Xq, Xk, Xv, mask?) -> Y (num_heads H, the same scale), which
// reads the heads in place: the layout copies go. When Xq, Xk and Xv are, in that order, the three
// equal outputs of one Split along the last axis (a merged QKV projection made by
// fuse_horizontal_matmul), the Split goes too and the op reads the packed projection.
//
// Preconditions: static ranks (3 for X, 4 for the heads), H and D known, B and S the same
// symbols or numbers on both sides of each Reshape, float values. Besides the pattern's own
// edges, the removed values may only be read by Shape nodes whose outputs only feed Gathers of
// constant non-negative indices (the batch/sequence sizes exporters compute for the Reshapes);
// those Shape nodes are redirected to a kept value with the same dims at those indices. Exact:
// the same arithmetic on the same elements.
namespace {

bool perm_is(const ir::Node& t, std::vector<int64_t> want) {
  return is_onnx(t, "Transpose") && t.inputs.size() == 1 && t.attr_ints("perm") == want;
}

const SymShape* shape_of(const ir::Graph& g, const std::string& v, size_t rank) {
  const ir::TypeInfo* t = fusion::type_of(g, v);
  if (!t || !t->shape.rank_known || t->shape.rank() != rank || !dtype_is_float(t->elem)) return nullptr;
  return &t->shape;
}

struct HeadsMatch {
  std::set<int> group;                              // nodes that go
  std::vector<std::string> removed;                 // values that disappear with them
  std::vector<std::pair<int, std::string>> shapes;  // Shape readers to redirect: (node, value read)
};

// `v` is read by `reader` and otherwise only by Shape nodes feeding Gathers of constant indices;
// those are recorded (their gathered indices checked when redirecting).
bool read_by(const ir::Graph& g, const ir::UseIndex& uses, const std::string& v, int reader, HeadsMatch* m) {
  if (uses.is_graph_output(v)) return false;
  int seen = 0;
  for (int c : uses.consumers(v)) {
    if (c == reader) {
      ++seen;
      continue;
    }
    const ir::Node& s = g.nodes[static_cast<size_t>(c)];
    if (!is_onnx(s, "Shape") || s.attr("start") || s.attr("end")) return false;
    m->shapes.emplace_back(c, v);
  }
  return seen == 1;
}

// The dims a Shape node's output is read at (Gathers of constant non-negative scalar indices).
bool gathered_dims(const ir::Graph& g, const ir::UseIndex& uses, int shape_node, std::vector<int64_t>* dims) {
  const std::string& out = g.nodes[static_cast<size_t>(shape_node)].outputs[0];
  if (uses.is_graph_output(out)) return false;
  for (int c : uses.consumers(out)) {
    const ir::Node& n = g.nodes[static_cast<size_t>(c)];
    const Tensor* idx = n.inputs.size() == 2 ? ir::constant_value(g, n.inputs[1]) : nullptr;
    if (!is_onnx(n, "Gather") || n.inputs[0] != out || n.attr_int("axis", 0) != 0 || !idx || idx->numel() != 1 ||
        !dtype_is_integer(idx->dtype()) || idx->get_i64(0) < 0)
      return false;
    dims->push_back(idx->get_i64(0));
  }
  return true;
}

// X -> Reshape [B, S, H, D] -> Transpose(perm) -> `att` input; H and D of the heads.
bool head_split(const ir::Graph& g, const ir::UseIndex& uses, const std::string& in, int att,
                const std::vector<int64_t>& perm, HeadsMatch* m, std::string* x, int64_t* h, int64_t* d) {
  int ti = uses.producer(in);
  if (ti < 0 || !perm_is(g.nodes[static_cast<size_t>(ti)], perm) || !read_by(g, uses, in, att, m)) return false;
  const std::string& r_out = g.nodes[static_cast<size_t>(ti)].inputs[0];
  int ri = uses.producer(r_out);
  if (ri < 0 || !is_onnx(g.nodes[static_cast<size_t>(ri)], "Reshape") || !read_by(g, uses, r_out, ti, m)) return false;
  const ir::Node& r = g.nodes[static_cast<size_t>(ri)];
  const SymShape* rs = shape_of(g, r_out, 4);
  const SymShape* xs = r.inputs.empty() ? nullptr : shape_of(g, r.inputs[0], 3);
  if (!rs || !xs || !rs->dims[2].known() || !rs->dims[3].known() || !xs->dims[2].known()) return false;
  if (!fusion::same_dim(rs->dims[0], xs->dims[0]) || !fusion::same_dim(rs->dims[1], xs->dims[1]) ||
      rs->dims[2].value * rs->dims[3].value != xs->dims[2].value)
    return false;
  *x = r.inputs[0], *h = rs->dims[2].value, *d = rs->dims[3].value;
  m->group.insert({ti, ri});
  m->removed.insert(m->removed.end(), {in, r_out});
  return true;
}

// The Split node whose outputs 0, 1, 2 are xs[0..2], three equal parts along the last axis.
int packed_split(const ir::Graph& g, const ir::UseIndex& uses, const std::vector<std::string>& xs) {
  int si = uses.producer(xs[0]);
  if (si < 0) return -1;
  const ir::Node& s = g.nodes[static_cast<size_t>(si)];
  if (!is_onnx(s, "Split") || s.outputs.size() != 3 || s.inputs.empty()) return -1;
  for (size_t i = 0; i < 3; ++i)
    if (s.outputs[i] != xs[i]) return -1;
  const SymShape* in = shape_of(g, s.inputs[0], 3);
  const SymShape* part = shape_of(g, xs[0], 3);
  if (!in || !part || !in->dims[2].known() || !part->dims[2].known() || in->dims[2].value != 3 * part->dims[2].value)
    return -1;
  int64_t axis = s.attr_int("axis", 0);
  if (axis != -1 && axis != 2) return -1;
  for (size_t i = 1; i < 3; ++i)
    if (!fusion::same_type(g, xs[0], xs[i])) return -1;  // equal parts
  return si;
}

bool try_heads(ir::Graph& g, const ir::UseIndex& uses, int ai) {
  const ir::Node& att = g.nodes[static_cast<size_t>(ai)];
  if (!fusion::is_kiln(att, "Attention") || att.inputs.size() < 3 || att.outputs.size() != 1) return false;
  const std::vector<int64_t> heads_perm = {0, 2, 1, 3};
  bool kt = att.attr_int("k_transposed", 0) != 0;
  HeadsMatch m;
  m.group.insert(ai);
  std::vector<std::string> xs(3);
  int64_t h[3], d[3];
  for (size_t i = 0; i < 3; ++i) {
    std::vector<int64_t> perm = i == 1 && kt ? std::vector<int64_t>{0, 2, 3, 1} : heads_perm;
    if (!head_split(g, uses, att.inputs[i], ai, perm, &m, &xs[i], &h[i], &d[i])) return false;
  }
  if (h[0] != h[1] || h[0] != h[2] || d[0] != d[1]) return false;
  // Output: Transpose(0, 2, 1, 3) -> Reshape [B, S, H*Dv].
  const std::string& y4 = att.outputs[0];
  int ot = -1, orr = -1;
  for (int c : uses.consumers(y4))
    if (perm_is(g.nodes[static_cast<size_t>(c)], heads_perm)) ot = c;
  if (ot < 0 || !read_by(g, uses, y4, ot, &m)) return false;
  const std::string& yt = g.nodes[static_cast<size_t>(ot)].outputs[0];
  for (int c : uses.consumers(yt))
    if (is_onnx(g.nodes[static_cast<size_t>(c)], "Reshape") && g.nodes[static_cast<size_t>(c)].inputs[0] == yt) orr = c;
  if (orr < 0 || !read_by(g, uses, yt, orr, &m)) return false;
  const std::string& y = g.nodes[static_cast<size_t>(orr)].outputs[0];
  const SymShape* ts = shape_of(g, yt, 4);
  const SymShape* ys = shape_of(g, y, 3);
  if (!ts || !ys || !ys->dims[2].known() || ys->dims[2].value != h[2] * d[2] ||
      !fusion::same_dim(ts->dims[0], ys->dims[0]) || !fusion::same_dim(ts->dims[1], ys->dims[1]))
    return false;
  m.group.insert({ot, orr});
  m.removed.insert(m.removed.end(), {y4, yt});
  int split = packed_split(g, uses, xs);
  if (split >= 0) {
    for (size_t i = 0; i < 3; ++i) {
      int reshape = uses.producer(g.nodes[static_cast<size_t>(uses.producer(att.inputs[i]))].inputs[0]);
      if (!read_by(g, uses, xs[i], reshape, &m)) split = -1;
    }
  }
  if (split >= 0) {
    m.group.insert(split);
    m.removed.insert(m.removed.end(), xs.begin(), xs.end());
  }
  // Redirect the Shape readers of removed values, or give up.
  std::vector<std::string> kept = {y};
  if (split >= 0)
    kept.push_back(g.nodes[static_cast<size_t>(split)].inputs[0]);
  else
    kept.insert(kept.end(), xs.begin(), xs.end());
  std::vector<std::pair<int, std::string>> redirect;
  for (const auto& [node, value] : m.shapes) {
    if (std::find(m.removed.begin(), m.removed.end(), value) == m.removed.end()) continue;
    std::vector<int64_t> dims;
    const ir::TypeInfo* vt = fusion::type_of(g, value);
    if (!vt || !vt->shape.rank_known || !gathered_dims(g, uses, node, &dims)) return false;
    std::string to;
    for (const std::string& k : kept) {
      bool ok = true;
      if (k == y) {  // its type is the Reshape's output type: known
        for (int64_t i : dims)
          ok &= i < 3 && static_cast<size_t>(i) < vt->shape.rank() &&
                fusion::same_dim(ys->dims[static_cast<size_t>(i)], vt->shape.dims[static_cast<size_t>(i)]);
      } else {
        const ir::TypeInfo* kt2 = fusion::type_of(g, k);
        ok = kt2 && kt2->shape.rank_known;
        for (int64_t i : dims)
          ok = ok && static_cast<size_t>(i) < kt2->shape.rank() && static_cast<size_t>(i) < vt->shape.rank() &&
               fusion::same_dim(kt2->shape.dims[static_cast<size_t>(i)], vt->shape.dims[static_cast<size_t>(i)]);
      }
      if (ok) {
        to = k;
        break;
      }
    }
    if (to.empty()) return false;
    redirect.emplace_back(node, to);
  }
  ir::Node mha = fusion::kiln_node("MultiHeadAttention", att.name);
  if (split >= 0)
    mha.inputs = {g.nodes[static_cast<size_t>(split)].inputs[0], "", ""};
  else
    mha.inputs = xs;
  if (att.inputs.size() > 3 && !att.inputs[3].empty()) mha.inputs.push_back(att.inputs[3]);
  while (!mha.inputs.empty() && mha.inputs.back().empty()) mha.inputs.pop_back();
  mha.outputs = {y};
  fusion::set_int(mha, "num_heads", h[0]);
  fusion::set_float(mha, "scale", att.attr_float("scale", 1.f));
  for (const auto& [node, to] : redirect) g.nodes[static_cast<size_t>(node)].inputs[0] = to;
  fusion::replace_group(g, m.group, std::move(mha));
  return true;
}

}  // namespace

Result<int> fuse_attention_heads(ir::Graph& g) { return fusion::rewrite_until_fixpoint(g, try_heads); }

}  // namespace kiln::passes
