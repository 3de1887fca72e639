#include "onnx/importer.h"

#include <google/protobuf/io/coded_stream.h>
#include <sys/mman.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>

#include "core/checked_size.h"
#include "core/file_access.h"
#include "core/mapped_file.h"
#include "core/parallel.h"
#include "onnx/onnx.pb.h"
#include "onnx/onnx_data.pb.h"
#include "onnx/raw_data_split.h"
#include "ops/shape_inference.h"

namespace kiln::onnx_import {

namespace fs = std::filesystem;

namespace {

// Protobuf nesting accepted (ModelProto -> GraphProto -> NodeProto -> AttributeProto -> GraphProto ...).
constexpr int kProtoRecursionLimit = 200;

template <typename Msg>
bool parse_message(std::string_view bytes, Msg* msg, int recursion_limit = kProtoRecursionLimit) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(std::min<size_t>(bytes.size(), INT32_MAX)));
  in.SetTotalBytesLimit(INT32_MAX);
  in.SetRecursionLimit(recursion_limit);
  return msg->ParseFromCodedStream(&in) && in.ConsumedEntireMessage();
}

// How deep the messages of an ONNX model's wire bytes nest, following every field through which ONNX
// messages nest without bound (graphs in attributes, nodes in graphs and functions, types in types),
// without recursion and without building the messages; other fields are skipped as bytes (they add a
// few levels at most). nullopt when the bytes are not well-formed protobuf along those fields. This
// tells a model nested deeper than any limit from a corrupt one, when protobuf refuses both.
std::optional<int> onnx_nesting_depth(std::string_view bytes) {
  constexpr int kMaxScannedDepth = 100 * kProtoRecursionLimit;
  enum Kind { kModel, kTraining, kFunction, kGraph, kNode, kAttr, kValueInfo, kType, kTypeElem, kTypeMap, kLeaf };
  auto child = [](int kind, uint64_t field) -> int {
    switch (kind) {
      case kModel: return field == 7 ? kGraph : field == 20 ? kTraining : field == 25 ? kFunction : kLeaf;
      case kTraining: return field == 1 || field == 2 ? kGraph : kLeaf;
      case kFunction: return field == 7 ? kNode : kLeaf;
      case kGraph: return field == 1 ? kNode : field >= 11 && field <= 13 ? kValueInfo : kLeaf;
      case kNode: return field == 5 ? kAttr : kLeaf;
      case kAttr: return field == 6 || field == 11 ? kGraph : field == 14 || field == 15 ? kType : kLeaf;
      case kValueInfo: return field == 2 ? kType : kLeaf;
      case kType: return field == 4 || field == 9 ? kTypeElem : field == 5 ? kTypeMap : kLeaf;
      case kTypeElem: return field == 1 ? kType : kLeaf;  // Sequence.elem_type, Optional.elem_type
      case kTypeMap: return field == 2 ? kType : kLeaf;   // Map.value_type
      default: return kLeaf;
    }
  };
  auto varint = [](const uint8_t*& p, const uint8_t* end, uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
      uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  };
  struct Level {
    int kind;
    const uint8_t *p, *end;
  };
  const auto* begin = reinterpret_cast<const uint8_t*>(bytes.data());
  std::vector<Level> stack{{kModel, begin, begin + bytes.size()}};
  int deepest = 0;
  while (!stack.empty()) {
    Level& top = stack.back();
    if (top.p == top.end) {
      stack.pop_back();
      continue;
    }
    uint64_t tag, n;
    if (!varint(top.p, top.end, tag) || (tag >> 3) == 0) return std::nullopt;
    switch (tag & 7) {
      case 0:
        if (!varint(top.p, top.end, n)) return std::nullopt;
        break;
      case 1:
      case 5: {
        size_t w = (tag & 7) == 1 ? 8 : 4;
        if (static_cast<size_t>(top.end - top.p) < w) return std::nullopt;
        top.p += w;
        break;
      }
      case 2: {
        if (!varint(top.p, top.end, n) || n > static_cast<uint64_t>(top.end - top.p)) return std::nullopt;
        const uint8_t* body = top.p;
        top.p += n;
        int kind = child(top.kind, tag >> 3);
        if (kind != kLeaf) {
          stack.push_back({kind, body, body + n});  // invalidates `top`
          deepest = std::max(deepest, static_cast<int>(stack.size()) - 1);
          if (deepest >= kMaxScannedDepth) return deepest;  // deep enough to tell; the stack stays small
        }
        break;
      }
      default: return std::nullopt;  // groups (unused by ONNX) or an invalid wire type
    }
  }
  return deepest;
}

// Unpacks sub-byte elements (int4/uint4/float4/int2/uint2) from packed little-endian bytes.
void unpack_sub_byte(const uint8_t* src, Tensor& t) {
  int bits = dtype_packed_bits(t.dtype());
  int per_byte = 8 / bits;
  uint8_t mask = static_cast<uint8_t>((1u << bits) - 1);
  auto* dst = static_cast<uint8_t*>(t.raw());
  bool sign = t.dtype() == DataType::kInt4 || t.dtype() == DataType::kInt2;
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint8_t v = static_cast<uint8_t>((src[i / per_byte] >> ((i % per_byte) * bits)) & mask);
    if (sign && (v & (1u << (bits - 1)))) v = static_cast<uint8_t>(v | ~mask);  // sign-extend
    dst[i] = v;
  }
}

// Bytes `numel` elements of dt take in a file (sub-byte types packed); numel is already checked.
size_t file_bytes(DataType dt, int64_t numel) {
  int bits = dtype_packed_bits(dt);
  return bits < 8 ? static_cast<size_t>(numel / 8 * bits + (numel % 8 * bits + 7) / 8)
                  : static_cast<size_t>(numel) * dtype_size(dt);
}

size_t packed_bytes(const Tensor& t) { return file_bytes(t.dtype(), t.numel()); }

// Whether n bytes are exactly t's elements as stored (no unpacking, no size error): a plain copy.
bool plain_bytes(const Tensor& t, size_t n) {
  return t.dtype() != DataType::kString && dtype_packed_bits(t.dtype()) >= 8 && n == t.nbytes();
}

Status fill_from_raw(std::string_view raw, Tensor& t, const std::string& what) {
  if (t.dtype() == DataType::kString) return InvalidModel(what, ": string tensors cannot use raw_data");
  size_t need = dtype_packed_bits(t.dtype()) < 8 ? packed_bytes(t) : t.nbytes();
  if (raw.size() != need)
    return InvalidModel(what, ": raw_data holds ", raw.size(), " bytes but ", t.describe(), " needs ", need);
  if (dtype_packed_bits(t.dtype()) < 8)
    unpack_sub_byte(reinterpret_cast<const uint8_t*>(raw.data()), t);
  else if (need)
    std::memcpy(t.raw(), raw.data(), need);
  return Status::Ok();
}

template <typename Field>
Status check_count(const Field& f, int64_t expected, const std::string& what, const char* field) {
  if (static_cast<int64_t>(f.size()) != expected)
    return InvalidModel(what, ": ", field, " holds ", f.size(), " values but the dims need ", expected);
  return Status::Ok();
}

struct ExternalRef {
  std::string location;
  int64_t offset = 0, length = -1;  // -1: to the end of the file
};

Result<ExternalRef> external_ref(const onnx::TensorProto& p, const std::string& what) {
  ExternalRef r;
  for (const auto& kv : p.external_data()) {
    try {
      if (kv.key() == "location")
        r.location = kv.value();
      else if (kv.key() == "offset")
        r.offset = std::stoll(kv.value());
      else if (kv.key() == "length")
        r.length = std::stoll(kv.value());
    } catch (...) {
      return InvalidModel(what, ": external_data '", kv.key(), "' has a non-numeric value '", kv.value(), "'");
    }
  }
  if (r.location.empty()) return InvalidModel(what, ": external data without a 'location'");
  return r;
}

// Reads a tensor's external data from its file beside the model, straight into the tensor. The file
// is opened confined to the model's folder (core/file_access.h), without blocking, and must be a
// regular file; offset and length are checked against its size and the tensor's before any read.
Result<Tensor> read_external(const ExternalRef& ref, const std::string& base_dir, bool allow_outside,
                             const std::string& what, DataType dt, const Dims& dims) {
  if (base_dir.empty()) return InvalidModel(what, ": uses external data but the model was not loaded from a file");
  std::string file_what = "external data '" + ref.location + "' of " + what;
  KILN_ASSIGN_OR_RETURN(OpenedFile f, open_inside(base_dir, ref.location, allow_outside, file_what));
  int64_t size = static_cast<int64_t>(f.size), offset = ref.offset, length = ref.length;
  if (offset < 0 || offset > size)
    return InvalidModel(what, ": external data offset ", offset, " is outside '", ref.location, "' (", size, " bytes)");
  if (length < -1) return InvalidModel(what, ": external data length ", length, " is negative");
  if (length == -1) length = size - offset;
  if (length > size - offset)
    return InvalidModel(what, ": external data [", offset, ", +", length, ") runs past the end of '", ref.location,
                        "' (", size, " bytes)");
  if (dt == DataType::kString) return InvalidModel(what, ": string tensors cannot use external data");
  size_t need = file_bytes(dt, dims_numel(dims));
  if (static_cast<size_t>(length) != need)
    return InvalidModel(what, ": external data holds ", length, " bytes but ", dtype_name(dt), dims_str(dims),
                        " needs ", need);
  Tensor t = Tensor::uninitialized(dt, dims);  // sizes checked: allocate, then fill every byte
  if (plain_bytes(t, need)) {                  // the common case: one read into the tensor
    KILN_RETURN_IF_ERROR(read_at(f.fd.get(), t.raw(), need, static_cast<uint64_t>(offset), file_what));
    return t;
  }
  std::string buf(need, '\0');
  KILN_RETURN_IF_ERROR(read_at(f.fd.get(), buf.data(), need, static_cast<uint64_t>(offset), file_what));
  KILN_RETURN_IF_ERROR(fill_from_raw(buf, t, what));
  return t;
}

Result<ir::TypeInfo> convert_type(const onnx::TypeProto& tp, const std::string& what) {
  switch (tp.value_case()) {
    case onnx::TypeProto::kTensorType: {
      const auto& tt = tp.tensor_type();
      if (tt.elem_type() != 0 && !dtype_is_known(tt.elem_type()))
        return Unsupported(what, ": unknown element type code ", tt.elem_type());
      SymShape shape;
      if (tt.has_shape()) {
        std::vector<Dim> dims;
        for (const auto& d : tt.shape().dim()) {
          if (d.has_dim_value()) {
            if (d.dim_value() < 0) return InvalidModel(what, ": negative dimension ", d.dim_value());
            dims.emplace_back(d.dim_value());
          } else if (d.has_dim_param() && !d.dim_param().empty()) {
            dims.push_back(Dim::symbol(d.dim_param()));
          } else {
            dims.emplace_back();
          }
        }
        shape = SymShape(std::move(dims));
      }
      return ir::TypeInfo::tensor(static_cast<DataType>(tt.elem_type()), shape);
    }
    case onnx::TypeProto::kSequenceType: {
      KILN_ASSIGN_OR_RETURN(ir::TypeInfo e, convert_type(tp.sequence_type().elem_type(), what));
      return ir::TypeInfo::sequence(e);
    }
    case onnx::TypeProto::kOptionalType: {
      KILN_ASSIGN_OR_RETURN(ir::TypeInfo e, convert_type(tp.optional_type().elem_type(), what));
      return ir::TypeInfo::optional(e);
    }
    case onnx::TypeProto::kMapType: {
      KILN_ASSIGN_OR_RETURN(ir::TypeInfo v, convert_type(tp.map_type().value_type(), what));
      ir::TypeInfo t;
      t.kind = ir::TypeInfo::Kind::kMap;
      t.map_key = static_cast<DataType>(tp.map_type().key_type());
      t.inner = std::make_shared<ir::TypeInfo>(v);
      return t;
    }
    case onnx::TypeProto::kSparseTensorType: return Unsupported(what, ": sparse tensor values are not supported");
    default: return ir::TypeInfo();
  }
}

// The original model bytes when detach_raw_data() rewrote them, and the copies out of them that
// the import defers: all of them run at the end, spread over the threads (copying 100 MB of weights
// into fresh memory is mostly page-fault work, which both cores can do).
struct Detached {
  std::string_view bytes;
  struct Copy {
    const char* src;
    size_t n;
    void* dst;
  };
  std::vector<Copy> copies;

  bool empty() const { return bytes.empty(); }
  void run_copies();
};

Result<Tensor> convert_tensor(const onnx::TensorProto& p, const std::string& base_dir, bool allow_outside,
                              Detached* detached, const char* kind = "tensor");

struct Importer {
  std::string base_dir;
  bool allow_outside = false;
  ExternalResolver resolver;
  Detached detached;

  // `kind` names it in errors: "initializer 'w'", "tensor 'w'".
  Result<Tensor> load_tensor(const onnx::TensorProto& p, const char* kind = "tensor") {
    if (resolver && p.data_location() == onnx::TensorProto::EXTERNAL) {
      std::string what = std::string(kind) + " '" + p.name() + "'";
      KILN_ASSIGN_OR_RETURN(ExternalRef ref, external_ref(p, what));
      if (ref.location != kDetachedLocation || detached.empty()) {
        if (!dtype_is_known(p.data_type())) return Unsupported(what, ": unknown data type code ", p.data_type());
        Dims dims(p.dims().begin(), p.dims().end());
        KILN_RETURN_IF_ERROR(
            checked_tensor_bytes(static_cast<DataType>(p.data_type()), dims, what, ErrorCode::kInvalidModel).status());
        return resolver(ref.location, ref.offset, ref.length, static_cast<DataType>(p.data_type()), dims);
      }
    }
    return convert_tensor(p, base_dir, allow_outside, detached.empty() ? nullptr : &detached, kind);
  }
  std::map<std::string, int> opsets;
  int node_counter = 0;

  Status convert_graph(const onnx::GraphProto& gp, ir::Graph& g, const ir::Graph* parent) {
    g.name = gp.name();
    g.parent = parent;
    g.opset_imports = opsets;
    for (const auto& tp : gp.initializer()) {
      if (tp.name().empty()) return InvalidModel("graph '", g.name, "' has an initializer without a name");
      KILN_ASSIGN_OR_RETURN(Tensor t, load_tensor(tp, "initializer"));
      g.initializers[tp.name()] = std::move(t);
    }
    for (const auto& sp : gp.sparse_initializer()) {
      KILN_ASSIGN_OR_RETURN(Tensor t, sparse_to_dense(sp));
      g.initializers[sp.values().name()] = std::move(t);
    }
    for (const auto& vi : gp.input()) {
      KILN_ASSIGN_OR_RETURN(ir::TypeInfo t, convert_type(vi.type(), "graph input '" + vi.name() + "'"));
      if (vi.name().empty()) return InvalidModel("graph '", g.name, "' has an input without a name");
      g.inputs.push_back({vi.name(), t});
    }
    for (const auto& vi : gp.output()) {
      KILN_ASSIGN_OR_RETURN(ir::TypeInfo t, convert_type(vi.type(), "graph output '" + vi.name() + "'"));
      g.outputs.push_back({vi.name(), t});
    }
    for (const auto& vi : gp.value_info()) {
      auto t = convert_type(vi.type(), "value_info '" + vi.name() + "'");
      if (t.ok()) g.value_types[vi.name()] = t.value();
    }
    for (const auto& np : gp.node()) {
      ir::Node n;
      KILN_RETURN_IF_ERROR(convert_node(np, n, g));
      g.nodes.push_back(std::move(n));
    }
    // Some old files list node outputs as graph inputs too; the node is the real producer.
    std::set<std::string> produced;
    for (const auto& n : g.nodes)
      for (const auto& o : n.outputs) produced.insert(o);
    std::erase_if(g.inputs, [&](const ir::ValueInfo& v) { return produced.count(v.name) > 0; });
    return Status::Ok();  // sorted once every graph is complete (sort_all)
  }

  // ONNX SparseTensorProto: values [NNZ], indices [NNZ] (linear) or [NNZ, rank] (COO coordinates),
  // dims the dense shape. Every index is checked against NNZ and the dims before it is used.
  Result<Tensor> sparse_to_dense(const onnx::SparseTensorProto& sp) {
    std::string what = "sparse tensor '" + sp.values().name() + "'";
    KILN_ASSIGN_OR_RETURN(Tensor values, load_tensor(sp.values()));
    KILN_ASSIGN_OR_RETURN(Tensor indices, load_tensor(sp.indices()));
    Dims dims(sp.dims().begin(), sp.dims().end());
    KILN_RETURN_IF_ERROR(checked_tensor_bytes(values.dtype(), dims, what, ErrorCode::kInvalidModel).status());
    if (values.rank() != 1)
      return InvalidModel(what, ": values must be 1-D [NNZ] but have shape ", dims_str(values.shape()));
    if (!dtype_is_integer(indices.dtype()))
      return InvalidModel(what, ": indices must be integers, not ", dtype_name(indices.dtype()));
    int64_t n = values.numel();
    int64_t rank = static_cast<int64_t>(dims.size());
    bool coo_flat = indices.rank() == 1;
    if (coo_flat ? indices.numel() != n : indices.rank() != 2 || indices.shape()[0] != n || indices.shape()[1] != rank)
      return InvalidModel(what, ": indices of shape ", dims_str(indices.shape()), " do not match ", n,
                          " values and dense shape ", dims_str(dims), " (expected [", n, "] or [", n, ",", rank, "])");
    Tensor out(values.dtype(), dims);
    int64_t total = out.numel();
    size_t es = dtype_size(values.dtype());
    for (int64_t i = 0; i < n; ++i) {
      int64_t flat = 0;
      if (coo_flat) {
        flat = indices.get_i64(i);
      } else {
        for (int64_t d = 0; d < rank; ++d) {
          int64_t c = indices.get_i64(i * rank + d), extent = dims[static_cast<size_t>(d)];
          if (c < 0 || c >= extent)
            return InvalidModel(what, ": index ", i, " has coordinate ", c, " on axis ", d, ", outside [0, ", extent,
                                ")");
          flat = flat * extent + c;  // < total: no overflow
        }
      }
      if (flat < 0 || flat >= total)
        return InvalidModel(what, ": index ", i, " is ", flat, ", outside the ", total, " elements of ",
                            dims_str(dims));
      if (values.dtype() == DataType::kString)
        out.strings()[flat] = values.strings()[i];
      else
        std::memcpy(static_cast<uint8_t*>(out.raw()) + flat * es, static_cast<const uint8_t*>(values.raw()) + i * es,
                    es);
    }
    return out;
  }

  Status convert_node(const onnx::NodeProto& np, ir::Node& n, const ir::Graph& g) {
    n.op_type = np.op_type();
    n.domain = np.domain() == "ai.onnx" ? "" : np.domain();
    n.name = np.name().empty() ? np.op_type() + "_" + std::to_string(node_counter) : np.name();
    ++node_counter;
    if (n.op_type.empty()) return InvalidModel("node '", n.name, "' in graph '", g.name, "' has no op_type");
    auto it = opsets.find(n.domain);
    if (it == opsets.end())
      return InvalidModel(n.where(), "its domain '", n.domain.empty() ? "ai.onnx" : n.domain,
                          "' is not in the model's opset_import — re-export the model with that domain imported");
    n.opset = it->second;
    n.inputs.assign(np.input().begin(), np.input().end());
    n.outputs.assign(np.output().begin(), np.output().end());
    for (const auto& ap : np.attribute()) {
      if (ap.name().empty()) return InvalidModel(n.where(), "has an attribute without a name");
      ir::Attribute a;
      KILN_RETURN_IF_ERROR(convert_attribute(ap, a, n, g));
      n.attrs[ap.name()] = std::move(a);
    }
    return Status::Ok();
  }

  Status convert_attribute(const onnx::AttributeProto& ap, ir::Attribute& a, const ir::Node& n, const ir::Graph& g) {
    using T = ir::Attribute::Type;
    std::string what = n.where() + "attribute '" + ap.name() + "'";
    if (!ap.ref_attr_name().empty())
      return Unsupported(what, " refers to a function attribute '", ap.ref_attr_name(), "' outside a function");
    auto type = ap.type();
    if (type == onnx::AttributeProto::UNDEFINED) {  // IR < 2 files: guess from the filled field
      if (ap.has_f())
        type = onnx::AttributeProto::FLOAT;
      else if (ap.has_i())
        type = onnx::AttributeProto::INT;
      else if (ap.has_s())
        type = onnx::AttributeProto::STRING;
      else if (ap.has_t())
        type = onnx::AttributeProto::TENSOR;
      else if (ap.has_g())
        type = onnx::AttributeProto::GRAPH;
      else if (ap.floats_size())
        type = onnx::AttributeProto::FLOATS;
      else if (ap.ints_size())
        type = onnx::AttributeProto::INTS;
      else if (ap.strings_size())
        type = onnx::AttributeProto::STRINGS;
    }
    switch (type) {
      case onnx::AttributeProto::FLOAT:
        a.type = T::kFloat;
        a.f = ap.f();
        break;
      case onnx::AttributeProto::INT:
        a.type = T::kInt;
        a.i = ap.i();
        break;
      case onnx::AttributeProto::STRING:
        a.type = T::kString;
        a.s = ap.s();
        break;
      case onnx::AttributeProto::TENSOR: {
        a.type = T::kTensor;
        auto t = load_tensor(ap.t());
        if (!t.ok()) return t.status().with_context(what + ": ");
        a.t = std::move(t).value();
        break;
      }
      case onnx::AttributeProto::SPARSE_TENSOR: {
        a.type = T::kTensor;
        auto t = sparse_to_dense(ap.sparse_tensor());
        if (!t.ok()) return t.status().with_context(what + ": ");
        a.t = std::move(t).value();
        break;
      }
      case onnx::AttributeProto::GRAPH: {
        a.type = T::kGraph;
        a.g = std::make_shared<ir::Graph>();
        KILN_RETURN_IF_ERROR(convert_graph(ap.g(), *a.g, &g));
        break;
      }
      case onnx::AttributeProto::FLOATS:
        a.type = T::kFloats;
        a.floats.assign(ap.floats().begin(), ap.floats().end());
        break;
      case onnx::AttributeProto::INTS:
        a.type = T::kInts;
        a.ints.assign(ap.ints().begin(), ap.ints().end());
        break;
      case onnx::AttributeProto::STRINGS:
        a.type = T::kStrings;
        a.strings.assign(ap.strings().begin(), ap.strings().end());
        break;
      case onnx::AttributeProto::TENSORS:
        a.type = T::kTensors;
        for (const auto& tp : ap.tensors()) {
          auto t = load_tensor(tp);
          if (!t.ok()) return t.status().with_context(what + ": ");
          a.tensors.push_back(std::move(t).value());
        }
        break;
      case onnx::AttributeProto::GRAPHS:
        a.type = T::kGraphs;
        for (const auto& gp : ap.graphs()) {
          auto sg = std::make_shared<ir::Graph>();
          KILN_RETURN_IF_ERROR(convert_graph(gp, *sg, &g));
          a.graphs.push_back(sg);
        }
        break;
      case onnx::AttributeProto::TYPE_PROTO: {
        a.type = T::kTypeProto;
        KILN_ASSIGN_OR_RETURN(a.type_proto, convert_type(ap.tp(), what));
        break;
      }
      default: return Unsupported(what, " has an unsupported attribute type ", static_cast<int>(ap.type()));
    }
    return Status::Ok();
  }
};

// Sets parent pointers after the graphs have their final addresses (vectors may have moved).
void fix_parents(ir::Graph& g, const ir::Graph* parent) {
  g.parent = parent;
  for (auto& n : g.nodes)
    for (auto& [k, a] : n.attrs) {
      if (a.g) fix_parents(*a.g, &g);
      for (auto& sg : a.graphs) fix_parents(*sg, &g);
    }
}

// Sorts subgraphs first, then the graph; a subgraph may read any value of its enclosing graphs.
Status sort_all(ir::Graph& g) {
  for (auto& n : g.nodes)
    for (auto& [k, a] : n.attrs) {
      if (a.g) KILN_RETURN_IF_ERROR(sort_all(*a.g));
      for (auto& sg : a.graphs) KILN_RETURN_IF_ERROR(sort_all(*sg));
    }
  return g.topological_sort();
}

}  // namespace

namespace {
void Detached::run_copies() {
  size_t total = 0;
  for (const Copy& c : copies) total += c.n;
  constexpr size_t kChunk = size_t{1} << 20;
  // Chunk i of the concatenated copies, found by walking the list (a few hundred entries).
  parallel_for(static_cast<int64_t>((total + kChunk - 1) / kChunk), 1, [&](int64_t begin, int64_t end) {
    size_t lo = static_cast<size_t>(begin) * kChunk, hi = std::min(total, static_cast<size_t>(end) * kChunk), at = 0;
    for (const Copy& c : copies) {
      size_t b = std::max(lo, at), e = std::min(hi, at + c.n);
      if (b < e) {
        char* dst = static_cast<char*>(c.dst) + (b - at);
        // Map the destination's pages in one call instead of a fault per 4 KiB (a hint; Linux >= 5.14).
        uintptr_t pb = (reinterpret_cast<uintptr_t>(dst) + 4095) & ~uintptr_t{4095},
                  pe = (reinterpret_cast<uintptr_t>(dst) + (e - b)) & ~uintptr_t{4095};
        if (pe > pb) ::madvise(reinterpret_cast<void*>(pb), pe - pb, MADV_POPULATE_WRITE);
        std::memcpy(dst, c.src + (b - at), e - b);
      }
      at += c.n;
      if (at >= hi) break;
    }
  });
  copies.clear();
}

// `detached`: set when detach_raw_data() rewrote the model; its copies are deferred (run_copies).
Result<Tensor> convert_tensor(const onnx::TensorProto& p, const std::string& base_dir, bool allow_outside,
                              Detached* detached, const char* kind) {
  std::string what = std::string(kind) + " '" + p.name() + "'";
  if (p.has_segment()) return Unsupported(what, ": segmented tensors are not supported");
  if (!dtype_is_known(p.data_type())) return Unsupported(what, ": unknown data type code ", p.data_type());
  auto dt = static_cast<DataType>(p.data_type());
  if (dt == DataType::kComplex64 || dt == DataType::kComplex128)
    return Unsupported(what, ": complex tensors are not supported");
  Dims dims(p.dims().begin(), p.dims().end());
  KILN_RETURN_IF_ERROR(checked_tensor_bytes(dt, dims, what, ErrorCode::kInvalidModel).status());
  const int64_t numel = dims_numel(dims);  // checked just above
  // Check the stored element count before allocating, so a lying header cannot force a huge allocation.
  int bits = dtype_packed_bits(dt);
  int64_t stored = -1;
  if (p.data_location() != onnx::TensorProto::EXTERNAL) {
    if (p.has_raw_data())
      stored = static_cast<int64_t>(p.raw_data().size()) * 8 / std::max(bits, 1);
    else if (dt == DataType::kFloat32)
      stored = p.float_data_size();
    else if (dt == DataType::kFloat64)
      stored = p.double_data_size();
    else if (dt == DataType::kInt64)
      stored = p.int64_data_size();
    else if (dt == DataType::kUInt32 || dt == DataType::kUInt64)
      stored = p.uint64_data_size();
    else if (dt == DataType::kString)
      stored = p.string_data_size();
    else
      stored = static_cast<int64_t>(p.int32_data_size()) * (bits < 8 ? 8 / bits : 1);
    if (stored + 8 < numel)
      return InvalidModel(what, ": holds data for ", stored, " elements but its dims ", dims_str(dims), " need ",
                          numel);
  }
  if (p.data_location() == onnx::TensorProto::EXTERNAL) {
    KILN_ASSIGN_OR_RETURN(ExternalRef ref, external_ref(p, what));
    if (ref.location == kDetachedLocation && detached) {
      std::string_view all = detached->bytes;
      if (ref.offset < 0 || ref.length < 0 || static_cast<uint64_t>(ref.offset) > all.size() ||
          static_cast<uint64_t>(ref.length) > all.size() - static_cast<uint64_t>(ref.offset))
        return Internal(what, ": detached raw_data [", ref.offset, ", +", ref.length, ") is outside the model");
      std::string_view raw = all.substr(static_cast<size_t>(ref.offset), static_cast<size_t>(ref.length));
      if (dt == DataType::kString) return InvalidModel(what, ": string tensors cannot use raw_data");
      if (raw.size() != file_bytes(dt, numel))  // before allocating: the dims may lie
        return InvalidModel(what, ": raw_data holds ", raw.size(), " bytes but ", dtype_name(dt), dims_str(dims),
                            " needs ", file_bytes(dt, numel));
      Tensor t = Tensor::uninitialized(dt, dims);
      if (plain_bytes(t, raw.size())) {
        if (!raw.empty()) detached->copies.push_back({raw.data(), raw.size(), t.raw()});
        return t;
      }
      KILN_RETURN_IF_ERROR(fill_from_raw(raw, t, what));  // sub-byte types, and the size error
      return t;
    }
    return read_external(ref, base_dir, allow_outside, what, dt, dims);
  }
  if (p.has_raw_data() && dt != DataType::kString && p.raw_data().size() != file_bytes(dt, numel))
    return InvalidModel(what, ": raw_data holds ", p.raw_data().size(), " bytes but ", dtype_name(dt), dims_str(dims),
                        " needs ", file_bytes(dt, numel));
  Tensor t = Tensor::uninitialized(dt, dims);  // every path below writes each element or fails
  if (p.has_raw_data()) {
    KILN_RETURN_IF_ERROR(fill_from_raw(p.raw_data(), t, what));
    return t;
  }
  auto* bytes = static_cast<uint8_t*>(t.raw());
  switch (dt) {
    case DataType::kFloat32:
      KILN_RETURN_IF_ERROR(check_count(p.float_data(), numel, what, "float_data"));
      for (int64_t i = 0; i < numel; ++i) t.data<float>()[i] = p.float_data(static_cast<int>(i));
      break;
    case DataType::kFloat64:
      KILN_RETURN_IF_ERROR(check_count(p.double_data(), numel, what, "double_data"));
      for (int64_t i = 0; i < numel; ++i) t.data<double>()[i] = p.double_data(static_cast<int>(i));
      break;
    case DataType::kInt64:
      KILN_RETURN_IF_ERROR(check_count(p.int64_data(), numel, what, "int64_data"));
      for (int64_t i = 0; i < numel; ++i) t.data<int64_t>()[i] = p.int64_data(static_cast<int>(i));
      break;
    case DataType::kUInt32:
    case DataType::kUInt64:
      KILN_RETURN_IF_ERROR(check_count(p.uint64_data(), numel, what, "uint64_data"));
      for (int64_t i = 0; i < numel; ++i) {
        if (dt == DataType::kUInt32)
          t.data<uint32_t>()[i] = static_cast<uint32_t>(p.uint64_data(static_cast<int>(i)));
        else
          t.data<uint64_t>()[i] = p.uint64_data(static_cast<int>(i));
      }
      break;
    case DataType::kString:
      KILN_RETURN_IF_ERROR(check_count(p.string_data(), numel, what, "string_data"));
      for (int64_t i = 0; i < numel; ++i) t.strings()[i] = p.string_data(static_cast<int>(i));
      break;
    case DataType::kUInt4:
    case DataType::kInt4:
    case DataType::kFloat4E2M1:
    case DataType::kUInt2:
    case DataType::kInt2: {
      // int32_data holds the packed bytes, one byte per int32 value.
      size_t nb = packed_bytes(t);
      KILN_RETURN_IF_ERROR(check_count(p.int32_data(), static_cast<int64_t>(nb), what, "int32_data"));
      std::vector<uint8_t> packed(nb);
      for (size_t i = 0; i < nb; ++i) packed[i] = static_cast<uint8_t>(p.int32_data(static_cast<int>(i)));
      unpack_sub_byte(packed.data(), t);
      break;
    }
    default: {  // int32_data carries int32, int16, int8, uint16, uint8, bool, float16, bfloat16, float8
      KILN_RETURN_IF_ERROR(check_count(p.int32_data(), numel, what, "int32_data"));
      size_t es = dtype_size(dt);
      for (int64_t i = 0; i < numel; ++i) {
        int32_t v = p.int32_data(static_cast<int>(i));
        if (dt == DataType::kInt32 || dt == DataType::kInt16 || dt == DataType::kInt8 || dt == DataType::kUInt16 ||
            dt == DataType::kUInt8 || dt == DataType::kBool) {
          t.set_i64(i, v);
        } else {
          std::memcpy(bytes + i * es, &v, es);  // raw bit pattern, little-endian
        }
      }
    }
  }
  return t;
}
}  // namespace

Result<Tensor> tensor_from_proto(const onnx::TensorProto& p, const std::string& base_dir, bool allow_outside) {
  return convert_tensor(p, base_dir, allow_outside, nullptr);
}

namespace {
std::atomic<bool> g_allow_outside{false};
}
bool allow_external_data_outside_default() { return g_allow_outside.load(std::memory_order_relaxed); }
void set_allow_external_data_outside_default(bool allow) { g_allow_outside.store(allow, std::memory_order_relaxed); }

void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* p) {
  p->set_name(name);
  p->set_data_type(static_cast<int32_t>(t.dtype()));
  for (int64_t d : t.shape()) p->add_dims(d);
  if (t.dtype() == DataType::kString) {
    for (int64_t i = 0; i < t.numel(); ++i) p->add_string_data(t.strings()[i]);
    return;
  }
  int bits = dtype_packed_bits(t.dtype());
  if (bits < 8) {
    std::string packed((t.numel() * bits + 7) / 8, '\0');
    int per_byte = 8 / bits;
    uint8_t mask = static_cast<uint8_t>((1u << bits) - 1);
    const auto* src = static_cast<const uint8_t*>(t.raw());
    for (int64_t i = 0; i < t.numel(); ++i)
      packed[static_cast<size_t>(i / per_byte)] |= static_cast<char>((src[i] & mask) << ((i % per_byte) * bits));
    p->set_raw_data(packed);
    return;
  }
  p->set_raw_data(std::string(static_cast<const char*>(t.raw()), t.nbytes()));
}

namespace {
Result<ir::Model> parse_model_impl(std::string_view bytes, const std::string& base_dir, const ImportOptions& opts) {
  onnx::ModelProto mp;
  // Large raw_data fields become references into `bytes` (see raw_data_split.h): protobuf does not
  // copy them, the importer copies them once, into the tensors.
  std::optional<std::string> detached = detach_raw_data(bytes);
  const std::string_view wire = detached ? std::string_view(*detached) : bytes;
  if (!parse_message(wire, &mp)) {
    // Tell nesting from corruption: a model that parses with a 10x deeper (still stack-safe) limit is
    // well formed but nests its subgraphs deeper than kiln accepts.
    // Deeper than that the depth is measured without parsing (onnx_nesting_depth), so that a deep model
    // is never mistaken for a corrupt one.
    const std::string nested = str_cat("the model nests messages deeper than ", kProtoRecursionLimit,
                                       " protobuf levels (subgraphs inside subgraphs, about 3 levels per "
                                       "If/Loop/Scan), the limit kiln accepts");
    onnx::ModelProto deeper;
    if (parse_message(wire, &deeper, 10 * kProtoRecursionLimit))
      return InvalidModel(nested, ": refused — flatten the control flow");
    std::optional<int> depth = onnx_nesting_depth(wire);
    if (depth && *depth > kProtoRecursionLimit)
      return InvalidModel(nested, " (", *depth, " levels): refused — flatten the control flow");
    return InvalidModel("not a valid ONNX model: the protobuf could not be parsed (truncated or corrupted file)");
  }
  if (!mp.has_graph()) return InvalidModel("the ONNX model has no graph");
  if (mp.ir_version() < kMinIrVersion || mp.ir_version() > kMaxIrVersion)
    return Unsupported("the model's IR version ", mp.ir_version(), " is outside what kiln reads (", kMinIrVersion, "-",
                       kMaxIrVersion, ")");
  ir::Model m;
  m.ir_version = mp.ir_version();
  m.producer_name = mp.producer_name();
  m.producer_version = mp.producer_version();
  m.domain = mp.domain();
  m.model_version = mp.model_version();
  m.doc_string = mp.doc_string();
  for (const auto& op : mp.opset_import()) {
    std::string d = op.domain() == "ai.onnx" ? "" : op.domain();
    if (op.version() < 1 || op.version() > 1000)
      return InvalidModel("opset_import for domain '", op.domain(), "' has invalid version ", op.version());
    m.opset_imports[d] = static_cast<int>(op.version());
  }
  if (mp.opset_import_size() == 0) m.opset_imports[""] = 1;  // IR 2 files: opset 1 implied
  if (m.opset_imports.count("") && m.opset_imports[""] > kMaxDefaultOpset)
    return Unsupported("the model uses default-domain opset ", m.opset_imports[""], "; kiln supports opsets 1-",
                       kMaxDefaultOpset, " — re-export with opset ", kMaxDefaultOpset, " or lower");
  if (mp.functions_size() > 0) {
    // Model-local functions are reported as unsupported ops when used (check_supported).
  }
  Importer imp;
  imp.base_dir = base_dir;
  imp.allow_outside = opts.allow_external_data_outside;
  imp.resolver = opts.external_resolver;
  if (detached) imp.detached.bytes = bytes;
  imp.opsets = m.opset_imports;
  m.graph = std::make_shared<ir::Graph>();
  KILN_RETURN_IF_ERROR(imp.convert_graph(mp.graph(), *m.graph, nullptr));
  imp.detached.run_copies();  // the weights' bytes, before anything reads them
  fix_parents(*m.graph, nullptr);
  KILN_RETURN_IF_ERROR(sort_all(*m.graph));
  if (opts.infer_shapes) KILN_RETURN_IF_ERROR(ops::infer_shapes(*m.graph));
  return m;
}
}  // namespace

Result<ir::Model> parse_model(std::string_view bytes, const std::string& base_dir, const ImportOptions& opts) {
  try {
    return parse_model_impl(bytes, base_dir, opts);
  } catch (const std::bad_alloc&) {
    return InvalidModel("the model needs more memory than is available (a tensor with huge dims?)");
  } catch (const std::exception& e) {
    return Internal("import failed: ", e.what());
  }
}

Result<ir::Model> load_model(const std::string& path, const ImportOptions& opts) {
  KILN_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  auto m = parse_model(file->view(), dir, opts);
  if (!m.ok()) return m.status().with_context("'" + path + "': ");
  m.value().path = path;
  return m;
}

namespace {
Result<ops::Value> value_from_sequence(const onnx::SequenceProto& sp, const std::string& base_dir, bool allow_outside) {
  std::vector<Tensor> items;
  DataType elem = DataType::kUndefined;
  if (sp.elem_type() != onnx::SequenceProto::TENSOR && sp.elem_type() != onnx::SequenceProto::UNDEFINED)
    return Unsupported("sequence '", sp.name(), "': only sequences of tensors are supported");
  for (const auto& tp : sp.tensor_values()) {
    KILN_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(tp, base_dir, allow_outside));
    elem = t.dtype();
    items.push_back(std::move(t));
  }
  return ops::Value::make_sequence(std::move(items), elem);
}
}  // namespace

namespace {
Result<ops::Value> read_value_pb_impl(const std::string& path, const ir::TypeInfo* expected,
                                      const ImportOptions& opts) {
  const bool allow = opts.allow_external_data_outside;
  KILN_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  std::string_view bytes = file->view();
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  using K = ir::TypeInfo::Kind;
  K kind = expected ? expected->kind : K::kTensor;
  if (kind == K::kSequence) {
    onnx::SequenceProto sp;
    if (!parse_message(bytes, &sp)) return InvalidArgument("'", path, "' is not a valid SequenceProto");
    auto v = value_from_sequence(sp, dir, allow);
    if (v.ok() && v.value().sequence_elem == DataType::kUndefined && expected->inner)
      v.value().sequence_elem = expected->inner->elem;
    return v;
  }
  if (kind == K::kOptional) {
    onnx::OptionalProto op;
    if (!parse_message(bytes, &op)) return InvalidArgument("'", path, "' is not a valid OptionalProto");
    if (op.has_tensor_value()) {
      KILN_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(op.tensor_value(), dir, allow));
      return ops::Value(std::move(t));
    }
    if (op.has_sequence_value()) return value_from_sequence(op.sequence_value(), dir, allow);
    return ops::Value::none();
  }
  onnx::TensorProto tp;
  if (!parse_message(bytes, &tp)) return InvalidArgument("'", path, "' is not a valid TensorProto");
  KILN_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(tp, dir, allow));
  return ops::Value(std::move(t));
}
}  // namespace

Result<ops::Value> read_value_pb(const std::string& path, const ir::TypeInfo* expected, const ImportOptions& opts) {
  try {
    return read_value_pb_impl(path, expected, opts);
  } catch (const std::bad_alloc&) {
    return InvalidArgument("'", path, "': not enough memory to read it");
  } catch (const std::exception& e) {
    return Internal("reading '", path, "' failed: ", e.what());
  }
}

Status write_tensor_pb(const std::string& path, const Tensor& t, const std::string& name) {
  onnx::TensorProto tp;
  tensor_to_proto(t, name, &tp);
  std::ofstream f(path, std::ios::binary);
  if (!f || !tp.SerializeToOstream(&f)) return IOError("cannot write '", path, "'");
  return Status::Ok();
}

}  // namespace kiln::onnx_import
