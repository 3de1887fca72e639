#include "plugin/custom_ops.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>

#include "backends/registry.h"
#include "core/parallel.h"
#include "plugin/host_api.h"

namespace kiln::plugin {

namespace {

class PluginTactic;

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<CustomOp>> ops;
  std::vector<std::unique_ptr<PluginTactic>> tactics;
  std::map<std::string, Provider> providers;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: tactics and schemas point into it
  return *r;
}

// Calls a callback, turning an exception into its failure message.
template <typename F>
std::string guarded_call(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return std::string("threw an exception: ") + e.what();
  } catch (...) {
    return "threw an unknown exception";
  }
}

std::string op_key(const std::string& domain, const std::string& op_type) {
  return ops::canonical_domain(domain) + "::" + op_type;
}

std::string opsets_str(const CustomOpDesc& d) {
  return d.until_opset > 0 ? std::to_string(d.since_opset) + "-" + std::to_string(d.until_opset)
                           : std::to_string(d.since_opset) + " and later";
}

// Infers node outputs into `s` and checks every used output got a type.
Status call_infer(const CustomOp& op, const ir::Node& n, const void* state, kiln_shape_ctx& s) {
  std::string err = guarded_call([&] { return op.desc.infer(state, &s); });
  if (!err.empty()) return InvalidModel(n.where(), op.who(), " shape inference failed: ", err);
  for (size_t o = 0; o < s.outputs.size(); ++o)
    if (n.has_output(o) && !s.outputs[o].set)
      return InvalidModel(n.where(), op.who(), ": its infer callback did not set the type of output ", o);
  return Status::Ok();
}

Status opset_error(const ir::Node& n) {
  if (const CustomOp* any = find_custom_op_any(n.domain, n.op_type))
    return Unsupported(n.where(), any->who(), " implements opsets ", opsets_str(any->desc), "; this node has opset ",
                       n.opset, " — load a plugin version that implements it");
  return Internal(n.where(), "no custom op registered for it");
}

Status custom_infer(ops::InferContext& ctx) {
  const CustomOp* op = find_custom_op(ctx.node.domain, ctx.node.op_type, ctx.node.opset);
  if (!op) return opset_error(ctx.node);
  KILN_ASSIGN_OR_RETURN(CustomOpDesc::State state, state_for(*op, ctx.node));
  kiln_shape_ctx s = kiln_shape_ctx::from_infer(ctx);
  KILN_RETURN_IF_ERROR(call_infer(*op, ctx.node, state.get(), s));
  for (size_t o = 0; o < s.outputs.size(); ++o)
    if (s.outputs[o].set) ctx.set_output(o, output_type(s, o).value());
  return Status::Ok();
}

Status custom_reference(ops::KernelContext& ctx) {
  const CustomOp* op = find_custom_op(ctx.node.domain, ctx.node.op_type, ctx.node.opset);
  if (!op) return opset_error(ctx.node);
  std::vector<const Tensor*> inputs(ctx.num_inputs(), nullptr);
  for (size_t i = 0; i < ctx.num_inputs(); ++i)
    if (ctx.has_input(i)) inputs[i] = &ctx.input(i);
  std::vector<Tensor> outputs;
  KILN_RETURN_IF_ERROR(run_reference(*op, ctx.node, inputs, outputs));
  for (size_t o = 0; o < outputs.size(); ++o) ctx.set_output(o, std::move(outputs[o]));
  return Status::Ok();
}

// Builds the C views of a kernel call and runs it. `inputs`/`outputs` as the runtime gives them.
Status call_kernel(const CustomOp& op, const CustomKernelDesc& k, const std::string& where, const void* state,
                   const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs, void* workspace,
                   size_t workspace_bytes, int threads, int device_index, void* stream) {
  // Small calls stay on the stack: a steady-state run allocates nothing.
  constexpr size_t kStack = 16;
  kiln_tensor in_stack[kStack], out_stack[kStack];
  std::vector<kiln_tensor> in_heap, out_heap;
  kiln_tensor* in = in_stack;
  kiln_tensor* out = out_stack;
  if (inputs.size() > kStack) in_heap.resize(inputs.size()), in = in_heap.data();
  if (outputs.size() > kStack) out_heap.resize(outputs.size()), out = out_heap.data();
  for (size_t i = 0; i < inputs.size(); ++i) in[i] = inputs[i] ? tensor_view(*inputs[i]) : kiln_tensor{};
  for (size_t o = 0; o < outputs.size(); ++o) out[o] = outputs[o] ? tensor_view(*outputs[o]) : kiln_tensor{};
  kiln_kernel_io io{};
  io.struct_size = sizeof io;
  io.num_inputs = static_cast<int32_t>(inputs.size());
  io.inputs = in;
  io.num_outputs = static_cast<int32_t>(outputs.size());
  io.outputs = out;
  io.workspace = workspace;
  io.workspace_bytes = workspace_bytes;
  io.threads = threads;
  io.device_index = device_index;
  io.stream = stream;
  std::string err = guarded_call([&] { return k.compute(state, io); });
  if (!err.empty()) return InvalidArgument(where, op.who(), ": kernel '", k.name, "' failed: ", err);
  return Status::Ok();
}

class PreparedPluginLayer : public backends::PreparedLayer {
 public:
  PreparedPluginLayer(const CustomOp* op, const CustomKernelDesc* k, CustomOpDesc::State state, kiln_shape_ctx shapes,
                      std::vector<Dims> out_shapes, std::vector<DataType> out_dtypes, std::string where)
      : op_(op),
        k_(k),
        state_(std::move(state)),
        shapes_(std::move(shapes)),
        out_shapes_(std::move(out_shapes)),
        out_dtypes_(std::move(out_dtypes)),
        where_(std::move(where)) {}
  std::vector<Dims> output_shapes() const override { return out_shapes_; }
  std::vector<DataType> output_dtypes() const override { return out_dtypes_; }
  size_t workspace_bytes(int threads) const override {
    if (!k_->workspace_size) return 0;
    try {
      return k_->workspace_size(state_.get(), &shapes_, threads);
    } catch (...) {
      return 0;
    }
  }
  Status run(const backends::RunContext& ctx, const std::vector<const Tensor*>& inputs,
             const std::vector<Tensor*>& outputs) const override {
    return call_kernel(*op_, *k_, where_, state_.get(), inputs, outputs, ctx.workspace, ctx.workspace_bytes,
                       ctx.threads, ctx.device.index, ctx.stream);
  }

 private:
  const CustomOp* op_;
  const CustomKernelDesc* k_;
  CustomOpDesc::State state_;
  kiln_shape_ctx shapes_;
  std::vector<Dims> out_shapes_;
  std::vector<DataType> out_dtypes_;
  std::string where_;  // "": the executor names the layer
};

class PluginTactic : public backends::Tactic {
 public:
  PluginTactic(const CustomOp* op, size_t k) : op_(op), k_(k) {}
  const CustomKernelDesc& kernel() const { return op_->desc.kernels[k_]; }
  std::string name() const override { return kernel().name; }
  backends::TacticInfo info() const override {
    backends::TacticInfo i = backends::TacticInfo::cpu_any_dtype();
    i.device = kernel().device == KILN_DEVICE_CUDA ? DeviceKind::kCUDA : DeviceKind::kCPU;
    return i;
  }
  std::vector<std::pair<std::string, std::string>> ops() const override {
    return {{op_->desc.domain, op_->desc.op_type}};
  }
  std::string why_unsupported(const backends::LayerSignature& sig) const override {
    if (!op_->covers(sig.node->opset))
      return "implements opsets " + opsets_str(op_->desc) + "; the layer has opset " + std::to_string(sig.node->opset);
    if (!kernel().why_unsupported) return "";
    auto state = state_for(*op_, *sig.node);
    if (!state.ok()) return state.status().message();
    kiln_shape_ctx s = kiln_shape_ctx::from_signature(sig);
    return guarded_call([&] { return kernel().why_unsupported(state.value().get(), &s); });
  }
  Result<std::unique_ptr<backends::PreparedLayer>> prepare(const backends::LayerSignature& sig) const override {
    const ir::Node& n = *sig.node;
    KILN_ASSIGN_OR_RETURN(CustomOpDesc::State state, state_for(*op_, n));
    kiln_shape_ctx s = kiln_shape_ctx::from_signature(sig);
    s.writable = true;
    KILN_RETURN_IF_ERROR(call_infer(*op_, n, state.get(), s));
    std::vector<Dims> shapes;
    std::vector<DataType> dtypes;
    for (size_t o = 0; o < s.outputs.size(); ++o) {
      if (!s.outputs[o].set) {  // an unused optional output: an empty tensor
        shapes.push_back({0});
        dtypes.push_back(DataType::kFloat32);
        continue;
      }
      auto dims = output_dims(s, o);
      if (!dims.ok()) return dims.status().with_context(n.where() + op_->who() + ": ");
      shapes.push_back(std::move(dims).value());
      dtypes.push_back(static_cast<DataType>(s.outputs[o].dtype));
    }
    s.writable = false;
    return std::unique_ptr<backends::PreparedLayer>(std::make_unique<PreparedPluginLayer>(
        op_, &kernel(), std::move(state), std::move(s), std::move(shapes), std::move(dtypes), std::string()));
  }
  int revision() const override { return kernel().revision; }

 private:
  const CustomOp* op_;
  size_t k_;
};

}  // namespace

std::string CustomOp::who() const {
  return "plugin '" + desc.plugin + "' " + desc.plugin_version + " (" + name() + ")";
}

const CustomOp* find_custom_op(const std::string& domain, const std::string& op_type, int opset) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::string d = ops::canonical_domain(domain);
  for (const auto& op : r.ops)
    if (op->desc.op_type == op_type && op->desc.domain == d && op->covers(opset)) return op.get();
  return nullptr;
}

const CustomOp* find_custom_op_any(const std::string& domain, const std::string& op_type) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::string d = ops::canonical_domain(domain);
  for (const auto& op : r.ops)
    if (op->desc.op_type == op_type && op->desc.domain == d) return op.get();
  return nullptr;
}

Result<CustomOpDesc::State> state_for(const CustomOp& op, const ir::Node& n) {
  CustomOpDesc::State state;
  std::string err;
  const ir::Attribute* stored = n.attr(kStateAttr);
  if (stored && stored->type == ir::Attribute::Type::kString && op.desc.deserialize_state) {
    err = guarded_call([&] { return op.desc.deserialize_state(stored->s, &state); });
    if (!err.empty())
      return InvalidModel(n.where(), op.who(), " cannot read the state stored in the engine: ", err,
                          " — rebuild the engine with this plugin version");
  } else if (op.desc.create_state) {
    kiln_attrs attrs{&n};
    err = guarded_call([&] { return op.desc.create_state(&attrs, &state); });
    if (!err.empty()) return InvalidModel(n.where(), op.who(), " rejected the node's attributes: ", err);
  }
  return state;
}

Status run_reference(const CustomOp& op, const ir::Node& n, const std::vector<const Tensor*>& inputs,
                     std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(CustomOpDesc::State state, state_for(op, n));
  kiln_shape_ctx s = kiln_shape_ctx::from_tensors(inputs, n.outputs.size());
  KILN_RETURN_IF_ERROR(call_infer(op, n, state.get(), s));
  s.writable = false;
  const CustomKernelDesc* chosen = nullptr;
  std::string declined;
  for (const auto& k : op.desc.kernels) {
    if (k.device != KILN_DEVICE_CPU) continue;
    std::string why = k.why_unsupported ? guarded_call([&] { return k.why_unsupported(state.get(), &s); }) : "";
    if (why.empty()) {
      chosen = &k;
      break;
    }
    declined += "\n  - " + k.name + ": " + why;
  }
  if (!chosen)
    return Unsupported(n.where(), op.who(),
                       ": no CPU kernel takes these inputs (the reference interpreter runs one):", declined);
  outputs.clear();
  std::vector<Tensor*> out_ptrs;
  for (size_t o = 0; o < s.outputs.size(); ++o) {
    if (!s.outputs[o].set) {
      outputs.emplace_back();
      continue;
    }
    auto dims = output_dims(s, o);
    if (!dims.ok()) return dims.status().with_context(n.where() + op.who() + ": ");
    outputs.emplace_back(static_cast<DataType>(s.outputs[o].dtype), std::move(dims).value());
  }
  for (auto& t : outputs) out_ptrs.push_back(t.defined() ? &t : nullptr);
  int threads = std::max(1, kiln::max_threads());
  size_t ws = 0;
  if (chosen->workspace_size) {
    std::string err = guarded_call([&] {
      ws = chosen->workspace_size(state.get(), &s, threads);
      return std::string();
    });
    if (!err.empty()) return InvalidArgument(n.where(), op.who(), ": workspace_size of '", chosen->name, "' ", err);
  }
  std::unique_ptr<uint8_t, void (*)(uint8_t*)> workspace(
      nullptr, [](uint8_t* p) { ::operator delete[](p, std::align_val_t(64)); });
  if (ws) {
    workspace.reset(static_cast<uint8_t*>(::operator new[](backends::workspace_piece(ws), std::align_val_t(64))));
    backends::poison_workspace(workspace.get(), ws);
  }
  return call_kernel(op, *chosen, n.where(), state.get(), inputs, out_ptrs, workspace.get(), ws, threads, 0, nullptr);
}

Status check_registrable(const CustomOpDesc& d) {
  std::string what = "custom op '" + op_key(d.domain, d.op_type) + "' of plugin '" + d.plugin + "'";
  if (d.plugin.empty()) return InvalidArgument(what, ": the provider's name is empty");
  if (d.op_type.empty()) return InvalidArgument(what, ": the op type is empty");
  if (d.domain == "kiln" || d.domain.rfind("kiln.", 0) == 0)
    return InvalidArgument(what, ": the domain '", d.domain, "' is kiln's own (its fused ops); use a domain of yours");
  if (d.since_opset < 1 || (d.until_opset > 0 && d.until_opset < d.since_opset))
    return InvalidArgument(what, ": opset range ", d.since_opset, "-", d.until_opset, " is empty or starts below 1");
  if (d.max_inputs >= 0 && d.max_inputs < d.min_inputs)
    return InvalidArgument(what, ": max_inputs ", d.max_inputs, " < min_inputs ", d.min_inputs);
  if (!d.infer) return InvalidArgument(what, ": infer (shape and type inference) is required and missing");
  if (static_cast<bool>(d.serialize_state) != static_cast<bool>(d.deserialize_state))
    return InvalidArgument(what, ": serialize_state and deserialize_state come together (one is missing)");
  std::string d_canon = ops::canonical_domain(d.domain);
  if (const CustomOp* other = find_custom_op_any(d_canon, d.op_type)) {
    const CustomOpDesc& o = other->desc;
    bool overlap = (o.until_opset <= 0 || d.since_opset <= o.until_opset) &&
                   (d.until_opset <= 0 || o.since_opset <= d.until_opset);
    if (overlap) return InvalidArgument(what, ": ", other->who(), " registered it already for opsets ", opsets_str(o));
  } else if (ops::OpRegistry::get().knows(d_canon, d.op_type)) {
    return InvalidArgument(what, ": kiln has this op built in; a plugin cannot replace it (use a domain of its own)");
  }
  if (d.kernels.empty()) return InvalidArgument(what, ": it has no kernels");
  bool cpu = false;
  std::set<std::string> names;
  for (const auto& k : d.kernels) {
    if (k.name.empty()) return InvalidArgument(what, ": a kernel has no name");
    if (!k.compute) return InvalidArgument(what, ": kernel '", k.name, "' has no compute function");
    if (k.device != KILN_DEVICE_CPU && k.device != KILN_DEVICE_CUDA)
      return InvalidArgument(what, ": kernel '", k.name, "' has unknown device ", k.device);
    if (!names.insert(k.name).second) return InvalidArgument(what, ": two kernels are named '", k.name, "'");
    if (backends::find_tactic(k.name))
      return InvalidArgument(what, ": kernel name '", k.name, "' is a tactic kiln has already");
    cpu |= k.device == KILN_DEVICE_CPU;
  }
  if (!cpu) return InvalidArgument(what, ": it needs a CPU kernel (the reference interpreter runs it)");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (auto p = r.providers.find(d.plugin);
      p != r.providers.end() && (p->second.version != d.plugin_version || p->second.origin != d.origin))
    return InvalidArgument(what, ": another plugin named '", d.plugin, "' (", p->second.version, ", from ",
                           p->second.origin, ") is loaded already");
  return Status::Ok();
}

Status register_op(CustomOpDesc desc) {
  KILN_RETURN_IF_ERROR(check_registrable(desc));
  desc.domain = ops::canonical_domain(desc.domain);
  auto op = std::make_unique<CustomOp>();
  op->desc = std::move(desc);
  const CustomOp* p = op.get();
  ops::OpRegistry::get().add({p->desc.domain, p->desc.op_type, p->desc.since_opset, custom_infer, custom_reference,
                              p->desc.min_inputs, p->desc.max_inputs});
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Provider& prov = r.providers[p->desc.plugin];
  prov.name = p->desc.plugin, prov.version = p->desc.plugin_version, prov.origin = p->desc.origin;
  prov.slow |= p->desc.slow;
  prov.ops.push_back(p->name());
  for (size_t k = 0; k < p->desc.kernels.size(); ++k) {
    r.tactics.push_back(std::make_unique<PluginTactic>(p, k));
    backends::add_tactic(r.tactics.back().get());
    prov.kernels.push_back(p->desc.kernels[k].name);
  }
  r.ops.push_back(std::move(op));
  return Status::Ok();
}

std::vector<Provider> providers() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<Provider> out;
  for (const auto& [name, p] : r.providers) out.push_back(p);
  return out;
}

const Provider* find_provider(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.providers.find(name);
  return it == r.providers.end() ? nullptr : &it->second;
}

PluginInfo info_of(const Provider& p) { return {p.name, p.version, p.origin, p.ops, p.kernels}; }

namespace {
void collect_plugin_nodes(ir::Graph& g, const std::string& prefix, std::map<std::string, nlohmann::json>& records,
                          Status& status) {
  for (auto& n : g.nodes) {
    if (const CustomOp* op = find_custom_op(n.domain, n.op_type, n.opset)) {
      nlohmann::json& rec = records[op->desc.plugin];
      if (rec.is_null())
        rec = {{"name", op->desc.plugin}, {"version", op->desc.plugin_version}, {"origin", op->desc.origin},
               {"slow", op->desc.slow},   {"ops", nlohmann::json::array()},     {"layers", nlohmann::json::array()}};
      if (std::find(rec["ops"].begin(), rec["ops"].end(), op->name()) == rec["ops"].end())
        rec["ops"].push_back(op->name());
      rec["layers"].push_back(prefix + n.name);
      if (op->desc.serialize_state && status.ok()) {
        n.attrs.erase(kStateAttr);
        auto state = state_for(*op, n);
        if (!state.ok()) {
          status = state.status();
          continue;
        }
        std::string bytes;
        std::string err = guarded_call([&] { return op->desc.serialize_state(state.value().get(), &bytes); });
        if (!err.empty()) {
          status = InvalidModel(n.where(), op->who(), " could not serialize its state: ", err);
          continue;
        }
        ir::Attribute a;
        a.type = ir::Attribute::Type::kString;
        a.s = std::move(bytes);
        n.attrs[kStateAttr] = std::move(a);
      }
    }
    for (auto& [k, a] : n.attrs) {
      if (a.g) collect_plugin_nodes(*a.g, prefix + n.name + "/" + k + "/", records, status);
      for (auto& sg : a.graphs) collect_plugin_nodes(*sg, prefix + n.name + "/" + k + "/", records, status);
    }
  }
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string major_of(const std::string& version) { return version.substr(0, version.find('.')); }
}  // namespace

Result<nlohmann::json> record_plugins(ir::Graph& g) {
  std::map<std::string, nlohmann::json> records;
  Status status;
  collect_plugin_nodes(g, "", records, status);
  KILN_RETURN_IF_ERROR(status);
  nlohmann::json out = nlohmann::json::array();
  for (auto& [name, rec] : records) out.push_back(std::move(rec));
  return out;
}

std::string how_to_load(const std::string& path_hint) {
  if (path_hint == kPythonOrigin)
    return "it is a Python custom op: define it with @kiln.custom_op (import the Python module that does) in "
           "this process before building or loading the engine (the kiln CLI cannot run Python ops; see "
           "examples/plugins/python_ops.py)";
  std::string p = path_hint.empty() ? "PATH/libPLUGIN.so" : path_hint;
  return "load it with `kiln <command> --plugin " + p + "`, KILN_PLUGIN_PATH=" + p + ", kiln::load_plugin(\"" + p +
         "\") (C++) or kiln.load_plugin(\"" + p + "\") (Python); see examples/plugins/README.md";
}

Status check_engine_plugins(const nlohmann::json& records) {
  KILN_RETURN_IF_ERROR(load_env_plugins_once());
  if (!records.is_array()) return Status::Ok();
  for (const auto& rec : records) {
    std::string name = rec.at("name").get<std::string>(), version = rec.value("version", "");
    std::string origin = rec.value("origin", "");
    std::string layers, ops;
    for (const auto& l : rec.value("layers", nlohmann::json::array()))
      layers += (layers.empty() ? "'" : ", '") + l.get<std::string>() + "'";
    for (const auto& o : rec.value("ops", nlohmann::json::array()))
      ops += (ops.empty() ? "" : ", ") + o.get<std::string>();
    const Provider* p = find_provider(name);
    if (!p)
      return Unsupported("the engine needs plugin '", name, "' ", version, " (ops ", ops, "; layers ", layers,
                         "), which is not loaded — ", how_to_load(origin));
    // A provider's ops are registered one by one (Python's @kiln.custom_op): each must be there.
    for (const auto& o : rec.value("ops", nlohmann::json::array())) {
      std::string key = o.get<std::string>();
      size_t sep = key.rfind("::");
      if (sep == std::string::npos || find_custom_op_any(key.substr(0, sep), key.substr(sep + 2))) continue;
      return Unsupported("the engine needs custom op ", key, " of plugin '", name, "' ", version, " (layers ", layers,
                         "), which is not registered (plugin '", name, "' has ", (p->ops.empty() ? "none" : ""),
                         join_names(p->ops), ") — ", how_to_load(origin));
    }
    if (major_of(p->version) != major_of(version))
      return Unsupported("the engine was built with plugin '", name, "' ", version, "; the loaded one (", p->origin,
                         ") is version ", p->version,
                         ", another major version (its ops or stored state may differ) — load version ",
                         major_of(version), ".x of the plugin, or rebuild the engine with this one (kiln build)");
  }
  return Status::Ok();
}

}  // namespace kiln::plugin
