#pragma once
// Exact mode's reducer (docs/exact.md). Each backward is one micro-batch: its gradients are
// kept (float32, on the parameters' device) and their per-parameter maxima recorded. The
// backward of the rank's last micro-batch of a step then agrees on one power-of-two scale
// per parameter (an allreduce MAX of the maxima; a max is exact in any order), converts every
// kept micro-batch gradient to int64 fixed point with it, sums them (exact, so associative),
// allreduces the int64 sums, and writes sum / scale / micro_batches into each .grad() once.
// Every float operation is per micro-batch or per element of the final sum, so the result
// does not depend on which rank computed which micro-batch: the same bits on any world size.
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

  /// After a forward in grad mode: one micro-batch's backward is expected.
  void arm(const Tensor& output);
  std::int64_t micro_batches_per_rank() const { return per_rank_; }

 private:
  std::int64_t per_rank_ = 0;
  struct State;
  std::unique_ptr<State> state_;  // the implementation's (exact_reducer.cpp)
};

}  // namespace phalanx::parallel
