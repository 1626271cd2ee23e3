#pragma once
#include <cstddef>
#include <memory>

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

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  std::size_t nbytes_ = 0;
  Device device_;
};

}  // namespace phalanx
