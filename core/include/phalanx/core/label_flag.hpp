#pragma once
// Where cross_entropy reports a label outside [0, classes) while a DDP reducer runs a step
// on this thread (docs/ddp.md, "The step flag"). Without an active sink the label check
// raises its ValueError on this rank alone (CPU: at once; CUDA: at the next read to the
// host). With one, the check writes `value` into the sink's device flag instead, on the
// device and without a host round trip, and the step goes on (the bad rows' loss is garbage,
// their gradient finite): the reducer reduces that flag with the last gradient bucket, so
// every rank learns of it at the same point and raises the same error before any optimizer
// step.
//
// A reducer owns its sink and registers it on the threads that run its forward (this thread
// keeps only a weak reference: nothing outlives the reducer). A sink is active from the DDP
// forward in grad mode until the reducer has read the flag (the end of that step's backward):
// a loss outside that window (a plain model, or after the step) raises at once. A bad label
// writes every active sink on the labels' device (two DDP models stepping on one thread: both
// steps fail, neither silently steps on a loss whose labels were replaced).
#include <atomic>
#include <memory>
#include <vector>

#include "phalanx/core/tensor.hpp"

namespace phalanx::detail {

struct LabelFlagSink {
  Tensor flag;                      ///< one float32 element on the labels' device
  float value = 1.f;                ///< written (overwriting) when a label is bad
  std::atomic<bool> active{false};  ///< set by the DDP forward, cleared once the flag is read
};

/// Registers `sink` on this thread (once; expired ones are dropped).
void add_label_flag_sink(const std::shared_ptr<LabelFlagSink>& sink);
/// This thread's active sinks whose flag is on `device` (valid until the next call).
const std::vector<const LabelFlagSink*>& label_flag_sinks(const Device& device);
/// The sinks of the label check now running on this thread (cross_entropy in grad mode,
/// inside DeviceKernels::find_label_out_of_range), else null: a deferring device writes each
/// one's flag.
const std::vector<const LabelFlagSink*>* label_flag_for_check();

}  // namespace phalanx::detail
