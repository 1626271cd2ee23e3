#pragma once
// The first of the textbook's three changes: initialise the process group.
//
//   auto pg = phalanx::parallel::init_process_group();   // reads the launcher's environment
//
// Backend priority: InitOptions::backend > PHALANX_BACKEND > the config file ("backend" in
// the JSON file named by PHALANX_CONFIG) > auto. Auto: a world of one runs on the built-in
// "single" backend; nccl when the device is CUDA and the plugin can run; mpi when launched
// by mpirun/srun and the plugin can run; else gloo. A backend named explicitly that cannot
// be loaded is an error, even in a world of one.
//
// Rendezvous (env://, the default): rank 0 hosts the TCP store on MASTER_ADDR:MASTER_PORT,
// unless the launcher hosts it (PHALANX_STORE_HOSTED=1, what phalanx-run does); every rank
// connects, checks that all ranks agree on the world size and backend and that no rank is
// taken twice, then the backend connects its full mesh. file:///path uses a FileStore on a
// shared filesystem instead.
#include <chrono>
#include <string>

#include "phalanx/backends/process_group.hpp"

namespace phalanx::parallel {

struct InitOptions {
  std::string backend;      ///< "" = PHALANX_BACKEND / config / auto
  std::string init_method;  ///< "" or "env://", "file:///path", "tcp://host:port"
  int rank = -1;            ///< -1 = from the environment
  int world_size = -1;      ///< -1 = from the environment
  std::chrono::milliseconds timeout{0};  ///< 0 = default_timeout(): PHALANX_TIMEOUT or kDefaultTimeout (300 s)
  std::string plugin_path;  ///< explicit plugin file or directory
  std::string device;       ///< "" = PHALANX_DEVICE or "cpu"
  std::string config_file;  ///< "" = PHALANX_CONFIG
};

/// Initialises the default process group (once per process; call destroy first to redo).
ProcessGroupPtr init_process_group(const InitOptions& options = {});
/// Releases the default group (and, on the hosting rank, the store).
void destroy_process_group();
bool is_initialized();
/// The default group; a world of one ("single") when init was never called.
ProcessGroupPtr default_process_group();
/// The backend init would choose for these options and this environment.
std::string resolve_backend(const InitOptions& options, int world_size);

}  // namespace phalanx::parallel
