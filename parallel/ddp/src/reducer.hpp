#pragma once
// The Reducer: DDP's gradient buckets and their life cycle in one backward pass
// (docs/ddp.md). Parameters' gradients live in their bucket's flat buffer; the autograd
// hook of each parameter marks it ready; a full bucket is handed to the comm hook at once,
// buckets strictly in index order (so every rank issues the same collectives in the same
// order); the last bucket, which carries the step flag, at the end of backward, whose
// callback then waits for all of them. A pass that stops part-way on one rank sends its
// remaining buckets void (flag set), so every rank's pass fails and the ranks stay in step;
// a bad cross_entropy label writes the same flag on the device (label_flag.hpp), so every
// rank raises the label error together. Buckets, views and the flag live on the parameters'
// device; the host reads only the flag (one element, copied back) once per step, after the
// buckets' own waits.
#include <chrono>
#include <string>
#include <unordered_map>
#include <vector>

#include "grad_reducer.hpp"
#include "phalanx/core/label_flag.hpp"

namespace phalanx::parallel {

class Reducer final : public GradReducer {
 public:
  Reducer(std::vector<std::pair<std::string, Tensor>> named_params, ProcessGroupPtr pg,
          const DDPOptions& options);
  ~Reducer() override;

  /// With find_unused_parameters, walks the graph from `output` to find the parameters it
  /// does not reach.
  void arm(const Tensor& output) override;
  void set_sync(bool on) override { sync_ = on; }
  bool sync() const override { return sync_; }
  void set_hook(CommHookPtr hook) override;
  double last_wait_seconds() const override { return last_wait_; }
  double last_comm_seconds() const override { return last_comm_; }
  /// Every bucket zero-filled (pass flag 0), launched in order and completed.
  void shadow_pass() override;

 private:
  void on_grad_ready(std::size_t param);
  void adopt_into_bucket(std::size_t param);
  void mark_ready(std::size_t param);
  void launch_in_order();
  /// The comm hook's launch / finish of one bucket, with their timeline events.
  void launch_bucket(GradBucket& b);
  void finish_bucket(GradBucket& b);
  void finalize() override;
  void reset_pass();
  void abandon_pass();
  /// Launches the buckets not yet launched, zero-filled, with the pass flag set.
  void launch_void_rest();
  /// Finishes the launched buckets; the first communication error (its bucket in *failed).
  std::exception_ptr finish_launched(std::size_t* failed);
  /// A pass that cannot end normally: launch_void_rest, then finish_launched; the first
  /// communication error (a failed launch wins), its bucket in *failed.
  std::exception_ptr drain_pass(std::size_t* failed);
  void set_pass_flag(float value);
  float pass_flag() const;
  /// Makes this reducer's flag this thread's label sink (the forward's loss comes next).
  void install_label_sink();
  void before_forward() override { install_label_sink(); }
  /// Throws the error the reduced step flag says every rank raises, if any.
  void raise_flagged(float flag, const char* who) const;

  Device device_;                       // the parameters' device: buckets live there
  Tensor flag_;                         // the step flag: the last bucket's last element
  std::shared_ptr<detail::LabelFlagSink> sink_;  // the step flag as cross_entropy's label sink
  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  ProcessGroupPtr pg_;
  CommHookPtr hook_;
  std::vector<GradBucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // parameter -> bucket
  std::vector<Tensor> views_;           // parameter -> its slice of the bucket buffer
  std::vector<int> pending_;            // bucket -> parameters not yet ready in this pass
  std::vector<char> ready_;             // parameter -> ready in this pass
  std::vector<char> unused_;            // parameter -> not reached by the last forward
  std::unordered_map<const TensorImpl*, std::size_t> index_;  // parameter identity -> index
  std::size_t next_launch_ = 0;
  bool find_unused_;
  bool sync_ = true;
  bool armed_ = false;
  bool in_pass_ = false;
  bool hook_used_ = false;
  std::chrono::steady_clock::time_point first_launch_;
  double last_wait_ = 0, last_comm_ = 0;
  // finalize: the buckets' Works whose wait() was a device-side wait (a backend that orders
  // device streams, NCCL): checked on the host once the pass flag's read synchronised.
  std::vector<WorkPtr> device_works_;
};

}  // namespace phalanx::parallel
