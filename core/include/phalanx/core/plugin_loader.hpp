#pragma once
// Finding and loading plugins (phalanx/core/plugin_abi.h): device plugins (CUDA, the sim test
// device) and communication plugins (gloo, nccl, shm, mpi) alike.
//
// Search order for libphalanx_<name>.so: the explicit path (a file or a directory), each
// directory in PHALANX_PLUGIN_PATH (colon-separated), the directory libphalanx.so was
// loaded from, then the install libdir. A plugin, once loaded, stays loaded for the
// process's life (its descriptor points into it).
#include <string>
#include <vector>

#include "phalanx/core/device.hpp"
#include "phalanx/core/plugin_abi.h"

namespace phalanx {

struct PluginInfo {
  std::string name, kind, description, path;
  bool builtin = false;
};

/// Loads plugin `name` (cached by name) and returns its descriptor. Throws
/// PluginNotFoundError (no such file, or it cannot be dlopen'ed) or PluginAbiError (built for
/// another ABI, or its descriptor disagrees with its file name). On "not found" the message
/// calls it a `noun` ("backend", "plugin") and lists `builtins` first among the available.
const phalanx_plugin_descriptor& load_plugin(const std::string& name, const std::string& explicit_path = "",
                                             const char* noun = "plugin",
                                             const std::vector<std::string>& builtins = {});
/// Every libphalanx_<name>.so on the search path (the first of each name), not loaded.
std::vector<PluginInfo> find_plugins(const std::string& explicit_path = "");
/// The directories searched, in order.
std::vector<std::string> plugin_search_path(const std::string& explicit_path = "");
/// "libphalanx_<name>.so".
std::string plugin_file_name(const std::string& name);

/// Loads the device plugin for `type` (libphalanx_cuda.so, libphalanx_sim.so), which
/// registers its kernel table; false with the reason when there is none or it cannot run.
bool load_device_plugin(DeviceType type, std::string* reason);

}  // namespace phalanx
