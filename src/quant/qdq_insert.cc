// Q/DQ insertion in ONNX Runtime's quantize_static pattern (qdq_insert.h).
#include "quant/qdq_insert.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ir/attribute_builders.h"
#include "ir/rewrite.h"

namespace kiln::quant {

namespace {

enum class Role { kNone, kCompute, kSameScale };

Role role_of(const ir::Node& n) {
  if (!n.domain.empty()) return Role::kNone;
  // Only what an INT8 layer takes (qdq_insert.h): no Concat (its inputs' scales differ from its
  // output's), no Transpose / Squeeze / Unsqueeze (they would run as float between a DQ and a Q).
  static const std::set<std::string> compute = {"Conv", "Gemm", "MatMul", "Add", "AveragePool", "GlobalAveragePool"};
  static const std::set<std::string> same = {"MaxPool", "Flatten", "Reshape"};
  if (compute.count(n.op_type)) return Role::kCompute;
  if (same.count(n.op_type)) return Role::kSameScale;
  return Role::kNone;
}

// The constant behind a value: an initializer, or the `value` of a Constant node.
const Tensor* constant_of(const ir::Graph& g, const ir::UseIndex& uses, const std::string& name) {
  if (name.empty()) return nullptr;
  if (const Tensor* t = ir::constant_value(g, name)) return t;
  int p = uses.producer(name);
  if (p < 0) return nullptr;
  const ir::Node& n = g.nodes[static_cast<size_t>(p)];
  // PyTorch's exporter shares equal initializers through Identity nodes.
  if (n.op_type == "Identity" && n.domain.empty() && n.has_input(0)) return constant_of(g, uses, n.inputs[0]);
  if (n.op_type != "Constant" || !n.domain.empty()) return nullptr;
  const ir::Attribute* a = n.attr("value");
  return a && a->type == ir::Attribute::Type::kTensor ? &a->t : nullptr;
}

bool is_float_activation(const ir::Graph& g, const ir::UseIndex& uses, const std::string& name) {
  if (name.empty() || constant_of(g, uses, name)) return false;
  auto it = g.value_types.find(name);
  if (it != g.value_types.end()) return it->second.is_tensor() && it->second.elem == DataType::kFloat32;
  for (const auto& in : g.inputs)
    if (in.name == name) return in.type.is_tensor() && in.type.elem == DataType::kFloat32;
  return false;
}

bool is_float_constant(const Tensor* t, int64_t rank_min, int64_t rank_max) {
  return t && t->dtype() == DataType::kFloat32 && t->rank() >= rank_min && t->rank() <= rank_max && t->numel() > 0;
}

// The activation inputs of a node that would be quantized, or empty when the node cannot be.
std::vector<size_t> data_inputs(const ir::Graph& g, const ir::UseIndex& uses, const ir::Node& n) {
  auto act = [&](size_t i) { return i < n.inputs.size() && is_float_activation(g, uses, n.inputs[i]); };
  const std::string& op = n.op_type;
  if (op == "Conv") {  // 2-D convolutions (kiln.QConv)
    if (!act(0) || !is_float_constant(constant_of(g, uses, n.inputs.size() > 1 ? n.inputs[1] : ""), 4, 4)) return {};
    return {0};
  }
  if (op == "Gemm") {
    if (n.attr_int("transA", 0) != 0 || !act(0) ||
        !is_float_constant(constant_of(g, uses, n.inputs.size() > 1 ? n.inputs[1] : ""), 2, 2))
      return {};
    return {0};
  }
  if (op == "MatMul") {
    // Activation x activation (attention's Q K^T and P V): FP32, no INT8 layer takes them.
    if (!act(0) || act(1)) return {};
    if (is_float_constant(constant_of(g, uses, n.inputs.size() > 1 ? n.inputs[1] : ""), 2, 2)) return {0};
    return {};
  }
  if (op == "Add") return act(0) && act(1) && n.inputs.size() == 2 ? std::vector<size_t>{0, 1} : std::vector<size_t>{};
  if (op == "MaxPool" && n.has_output(1)) return {};  // Indices: not a same-scale op
  if (op == "AveragePool") {                          // kiln.QPool: no padding counted, no ceil mode
    for (int64_t p : n.attr_ints("pads"))
      if (p != 0) return {};
    const std::string ap = n.attr_string("auto_pad", "NOTSET");
    if ((ap != "NOTSET" && ap != "VALID" && !ap.empty()) || n.attr_int("ceil_mode", 0)) return {};
  }
  if (op == "AveragePool" || op == "GlobalAveragePool" || op == "MaxPool") {  // 4-D (kiln.QPool)
    auto it = g.value_types.find(n.inputs.empty() ? "" : n.inputs[0]);
    if (it == g.value_types.end() || !it->second.shape.rank_known || it->second.shape.rank() != 4) return {};
  }
  return act(0) ? std::vector<size_t>{0} : std::vector<size_t>{};
}

// Relu, or Clip with lower bound 0 (opset >= 11 inputs, or the min attribute before).
bool is_zero_clamp(const ir::Graph& g, const ir::UseIndex& uses, const ir::Node& n) {
  if (!n.domain.empty()) return false;
  if (n.op_type == "Relu") return true;
  if (n.op_type != "Clip") return false;
  if (n.attr("min")) return n.attr_float("min", -1) == 0 && n.attr_float("max", 1) >= 0;
  const Tensor* lo = constant_of(g, uses, n.inputs.size() > 1 ? n.inputs[1] : "");
  if (!lo || lo->numel() != 1 || lo->get_f64(0) != 0) return false;
  if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
    const Tensor* hi = constant_of(g, uses, n.inputs[2]);
    if (!hi || hi->numel() != 1 || hi->get_f64(0) < 0) return false;
  }
  return true;
}

}  // namespace

Result<QdqPlan> plan_qdq(const ir::Graph& g, const ExcludeFn& exclude) {
  ir::UseIndex uses(g);
  QdqPlan plan;
  std::map<int, std::vector<size_t>> inputs_of;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    Role role = role_of(n);
    if (role == Role::kNone) continue;
    std::vector<size_t> ins = data_inputs(g, uses, n);
    if (ins.empty()) continue;
    if (role == Role::kSameScale) {
      // Only after a quantized layer (directly, or through an activation that will be absorbed).
      int p = uses.producer(n.inputs[0]);
      if (p >= 0 && !plan.nodes.count(p) && is_zero_clamp(g, uses, g.nodes[static_cast<size_t>(p)]) &&
          g.nodes[static_cast<size_t>(p)].has_input(0))
        p = uses.producer(g.nodes[static_cast<size_t>(p)].inputs[0]);
      if (p < 0 || !plan.nodes.count(p)) continue;
    }
    if (exclude && exclude(n)) {
      plan.excluded.push_back(n.name);
      continue;
    }
    plan.nodes.insert(static_cast<int>(i));
    inputs_of[static_cast<int>(i)] = ins;
  }
  auto weighted = [&](const ir::Node& n) {
    return n.op_type == "Conv" || n.op_type == "Gemm" || n.op_type == "MatMul";
  };
  auto float_out = [&](const ir::Node& n) { return n.op_type == "Gemm" || n.op_type == "MatMul"; };
  auto all_readers_quantized = [&](const std::string& v) {
    const auto& c = uses.consumers(v);
    if (c.empty() || uses.is_graph_output(v)) return false;
    for (int r : c)
      if (!plan.nodes.count(r)) return false;
    return true;
  };
  // The node a quantized node's data input comes from (through an absorbable Relu/Clip), or -1.
  auto source_node = [&](const std::string& v) {
    int p = uses.producer(v);
    if (p >= 0 && !plan.nodes.count(p) && is_zero_clamp(g, uses, g.nodes[static_cast<size_t>(p)]) &&
        g.nodes[static_cast<size_t>(p)].has_input(0))
      p = uses.producer(g.nodes[static_cast<size_t>(p)].inputs[0]);
    return p;
  };
  // Drops what no INT8 layer would take, until nothing changes: a residual Add needs a quantized
  // Conv/Gemm input read by it alone; a same-scale node needs a quantized source; the layers whose
  // output is quantized by a Q of their own cannot write a graph output.
  for (bool again = true; again;) {
    again = false;
    for (auto it = plan.nodes.begin(); it != plan.nodes.end();) {
      const ir::Node& n = g.nodes[static_cast<size_t>(*it)];
      bool keep = true;
      if (!float_out(n) && (n.outputs.size() != 1 || uses.is_graph_output(n.outputs[0]))) keep = false;
      if (keep && n.op_type == "Add") {
        keep = false;
        for (size_t k = 0; k < 2 && !keep; ++k) {
          int p = uses.producer(n.inputs[k]);
          keep = p >= 0 && plan.nodes.count(p) &&
                 (g.nodes[static_cast<size_t>(p)].op_type == "Conv" ||
                  g.nodes[static_cast<size_t>(p)].op_type == "Gemm") &&
                 uses.consumers(n.inputs[k]).size() == 1 && !uses.is_graph_output(n.inputs[k]);
        }
      }
      if (keep && role_of(n) == Role::kSameScale) {
        int p = source_node(n.inputs[0]);
        keep = p >= 0 && plan.nodes.count(p);
      }
      if (keep) {
        ++it;
        continue;
      }
      inputs_of.erase(*it);
      it = plan.nodes.erase(it);
      again = true;
    }
  }
  // A Relu / Clip(0, ..) after a quantized Conv or Add (or a Gemm/MatMul whose output is quantized
  // for all its readers) is absorbed: the output's Q clamps at 0.
  for (int i : plan.nodes) {
    const ir::Node& n = g.nodes[static_cast<size_t>(i)];
    if (!weighted(n) && n.op_type != "Add") continue;
    if (n.outputs.size() != 1 || uses.is_graph_output(n.outputs[0])) continue;
    const auto& c = uses.consumers(n.outputs[0]);
    if (c.size() != 1) continue;
    const ir::Node& r = g.nodes[static_cast<size_t>(c[0])];
    if (!is_zero_clamp(g, uses, r) || (exclude && exclude(r)) || r.outputs.size() != 1) continue;
    if (uses.is_graph_output(r.outputs[0]) || uses.consumers(r.outputs[0]).empty()) continue;
    if (float_out(n) && !all_readers_quantized(r.outputs[0])) continue;
    plan.absorbed[c[0]] = i;
  }
  // The INT8 region's exits: the outputs (after an absorbed activation) of quantized layers other than
  // the float-output linear ones, when some reader stays float.
  std::map<int, int> absorbed_by;
  for (const auto& [act, node] : plan.absorbed) absorbed_by[node] = act;
  for (int i : plan.nodes) {
    const ir::Node& n = g.nodes[static_cast<size_t>(i)];
    if (float_out(n)) continue;
    auto a = absorbed_by.find(i);
    const std::string& y = a == absorbed_by.end() ? n.outputs[0] : g.nodes[static_cast<size_t>(a->second)].outputs[0];
    if (!uses.is_graph_output(y) && !all_readers_quantized(y)) plan.exits.insert(y);
  }
  // The activations quantized nodes read, and the exits.
  std::set<std::string> quantized = plan.exits;
  for (const auto& [i, ins] : inputs_of)
    for (size_t k : ins) quantized.insert(g.nodes[static_cast<size_t>(i)].inputs[k]);
  // Parameters: measured, or (a same-scale node's output) its input's.
  std::set<std::string> observed;
  auto observe = [&](const std::string& v) {
    if (observed.insert(v).second) plan.observe.push_back(v);
  };
  for (const auto& in : g.inputs)
    if (quantized.count(in.name)) observe(in.name);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    for (const auto& o : n.outputs) {
      if (o.empty() || !quantized.count(o)) continue;
      if (plan.nodes.count(static_cast<int>(i)) && role_of(n) == Role::kSameScale) {
        // Its input's parameters: that input is quantized (the node reads it through a DQ), so it
        // has parameters of its own or, transitively, another's.
        plan.same_scale_as[o] = n.inputs[0];
        continue;
      }
      observe(o);
    }
  }
  return plan;
}

namespace {

struct Inserter {
  ir::Graph& g;
  int opset;
  std::vector<ir::Node> out;
  std::map<std::string, std::string> dq_of;  // activation -> its DequantizeLinear output
  std::map<std::string, QuantParams> params;
  std::map<std::string, std::string> param_names;  // activation -> the name prefix of its scale/zp
  std::map<std::string, std::string> weight_dq;    // weight initializer -> its DQ output
  std::map<std::string, std::vector<float>> weight_scales;
  QdqResult result;

  ir::Node node(const std::string& op, const std::string& name, std::vector<std::string> ins,
                std::vector<std::string> outs) {
    ir::Node n;
    n.op_type = op;
    n.name = name;
    n.opset = opset;
    n.inputs = std::move(ins);
    n.outputs = std::move(outs);
    return n;
  }

  std::string fresh(const std::string& base) {
    std::string name = base;
    for (int k = 1; g.initializers.count(name) || taken.count(name); ++k) name = base + "_" + std::to_string(k);
    taken.insert(name);
    return name;
  }
  std::set<std::string> taken;

  // Q -> DQ after activation `v`, with the parameters of `param_of` (itself, or a same-scale source).
  void quantize_activation(const std::string& v, const std::string& param_of) {
    const std::string& prefix = param_names.at(param_of);
    const std::string q = fresh(v + "_QuantizeLinear_Output"), dq = fresh(v + "_DequantizeLinear_Output");
    out.push_back(
        node("QuantizeLinear", fresh(v + "_QuantizeLinear"), {v, prefix + "_scale", prefix + "_zero_point"}, {q}));
    out.push_back(
        node("DequantizeLinear", fresh(v + "_DequantizeLinear"), {q, prefix + "_scale", prefix + "_zero_point"}, {dq}));
    dq_of[v] = dq;
    params[v] = params.at(param_of);
  }

  void add_params(const std::string& v, const QuantParams& p) {
    std::string prefix = fresh(v);  // a free prefix: PREFIX_scale and PREFIX_zero_point
    while (g.initializers.count(prefix + "_scale") || g.initializers.count(prefix + "_zero_point"))
      prefix = fresh(prefix);
    g.initializers[prefix + "_scale"] = Tensor::scalar<float>(DataType::kFloat32, p.scale);
    g.initializers[prefix + "_zero_point"] =
        Tensor::scalar<uint8_t>(DataType::kUInt8, static_cast<uint8_t>(p.zero_point));
    param_names[v] = prefix;
    params[v] = p;
  }

  // Per-channel symmetric int8 weight along `axis`, dequantized by a DQ node; returns its output.
  std::string quantize_weight(const std::string& w, int64_t axis) {
    if (auto it = weight_dq.find(w); it != weight_dq.end()) return it->second;
    const Tensor& t = g.initializers.at(w);
    const Dims& d = t.shape();
    const int64_t channels = d[static_cast<size_t>(axis)];
    int64_t inner = 1;
    for (size_t i = static_cast<size_t>(axis) + 1; i < d.size(); ++i) inner *= d[i];
    std::vector<float> amax(static_cast<size_t>(channels), 0.f);
    const float* x = t.data<float>();
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) {
      size_t c = static_cast<size_t>((i / inner) % channels);
      if (std::isfinite(x[i])) amax[c] = std::max(amax[c], std::fabs(x[i]));
    }
    Tensor q(DataType::kInt8, d), scale(DataType::kFloat32, {channels}), zp(DataType::kInt8, {channels});
    std::vector<float> s(static_cast<size_t>(channels));
    for (size_t c = 0; c < s.size(); ++c) s[c] = amax[c] > 0 ? amax[c] / 127.f : 1.f, scale.data<float>()[c] = s[c];
    for (int64_t i = 0; i < n; ++i) {
      size_t c = static_cast<size_t>((i / inner) % channels);
      // Half to even (nearbyint in the default rounding mode), as numpy's round in ONNX Runtime's
      // quantizer: std::round's ties away from zero moved 124 of mobilenet_v2_fmnist's 2.2M weights.
      float v = std::isfinite(x[i]) ? std::nearbyint(x[i] / s[c]) : 0.f;
      q.data<int8_t>()[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, v)));
    }
    const std::string qn = fresh(w + "_quantized"), sn = fresh(w + "_scale"), zn = fresh(w + "_zero_point");
    g.initializers[qn] = std::move(q), g.initializers[sn] = std::move(scale), g.initializers[zn] = std::move(zp);
    const std::string dq = fresh(w + "_DequantizeLinear_Output");
    ir::Node n2 = node("DequantizeLinear", fresh(w + "_DequantizeLinear"), {qn, sn, zn}, {dq});
    n2.attrs["axis"] = ir::attr_int(axis);
    out.push_back(std::move(n2));
    weight_dq[w] = dq;
    weight_scales[w] = s;
    ++result.weights;
    return dq;
  }

  // int32 bias with scale s_x * s_w[c] (zero point 0), dequantized along axis 0.
  std::string quantize_bias(const std::string& b, float sx, const std::vector<float>& sw) {
    const Tensor& t = g.initializers.at(b);
    const int64_t c = t.numel();
    Tensor q(DataType::kInt32, {c}), scale(DataType::kFloat32, {c}), zp(DataType::kInt32, {c});
    for (int64_t i = 0; i < c; ++i) {
      float s = sx * sw[static_cast<size_t>(i)];
      if (!(s > 0) || !std::isfinite(s)) return "";                            // keep the FP32 bias
      double v = std::nearbyint(static_cast<double>(t.data<float>()[i]) / s);  // half to even, as numpy
      v = std::min<double>(std::numeric_limits<int32_t>::max(),
                           std::max<double>(std::numeric_limits<int32_t>::min(), v));
      q.data<int32_t>()[i] = static_cast<int32_t>(v);
      scale.data<float>()[i] = s;
    }
    const std::string qn = fresh(b + "_quantized"), sn = fresh(b + "_quantized_scale"),
                      zn = fresh(b + "_quantized_zero_point");
    g.initializers[qn] = std::move(q), g.initializers[sn] = std::move(scale), g.initializers[zn] = std::move(zp);
    const std::string dq = fresh(b + "_DequantizeLinear_Output");
    ir::Node n = node("DequantizeLinear", fresh(b + "_DequantizeLinear"), {qn, sn, zn}, {dq});
    n.attrs["axis"] = ir::attr_int(0);
    out.push_back(std::move(n));
    ++result.biases;
    return dq;
  }
};

}  // namespace

Result<QdqResult> insert_qdq(ir::Graph& g, const QdqPlan& plan, const std::map<std::string, Range>& ranges) {
  auto it = g.opset_imports.find("");
  const int opset = it == g.opset_imports.end() ? 0 : it->second;
  if (opset < 13)
    return Unsupported(
        "INT8 calibration writes per-axis DequantizeLinear nodes, which need opset 13 or later; the "
        "model imports opset ",
        opset, " (convert it with onnx.version_converter)");
  for (const auto& v : plan.observe)
    if (!ranges.count(v))
      return InvalidArgument("no calibrated range for activation '", v, "' (the calibration data or cache lacks it)");
  ir::UseIndex uses(g);
  Inserter ins{g, opset, {}, {}, {}, {}, {}, {}, {}, {}};
  for (const auto& n : g.nodes)
    for (const auto& o : n.outputs) ins.taken.insert(o);
  for (const auto& in : g.inputs) ins.taken.insert(in.name);
  for (const auto& v : plan.observe) {
    ins.add_params(v, uint8_params(ranges.at(v)));
    ins.result.activations.push_back({v, ranges.at(v), ins.params[v]});
  }
  std::set<std::string> wanted = plan.exits;  // activations with a quantized reader, and the exits
  for (int i : plan.nodes)
    for (size_t k : data_inputs(g, uses, g.nodes[static_cast<size_t>(i)]))
      wanted.insert(g.nodes[static_cast<size_t>(i)].inputs[k]);
  auto source_of = [&](std::string v) {
    for (int guard = 0; plan.same_scale_as.count(v) && guard < 1 << 20; ++guard) v = plan.same_scale_as.at(v);
    return v;
  };
  auto emit_qdq = [&](const std::string& v) {
    if (!wanted.count(v) || ins.dq_of.count(v)) return;
    ins.quantize_activation(v, source_of(v));
  };
  for (const auto& in : g.inputs) emit_qdq(in.name);
  std::map<int, int> absorber_of;  // quantized node -> the activation node it absorbs
  for (const auto& [act, node] : plan.absorbed) absorber_of[node] = act;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (plan.absorbed.count(static_cast<int>(i))) {
      ++ins.result.removed_activations;
      continue;
    }
    ir::Node n = g.nodes[i];
    if (plan.nodes.count(static_cast<int>(i))) {
      ++ins.result.nodes;
      std::vector<size_t> data = data_inputs(g, uses, n);
      float sx = 0;
      for (size_t k : data) {
        const std::string& v = n.inputs[k];
        if (!ins.dq_of.count(v))
          return Internal("Q/DQ insertion: activation '", v, "' read by '", n.name, "' was not quantized before it");
        if (k == 0) sx = ins.params.at(v).scale;
        n.inputs[k] = ins.dq_of.at(v);
      }
      // Weights and bias of Conv / Gemm / MatMul with a constant weight.
      bool weighted = n.op_type == "Conv" || n.op_type == "Gemm" || (n.op_type == "MatMul" && data.size() == 1);
      if (weighted) {
        const std::string w = n.inputs[1];
        int64_t axis = n.op_type == "Conv" ? 0 : n.op_type == "Gemm" ? (n.attr_int("transB", 0) ? 0 : 1) : 1;
        if (!g.initializers.count(w)) {
          // A Constant node's weight: as an initializer of its own (fold_constants drops the node).
          const Tensor* t = constant_of(g, uses, w);
          g.initializers[w] = t->clone();
        }
        n.inputs[1] = ins.quantize_weight(w, axis);
        const std::vector<float>& sw = ins.weight_scales.at(w);
        bool plain_bias = n.op_type == "Conv" ||
                          (n.op_type == "Gemm" && n.attr_float("alpha", 1) == 1 && n.attr_float("beta", 1) == 1);
        if (plain_bias && n.has_input(2)) {
          const Tensor* b = ir::constant_value(g, n.inputs[2]);
          if (b && b->dtype() == DataType::kFloat32 && b->rank() == 1 &&
              b->numel() == static_cast<int64_t>(sw.size())) {
            std::string dq = ins.quantize_bias(n.inputs[2], sx, sw);
            if (!dq.empty()) n.inputs[2] = dq;
          }
        }
      }
      if (auto a = absorber_of.find(static_cast<int>(i)); a != absorber_of.end()) {
        n.outputs[0] = g.nodes[static_cast<size_t>(a->second)].outputs[0];
        ir::add_sources(n, g.nodes[static_cast<size_t>(a->second)]);
      }
    }
    // Float readers of an exit read its DQ (the quantized layer writes only the Q's value).
    for (auto& v : n.inputs)
      if (plan.exits.count(v) && ins.dq_of.count(v)) v = ins.dq_of.at(v);
    std::vector<std::string> outs = n.outputs;
    ins.out.push_back(std::move(n));
    for (const auto& o : outs)
      if (!o.empty()) emit_qdq(o);
  }
  // Weights and biases nothing reads any more.
  std::set<std::string> read;
  for (const auto& n : ins.out)
    for (const auto& v : n.inputs) read.insert(v);
  for (const auto& o : g.outputs) read.insert(o.name);
  for (auto& [w, dq] : ins.weight_dq)
    if (!read.count(w)) g.initializers.erase(w);
  for (int i : plan.nodes) {
    const ir::Node& n = g.nodes[static_cast<size_t>(i)];
    if (n.inputs.size() > 2 && !read.count(n.inputs[2]) && g.initializers.count(n.inputs[2]))
      g.initializers.erase(n.inputs[2]);
  }
  g.nodes = std::move(ins.out);
  KILN_RETURN_IF_ERROR(g.topological_sort());
  return ins.result;
}

}  // namespace kiln::quant
