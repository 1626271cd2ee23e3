#pragma once
// The shm backend works on host memory: non-CPU tensors are staged through a host buffer
// (phalanx/backends/host_staging.hpp, shared with the Gloo and MPI plugins).
#include "phalanx/backends/host_staging.hpp"

namespace phalanx::shm {

using staging::copy_back;
using staging::host_of;
using staging::write_back;

}  // namespace phalanx::shm
