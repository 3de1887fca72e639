// The public custom-op API (kiln/custom_op.h) over src/plugin: Status into kiln::Error.
#include "engine/engine_impl.h"
#include "kiln/custom_op.h"
#include "plugin/custom_ops.h"

namespace kiln {

void register_custom_op(CustomOpDesc desc) try {
  Status s = plugin::register_op(std::move(desc));
  if (!s.ok()) detail::throw_error(s);
} catch (...) {
  detail::rethrow_as_error("registering a custom op");
}

PluginInfo load_plugin(const std::string& path) try {
  auto r = plugin::load_plugin_file(path);
  if (!r.ok()) detail::throw_error(r.status());
  return std::move(r).value();
} catch (...) {
  detail::rethrow_as_error("loading plugin '" + path + "'");
}

std::vector<PluginInfo> loaded_plugins() {
  std::vector<PluginInfo> out;
  for (const auto& p : plugin::providers()) out.push_back(plugin::info_of(p));
  return out;
}

void load_env_plugins() try {
  Status s = plugin::load_env_plugins_once();
  if (!s.ok()) detail::throw_error(s);
} catch (...) {
  detail::rethrow_as_error("loading KILN_PLUGIN_PATH");
}

}  // namespace kiln
