#pragma once
// ProcessGroup: the abstraction the rest of Phalanx talks to. DDP and the samplers do not
// know which backend carries the bytes.
//
// Every public call returns a Work handle at once. Operations run on the group's own
// worker thread, one after another in issue order (so every rank executes them in the
// same order), while the caller keeps computing; or on the caller's thread when the
// backend asks for it (Backend::inline_ops; their Works come from Backend::inline_work:
// a reused Work, a thread it insists on, are the backend's own). The bytes are carried by a Backend
// (phalanx/backends/backend.hpp) that the group owns: its destructor stops the threads,
// fails what is still queued, and only then destroys the backend, so a backend's hooks
// never run on a half-destroyed object. After an operation fails the group is broken:
// later operations fail at once with an error naming the first failure; the operations
// queued behind the first failure fail with it at once, and the failure hook runs for the
// first failure only.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "phalanx/backends/backend.hpp"
#include "phalanx/backends/default_timeout.hpp"
#include "phalanx/backends/reduce_op.hpp"
#include "phalanx/backends/work.hpp"
#include "phalanx/core/tensor.hpp"

namespace phalanx {

class Store;

/// What a backend factory receives.
struct BackendConfig {
  int rank = 0;
  int size = 1;
  std::shared_ptr<Store> store;  ///< rendezvous store (already prefixed for this group)
  std::chrono::milliseconds timeout{kDefaultTimeout};
  std::string hostname = "127.0.0.1";  ///< address this rank listens on
  /// Where this rank runs, decided once by parallel::init_process_group (docs/ddp.md,
  /// "Devices"): the launcher's LOCAL_RANK / LOCAL_WORLD_SIZE (or MPI's, SLURM's), and the
  /// device resolved from InitOptions::device / PHALANX_DEVICE / the config file ("cuda"
  /// without an index is cuda:LOCAL_RANK). Backends read these fields, never the environment.
  int local_rank = 0;
  int local_world_size = 1;
  Device device = Device::cpu();
  /// The job's ranks on this machine, whichever launcher started them (two launchers on one
  /// machine count together); 0 when unknown. Waits spin only while this fits the cores.
  int ranks_on_machine = 0;
};


class ProcessGroup final {
 public:
  /// Takes `backend` (non-null, not owned by another group yet) and starts the worker
  /// thread unless the backend runs its operations inline.
  explicit ProcessGroup(BackendPtr backend);
  /// Stops the threads (waits for the running operation to return), fails what is still
  /// queued ("destroyed before it ran"), then destroys the backend.
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string backend_name() const { return backend_->name(); }
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// The backend, for tests and tools that need its concrete type (dynamic_cast).
  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }

  // Tensors are taken by reference: an operation that runs on the caller's thread (inline
  // backends) uses the caller's handles as they are; a queued one copies them (the handles,
  // not the data) into its closure. Either way the data is read and written in place.

  /// In place: every rank ends with the reduction of all ranks' `tensor`.
  WorkPtr allreduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  /// In place: every rank ends with `root`'s tensor.
  WorkPtr broadcast(const Tensor& tensor, int root = 0);
  /// outputs[r] receives rank r's input (outputs: `size()` tensors shaped like input).
  WorkPtr allgather(const std::vector<Tensor>& outputs, const Tensor& input);
  /// output receives the reduction over ranks of inputs[rank()] (inputs: `size()` tensors).
  WorkPtr reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op = ReduceOp::Sum);
  /// In place at `root` only; other ranks' tensors are left as they were.
  WorkPtr reduce(const Tensor& tensor, int root = 0, ReduceOp op = ReduceOp::Sum);
  /// At `root`, outputs[r] receives rank r's input; outputs is ignored elsewhere.
  WorkPtr gather(const std::vector<Tensor>& outputs, const Tensor& input, int root = 0);
  /// output receives `root`'s inputs[rank()]; inputs is ignored elsewhere.
  WorkPtr scatter(const Tensor& output, const std::vector<Tensor>& inputs, int root = 0);
  WorkPtr barrier();
  WorkPtr send(const Tensor& tensor, int dst, int tag = 0);
  WorkPtr recv(const Tensor& tensor, int src, int tag = 0);

  /// A zero-filled 1-D tensor of `numel` elements of `dtype` on `device`, for a buffer that
  /// this group reduces again and again (DDP's gradient buckets): where the backend has memory
  /// its collectives reduce in place (shm: every rank maps every rank's buffer), allreduce on
  /// the whole tensor skips the copies in and out of the staging area; elsewhere (other
  /// backends, devices, one rank, PHALANX_SHM_ZERO_COPY=0, too little /dev/shm) an ordinary
  /// tensor. Collective where the backend has such memory: every rank calls it with the same
  /// numel and dtype in the same order (as DDP's constructor does). A contiguous part of
  /// it (every rank passing the same part) reduces in place too; a strided view goes through
  /// the staging area as any tensor does.
  Tensor symmetric_zeros(std::int64_t numel, DType dtype, Device device = Device::cpu());

  /// How many operations have been issued.
  std::uint64_t sequence_number() const;
  /// Whether an operation is running (on the worker or inline on a caller's thread) or
  /// queued right now. For exit handlers deciding whether this rank ended cleanly; true
  /// when it cannot tell without blocking.
  bool operation_in_flight() const;

  /// Ends the group from any thread (parallel::init_process_group's failure watcher calls it
  /// when another rank posts its failure): the running operation, everything queued and
  /// every later operation fail at once with `error`, even while the worker thread is still
  /// blocked inside the backend (its Work is completed from here; the backend's own result
  /// arrives later and is ignored). Idempotent: the first error stands. The backend is told
  /// (on_abort) so that an operation stuck in it returns soon. The tensors of an aborted
  /// operation must not be read: the backend may have written part of them, or may still
  /// be writing (until stop_threads() returns true, or the group is destroyed).
  void abort(std::exception_ptr error);
  bool is_aborted() const;

  /// Called on the worker thread when an operation fails on this rank, with the error and
  /// the operation's description; returns the error its Work should carry (e.g. the failing
  /// peer's own message). Set before the first operation; null = none.
  using FailureHook = std::function<std::exception_ptr(std::exception_ptr error, const std::string& what)>;
  void set_failure_hook(FailureHook hook);
  /// PHALANX_DEBUG=detail: called on the worker thread before each collective (not send or
  /// recv) with the collective's index among collectives and its signature, e.g.
  /// "allreduce(sum, float32 [4, 3])"; throws to fail that collective. Set before the first
  /// operation; null (the default) costs one branch per call.
  using CollectiveCheck = std::function<void(std::uint64_t index, const std::string& signature)>;
  void set_collective_check(CollectiveCheck check);

  /// Stops the worker threads: waits for the running operations to return, at most `grace`
  /// (negative = no limit). False when a thread is still blocked in the backend after
  /// `grace`: the group must then not be destroyed (plugin_registry leaks an aborted group
  /// whose worker is stuck rather than hang the process; the thread ends with the process).
  bool stop_threads(std::chrono::milliseconds grace = std::chrono::milliseconds(-1));

 private:
  friend class Backend;  // defer_completion, record_failure
  struct Item {
    WorkPtr work;
    std::function<void(std::uint64_t)> fn;
    std::string signature;  // non-empty only with a collective check
  };
  // process_group_operations.cpp: the ten operations and their dispatch.
  /// Issues one operation: `body(seq, args...)` calls the backend. While an inline group is
  /// open, runs it here at once on a Work from Backend::inline_work and the caller's own
  /// `args` (no copy, no lock, no std::function); otherwise enqueue()s a closure holding
  /// copies of them.
  template <class Body, class... Args>
  WorkPtr call(const char* op, const std::string& signature, Body body, const Args&... args);
  /// call() once the operation's stream ordering is settled (its ready event, for device
  /// tensors of a backend that does not order the device's streams itself).
  template <class Body, class... Args>
  WorkPtr dispatch(const char* op, const std::string& signature, Body body, const Args&... args);
  void check_root(int root, const char* op) const;
  void check_peer(int peer, const char* op) const;
  // work_queue.cpp: the worker thread and its queue, the completion thread.
  WorkPtr enqueue(const char* op, std::function<void(std::uint64_t)> fn, std::string signature = {});
  void worker_loop();
  void completion_loop();
  /// Backend::defer_completion lands here (inside a run_* hook).
  void defer_completion(std::function<void()> waiter) { pending_waiter_ = std::move(waiter); }
  void run_item(Item& item);
  // src/run_operation.hpp: one operation on its Work, on the worker or inline.
  template <bool kUnshared, class Fn>
  void run_op(const WorkPtr& work, Fn& fn, const std::string& signature);
  /// The device events of an operation on device tensors of a backend that orders device
  /// streams, while its run_* hook runs (Backend::ready_event, done_event, complete_on_device).
  struct DeviceOp {
    DeviceKernels* kernels = nullptr;
    void* ready = nullptr;  // recorded when the operation was issued
    void* done = nullptr;   // recorded by the backend after the operation
    bool enqueued = false;  // complete_on_device was called
  };
  // process_group.cpp: the group's life and failures.
  void fail_item(const WorkPtr& work, std::exception_ptr error);
  /// The bookkeeping of a failed operation described by `what` (failure hook for the first
  /// failure, the group broken, queued operations failed); returns the error its Work ends with.
  std::exception_ptr record_failure(const std::string& what, std::exception_ptr error);
  static Backend* adopt(const BackendPtr& backend);  // checks it; throws ValueError
  std::string describe(const std::string& op, std::uint64_t seq) const { return backend_->describe(op, seq); }
  /// A Work's own bound (Work::wait): the backend's timeout fires first.
  std::chrono::milliseconds work_timeout() const { return timeout_ + std::chrono::seconds(5); }

  BackendPtr backend_;  // destroyed explicitly by ~ProcessGroup, after the threads stopped
  Backend* be_;         // backend_.get(), for the hooks

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  bool inline_ops_;
  // PHALANX_TEST_SKIP_READY_WAIT: "1" (every operation) or "allreduce" (that one only): operations on device
  // tensors skip their ready event's wait (tests prove with it that the sim device's
  // asynchronous mode catches a missing wait); "0" otherwise.
  std::string skip_ready_wait_;
  // PHALANX_TEST_SKIP_DEVICE_ORDER (backends that order device streams): "wait" makes
  // Work::wait() skip its device-side wait ("wait_allreduce": an allreduce's only), "hold" releases an operation's tensors as soon
  // as its run_* hook returned instead of once its done event completed; "0" otherwise.
  std::string skip_device_order_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  WorkPtr running_;                  // the operation the worker is running now
  std::exception_ptr abort_error_;   // set by abort()
  FailureHook failure_hook_;
  CollectiveCheck collective_check_;
  std::atomic<bool> checking_{false};  // collective_check_ is set (read on the caller's thread)
  std::uint64_t collective_index_ = 0;  // worker thread only
  std::condition_variable exit_cv_;
  bool worker_exited_ = false, completer_exited_ = false;
  std::atomic<std::uint64_t> next_seq_{0};  // written under mu_, or by an inline operation (InlineOp)
  bool stopping_ = false;
  // abort_error_, stopping_ or broken_ is set (stored under mu_ after them; never cleared):
  // the inline path reads it instead of taking mu_.
  std::atomic<bool> closed_{false};
  // Set by the destructor before on_close(): a failure it provokes (a posted receive ended
  // by on_close) ends that Work only; it is not reported through the failure hook.
  std::atomic<bool> destroying_{false};
  std::string broken_;  // non-empty once an operation failed
  bool failed_ = false;  // an operation failed here: the hook ran (only for the first)
  std::thread worker_;
  // deferred completions (point-to-point)
  std::function<void()> pending_waiter_;  // set by defer_completion during a run_* hook
  // The running hook's device events (worker thread, or the caller's for an inline group),
  // and the done event the hook handed on (complete_on_device) for run_op to give its Work.
  DeviceOp* device_op_ = nullptr;
  DeviceOp pending_device_;
  std::deque<std::pair<WorkPtr, std::function<void()>>> completions_;
  // The waiters of device operations that failed on the completion thread (a watchdog's
  // timeout, an abort): the tensors they hold may still be in use by work queued on the
  // backend's stream, so they are released with the group, after the backend (which
  // finishes or aborts that work first), never when the failure is found.
  std::vector<std::function<void()>> failed_device_waiters_;
  std::condition_variable completion_cv_;
  std::thread completer_;
  WorkPtr completing_;  // the deferred completion running now
  // An inline operation is running on a caller's thread (plain stores around it, no
  // read-modify-write: a group's inline operations come from one thread at a time).
  std::atomic<bool> inline_active_{false};
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

}  // namespace phalanx
