#pragma once
#include <cstdint>
#include <string>

namespace phalanx {

enum class DeviceType : std::uint8_t { CPU = 0, CUDA = 1 };
constexpr int kNumDeviceTypes = 2;

/// Where a tensor's storage lives. CPU is built in; CUDA arrives through the device plugin.
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  /// Parses "cpu", "cuda", "cuda:1".
  static Device parse(const std::string& text);
  bool is_cpu() const { return type == DeviceType::CPU; }
  std::string str() const;
  friend bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
  friend bool operator!=(Device a, Device b) { return !(a == b); }
};

}  // namespace phalanx
