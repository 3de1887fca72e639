#include "tune/layer_key.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "backends/device_runtime.h"

namespace kiln::tune {

namespace {

// Constants up to this many elements are parameters whose values can decide a kernel (axes, shapes,
// pads, clip bounds); larger ones are weights, whose values never do.
constexpr int64_t kParameterElements = 64;

std::string num(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

uint64_t tensor_hash(const Tensor& t) {
  std::string head = std::string(dtype_name(t.dtype())) + dims_str(t.shape());
  uint64_t h = fnv1a(head.data(), head.size());
  if (t.dtype() == DataType::kString) {
    for (int64_t i = 0; i < t.numel(); ++i) h = fnv1a(t.strings()[i].data(), t.strings()[i].size(), h);
    return h;
  }
  return t.raw() ? fnv1a(t.raw(), t.nbytes(), h) : h;
}

std::string tensor_text(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + dims_str(t.shape()) + "#" + hex64(tensor_hash(t));
}

void append_attr(const ir::Attribute& a, std::string& out);

// A graph (a fused op's body, a control-flow branch) up to renaming: values are numbered in order of
// definition, so two bodies computing the same thing from differently named values hash alike.
std::string graph_text(const ir::Graph& g) {
  std::map<std::string, std::string> ids;
  std::string out = "graph(";
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    ids[g.inputs[i].name] = "i" + std::to_string(i);
    out += g.inputs[i].type.str() + ",";
  }
  out += ")";
  for (const auto& [name, t] : g.initializers)
    if (!ids.count(name)) ids[name] = "w:" + tensor_text(t);
  int next = 0;
  auto ref = [&](const std::string& name) -> std::string {
    if (name.empty()) return "-";
    auto it = ids.find(name);
    return it != ids.end() ? it->second : "outer:" + name;  // read from an enclosing graph
  };
  for (const auto& n : g.nodes) {
    out += n.domain + "::" + n.op_type + "/" + std::to_string(n.opset) + "(";
    for (const auto& in : n.inputs) out += ref(in) + ",";
    out += "){";
    for (const auto& [k, a] : n.attrs) {
      if (k.rfind("kiln.", 0) == 0) continue;  // kiln's annotations (provenance), not semantics
      out += k + "=";
      append_attr(a, out);
      out += ";";
    }
    out += "}->";
    for (const auto& o : n.outputs) {
      if (!o.empty()) ids[o] = "v" + std::to_string(next++);
      out += ref(o) + ",";
    }
    out += ";";
  }
  out += "out(";
  for (const auto& o : g.outputs) out += ref(o.name) + ",";
  return out + ")";
}

void append_attr(const ir::Attribute& a, std::string& out) {
  using T = ir::Attribute::Type;
  auto list = [&](size_t n, auto&& item) {
    out += "[";
    for (size_t i = 0; i < n; ++i) {
      if (i) out += ",";
      item(i);
    }
    out += "]";
  };
  switch (a.type) {
    case T::kFloat: out += num(a.f); break;
    case T::kInt: out += std::to_string(a.i); break;
    case T::kString: out += quoted(a.s); break;
    case T::kTensor: out += tensor_text(a.t); break;
    case T::kGraph: {
      std::string g = a.g ? graph_text(*a.g) : "null";
      out += "graph#" + hex64(fnv1a(g.data(), g.size()));
      break;
    }
    case T::kFloats: list(a.floats.size(), [&](size_t i) { out += num(a.floats[i]); }); break;
    case T::kInts: list(a.ints.size(), [&](size_t i) { out += std::to_string(a.ints[i]); }); break;
    case T::kStrings: list(a.strings.size(), [&](size_t i) { out += quoted(a.strings[i]); }); break;
    case T::kTensors: list(a.tensors.size(), [&](size_t i) { out += tensor_text(a.tensors[i]); }); break;
    case T::kGraphs:
      list(a.graphs.size(), [&](size_t i) {
        std::string g = a.graphs[i] ? graph_text(*a.graphs[i]) : "null";
        out += "graph#" + hex64(fnv1a(g.data(), g.size()));
      });
      break;
    case T::kTypeProto: out += "type:" + a.type_proto.str(); break;
    case T::kUndefined: out += "?"; break;
  }
}

}  // namespace

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex64(uint64_t v) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::string layer_key(const backends::LayerSignature& sig) {
  const ir::Node& n = *sig.node;
  std::string out = n.domain.empty() ? "" : n.domain + "::";
  out += n.op_type + "/" + std::to_string(n.opset) + "{";
  for (const auto& [k, a] : n.attrs) {
    // kiln's annotations ("kiln.*": provenance, the plain value a blocked layer stands for) are
    // not what is computed
    if (k.rfind("kiln.", 0) == 0) continue;
    out += k + "=";
    append_attr(a, out);
    out += ";";
  }
  out += "}(";
  for (size_t i = 0; i < sig.inputs.size(); ++i) {
    const backends::TensorSig& t = sig.inputs[i];
    if (i) out += ",";
    if (!t.present) {
      out += "-";
      continue;
    }
    out += std::string(dtype_name(t.dtype)) + dims_str(t.shape);
    if (t.constant)
      out += t.constant->numel() <= kParameterElements ? "const#" + hex64(tensor_hash(*t.constant)) : "const";
  }
  out += ")@" + backends::device_name(sig.device);
  // The instruction set the kernels may use (--isa) picks their code path: timings of one say
  // nothing of another. Spaces would read as separators in the key: "avx2+avx512".
  if (sig.device.kind == DeviceKind::kCPU) {
    std::string isa = isa_names(sig.isa);
    std::replace(isa.begin(), isa.end(), ' ', '+');
    out += "[" + isa + "]";
  } else if (const backends::DeviceRuntime* rt = backends::device_runtime(sig.device.kind)) {
    // The GPU model and its software (compute capability, driver, CUDA runtime, cuBLASLt, cuDNN), as
    // the engine file records them: timings on one say nothing of another.
    if (std::string id = backends::identity_key(*rt, sig.device.index); !id.empty()) out += "[" + id + "]";
  }
  out += ":" + std::string(dtype_name(sig.compute));
  return out;
}

}  // namespace kiln::tune
