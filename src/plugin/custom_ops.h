// Custom ops (kiln/custom_op.h) inside kiln: the registry of registered ops and their providers, the
// op schema every custom op gets (its infer and reference entries call the op's callbacks), the
// tactics its kernels become, and what an engine records about the plugins it uses.
//
// Registration adds, for each op, an OpSchema to ops::OpRegistry (so the importer, the passes and the
// interpreter treat it like a built-in op) and one backends::Tactic per kernel to the tactic registry
// (so the auto-tuner times them against each other). A node's state comes from its serialized state
// (kStateAttr, written by the builder when the op can serialize it) or from its attributes.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"
#include "kiln/custom_op.h"

namespace kiln::plugin {

// The origin (CustomOpDesc::origin) of ops registered by Python's @kiln.custom_op (python/src).
inline constexpr const char* kPythonOrigin = "python";

// Where the builder stores a node's serialized plugin state (a string attribute of the engine's graph).
inline constexpr const char* kStateAttr = "kiln.plugin_state";

struct CustomOp {
  CustomOpDesc desc;
  std::string name() const { return (desc.domain.empty() ? "ai.onnx" : desc.domain) + "::" + desc.op_type; }
  bool covers(int opset) const {
    return opset >= desc.since_opset && (desc.until_opset <= 0 || opset <= desc.until_opset);
  }
  // "plugin 'kiln_example_ops' 1.0.0 (my.domain::SquarePlus)": the prefix of its messages.
  std::string who() const;
};

// The custom op for (domain, op_type) whose opset range holds `opset`; nullptr when none.
const CustomOp* find_custom_op(const std::string& domain, const std::string& op_type, int opset);
// Any custom op of (domain, op_type), whatever its opsets (messages); nullptr when none.
const CustomOp* find_custom_op_any(const std::string& domain, const std::string& op_type);
// The state of node `n` of op `op`: deserialized from kStateAttr when present, else made from its
// attributes (nullptr for stateless ops). Errors name the node and the plugin.
Result<CustomOpDesc::State> state_for(const CustomOp& op, const ir::Node& n);
// Runs node `n` with the op's first CPU kernel that takes `inputs` (nullptr: absent): the reference
// interpreter's kernel for custom ops. `outputs` receives one tensor per node output.
Status run_reference(const CustomOp& op, const ir::Node& n, const std::vector<const Tensor*>& inputs,
                     std::vector<Tensor>& outputs);

Status register_op(CustomOpDesc desc);
// Whether `desc` could be registered now (what register_op checks first), naming the conflict.
Status check_registrable(const CustomOpDesc& desc);

struct Provider {
  std::string name, version, origin;
  bool slow = false;
  std::vector<std::string> ops, kernels;
};
std::vector<Provider> providers();
const Provider* find_provider(const std::string& name);  // valid until the next registration

// Builder: for the custom-op nodes of `g` (bodies too), stores serializable states in kStateAttr and
// returns the record of each plugin used: [{name, version, origin, ops, layers}] (empty array: none).
Result<nlohmann::json> record_plugins(ir::Graph& g);
// Loader: every plugin in `records` (an engine's build.plugins) is loaded, with the same major version.
Status check_engine_plugins(const nlohmann::json& records);
// How to load a plugin, for messages.
std::string how_to_load(const std::string& path_hint);

// The loader (loader.cc): a plugin shared library, KILN_PLUGIN_PATH.
Result<PluginInfo> load_plugin_file(const std::string& path);
Status load_env_plugins_once();
PluginInfo info_of(const Provider& p);

}  // namespace kiln::plugin
