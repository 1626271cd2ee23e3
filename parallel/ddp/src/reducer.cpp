#include "reducer.hpp"
#include "comm_context.hpp"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/label_flag.hpp"
#include "phalanx/core/timeline.hpp"

namespace phalanx::parallel {

using Clock = std::chrono::steady_clock;

Reducer::Reducer(std::vector<std::pair<std::string, Tensor>> named, ProcessGroupPtr pg, const DDPOptions& o)
    : pg_(std::move(pg)), hook_(allreduce_hook()), find_unused_(o.find_unused_parameters()) {
  for (auto& [name, p] : named) {
    if (!p.requires_grad()) continue;
    if (p.dtype() != DType::Float32) throw TypeError("DDP: parameter '" + name + "' is not float32");
    names_.push_back(name);
    params_.push_back(p);
  }
  const std::size_t n = params_.size();
  device_ = n ? params_.front().device() : Device::cpu();  // one device (DDP checked)
  for (std::size_t p = 0; p < n; ++p) index_[params_[p].impl()] = p;
  bucket_of_.resize(n);
  views_.resize(n);
  ready_.assign(n, 0);
  unused_.assign(n, 0);
  const BucketLayout& layout = lay_out_buckets(params_, o);
  for (std::size_t b = 0; b < layout.size(); ++b) {
    GradBucket bucket;
    bucket.index = b;
    std::int64_t total = 0;
    for (std::size_t p : layout[b]) {
      bucket.params.push_back(p);
      bucket.offsets.push_back(total);
      total += params_[p].numel();
    }
    // The last bucket carries one more element after its gradients: the step flag
    // (0 = this rank's step is sound; 1 = its backward stopped part-way and sends no
    // gradients; W + 1 = a cross_entropy label was out of range, written on the device by
    // the label check). Reduced with the gradients (a mean), it is non-zero on every rank
    // when any rank's step was void, at no extra collective, and its sum S = round(mean * W)
    // = void ranks + (W + 1) * bad-label ranks says which.
    // From the group: memory its backend reduces in place where it has such (shm's zero-copy
    // buffers: no staging copies), ordinary zeros elsewhere. Every rank builds the same
    // buckets in the same order, as that call needs.
    bucket.buffer = pg_->symmetric_zeros(total + (b + 1 == layout.size() ? 1 : 0), DType::Float32, device_);
    if (b + 1 == layout.size())  // the flag, set and read through device ops
      flag_ = Tensor(std::make_shared<TensorImpl>(bucket.buffer.impl()->storage(),
                                                  static_cast<std::size_t>(total) * 4, Shape{1}, DType::Float32));
    for (std::size_t s = 0; s < bucket.params.size(); ++s) {
      const std::size_t p = bucket.params[s];
      bucket_of_[p] = b;
      // A view of the bucket buffer shaped like the parameter: gradients accumulate here.
      views_[p] = Tensor(std::make_shared<TensorImpl>(bucket.buffer.impl()->storage(),
                                                      static_cast<std::size_t>(bucket.offsets[s]) * 4,
                                                      params_[p].shape(), DType::Float32));
    }
    buckets_.push_back(std::move(bucket));
  }
  // Gradient-producing ops write each parameter's first gradient straight into its view.
  for (std::size_t p = 0; p < n; ++p) params_[p].set_grad_destination(views_[p]);
  pending_.resize(buckets_.size());
  reset_pass();
  attach_grad_hooks(params_, [this](std::size_t p) { on_grad_ready(p); });
}

Reducer::~Reducer() { detach_grad_hooks(); }

void Reducer::set_hook(CommHookPtr hook) {
  if (!hook) throw ValueError("DDP: the comm hook is null");
  if (hook_used_) throw ValueError("DDP: register the comm hook before the first backward");
  hook_ = std::move(hook);
}

void Reducer::reset_pass() {
  if (sink_) sink_->active = false;  // the flag has been read (or is void): losses raise again
  set_pass_flag(0.f);                // a device fill: no host wait
  for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = static_cast<int>(buckets_[b].params.size());
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = 0;
  in_pass_ = false;
}

void Reducer::set_pass_flag(float value) { flag_.fill_(value); }

float Reducer::pass_flag() const { return flag_.item(); }

void Reducer::install_label_sink() {
  // Registered and activated at every DDP forward in grad mode, on the forward's thread
  // (before the module runs: a loss computed inside the forward is covered too); inactive
  // again once finalize has read the flag (reset_pass), so a loss after the step, or of a
  // model outside DDP, raises at once. This thread holds it weakly: it dies with the reducer.
  if (!sink_) {
    sink_ = std::make_shared<detail::LabelFlagSink>();
    sink_->flag = flag_;
    sink_->value = static_cast<float>(pg_->size() + 1);
  }
  detail::add_label_flag_sink(sink_);
  sink_->active = true;
}

void Reducer::raise_flagged(float flag, const char* who) const {
  if (flag == 0.f) return;
  const long world = pg_->size();
  const long sum = std::max(1L, std::lround(static_cast<double>(flag) * world));
  const long bad_labels = sum / (world + 1), void_ranks = sum % (world + 1);
  // The same message on every rank: it depends on the reduced flag only.
  if (bad_labels > 0)
    throw ValueError(detail::concat(
        who, "cross_entropy got a target outside [0, classes) on ", bad_labels, " of ", world,
        " rank(s) in this step, so this step's reduced gradients are contaminated on every rank and no rank "
        "may step; skip this optimizer step, zero the gradients and fix the labels (each must be a class "
        "index below the model's output width)"));
  throw PeerFailedError(detail::concat(
      who, "the backward pass stopped part-way on ", std::max(1L, void_ranks), " of ", world,
      " rank(s) (an exception inside their backward, or parameters without a gradient), so this "
      "step's reduced gradients are incomplete on every rank; skip this optimizer step and zero the "
      "gradients, or stop (the failing rank's own error says why)"));
}

void Reducer::launch_void_rest() {
  // Every rank must issue the same collectives in every pass: the buckets this rank never
  // filled go out zero-filled, the last one with the pass flag set, so the peers' pass
  // fails (finalize) instead of pairing with this rank's next pass.
  while (next_launch_ < buckets_.size()) {
    GradBucket& b = buckets_[next_launch_];
    b.buffer.zero_();
    if (next_launch_ + 1 == buckets_.size()) set_pass_flag(1.f);
    launch_bucket(b);
    ++next_launch_;
  }
}

std::exception_ptr Reducer::finish_launched(std::size_t* failed) {
  std::exception_ptr error;
  for (std::size_t b = 0; b < next_launch_; ++b) {
    try {
      finish_bucket(buckets_[b]);
    } catch (const CommError&) {
      if (!error) {
        error = std::current_exception();
        *failed = b;
      }
    }
  }
  return error;
}

std::exception_ptr Reducer::drain_pass(std::size_t* failed) {
  std::exception_ptr error;
  try {
    launch_void_rest();
  } catch (const CommError&) {
    error = std::current_exception();
    *failed = next_launch_;
  }
  if (std::exception_ptr e = finish_launched(failed); e && !error) error = e;
  return error;
}

void Reducer::abandon_pass() {
  // The previous backward stopped part-way (an exception inside the autograd graph or a
  // hook): its end-of-backward callback never ran, and that exception already reached the
  // caller. Send the buckets it never launched as void (so the peers' pass fails too and
  // no rank pairs its next pass with another's old one), complete them all, so no
  // collective still writes into the gradient buffers, then start afresh. The gradients
  // are garbage: zero them before the next backward (optimizer.zero_grad()).
  std::size_t failed = 0;
  const std::exception_ptr error = drain_pass(&failed);
  armed_ = false;
  reset_pass();
  if (error)
    rethrow_with_context(error, detail::concat("DDP: the previous backward stopped part-way, and completing its "
                                               "gradient bucket ", failed, " failed: "));
}

void Reducer::arm(const Tensor& output) {
  if (!params_.empty() && params_.front().device() != device_)
    throw ConfigError("DDP: the model moved from " + device_.str() + " to " + params_.front().device().str() +
                      " after it was wrapped; its gradient buckets stay on " + device_.str() +
                      ": move the model before wrapping it in DDP");
  if (in_pass_) abandon_pass();
  armed_ = true;
  install_label_sink();
  if (!find_unused_) return;
  // Walk the graph from the output; leaves never reached are unused in this iteration.
  std::fill(unused_.begin(), unused_.end(), 1);
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  if (output.defined() && output.grad_fn()) stack.push_back(output.grad_fn().get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (seen[n]) continue;
    seen[n] = true;
    if (auto* acc = dynamic_cast<AccumulateGrad*>(n)) {
      auto it = index_.find(acc->leaf().impl());
      if (it != index_.end()) unused_[it->second] = 0;
    }
    for (const Edge& e : n->next_edges)
      if (e.fn) stack.push_back(e.fn.get());
  }
}

void Reducer::adopt_into_bucket(std::size_t p) {
  // The gradient must live in the bucket. It already does unless it was (re)created
  // elsewhere, e.g. after zero_grad(set_to_none): then one copy, and it lives there after.
  const Tensor g = params_[p].grad();
  if (g.defined() && g.impl() == views_[p].impl()) return;
  if (g.defined())
    views_[p].copy_(g);
  else
    views_[p].zero_();
  params_[p].set_grad(views_[p]);
}

void Reducer::on_grad_ready(std::size_t p) {
  adopt_into_bucket(p);
  if (!sync_) return;  // no_sync(): accumulate locally only
  if (!armed_)
    throw AutogradError("DDP: backward reached parameter '" + names_[p] +
                        "' without a forward since the last reduction: run forward before each "
                        "backward (backward twice through one graph, or a second backward before "
                        "the optimizer step, is not supported under DDP)");
  if (!in_pass_) {
    in_pass_ = true;
    hook_used_ = true;
    queue_backward_callback([this] { finalize(); });
    if (find_unused_)
      for (std::size_t q = 0; q < params_.size(); ++q)
        if (unused_[q] && !ready_[q]) {
          adopt_into_bucket(q);
          mark_ready(q);
        }
  }
  if (ready_[p])
    throw AutogradError("DDP: parameter '" + names_[p] + "' received its gradient twice in one backward");
  mark_ready(p);
}

void Reducer::mark_ready(std::size_t p) {
  ready_[p] = 1;
  if (--pending_[bucket_of_[p]] == 0) launch_in_order();
}

void Reducer::launch_in_order() {
  // The last bucket waits for the end of backward (finalize): its pass flag says whether
  // this rank's backward ran to the end, which only then is known. Backward has next to
  // nothing left to compute by the time the last bucket fills.
  while (next_launch_ + 1 < buckets_.size() && pending_[next_launch_] == 0) {
    if (next_launch_ == 0) first_launch_ = Clock::now();
    launch_bucket(buckets_[next_launch_]);
    ++next_launch_;
  }
}

void Reducer::launch_bucket(GradBucket& b) {
  if (!timeline::enabled()) {
    hook_->launch(*pg_, b);
    return;
  }
  // Two events: the launch itself on this thread (inside backward), and the bucket from
  // launch to completion (its wait at the end of backward), as an async row.
  const timeline::Arg bytes{"bytes", b.buffer.numel() * 4};
  const timeline::Arg params{"params", static_cast<std::int64_t>(b.params.size())};
  const int index = static_cast<int>(b.index);
  timeline::async_begin("bucket", "ddp", b.index, index, bytes, params);
  timeline::Span span("launch bucket", "ddp", bytes, params, index);
  hook_->launch(*pg_, b);
}

void Reducer::finish_bucket(GradBucket& b) {
  if (!timeline::enabled()) {
    hook_->finish(*pg_, b);
    return;
  }
  struct End {
    const GradBucket& b;
    ~End() { timeline::async_end("bucket", "ddp", b.index, static_cast<int>(b.index)); }
  } end{b};
  hook_->finish(*pg_, b);
}

void Reducer::finalize() {
  // Backward's computation is over: the last bucket's launch and the wait for all of them.
  const timeline::Span span("finalize", "ddp");
  armed_ = false;
  if (next_launch_ + 1 < buckets_.size() || pending_.back() != 0) {
    std::string missing;
    int count = 0;
    for (std::size_t p = 0; p < params_.size(); ++p)
      if (!ready_[p] && count++ < 5) missing += (missing.empty() ? "" : ", ") + names_[p];
    // Send the rest as void and complete everything, so the group stays in step and the
    // peers' pass fails too; a communication error wins (its kind kept: a peer's failure
    // stays a PeerFailedError).
    std::size_t failed = 0;
    const std::exception_ptr error = drain_pass(&failed);
    reset_pass();
    if (error)
      rethrow_with_context(error, detail::concat("DDP: reducing gradient bucket ", failed, " failed: "));
    throw AutogradError(detail::concat(
        "DDP: ", count, " parameter(s) got no gradient in this backward pass (", missing,
        "): they were not used to compute the loss. Pass find_unused_parameters=true to DDPOptions "
        "if parts of the model are unused in some iterations, or remove them from the model"));
  }
  if (next_launch_ == 0) first_launch_ = Clock::now();
  // The flag holds 0, or W + 1 when this rank's loss saw a bad label (written on the device
  // by the label check since the last reduction, no_sync() passes included).
  try {
    launch_bucket(buckets_.back());
  } catch (const CommError&) {
    std::size_t failed = 0;
    finish_launched(&failed);  // nothing may still write into the buffers
    reset_pass();
    rethrow_with_context(std::current_exception(),
                         detail::concat("DDP: reducing gradient bucket ", buckets_.size() - 1, " failed: "));
  }
  ++next_launch_;
  const auto wait_start = Clock::now();
  device_works_.clear();
  for (auto& b : buckets_) {
    try {
      const WorkPtr work = b.work;  // the hook's finish drops it
      finish_bucket(b);
      if (work && work->on_device() && !work->is_completed()) device_works_.push_back(work);
    } catch (const CommError&) {
      device_works_.clear();
      reset_pass();
      rethrow_with_context(std::current_exception(),
                           detail::concat("DDP: reducing gradient bucket ", b.index, " (", b.params.size(),
                                          " parameter(s), ", b.buffer.numel() * 4, " bytes) failed: "));
    }
  }
  const auto end = Clock::now();
  last_wait_ = std::chrono::duration<double>(end - wait_start).count();
  last_comm_ = std::chrono::duration<double>(end - first_launch_).count();
  // The flag's mean over ranks; read once a step, after the buckets' waits above. The read
  // may report an earlier deferred device error (CUDA: a label check outside the step): the
  // pass is over either way, so the reducer is reset before that error leaves (else the next
  // forward would finish these buckets a second time).
  float flag = 0.f;
  try {
    flag = pass_flag();
  } catch (...) {
    device_works_.clear();
    reset_pass();
    throw;
  }
  // Reading it synchronised the host with the device, so the buckets reduced on a device
  // stream (their wait() did not block the host) have ended there: a failure the backend
  // found after that wait() returned (NCCL's watchdog: a timeout, a dead peer, an abort)
  // surfaces here, before the optimizer steps on what an aborted collective left behind.
  std::vector<WorkPtr> works;
  works.swap(device_works_);
  reset_pass();
  for (const auto& work : works) {
    try {
      work->synchronize();
    } catch (const CommError&) {
      rethrow_with_context(std::current_exception(), "DDP: a gradient bucket's reduction failed on the device: ");
    }
  }
  raise_flagged(flag, "DDP: ");
}

void Reducer::shadow_pass() {
  if (in_pass_) abandon_pass();
  armed_ = false;
  hook_used_ = true;
  for (auto& b : buckets_) b.buffer.zero_();  // zeros, and the pass flag 0 (completed)
  std::exception_ptr error;
  std::size_t failed = 0;
  try {
    for (; next_launch_ < buckets_.size(); ++next_launch_) launch_bucket(buckets_[next_launch_]);
  } catch (const CommError&) {
    error = std::current_exception();
    failed = next_launch_;
  }
  if (std::exception_ptr e = finish_launched(&failed); e && !error) error = e;
  float flag = 0.f;
  try {
    if (!error) flag = pass_flag();
  } catch (...) {
    reset_pass();
    throw;
  }
  reset_pass();
  if (error)
    rethrow_with_context(error, detail::concat("DDP (joined rank): reducing gradient bucket ", failed, " failed: "));
  raise_flagged(flag, "DDP (joined rank): ");
}

}  // namespace phalanx::parallel
