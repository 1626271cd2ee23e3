#pragma once
#include <cstdint>
#include <string>

namespace phalanx {

/// Sim is the test accelerator (tests/support/sim_device): host memory behind its own
/// allocator that the host may never read directly; it proves device-generic code on CPU CI.
enum class DeviceType : std::uint8_t { CPU = 0, CUDA = 1, Sim = 2 };
constexpr int kNumDeviceTypes = 3;

/// Where a tensor's storage lives. CPU is built in; CUDA (and, for tests, Sim) arrive through
/// device plugins.
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  static Device sim(int i = 0) { return {DeviceType::Sim, i}; }
  /// Parses "cpu", "cuda", "cuda:1", "sim", "sim:1".
  static Device parse(const std::string& text);
  bool is_cpu() const { return type == DeviceType::CPU; }
  std::string str() const;
  friend bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
  friend bool operator!=(Device a, Device b) { return !(a == b); }
};

}  // namespace phalanx
