#pragma once
// The MPI communication backend (docs/mpi.md): every collective of the ProcessGroup
// interface on one MPI call over a private duplicate of MPI_COMM_WORLD (errors returned,
// never fatal). MPI works on host memory: CPU tensors are used in place; tensors of any other
// device (CUDA, sim) are staged through a host buffer, as the Gloo plugin does.
//
// Operations run on the caller's thread by default (the Backend's inline mode: a 4-byte
// allreduce costs what MPI_Allreduce costs, with no hop to a worker thread); their Work is
// complete when the call returns. PHALANX_MPI_ASYNC=1 runs them on the group's worker thread
// instead (the caller overlaps computation with a collective in flight).
//
// Thread levels (docs/mpi.md, "Threads"). Inline mode initialises MPI at MPI_THREAD_SINGLE
// (OpenMPI locks inside every call at any higher level): every MPI call of the process is
// then made on one thread, the one that created the group (and initialised MPI); another
// thread gets a one-line ConfigError at the call (inline_work). send and recv post MPI_Isend /
// MPI_Irecv and their Work is completed by its waiter (Work::attach_poll: MPI_Test on the
// thread that waits). No MPI lock is taken: one thread cannot race itself.
// mpi_single_thread.cpp holds what this mode needs. With PHALANX_MPI_ASYNC=1,
// PHALANX_MPI_THREADS=serialized, or MPI initialised by the application at
// MPI_THREAD_SERIALIZED or above, send and recv complete on the group's completion thread,
// and all MPI calls of the process are serialised by one lock (MpiCall, mpi_runtime.hpp: an
// atomic exchange when uncontended).
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "../plugin_support/inline_work.hpp"
#include "phalanx/backends/process_group.hpp"

namespace phalanx::mpi_backend {

class MpiProcessGroup final : public Backend {
 public:
  explicit MpiProcessGroup(const BackendConfig& config);
  ~MpiProcessGroup() override;
  std::string name() const override { return "mpi"; }

 protected:
  /// The group is going away: a send or recv still waiting ends now (its Work fails).
  void on_close() noexcept override { closing_ = true; }
  /// The sends and receives left to their waiters fail with the abort's error.
  void on_abort() noexcept override;
  /// On the caller's thread: the thread check (MPI_THREAD_SINGLE), then this thread's
  /// spare Work.
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

 private:
  /// Throws CommError "<describe(op, seq)> failed: MPI: <MPI_Error_string>" unless rc is MPI_SUCCESS.
  void check(int rc, const char* op, std::uint64_t seq) const;
  MPI_Datatype type_of(const Tensor& t) const;
  MPI_Op op_of(const Tensor& t, ReduceOp op) const;
  /// A reusable host buffer of at least `bytes` (used only under the MPI call lock).
  char* scratch(std::size_t bytes);
  /// The completion of a posted send or receive (on the completion thread): MPI_Test under
  /// the MPI call lock, yielding between tests, then sleeping; fails at the group's timeout.
  void wait_request(MPI_Request request, const Tensor& keep_alive, const char* op, std::uint64_t seq);

  // MPI_THREAD_SINGLE (mpi_single_thread.cpp).
  /// The ConfigError of an operation (or a wait) from another thread than owner_'s.
  [[noreturn, gnu::cold, gnu::noinline]] void wrong_thread(const char* op) const;
  /// A send or receive posted at MPI_THREAD_SINGLE, completed by its Work's waiter.
  struct Posted {
    MPI_Request request = MPI_REQUEST_NULL;
    Tensor host;    // the buffer MPI reads or writes
    Tensor target;  // a staged receive: where `host` lands (undefined otherwise)
    const char* op;
    std::uint64_t seq;
    std::chrono::steady_clock::time_point deadline;
    bool ended = false;  // completed, or given up (timed out, closed): no more polls
    int error = MPI_SUCCESS;  // or the error MPI_Test gave when another post's sweep ended it
    std::weak_ptr<plugin_support::PluginWork> work{};  // the Work its waiter polls
    bool reported = false;  // the Work's poll returned its end: the Work holds no poll any more
  };
  /// Posts nothing; registers `p` (the request just posted) to be completed by the waiter
  /// of the running operation's Work (current_).
  void defer_to_waiter(std::shared_ptr<Posted> p);
  /// The Work's poll: the thread check, then one poll(); a failure goes through the group's
  /// bookkeeping (record_failure) unless the group is being destroyed.
  bool poll_step(Posted& p, std::exception_ptr& failure);
  /// One MPI_Test of `p`: true once it completed; throws TimeoutError past its deadline,
  /// CommError once the group is closing or aborted.
  bool poll(Posted& p);
  /// ~MpiProcessGroup: the Works still waiting for their waiter fail ("destroyed before it
  /// completed (nobody waited for it)") and drop their polls, which refer to this backend.
  void drop_polls() noexcept;
  /// ~MpiProcessGroup on another thread than owner_'s (no MPI call allowed): keeps the
  /// buffers of the requests still pending until exit.
  void abandon_posted() noexcept;
  /// ~MpiProcessGroup at MPI_THREAD_SINGLE: ends the requests nobody completed. A receive is
  /// cancelled (MPI_Cancel, then completed); a send is cancelled where MPI can, else freed
  /// (MPI_Request_free: it completes in the background) and its buffer kept until exit.
  void end_posted() noexcept;

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op sum_fp16_ = MPI_OP_NULL, sum_bf16_ = MPI_OP_NULL;
  int tag_ub_ = 32767;
  std::mutex mpi_mu_;                // guards orphans_ (MPI calls hold MpiCall instead)
  std::vector<char> scratch_;        // under the MPI call lock (MpiCall)
  std::vector<Tensor> orphans_;      // buffers of timed-out requests MPI may still write (under mpi_mu_)
  std::atomic<bool> closing_{false};  // the destructor runs: pending waits end at once
  bool single_ = false;  // MPI runs at MPI_THREAD_SINGLE (or FUNNELED): one thread, no lock
  bool locked_ = true;   // !single_: MPI calls take the process-wide MpiCall lock
  std::thread::id owner_;  // single_: the one thread that may call MPI (it created the group)
  // single_: owner_'s spare-Work slot, which holds the Work of the operation running now
  const std::shared_ptr<plugin_support::PluginWork>* current_ = nullptr;
  // single_ only: changed by owner_ under posted_mu_ (on_abort reads it from another thread).
  std::vector<std::shared_ptr<Posted>> posted_;
  std::mutex posted_mu_;
};

}  // namespace phalanx::mpi_backend
