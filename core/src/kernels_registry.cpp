#include <array>

#include "phalanx/core/kernels.hpp"

namespace phalanx {

DeviceKernels& cpu_kernels();  // core/src/cpu/cpu_kernels.cpp

namespace {
std::array<DeviceKernels*, kNumDeviceTypes>& table() {
  static std::array<DeviceKernels*, kNumDeviceTypes> t{&cpu_kernels(), nullptr};
  return t;
}
}  // namespace

DeviceKernels& kernels_for(Device device) {
  DeviceKernels* k = table()[static_cast<int>(device.type)];
  if (!k)
    throw TypeError("no kernels for device " + device.str() +
                    ": the CUDA device plugin (libphalanx_cuda.so) is not loaded; build Phalanx "
                    "with CUDA and load it, or use PHALANX_DEVICE=cpu");
  return *k;
}

void register_device_kernels(DeviceType type, DeviceKernels* k) {
  table()[static_cast<int>(type)] = k;
}

}  // namespace phalanx
