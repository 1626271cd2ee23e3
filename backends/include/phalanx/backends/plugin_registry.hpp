#pragma once
// Communication backends: built-in ("single", the world of one) or plugins found and loaded
// by core's plugin loader (phalanx/core/plugin_loader.hpp: search path, ABI checks).
#include <string>
#include <vector>

#include "phalanx/backends/process_group.hpp"
#include "phalanx/core/plugin_loader.hpp"

namespace phalanx {

/// Creates a process group of backend `name` (built-in or plugin). Throws
/// PluginNotFoundError, PluginAbiError or BackendUnavailableError.
ProcessGroupPtr create_process_group(const std::string& name, const BackendConfig& config,
                                     const std::string& explicit_path = "");
/// Whether the plugin exists and its probe says it can run here (never throws).
bool backend_available(const std::string& name, std::string* reason = nullptr);
/// Every plugin found on the search path, after the built-ins.
std::vector<PluginInfo> list_backends(const std::string& explicit_path = "");

}  // namespace phalanx
