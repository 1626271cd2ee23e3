#pragma once
// Cross-entropy's label check on CUDA without a copy per step. A kernel raises a flag in pinned
// host memory that the device writes directly; the calling thread reads the flag (a host load,
// no copy) once, when it next reads a result to the host (copy_to_host: the loss read, which
// waits for the device anyway), or when it checks labels again and the previous check has
// finished; a previous check still running is chained into the same flag (up to 8), never
// waited for, so the check adds no host synchronisation per step. Under a DDP step the check
// writes the reducer's step flag on the device instead (flag_into). A bad label then throws the CPU check's ValueError (index and label,
// found by one copy of the labels, on the error path only), at most one step late; until then
// the bad row's loss is NaN (the cross_entropy kernel never reads outside the row).
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "phalanx/core/tensor.hpp"

namespace phalanx::cuda {

class LabelCheck {
 public:
  /// Checks `target` (int64, contiguous, on the current CUDA device) against [0, classes) on
  /// the default stream. Reports this thread's earlier checks first when they have finished
  /// (may throw ValueError); chains onto them while they run.
  void launch(const Tensor& target, std::int64_t classes);
  /// Waits for this thread's pending check, if any; throws ValueError when it saw a bad label.
  void resolve();
  /// The check under a DDP step: writes `value` into `flag` (one float32 on the labels'
  /// device) when a label is outside [0, classes), on the default stream; no host wait, no
  /// pinned slot (the reducer reduces the flag with its last bucket: docs/ddp.md).
  void flag_into(const Tensor& target, std::int64_t classes, const Tensor& flag, float value);

  /// A flag in mapped pinned memory and the event after the kernel that may raise it.
  struct Slot {
    int device = -1;
    int* host = nullptr;    ///< the flag, as the host reads it
    int* mapped = nullptr;  ///< the same flag, as the device writes it
    cudaEvent_t done = nullptr;
  };
  void release(Slot* slot);

 private:
  Slot* acquire(int device);
  std::mutex mu_;
  std::vector<Slot*> free_;  // never freed: a few per thread that ever checked labels
};

}  // namespace phalanx::cuda
