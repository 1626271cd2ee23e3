#pragma once
// Exact mode's reducer (docs/exact.md). Each backward is one micro-batch: its gradients are
// kept (float32, on the parameters' device: micro-batch j of the step writes straight into
// slot j, a flat buffer) and their per-parameter maxima recorded as they are produced.
// During the rank's last micro-batch of a step each bucket's maxima go out in an allreduce
// MAX as soon as its gradients are in (in bucket order, without waiting; on an accelerator
// at the end of backward), the last bucket's with a flag slot that voids the step on every
// rank when one rank's backward stopped part-way (a max is exact in any order). At the end
// of backward every rank derives the same power-of-two scale per parameter from the agreed
// maxima, converts every kept micro-batch gradient to int64 fixed point with it, sums them
// (exact, so associative) into int64 buffers, allreduces them, and writes sum / scale /
// micro_batches into each .grad() once (the last slot, which then holds the step's
// gradients). On the CPU with shared memory (inline, on every rank: agreed at construction)
// or one worker this runs in 256 KiB chunks that stay in cache from conversion to
// conversion back; otherwise one allreduce per bucket,
// launched as soon as it is converted, while the next one is converted. Every float
// operation is per micro-batch or per element of the final sum, so the result does not
// depend on which rank computed which micro-batch: the same bits on any world size.
// Everything runs on the parameters' device through its kernel table; only the maxima
// (one float per parameter) travel to the host, to choose the scales.
#include <memory>
#include <string>
#include <vector>

#include "phalanx/parallel/ddp.hpp"

namespace phalanx::parallel {

class ExactReducer {
 public:
  /// Throws ConfigError when the world size does not divide the number of micro-batches,
  /// or the micro-batch does not divide the global batch.
  ExactReducer(std::vector<std::pair<std::string, Tensor>> named_params, ProcessGroupPtr pg,
               const DDPOptions& options);
  ~ExactReducer();
  ExactReducer(const ExactReducer&) = delete;
  ExactReducer& operator=(const ExactReducer&) = delete;

  /// After a forward in grad mode: one micro-batch's backward is expected. The step's first
  /// micro-batch clears .grad(). When the previous backward stopped part-way, completes that
  /// step as void on every rank (one collective) and throws AutogradError.
  void arm(const Tensor& output);
  std::int64_t micro_batches_per_rank() const { return per_rank_; }
  /// Bucket layout (parameter indices per int64 bucket), for inspection and tests.
  std::vector<std::vector<std::size_t>> layout() const;

 private:
  std::int64_t per_rank_ = 0;
  struct State;
  std::unique_ptr<State> state_;  // the implementation's (exact_reducer.cpp)
};

}  // namespace phalanx::parallel
