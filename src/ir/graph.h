// The IR: a Graph of Nodes connected by value names (ONNX's own convention: an empty input name
// is a missing optional input). Subgraphs (If/Loop/Scan bodies) hang off attributes and may read
// values of enclosing graphs by name.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/shape.h"
#include "core/status.h"
#include "core/tensor.h"

namespace kiln::ir {

class Graph;

// Static type of a value: a tensor, a sequence of tensors, an optional, or unknown.
struct TypeInfo {
  enum class Kind { kUnknown, kTensor, kSequence, kOptional, kMap };
  Kind kind = Kind::kUnknown;
  DataType elem = DataType::kUndefined;  // for kTensor
  SymShape shape;                        // for kTensor
  std::shared_ptr<TypeInfo> inner;       // element type of kSequence / kOptional, value of kMap
  DataType map_key = DataType::kUndefined;

  static TypeInfo tensor(DataType dt, SymShape s = SymShape()) {
    TypeInfo t;
    t.kind = Kind::kTensor;
    t.elem = dt;
    t.shape = std::move(s);
    return t;
  }
  static TypeInfo sequence(TypeInfo elem);
  static TypeInfo optional(TypeInfo elem);
  bool is_tensor() const { return kind == Kind::kTensor; }
  std::string str() const;  // "float32[1,3,?,?]", "seq(float32[?])", "optional(...)"
};

struct ValueInfo {
  std::string name;
  TypeInfo type;
};

struct Attribute {
  enum class Type {
    kUndefined,
    kFloat,
    kInt,
    kString,
    kTensor,
    kGraph,
    kFloats,
    kInts,
    kStrings,
    kTensors,
    kGraphs,
    kTypeProto
  };
  Type type = Type::kUndefined;
  float f = 0;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::shared_ptr<Graph> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<Graph>> graphs;
  TypeInfo type_proto;
};

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;                // "" for the default ONNX domain
  int opset = 0;                     // the model's opset for this node's domain
  std::vector<std::string> inputs;   // "" marks a missing optional input
  std::vector<std::string> outputs;  // "" marks an unused optional output
  std::map<std::string, Attribute> attrs;

  bool has_input(size_t i) const { return i < inputs.size() && !inputs[i].empty(); }
  bool has_output(size_t i) const { return i < outputs.size() && !outputs[i].empty(); }
  const Attribute* attr(const std::string& n) const {
    auto it = attrs.find(n);
    return it == attrs.end() ? nullptr : &it->second;
  }
  int64_t attr_int(const std::string& n, int64_t dflt) const;
  float attr_float(const std::string& n, float dflt) const;
  std::string attr_string(const std::string& n, const std::string& dflt) const;
  std::vector<int64_t> attr_ints(const std::string& n, std::vector<int64_t> dflt = {}) const;
  std::vector<float> attr_floats(const std::string& n, std::vector<float> dflt = {}) const;
  // "node 'conv_7' (Conv, opset 13): " — the prefix of every error about this node.
  std::string where() const;
};

class Graph {
 public:
  std::string name;
  std::vector<Node> nodes;
  std::vector<ValueInfo> inputs;
  std::vector<ValueInfo> outputs;
  std::map<std::string, Tensor> initializers;
  // Types known for any value (inputs, outputs, value_info, and whatever inference adds).
  std::unordered_map<std::string, TypeInfo> value_types;
  std::map<std::string, int> opset_imports;  // domain -> version ("" is ai.onnx)
  const Graph* parent = nullptr;             // enclosing graph, for subgraphs

  // Orders nodes so each comes after the producers of its inputs. Fails on a cycle or on a
  // name produced by no node, graph input, initializer or enclosing graph.
  Status topological_sort();
  // Names visible in this graph from its own inputs, initializers and node outputs.
  bool defines(const std::string& value) const;
  // Visible here or in any enclosing graph.
  bool visible(const std::string& value) const;
  // Names this graph reads from enclosing graphs (including through nested subgraphs).
  std::vector<std::string> outer_references() const;
};

// A loaded model: the main graph and what reports need.
struct Model {
  std::shared_ptr<Graph> graph;
  int64_t ir_version = 0;
  std::string producer_name, producer_version, domain;
  int64_t model_version = 0;
  std::string doc_string;
  std::map<std::string, int> opset_imports;
  std::string path;  // file it was loaded from, if any
};

}  // namespace kiln::ir
