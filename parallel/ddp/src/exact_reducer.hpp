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
#include <algorithm>
#include <string>
#include <vector>

#include "grad_reducer.hpp"
#include "phalanx/core/label_flag.hpp"

namespace phalanx {
class DeviceKernels;
}

namespace phalanx::parallel {

class ExactReducer final : public GradReducer {
 public:
  /// Throws ConfigError when the world size does not divide the number of micro-batches,
  /// or the micro-batch does not divide the global batch.
  ExactReducer(std::vector<std::pair<std::string, Tensor>> named_params, ProcessGroupPtr pg,
               const DDPOptions& options);
  ~ExactReducer() override;

  /// One micro-batch's backward is expected. The step's first micro-batch clears .grad().
  /// When the previous backward stopped part-way, completes that step as void on every
  /// rank (one collective) and throws AutogradError.
  void arm(const Tensor& output) override;
  std::int64_t micro_batches_per_rank() const override { return per_rank; }

  // Each backward is one micro-batch and the step's last one reduces, in fixed point: no
  // Join, no_sync() or comm hook, and one micro-batch per forward.
  void check_join() const override;
  void check_no_sync() const override;
  void check_comm_hook(const CommHookPtr& hook) const override;
  void check_forward(std::int64_t samples) const override;

 private:
  /// A piece of one parameter: its int64 sums, its gradient in every slot, and its place in
  /// the last slot (the result). On the CPU a parameter is cut into pieces that fit the L2
  /// cache, so zeroing the sums and adding the L slots run while the piece is in cache (one
  /// pass over memory, not L + 1).
  struct Piece {
    std::size_t param;
    Tensor acc;
    std::vector<Tensor> src;  // [slot]
    Tensor out;               // = src.back(): sum / scale / K goes here
  };
  /// The unit of the sums' allreduce: consecutive pieces whose int64 sums are one tensor.
  struct Chunk {
    Tensor acc;
    std::vector<Piece> pieces;
  };
  struct Bucket {
    std::vector<std::size_t> params;  // reverse registration order (the maxima's order)
    Tensor maxima;                 // float32 [params (+1: the step flag, last bucket)] on the device
    std::vector<float> host_max;   // the agreed maxima
    // Unchunked: one chunk, the bucket's own int64 sums. Chunked (CPU, inline shm or W = 1):
    // chunks of kCpuChunk elements over one shared buffer, each reduced and converted back
    // before the next is converted.
    std::vector<Chunk> chunks;
    WorkPtr max_work;              // the maxima's allreduce in flight
    WorkPtr work;                  // the sums' allreduce in flight
    int pending = 0;               // parameters still without their gradient in the last micro-batch
  };

  ProcessGroupPtr pg;
  DeviceKernels* kernels = nullptr;
  std::vector<Tensor> params;
  std::vector<std::string> names;
  std::vector<std::size_t> bucket_of, index_in_bucket;  // parameter -> bucket, its place there
  std::int64_t micro_batches = 0;  // K, all ranks together
  std::int64_t per_rank = 0;       // L = K / world
  std::int64_t micro_batch = 0;    // samples per forward
  int k_bits = 0;                  // K <= 2^k_bits
  std::vector<Tensor> slots;               // L flat float32 buffers: micro-batch j's gradients
  std::vector<std::vector<Tensor>> views;  // [slot][parameter], shaped like the parameter
  std::vector<Bucket> buckets;
  std::vector<double> scales;  // per parameter, this step's
  std::vector<char> ready;     // parameter -> got its gradient in this backward
  std::int64_t micro = 0;      // the step's micro-batch the current/next backward is (0 .. L-1)
  bool armed = false;
  bool in_pass = false;
  bool host_maxima = false;  // the parameters live in host memory (CPU)
  bool chunked = false;      // the sums go chunk by chunk through one cache-sized buffer
  // This step's collective decisions, the same on every rank (they come from agreed maxima).
  std::size_t next_bucket = 0;  // the next bucket whose maxima go out
  std::string nonfinite;        // the first parameter whose agreed max is NaN or Inf
  bool step_void = false;       // some rank's step was void (the last bucket's flag)
  bool bad_label = false;       // some rank's cross_entropy saw a label out of range (the flag: 2)
  std::shared_ptr<detail::LabelFlagSink> sink;  // the step flag as cross_entropy's label sink

  void on_grad_ready(std::size_t p);
  void finalize() override;
  void launch_max(std::size_t b, bool void_rank);
  void reduce_sums();
  void drain();
  void finish_step(bool void_rank);
  void install_label_sink();
  void before_forward() override { install_label_sink(); }
  [[noreturn]] void void_step(const std::string& why);
  void reset_step() {
    micro = 0;
    next_bucket = 0;
    nonfinite.clear();
    step_void = false;
    bad_label = false;
    if (sink) sink->active = false;  // the flag has been read: losses raise at once again
    armed = false;
    in_pass = false;
    std::fill(ready.begin(), ready.end(), 0);
    for (auto& b : buckets) b.pending = static_cast<int>(b.params.size());
  }
  void clear_grads() {
    for (auto& p : params) p.set_grad(Tensor());
  }
  bool last_micro() const { return micro + 1 == per_rank; }
  std::string where() const {
    return detail::concat("micro-batch ", micro + 1, " of ", per_rank, " on rank ", pg->rank());
  }
};

}  // namespace phalanx::parallel
