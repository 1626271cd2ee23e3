#pragma once
// A caching device allocator: plain cudaMalloc (never managed memory), freed blocks kept
// per device and rounded size for reuse. All kernels run on the default stream, so a block
// freed and reused is ordered after its last use.
#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

namespace phalanx::cuda {

class CachingAllocator {
 public:
  void* allocate(std::size_t nbytes, int device);
  void deallocate(void* p, std::size_t nbytes, int device);
  /// Returns every cached block to CUDA.
  void release_all();
  std::size_t cached_bytes() const;

 private:
  static std::size_t round(std::size_t n) { return (std::max<std::size_t>(n, 1) + 511) / 512 * 512; }
  mutable std::mutex mu_;
  std::map<std::pair<int, std::size_t>, std::vector<void*>> free_;
  std::size_t cached_ = 0;
};

}  // namespace phalanx::cuda
