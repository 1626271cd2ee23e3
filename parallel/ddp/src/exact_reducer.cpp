// Exact mode's reducer: see exact_reducer.hpp and docs/exact.md.
#include "exact_reducer.hpp"
#include "comm_context.hpp"

#include <algorithm>
#include <cmath>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/autograd.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/label_flag.hpp"
#include "phalanx/core/tensor_impl.hpp"
#include "phalanx/parallel/exact.hpp"

namespace phalanx::parallel {

namespace {

/// Elements of a CPU piece: its int64 sums and two slots' floats fit a 512 KiB L2 cache.
constexpr std::int64_t kCpuPiece = 16384;
/// Elements of a CPU chunk on shared memory (inline) or one worker: 256 KiB of int64 sums
/// (one round of shm's default staging) that stay in cache from their conversion through
/// their allreduce to the conversion back.
constexpr std::int64_t kCpuChunk = 32768;

/// A tensor of `shape` over `base`'s storage from element `offset` on (no copy).
Tensor view_of(const Tensor& base, std::int64_t offset, const Shape& shape) {
  const std::size_t item = base.dtype() == DType::Int64 ? 8 : 4;
  return Tensor(std::make_shared<TensorImpl>(base.impl()->storage(),
                                             base.impl()->byte_offset() + static_cast<std::size_t>(offset) * item,
                                             shape, base.dtype()));
}

/// The power-of-two exponent s of a parameter's scale: with |x| <= max for every kept value
/// and K <= 2^k micro-batches, |llrint(x * 2^s)| <= 2^(61 - k), so a sum of K of them stays
/// within 2^61 (int64 holds 2^63). max == 0: every value is 0, any scale does.
int scale_exponent(float max, int k) {
  if (max == 0.f) return 0;
  int e = 0;
  std::frexp(static_cast<double>(max), &e);  // max < 2^e
  return 61 - k - e;  // in [-67 - k, 210 - k]: 2^s is a normal double
}

}  // namespace

ExactReducer::ExactReducer(std::vector<std::pair<std::string, Tensor>> named, ProcessGroupPtr group,
                           const DDPOptions& o)
    : pg(std::move(group)) {
  const ExactPlan plan = exact_plan(o.exact(), pg->size());
  micro_batches = plan.micro_batches;
  per_rank = plan.per_rank;
  micro_batch = o.exact().micro_batch;
  while ((std::int64_t{1} << k_bits) < micro_batches) ++k_bits;
  for (auto& [name, p] : named) {
    if (!p.requires_grad()) continue;
    if (p.dtype() != DType::Float32) throw TypeError("DDP exact mode: parameter '" + name + "' is not float32");
    if (!params.empty() && p.device() != params[0].device())
      throw ValueError("DDP exact mode: parameter '" + name + "' is on " + p.device().str() + ", the others on " +
                       params[0].device().str() + "; move the model to one device");
    names.push_back(name);
    params.push_back(p);
  }
  const std::size_t n = params.size();
  if (n == 0) throw ValueError("DDP exact mode: the model has no parameter that requires a gradient");
  const Device device = params[0].device();
  kernels = &kernels_for(device);
  host_maxima = device.is_cpu();
  // Shared memory runs each allreduce on this thread at once (inline): nothing can overlap
  // it, and it moves bytes at memory speed, so the sums go in cache-sized chunks, each
  // converted, reduced and converted back while in cache. Elsewhere (a worker thread, or a
  // network whose per-message latency would add up over many chunks: MPI, Gloo) a bucket
  // is reduced while the next one is converted.
  // The schedule decides which allreduces a step issues, so it is one collective decision:
  // a rank's own settings (PHALANX_SHM_INLINE, its model's device) may differ from its
  // peers', and shm chunks only when every rank can (a MIN of one flag, once).
  chunked = device.is_cpu() && (pg->size() == 1 || (pg->backend().inline_ops() && pg->backend().shared_memory()));
  if (pg->size() > 1 && pg->backend().shared_memory()) {
    const std::int64_t mine = chunked ? 1 : 0;
    Tensor flag = from_buffer(&mine, {1});  // host memory: shm's own
    try {
      pg->allreduce(flag, ReduceOp::Min)->wait();
    } catch (const CommError&) {
      rethrow_with_context(std::current_exception(), "DDP exact mode: agreeing on the reduction schedule failed: ");
    }
    chunked = flag.item_int() == 1;
  }
  scales.assign(n, 1.0);
  ready.assign(n, 0);
  bucket_of.assign(n, 0);
  index_in_bucket.assign(n, 0);
  // The normal reducer's buckets, so the maxima of the last layers travel while backward
  // goes on.
  const BucketLayout& layout = lay_out_buckets(params, o);
  // The slots hold the parameters in registration order; a bucket (consecutive parameters)
  // is one range of them, which its chunks follow.
  std::vector<std::int64_t> offset(n, 0);
  std::int64_t total = 0;
  for (std::size_t p = 0; p < n; ++p) {
    offset[p] = total;
    total += params[p].numel();
  }
  // L slots; the last one holds the step's result, so the memory beyond a plain model's
  // gradients is L - 1 gradient copies, plus the int64 sums (two copies' worth, or one
  // chunk's 256 KiB when chunked).
  for (std::int64_t j = 0; j < per_rank; ++j) {
    slots.push_back(zeros({total}, DType::Float32, device));
    views.emplace_back();
    for (std::size_t p = 0; p < n; ++p) views[j].push_back(view_of(slots[j], offset[p], params[p].shape()));
  }
  Tensor shared_acc;
  if (chunked) {
    std::int64_t largest = 0;
    for (const auto& l : layout) {
      std::int64_t size = 0;
      for (std::size_t p : l) size += params[p].numel();
      largest = std::max(largest, size);
    }
    shared_acc = zeros({std::min(kCpuChunk, largest)}, DType::Int64, device);
  }
  for (std::size_t bi = 0; bi < layout.size(); ++bi) {
    Bucket bucket;
    bucket.params = layout[bi];
    const bool last = bi + 1 == layout.size();
    bucket.maxima = zeros({static_cast<std::int64_t>(bucket.params.size()) + (last ? 1 : 0)}, DType::Float32, device);
    bucket.host_max.assign(static_cast<std::size_t>(bucket.maxima.numel()), 0.f);
    std::int64_t size = 0;
    for (std::size_t i = 0; i < bucket.params.size(); ++i) {
      bucket_of[bucket.params[i]] = bi;
      index_in_bucket[bucket.params[i]] = i;
      size += params[bucket.params[i]].numel();
    }
    const std::int64_t chunk_cap = chunked ? kCpuChunk : size;
    const std::int64_t piece_cap = device.is_cpu() ? kCpuPiece : size;
    const Tensor acc = chunked ? shared_acc : zeros({size}, DType::Int64, device);
    std::int64_t used = 0;  // elements in the chunk being filled
    Chunk chunk;
    auto close_chunk = [&] {
      chunk.acc = view_of(acc, 0, {used});
      bucket.chunks.push_back(std::move(chunk));
      chunk = Chunk{};
      used = 0;
    };
    for (auto it = bucket.params.rbegin(); it != bucket.params.rend(); ++it) {  // the slots' order
      const std::size_t p = *it;
      const std::int64_t numel = params[p].numel();
      for (std::int64_t b = 0; b < numel;) {
        if (used == chunk_cap) close_chunk();
        const std::int64_t len = std::min({piece_cap, numel - b, chunk_cap - used});
        Piece pc{p, view_of(acc, used, {len}), {}, Tensor()};
        for (std::int64_t j = 0; j < per_rank; ++j) pc.src.push_back(view_of(slots[j], offset[p] + b, {len}));
        pc.out = pc.src.back();
        chunk.pieces.push_back(std::move(pc));
        used += len;
        b += len;
      }
    }
    if (used > 0) close_chunk();
    buckets.push_back(std::move(bucket));
  }
  reset_step();
  attach_grad_hooks(params, [this](std::size_t p) { on_grad_ready(p); });
}

void ExactReducer::install_label_sink() {
  // A bad label in a micro-batch's loss writes 2 into the step flag (the last bucket's last
  // maximum) on the device; the maxima's allreduce MAX carries it to every rank. Installed
  // and activated at every DDP forward in grad mode, on its thread (a loss inside the
  // model's forward is covered too), until finish_step has read the flag (reset_step).
  if (buckets.empty()) return;
  if (!sink) {
    const Bucket& last = buckets.back();
    sink = std::make_shared<detail::LabelFlagSink>();
    sink->flag = view_of(last.maxima, last.maxima.numel() - 1, {1});
    sink->value = 2.f;
  }
  detail::add_label_flag_sink(sink);
  sink->active = true;
}

ExactReducer::~ExactReducer() {
  detach_grad_hooks();
  drain();
}

void ExactReducer::arm(const Tensor&) {
  if (in_pass)
    void_step("the previous backward (" + where() + ") stopped part-way");
  if (armed)
    void_step("the previous forward (" + where() +
              ") got no backward (each forward in grad mode is one micro-batch and needs its backward; run "
              "evaluation under NoGradGuard)");
  armed = true;
  install_label_sink();
  // This micro-batch's gradients are written straight into its slot: .grad() must be
  // undefined for that (the step's first micro-batch thereby clears the previous result).
  for (std::size_t p = 0; p < params.size(); ++p) {
    params[p].set_grad(Tensor());
    params[p].set_grad_destination(views[micro][p]);
  }
}

void ExactReducer::check_join() const {
  throw ConfigError("DDP: Join cannot shadow exact mode's reductions; give every rank the same number of "
                    "micro-batches (exact mode's sampler does) or turn exact mode off");
}

void ExactReducer::check_no_sync() const {
  throw ConfigError("DDP: no_sync() has no meaning in exact mode: each backward is one micro-batch "
                    "and the last one of the step reduces; drop no_sync() or turn exact mode off");
}

void ExactReducer::check_comm_hook(const CommHookPtr& hook) const {
  throw ConfigError("DDP: a comm hook (" + (hook ? hook->name() : std::string("null")) +
                    ") cannot be combined with exact mode, which reduces in 64-bit fixed point "
                    "itself; drop the hook or turn exact mode off");
}

void ExactReducer::check_forward(std::int64_t samples) const {
  // One forward and backward is one micro-batch; the mean of its loss weighs it 1/K.
  if (samples != micro_batch)
    throw ShapeError(detail::concat("DDP exact mode: the input has ", std::max<std::int64_t>(samples, 0),
                                    " samples, the micro-batch is ", micro_batch,
                                    "; feed exactly one micro-batch per forward (pad or drop a short last batch)"));
}

void ExactReducer::on_grad_ready(std::size_t p) {
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
  Bucket& b = buckets[bucket_of[p]];
  kernels->abs_max_into(slot, b.maxima, static_cast<std::int64_t>(index_in_bucket[p]));
  if (!last_micro()) return;
  // The rank's last micro-batch: a bucket whose gradients are all in has its final local
  // maxima. Buckets go strictly in order (every rank issues the same collectives in the
  // same order); the last one, which carries the void flag, waits for the end of backward.
  --b.pending;
  // On the CPU the maxima go out as their bucket completes; on an accelerator at the end of
  // backward (reading them to the host mid-backward would stall its stream).
  while (host_maxima && next_bucket + 1 < buckets.size() && buckets[next_bucket].pending == 0) {
    launch_max(next_bucket, false);
    ++next_bucket;
  }
}

void ExactReducer::finalize() {
  armed = false;
  in_pass = false;
  for (std::size_t p = 0; p < params.size(); ++p) {
    if (!ready[p]) views[micro][p].zero_();  // not used by this micro-batch: contributes zero
    ready[p] = 0;
  }
  if (!last_micro()) {
    clear_grads();  // partial gradients stay in the slots, out of the user's reach
    ++micro;
    return;
  }
  finish_step(false);
}

void ExactReducer::launch_max(std::size_t bi, bool void_rank) {
  // The maxima's allreduce MAX (exact in any order) starts now and completes while backward
  // goes on; nothing waits for it before the end of backward. A NaN travels as +Inf (a max
  // with NaN depends on the order, with Inf it does not); the last bucket's extra slot is
  // the void flag: 1 from a rank whose step is void.
  Bucket& b = buckets[bi];
  std::vector<float>& h = b.host_max;
  if (void_rank) {
    std::fill(h.begin(), h.end(), 0.f);
  } else {
    kernels->copy_to_host(h.data(), b.maxima.raw_data(), h.size() * 4);
    for (float& m : h)
      if (std::isnan(m)) m = INFINITY;
  }
  // The step flag: 1 from a void rank; 2 (already there, from the device) from a rank whose
  // loss saw a bad label; a MAX, so a bad label wins.
  if (bi + 1 == buckets.size()) h.back() = void_rank ? 1.f : h.back() >= 1.5f ? 2.f : 0.f;
  if (pg->size() > 1) {
    kernels->copy_from_host(b.maxima.raw_data(), h.data(), h.size() * 4);
    b.max_work = pg->allreduce(b.maxima, ReduceOp::Max);
  }
}

void ExactReducer::reduce_sums() {
  // 1. The agreed maxima, bucket by bucket; the step's collective decisions (void,
  //    non-finite) come from them, so every rank takes the same branch below.
  for (std::size_t bi = 0; bi < buckets.size(); ++bi) {
    Bucket& b = buckets[bi];
    if (b.max_work) {
      WorkPtr w = std::move(b.max_work);
      w->wait();
      kernels->copy_to_host(b.host_max.data(), b.maxima.raw_data(), b.host_max.size() * 4);
    }
    if (bi + 1 == buckets.size() && b.host_max.back() != 0.f) {
      step_void = true;
      bad_label = b.host_max.back() >= 1.5f;
    }
    for (std::size_t i = 0; i < b.params.size() && nonfinite.empty(); ++i)
      if (!std::isfinite(b.host_max[i])) nonfinite = names[b.params[i]];
  }
  if (step_void || !nonfinite.empty()) return;  // no sums: the step is void everywhere
  // 2. Fixed point with the agreed scales, summed over this rank's micro-batches, then over
  //    the ranks: int64 additions, exact in any order.
  // 3. Divide once: sum / scale / K, into the last slot, which becomes .grad().
  const double count = static_cast<double>(micro_batches);
  const bool reduce = pg->size() > 1;
  for (auto& b : buckets)
    for (std::size_t i = 0; i < b.params.size(); ++i)
      scales[b.params[i]] = std::ldexp(1.0, scale_exponent(b.host_max[i], k_bits));
  auto convert = [&](Chunk& c) {
    for (auto& pc : c.pieces) {
      kernels->fill(pc.acc, 0.0);
      for (const Tensor& src : pc.src) kernels->fixed_point_accumulate(src, scales[pc.param], pc.acc);
    }
  };
  auto convert_back = [&](Chunk& c) {
    for (auto& pc : c.pieces) kernels->fixed_point_to_float(pc.acc, scales[pc.param], count, pc.out);
  };
  if (chunked) {  // inline collectives: each chunk's allreduce is done when it returns
    for (auto& b : buckets)
      for (auto& c : b.chunks) {
        convert(c);
        if (reduce) pg->allreduce(c.acc, ReduceOp::Sum)->wait();
        convert_back(c);
      }
    return;
  }
  // One chunk per bucket: each bucket's allreduce starts as soon as it is summed, while the
  // next one is converted.
  for (auto& b : buckets)
    for (auto& c : b.chunks) {  // one, or none for parameters without elements
      convert(c);
      if (reduce) b.work = pg->allreduce(c.acc, ReduceOp::Sum);
    }
  for (auto& b : buckets) {
    if (b.work) {
      WorkPtr w = std::move(b.work);
      w->wait();
    }
    for (auto& c : b.chunks) convert_back(c);
  }
}

void ExactReducer::drain() {
  for (auto& b : buckets)  // nothing may still write into the maxima or the sums
    for (WorkPtr* w : {&b.max_work, &b.work}) {
      if (!*w) continue;
      try {
        (*w)->wait();
      } catch (const CommError&) {
      }
      w->reset();
    }
}

void ExactReducer::finish_step(bool void_rank) {
  std::exception_ptr comm_error, other_error;
  try {
    for (; next_bucket < buckets.size(); ++next_bucket) launch_max(next_bucket, void_rank);
    if (void_rank) {
      for (auto& b : buckets)
        if (b.max_work) {
          WorkPtr w = std::move(b.max_work);
          w->wait();
        }
    } else {
      reduce_sums();
    }
  } catch (const CommError&) {
    comm_error = std::current_exception();
  } catch (...) {
    // Not the group's failure (a device error reading the maxima, or CUDA's deferred label
    // error of a loss computed outside the step): this rank's step is void. Send the maxima
    // it has not sent yet with the void flag, so the peers' step fails too and the group stays
    // in step, and leave the reducer reset below before rethrowing.
    other_error = std::current_exception();
    try {
      for (; next_bucket < buckets.size(); ++next_bucket)
        if (!buckets[next_bucket].max_work) launch_max(next_bucket, true);
    } catch (const CommError&) {
      comm_error = std::current_exception();
    } catch (...) {
    }
  }
  drain();
  // Every step starts from zero maxima, a void one's too (its maxima hold this rank's partial
  // or the group's agreed ones): a leftover would raise the next step's max, hence change its
  // scale, on this rank only, making the next step's bits depend on who voided what.
  for (auto& b : buckets) b.maxima.zero_();
  const bool was_void = step_void, was_bad_label = bad_label;
  const std::string bad = nonfinite;
  reset_step();
  clear_grads();
  if (comm_error) {
    try {
      std::rethrow_exception(comm_error);
    } catch (const CommError&) {
      rethrow_with_context(std::current_exception(), "DDP exact mode: reducing the gradients failed: ");
    }
  }
  if (other_error) std::rethrow_exception(other_error);
  if (void_rank) return;  // the caller (void_step) says why
  // The same message on every rank: it depends on the agreed flag only.
  if (was_bad_label)
    throw ValueError(detail::concat(
        "DDP exact mode: cross_entropy got a target outside [0, classes) on at least one of ", pg->size(),
        " rank(s) in this step, so this step is void on every rank and its gradients are cleared; skip this "
        "optimizer step and fix the labels (each must be a class index below the model's output width)"));
  if (was_void)
    throw PeerFailedError(detail::concat(
        "DDP exact mode: a backward pass stopped part-way on at least one of ", pg->size(),
        " rank(s), so this step is void on every rank and its gradients are cleared; skip this optimizer "
        "step and start the next step with its first micro-batch, or stop (the failing rank's own error says why)"));
  if (!bad.empty())
    throw ValueError("DDP exact mode: the gradient of parameter '" + bad +
                     "' is not finite (NaN or Inf) in this step on at least one rank; the step is void on every "
                     "rank and its gradients are cleared: skip this optimizer step, or lower the learning rate / "
                     "check the data");
  for (std::size_t p = 0; p < params.size(); ++p) params[p].set_grad(views[per_rank - 1][p]);
}

void ExactReducer::void_step(const std::string& why) {
  // The peers agree on the scales bucket by bucket at the end of their step: take part in
  // the collectives this rank has not issued yet, with the void flag set, so every rank's
  // step fails and the group stays in step.
  finish_step(true);
  throw AutogradError("DDP exact mode: " + why +
                      ", so this step is void on every rank and its gradients are cleared; this forward was "
                      "not counted: start the next step with its first micro-batch");
}

}  // namespace phalanx::parallel
