#pragma once
// Backend: what carries the bytes of a ProcessGroup (docs/design.md, "Process groups";
// docs/plugins.md). A backend implements the synchronous `run_*` hooks; the ProcessGroup
// that owns it (phalanx/backends/process_group.hpp) calls them from its worker thread, one
// at a time in issue order, or on the caller's thread when the backend runs its operations
// inline (inline_ops; the Works of those, inline_work, are the backend's business: MPI
// reuses its Works and restricts the thread). The group stops its threads before it destroys the
// backend, so a hook never runs on a backend whose destructor has begun: a backend needs no
// shutdown step of its own.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "phalanx/backends/reduce_op.hpp"
#include "phalanx/backends/work.hpp"
#include "phalanx/core/tensor.hpp"

namespace phalanx {

class ProcessGroup;

/// The operation an inline group is about to run on the caller's thread, as
/// Backend::inline_work sees it (valid during that call only).
class InlineOp {
 public:
  /// "allreduce", "send": a string literal (the same pointer for every call of an operation).
  const char* name() const { return name_; }
  /// Takes the operation's sequence number from the group. `one_issuer`: the backend makes
  /// sure that a single thread issues every operation of the group (MPI at
  /// MPI_THREAD_SINGLE), so a plain increment will do instead of an atomic one.
  std::uint64_t take_seq(bool one_issuer) const {
    if (!one_issuer) return seq_->fetch_add(1, std::memory_order_relaxed);
    const std::uint64_t s = seq_->load(std::memory_order_relaxed);
    seq_->store(s + 1, std::memory_order_relaxed);
    return s;
  }
  /// The timeout a Work of this group carries (Work's constructor).
  std::chrono::milliseconds work_timeout() const { return work_timeout_; }

 private:
  friend class ProcessGroup;
  InlineOp(const char* name, std::atomic<std::uint64_t>& seq, std::chrono::milliseconds work_timeout)
      : name_(name), seq_(&seq), work_timeout_(work_timeout) {}
  const char* name_;
  std::atomic<std::uint64_t>* seq_;
  std::chrono::milliseconds work_timeout_;
};

class Backend {
 public:
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// Whether the group runs this backend's operations on the caller's thread (no worker
  /// thread; each one's Work from inline_work): for backends whose operations are trivial (the
  /// world of one) or cheaper than a thread hop (shm, MPI fast paths). Fixed at construction.
  bool inline_ops() const { return inline_ops_; }
  /// Whether every peer is reached through this host's memory (shm): a collective moves
  /// bytes at memory speed with no per-message latency, so splitting it into many small
  /// ones costs nothing (DDP's exact mode reduces in cache-sized chunks there). Declared by
  /// the backend at construction (declare_shared_memory); false by default.
  bool shared_memory() const { return shared_memory_; }
  /// Whether the backend orders its operations on device tensors against the device's
  /// compute stream itself (NCCL: its own stream waits for an event). Otherwise the group
  /// does it (docs/gpu.md, "Stream ordering"): it records a ready event when the operation
  /// is issued and waits for it on the thread that runs the operation, which works on the
  /// device's communication stream meanwhile. Declared at construction; false by default.
  bool orders_device_streams() const { return orders_device_streams_; }
  /// "gloo", "shm", "hierarchical:shm+gloo": what ProcessGroup::backend_name() returns.
  virtual std::string name() const = 0;

 protected:
  /// Throws ConfigError for a size below 1 or a rank outside [0, size).
  Backend(int rank, int size, std::chrono::milliseconds timeout, bool inline_ops = false);

  /// Called once by ProcessGroup::abort(), from the aborting thread, after the Works were
  /// completed: make the operation running in the backend return soon (close the
  /// connections, abort the communicator), and fail the Works the backend completes itself
  /// (Work::attach_poll; record_failure gives the abort's error). Must not block, nor
  /// throw. The default does nothing.
  virtual void on_abort() noexcept {}
  /// Called once by ~ProcessGroup before it stops its threads (a hook may be running):
  /// make a wait that can no longer end well return now (a posted receive whose Work
  /// nobody will read). Must not block, nor throw. The default does nothing.
  virtual void on_close() noexcept {}
  /// For a backend whose every peer is in this host's memory (shared_memory()).
  void declare_shared_memory() { shared_memory_ = true; }
  /// For a backend that orders device streams itself (orders_device_streams()).
  void declare_device_streams() { orders_device_streams_ = true; }

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
  /// ProcessGroup::symmetric_zeros on CPU, with every rank calling it alike: `numel`
  /// zero-filled elements of `dtype` that this backend's collectives reduce in place, without
  /// staging copies (shm: memory that every rank maps, docs/shm.md "Zero-copy buffers"); or an
  /// undefined Tensor when the backend has no such memory (the default), and the group then
  /// hands out ordinary memory. Called on the caller's thread, never concurrently with itself.
  virtual Tensor alloc_symmetric(std::int64_t numel, DType dtype);

  /// Called from a run_* hook that only posted its operation (point-to-point): the Work
  /// completes when `waiter` returns, on the group's completion thread, so the worker can
  /// go on posting (a ring of sends and receives then cannot deadlock). Only valid inside a
  /// run_* hook called by the owning group.
  void defer_completion(std::function<void()> waiter);
  /// For a backend that orders device streams itself (declare_device_streams), inside a
  /// run_* hook on device tensors (null otherwise): the device's handle (CUDA: a
  /// cudaEvent_t, DeviceKernels::event_handle) of the operation's ready event, recorded on
  /// the issuing thread's compute stream when the operation was issued. Make the backend's
  /// stream wait for it on the device before the operation reads its inputs.
  void* ready_event() const;
  /// ... and of its done event: record it on the backend's stream after the operation's last
  /// work there, then call complete_on_device().
  void* done_event() const;
  /// The operation is queued on the device and its done event recorded: from now on its
  /// Work's wait() is a device-side wait on that event (Work::on_device). The Work completes
  /// on the host when `waiter` returns, on the group's completion thread (it watches the
  /// done event with the backend's timeout and abort, and throws on failure, which breaks
  /// the group as a failed run_* hook does); the group holds the operation's tensors until
  /// then, so their memory goes back to the allocator only once the device is done with
  /// them. Operations complete in issue order. Only valid inside a run_* hook on device
  /// tensors of a group whose backend orders device streams.
  void complete_on_device(std::function<void()> waiter);
  /// The Work of an inline backend's next operation (inline_ops), on the caller's thread,
  /// while the group takes operations: take its sequence number (op.take_seq) and make or
  /// reuse its Work. The group then runs the operation here and completes that Work, unless
  /// the run_* hook handed its end on (defer_completion, Work::attach_poll). Throwing
  /// refuses the operation: nothing runs. The default takes the number atomically and makes
  /// a new Work; shm and MPI reuse this thread's spare Work, MPI also refuses any thread but
  /// its own at MPI_THREAD_SINGLE (docs/mpi.md, "Threads").
  virtual WorkPtr inline_work(const InlineOp& op);
  /// The group's bookkeeping of an operation that failed outside a run_* hook (in a
  /// waiter's poll, or found failed at an abort): the failure hook for the group's first
  /// failure, the group broken, its queued operations failed. Returns the error the
  /// operation's Work should end with (the abort's error once the group was aborted).
  std::exception_ptr record_failure(const std::string& what, std::exception_ptr error);

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
  bool shared_memory_ = false;
  bool orders_device_streams_ = false;
  std::atomic<bool> aborted_{false};  // set by ProcessGroup::abort
  ProcessGroup* group_ = nullptr;     // the owner, set by ProcessGroup's constructor
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
