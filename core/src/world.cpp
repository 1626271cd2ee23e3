#include "phalanx/core/world.hpp"

#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "phalanx/core/error.hpp"

namespace phalanx {

namespace {
std::mutex g_mu;
WorldInfo g_world;
}  // namespace

WorldInfo default_world() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_world;
}

void set_default_world(WorldInfo w) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_world = w;
}

int launch_world_size(std::string* source) {
  for (const char* name : {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    // Strict: "2 " or "2x" is a launcher or shell mistake, not a world of one.
    if (end == v || *end != '\0' || errno != 0 || n < 1 || n >= (1L << 30))
      throw ValueError(detail::concat(name, "='", v, "' is not a positive integer; fix the launch environment "
                                      "(the number of workers) or unset it"));
    if (source) *source = name;
    return static_cast<int>(n);
  }
  return 1;
}

void require_world_initialized(const std::string& who) {
  const WorldInfo w = default_world();
  if (w.initialized || w.size > 1) return;
  std::string source;
  const int n = launch_world_size(&source);
  if (n > 1)
    throw ValueError(detail::concat(who, ": the launch environment says ", source, "=", n,
                                    " but no process group is initialised, so this worker would train "
                                    "alone as a world of one; call parallel::init_process_group() first"));
}

}  // namespace phalanx
