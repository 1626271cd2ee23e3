#pragma once
// The CPU allocator behind CpuKernels::allocate/deallocate: 64-byte aligned blocks, with
// freed blocks of 4 KiB and more kept for reuse by size (a training step frees and
// re-allocates the same sizes every step), like the CUDA plugin's cuda_allocator.
#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace phalanx {

/// Free CPU blocks kept for reuse, by rounded size, within a byte budget
/// (PHALANX_CPU_CACHE_MB, default 1024).
class CpuBlockCache {
 public:
  CpuBlockCache();
  ~CpuBlockCache();
  void* take(std::size_t rounded);
  bool give(void* p, std::size_t rounded);
  void release_all();
  std::size_t cached_bytes() const;

 private:
  static constexpr std::size_t kMinCached = 4096;  // small blocks: malloc's own caches win
  mutable std::mutex mu_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_ = 0;
  std::size_t budget_ = std::size_t(1024) << 20;
};

class CpuAllocator {
 public:
  void* allocate(std::size_t nbytes);
  void deallocate(void* p, std::size_t nbytes);

 private:
  CpuBlockCache cache_;
};

}  // namespace phalanx
