#include "phalanx/backends/plugin_registry.hpp"

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/world_of_one.hpp"

namespace phalanx {

namespace {
const std::vector<std::string> kBuiltins{"single"};

const phalanx_plugin_descriptor& load_backend(const std::string& name, const std::string& explicit_path) {
  return load_plugin(name, explicit_path, "backend", kBuiltins);
}
}  // namespace

std::vector<PluginInfo> list_backends(const std::string& explicit_path) {
  std::vector<PluginInfo> out{{"single", "comm", "built-in world of one (no communication)", "", true}};
  for (auto& p : find_plugins(explicit_path)) out.push_back(std::move(p));
  return out;
}

bool backend_available(const std::string& name, std::string* reason) {
  if (name == "single") return true;
  try {
    const auto& d = load_backend(name, "");
    if (!d.probe) return true;
    char buf[512] = {0};
    const bool ok = d.probe(buf, sizeof buf) != 0;
    if (!ok && reason) *reason = buf;
    return ok;
  } catch (const std::exception& e) {
    if (reason) *reason = e.what();
    return false;
  }
}

ProcessGroupPtr create_process_group(const std::string& name, const BackendConfig& config,
                                     const std::string& explicit_path) {
  if (name == "single") {
    if (config.size != 1)
      throw ConfigError(detail::concat("backend 'single' is a world of one, but the world size is ",
                                       config.size, "; choose a communication backend such as gloo"));
    return make_world_of_one(config.timeout);
  }
  const phalanx_plugin_descriptor& d = load_backend(name, explicit_path);
  if (std::string(d.kind ? d.kind : "") != "comm")
    throw PluginAbiError("backend '" + name + "' is a '" + (d.kind ? d.kind : "") +
                         "' plugin, not a communication backend");
  if (d.probe) {
    char reason[512] = {0};
    if (!d.probe(reason, sizeof reason))
      throw BackendUnavailableError("backend '" + name + "' cannot run here: " + reason);
  }
  char err[1024] = {0};
  void* obj = d.create(&config, err, sizeof err);
  if (!obj) throw CommError("backend '" + name + "' failed to start on rank " +
                            std::to_string(config.rank) + ": " + err);
  // The group owns the backend and frees it with the plugin's destroy, after its threads stopped.
  auto* pg = new ProcessGroup(BackendPtr(static_cast<Backend*>(obj), BackendDeleter(d.destroy)));
  return ProcessGroupPtr(pg, [](ProcessGroup* p) {
    // An aborted group's worker may still be blocked inside the backend (a peer that
    // stopped without closing its connections): give it a moment, then leave the group
    // (and its backend) alive rather than hang here; its thread ends with the process.
    if (p->is_aborted() && !p->stop_threads(std::chrono::milliseconds(500))) return;
    delete p;
  });
}

}  // namespace phalanx
