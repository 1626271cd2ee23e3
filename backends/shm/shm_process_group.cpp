#include "shm_process_group.hpp"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/prefix_store.hpp"
#include "phalanx/core/env.hpp"
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
    publish_pid(*store, c.rank);  // before anything that can fail: the others see this rank exit
    const WaitPolicy policy = wait_policy_from_env(std::max(c.size, c.ranks_on_machine));
    seg_ = std::make_unique<Segment>(*store, c.rank, c.size, slot_bytes_from_env(),
                                     bytes_from_env("PHALANX_SHM_SMALL_BYTES", 16 * 1024),
                                     bytes_from_env("PHALANX_SHM_CHUNK_BYTES", 256 * 1024), c.timeout);
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
