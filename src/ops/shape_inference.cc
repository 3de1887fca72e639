#include "ops/shape_inference.h"

#include <optional>
#include <set>

#include "ops/interpreter.h"
#include "ops/registry.h"

namespace kiln::ops {

ir::TypeInfo type_of(const Tensor& t) { return ir::TypeInfo::tensor(t.dtype(), SymShape::from_dims(t.shape())); }

namespace {

// Ops whose outputs must not be folded: random, or with side information.
bool never_fold(const ir::Node& n) {
  static const std::set<std::string> kRandom = {
      "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"};
  if (kRandom.count(n.op_type)) return true;
  for (const auto& [k, a] : n.attrs)
    if (a.g || !a.graphs.empty()) return true;
  return false;
}

// Combines the inferred type with a declared one: inferred wins, declared fills unknown dims.
Status merge_types(const ir::Node& n, const std::string& value, ir::TypeInfo& inferred, const ir::TypeInfo& declared) {
  if (inferred.kind == ir::TypeInfo::Kind::kUnknown) {
    inferred = declared;
    return Status::Ok();
  }
  if (!inferred.is_tensor() || !declared.is_tensor()) return Status::Ok();
  if (inferred.elem != DataType::kUndefined && declared.elem != DataType::kUndefined && inferred.elem != declared.elem)
    return InvalidModel(n.where(), "output '", value, "' is inferred as ", inferred.str(), " but the model declares ",
                        declared.str());
  if (inferred.elem == DataType::kUndefined) inferred.elem = declared.elem;
  if (!inferred.shape.rank_known) {
    inferred.shape = declared.shape;
  } else if (declared.shape.rank_known && declared.shape.rank() == inferred.shape.rank()) {
    for (size_t i = 0; i < inferred.shape.rank(); ++i)
      if (!inferred.shape.dims[i].known() && (declared.shape.dims[i].known() || !declared.shape.dims[i].param.empty()))
        inferred.shape.dims[i] = declared.shape.dims[i];
  }
  return Status::Ok();
}

// The elements of a small integer constant as a symbolic value (nullopt for other constants).
std::optional<SymValue> value_of_constant(const Tensor& t) {
  if (!dtype_is_integer(t.dtype()) || t.rank() > 1 || t.numel() > 64) return std::nullopt;
  SymValue v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(SymInt::of(t.get_i64(i)));
  return v;
}

// A fully known symbolic value as a constant of the output's type (scalar or 1-D integer).
std::optional<Tensor> constant_of_value(const SymValue& v, const ir::TypeInfo& type) {
  if (!type.is_tensor() || !dtype_is_integer(type.elem) || !type.shape.rank_known || type.shape.rank() > 1)
    return std::nullopt;
  if (type.shape.rank() == 0 && v.size() != 1) return std::nullopt;
  for (const SymInt& x : v)
    if (!x.known) return std::nullopt;
  Tensor t(type.elem, type.shape.rank() == 0 ? Dims{} : Dims{static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.set_i64(static_cast<int64_t>(i), v[i].value);
  return t;
}

class GraphInferencer {
 public:
  GraphInferencer(const InferOptions& opts, int* counter) : opts_(opts), counter_(counter) {}

  Status run(ir::Graph& g, std::map<std::string, Tensor> outer_constants,
             std::map<std::string, Tensor>* constants_out = nullptr) {
    std::map<std::string, Tensor> constants = std::move(outer_constants);
    std::set<std::string> input_names;
    for (const auto& in : g.inputs) {
      input_names.insert(in.name);
      constants.erase(in.name);  // shadows an outer value
      g.value_types[in.name] = in.type;
    }
    for (const auto& [name, t] : g.initializers) {
      if (!input_names.count(name)) constants[name] = t;  // an input may override it: not constant
      if (!g.value_types.count(name) || !input_names.count(name)) g.value_types[name] = type_of(t);
    }
    std::map<std::string, ir::TypeInfo> declared;
    for (const auto& o : g.outputs) declared[o.name] = o.type;
    for (auto& [k, v] : g.value_types) declared.emplace(k, v);

    std::map<std::string, SymValue> values;  // symbolic values of integer tensors (shape sub-graphs)
    const OpRegistry& reg = OpRegistry::get();
    for (auto& n : g.nodes) {
      const OpSchema* s = reg.find(n.domain, n.op_type, n.opset);
      InferContext ctx(n);
      ctx.symbol_counter = counter_;
      std::vector<SymValue> const_values;
      const_values.reserve(n.inputs.size());  // ctx.input_values points into it
      for (const auto& in : n.inputs) {
        const ir::TypeInfo* t = nullptr;
        const Tensor* c = nullptr;
        if (!in.empty()) {
          t = lookup(g, in);
          auto it = constants.find(in);
          if (it != constants.end()) c = &it->second;
          if (!t) {
            static const ir::TypeInfo kUnknown;
            t = &kUnknown;
          }
        }
        ctx.inputs.push_back(t);
        ctx.constants.push_back(c);
        const SymValue* sv = nullptr;
        if (c) {
          if (auto v = value_of_constant(*c)) sv = &const_values.emplace_back(std::move(*v));
        } else if (!in.empty()) {
          auto it = values.find(in);
          if (it != values.end()) sv = &it->second;
        }
        ctx.input_values.push_back(sv);
      }
      ctx.outputs.resize(n.outputs.size());
      ctx.output_values.resize(n.outputs.size());
      ctx.infer_subgraph = [&](const ir::Graph& sg,
                               const std::vector<ir::TypeInfo>& in_types) -> Result<std::vector<ir::TypeInfo>> {
        auto& mg = const_cast<ir::Graph&>(sg);
        for (size_t i = 0; i < mg.inputs.size() && i < in_types.size(); ++i)
          if (in_types[i].kind != ir::TypeInfo::Kind::kUnknown) {
            ir::TypeInfo merged = in_types[i];
            KILN_RETURN_IF_ERROR(merge_types(n, mg.inputs[i].name, merged, mg.inputs[i].type));
            mg.inputs[i].type = merged;
          }
        GraphInferencer sub(opts_, counter_);
        KILN_RETURN_IF_ERROR(sub.run(mg, constants));
        std::vector<ir::TypeInfo> outs;
        for (const auto& o : mg.outputs) {
          auto it = mg.value_types.find(o.name);
          outs.push_back(it != mg.value_types.end() ? it->second : (lookup(mg, o.name) ? *lookup(mg, o.name) : o.type));
        }
        return outs;
      };
      if (s && s->infer) {
        Status st = s->infer(ctx);
        if (!st.ok()) {
          if (st.message().rfind("node '", 0) == 0) return st;
          return st.with_context(n.where());
        }
      }
      // Fold when every input is a known constant.
      bool all_const = s && opts_.fold_constants && !never_fold(n);
      for (size_t i = 0; i < n.inputs.size() && all_const; ++i)
        if (!n.inputs[i].empty() && !ctx.constants[i]) all_const = false;
      if (all_const) {
        std::vector<Value> in_vals;
        in_vals.reserve(n.inputs.size());
        for (size_t i = 0; i < n.inputs.size(); ++i)
          in_vals.push_back(ctx.constants[i] ? Value(*ctx.constants[i]) : Value());
        std::vector<const Value*> ptrs;
        for (size_t i = 0; i < n.inputs.size(); ++i) ptrs.push_back(n.inputs[i].empty() ? nullptr : &in_vals[i]);
        auto res = run_node(n, *s, ptrs, nullptr);
        // A node whose inputs are all known and whose kernel refuses them (Range with delta 0, OneHot
        // of depth 0) fails every run: the build says so now, with the kernel's message. Other
        // failures (unsupported, out of memory on a huge constant) only skip the fold.
        if (!res.ok() &&
            (res.status().code() == ErrorCode::kInvalidArgument || res.status().code() == ErrorCode::kInvalidModel))
          return res.status().message().rfind("node '", 0) == 0 ? res.status() : res.status().with_context(n.where());
        if (res.ok()) {
          for (size_t o = 0; o < n.outputs.size(); ++o) {
            if (!n.has_output(o) || !res.value()[o].is_tensor()) continue;
            const Tensor& t = res.value()[o].tensor;
            ctx.outputs[o] = type_of(t);
            if (t.numel() <= opts_.max_fold_elements) constants[n.outputs[o]] = t;
          }
        }
      }
      for (size_t o = 0; o < n.outputs.size(); ++o) {
        if (!n.has_output(o) || !ctx.output_values[o]) continue;
        values[n.outputs[o]] = *ctx.output_values[o];
        if (!constants.count(n.outputs[o]))
          if (auto t = constant_of_value(*ctx.output_values[o], ctx.outputs[o]))
            constants[n.outputs[o]] = std::move(*t);
      }
      for (size_t o = 0; o < n.outputs.size(); ++o) {
        if (!n.has_output(o)) continue;
        auto it = declared.find(n.outputs[o]);
        if (it != declared.end()) KILN_RETURN_IF_ERROR(merge_types(n, n.outputs[o], ctx.outputs[o], it->second));
        g.value_types[n.outputs[o]] = ctx.outputs[o];
      }
    }
    for (auto& o : g.outputs) {
      auto it = g.value_types.find(o.name);
      if (it != g.value_types.end()) o.type = it->second;
    }
    if (constants_out) *constants_out = std::move(constants);
    return Status::Ok();
  }

 private:
  static const ir::TypeInfo* lookup(const ir::Graph& g, const std::string& name) {
    for (const ir::Graph* p = &g; p; p = p->parent) {
      auto it = p->value_types.find(name);
      if (it != p->value_types.end()) return &it->second;
    }
    return nullptr;
  }
  const InferOptions& opts_;
  int* counter_;
};

}  // namespace

Status infer_shapes(ir::Graph& g, const InferOptions& opts) {
  int counter = 0;
  GraphInferencer inf(opts, &counter);
  return inf.run(g, {}, opts.constants_out);
}

}  // namespace kiln::ops
