#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "phalanx/core/device.hpp"

namespace phalanx {

/// A block of device memory with shared ownership. Tensors are views into a Storage.
class Storage {
 public:
  /// Allocates `nbytes` on `device` through that device's kernel table.
  Storage(std::size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  /// CPU storage over bytes [offset, offset + nbytes) of the file at `path`, mapped
  /// copy-on-write: the pages are the host's page cache, shared by every process that maps
  /// the file, and a write (an in-place op) gives the writing process a private copy of
  /// the page it touches; the file itself never changes. The mapping lives as long as the
  /// storage. `offset` must be a multiple of 64 (the CPU allocator's alignment); the
  /// file must hold offset + nbytes bytes. Errors are IoErrors naming the file.
  /// A file truncated by someone else while mapped faults on access (SIGBUS): map only
  /// files that are replaced by rename, never rewritten in place.
  static std::shared_ptr<Storage> map_file(const std::string& path, std::size_t offset, std::size_t nbytes);
  /// As map_file, over the open, readable descriptor `fd` (not closed; the mapping outlives
  /// it), so a caller that opened and checked a file maps that very file and not whatever
  /// the path names by then. `what` names the file in errors.
  static std::shared_ptr<Storage> map_fd(int fd, const std::string& what, std::size_t offset, std::size_t nbytes);

  /// A non-owning view of `nbytes` at `data` on `device` (memory someone else owns): the
  /// storage never frees it and holds `keep_alive` (typically the owning Storage) until it
  /// is destroyed. A device plugin uses it to hand its memory to the CPU kernels as CPU
  /// tensors (tests/support/sim_device); `data` must stay valid while `keep_alive` lives.
  static std::shared_ptr<Storage> borrow(void* data, std::size_t nbytes, Device device,
                                         std::shared_ptr<const void> keep_alive);

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  /// True for a file mapping (map_file, map_fd).
  bool mapped() const { return map_base_ != nullptr; }
  /// True for a borrowed view (borrow): the memory belongs to someone else.
  bool borrowed() const { return borrowed_; }

 private:
  Storage() = default;
  void* data_ = nullptr;
  std::size_t nbytes_ = 0;
  Device device_;
  void* map_base_ = nullptr;  // the whole mapping (page aligned), when mapped()
  std::size_t map_len_ = 0;
  bool borrowed_ = false;
  std::shared_ptr<const void> keep_alive_;  // what a borrowed view keeps alive
};

}  // namespace phalanx
