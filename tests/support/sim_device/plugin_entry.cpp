// The sim device plugin's entry point (tests only, never installed): registers the sim
// kernel table for DeviceType::Sim. PHALANX_SIM_UNAVAILABLE=<reason> makes the probe fail,
// so tests can check the error a missing device gives. PHALANX_SIM_ASYNC picks the mode
// (sim_stream.hpp; docs/devices.md). Test hooks are exported below.
#include <cstdio>
#include <cstdlib>

#include "phalanx/core/plugin_abi.h"
#include "sim_allocator.hpp"
#include "sim_kernels.hpp"
#include "sim_side_stream.hpp"
#include "sim_stream.hpp"

namespace {

int probe(char* reason, size_t len) {
  if (const char* why = std::getenv("PHALANX_SIM_UNAVAILABLE")) {
    std::snprintf(reason, len, "PHALANX_SIM_UNAVAILABLE is set (%s)", why);
    return 0;
  }
  return 1;
}

void* create(const void*, char* error, size_t len) {
  try {
    (void)phalanx::sim::mode_from_env();  // a bad PHALANX_SIM_ASYNC fails here, with its ConfigError
    phalanx::register_device_kernels(phalanx::DeviceType::Sim, &phalanx::sim::table());
    return &phalanx::sim::table();
  } catch (const std::exception& e) {
    std::snprintf(error, len, "%s", e.what());
    return nullptr;
  }
}

const phalanx_plugin_descriptor kDescriptor = {
    PHALANX_PLUGIN_ABI_VERSION, "sim", "device",
    "test accelerator: host memory behind tagged pointers, poisoned when freed, CPU kernels",
    &probe, &create, nullptr};

}  // namespace

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

SIM_EXPORT const phalanx_plugin_descriptor* phalanx_plugin_entry(void) { return &kDescriptor; }

/// 1: the freed block holding `ptr` is quarantined with its poison intact; 0: it was
/// written after the free; -1: not in the quarantine.
SIM_EXPORT int phalanx_sim_freed_block_poisoned(const void* ptr) {
  return phalanx::sim::Allocator::instance().freed_block_poisoned(ptr);
}
/// Live (allocated, not freed) blocks and bytes: leak checks.
SIM_EXPORT size_t phalanx_sim_live_blocks(void) { return phalanx::sim::Allocator::instance().live_blocks(); }
SIM_EXPORT size_t phalanx_sim_live_bytes(void) { return phalanx::sim::Allocator::instance().live_bytes(); }
/// The tag bit every sim pointer carries.
SIM_EXPORT unsigned long long phalanx_sim_tag(void) { return phalanx::sim::kTag; }
/// The mode (0 synchronous, 1 eager, 2 lazy): the queue is drained first. Returns the old one.
SIM_EXPORT int phalanx_sim_set_async(int mode) {
  auto& s = phalanx::sim::Stream::instance();
  const int old = static_cast<int>(s.mode());
  s.set_mode(static_cast<phalanx::sim::Mode>(mode));
  return old;
}
/// Kernels, copies and frees queued on the compute stream and not yet run.
SIM_EXPORT size_t phalanx_sim_pending(void) { return phalanx::sim::Stream::instance().pending(); }

// The side stream (sim_side_stream.hpp), for a test backend that orders device streams
// itself as NCCL does: `event` is a sim event (DeviceKernels::event_handle of the sim's).
/// Queues `*fn` on the side stream (moved from).
SIM_EXPORT void phalanx_sim_side_submit(std::function<void()>* fn) {
  phalanx::sim::SideStream::instance().submit(std::move(*fn));
}
/// The side stream waits (on the device) for `event`, recorded on the compute stream.
SIM_EXPORT void phalanx_sim_side_wait_event(void* event) {
  const std::uint64_t t = static_cast<phalanx::sim::SimEvent*>(event)->ticket;
  if (t) phalanx::sim::SideStream::instance().submit([t] { phalanx::sim::Stream::instance().wait_ticket(t); });
}
/// Records `event` on the side stream.
SIM_EXPORT void phalanx_sim_side_record(void* event) {
  *static_cast<phalanx::sim::SimEvent*>(event) = phalanx::sim::SimEvent{phalanx::sim::SideStream::instance().ticket(), true};
}
/// Lets everything queued on the side stream run (no wait).
SIM_EXPORT void phalanx_sim_side_flush(void) { phalanx::sim::SideStream::instance().flush(); }
/// Waits until everything queued on the side stream ran; rethrows an item's error.
SIM_EXPORT void phalanx_sim_side_drain(void) {
  auto& s = phalanx::sim::SideStream::instance();
  s.wait_ticket(s.ticket());
}
