#pragma once
// Workers started by srun itself, with no phalanx-run and no MASTER_ADDR (docs/slurm.md):
// the job's TCP store is hosted by rank 0 on the first node of the step, at a port and with a
// job token that every task computes alike from Slurm's variables.
#include <string>

namespace phalanx::parallel {

/// The first host of a Slurm hostlist expression: "node[01-03,7],gpu5" -> "node01",
/// "rack[2-3]-n[5,9]" -> "rack2-n5", "vm" -> "vm". ConfigError naming `variable` for an
/// empty or malformed expression.
std::string first_slurm_host(const std::string& nodelist, const char* variable);

/// The tasks on node `node` (0-based) of a Slurm tasks-per-node list: "2(x3),1" is 2, 2, 2,
/// 1. ConfigError naming `variable` when malformed or shorter than `node` + 1.
int slurm_tasks_on_node(const std::string& spec, int node, const char* variable);

struct SlurmRendezvous {
  std::string host;   ///< the first node of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST, SLURM_NODELIST)
  int port = 0;       ///< MASTER_PORT, else 15000 + (SLURM_JOB_ID * 16 + SLURM_STEP_ID) mod 17000
  std::string token;  ///< PHALANX_RDZV_TOKEN, else derived from "slurm:<job>.<step>" and PHALANX_RDZV_SECRET
};

/// Where the store of a job started by srun is; ConfigError naming the variable when
/// Slurm's variables are missing or malformed.
SlurmRendezvous slurm_rendezvous(int master_port);

/// Whether srun connected the tasks to an MPI runtime (srun --mpi=pmix sets PMIX_RANK):
/// only then can `auto` use the MPI plugin under srun.
bool slurm_connected_mpi();

}  // namespace phalanx::parallel
