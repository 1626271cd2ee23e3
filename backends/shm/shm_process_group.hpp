#pragma once
// The shared-memory communication backend ("shm"): every rank of the group on one host,
// all bytes through one POSIX shared-memory segment (docs/shm.md).
//
// Operations run inline on the caller's thread (PHALANX_SHM_INLINE=0: on the group's worker
// thread), so a small allreduce costs a few cache-line transfers, not a thread hop. The
// collectives advance in "rounds": each rank writes its part into its own staging slot
// (half round & 1 of it), posts a step, waits until every rank posted it, and reads the
// others' slots. Reductions sum the ranks' values in rank order 0..W-1, so results are
// the same bits on every rank and in every run. send/recv go through a ring buffer per
// ordered pair of ranks, advanced by whichever thread waits (so a ring of sends and
// receives cannot deadlock).
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "phalanx/backends/process_group.hpp"  // BackendConfig, Backend
#include "shm_segment.hpp"
#include "shm_sync.hpp"

namespace phalanx::shm {

class ShmProcessGroup final : public Backend {
 public:
  explicit ShmProcessGroup(const BackendConfig& config);
  ~ShmProcessGroup() override;
  std::string name() const override { return "shm"; }

 protected:
  void on_abort() noexcept override;
  /// Ends the waits of pending sends and receives: their Works fail at once with "the
  /// process group was destroyed before it completed". A collective running on the worker
  /// (PHALANX_SHM_INLINE=0) is left alone: the group waits for it.
  void on_close() noexcept override;
  /// Inline mode: this thread's spare Work (no allocation per operation).
  WorkPtr inline_work(const InlineOp& op) override;
  void run_allreduce(Tensor& t, ReduceOp op, std::uint64_t seq) override;
  void run_broadcast(Tensor& t, int root, std::uint64_t seq) override;
  void run_allgather(std::vector<Tensor>& out, const Tensor& in, std::uint64_t seq) override;
  void run_reduce_scatter(Tensor& out, std::vector<Tensor>& in, ReduceOp op, std::uint64_t seq) override;
  void run_reduce(Tensor& t, int root, ReduceOp op, std::uint64_t seq) override;
  void run_gather(std::vector<Tensor>& out, const Tensor& in, int root, std::uint64_t seq) override;
  void run_scatter(Tensor& out, std::vector<Tensor>& in, int root, std::uint64_t seq) override;
  void run_barrier(std::uint64_t seq) override;
  void run_send(const Tensor& t, int dst, int tag, std::uint64_t seq) override;
  void run_recv(Tensor& t, int src, int tag, std::uint64_t seq) override;
  /// A new segment holding one slot of round_up(numel x element size, page) bytes per rank
  /// (made and attached through the store, as the group's own); this rank's slot, zero-filled,
  /// as the tensor's memory (the segment stays mapped while the tensor or a view of it lives).
  /// Undefined (the group falls back to ordinary memory) with PHALANX_SHM_ZERO_COPY=0 or when
  /// rank 0 cannot make the segment (/dev/shm too small: a one-line warning).
  Tensor alloc_symmetric(std::int64_t numel, DType dtype) override;

 private:
  /// A zero-copy buffer: this rank's slot in `seg`; the same offset in every rank's slot is
  /// the same element of their buffers.
  struct Region {
    const char* base;  ///< this rank's slot (compared only while seg is alive)
    std::size_t bytes;
    std::uint32_t index;  ///< the group's count of zero-copy buffers when it was made
    std::weak_ptr<Segment> seg;
  };
  /// The region a whole contiguous host tensor lies in (its segment locked), or null.
  std::shared_ptr<Segment> find_region(const Tensor& t, std::size_t* offset, std::uint32_t* index);
  /// Allreduce of a tensor at `offset` in every rank's slot of `seg`: each rank reduces its
  /// 1/W slice straight from the W slots and writes it into all of them; two steps, no copies.
  void allreduce_in_place(Tensor& t, ReduceOp op, Segment& seg, std::size_t offset, std::uint32_t index,
                          std::uint64_t seq);

  /// The operation running now (collectives run one at a time, in issue order).
  struct Op {
    const char* name;
    std::uint64_t seq;
    std::uint64_t sig;
    std::atomic<bool>* busy;       ///< released when the operation ends
    Clock::time_point deadline{};  ///< set when the operation first has to wait
    bool first = true;             ///< its first step checks every rank's signature
    Op(const char* n, std::uint64_t s, std::uint64_t g, std::atomic<bool>* b) : name(n), seq(s), sig(g), busy(b) {}
    Op(const Op&) = delete;
    Op& operator=(const Op&) = delete;
    ~Op() { busy->store(false, std::memory_order_release); }
  };
  Op begin(const char* name, std::uint64_t seq, std::uint64_t sig) const;
  /// Posts the next step and waits until every rank posted it.
  void step(Op& op);
  /// The half of the staging slots the current round uses; next_round() moves on.
  int half() const { return static_cast<int>(round_ & 1); }
  void next_round() { ++round_; }
  /// Allreduce (root < 0) or reduce to `root`, in place on host memory.
  void reduce_impl(Tensor& t, ReduceOp op, int root, Op& o);
  [[noreturn]] void fail_signature(const Op& o, int q, std::uint64_t theirs);

  // point to point (shm_p2p.cpp)
  struct P2p;
  using P2pPtr = std::shared_ptr<P2p>;
  void post_p2p(const P2pPtr& p);
  bool progress_locked();
  bool progress_send(P2p& p);
  bool progress_recv(P2p& p);
  void wait_p2p(const P2pPtr& p);

  std::unique_ptr<Segment> seg_;
  std::unique_ptr<Sync> sync_;
  std::uint64_t step_ = 0;   ///< the last step this rank posted
  std::uint64_t round_ = 0;  ///< rounds run so far (selects the slot half)
  /// Collectives begun (the caller's thread or the worker, one at a time): published in
  /// this rank's line when the group is destroyed, for peers that still wait.
  mutable std::uint64_t collectives_ = 0;
  std::size_t small_max_;    ///< allreduce up to this many bytes: one round, every rank reduces it all
  std::size_t chunk_bytes_;  ///< larger ones: rounds of this many bytes, each rank reducing 1/W of each
  std::string binding_;      ///< where bind_to_share put the creating thread
  std::shared_ptr<Store> store_;  ///< the group's store ("shm/"): zero-copy buffers' segments meet there
  bool zero_copy_ = true;         ///< rank 0's PHALANX_SHM_ZERO_COPY (Segment::user)
  std::mutex regions_mu_;         ///< alloc_symmetric (caller) against find_region (worker, PHALANX_SHM_INLINE=0)
  std::vector<Region> regions_;
  std::atomic<std::size_t> regions_count_{0};  ///< regions_.size(), read without the lock
  std::uint32_t symmetric_count_ = 0;

  /// Set while a collective runs: inline operations issued from two threads at once are an
  /// error, not a race on the steps.
  mutable std::atomic<bool> busy_{false};

  std::mutex p2p_mu_;
  std::vector<std::deque<P2pPtr>> sends_, recvs_;  ///< pending, per peer, in issue order
  std::atomic<bool> closing_{false};               ///< on_close ran: pending p2p waits end
};

}  // namespace phalanx::shm
