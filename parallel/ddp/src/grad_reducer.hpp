#pragma once
// The gradient reducer DDP drives: the bucketed one (reducer.hpp: each bucket reduced as
// soon as backward fills it) or exact mode's (exact_reducer.hpp: the step's micro-batches
// summed in 64-bit fixed point). DDP arms it after each forward, asks it what it can do,
// and never asks which one it is. The per-gradient hooks and the bucket copies stay each
// reducer's own non-virtual code: the virtual calls are per forward (arm) and per backward
// (finalize), never per gradient or element.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "phalanx/parallel/ddp.hpp"

namespace phalanx::parallel {

/// Parameter indices (into the reduced parameters) per bucket, bucket 0 first.
using BucketLayout = std::vector<std::vector<std::size_t>>;

/// The one bucket rule, both reducers': parameters in reverse registration order (the order
/// backward produces their gradients), the first bucket closing at first_bucket_mb of
/// float32 gradients (the last layers: small, so its reduction starts early), the others at
/// bucket_cap_mb; a parameter larger than the cap gets a bucket of its own.
BucketLayout bucket_layout(const std::vector<Tensor>& params, const DDPOptions& options);

class GradReducer {
 public:
  virtual ~GradReducer() = default;
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  /// After a forward in grad mode: a backward is expected. `output` is the forward's
  /// result (find_unused_parameters walks the graph from it).
  virtual void arm(const Tensor& output) = 0;
  /// Before a DDP forward in grad mode, on its thread (a loss inside the forward included):
  /// the reducer's label sink becomes active there (label_flag.hpp).
  virtual void before_forward() {}
  const BucketLayout& layout() const { return layout_; }

  // What the reducer can do. Each check throws the one-line error that says what to do
  // where this reducer cannot (docs/errors.md), and returns otherwise; DDP checks before it
  // calls the operation, so a reducer never receives one it refused.
  /// Join's shadowing of the others' reductions (ConfigError).
  virtual void check_join() const {}
  /// no_sync() (ConfigError).
  virtual void check_no_sync() const {}
  /// A comm hook (ConfigError naming `hook`, which may be null).
  virtual void check_comm_hook(const CommHookPtr& hook) const { (void)hook; }
  /// A forward whose first tensor argument has `samples` rows (-1: none) that a backward
  /// will follow (ShapeError).
  virtual void check_forward(std::int64_t samples) const { (void)samples; }

  // The operations behind those capabilities; a reducer without one keeps these defaults.
  virtual void set_sync(bool on) { (void)on; }
  virtual bool sync() const { return true; }
  virtual void set_hook(CommHookPtr hook) { (void)hook; }
  /// Join: a joined rank's part of one backward of the others.
  virtual void shadow_pass() {}

  /// Backward passes per rank and optimizer step (exact mode's micro-batches; 0: any).
  virtual std::int64_t micro_batches_per_rank() const { return 0; }
  /// The last backward's wait for communication at its end, and its communication time.
  virtual double last_wait_seconds() const { return 0; }
  virtual double last_comm_seconds() const { return 0; }

 protected:
  GradReducer() = default;
  /// Lays the buckets out over `params` (the reduced ones, in registration order) by the
  /// one rule, once, at construction.
  const BucketLayout& lay_out_buckets(const std::vector<Tensor>& params, const DDPOptions& options) {
    layout_ = bucket_layout(params, options);
    return layout_;
  }
  /// The end of backward, queued by the pass's first gradient: the reductions' last
  /// launches and the wait for them.
  virtual void finalize() = 0;

  /// Registers `on_ready(p)` as parameter p's gradient-accumulated hook for every p: the
  /// reducer's own non-virtual per-gradient code (the hook calls it directly).
  template <typename OnReady>
  void attach_grad_hooks(const std::vector<Tensor>& params, OnReady on_ready) {
    hooked_ = params;
    for (std::size_t p = 0; p < params.size(); ++p)
      hook_ids_.push_back(hooked_[p].register_grad_accumulated_hook([on_ready, p](const Tensor&) { on_ready(p); }));
  }
  /// Removes those hooks and the parameters' gradient destinations; the first thing a
  /// reducer's destructor does (the hooks call into it).
  void detach_grad_hooks() noexcept;

 private:
  BucketLayout layout_;
  std::vector<Tensor> hooked_;
  std::vector<std::uint64_t> hook_ids_;
};

/// The reducer for `options` on `pg`: exact mode's on any world size (it refuses a model
/// with buffers: ConfigError), the bucketed one on more than one rank, none (null: DDP is a
/// pass-through) otherwise. `share` makes the replicas equal before the reducer is built
/// (the model check and rank 0's broadcast, of the buffers too when `with_buffers`); it is
/// not called on one rank.
std::unique_ptr<GradReducer> make_grad_reducer(const nn::Module& module, const ProcessGroupPtr& pg,
                                               const DDPOptions& options,
                                               const std::function<void(bool with_buffers)>& share);

}  // namespace phalanx::parallel
