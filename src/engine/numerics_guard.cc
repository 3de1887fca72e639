// The numerics guard: see numerics_guard.h and kiln/numerics.h.
#include "engine/numerics_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace kiln {

const char* numerics_kind_name(NumericsFinding::Kind k) {
  switch (k) {
    case NumericsFinding::Kind::kNonFinite: return "nan/inf";
    case NumericsFinding::Kind::kFP16Overflow: return "fp16-range";
    case NumericsFinding::Kind::kINT8Saturation: return "int8-saturation";
  }
  return "?";
}

namespace engine {

namespace {

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

std::string range_str(const NumericsRange& r) {
  if (!r.observed) return "'" + r.name + "' (not a numeric tensor)";
  std::string s = "'" + r.name + "' " + r.dtype + dims_str(r.shape) + " [" + fmt(r.min) + ", " + fmt(r.max) + "]";
  if (r.nan) s += " " + std::to_string(r.nan) + " NaN";
  if (r.inf) s += " " + std::to_string(r.inf) + " Inf";
  return s;
}

bool dtype_is_float_name(const std::string& name) {
  DataType t;
  return dtype_from_name(name, &t) && dtype_is_float(t);
}

double abs_max(const NumericsRange& r) { return std::max(std::fabs(r.min), std::fabs(r.max)); }

// Whether `t` shares bytes with one of the inputs (an output written in place over its input).
bool overlaps_any(const Tensor& t, const std::vector<const ops::Value*>& ins) {
  auto* b = static_cast<const uint8_t*>(t.raw());
  for (const ops::Value* v : ins) {
    if (!v || !v->is_tensor() || !v->tensor.raw()) continue;
    auto* c = static_cast<const uint8_t*>(v->tensor.raw());
    if (b < c + v->tensor.nbytes() && c < b + t.nbytes()) return true;
  }
  return false;
}

bool quant_range(DataType t, int64_t* lo, int64_t* hi) {
  switch (t) {
    case DataType::kInt8: *lo = -128, *hi = 127; return true;
    case DataType::kUInt8: *lo = 0, *hi = 255; return true;
    default: return false;
  }
}

// Where a quantized op of ONNX / ONNX Runtime keeps its output zero point (QOperator format).
int output_zero_point_input(const ir::Node& n) {
  const std::string& op = n.op_type;
  if (op == "QuantizeLinear") return 2;
  if (op == "QLinearConv" || op == "QLinearMatMul" || op == "QLinearAdd" || op == "QLinearMul") return 7;
  if (op == "QLinearSigmoid" || op == "QLinearLeakyRelu" || op == "QLinearAveragePool" ||
      op == "QLinearGlobalAveragePool" || op == "QLinearSoftmax")
    return 4;
  if (op == "QLinearConcat") return 1;
  return -1;
}

// QuantizeLinear's clipped elements, exactly: those whose round(x / scale) + zero point falls
// outside the output type's range, except at a limit equal to the zero point (per-tensor and
// per-axis scales; -1 for blocked ones).
int64_t quantize_clipped(const ir::Node& n, const std::vector<const ops::Value*>& ins, int64_t lo, int64_t hi) {
  if (ins.size() < 2 || !ins[0] || !ins[1] || !ins[0]->is_tensor() || !ins[1]->is_tensor()) return -1;
  const Tensor& x = ins[0]->tensor;
  const Tensor& scale = ins[1]->tensor;
  const Tensor* zp = ins.size() > 2 && ins[2] && ins[2]->is_tensor() ? &ins[2]->tensor : nullptr;
  if (!dtype_is_float(x.dtype()) || n.attr_int("block_size", 0) != 0) return -1;
  int64_t inner = 1, dim = 1;
  bool per_axis = scale.numel() > 1;
  if (per_axis) {
    int64_t rank = x.rank(), axis = n.attr_int("axis", 1);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank || scale.numel() != x.dim(static_cast<int>(axis))) return -1;
    dim = x.dim(static_cast<int>(axis));
    for (int64_t i = axis + 1; i < rank; ++i) inner *= x.dim(static_cast<int>(i));
  }
  if (zp && zp->numel() != scale.numel()) return -1;
  int64_t clipped = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t s = per_axis ? (i / inner) % dim : 0;
    double q = x.get_f64(i) / scale.get_f64(s);
    if (std::isnan(q)) continue;
    int64_t z = zp ? zp->get_i64(s) : 0;
    double r = std::nearbyint(q) + static_cast<double>(z);
    // Clamping at a limit that is the zero point clamps at real 0: a ReLU folded into the range
    // (ONNX Runtime's QDQ models quantize a ReLU's input with uint8 zero point 0), not saturation.
    clipped += (r < static_cast<double>(lo) && z != lo) || (r > static_cast<double>(hi) && z != hi);
  }
  return clipped;
}

void scan(const Tensor& t, NumericsRange& r) {
  double mn = std::numeric_limits<double>::infinity(), mx = -mn;
  auto take = [&](double v) {
    if (std::isnan(v)) {
      ++r.nan;
    } else if (std::isinf(v)) {
      ++r.inf;
    } else {
      mn = std::min(mn, v);
      mx = std::max(mx, v);
    }
  };
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DataType::kFloat32: {
      const float* p = t.data<float>();
      for (int64_t i = 0; i < n; ++i) take(p[i]);
      break;
    }
    case DataType::kInt8: {
      const int8_t* p = t.data<int8_t>();
      for (int64_t i = 0; i < n; ++i) take(p[i]);
      break;
    }
    case DataType::kUInt8: {
      const uint8_t* p = t.data<uint8_t>();
      for (int64_t i = 0; i < n; ++i) take(p[i]);
      break;
    }
    default:
      for (int64_t i = 0; i < n; ++i) take(t.get_f64(i));
  }
  if (mn <= mx) r.min = mn, r.max = mx;
}

}  // namespace

std::string layer_precision(const ir::Node& n, const std::vector<ops::Value>& outs) {
  if (const ir::Attribute* a = n.attr("kiln.precision"); a && a->type == ir::Attribute::Type::kString) return a->s;
  for (const auto& v : outs) {
    if (!v.is_tensor()) continue;
    DataType t = v.tensor.dtype();
    if (t == DataType::kFloat16) return "fp16";
    if (t == DataType::kBFloat16) return "bf16";
    if (t == DataType::kInt8 || t == DataType::kUInt8) return "int8";
  }
  return "fp32";
}

NumericsRange range_of(const std::string& name, const ops::Value* v) {
  NumericsRange r;
  r.name = name;
  if (!v || !v->is_tensor() || v->tensor.dtype() == DataType::kString || !v->tensor.defined()) return r;
  const Tensor& t = v->tensor;
  DataType dt = t.dtype();
  if (!dtype_is_float(dt) && !dtype_is_integer(dt) && dt != DataType::kBool) return r;
  r.dtype = dtype_name(dt);
  r.shape = t.shape();
  r.elements = t.numel();
  r.observed = true;
  if (t.numel() && t.raw()) scan(t, r);
  return r;
}

NumericsGuard::NumericsGuard(std::shared_ptr<const ir::Graph> graph, NumericsCheck check)
    : graph_(std::move(graph)), check_(check) {
  // Every body's owner, so that a body layer is named by its path from the main graph.
  std::vector<const ir::Graph*> todo{graph_.get()};
  while (!todo.empty()) {
    const ir::Graph* g = todo.back();
    todo.pop_back();
    for (const auto& n : g->nodes)
      for (const auto& [k, a] : n.attrs) {
        std::string name = n.name.empty() ? n.op_type : n.name;
        if (a.g) owners_[a.g.get()] = {g, name, k}, todo.push_back(a.g.get());
        for (size_t s = 0; s < a.graphs.size(); ++s)
          owners_[a.graphs[s].get()] = {g, name, k + "[" + std::to_string(s) + "]"}, todo.push_back(a.graphs[s].get());
      }
  }
}

std::string NumericsGuard::path_of(const ir::Graph& g, const ir::Node& n) const {
  std::string path = n.name.empty() ? n.op_type : n.name;
  for (const ir::Graph* at = &g; at;) {
    auto it = owners_.find(at);
    if (it == owners_.end()) break;
    path = it->second.node + "/" + it->second.attr + "/" + path;
    at = it->second.parent;
  }
  return path;
}

void NumericsGuard::add(NumericsFinding f) {
  int k = static_cast<int>(f.kind);
  ++kind_count_[k];
  // A control-flow layer's output carries what its body layers (observed before it) found.
  if (f.introduced && from_bodies_[k]) f.introduced = false;
  bool first_of_kind = !have_first_[k];
  have_first_[k] = true;
  // A problem an input already had is the earlier layer's: counted, not listed (the first of each
  // kind is always listed).
  if (!f.introduced && !first_of_kind) {
    ++report_.propagated;
    return;
  }
  if (static_cast<int>(report_.findings.size()) >= std::max(check_.max_findings, 3) && !first_of_kind) {
    ++report_.findings_dropped;
    return;
  }
  report_.findings.push_back(std::move(f));
}

void NumericsGuard::begin_run(const std::map<std::string, ops::Value>& inputs) {
  report_ = NumericsReport();
  produced_.clear();
  last_counts_.clear();
  std::fill(std::begin(kind_count_), std::end(kind_count_), 0);
  index_ = 0;
  std::fill(std::begin(have_first_), std::end(have_first_), false);
  for (const auto& [name, v] : inputs) {
    NumericsRange r = range_of(name, &v);
    produced_[name] = r;
    if (!r.observed || !(r.nan || r.inf)) continue;
    NumericsFinding f;
    f.kind = NumericsFinding::Kind::kNonFinite;
    f.index = -1;
    f.layer = "(graph input)";
    f.op_type = "input";
    f.output = name;
    f.bad = r.nan + r.inf;
    f.share = r.elements ? static_cast<double>(f.bad) / static_cast<double>(r.elements) : 0;
    f.range = r;
    f.message = "graph input " + range_str(r) + " already holds non-finite values";
    add(std::move(f));
  }
}

void NumericsGuard::attach(ops::Interpreter& interp) {
  interp.on_layer = [this](const ir::Graph& g, const ir::Node& n, const std::vector<const ops::Value*>& ins,
                           const std::vector<ops::Value>& outs) { observe(g, n, ins, outs); };
}

void NumericsGuard::observe(const ir::Graph& g, const ir::Node& n, const std::vector<const ops::Value*>& ins,
                            const std::vector<ops::Value>& outs) {
  const int64_t index = index_++;
  ++report_.layers_checked;
  // Findings made since the last layer of this graph ran are its bodies' (they run inside it).
  bool has_bodies = false;
  for (const auto& [k, a] : n.attrs) has_bodies |= a.g != nullptr || !a.graphs.empty();
  auto& last = last_counts_[&g];
  for (int k = 0; k < 3; ++k) from_bodies_[k] = has_bodies && kind_count_[k] > last[k];
  const std::string precision = layer_precision(n, outs);
  std::vector<NumericsRange> in_ranges;  // computed once, when the layer has a finding
  bool in_done = false;
  auto inputs = [&]() -> const std::vector<NumericsRange>& {
    if (!in_done) {
      // An input's range as it was made: the layer may have written its output over it (in place).
      for (size_t i = 0; i < ins.size() && i < n.inputs.size(); ++i) {
        if (n.inputs[i].empty()) continue;
        auto it = produced_.find(n.inputs[i]);
        in_ranges.push_back(it != produced_.end() ? it->second : range_of(n.inputs[i], ins[i]));
      }
      in_done = true;
    }
    return in_ranges;
  };
  auto make = [&](NumericsFinding::Kind kind, const std::string& out, const NumericsRange& r) {
    NumericsFinding f;
    f.kind = kind;
    f.index = index;
    f.layer = path_of(g, n);
    f.op_type = (n.domain.empty() || n.domain == "ai.onnx" ? "" : n.domain + ".") + n.op_type;
    f.precision = precision;
    f.output = out;
    f.range = r;
    f.inputs = inputs();
    return f;
  };
  auto inputs_str = [&]() {
    std::string s;
    for (const auto& r : inputs()) s += (s.empty() ? "" : ", ") + range_str(r);
    return s.empty() ? std::string("none") : s;
  };
  for (size_t o = 0; o < outs.size() && o < n.outputs.size(); ++o) {
    if (n.outputs[o].empty()) continue;
    NumericsRange r = range_of(n.outputs[o], &outs[o]);
    inputs();  // before this layer's outputs replace a value of the same name (a Loop's next iteration)
    produced_[n.outputs[o]] = r;
    if (!r.observed || !r.elements) continue;
    DataType dt = outs[o].tensor.dtype();
    const std::string where = "layer '" + path_of(g, n) + "' (" + (n.domain.empty() ? "" : n.domain + ".") + n.op_type +
                              ", " + precision + ") output " + range_str(r);
    if (r.nan || r.inf) {
      NumericsFinding f = make(NumericsFinding::Kind::kNonFinite, n.outputs[o], r);
      f.bad = r.nan + r.inf;
      f.share = static_cast<double>(f.bad) / static_cast<double>(r.elements);
      for (const auto& i : f.inputs) f.introduced &= !(i.nan || i.inf);
      f.message = where + ": " + std::to_string(f.bad) + " of " + std::to_string(r.elements) + " values are NaN/Inf" +
                  (f.introduced ? "" : " (an input already was)") + "; inputs " + inputs_str();
      add(std::move(f));
    }
    if (dtype_is_float(dt) && dt != DataType::kBFloat16 && abs_max(r) > kFP16Max) {
      NumericsFinding f = make(NumericsFinding::Kind::kFP16Overflow, n.outputs[o], r);
      const Tensor& t = outs[o].tensor;
      for (int64_t i = 0; i < t.numel(); ++i) {
        double v = t.get_f64(i);
        f.bad += std::isfinite(v) && std::fabs(v) > kFP16Max;
      }
      f.share = static_cast<double>(f.bad) / static_cast<double>(r.elements);
      f.warning = precision != "fp16";
      for (const auto& i : f.inputs)
        f.introduced &= !(i.observed && dtype_is_float_name(i.dtype) && abs_max(i) > kFP16Max);
      f.message = where + ": " + std::to_string(f.bad) + " of " + std::to_string(r.elements) +
                  " values beyond FP16's range (|x| > 65504)" +
                  (f.warning ? "; this " + precision +
                                   " layer would overflow in FP16 (under --fp16 keep it in fp32: "
                                   "--layer-precisions '" +
                                   n.name + ":fp32')"
                             : "") +
                  (f.introduced ? "" : " (an input already was)") + "; inputs " + inputs_str();
      add(std::move(f));
    }
    int64_t lo = 0, hi = 0;
    if (quant_range(dt, &lo, &hi)) {
      const Tensor& t = outs[o].tensor;
      int64_t clipped = n.op_type == "QuantizeLinear" && !overlaps_any(t, ins) ? quantize_clipped(n, ins, lo, hi) : -1;
      std::string how = "clipped by the quantization (round(x / scale) + zero point outside [" + std::to_string(lo) +
                        ", " + std::to_string(hi) +
                        "]; clamping at a limit equal to the zero point, a folded ReLU, not counted)";
      if (clipped < 0) {
        // Not a QuantizeLinear (or a blocked one): the values at either limit, except a limit that is
        // the output's zero point (a real zero, as after a ReLU), when the op says where that is.
        int zi = output_zero_point_input(n);
        int64_t zp = std::numeric_limits<int64_t>::min();
        if (zi >= 0 && static_cast<size_t>(zi) < ins.size() && ins[zi] && ins[zi]->is_tensor() &&
            ins[zi]->tensor.numel() == 1)
          zp = ins[zi]->tensor.get_i64(0);
        else if (zi >= 0)
          zp = 0;  // absent zero point: 0
        clipped = 0;
        for (int64_t i = 0; i < t.numel(); ++i) {
          int64_t v = t.get_i64(i);
          clipped += (v == lo || v == hi) && v != zp;
        }
        how = "at " + std::string(dtype_name(dt)) + "'s limits " + std::to_string(lo) + "/" + std::to_string(hi) +
              (zp != std::numeric_limits<int64_t>::min() ? " (zero point " + std::to_string(zp) + " left out)"
                                                         : " (zero point unknown)");
      }
      double share = static_cast<double>(clipped) / static_cast<double>(r.elements);
      if (clipped > 0 && share > check_.int8_saturation) {
        NumericsFinding f = make(NumericsFinding::Kind::kINT8Saturation, n.outputs[o], r);
        f.bad = clipped;
        f.share = share;
        // An int8 layer that only moves saturated values (Reshape, Transpose, Concat) repeats the
        // finding of the layer that made them.
        for (const auto& i : f.inputs)
          f.introduced &= !(i.observed && (i.dtype == "int8" || i.dtype == "uint8") &&
                            (i.min == static_cast<double>(lo) || i.max == static_cast<double>(hi)) &&
                            n.op_type != "QuantizeLinear");
        f.message = where + ": " + std::to_string(clipped) + " of " + std::to_string(r.elements) + " values (" +
                    fmt(100 * share) + "%, threshold " + fmt(100 * check_.int8_saturation) + "%) " + how + "; inputs " +
                    inputs_str();
        add(std::move(f));
      }
    }
  }
  std::copy(std::begin(kind_count_), std::end(kind_count_), last.begin());
  std::fill(std::begin(from_bodies_), std::end(from_bodies_), false);
}

namespace {
nlohmann::json range_json(const NumericsRange& r) {
  if (!r.observed) return {{"name", r.name}, {"observed", false}};
  return {{"name", r.name}, {"observed", true}, {"dtype", r.dtype}, {"shape", r.shape},      {"min", r.min},
          {"max", r.max},   {"nan", r.nan},     {"inf", r.inf},     {"elements", r.elements}};
}
}  // namespace

nlohmann::json numerics_json(const NumericsReport& r) {
  nlohmann::json fs = nlohmann::json::array();
  for (const auto& f : r.findings) {
    nlohmann::json ins = nlohmann::json::array();
    for (const auto& i : f.inputs) ins.push_back(range_json(i));
    fs.push_back({{"kind", numerics_kind_name(f.kind)},
                  {"severity", f.warning ? "warning" : "error"},
                  {"index", f.index},
                  {"layer", f.layer},
                  {"op_type", f.op_type},
                  {"precision", f.precision},
                  {"output", f.output},
                  {"range", range_json(f.range)},
                  {"bad", f.bad},
                  {"share", f.share},
                  {"introduced", f.introduced},
                  {"inputs", ins},
                  {"message", f.message}});
  }
  const NumericsFinding* first = r.first_error();
  return {{"layers_checked", r.layers_checked},
          {"findings", fs},
          {"first_error", first ? fs[static_cast<size_t>(first - r.findings.data())] : nlohmann::json(nullptr)},
          {"propagated", r.propagated},
          {"findings_dropped", r.findings_dropped}};
}

std::vector<std::string> numerics_lines(const NumericsReport& r, const std::string& who) {
  std::vector<std::string> lines;
  const NumericsFinding* first = r.first_error();
  int warnings = 0;
  for (const auto& f : r.findings) warnings += f.warning;
  std::string head = "numerics (" + who + ", " + std::to_string(r.layers_checked) + " layers checked): ";
  if (first)
    lines.push_back(head + "FIRST " + numerics_kind_name(first->kind) + " at layer " + std::to_string(first->index) +
                    " '" + first->layer + "'");
  else
    lines.push_back(head + "no Inf/NaN, FP16 overflow or INT8 saturation" +
                    (warnings ? " in the precision each layer runs in (" + std::to_string(warnings) + " warning(s))"
                              : std::string()));
  for (const auto& f : r.findings)
    lines.push_back(std::string("  ") + (f.warning ? "warning " : "error   ") + numerics_kind_name(f.kind) + ": " +
                    f.message);
  if (r.propagated)
    lines.push_back("  " + std::to_string(r.propagated) +
                    " later finding(s) only carry a problem an input already had");
  if (r.findings_dropped) lines.push_back("  " + std::to_string(r.findings_dropped) + " more finding(s) not listed");
  return lines;
}

}  // namespace engine
}  // namespace kiln
