#pragma once
// The sim device's memory: host blocks behind tagged pointers the host cannot dereference.
// Every block handed out is filled with 0xFF (a NaN in every float type) so that a read of
// memory nobody wrote shows; a freed block is poisoned again and kept in a quarantine, where
// a later write to it is caught when it leaves; pointers are range-checked against the live
// blocks on every copy and kernel call.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>

namespace phalanx::sim {

/// Bit 55: non-canonical on x86-64 with 4-level paging, the kernel half on AArch64 (its
/// top-byte-ignore covers bits 56-63 only), and unmapped user space with 5-level paging, so
/// a host dereference of a tagged pointer faults at once everywhere.
constexpr std::uintptr_t kTag = std::uintptr_t(1) << 55;

inline bool is_tagged(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & kTag) != 0; }

class Allocator {
 public:
  static Allocator& instance();

  void* allocate(std::size_t nbytes);              ///< returns a tagged pointer
  void deallocate(void* tagged, std::size_t nbytes);  ///< aborts on a pointer it did not hand out
  /// The host address of [tagged, tagged + nbytes): throws ValueError naming `what` when
  /// the range is not inside one live block (a host pointer, a freed or foreign block, an
  /// overrun).
  void* host(const void* tagged, std::size_t nbytes, const char* what) const;

  /// Test hooks: 1 when the freed block at `tagged` is quarantined with its poison intact,
  /// 0 when it was written after the free, -1 when it is not in the quarantine.
  int freed_block_poisoned(const void* tagged) const;
  std::size_t live_blocks() const;
  std::size_t live_bytes() const;

 private:
  struct Freed {
    std::uintptr_t addr;
    std::size_t size;
  };
  void evict_locked();
  mutable std::mutex mu_;
  std::map<std::uintptr_t, std::size_t> live_;  // host address -> rounded size
  std::deque<Freed> quarantine_;
  std::size_t live_bytes_ = 0, quarantined_bytes_ = 0;
  static constexpr std::size_t kQuarantineBytes = std::size_t(64) << 20;
};

}  // namespace phalanx::sim
