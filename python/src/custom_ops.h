// Python's custom ops (@kiln.custom_op) and plugin loading: kiln._kiln's load_plugin, loaded_plugins,
// PluginInfo and _register_custom_op (python/src/custom_ops.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace kiln::python {

void bind_custom_ops(pybind11::module_& m);

}  // namespace kiln::python
