#pragma once
// Backend: what carries the bytes of a ProcessGroup (docs/design.md, "Process groups";
// docs/plugins.md). A backend implements the synchronous `run_*` hooks; the ProcessGroup
// that owns it (phalanx/backends/process_group.hpp) calls them from its worker thread, one
// at a time in issue order, or on the caller's thread when the backend runs its operations
// inline. The group stops its threads before it destroys the backend, so a hook never runs
// on a backend whose destructor has begun: a backend needs no shutdown step of its own.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "phalanx/backends/reduce_op.hpp"
#include "phalanx/core/tensor.hpp"

namespace phalanx {

class ProcessGroup;

class Backend {
 public:
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// Whether the group runs this backend's operations on the caller's thread (no worker
  /// thread): for backends whose operations are trivial (the world of one) or cheaper than
  /// a thread hop (shm, MPI fast paths). Fixed at construction.
  bool inline_ops() const { return inline_ops_; }
  /// "gloo", "shm", "hierarchical:shm+gloo": what ProcessGroup::backend_name() returns.
  virtual std::string name() const = 0;

 protected:
  /// Throws ConfigError for a size below 1 or a rank outside [0, size).
  Backend(int rank, int size, std::chrono::milliseconds timeout, bool inline_ops = false);

  /// Called once by ProcessGroup::abort(), from the aborting thread, after the Works were
  /// completed: make the operation running in the backend return soon (close the
  /// connections, abort the communicator). Must not block, nor throw. The default does
  /// nothing.
  virtual void on_abort() noexcept {}
  /// Called once by ~ProcessGroup before it stops its threads (a hook may be running):
  /// make a wait that can no longer end well return now (a posted receive whose Work
  /// nobody will read). Must not block, nor throw. The default does nothing.
  virtual void on_close() noexcept {}

  // The tensors are the caller's own handles on an inline group (copies on a queued one):
  // a hook reads and writes their data, and never assigns to a handle itself.
  virtual void run_allreduce(Tensor& t, ReduceOp op, std::uint64_t seq) = 0;
  virtual void run_broadcast(Tensor& t, int root, std::uint64_t seq) = 0;
  virtual void run_allgather(std::vector<Tensor>& out, const Tensor& in, std::uint64_t seq) = 0;
  virtual void run_reduce_scatter(Tensor& out, std::vector<Tensor>& in, ReduceOp op,
                                  std::uint64_t seq) = 0;
  virtual void run_reduce(Tensor& t, int root, ReduceOp op, std::uint64_t seq) = 0;
  virtual void run_gather(std::vector<Tensor>& out, const Tensor& in, int root, std::uint64_t seq) = 0;
  virtual void run_scatter(Tensor& out, std::vector<Tensor>& in, int root, std::uint64_t seq) = 0;
  virtual void run_barrier(std::uint64_t seq) = 0;
  virtual void run_send(const Tensor& t, int dst, int tag, std::uint64_t seq) = 0;
  virtual void run_recv(Tensor& t, int src, int tag, std::uint64_t seq) = 0;

  /// Called from a run_* hook that only posted its operation (point-to-point): the Work
  /// completes when `waiter` returns, on the group's completion thread, so the worker can
  /// go on posting (a ring of sends and receives then cannot deadlock). Only valid inside a
  /// run_* hook called by the owning group.
  void defer_completion(std::function<void()> waiter);
  /// Like defer_completion, but with no thread of the group involved: the Work completes
  /// when `poll` returns true, and `poll` is called by whoever waits on the Work (wait(),
  /// is_completed()), on the waiter's thread, one step at a time (it must not block; it
  /// throws the operation's error, which breaks the group as any failure does). Used where
  /// only one thread may call the library (MPI at MPI_THREAD_SINGLE). Operations posted
  /// before any wait still cannot deadlock: every post happened before the first poll.
  /// A Work still pending when the group is destroyed fails ("destroyed before it
  /// completed") and its poll is dropped; the backend ends what it posted in its on_close
  /// or destructor. Only valid inside a run_* hook called by the owning group.
  void defer_polled(std::function<bool()> poll);

  /// From now on every operation of the owning group (and every poll of its Works) must
  /// come from the calling thread; another thread gets a ConfigError at the call: "<op> on
  /// rank R of W (<name>): called from a thread other than the one that created the process
  /// group; <rule>". Call from the constructor (the thread that creates the group).
  void restrict_to_this_thread(std::string rule);
  /// Whether the calling thread may call into this backend (always, unless restricted).
  bool on_allowed_thread() const {
    return only_thread_ == std::thread::id() || only_thread_ == std::this_thread::get_id();
  }
  /// Throws the ConfigError of restrict_to_this_thread for `op`.
  [[noreturn]] void wrong_thread(const char* op) const;

  /// "allreduce #12 on rank 1 of 4 (gloo)": the context every error message starts with.
  std::string describe(const std::string& op, std::uint64_t seq) const;
  /// Whether the owning group was aborted (set before on_abort runs; never cleared).
  bool is_aborted() const { return aborted_.load(std::memory_order_acquire); }
  /// How many operations the owning group has issued (0 outside a group).
  std::uint64_t sequence_number() const;

 private:
  friend class ProcessGroup;  // calls the hooks; sets group_ when it takes the backend
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  bool inline_ops_;
  std::atomic<bool> aborted_{false};  // set by ProcessGroup::abort
  ProcessGroup* group_ = nullptr;     // the owner, set by ProcessGroup's constructor
  std::thread::id only_thread_{};     // restrict_to_this_thread (default: any thread)
  std::string thread_rule_;
};

/// Frees a backend the way it was made: a plugin's `destroy` (the descriptor's, so the
/// object dies in the library that created it), else `delete`.
struct BackendDeleter {
  void (*destroy)(void*) = nullptr;
  BackendDeleter() = default;
  explicit BackendDeleter(void (*d)(void*)) : destroy(d) {}
  /// So that a std::unique_ptr<MyBackend> converts to a BackendPtr.
  template <class T>
  BackendDeleter(std::default_delete<T>) {}  // NOLINT(google-explicit-constructor)
  void operator()(Backend* b) const {
    if (destroy)
      destroy(b);
    else
      delete b;
  }
};

/// The owning pointer a ProcessGroup is built from.
using BackendPtr = std::unique_ptr<Backend, BackendDeleter>;

}  // namespace phalanx
