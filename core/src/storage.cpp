#include "phalanx/core/storage.hpp"

#include "phalanx/core/kernels.hpp"

namespace phalanx {

Storage::Storage(std::size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  data_ = kernels_for(device).allocate(nbytes, device.index);
}

Storage::~Storage() {
  if (data_) kernels_for(device_).deallocate(data_, nbytes_, device_.index);
}

}  // namespace phalanx
