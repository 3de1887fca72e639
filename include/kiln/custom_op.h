/// Custom ops in C++: the one registration path behind shared-library plugins (kiln/plugin.h, loaded
/// by load_plugin) and, later, Python's @kiln.custom_op. A registered op is a kiln op like any other:
/// the importer infers its outputs, the builder tunes its kernels as tactics ("<plugin>.<kernel>"),
/// the reference interpreter runs its first CPU kernel that accepts the inputs, and an engine that
/// uses it records the plugin's name and version (loading the engine without it is an error naming it).
///
/// Callbacks see the node through plugin.h's C accessors (kiln::plugin_host_api() gives them to C++
/// callers too), so one description serves both ABIs. They return "" on success or the failure's
/// message; an exception they throw counts as a failure with its what().
///
/// Register before building or loading engines that use the op, and not concurrently with builds or
/// runs: the registries are process-wide and ops are never removed.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/plugin.h"

namespace kiln {

struct CustomKernelDesc {
  std::string name;  ///< the tactic's name, unique: "<plugin>.<kernel>" (register_custom_op checks)
  int device = KILN_DEVICE_CPU;
  int revision = 1;  ///< the timing cache retimes the kernel when this changes
  /// Optional: "" when it takes these inputs, else why not (the builder lists it among the declined).
  std::function<std::string(const void* state, const kiln_shape_ctx* shapes)> why_unsupported;
  /// Optional: scratch bytes at these concrete shapes and thread count.
  std::function<size_t(const void* state, const kiln_shape_ctx* shapes, int threads)> workspace_size;
  /// Required: computes io.outputs.
  std::function<std::string(const void* state, const kiln_kernel_io& io)> compute;
};

struct CustomOpDesc {
  std::string plugin;          ///< the provider's name ("kiln_example_ops", or "python")
  std::string plugin_version;  ///< "MAJOR.MINOR.PATCH"; engines refuse another MAJOR
  std::string origin;          ///< where it came from: the .so's path, "python", ... (messages, inspect)
  bool slow = false;           ///< interpreted kernels (Python): `kiln inspect` says so
  std::string domain, op_type;
  int since_opset = 1, until_opset = 0;  ///< until 0: no upper bound
  int min_inputs = 0, max_inputs = -1;
  using State = std::shared_ptr<const void>;
  /// Optional (none: stateless): the node's attributes -> its state.
  std::function<std::string(const kiln_attrs* attrs, State* state)> create_state;
  /// Optional pair: the state stored in the engine and read back at load instead of create_state.
  std::function<std::string(const void* state, std::string* bytes)> serialize_state;
  std::function<std::string(const std::string& bytes, State* state)> deserialize_state;
  /// Required: output types from input types (plugin.h's shape accessors).
  std::function<std::string(const void* state, kiln_shape_ctx* shapes)> infer;
  std::vector<CustomKernelDesc> kernels;  ///< at least one CPU kernel
};

/// Registers an op; throws kiln::Error (kInvalidArgument) naming what is wrong: a missing callback, no
/// CPU kernel, a duplicate kernel name, an op kiln or another plugin already has for those opsets.
void register_custom_op(CustomOpDesc desc);

struct PluginInfo {
  std::string name, version, path;
  std::vector<std::string> ops;      ///< "domain::OpType"
  std::vector<std::string> kernels;  ///< tactic names
};
/// Loads a plugin shared library (kiln/plugin.h) and registers its ops. Loading the same file again
/// returns its info; another file with a loaded plugin's name is refused. Throws kiln::Error naming the
/// file and the fault: not found, not a shared library, no kiln_plugin_init, another ABI major version,
/// a null required callback, a malformed description. Nothing is registered from a plugin that fails.
PluginInfo load_plugin(const std::string& path);
/// Every plugin (and register_custom_op provider) loaded so far.
std::vector<PluginInfo> loaded_plugins();
/// Loads KILN_PLUGIN_PATH (colon-separated .so files or directories of them) once per process; kiln's
/// builder, engine loader and CLI call it. Throws like load_plugin.
void load_env_plugins();
/// The accessors plugin callbacks use (the same table kiln_plugin_init receives).
const kiln_host_api* plugin_host_api();

}  // namespace kiln
