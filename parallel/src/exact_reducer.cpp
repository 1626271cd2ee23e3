// Exact mode's reducer: see exact_reducer.hpp and docs/exact.md.
#include "exact_reducer.hpp"

#include <algorithm>
#include <cmath>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/tensor_impl.hpp"
#include "phalanx/parallel/exact.hpp"

namespace phalanx::parallel {

namespace {

/// A tensor of `shape` over `base`'s storage from element `offset` on (no copy).
Tensor view_of(const Tensor& base, std::int64_t offset, const Shape& shape) {
  const std::size_t item = base.dtype() == DType::Int64 ? 8 : 4;
  return Tensor(std::make_shared<TensorImpl>(base.impl()->storage(),
                                             base.impl()->byte_offset() + static_cast<std::size_t>(offset) * item,
                                             shape, base.dtype()));
}

/// Elements of a CPU piece: its int64 sums and one slot's floats fit a 512 KiB L2 cache
/// together with a second slot's.
constexpr std::int64_t kCpuPiece = 16384;

/// The power-of-two exponent s of parameter's scale: with |x| <= max for every kept value
/// and K <= 2^k micro-batches, |llrint(x * 2^s)| <= 2^(61 - k), so a sum of K of them stays
/// within 2^61 (int64 holds 2^63). max == 0: every value is 0, any scale does.
int scale_exponent(float max, int k) {
  if (max == 0.f) return 0;
  int e = 0;
  std::frexp(static_cast<double>(max), &e);  // max < 2^e
  return 61 - k - e;  // in [-67 - k, 210 - k]: 2^s is a normal double
}

/// Adds DDP's context to a communication error without changing its kind.
[[noreturn]] void rethrow_with_context(const std::string& context) {
  try {
    throw;
  } catch (const PeerFailedError&) {
    throw;
  } catch (const TimeoutError& e) {
    throw TimeoutError(context + e.what());
  } catch (const DesyncError& e) {
    throw DesyncError(context + e.what());
  } catch (const CommError& e) {
    throw CommError(context + e.what());
  }
}

}  // namespace

struct ExactReducer::State {
  /// A piece of one parameter: its int64 sums and its gradient in every slot. On the CPU a
  /// parameter is cut into pieces that fit the L2 cache, so zeroing the sums and adding the
  /// L slots run while the piece is in cache (one pass over memory, not L + 1).
  struct Piece {
    std::size_t param;
    Tensor acc;
    std::vector<Tensor> src;  // [slot]
  };
  struct Bucket {
    std::vector<std::size_t> params;
    Tensor acc;                    // int64, the bucket's fixed-point sums
    std::vector<Tensor> acc_view;  // per parameter of the bucket, shaped like it
    std::vector<Piece> pieces;
    WorkPtr work;
  };

  ProcessGroupPtr pg;
  DeviceKernels* kernels = nullptr;
  std::vector<Tensor> params;
  std::vector<std::string> names;
  std::vector<std::uint64_t> hook_ids;
  std::int64_t micro_batches = 0;  // K, all ranks together
  std::int64_t per_rank = 0;       // L = K / world
  int k_bits = 0;                  // K <= 2^k_bits
  std::vector<Tensor> slots;                // L flat float32 buffers: micro-batch j's gradients
  std::vector<std::vector<Tensor>> views;   // [slot][parameter], shaped like the parameter
  Tensor maxima;                   // float32 [P + 1] on the device: max |g| per parameter, void flag
  std::vector<float> host_maxima;  // P + 1
  std::vector<double> scales;      // P
  std::vector<Bucket> buckets;
  std::vector<char> ready;  // parameter -> got its gradient in this backward
  std::int64_t micro = 0;   // the step's micro-batch the current/next backward is (0 .. L-1)
  bool armed = false;
  bool in_pass = false;

  void on_grad_ready(std::size_t p);
  void finalize();
  void reduce();
  void void_step();
  void clear_grads() {
    for (auto& p : params) p.set_grad(Tensor());
  }
  void start_step() {
    micro = 0;
    maxima.zero_();
  }
  std::string where() const {
    return detail::concat("micro-batch ", micro + 1, " of ", per_rank, " on rank ", pg->rank());
  }
};

ExactReducer::ExactReducer(std::vector<std::pair<std::string, Tensor>> named, ProcessGroupPtr pg,
                           const DDPOptions& o)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  const ExactPlan plan = exact_plan(o.exact, pg->size());
  s.pg = std::move(pg);
  s.micro_batches = plan.micro_batches;
  s.per_rank = per_rank_ = plan.per_rank;
  while ((std::int64_t{1} << s.k_bits) < s.micro_batches) ++s.k_bits;
  std::int64_t total = 0;
  std::vector<std::int64_t> offset;
  for (auto& [name, p] : named) {
    if (!p.requires_grad()) continue;
    if (p.dtype() != DType::Float32) throw TypeError("DDP exact mode: parameter '" + name + "' is not float32");
    if (!s.params.empty() && p.device() != s.params[0].device())
      throw ValueError("DDP exact mode: parameter '" + name + "' is on " + p.device().str() + ", the others on " +
                       s.params[0].device().str() + "; move the model to one device");
    s.names.push_back(name);
    s.params.push_back(p);
    offset.push_back(total);
    total += p.numel();
  }
  const std::size_t n = s.params.size();
  if (n == 0) throw ValueError("DDP exact mode: the model has no parameter that requires a gradient");
  const Device device = s.params[0].device();
  s.kernels = &kernels_for(device);
  // L slots; the last one holds the step's result, so the memory beyond a plain model's
  // gradients is L - 1 gradient copies, plus the int64 buckets (2 copies).
  for (std::int64_t j = 0; j < s.per_rank; ++j) {
    s.slots.push_back(zeros({total}, DType::Float32, device));
    s.views.emplace_back();
    for (std::size_t p = 0; p < n; ++p) s.views[j].push_back(view_of(s.slots[j], offset[p], s.params[p].shape()));
  }
  s.maxima = zeros({static_cast<std::int64_t>(n) + 1}, DType::Float32, device);
  s.host_maxima.assign(n + 1, 0.f);
  s.scales.assign(n, 1.0);
  s.ready.assign(n, 0);
  // Buckets of at most bucket_cap_mb of int64 sums, in reverse registration order; a
  // parameter larger than the cap gets a bucket of its own.
  const auto cap = static_cast<std::int64_t>(o.bucket_cap_mb * 1024 * 1024);
  std::vector<std::vector<std::size_t>> layout(1);
  std::int64_t bytes = 0;
  for (std::size_t p = n; p-- > 0;) {
    const std::int64_t b = s.params[p].numel() * 8;
    if (!layout.back().empty() && bytes + b > cap) {
      layout.emplace_back();
      bytes = 0;
    }
    layout.back().push_back(p);
    bytes += b;
  }
  for (auto& members : layout) {
    State::Bucket bucket;
    bucket.params = members;
    std::int64_t size = 0;
    for (std::size_t p : members) size += s.params[p].numel();
    bucket.acc = zeros({size}, DType::Int64, device);
    std::int64_t at = 0;
    for (std::size_t p : members) {
      const std::int64_t numel = s.params[p].numel();
      bucket.acc_view.push_back(view_of(bucket.acc, at, s.params[p].shape()));
      const std::int64_t piece = device.is_cpu() ? kCpuPiece : numel;
      for (std::int64_t b = 0; b < numel; b += piece) {
        const std::int64_t len = std::min(piece, numel - b);
        State::Piece pc{p, view_of(bucket.acc, at + b, {len}), {}};
        for (std::int64_t j = 0; j < s.per_rank; ++j) pc.src.push_back(view_of(s.slots[j], offset[p] + b, {len}));
        bucket.pieces.push_back(std::move(pc));
      }
      at += numel;
    }
    s.buckets.push_back(std::move(bucket));
  }
  for (std::size_t p = 0; p < n; ++p)
    s.hook_ids.push_back(
        s.params[p].register_grad_accumulated_hook([st = &s, p](const Tensor&) { st->on_grad_ready(p); }));
}

ExactReducer::~ExactReducer() {
  State& s = *state_;
  for (std::size_t p = 0; p < s.params.size(); ++p) {
    s.params[p].remove_grad_accumulated_hook(s.hook_ids[p]);
    s.params[p].set_grad_destination(Tensor());
  }
}

std::vector<std::vector<std::size_t>> ExactReducer::layout() const {
  std::vector<std::vector<std::size_t>> out;
  for (const auto& b : state_->buckets) out.push_back(b.params);
  return out;
}

void ExactReducer::arm(const Tensor&) {
  State& s = *state_;
  if (s.in_pass) s.void_step();  // throws
  s.armed = true;
  // This micro-batch's gradients are written straight into its slot: .grad() must be
  // undefined for that (the step's first micro-batch thereby clears the previous result).
  for (std::size_t p = 0; p < s.params.size(); ++p) {
    s.params[p].set_grad(Tensor());
    s.params[p].set_grad_destination(s.views[s.micro][p]);
  }
}

void ExactReducer::State::on_grad_ready(std::size_t p) {
  if (!armed)
    throw AutogradError("DDP exact mode: backward reached parameter '" + names[p] +
                        "' without a forward since the last backward: run one forward before each "
                        "backward (each forward and backward is one micro-batch)");
  if (!in_pass) {
    in_pass = true;
    queue_backward_callback([this] { finalize(); });
  }
  if (ready[p])
    throw AutogradError("DDP exact mode: parameter '" + names[p] + "' received its gradient twice in one backward");
  ready[p] = 1;
  const Tensor g = params[p].grad();
  Tensor& slot = views[micro][p];
  if (!g.is_same(slot)) slot.copy_(g);  // reached along several paths: the sum was made elsewhere
  kernels->abs_max_into(slot, maxima, static_cast<std::int64_t>(p));
}

void ExactReducer::State::finalize() {
  armed = false;
  in_pass = false;
  for (std::size_t p = 0; p < params.size(); ++p) {
    if (!ready[p]) views[micro][p].zero_();  // not used by this micro-batch: contributes zero
    ready[p] = 0;
  }
  if (micro + 1 < per_rank) {
    clear_grads();  // partial gradients stay in the slots, out of the user's reach
    ++micro;
    return;
  }
  reduce();
}

void ExactReducer::State::void_step() {
  // The previous backward stopped part-way (its exception already reached the caller).
  // The peers will agree on the scales in one collective at the end of their step: take
  // part with the void flag set, so every rank's step fails and the group stays in step.
  const std::string at = where();
  armed = false;
  in_pass = false;
  std::fill(ready.begin(), ready.end(), 0);
  clear_grads();
  std::fill(host_maxima.begin(), host_maxima.end(), 0.f);
  host_maxima.back() = 1.f;
  kernels->copy_from_host(maxima.raw_data(), host_maxima.data(), host_maxima.size() * 4);
  try {
    if (pg->size() > 1) pg->allreduce(maxima, ReduceOp::Max)->wait();
  } catch (const CommError&) {
    start_step();
    rethrow_with_context("DDP exact mode: voiding the step after a failed backward: ");
  }
  start_step();
  throw AutogradError("DDP exact mode: the previous backward (" + at +
                      ") stopped part-way, so this step is void on every rank and its gradients are "
                      "cleared; this forward was not counted: start the next step with its first micro-batch");
}

void ExactReducer::State::reduce() {
  const std::size_t n = params.size();
  // 1. Agree on the maxima (and on whether any rank's step is void). A NaN max travels as
  //    +Inf: a max with NaN is order-dependent, with Inf it is not.
  kernels->copy_to_host(host_maxima.data(), maxima.raw_data(), host_maxima.size() * 4);
  for (std::size_t p = 0; p < n; ++p)
    if (std::isnan(host_maxima[p])) host_maxima[p] = INFINITY;
  host_maxima.back() = 0.f;
  try {
    if (pg->size() > 1) {
      kernels->copy_from_host(maxima.raw_data(), host_maxima.data(), host_maxima.size() * 4);
      pg->allreduce(maxima, ReduceOp::Max)->wait();
      kernels->copy_to_host(host_maxima.data(), maxima.raw_data(), host_maxima.size() * 4);
    }
  } catch (const CommError&) {
    clear_grads();
    start_step();
    rethrow_with_context("DDP exact mode: agreeing on the gradient scales failed: ");
  }
  start_step();
  if (host_maxima.back() != 0.f) {
    clear_grads();
    throw PeerFailedError(detail::concat(
        "DDP exact mode: a backward pass stopped part-way on at least one of ", pg->size(),
        " rank(s), so this step is void on every rank and its gradients are cleared; skip this optimizer "
        "step and start the next step with its first micro-batch, or stop (the failing rank's own error says why)"));
  }
  for (std::size_t p = 0; p < n; ++p) {
    if (!std::isfinite(host_maxima[p])) {
      clear_grads();
      throw ValueError("DDP exact mode: the gradient of parameter '" + names[p] +
                       "' is not finite (NaN or Inf) in this step on at least one rank; the step is void on "
                       "every rank and its gradients are cleared: skip this optimizer step, or lower the "
                       "learning rate / check the data");
    }
    scales[p] = std::ldexp(1.0, scale_exponent(host_maxima[p], k_bits));
  }
  // 2. Convert and sum in int64, bucket by bucket; each bucket's allreduce starts as soon
  //    as it is summed, while the next one is converted.
  const bool distributed = pg->size() > 1;
  std::size_t launched = 0;
  try {
    for (auto& b : buckets) {
      for (auto& pc : b.pieces) {
        kernels->fill(pc.acc, 0.0);
        for (const Tensor& src : pc.src) kernels->fixed_point_accumulate(src, scales[pc.param], pc.acc);
      }
      if (distributed) b.work = pg->allreduce(b.acc, ReduceOp::Sum);
      ++launched;
    }
    // 3. Divide once: sum / scale / K, into the last slot, which becomes .grad().
    Tensor* out = views[per_rank - 1].data();
    for (auto& b : buckets) {
      if (b.work) {
        WorkPtr w = std::move(b.work);
        w->wait();
      }
      for (std::size_t i = 0; i < b.params.size(); ++i) {
        const std::size_t p = b.params[i];
        kernels->fixed_point_to_float(b.acc_view[i], scales[p], static_cast<double>(micro_batches), out[p]);
      }
    }
  } catch (const CommError&) {
    for (std::size_t i = 0; i < launched; ++i) {  // nothing may still write into the buckets
      if (!buckets[i].work) continue;
      try {
        buckets[i].work->wait();
      } catch (const CommError&) {
      }
      buckets[i].work.reset();
    }
    clear_grads();
    rethrow_with_context("DDP exact mode: reducing the gradients failed: ");
  }
  for (std::size_t p = 0; p < n; ++p) params[p].set_grad(views[per_rank - 1][p]);
}

}  // namespace phalanx::parallel
