#include "cpu/cpu_allocator.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>

#include "phalanx/core/env.hpp"
#include "phalanx/core/memory_stats.hpp"

namespace phalanx {

namespace {
constexpr std::size_t kAlign = 64;  // a cache line: full-width SIMD loads, no false sharing
// cpu_memory_stats(): relaxed atomics, two per allocation (no lock on the allocation path).
std::atomic<std::size_t> g_allocated{0}, g_peak{0};
void count_allocation(std::size_t bytes) {
  const std::size_t now = g_allocated.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
}  // namespace

MemoryStats cpu_memory_stats() {
  return {g_allocated.load(std::memory_order_relaxed), g_peak.load(std::memory_order_relaxed)};
}
void reset_cpu_peak_memory() { g_peak.store(g_allocated.load(std::memory_order_relaxed), std::memory_order_relaxed); }

// A caching allocator: a training step frees and re-allocates the same sizes every step
// (activations, gradients), and glibc answers large requests with mmap/munmap and
// consolidation. Blocks are kept per exact (rounded) size up to a byte budget.
CpuBlockCache::CpuBlockCache() {
  // A whole number of MiB, as the name says: "1g" is refused, not read as 1.
  budget_ = static_cast<std::size_t>(env::integer("PHALANX_CPU_CACHE_MB", std::int64_t(budget_ >> 20), 0,
                                                 std::int64_t(1) << 24, "a whole number of MiB")) << 20;
}
CpuBlockCache::~CpuBlockCache() { release_all(); }

void* CpuBlockCache::take(std::size_t rounded) {
  if (rounded < kMinCached) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_.find(rounded);
  if (it == free_.end() || it->second.empty()) return nullptr;
  void* p = it->second.back();
  it->second.pop_back();
  cached_ -= rounded;
  return p;
}

bool CpuBlockCache::give(void* p, std::size_t rounded) {
  if (rounded < kMinCached) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (cached_ + rounded > budget_) return false;
  free_[rounded].push_back(p);
  cached_ += rounded;
  return true;
}

void CpuBlockCache::release_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, blocks] : free_)
    for (void* p : blocks) std::free(p);
  free_.clear();
  cached_ = 0;
}

std::size_t CpuBlockCache::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

namespace {
std::size_t round_up(std::size_t nbytes) {
  return (std::max<std::size_t>(nbytes, 1) + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

void* CpuAllocator::allocate(std::size_t nbytes) {
  const std::size_t rounded = round_up(nbytes);
  if (void* p = cache_.take(rounded)) {
    count_allocation(rounded);
    return p;
  }
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) {
    cache_.release_all();  // give cached blocks back and try once more
    p = std::aligned_alloc(kAlign, rounded);
    if (!p) throw std::bad_alloc();
  }
  count_allocation(rounded);
  return p;
}
void CpuAllocator::deallocate(void* p, std::size_t nbytes) {
  const std::size_t rounded = round_up(nbytes);
  g_allocated.fetch_sub(rounded, std::memory_order_relaxed);
  if (!cache_.give(p, rounded)) std::free(p);
}
}  // namespace phalanx
