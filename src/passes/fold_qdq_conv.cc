// fold_qdq_conv: folds the QuantizeLinear / DequantizeLinear pairs around the layers of a CNN (the
// Q/DQ format of ONNX Runtime's quantize_static, PyTorch's exporter, kiln's calibrator) into
// quantized layers, so 8-bit values flow from layer to layer (ops/kiln_quantized.h):
//  - DQ(x) , DQ(w int8, per-tensor or per-axis 0, zero point 0) [, DQ(bias int32)] -> Conv
//    [-> Relu | Clip] -> Q                                               => kiln.QConv
//  - the same around Gemm (alpha = beta = 1, transA 0; B a constant)    => kiln.QConv on [N, C]
//  - DQ(a), DQ(b) -> Add [-> Relu] -> Q where a is a kiln.QConv's only output read only here
//                                                                        => that QConv with b as residual
//  - DQ -> MaxPool | AveragePool (no pads counted) | GlobalAveragePool -> Q  => kiln.QPool
//  - DQ -> Flatten | Reshape | Concat -> Q with the same scale, zero point and type  => the op on the integers
// Then the 4-D quantized layers go channels-last (what int8 convolution kernels want): Transposes
// at the region's boundaries, none between quantized neighbours.
//
// Exactness: the folded layers compute what the Q/DQ graph computes (a residual Add folded into the
// conv keeps the conv's own Q as the layer's inner quantization, rounding and saturation included).
// The bias must be in units of x_scale * w_scale (quantize_static's; checked to 1e-5 relative), else
// the conv is left alone. Anything else (per-axis activations, non-zero weight zero points, float
// biases, other consumers of an intermediate) is left as it is, to the FP32 path.
// Runs first in the pipeline: fold_constants would otherwise turn the weights' DQ into floats.
#include <cmath>
#include <map>

#include "ir/attribute_builders.h"
#include "ir/rewrite.h"
#include "ops/kiln_quantized.h"
#include "passes/pass.h"

namespace kiln::passes {

namespace {

struct QParams {
  std::string q;  // the quantized value (DQ's input / Q's output)
  float scale = 1;
  int64_t zero_point = 0;
  DataType type = DataType::kUndefined;
};

bool is_8bit(DataType t) { return t == DataType::kUInt8 || t == DataType::kInt8; }

DataType dtype_of(const ir::Graph& g, const std::string& v) {
  if (const Tensor* t = ir::constant_value(g, v)) return t->dtype();
  auto it = g.value_types.find(v);
  return it == g.value_types.end() || !it->second.is_tensor() ? DataType::kUndefined : it->second.elem;
}

// Scale and zero point inputs (1, 2) of a Q/DQ node when per-tensor constants.
bool scalar_params(const ir::Graph& g, const ir::Node& n, QParams* p) {
  if (n.inputs.size() < 2 || n.attr_int("block_size", 0) != 0) return false;
  const Tensor* s = ir::constant_value(g, n.inputs[1]);
  if (!s || s->numel() != 1 || s->dtype() != DataType::kFloat32) return false;
  p->scale = static_cast<float>(s->get_f64(0));
  if (!(p->scale > 0) || !std::isfinite(p->scale)) return false;
  if (n.has_input(2)) {
    const Tensor* z = ir::constant_value(g, n.inputs[2]);
    if (!z || z->numel() != 1) return false;
    p->zero_point = z->get_i64(0);
  }
  return true;
}

// The DQ producing `v` (per-tensor, 8-bit, not a constant) or -1.
int dq_of(const ir::Graph& g, const ir::UseIndex& uses, const std::string& v, QParams* p) {
  int i = uses.producer(v);
  if (i < 0) return -1;
  const ir::Node& n = g.nodes[static_cast<size_t>(i)];
  if (!n.domain.empty() || n.op_type != "DequantizeLinear" || !scalar_params(g, n, p)) return -1;
  p->q = n.inputs[0];
  p->type = dtype_of(g, p->q);
  if (!is_8bit(p->type) || ir::is_constant(g, p->q)) return -1;
  return i;
}

// A per-tensor QuantizeLinear to 8 bits.
bool q_params(const ir::Graph& g, const ir::Node& n, QParams* p) {
  if (!n.domain.empty() || n.op_type != "QuantizeLinear" || !scalar_params(g, n, p)) return false;
  if (n.attr_int("saturate", 1) != 1 || n.attr_int("output_dtype", 0) != 0) return false;
  p->q = n.outputs[0];
  p->type = n.has_input(2) ? dtype_of(g, n.inputs[2]) : DataType::kUInt8;
  return is_8bit(p->type);
}

// The only reader of `v` (not a graph output), or -1.
int only_reader(const ir::UseIndex& uses, const std::string& v) {
  if (!uses.single_use(v)) return -1;
  return uses.consumers(v)[0];
}

// From `v` (a layer's float output): [Relu | Clip with constant bounds] then Q, each the only reader.
// Fills the activation and returns the Q's index (or -1); `chain` gets the nodes passed.
int activation_then_q(const ir::Graph& g, const ir::UseIndex& uses, const std::string& v, std::string* act, float* lo,
                      float* hi, std::vector<int>* chain, QParams* out) {
  int r = only_reader(uses, v);
  if (r < 0) return -1;
  const ir::Node* n = &g.nodes[static_cast<size_t>(r)];
  act->clear();
  if (n->domain.empty() && (n->op_type == "Relu" || n->op_type == "Clip")) {
    if (n->op_type == "Clip") {
      double a = -INFINITY, b = INFINITY;
      if (n->opset < 11) {
        a = n->attr_float("min", -INFINITY), b = n->attr_float("max", INFINITY);
      } else {
        if (n->has_input(1) && !ir::constant_scalar(g, n->inputs[1], &a)) return -1;
        if (n->has_input(2) && !ir::constant_scalar(g, n->inputs[2], &b)) return -1;
      }
      *lo = static_cast<float>(a), *hi = static_cast<float>(b);
    }
    *act = n->op_type;
    chain->push_back(r);
    r = only_reader(uses, n->outputs[0]);
    if (r < 0) return -1;
    n = &g.nodes[static_cast<size_t>(r)];
  }
  if (!q_params(g, *n, out)) return -1;
  chain->push_back(r);
  return r;
}

// Weights behind DQ(w): int8 constant, zero points 0, scales per tensor or along `axis`.
bool weight_dq(const ir::Graph& g, const ir::UseIndex& uses, const std::string& v, int64_t axis, const Tensor** w,
               std::vector<float>* scales) {
  int i = uses.producer(v);
  if (i < 0) return false;
  const ir::Node& n = g.nodes[static_cast<size_t>(i)];
  if (!n.domain.empty() || n.op_type != "DequantizeLinear" || n.inputs.size() < 2) return false;
  *w = ir::constant_value(g, n.inputs[0]);
  const Tensor* s = ir::constant_value(g, n.inputs[1]);
  if (!*w || !s || (*w)->dtype() != DataType::kInt8 || s->dtype() != DataType::kFloat32) return false;
  if (n.attr_int("block_size", 0) != 0) return false;
  if (s->numel() != 1) {
    int64_t ax = n.attr_int("axis", 1);
    if (ax < 0) ax += (*w)->rank();
    if (ax != axis || s->rank() != 1 || s->numel() != (*w)->dim(static_cast<size_t>(axis))) return false;
  }
  if (n.has_input(2)) {
    const Tensor* z = ir::constant_value(g, n.inputs[2]);
    if (!z) return false;
    for (int64_t k = 0; k < z->numel(); ++k)
      if (z->get_i64(k) != 0) return false;
  }
  scales->clear();
  for (int64_t k = 0; k < s->numel(); ++k) {
    float f = static_cast<float>(s->get_f64(k));
    if (!(f > 0) || !std::isfinite(f)) return false;
    scales->push_back(f);
  }
  return true;
}

// The int32 bias behind DQ(b) whose scale is x_scale * w_scale[m] (to 1e-5 relative).
bool bias_dq(const ir::Graph& g, const ir::UseIndex& uses, const std::string& v, float xs, const std::vector<float>& ws,
             int64_t m, std::string* bias_name) {
  int i = uses.producer(v);
  if (i < 0) return false;
  const ir::Node& n = g.nodes[static_cast<size_t>(i)];
  if (!n.domain.empty() || n.op_type != "DequantizeLinear" || n.inputs.size() < 2) return false;
  const Tensor* b = ir::constant_value(g, n.inputs[0]);
  const Tensor* s = ir::constant_value(g, n.inputs[1]);
  if (!b || !s || b->dtype() != DataType::kInt32 || b->numel() != m || s->dtype() != DataType::kFloat32) return false;
  if (s->numel() != 1 && s->numel() != m) return false;
  if (n.has_input(2)) {
    const Tensor* z = ir::constant_value(g, n.inputs[2]);
    if (!z) return false;
    for (int64_t k = 0; k < z->numel(); ++k)
      if (z->get_i64(k) != 0) return false;
  }
  for (int64_t k = 0; k < m; ++k) {
    const double want = static_cast<double>(xs) * ws[ws.size() == 1 ? 0 : static_cast<size_t>(k)];
    const double have = s->get_f64(s->numel() == 1 ? 0 : k);
    if (std::fabs(have - want) > 1e-5 * want) return false;
  }
  *bias_name = n.inputs[0];
  return true;
}

void set_quant_attrs(ir::Node& n, const QParams& x, const QParams& y) {
  n.attrs["x_scale"] = ir::attr_float(x.scale);
  n.attrs["x_zero_point"] = ir::attr_int(x.zero_point);
  n.attrs["y_scale"] = ir::attr_float(y.scale);
  n.attrs["y_zero_point"] = ir::attr_int(y.zero_point);
  n.attrs["y_type"] = ir::attr_int(static_cast<int64_t>(y.type));
}

ir::Attribute floats_attr(std::vector<float> v) {
  ir::Attribute a;
  a.type = ir::Attribute::Type::kFloats;
  a.floats = std::move(v);
  return a;
}

// Conv / Gemm -> kiln.QConv. Returns the sites changed; `dead` gets the nodes they replaced.
int fold_linear(ir::Graph& g, std::set<int>* dead) {
  ir::UseIndex uses(g);
  int changed = 0;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    ir::Node& n = g.nodes[k];
    if (!n.domain.empty() || (n.op_type != "Conv" && n.op_type != "Gemm") || n.inputs.size() < 2) continue;
    const bool gemm = n.op_type == "Gemm";
    if (gemm && (n.attr_float("alpha", 1) != 1 || n.attr_float("beta", 1) != 1 || n.attr_int("transA", 0) != 0))
      continue;
    QParams x, y;
    if (dq_of(g, uses, n.inputs[0], &x) < 0) continue;
    const bool trans_b = gemm && n.attr_int("transB", 0) != 0;
    const Tensor* w = nullptr;
    std::vector<float> ws;
    if (!weight_dq(g, uses, n.inputs[1], gemm && !trans_b ? 1 : 0, &w, &ws)) continue;
    if (gemm ? w->rank() != 2 : w->rank() != 4) continue;  // 2-D convolutions (and Gemm)
    const int64_t m = gemm && !trans_b ? w->dim(1) : w->dim(0);
    std::string bias;
    if (n.has_input(2) && !bias_dq(g, uses, n.inputs[2], x.scale, ws, m, &bias)) continue;
    std::string act;
    float lo = 0, hi = 0;
    std::vector<int> chain;
    if (activation_then_q(g, uses, n.outputs[0], &act, &lo, &hi, &chain, &y) < 0) continue;
    // The weights as [M, C/group, kh, kw] int8 (a Gemm's as [M, K, 1, 1]).
    const std::string w_name = ir::unique_name(g, n.name + "/qweights");
    Tensor wt(DataType::kInt8, gemm ? Dims{m, w->numel() / m, 1, 1} : w->shape());
    if (gemm && !trans_b) {
      const int64_t kdim = w->dim(0);
      for (int64_t r = 0; r < kdim; ++r)
        for (int64_t c = 0; c < m; ++c) wt.data<int8_t>()[c * kdim + r] = w->data<int8_t>()[r * m + c];
    } else {
      std::copy(w->data<int8_t>(), w->data<int8_t>() + w->numel(), wt.data<int8_t>());
    }
    g.initializers[w_name] = std::move(wt);
    ir::Node q;
    q.name = n.name;
    q.op_type = "QConv";
    q.domain = "kiln";
    q.opset = 1;
    q.inputs = {x.q, w_name};
    if (!bias.empty()) q.inputs.push_back(bias);
    q.outputs = {g.nodes[static_cast<size_t>(chain.back())].outputs[0]};
    if (!gemm)
      for (const char* a : {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})
        if (const ir::Attribute* at = n.attr(a)) q.attrs[a] = *at;
    set_quant_attrs(q, x, y);
    q.attrs["w_scales"] = floats_attr(ws);
    if (!act.empty()) q.attrs["activation"] = ir::attr_string(act);
    if (act == "Clip") q.attrs["activation_min"] = ir::attr_float(lo), q.attrs["activation_max"] = ir::attr_float(hi);
    for (int c : chain) {
      ir::add_sources(q, g.nodes[static_cast<size_t>(c)]);
      dead->insert(c);
    }
    g.nodes[k] = std::move(q);
    ++changed;
  }
  return changed;
}

// DQ(a) + DQ(b) [-> Relu] -> Q with a the only output of a kiln.QConv without residual or activation.
int fold_residual_add(ir::Graph& g, std::set<int>* dead) {
  ir::UseIndex uses(g);
  int changed = 0;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const ir::Node& add = g.nodes[k];
    if (!add.domain.empty() || add.op_type != "Add" || add.inputs.size() != 2) continue;
    QParams in[2];
    int dq[2] = {dq_of(g, uses, add.inputs[0], &in[0]), dq_of(g, uses, add.inputs[1], &in[1])};
    if (dq[0] < 0 || dq[1] < 0) continue;
    std::string act;
    float lo = 0, hi = 0;
    std::vector<int> chain;
    QParams y;
    if (activation_then_q(g, uses, add.outputs[0], &act, &lo, &hi, &chain, &y) < 0 || act == "Clip") continue;
    for (int side = 0; side < 2; ++side) {
      const int p = uses.producer(in[side].q);
      if (p < 0 || dq[side] == dq[1 - side]) continue;
      ir::Node& conv = g.nodes[static_cast<size_t>(p)];
      if (conv.domain != "kiln" || conv.op_type != "QConv" || conv.inputs.size() > 3 || conv.attr("activation"))
        continue;
      if (only_reader(uses, in[side].q) != dq[side] || only_reader(uses, add.inputs[side]) != static_cast<int>(k))
        continue;
      const QParams& r = in[1 - side];
      conv.inputs.resize(3);
      conv.inputs.push_back(r.q);
      conv.attrs["residual_scale"] = ir::attr_float(r.scale);
      conv.attrs["residual_zero_point"] = ir::attr_int(r.zero_point);
      // The conv's own Q stays part of the layer (its rounding and saturation before the sum).
      conv.attrs["inner_scale"] = conv.attrs["y_scale"];
      conv.attrs["inner_zero_point"] = conv.attrs["y_zero_point"];
      conv.attrs["inner_type"] = conv.attrs["y_type"];
      conv.attrs["y_scale"] = ir::attr_float(y.scale);
      conv.attrs["y_zero_point"] = ir::attr_int(y.zero_point);
      conv.attrs["y_type"] = ir::attr_int(static_cast<int64_t>(y.type));
      if (!act.empty()) conv.attrs["activation"] = ir::attr_string(act);
      conv.outputs[0] = g.nodes[static_cast<size_t>(chain.back())].outputs[0];
      ir::add_sources(conv, add);
      dead->insert(static_cast<int>(k));
      dead->insert(dq[side]);  // read the conv's old output
      for (int c : chain) {
        ir::add_sources(conv, g.nodes[static_cast<size_t>(c)]);
        dead->insert(c);
      }
      ++changed;
      break;
    }
  }
  return changed;
}

// Pools -> kiln.QPool; Flatten / Reshape / Concat between equal Q/DQ pairs -> the op on integers.
int fold_pools_and_movement(ir::Graph& g, std::set<int>* dead) {
  ir::UseIndex uses(g);
  int changed = 0;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    ir::Node& n = g.nodes[k];
    if (!n.domain.empty() || n.outputs.size() != 1 || n.inputs.empty()) continue;
    const bool pool = n.op_type == "MaxPool" || n.op_type == "AveragePool" || n.op_type == "GlobalAveragePool";
    const bool move = n.op_type == "Flatten" || n.op_type == "Reshape" || n.op_type == "Concat";
    if (!pool && !move) continue;
    const int r = only_reader(uses, n.outputs[0]);
    QParams y;
    if (r < 0 || !q_params(g, g.nodes[static_cast<size_t>(r)], &y)) continue;
    if (pool) {
      QParams x;
      if (dq_of(g, uses, n.inputs[0], &x) < 0) continue;
      auto it = g.value_types.find(x.q);
      if (it == g.value_types.end() || !it->second.shape.rank_known || it->second.shape.rank() != 4) continue;
      if (n.op_type == "AveragePool") {
        bool pads = false;
        for (int64_t p : n.attr_ints("pads")) pads |= p != 0;
        const std::string ap = n.attr_string("auto_pad", "NOTSET");
        if (pads || (ap != "NOTSET" && ap != "VALID" && !ap.empty()) || n.attr_int("ceil_mode", 0)) continue;
      }
      const std::string mode = n.op_type;
      n.domain = "kiln", n.op_type = "QPool", n.opset = 1;
      n.attrs["mode"] = ir::attr_string(mode);
      n.attrs.erase("storage_order");
      set_quant_attrs(n, x, y);
      n.inputs = {x.q};
    } else {
      const size_t count = n.op_type == "Reshape" ? 1 : n.inputs.size();
      bool ok = true;
      std::vector<std::string> qs;
      for (size_t i = 0; i < count && ok; ++i) {
        QParams x;
        ok = dq_of(g, uses, n.inputs[i], &x) >= 0 && x.scale == y.scale && x.zero_point == y.zero_point &&
             x.type == y.type;
        qs.push_back(x.q);
      }
      if (!ok) continue;
      for (size_t i = 0; i < count; ++i) n.inputs[i] = qs[i];
    }
    n.outputs[0] = g.nodes[static_cast<size_t>(r)].outputs[0];
    dead->insert(r);
    ++changed;
  }
  return changed;
}

// The 4-D quantized layers channels-last, with Transposes where values enter and leave them.
void to_channels_last(ir::Graph& g) {
  const int64_t opset = g.opset_imports.count("") ? g.opset_imports.at("") : 13;
  std::map<std::string, std::string> nhwc_of;  // channels-first value -> its channels-last twin
  std::vector<ir::Node> added;
  auto transpose = [&](const std::string& from, const std::string& to, std::vector<int64_t> perm) {
    ir::Node t;
    t.name = to + "/transpose";
    t.op_type = "Transpose";
    t.opset = static_cast<int>(opset);
    t.inputs = {from};
    t.outputs = {to};
    t.attrs["perm"] = ir::attr_ints(std::move(perm));
    added.push_back(std::move(t));
  };
  auto rank4 = [&](const std::string& v) {
    auto it = g.value_types.find(v);
    return it != g.value_types.end() && it->second.shape.rank_known && it->second.shape.rank() == 4;
  };
  std::map<std::string, ir::Node> quantize_of;  // value -> a QuantizeLinear producing it
  for (const auto& n : g.nodes) {
    QParams y;
    if (q_params(g, n, &y) && rank4(n.inputs[0]) && dtype_of(g, n.inputs[0]) == DataType::kFloat32)
      quantize_of[n.outputs[0]] = n;
  }
  auto nhwc = [&](const std::string& v) {
    auto it = nhwc_of.find(v);
    if (it != nhwc_of.end()) return it->second;
    std::string name = ir::unique_name(g, v + "/nhwc");
    if (auto q = quantize_of.find(v); q != quantize_of.end()) {
      // Quantized and transposed in one pass (the QuantizeLinear stays for any other reader).
      QParams y;
      q_params(g, q->second, &y);
      ir::Node t;
      t.name = name + "/quantize";
      t.op_type = "QuantizeChannelsLast";
      t.domain = "kiln";
      t.opset = 1;
      t.inputs = {q->second.inputs[0]};
      t.outputs = {name};
      t.attrs["y_scale"] = ir::attr_float(y.scale);
      t.attrs["y_zero_point"] = ir::attr_int(y.zero_point);
      t.attrs["y_type"] = ir::attr_int(static_cast<int64_t>(y.type));
      ir::add_sources(t, q->second);
      added.push_back(std::move(t));
      nhwc_of[v] = name;
      return name;
    }
    transpose(v, name, {0, 2, 3, 1});
    nhwc_of[v] = name;
    return name;
  };
  for (auto& n : g.nodes) {  // topological order: producers first
    if (!ops::is_kiln_quantized_layer(n) || !rank4(n.inputs[0]) || n.attr_int("channels_last", 0)) continue;
    n.attrs["channels_last"] = ir::attr_int(1);
    n.inputs[0] = nhwc(n.inputs[0]);
    if (n.inputs.size() > 3 && !n.inputs[3].empty()) n.inputs[3] = nhwc(n.inputs[3]);
    const std::string y = n.outputs[0], y_nhwc = ir::unique_name(g, y + "/nhwc");
    n.outputs[0] = y_nhwc;
    nhwc_of[y] = y_nhwc;
    transpose(y_nhwc, y, {0, 3, 1, 2});
  }
  // Flatten (axis 1) of a [N, C, 1, 1] value reads its channels-last twin (the same elements).
  for (auto& n : g.nodes) {
    if (!n.domain.empty() || n.op_type != "Flatten" || n.attr_int("axis", 1) != 1) continue;
    auto it = nhwc_of.find(n.inputs[0]);
    auto ty = g.value_types.find(n.inputs[0]);
    if (it == nhwc_of.end() || ty == g.value_types.end() || !ty->second.shape.rank_known) continue;
    const auto& d = ty->second.shape.dims;
    if (d.size() == 4 && d[2].known() && d[2].value == 1 && d[3].known() && d[3].value == 1) n.inputs[0] = it->second;
  }
  for (auto& t : added) g.nodes.push_back(std::move(t));
}

// Constant nodes (value: a tensor) as initializers, as fold_constants would make them later: PyTorch's
// exporter writes the scales and zero points so. Only in graphs with Q/DQ nodes.
void constants_to_initializers(ir::Graph& g) {
  bool qdq = false;
  for (const auto& n : g.nodes) qdq |= n.domain.empty() && n.op_type == "DequantizeLinear";
  if (!qdq) return;
  std::set<int> moved;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const ir::Node& n = g.nodes[k];
    const ir::Attribute* v = n.attr("value");
    if (!n.domain.empty() || n.op_type != "Constant" || n.outputs.size() != 1 || !v ||
        v->type != ir::Attribute::Type::kTensor || g.initializers.count(n.outputs[0]))
      continue;
    g.initializers[n.outputs[0]] = v->t;
    moved.insert(static_cast<int>(k));
  }
  ir::remove_nodes(g, moved);
}

}  // namespace

Result<int> fold_qdq_conv(ir::Graph& g) {
  constants_to_initializers(g);
  std::set<int> dead;
  int changed = fold_linear(g, &dead);
  if (!changed) return 0;
  ir::remove_nodes(g, dead);
  dead.clear();
  changed += fold_residual_add(g, &dead);
  ir::remove_nodes(g, dead);
  dead.clear();
  changed += fold_pools_and_movement(g, &dead);
  ir::remove_nodes(g, dead);
  KILN_RETURN_IF_ERROR(g.topological_sort());
  to_channels_last(g);
  KILN_ASSIGN_OR_RETURN(int removed, remove_dead_nodes(g));
  (void)removed;
  return changed;
}

}  // namespace kiln::passes
