#pragma once
// Finding and loading backend plugins.
//
// Search order for libphalanx_<name>.so: the explicit path (a file or a directory), each
// directory in PHALANX_PLUGIN_PATH (colon-separated), the directory libphalanx.so was
// loaded from, then the install libdir. Built-in backends ("single", the world of one)
// need no plugin.
#include <string>
#include <vector>

#include "phalanx/backends/plugin_abi.h"
#include "phalanx/backends/process_group.hpp"

namespace phalanx {

struct PluginInfo {
  std::string name, kind, description, path;
  bool builtin = false;
};

/// Creates a process group of backend `name` (built-in or plugin). Throws
/// PluginNotFoundError, PluginAbiError or BackendUnavailableError.
ProcessGroupPtr create_process_group(const std::string& name, const BackendConfig& config,
                                     const std::string& explicit_path = "");
/// Loads a plugin (cached by name) and returns its descriptor.
const phalanx_plugin_descriptor& load_plugin(const std::string& name,
                                             const std::string& explicit_path = "");
/// Whether the plugin exists and its probe says it can run here (never throws).
bool backend_available(const std::string& name, std::string* reason = nullptr);
/// Every backend found on the search path, plus the built-ins.
std::vector<PluginInfo> list_backends(const std::string& explicit_path = "");
/// The directories searched, in order.
std::vector<std::string> plugin_search_path(const std::string& explicit_path = "");

}  // namespace phalanx
