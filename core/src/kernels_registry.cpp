#include <array>
#include <mutex>
#include <string>

#include "phalanx/core/kernels.hpp"

namespace phalanx {

DeviceKernels& cpu_kernels();  // core/src/cpu/cpu_kernels.cpp
// Loads the device plugin for `type` (libphalanx_cuda.so) through the plugin registry
// (backends/src/plugin_registry.cpp); returns false with the reason.
bool load_device_plugin(DeviceType type, std::string* reason);

namespace {
std::array<DeviceKernels*, kNumDeviceTypes>& table() {
  static std::array<DeviceKernels*, kNumDeviceTypes> t{&cpu_kernels(), nullptr};
  return t;
}
}  // namespace

DeviceKernels& kernels_for(Device device) {
  DeviceKernels* k = table()[static_cast<int>(device.type)];
  if (!k) {
    std::string reason;
    if (load_device_plugin(device.type, &reason)) k = table()[static_cast<int>(device.type)];
    if (!k)
      throw TypeError("no kernels for device " + device.str() + ": " + reason +
                      " (use the CPU: PHALANX_DEVICE=cpu / --device cpu)");
  }
  return *k;
}

void register_device_kernels(DeviceType type, DeviceKernels* k) {
  table()[static_cast<int>(type)] = k;
}

}  // namespace phalanx
