#pragma once
// Communication hooks: how DDP reduces one bucket of gradients. A hook starts the
// communication in launch() (called from the autograd hook as soon as the bucket is full,
// so it overlaps the rest of backward) and completes it in finish() (called at the end of
// backward), leaving the MEAN over ranks in bucket.buffer.
#include <memory>
#include <string>
#include <vector>

#include "phalanx/backends/process_group.hpp"

namespace phalanx::parallel {

/// One bucket: a flat float32 buffer that holds its parameters' gradients back to back.
struct GradBucket {
  std::size_t index = 0;
  Tensor buffer;                       ///< [numel], the gradients live here (views)
  std::vector<std::size_t> params;     ///< indices into the model's parameters
  std::vector<std::int64_t> offsets;   ///< element offset of each parameter's gradient
  WorkPtr work;                        ///< the hook's in-flight operation
  Tensor scratch;                      ///< hook-owned scratch (e.g. the compressed copy)
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  /// Starts reducing bucket.buffer (asynchronously: do not wait here).
  virtual void launch(ProcessGroup& pg, GradBucket& bucket) = 0;
  /// Waits for it and leaves the mean over ranks in bucket.buffer.
  virtual void finish(ProcessGroup& pg, GradBucket& bucket) = 0;
};

using CommHookPtr = std::shared_ptr<CommHook>;

/// The default: allreduce the float32 sum, then divide by the world size once (one
/// rounding, exact when the world size is a power of two).
CommHookPtr allreduce_hook();
/// Compression: divide by the world size, round to float16 (or bfloat16), allreduce the
/// 16-bit sum, widen back into the bucket. Halves the bytes on the wire.
CommHookPtr fp16_compress_hook();
CommHookPtr bf16_compress_hook();

}  // namespace phalanx::parallel
