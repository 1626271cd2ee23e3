#pragma once
// The default world (rank, size) that components consult when the user does not pass one:
// a world of one until parallel::init_process_group() records the real one.

namespace phalanx {

struct WorldInfo {
  int rank = 0;
  int size = 1;
};

WorldInfo default_world();
void set_default_world(WorldInfo world);

}  // namespace phalanx
