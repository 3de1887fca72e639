#include "onnx/exporter.h"

#include <fstream>

#include "onnx/importer.h"
#include "onnx/onnx.pb.h"

namespace kiln::onnx_import {

namespace {

void type_to_proto(const ir::TypeInfo& t, onnx::TypeProto* p) {
  using K = ir::TypeInfo::Kind;
  switch (t.kind) {
    case K::kTensor: {
      auto* tt = p->mutable_tensor_type();
      tt->set_elem_type(static_cast<int32_t>(t.elem));
      if (t.shape.rank_known) {
        auto* s = tt->mutable_shape();
        for (const Dim& d : t.shape.dims) {
          auto* dp = s->add_dim();
          if (d.known())
            dp->set_dim_value(d.value);
          else if (!d.param.empty())
            dp->set_dim_param(d.param);
        }
      }
      break;
    }
    case K::kSequence:
      if (t.inner) type_to_proto(*t.inner, p->mutable_sequence_type()->mutable_elem_type());
      break;
    case K::kOptional:
      if (t.inner) type_to_proto(*t.inner, p->mutable_optional_type()->mutable_elem_type());
      break;
    default: break;
  }
}

struct Exporter {
  const ExportOptions& opts;

  void tensor(const Tensor& t, const std::string& name, onnx::TensorProto* p) {
    size_t bytes = t.dtype() == DataType::kString ? 0 : t.nbytes();
    if (opts.store_external && bytes >= opts.external_min_bytes && dtype_packed_bits(t.dtype()) >= 8) {
      auto [off, len] = opts.store_external(t);
      p->set_name(name);
      p->set_data_type(static_cast<int32_t>(t.dtype()));
      for (int64_t d : t.shape()) p->add_dims(d);
      p->set_data_location(onnx::TensorProto::EXTERNAL);
      auto kv = [&](const char* k, const std::string& v) {
        auto* e = p->add_external_data();
        e->set_key(k);
        e->set_value(v);
      };
      kv("location", opts.external_location);
      kv("offset", std::to_string(off));
      kv("length", std::to_string(len));
      return;
    }
    tensor_to_proto(t, name, p);
  }

  void graph(const ir::Graph& g, onnx::GraphProto* p) {
    p->set_name(g.name);
    for (const auto& [name, t] : g.initializers) tensor(t, name, p->add_initializer());
    for (const auto& in : g.inputs) {
      auto* vi = p->add_input();
      vi->set_name(in.name);
      type_to_proto(in.type, vi->mutable_type());
    }
    for (const auto& out : g.outputs) {
      auto* vi = p->add_output();
      vi->set_name(out.name);
      type_to_proto(out.type, vi->mutable_type());
    }
    for (const auto& [name, t] : g.value_types) {
      if (t.kind == ir::TypeInfo::Kind::kUnknown) continue;
      auto* vi = p->add_value_info();
      vi->set_name(name);
      type_to_proto(t, vi->mutable_type());
    }
    for (const auto& n : g.nodes) node(n, p->add_node());
  }

  void node(const ir::Node& n, onnx::NodeProto* p) {
    p->set_name(n.name);
    p->set_op_type(n.op_type);
    p->set_domain(n.domain);
    for (const auto& i : n.inputs) p->add_input(i);
    for (const auto& o : n.outputs) p->add_output(o);
    for (const auto& [name, a] : n.attrs) {
      auto* ap = p->add_attribute();
      ap->set_name(name);
      using T = ir::Attribute::Type;
      switch (a.type) {
        case T::kFloat:
          ap->set_type(onnx::AttributeProto::FLOAT);
          ap->set_f(a.f);
          break;
        case T::kInt:
          ap->set_type(onnx::AttributeProto::INT);
          ap->set_i(a.i);
          break;
        case T::kString:
          ap->set_type(onnx::AttributeProto::STRING);
          ap->set_s(a.s);
          break;
        case T::kTensor:
          ap->set_type(onnx::AttributeProto::TENSOR);
          tensor(a.t, "", ap->mutable_t());
          break;
        case T::kGraph:
          ap->set_type(onnx::AttributeProto::GRAPH);
          graph(*a.g, ap->mutable_g());
          break;
        case T::kFloats:
          ap->set_type(onnx::AttributeProto::FLOATS);
          for (float f : a.floats) ap->add_floats(f);
          break;
        case T::kInts:
          ap->set_type(onnx::AttributeProto::INTS);
          for (int64_t i : a.ints) ap->add_ints(i);
          break;
        case T::kStrings:
          ap->set_type(onnx::AttributeProto::STRINGS);
          for (const auto& s : a.strings) ap->add_strings(s);
          break;
        case T::kTensors:
          ap->set_type(onnx::AttributeProto::TENSORS);
          for (const auto& t : a.tensors) tensor(t, "", ap->add_tensors());
          break;
        case T::kGraphs:
          ap->set_type(onnx::AttributeProto::GRAPHS);
          for (const auto& sg : a.graphs) graph(*sg, ap->add_graphs());
          break;
        case T::kTypeProto:
          ap->set_type(onnx::AttributeProto::TYPE_PROTO);
          type_to_proto(a.type_proto, ap->mutable_tp());
          break;
        default: break;
      }
    }
  }
};

}  // namespace

Result<std::string> serialize_model(const ir::Model& m, const ExportOptions& opts) {
  onnx::ModelProto mp;
  mp.set_ir_version(m.ir_version ? m.ir_version : 8);
  mp.set_producer_name(m.producer_name);
  mp.set_producer_version(m.producer_version);
  mp.set_domain(m.domain);
  mp.set_model_version(m.model_version);
  mp.set_doc_string(m.doc_string);
  for (const auto& [d, v] : m.opset_imports) {
    auto* op = mp.add_opset_import();
    op->set_domain(d);
    op->set_version(v);
  }
  Exporter ex{opts};
  ex.graph(*m.graph, mp.mutable_graph());
  std::string out;
  if (!mp.SerializeToString(&out)) return Internal("could not serialize the model (over 2 GB?)");
  return out;
}

Status save_model(const ir::Model& m, const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, serialize_model(m));
  std::ofstream f(path, std::ios::binary);
  if (!f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()))) return IOError("cannot write '", path, "'");
  return Status::Ok();
}

}  // namespace kiln::onnx_import
