#pragma once
// Where cross_entropy reports a label outside [0, classes) while a DDP reducer runs a step
// on this thread (docs/ddp.md, "The step flag"). Without a sink the label check raises its
// ValueError on this rank alone (CPU: at once; CUDA: at the next read to the host). With one,
// the check writes `value` into the sink's device flag instead, on the device and without a
// host round trip, and the step goes on (the bad rows' loss is garbage, their gradient
// finite): the reducer reduces that flag with the last gradient bucket, so every rank learns
// of it at the same point and raises the same error before any optimizer step.
#include <memory>

#include "phalanx/core/tensor.hpp"

namespace phalanx::detail {

struct LabelFlagSink {
  Tensor flag;                         ///< one float32 element on the labels' device
  float value = 1.f;                   ///< written (overwriting) when a label is bad
  std::weak_ptr<const void> owner;     ///< the sink is ignored once its owner is gone
};

/// Installs `sink` as this thread's (replacing any); an empty one removes it.
void set_label_flag_sink(LabelFlagSink sink);
/// This thread's sink whose owner is alive and whose flag is on `device`; null otherwise.
const LabelFlagSink* label_flag_sink(const Device& device);
/// The sink of the label check now running on this thread (cross_entropy in grad mode, inside
/// DeviceKernels::find_label_out_of_range), else null: a deferring device writes its flag.
const LabelFlagSink* label_flag_for_check();

}  // namespace phalanx::detail
