#pragma once
// The default world (rank, size) that components consult when the user does not pass one:
// a world of one until parallel::init_process_group() records the real one.
#include <string>

namespace phalanx {

struct WorldInfo {
  int rank = 0;
  int size = 1;
  bool initialized = false;  ///< set by parallel::init_process_group()
};

WorldInfo default_world();
void set_default_world(WorldInfo world);

/// The world size the launch environment announces: WORLD_SIZE (torchrun, phalanx-run),
/// else OMPI_COMM_WORLD_SIZE (Open MPI's mpirun), else SLURM_NTASKS (srun), else PMI_SIZE
/// (MPICH, Intel MPI); 1 when none is set. Throws ValueError when the first one set is not
/// a positive integer (parsed strictly: "2 " is an error). `source` receives its name.
int launch_world_size(std::string* source = nullptr);

/// Throws ValueError naming `who` and the fix when the launch environment says the world
/// is larger than one but no process group was initialised (and no world was set): each
/// worker would otherwise train alone as a world of one.
void require_world_initialized(const std::string& who);

}  // namespace phalanx
