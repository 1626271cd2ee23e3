#pragma once
// What the CPU allocator hands out (tensors and the kernels' scratch tensors), like
// torch.cuda.memory_allocated / max_memory_allocated for the GPU: bytes in blocks that are
// in use, rounded up to the allocator's 64-byte granule. Blocks kept in its reuse cache are
// not counted; memory that kernels take from malloc directly (OpenBLAS's buffers) is not.
#include <cstddef>

namespace phalanx {

struct MemoryStats {
  std::size_t allocated_bytes;       ///< in use now
  std::size_t peak_allocated_bytes;  ///< the most in use at once since the last reset
};

MemoryStats cpu_memory_stats();
/// Sets the peak to what is in use now (measure a region: reset, run it, read the peak).
void reset_cpu_peak_memory();

}  // namespace phalanx
