#pragma once
// The sim device's kernel table: every entry runs the CPU kernel over CPU views of the
// untagged memory (Storage::borrow), so sim results equal CPU results bit for bit. Operands
// that are not sim tensors, and ranges outside live sim blocks, are errors.
#include "phalanx/core/kernels.hpp"

namespace phalanx::sim {

DeviceKernels& table();

}  // namespace phalanx::sim
