#include "phalanx/parallel/launch_env.hpp"

#include <cstdlib>
#include <string>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/env.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/parallel/internal/slurm_rendezvous.hpp"

namespace phalanx::parallel {

namespace {
const char* get(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int parse_int(const char* name, const char* value, int lo, int hi) {
  std::string s = value;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0')
    throw ConfigError(std::string(name) + "='" + s + "' is not an integer");
  if (v < lo || v > hi)
    throw ConfigError(detail::concat(name, "=", v, " is out of range [", lo, ", ", hi, "]"));
  return static_cast<int>(v);
}
}  // namespace

LaunchEnv read_launch_env() {
  LaunchEnv e;
  constexpr int kMax = 1 << 20;
  const char* rank = get("RANK");
  const char* world = get("WORLD_SIZE");
  if (rank || world) {
    if (!rank || !world)
      throw ConfigError(std::string(rank ? "RANK" : "WORLD_SIZE") + " is set but " +
                        (rank ? "WORLD_SIZE" : "RANK") + " is not; a launcher sets both (phalanx-run does)");
    e.source = "env";
    e.world_size = parse_int("WORLD_SIZE", world, 1, kMax);
    e.rank = parse_int("RANK", rank, 0, kMax);
    e.local_rank = get("LOCAL_RANK") ? parse_int("LOCAL_RANK", get("LOCAL_RANK"), 0, kMax) : e.rank;
    e.local_world_size = get("LOCAL_WORLD_SIZE")
                             ? parse_int("LOCAL_WORLD_SIZE", get("LOCAL_WORLD_SIZE"), 1, kMax)
                             : e.world_size;
  } else if (get("OMPI_COMM_WORLD_RANK") && get("OMPI_COMM_WORLD_SIZE")) {
    e.source = "openmpi";
    e.world_size = parse_int("OMPI_COMM_WORLD_SIZE", get("OMPI_COMM_WORLD_SIZE"), 1, kMax);
    e.rank = parse_int("OMPI_COMM_WORLD_RANK", get("OMPI_COMM_WORLD_RANK"), 0, kMax);
    e.local_rank = get("OMPI_COMM_WORLD_LOCAL_RANK")
                       ? parse_int("OMPI_COMM_WORLD_LOCAL_RANK", get("OMPI_COMM_WORLD_LOCAL_RANK"), 0, kMax)
                       : 0;
    e.local_world_size = get("OMPI_COMM_WORLD_LOCAL_SIZE")
                             ? parse_int("OMPI_COMM_WORLD_LOCAL_SIZE", get("OMPI_COMM_WORLD_LOCAL_SIZE"), 1, kMax)
                             : 1;
  } else if (get("SLURM_PROCID") && get("SLURM_NTASKS")) {
    e.source = "slurm";
    e.world_size = parse_int("SLURM_NTASKS", get("SLURM_NTASKS"), 1, kMax);
    e.rank = parse_int("SLURM_PROCID", get("SLURM_PROCID"), 0, kMax);
    // sbatch's batch script also has SLURM_PROCID=0 and the job's SLURM_NTASKS, but it is one
    // process, not a task of srun: without this the program waited PHALANX_TIMEOUT for tasks
    // that never start. srun's tasks have a step id; the batch, extern and interactive steps
    // either have none or one of Slurm's reserved ids (0xfffffff0 and up).
    const char* step = get("SLURM_STEP_ID");
    if (e.world_size > 1 && (!step || std::strtoull(step, nullptr, 10) >= 0xfffffff0ULL))
      throw ConfigError(detail::concat(
          "SLURM_NTASKS=", e.world_size, " but this is Slurm's batch script, not a task of srun (",
          step ? "SLURM_STEP_ID=" + std::string(step) : std::string("no SLURM_STEP_ID"),
          "): start the workers with `srun phalanx-train ...` or `srun --ntasks-per-node=1 phalanx-run ...` "
          "(docs/slurm.md), or set RANK=0 and WORLD_SIZE=1 to run one process here"));
    e.local_rank = get("SLURM_LOCALID") ? parse_int("SLURM_LOCALID", get("SLURM_LOCALID"), 0, kMax) : 0;
    // The tasks on this node: the step's list (srun sets it, "2(x3),1"), else the job's.
    const int node = get("SLURM_NODEID") ? parse_int("SLURM_NODEID", get("SLURM_NODEID"), 0, kMax) : 0;
    e.local_world_size = e.local_rank + 1;
    for (const char* v : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})
      if (const char* spec = get(v)) {
        e.local_world_size = slurm_tasks_on_node(spec, node, v);
        break;
      }
  } else if (get("PMI_RANK") && get("PMI_SIZE")) {  // MPICH's hydra, Intel MPI
    e.source = "pmi";
    e.world_size = parse_int("PMI_SIZE", get("PMI_SIZE"), 1, kMax);
    e.rank = parse_int("PMI_RANK", get("PMI_RANK"), 0, kMax);
    e.local_rank = get("MPI_LOCALRANKID") ? parse_int("MPI_LOCALRANKID", get("MPI_LOCALRANKID"), 0, kMax) : 0;
    e.local_world_size = get("MPI_LOCALNRANKS") ? parse_int("MPI_LOCALNRANKS", get("MPI_LOCALNRANKS"), 1, kMax)
                                                : e.local_rank + 1;
  }
  if (e.rank >= e.world_size)
    throw ConfigError(detail::concat("rank ", e.rank, " is not below the world size ", e.world_size,
                                     " (ranks count from 0); check RANK and WORLD_SIZE"));
  if (e.local_rank >= e.local_world_size)
    throw ConfigError(detail::concat("local rank ", e.local_rank, " is not below the local world size ",
                                     e.local_world_size));
  if (const char* a = get("MASTER_ADDR")) e.master_addr = a;
  if (const char* p = get("MASTER_PORT")) e.master_port = parse_int("MASTER_PORT", p, 1, 65535);
  e.restart_count = static_cast<int>(env::integer("PHALANX_RESTART_COUNT", e.restart_count, 0, kMax));
  e.store_hosted = env::flag("PHALANX_STORE_HOSTED", e.store_hosted);
  return e;
}

Device resolve_device(const std::string& text, const LaunchEnv& env, const std::string& source) {
  if (text == "cuda") return Device::cuda(env.local_rank);
  try {
    return Device::parse(text);
  } catch (const ValueError&) {
    throw ConfigError("unknown device '" + text + "' (from " + source +
                      "): use cpu, cuda (= cuda:LOCAL_RANK), cuda:N, sim or sim:N");
  }
}

}  // namespace phalanx::parallel
