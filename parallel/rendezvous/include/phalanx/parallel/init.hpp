#pragma once
// The first of the textbook's three changes: initialise the process group.
//
//   auto pg = phalanx::parallel::init_process_group();   // reads the launcher's environment
//
// Backend priority: InitOptions::backend > PHALANX_BACKEND > the config file ("backend" in
// the JSON file named by PHALANX_CONFIG) > auto. Auto: a world of one runs on the built-in
// "single" backend; nccl when the device is CUDA and the plugin can run; mpi when launched
// by mpirun/srun (OMPI_COMM_WORLD_*, SLURM_*, PMI_* set) and libphalanx_mpi.so loads; else
// (resolve_backend says "auto") the ranks tell each other their hosts through the store
// (PHALANX_HOST_ID, else hostname, boot id and the launcher's GROUP_RANK) and init picks:
// every rank on one host -> "shm" when its plugin can run on every rank, else gloo; several
// hosts -> the hierarchical group (shm or gloo within a host, gloo between hosts;
// hierarchical_process_group.hpp), which can also be named ("hierarchical"). A backend
// named explicitly ("gloo" included) is used as named; one that cannot be loaded is an
// error, even in a world of one.
//
// Rendezvous (env://, the default): rank 0 hosts the TCP store on MASTER_ADDR:MASTER_PORT,
// unless the launcher hosts it (PHALANX_STORE_HOSTED=1, what phalanx-run does); every rank
// connects, checks that all ranks agree on the world size and backend and that no rank is
// taken twice, then the backend connects its full mesh. file:///path uses a FileStore on a
// shared filesystem instead. Backend mpi under mpirun/srun without MASTER_ADDR: MPI_Init is
// the rendezvous (no store, no check-in; the plugin checks MPI's world against this one;
// docs/mpi.md).
//
// Device: decided once, here (docs/ddp.md, "Devices"): InitOptions::device > PHALANX_DEVICE >
// "device" in the config file > "cpu"; "cuda" without an index is cuda:LOCAL_RANK. A device
// that is no device, or whose plugin cannot load, fails init before any rendezvous. The
// backend receives it (BackendConfig::device, local_rank); code that needs it asks
// local_device() and never reads LOCAL_RANK itself:
//
//   auto pg = phalanx::parallel::init_process_group();
//   model->to(phalanx::parallel::local_device());
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
  std::string device;       ///< "" = PHALANX_DEVICE / config / "cpu"; "cuda" = cuda:LOCAL_RANK
  std::string config_file;  ///< "" = PHALANX_CONFIG
};

/// Initialises the default process group (once per process; call destroy first to redo).
ProcessGroupPtr init_process_group(const InitOptions& options = {});
/// Releases the default group (and, on the hosting rank, the store).
void destroy_process_group();
bool is_initialized();
/// The default group; a world of one ("single") when init was never called.
ProcessGroupPtr default_process_group();
/// The device these options and this environment name for this rank (see above); throws
/// ConfigError naming the source of a text that is no device.
Device resolve_device(const InitOptions& options = {});
/// The device init_process_group decided for this rank; before init (or after destroy),
/// resolve_device() of the environment.
Device local_device();
/// The backend init would choose for these options and this environment, before it knows the
/// hosts: "single", "nccl", "mpi", a named backend, or "auto" for a CPU job whose backend init
/// decides from the hosts: "shm" (one host, its plugin can run on every rank), else gloo, or
/// the hierarchical group (several hosts).
std::string resolve_backend(const InitOptions& options, int world_size);

}  // namespace phalanx::parallel
