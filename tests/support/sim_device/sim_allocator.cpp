#include "sim_allocator.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "phalanx/core/error.hpp"

namespace phalanx::sim {

namespace {
constexpr std::size_t kAlign = 64;  // as the CPU allocator: same vector paths in the kernels
constexpr unsigned char kPoison = 0xFF;

std::size_t round_up(std::size_t n) { return (std::max<std::size_t>(n, 1) + kAlign - 1) / kAlign * kAlign; }

[[noreturn]] void die(const char* what, std::uintptr_t addr) {
  std::fprintf(stderr, "phalanx sim device: %s (block 0x%llx)\n", what,
               static_cast<unsigned long long>(addr));
  std::abort();
}

bool poisoned(std::uintptr_t addr, std::size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(addr);
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != kPoison) return false;
  return true;
}
}  // namespace

Allocator& Allocator::instance() {
  static Allocator* a = new Allocator;  // never destroyed: storages may die during exit
  return *a;
}

void* Allocator::allocate(std::size_t nbytes) {
  const std::size_t size = round_up(nbytes);
  void* p = std::aligned_alloc(kAlign, size);
  if (!p) throw std::bad_alloc();
  std::memset(p, kPoison, size);  // uninitialised memory reads as NaN / -1
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  if (addr & kTag) die("the host handed out an address with the tag bit set", addr);
  std::lock_guard<std::mutex> lock(mu_);
  live_[addr] = size;
  live_bytes_ += size;
  return reinterpret_cast<void*>(addr | kTag);
}

void Allocator::deallocate(void* tagged, std::size_t) {
  const auto t = reinterpret_cast<std::uintptr_t>(tagged);
  if (!(t & kTag)) die("deallocate of a pointer that is not a sim pointer", t);
  const std::uintptr_t addr = t & ~kTag;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(addr);
  if (it == live_.end()) die("deallocate of a block that is not live (a double free?)", addr);
  const std::size_t size = it->second;
  live_.erase(it);
  live_bytes_ -= size;
  std::memset(reinterpret_cast<void*>(addr), kPoison, size);
  quarantine_.push_back({addr, size});
  quarantined_bytes_ += size;
  evict_locked();
}

void Allocator::evict_locked() {
  while (quarantined_bytes_ > kQuarantineBytes && !quarantine_.empty()) {
    const Freed f = quarantine_.front();
    quarantine_.pop_front();
    quarantined_bytes_ -= f.size;
    if (!poisoned(f.addr, f.size)) die("a freed block was written after it was freed", f.addr);
    std::free(reinterpret_cast<void*>(f.addr));
  }
}

void* Allocator::host(const void* tagged, std::size_t nbytes, const char* what) const {
  const auto t = reinterpret_cast<std::uintptr_t>(tagged);
  if (!(t & kTag))
    throw ValueError(detail::concat("sim device: ", what, " got a host pointer where a sim pointer belongs (",
                                    tagged, "); a tensor on the wrong device?"));
  const std::uintptr_t addr = t & ~kTag;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(addr);
  if (it != live_.begin()) {
    --it;
    if (addr >= it->first && addr + nbytes <= it->first + it->second) return reinterpret_cast<void*>(addr);
  }
  throw ValueError(detail::concat("sim device: ", what, " touches ", nbytes, " bytes at ", tagged,
                                  ", outside every live sim block (freed memory or an overrun)"));
}

int Allocator::freed_block_poisoned(const void* tagged) const {
  const std::uintptr_t addr = reinterpret_cast<std::uintptr_t>(tagged) & ~kTag;
  std::lock_guard<std::mutex> lock(mu_);
  for (const Freed& f : quarantine_)
    if (addr >= f.addr && addr < f.addr + f.size) return poisoned(f.addr, f.size) ? 1 : 0;
  return -1;
}

std::size_t Allocator::live_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.size();
}

std::size_t Allocator::live_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_bytes_;
}

}  // namespace phalanx::sim
