// Must not link against rendezvous' objects and those below it: a function of parallel/ddp,
// declared by hand (no header needed), as if init.cpp reached up into Join.
#include "phalanx/backends/process_group.hpp"

namespace phalanx::parallel {
int find_common_rank(ProcessGroup& pg, Device device, bool condition);
}
int layer_link_control(phalanx::ProcessGroup& pg, phalanx::Device device) {
  return phalanx::parallel::find_common_rank(pg, device, true);
}
