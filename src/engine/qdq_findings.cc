// QuantizeLinear / DequantizeLinear layers that no INT8 layer took are findings, never silent: after
// the passes, such a layer converts between float and 8 bits around float work (a Q -> DQ pair in
// front of a float MatMul, a DQ of a value no INT8 layer wrote), which costs two passes over the
// tensor and computes nothing in INT8. The builder warns per layer (naming its readers or its
// source), counts them in its log and in the engine (build["qdq_unfolded"], listed by kiln inspect),
// and under BuilderConfig::strict_tactics fails instead.
//
// Taken (not findings): a QuantizeLinear all of whose readers are INT8 layers (ops::computes_in_int8),
// directly or through 8-bit movement layers (Reshape, Transpose, Concat, ...), or graph outputs; a
// DequantizeLinear whose input an INT8 layer wrote (directly or through such movement), or a graph
// input: the INT8 region's entries and exits.
#include <set>

#include "engine/engine_impl.h"
#include "ir/rewrite.h"
#include "ops/quantized_layers.h"

namespace kiln::detail {

namespace {

bool is_qdq(const ir::Node& n) {
  return n.domain.empty() && (n.op_type == "QuantizeLinear" || n.op_type == "DequantizeLinear");
}

bool is_8bit(const ir::Graph& g, const std::string& v) {
  auto it = g.value_types.find(v);
  if (it == g.value_types.end() || !it->second.is_tensor()) return false;
  return it->second.elem == DataType::kUInt8 || it->second.elem == DataType::kInt8;
}

// Layers that move 8-bit values without computing on them.
bool is_movement(const ir::Node& n) {
  static const std::set<std::string> ops = {"Reshape", "Flatten",  "Transpose", "Squeeze", "Unsqueeze",
                                            "Concat",  "Identity", "Split",     "Slice"};
  return n.domain.empty() && ops.count(n.op_type);
}

std::string describe(const ir::Node& n) {
  return "'" + n.name + "' (" + (n.domain.empty() ? n.op_type : n.domain + "." + n.op_type) + ")";
}

struct Walker {
  const ir::Graph& g;
  ir::UseIndex uses;

  // Whether every reader of the 8-bit value `v` is an INT8 layer (through movement); else the first
  // float reader in *why.
  bool read_by_int8(const std::string& v, std::string* why, int depth = 0) const {
    if (depth > 64) return false;
    for (int r : uses.consumers(v)) {
      const ir::Node& n = g.nodes[static_cast<size_t>(r)];
      if (ops::computes_in_int8(n)) continue;
      if (is_movement(n) && !n.outputs.empty() && is_8bit(g, n.outputs[0])) {
        bool ok = true;
        for (const auto& o : n.outputs) ok = ok && (o.empty() || read_by_int8(o, why, depth + 1));
        if (ok) continue;
        return false;
      }
      *why = describe(n);
      // A Q -> DQ pair: name the float work behind the DQ too.
      if (n.domain.empty() && n.op_type == "DequantizeLinear" && !n.outputs.empty() &&
          !uses.consumers(n.outputs[0]).empty())
        *why += " -> " + describe(g.nodes[static_cast<size_t>(uses.consumers(n.outputs[0])[0])]);
      return false;
    }
    return true;
  }

  // Whether an INT8 layer (through movement) or the graph's input wrote the 8-bit value `v`.
  bool written_by_int8(const std::string& v, std::string* why, int depth = 0) const {
    if (depth > 64) return false;
    int p = uses.producer(v);
    if (p < 0) return ir::is_constant(g, v) ? (*why = "a constant", false) : true;  // a graph input
    const ir::Node& n = g.nodes[static_cast<size_t>(p)];
    if (ops::computes_in_int8(n)) return true;
    if (is_movement(n) && n.has_input(0)) return written_by_int8(n.inputs[0], why, depth + 1);
    *why = describe(n);
    return false;
  }
};

}  // namespace

Status report_unfolded_qdq(const std::shared_ptr<EngineImpl>& e, const BuilderConfig& cfg,
                           const std::function<void(const std::string&)>& log) {
  const ir::Graph& g = *e->model.graph;
  bool any = false;
  for (const auto& n : g.nodes) any = any || is_qdq(n) || ops::computes_in_int8(n);
  if (!any) return Status::Ok();  // not an INT8 engine
  Walker w{g, ir::UseIndex(g)};
  nlohmann::json list = nlohmann::json::array();
  std::vector<std::string> lines;
  int int8_layers = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    int8_layers += ops::computes_in_int8(n);
    if (!is_qdq(n) || n.outputs.empty() || n.inputs.empty()) continue;
    std::string why, reason;
    if (n.op_type == "QuantizeLinear") {
      if (w.uses.is_graph_output(n.outputs[0]) || w.read_by_int8(n.outputs[0], &why)) continue;
      reason = "quantizes for " + why + ", which computes in float";
    } else {
      if (w.written_by_int8(n.inputs[0], &why)) continue;
      reason = "dequantizes what " + why + " wrote, not an INT8 layer";
    }
    const std::string name = i < e->layers.size() ? e->layers[i].name : n.name;
    list.push_back({{"layer", name}, {"op", n.op_type}, {"reason", reason}});
    lines.push_back("layer '" + name + "' (" + n.op_type + ") " + reason);
  }
  const size_t count = lines.size();
  if (cfg.strict_tactics && count) {
    std::string all;
    for (const auto& l : lines) all += "\n  " + l;
    return Unsupported("--strict-tactics: ", count, " QuantizeLinear/DequantizeLinear layer", count == 1 ? "" : "s",
                       " that no INT8 layer takes would run as float conversions:", all,
                       "\n— quantize the model where kiln's INT8 layers take the Q/DQ pairs (README: INT8), exclude "
                       "those layers from INT8, or build without --strict-tactics to accept them");
  }
  auto warn = warner(cfg);
  for (const auto& l : lines) warn(l + ": no INT8 layer takes it (a float conversion of its own)");
  e->build["qdq_unfolded"] = {{"layers", count}, {"int8_layers", int8_layers}, {"list", list}};
  log("[kiln build] INT8: " + std::to_string(int8_layers) + " INT8 layer" + (int8_layers == 1 ? "" : "s") + ", " +
      std::to_string(count) + " QuantizeLinear/DequantizeLinear layer" + (count == 1 ? "" : "s") +
      " that no INT8 layer takes" + (count ? " (kiln inspect lists them)" : ""));
  return Status::Ok();
}

}  // namespace kiln::detail
