// The MPI plugin's entry point. No probe: the plugin loads only where libmpi does, and
// MPI_Init (in the factory) is left for a job that asks for this backend.
#include "mpi_process_group.hpp"
#include "phalanx/backends/plugin_abi.h"

namespace {
void* create(const void* config, char*, size_t) {
  // Errors (ConfigError: not under mpirun, a thread level too low) propagate as C++
  // exceptions: plugins are C++ built against this Phalanx, see plugin_abi.h.
  return static_cast<phalanx::Backend*>(
      new phalanx::mpi_backend::MpiProcessGroup(*static_cast<const phalanx::BackendConfig*>(config)));
}
void destroy(void* backend) { delete static_cast<phalanx::Backend*>(backend); }

const phalanx_plugin_descriptor kDescriptor = {
    PHALANX_PLUGIN_ABI_VERSION, "mpi", "comm", "MPI (CPU tensors; others staged through host memory)",
    nullptr, &create, &destroy,
};
}  // namespace

extern "C" __attribute__((visibility("default"))) const phalanx_plugin_descriptor* phalanx_plugin_entry(void) {
  return &kDescriptor;
}
