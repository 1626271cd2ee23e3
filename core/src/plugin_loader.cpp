#include "phalanx/core/plugin_loader.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

#include "phalanx/core/env.hpp"
#include "phalanx/core/error.hpp"

#ifndef PHALANX_INSTALL_LIBDIR
#define PHALANX_INSTALL_LIBDIR "/usr/local/lib"
#endif

namespace phalanx {

namespace {

std::mutex g_mu;
std::map<std::string, const phalanx_plugin_descriptor*> g_loaded;

bool is_dir(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string core_library_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&core_library_dir), &info) && info.dli_fname) {
    std::string p = info.dli_fname;
    const auto slash = p.rfind('/');
    return slash == std::string::npos ? "." : p.substr(0, slash);
  }
  return "";
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

}  // namespace

std::vector<std::string> plugin_search_path(const std::string& explicit_path) {
  std::vector<std::string> dirs;
  auto add = [&](const std::string& d) {
    if (d.empty()) return;
    for (const auto& x : dirs)
      if (x == d) return;
    dirs.push_back(d);
  };
  add(explicit_path);  // a file or a directory; empty is skipped
  if (const auto env = env::path("PHALANX_PLUGIN_PATH")) {
    std::stringstream ss(*env);
    std::string d;
    while (std::getline(ss, d, ':')) add(d);
  }
  add(core_library_dir());
  add(PHALANX_INSTALL_LIBDIR);
  return dirs;
}

std::string plugin_file_name(const std::string& name) { return "libphalanx_" + name + ".so"; }

std::vector<PluginInfo> find_plugins(const std::string& explicit_path) {
  std::vector<PluginInfo> out;
  for (const auto& dir : plugin_search_path(explicit_path)) {
    if (!is_dir(dir)) continue;
    DIR* d = ::opendir(dir.c_str());
    if (!d) continue;
    while (dirent* e = ::readdir(d)) {
      const std::string f = e->d_name;
      if (f.rfind("libphalanx_", 0) != 0 || f.size() < 15 || f.compare(f.size() - 3, 3, ".so") != 0)
        continue;
      const std::string name = f.substr(11, f.size() - 14);
      bool seen = false;
      for (const auto& p : out) seen = seen || p.name == name;
      if (!seen) out.push_back({name, "", "", dir + "/" + f, false});
    }
    ::closedir(d);
  }
  return out;
}

const phalanx_plugin_descriptor& load_plugin(const std::string& name, const std::string& explicit_path,
                                             const char* noun, const std::vector<std::string>& builtins) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (auto it = g_loaded.find(name); it != g_loaded.end()) return *it->second;

  std::vector<std::string> tried;
  std::string path;
  for (const auto& entry : plugin_search_path(explicit_path)) {
    const std::string candidate = is_file(entry) ? entry : entry + "/" + plugin_file_name(name);
    if (is_file(entry) && entry.find(plugin_file_name(name)) == std::string::npos) continue;
    tried.push_back(candidate);
    if (is_file(candidate)) {
      path = candidate;
      break;
    }
  }
  if (path.empty()) {
    std::vector<std::string> available = builtins;
    for (const auto& p : find_plugins(explicit_path)) available.push_back(p.name);
    throw PluginNotFoundError(std::string(noun) + " '" + name + "' not found: no " + plugin_file_name(name) + " in " +
                              join(tried, ", ") + ". Available " + noun + "s: " + join(available, ", ") +
                              ". Build the plugin (CMake option PHALANX_WITH_<NAME>), or point "
                              "PHALANX_PLUGIN_PATH at the directory that holds it");
  }
  // Closed again on every error path below; kept open (for the process's life) once loaded.
  struct Handle {
    void* h;
    ~Handle() {
      if (h) ::dlclose(h);
    }
  } guard{::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)};
  void* handle = guard.h;
  if (!handle)
    throw PluginNotFoundError(std::string(noun) + " '" + name + "': " + path + " exists but cannot be loaded: " +
                              ::dlerror() + " (a missing dependency? check it with ldd)");
  auto entry = reinterpret_cast<phalanx_plugin_entry_fn>(::dlsym(handle, PHALANX_PLUGIN_ENTRY_SYMBOL));
  if (!entry)
    throw PluginNotFoundError(std::string(noun) + " '" + name + "': " + path + " is not a Phalanx plugin (no " +
                              PHALANX_PLUGIN_ENTRY_SYMBOL + " symbol)");
  const phalanx_plugin_descriptor* d = entry();
  if (!d || d->abi_version != PHALANX_PLUGIN_ABI_VERSION)
    throw PluginAbiError(detail::concat(noun, " '", name, "': ", path, " was built for plugin ABI ",
                                        d ? d->abi_version : 0u, " but this Phalanx uses ABI ",
                                        PHALANX_PLUGIN_ABI_VERSION,
                                        "; rebuild the plugin against this Phalanx's headers"));
  if (!d->name || name != d->name || !d->create)
    throw PluginAbiError(std::string(noun) + " '" + name + "': " + path + " describes itself as '" +
                         (d->name ? d->name : "") + "' (or has no factory); the file name and the "
                         "descriptor must agree");
  g_loaded[name] = d;
  guard.h = nullptr;  // loaded: the descriptor points into the library
  return *d;
}

bool load_device_plugin(DeviceType type, std::string* reason) {
  // CUDA ships as a plugin; sim is the test accelerator (tests/support/sim_device), built
  // with the tests into the build tree and never installed.
  const bool sim = type == DeviceType::Sim;
  if (type != DeviceType::CUDA && !sim) {
    if (reason) *reason = "no plugin provides this device type";
    return false;
  }
  const std::string name = sim ? "sim" : "cuda", what = sim ? "the sim device plugin" : "the CUDA device plugin";
  try {
    const phalanx_plugin_descriptor& d = load_plugin(name);
    if (std::string(d.kind ? d.kind : "") != "device") {
      if (reason) *reason = plugin_file_name(name) + " is not a device plugin";
      return false;
    }
    char why[512] = {0};
    if (d.probe && !d.probe(why, sizeof why)) {
      if (reason) *reason = what + " cannot run here: " + why;
      return false;
    }
    char err[512] = {0};
    if (!d.create(nullptr, err, sizeof err)) {
      if (reason) *reason = what + " failed to start: " + err;
      return false;
    }
    return true;
  } catch (const PluginNotFoundError& e) {
    if (reason) {
      *reason = e.what();
      if (sim && reason->find("' not found: ") != std::string::npos)  // not a load failure
        *reason = "no " + plugin_file_name(name) + " in " + join(plugin_search_path(""), ", ") +
                  ": the sim device is a test plugin, built with the tests and never installed; "
                  "build the tests (target phalanx_sim) and run from the build tree, or set "
                  "PHALANX_PLUGIN_PATH to the build directory";
    }
    return false;
  } catch (const std::exception& e) {
    if (reason) *reason = e.what();
    return false;
  }
}

}  // namespace phalanx
