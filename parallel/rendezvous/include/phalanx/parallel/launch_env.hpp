#pragma once
// What the launcher told this worker, from the environment. torchrun's names first
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), then
// OpenMPI's (OMPI_COMM_WORLD_*), then SLURM's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID),
// then PMI's (PMI_RANK, PMI_SIZE; MPI_LOCALRANKID, MPI_LOCALNRANKS) from MPICH and Intel MPI.
// No variables at all means a world of one.
#include <string>

#include "phalanx/core/device.hpp"

namespace phalanx::parallel {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;  ///< empty when unset
  int master_port = -1;     ///< -1 when unset
  std::string source = "none";  ///< "env" (torchrun names), "openmpi", "slurm", "pmi" (MPICH, Intel MPI) or "none"
  int restart_count = 0;        ///< PHALANX_RESTART_COUNT
  bool store_hosted = false;    ///< PHALANX_STORE_HOSTED=1: the launcher hosts the TCP store
};

/// Reads and validates the environment; throws ConfigError naming the bad variable.
LaunchEnv read_launch_env();

/// The device named by `text` for the rank `env` describes: "cpu", "cuda:N", "sim", "sim:N"
/// as written; "cuda" without an index is cuda:LOCAL_RANK (one GPU per local rank, as
/// torchrun's scripts do). `source` names where the text came from ("PHALANX_DEVICE", "the
/// device option", ...) in the ConfigError thrown for a text that is no device.
Device resolve_device(const std::string& text, const LaunchEnv& env, const std::string& source);

}  // namespace phalanx::parallel
