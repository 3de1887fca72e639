#include "engine/storage_dtypes.h"

#include <algorithm>
#include <set>

#include "backends/registry.h"
#include "engine/tactics.h"
#include "ir/rewrite.h"

namespace kiln::engine {

namespace {

bool reduced(DataType t) { return t == DataType::kFloat16 || t == DataType::kBFloat16; }

// Whether some tactic of the device implements n's op computing in a float precision (a layer that
// computes), rather than only tactics that move data (TacticInfo::compute kUndefined).
bool has_compute_tactic(const ir::Node& n, DeviceKind device) {
  for (const backends::Tactic* t : backends::all_tactics()) {
    const backends::TacticInfo info = t->info();
    if (info.device != device || !(dtype_is_float(info.compute) || info.any_float_compute)) continue;
    for (const auto& [domain, op] : t->ops())
      if (domain == n.domain && op == n.op_type) return true;
  }
  return false;
}

// A node with a body keeps float32, except kiln.FusedElementwise: its body is private (it reads the
// node's inputs only) and it stores like the elementwise ops it fused.
bool has_subgraph(const ir::Node& n) {
  if (n.domain == "kiln" && n.op_type == "FusedElementwise") return false;
  for (const auto& [k, a] : n.attrs)
    if (a.g || !a.graphs.empty()) return true;
  return false;
}

// kiln.FusedElementwise stored in d: its body (a private copy) declares d where it declared float32.
void retype_body(ir::Node& n, DataType d) {
  auto it = n.attrs.find("body");
  if (it == n.attrs.end() || !it->second.g) return;
  std::shared_ptr<ir::Graph> body = ir::deep_copy(*it->second.g, it->second.g->parent);
  for (auto& v : body->inputs)
    if (v.type.elem == DataType::kFloat32) v.type.elem = d;
  for (auto& v : body->outputs)
    if (v.type.elem == DataType::kFloat32) v.type.elem = d;
  for (auto& [name, t] : body->value_types)
    if (t.elem == DataType::kFloat32) t.elem = d;
  it->second.g = body;
}

// Every name read inside the bodies of `g`'s nodes (nested too): such values must stay float32.
void body_reads(const ir::Graph& g, std::set<std::string>* out) {
  for (const auto& n : g.nodes)
    for (const auto& [k, a] : n.attrs) {
      std::vector<const ir::Graph*> bodies;
      if (a.g) bodies.push_back(a.g.get());
      for (const auto& b : a.graphs) bodies.push_back(b.get());
      for (const ir::Graph* b : bodies)
        for (const auto& name : b->outer_references()) out->insert(name);
    }
}

}  // namespace

Result<StorageDtypeStats> assign_storage_dtypes(ir::Graph& g, const ir::Graph& typed, const Target& target,
                                                const PrecisionPolicy& policy) {
  StorageDtypeStats stats;
  // The CPU stores reduced activations only on its channels-last bfloat16 path (AMX targets), for graphs
  // layout_nhwc made channels-last convolutions in: elsewhere (transformers) its BF16 tactics convert
  // their float32 inputs inside the layer, cheaper than Cast layers around the float32 ones.
  if (target.device.kind == DeviceKind::kCPU) {
    bool nhwc = false;
    for (const auto& n : g.nodes) nhwc |= n.domain == "kiln" && (n.op_type == "NhwcConv" || n.op_type == "NhwcPool");
    if (!target.channels_last || !nhwc) return stats;
  }
  if (policy.strongly_typed) return stats;
  auto allowed = [&](DataType t) {
    return std::find(policy.allowed.begin(), policy.allowed.end(), t) != policy.allowed.end();
  };
  const DataType build_reduced = allowed(DataType::kFloat16)    ? DataType::kFloat16
                                 : allowed(DataType::kBFloat16) ? DataType::kBFloat16
                                                                : DataType::kFloat32;
  bool any_rule_reduced = false;
  for (const auto& r : policy.rules) any_rule_reduced |= reduced(r.precision);
  if (build_reduced == DataType::kFloat32 && !any_rule_reduced) return stats;
  stats.reduced = build_reduced;

  auto dtype_of = [&](const std::string& name) {
    if (auto it = g.initializers.find(name); it != g.initializers.end()) return it->second.dtype();
    auto it = typed.value_types.find(name);
    return it != typed.value_types.end() && it->second.is_tensor() ? it->second.elem : DataType::kUndefined;
  };
  std::set<std::string> keep_fp32;  // graph outputs and values bodies read
  for (const auto& o : g.outputs) keep_fp32.insert(o.name);
  body_reads(g, &keep_fp32);

  std::map<std::string, DataType> storage;                            // float32 activations stored reduced
  std::map<std::pair<std::string, DataType>, std::string> converted;  // (constant, dtype) -> its copy
  std::map<std::pair<std::string, DataType>, std::string> casts;      // (value, dtype) -> the Cast's output
  auto stored = [&](const std::string& v) {
    auto it = storage.find(v);
    return it == storage.end() ? dtype_of(v) : it->second;
  };
  // A float constant in dtype `d` (a converted copy, made once).
  auto constant_in = [&](const std::string& name, DataType d) -> Result<std::string> {
    auto key = std::make_pair(name, d);
    if (auto it = converted.find(key); it != converted.end()) return it->second;
    KILN_ASSIGN_OR_RETURN(Tensor c, g.initializers.at(name).cast(d));
    std::string copy = ir::unique_name(g, name + "::" + precision_name(d));
    g.initializers[copy] = std::move(c);
    g.value_types[copy] = ir::TypeInfo::tensor(d, SymShape::from_dims(g.initializers[copy].shape()));
    ++stats.constants;
    return converted[key] = copy;
  };

  std::vector<ir::Node> out;
  out.reserve(g.nodes.size());
  auto cast_node = [&](const std::string& from, const std::string& to, DataType d) {
    ir::Node c;
    c.op_type = "Cast";
    c.opset = std::max(13, g.opset_imports.count("") ? g.opset_imports.at("") : 13);
    c.name = to;
    c.inputs = {from};
    c.outputs = {to};
    ir::Attribute a;
    a.type = ir::Attribute::Type::kInt;
    a.i = static_cast<int64_t>(d);
    c.attrs["to"] = a;
    ++stats.casts;
    return c;
  };
  // The name under which value v is read in dtype d (a Cast inserted before the reader when needed).
  auto read_as = [&](const std::string& v, DataType d) -> std::string {
    if (stored(v) == d) return v;
    auto key = std::make_pair(v, d);
    if (auto it = casts.find(key); it != casts.end()) return it->second;
    std::string name = ir::unique_name(g, v + "::to_" + precision_name(d));
    g.value_types[name] = ir::TypeInfo::tensor(d);
    out.push_back(cast_node(v, name, d));
    return casts[key] = name;
  };

  const DeviceKind device = target.device.kind;
  std::map<std::string, std::string> renamed;  // a kept-float32 output produced reduced -> its reduced name
  std::set<std::string> replaced;              // constants some layer now reads a converted copy of
  for (size_t index = 0; index < g.nodes.size(); ++index) {
    ir::Node n = g.nodes[index];
    bool touches_fp32 = false;
    for (const auto& i : n.inputs) touches_fp32 |= !i.empty() && dtype_of(i) == DataType::kFloat32;
    for (const auto& o : n.outputs) touches_fp32 |= !o.empty() && dtype_of(o) == DataType::kFloat32;
    DataType d = DataType::kFloat32;
    if (touches_fp32 && !has_subgraph(n) && n.op_type != "Cast" && n.op_type != "CastLike") {
      if (has_compute_tactic(n, device)) {
        std::vector<std::string> names = ir::sources_of(n);
        names.insert(names.begin(), n.name);
        LayerPrecisions lp = layer_precisions(policy, names, DataType::kFloat32);
        d = lp.required != DataType::kUndefined ? lp.required : build_reduced;
      } else {
        // Data movement follows its first float32 activation input; float constants alone: the
        // build's reduced precision; no float32 input (a generator such as ConstantOfShape): float32.
        bool input_found = false, constant_found = false;
        for (const auto& i : n.inputs) {
          if (i.empty() || dtype_of(i) != DataType::kFloat32) continue;
          if (g.initializers.count(i)) {
            constant_found = true;
          } else if (!input_found) {
            auto r = renamed.find(i);
            d = stored(r == renamed.end() ? i : r->second), input_found = true;
          }
        }
        if (!input_found) d = constant_found ? build_reduced : DataType::kFloat32;
      }
      if (reduced(d)) {
        // Some tactic of precision d must take the layer with its float32 tensors in d (views need none).
        backends::LayerSignature sig = signature_of(typed, typed.nodes[index], target);
        sig.compute = d;
        for (size_t k = 0; k < sig.inputs.size(); ++k) {
          backends::TensorSig& t = sig.inputs[k];
          if (!t.present || t.dtype != DataType::kFloat32) continue;
          t.dtype = d;
          if (t.constant) {
            KILN_ASSIGN_OR_RETURN(std::string c, constant_in(n.inputs[k], d));
            t.constant = &g.initializers.at(c);
          }
        }
        for (auto& t : sig.outputs)
          if (t.dtype == DataType::kFloat32) t.dtype = d;
        if (!moves_no_elements(n) && backends::candidate_tactics(sig).empty()) {
          if (has_compute_tactic(n, device)) {
            const std::string op = n.domain.empty() ? n.op_type : n.domain + "." + n.op_type;
            if (stats.float32_ops[op]++ == 0 && stats.float32_example.empty()) {
              std::string why;
              for (const backends::Tactic* t : backends::all_tactics())
                if (backends::implements(*t, sig) && why.empty())
                  why = t->name() + ": " + backends::why_declined(*t, sig);
              stats.float32_example = "'" + n.name + "' (" + op + ")" + (why.empty() ? "" : ": " + why);
            }
          }
          d = DataType::kFloat32;
        }
      }
    }
    if (!reduced(d)) d = DataType::kFloat32;
    // Inputs: float32 ones are read in d (constants as converted copies, activations through a Cast
    // where their storage differs).
    for (auto& i : n.inputs) {
      if (i.empty() || dtype_of(i) != DataType::kFloat32) continue;
      if (g.initializers.count(i)) {
        if (reduced(d)) {
          replaced.insert(i);
          KILN_ASSIGN_OR_RETURN(i, constant_in(i, d));
        }
        continue;
      }
      if (auto r = renamed.find(i); r != renamed.end()) {
        if (stored(r->second) == d) {
          i = r->second;
          continue;
        }
      }
      i = read_as(i, d);
    }
    if (reduced(d) && n.domain == "kiln" && n.op_type == "FusedElementwise") retype_body(n, d);
    std::vector<ir::Node> after;
    if (reduced(d)) {
      ++stats.reduced_layers;
      for (auto& o : n.outputs) {
        if (o.empty() || dtype_of(o) != DataType::kFloat32) continue;
        auto vt = g.value_types.find(o);
        ir::TypeInfo type = vt != g.value_types.end() ? vt->second : ir::TypeInfo::tensor(d);
        type.elem = d;
        if (keep_fp32.count(o)) {
          std::string r = ir::unique_name(g, o + "::" + precision_name(d));
          g.value_types[r] = type;
          storage[r] = d;
          renamed[o] = r;
          after.push_back(cast_node(r, o, DataType::kFloat32));
          o = r;
        } else {
          g.value_types[o] = type;
          storage[o] = d;
        }
      }
    }
    out.push_back(std::move(n));
    for (auto& c : after) out.push_back(std::move(c));
  }
  g.nodes = std::move(out);
  // Constants no layer reads any more (every reader took a converted copy) are dropped.
  std::set<std::string> read;
  for (const auto& n : g.nodes)
    for (const auto& i : n.inputs) read.insert(i);
  body_reads(g, &read);
  for (const auto& o : g.outputs) read.insert(o.name);
  for (const auto& in : g.inputs) read.insert(in.name);
  for (const auto& c : replaced)
    if (!read.count(c)) g.initializers.erase(c), g.value_types.erase(c);
  // The order a load of the engine file gives (the importer sorts topologically, and the engine's
  // kernels are stored per layer index): a Cast placed before its consumer is valid but not that order.
  KILN_RETURN_IF_ERROR(g.topological_sort());
  return stats;
}

}  // namespace kiln::engine
