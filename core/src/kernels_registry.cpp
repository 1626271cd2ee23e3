#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "kernel_checks.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/plugin_loader.hpp"

namespace phalanx {

DeviceKernels& cpu_kernels();  // core/src/cpu/cpu_kernels.cpp

namespace {
// Read on every kernel call from any thread, written once when a device plugin loads: the
// slots are atomics (an acquire load is a plain load on x86 and ARMv8's ldar), and loading
// a plugin is serialised by load_mu.
using Table = std::array<std::atomic<DeviceKernels*>, kNumDeviceTypes>;
Table& table() {
  static Table* t = [] {
    auto* tbl = new Table;  // never destroyed: kernels may run during static destruction
    for (auto& slot : *tbl) slot.store(nullptr, std::memory_order_relaxed);
    (*tbl)[static_cast<int>(DeviceType::CPU)].store(with_boundary_checks(DeviceType::CPU, &cpu_kernels()), std::memory_order_release);
    return tbl;
  }();
  return *t;
}
std::mutex load_mu;
}  // namespace

DeviceKernels& kernels_for(Device device) {
  auto& slot = table()[static_cast<int>(device.type)];
  DeviceKernels* k = slot.load(std::memory_order_acquire);
  if (k) return *k;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(load_mu);
    k = slot.load(std::memory_order_acquire);
    if (!k && load_device_plugin(device.type, &reason)) k = slot.load(std::memory_order_acquire);
  }
  if (!k)
    throw TypeError("no kernels for device " + device.str() + ": " + reason +
                    " (use the CPU: PHALANX_DEVICE=cpu / --device cpu)");
  return *k;
}

void DeviceKernels::gemm_bf16(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const std::uint16_t*,
                              std::int64_t, const std::uint16_t*, std::int64_t, float, void*, std::int64_t, bool) {
  throw TypeError(std::string("bfloat16 matrix products are not supported on the ") + name() +
                  " device yet; compute in float32 there, or on the CPU");
}

void DeviceKernels::sgd_update_group(const std::vector<SgdGroupEntry>& params, const SgdUpdate& u) {
  SgdUpdate one = u;
  for (const SgdGroupEntry& e : params) {
    one.first_step = e.first_step;
    sgd_update(*e.param, *e.grad, *e.momentum_buffer, one);
  }
}

void DeviceKernels::adam_update_group(const std::vector<AdamGroupEntry>& params) {
  for (const AdamGroupEntry& e : params) adam_update(*e.param, *e.grad, *e.exp_avg, *e.exp_avg_sq, *e.max_exp_avg_sq, e.u);
}

void register_device_kernels(DeviceType type, DeviceKernels* k) {
  table()[static_cast<int>(type)].store(with_boundary_checks(type, k), std::memory_order_release);
}

}  // namespace phalanx
