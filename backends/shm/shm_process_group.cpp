#include "shm_process_group.hpp"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/prefix_store.hpp"
#include "phalanx/core/env.hpp"
#include "phalanx/core/storage.hpp"
#include "phalanx/core/tensor_impl.hpp"
#include "phalanx/core/warning.hpp"
#include "../plugin_support/inline_work.hpp"
#include "shm_signature.hpp"

namespace phalanx::shm {

namespace {

bool inline_from_env() { return env::flag("PHALANX_SHM_INLINE", true); }

std::size_t bytes_from_env(const char* name, std::size_t fallback) {
  return env::bytes(name, fallback, 0, std::numeric_limits<std::size_t>::max());
}

}  // namespace

ShmProcessGroup::ShmProcessGroup(const BackendConfig& c)
    : Backend(c.rank, c.size, c.timeout, inline_from_env()), sends_(c.size), recvs_(c.size) {
  declare_shared_memory();
  try {
    if (!c.store) throw ConfigError("shm backend: BackendConfig::store is null (the rendezvous needs a store)");
    auto store = std::make_shared<PrefixStore>("shm", c.store);
    store_ = store;
    publish_pid(*store, c.rank);  // before anything that can fail: the others see this rank exit
    const WaitPolicy policy = wait_policy_from_env(std::max(c.size, c.ranks_on_machine));
    seg_ = std::make_unique<Segment>(*store, c.rank, c.size, slot_bytes_from_env(),
                                     bytes_from_env("PHALANX_SHM_SMALL_BYTES", 16 * 1024),
                                     bytes_from_env("PHALANX_SHM_CHUNK_BYTES", 256 * 1024), c.timeout,
                                     /*channels=*/true, env::flag("PHALANX_SHM_ZERO_COPY", true) ? 1 : 0);
    // Rank 0's switch: a rank whose own differed would skip the others' collective
    // alloc_symmetric (and both would wait until the timeout).
    zero_copy_ = seg_->user() == 1;
    sync_ = std::make_unique<Sync>(*seg_, c.rank, policy, c.timeout);
    small_max_ = seg_->small_bytes();  // rank 0's, so that every rank cuts messages alike
    chunk_bytes_ = seg_->chunk_bytes();
    // Everyone attached: one barrier so that no rank starts while another is still setting up.
    Op o = begin("create", 0, make_sig(OpCode::Barrier, SigFields{}, 0));
    step(o);
    next_round();
    collectives_ = 0;  // the creation barrier is not the user's
    if (c.size > 1) binding_ = bind_to_share(c.rank, c.size);
  } catch (...) {
    // The others stop waiting for this rank at once (not at their timeout).
    if (sync_) sync_->mark_failed();
    else if (seg_) seg_->line(c.rank).state.store(kFailed, std::memory_order_seq_cst);
    sync_.reset();
    seg_.reset();
    throw;
  }
}

ShmProcessGroup::~ShmProcessGroup() {
  // The group stopped its threads before destroying this backend.
  if (sync_) sync_->mark_left(collectives_);
}

Tensor ShmProcessGroup::alloc_symmetric(std::int64_t numel, DType dtype) {
  if (!zero_copy_ || numel <= 0) return {};
  const std::size_t bytes = static_cast<std::size_t>(numel) * element_size(dtype);
  const std::uint32_t index = symmetric_count_++;  // every rank counts alike (a collective call)
  auto store = std::make_shared<PrefixStore>("symm/" + std::to_string(index), store_);
  publish_pid(*store, rank());
  // The ranks are the group's: one that died, failed or left before it came fails this at
  // once, named (its pid is in the group's segment), not at the timeout.
  const auto gone = [this, index](int r) -> std::string {
    if (sync_->aborted())  // the failure watcher: another rank failed, maybe still alive
      return detail::concat("the process group was aborted while this rank waited for rank ", r,
                            " to make zero-copy buffer #", index, " (ProcessGroup::symmetric_zeros)");
    const int why = sync_->peer_problem(r);
    if (why == 0) return {};
    return detail::concat("rank ", r, " (pid ", seg_->line(r).pid, ") ",
                          why == 1 ? "died (it exited or was killed)" : why == 2 ? "left the group" : "failed",
                          " before it made zero-copy buffer #", index,
                          " (ProcessGroup::symmetric_zeros); the job cannot continue: restart it");
  };
  std::shared_ptr<Segment> seg;
  try {
    seg = std::make_shared<Segment>(*store, rank(), size(), (bytes + 4095) / 4096 * 4096, 0, 0, timeout(),
                                    /*channels=*/false, bytes, gone);
  } catch (const BackendUnavailableError& e) {
    // Rank 0 told every rank (the store): all of them fall back alike.
    warn_once("shm-zero-copy", detail::concat("shm: no zero-copy buffer of ", bytes, " bytes (", e.what(),
                                              "); its collectives copy through the staging slots"));
    return {};
  }
  if (seg->user() != bytes)  // rank 0's slots would not hold this rank's tensor, or not alike
    throw ValueError(detail::concat("symmetric_zeros(", numel, ", ", dtype_name(dtype), "): rank 0 asked for ",
                                    seg->user(), " bytes, this rank (", rank(), ") for ", bytes,
                                    ": every rank must call it with the same numel and dtype, in the same order"));
  char* mine = seg->slot_base(rank());
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    // Buffers already freed leave the list here (their segments are unmapped).
    regions_.erase(std::remove_if(regions_.begin(), regions_.end(), [](const Region& r) { return r.seg.expired(); }),
                   regions_.end());
    regions_.push_back(Region{mine, bytes, index, seg});
    regions_count_.store(regions_.size(), std::memory_order_release);
  }
  auto storage = Storage::borrow(mine, bytes, Device::cpu(), seg);
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), 0, Shape{numel}, dtype));
}

std::shared_ptr<Segment> ShmProcessGroup::find_region(const Tensor& t, std::size_t* offset, std::uint32_t* index) {
  if (!t.device().is_cpu() || !t.is_contiguous()) return nullptr;
  const char* data = static_cast<const char*>(t.raw_data());
  const std::size_t n = t.nbytes();
  // Every allreduce asks: no lock while the group has no zero-copy buffer, and the address
  // compared before the weak_ptr is locked (an atomic read-modify-write per region was 1 us
  // per call with 64 buffers, more than a whole small staged allreduce).
  if (regions_count_.load(std::memory_order_acquire) == 0) return nullptr;
  std::lock_guard<std::mutex> lock(regions_mu_);
  for (const Region& r : regions_) {
    if (data < r.base || data + n > r.base + r.bytes) continue;
    std::shared_ptr<Segment> seg = r.seg.lock();  // a freed region's address may be reused: the next may match
    if (!seg) continue;
    *offset = static_cast<std::size_t>(data - r.base);
    *index = r.index;
    return seg;
  }
  return nullptr;
}

WorkPtr ShmProcessGroup::inline_work(const InlineOp& op) {
  return plugin_support::spare_work(op, op.take_seq(false), rank());
}

void ShmProcessGroup::on_abort() noexcept {
  if (sync_) sync_->abort();
}

ShmProcessGroup::Op ShmProcessGroup::begin(const char* name, std::uint64_t seq, std::uint64_t sig) const {
  if (busy_.exchange(true, std::memory_order_acquire))
    throw CommError(describe(name, seq) + ": another thread is running an operation of this group right now; "
                    "issue a group's operations from one thread at a time (or set PHALANX_SHM_INLINE=0)");
  ++collectives_;
  return Op(name, seq, sig, &busy_);
}

void ShmProcessGroup::step(Op& o) {
  const std::uint64_t s = ++step_;
  sync_->post(s, o.sig);
  const int W = size(), me = rank();
  Segment& seg = *seg_;
  if (W == 1) return;
  auto ready = [&] {
    for (int q = 0; q < W; ++q)
      if (q != me && seg.line(q).step.load(std::memory_order_acquire) < s) return false;
    return true;
  };
  auto need = [&](int q) { return seg.line(q).step.load(std::memory_order_acquire) < s; };
  sync_->wait(ready, need, o.deadline, [&] { return describe(o.name, o.seq); });
  if (o.first) {
    o.first = false;
    for (int q = 0; q < W; ++q) {
      if (q == me) continue;
      const std::uint64_t theirs = seg.line(q).sig[s & 1].load(std::memory_order_relaxed);
      if (theirs != o.sig) fail_signature(o, q, theirs);
    }
  }
}

void ShmProcessGroup::fail_signature(const Op& o, int q, std::uint64_t theirs) {
  sync_->mark_failed();
  throw CommError(describe(o.name, o.seq) + ": rank " + std::to_string(q) + " called " + sig_str(theirs) +
                  " where this rank called " + sig_str(o.sig) +
                  "; every rank must issue the same collectives with the same sizes, dtypes, reduce ops and roots, in the "
                  "same order (ranks that ran different numbers of steps: give each the same number of batches, "
                  "as DistributedSampler does, or use parallel::Join for uneven inputs)");
}

}  // namespace phalanx::shm
