#include "nccl_process_group.hpp"

#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/store.hpp"

namespace phalanx::nccl_backend {

namespace {

void cuda_ok(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw CommError(std::string("nccl backend: ") + call + " failed: " + cudaGetErrorString(e));
}
/// A call's own result; ncclInProgress (non-blocking communicator) is waited for separately.
void nccl_ok(ncclResult_t r, const char* call) {
  if (r != ncclSuccess && r != ncclInProgress) throw CommError(std::string(call) + " failed: " + ncclGetErrorString(r));
}

std::string secs(std::chrono::milliseconds t) { return detail::concat(t.count() / 1000.0, " s"); }

std::string last_error(ncclComm_t comm) {
  const char* s = comm ? ncclGetLastError(comm) : nullptr;
  return s && *s ? std::string(" (") + s + ")" : std::string();
}

/// ncclGroupStart/End; the group is closed on every path (an open group would swallow the
/// thread's later NCCL calls).
class NcclGroup {
 public:
  NcclGroup() { nccl_ok(ncclGroupStart(), "ncclGroupStart"); }
  ~NcclGroup() {
    if (open_) ncclGroupEnd();
  }
  void end() {
    open_ = false;
    nccl_ok(ncclGroupEnd(), "ncclGroupEnd");
  }

 private:
  bool open_ = true;
};

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Float32: return ncclFloat32;
    case DType::Int64: return ncclInt64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Bool: return ncclUint8;  // moved, never reduced (ProcessGroup refuses)
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;  // native
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Product: return ncclProd;
  }
  return ncclSum;
}

/// This rank's GPU, checked before NCCL is touched: two ranks of a node on one GPU hang or
/// fail inside NCCL, so say so here, with the fix.
int pick_device(const BackendConfig& c) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    throw BackendUnavailableError(detail::concat("nccl: rank ", c.rank, " sees no CUDA device (",
                                                 e != cudaSuccess ? cudaGetErrorString(e) : "the driver sees none",
                                                 "); use the gloo backend"));
  int dev = c.local_rank;  // a CPU device with backend nccl: cuda:LOCAL_RANK
  if (c.device.type == DeviceType::CUDA && c.device.index >= 0)
    dev = c.device.index;
  else if (c.device.type != DeviceType::CUDA && !c.device.is_cpu())
    throw ConfigError(detail::concat("nccl: rank ", c.rank, " was given device ", c.device.str(),
                                     "; the nccl backend needs CUDA devices (use the gloo backend for others)"));
  if (c.local_world_size > count)
    throw ConfigError(detail::concat(
        "nccl: LOCAL_RANK=", c.local_rank, " is one of ", c.local_world_size, " workers on this node, which has ",
        count, " CUDA device", count == 1 ? "" : "s", ": two ranks would share one GPU, which NCCL does not support; "
        "start at most ", count, " worker", count == 1 ? "" : "s", " per node (--nproc-per-node ", count,
        "), or use the gloo backend (it runs CUDA tensors through host memory)"));
  if (dev < 0 || dev >= count)
    throw ConfigError(detail::concat("nccl: rank ", c.rank, " (LOCAL_RANK=", c.local_rank, ") was given cuda:", dev,
                                     ", but this node has ", count, " CUDA device", count == 1 ? "" : "s",
                                     " (cuda:0 to cuda:", count - 1, "); start at most ", count,
                                     " workers per node, or use the gloo backend"));
  return dev;
}

}  // namespace

NcclBackend::P2pBatch::~P2pBatch() {
  if (done) cudaEventDestroy(done);  // released by CUDA once it completed
}

NcclBackend::NcclBackend(const BackendConfig& c) : Backend(c.rank, c.size, c.timeout) {
  // Each operation's stream waits for the ready event recorded in collective(); the group
  // adds none of its own (docs/gpu.md, "Stream ordering").
  declare_device_streams();
  try {
    device_ = pick_device(c);
    cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
    cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cuda_ok(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    cuda_ok(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    create_communicator(c);
  } catch (...) {
    if (comm_) ncclCommAbort(comm_);
    if (ready_) cudaEventDestroy(ready_);
    if (done_) cudaEventDestroy(done_);
    if (stream_) cudaStreamDestroy(stream_);
    throw;
  }
}

void NcclBackend::create_communicator(const BackendConfig& c) {
  const std::string where =
      detail::concat("nccl: creating the communicator on rank ", c.rank, " of ", c.size, " (cuda:", device_, ")");
  if (!c.store) throw ConfigError(where + ": the backend config has no rendezvous store");
  ncclUniqueId id;
  if (c.rank == 0) {
    nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
    c.store->set("nccl/unique_id",
                 Bytes(reinterpret_cast<std::uint8_t*>(&id), reinterpret_cast<std::uint8_t*>(&id) + sizeof id));
  } else {
    Bytes b;
    try {
      b = c.store->get("nccl/unique_id");
    } catch (const TimeoutError& e) {
      throw TimeoutError(where + " timed out: rank 0 did not publish NCCL's unique id (" + e.what() + ")");
    }
    if (b.size() != sizeof id)
      throw CommError(detail::concat(where, " failed: the unique id in the store has ", b.size(), " bytes, not ",
                                     sizeof id, " (a different NCCL version on rank 0?)"));
    std::memcpy(&id, b.data(), sizeof id);
  }
  c.store->set(detail::concat("nccl/joined/", c.rank), Bytes{1});  // names the missing ranks on a timeout

  // Non-blocking: the call returns at once, and the wait below is bounded by the timeout.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const auto deadline = Clock::now() + timeout();
  const ncclResult_t r = ncclCommInitRankConfig(&comm_, c.size, id, c.rank, &config);
  for (ncclResult_t state = r;;) {
    if (state == ncclInProgress) {
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
      if (q != ncclSuccess) state = q;
    }
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      const std::string detail_msg = last_error(comm_);
      if (comm_) ncclCommAbort(comm_);
      comm_ = nullptr;
      throw CommError(where + " failed: " + ncclGetErrorString(state) + detail_msg +
                      (state == ncclInvalidUsage ? "; two ranks given the same GPU also fail this way" : ""));
    }
    if (Clock::now() > deadline) {
      std::string missing;
      for (int k = 0; k < c.size; ++k)
        if (!c.store->check({detail::concat("nccl/joined/", k)})) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw TimeoutError(where + " timed out after " + secs(timeout()) + ": " +
                         (missing.empty() ? std::string("every rank joined, but NCCL did not connect them "
                                                        "(NCCL_DEBUG=INFO says why; NCCL_SOCKET_IFNAME picks the network)")
                                          : "rank(s) " + missing + " did not join") +
                         "; the communicator was aborted");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

NcclBackend::~NcclBackend() {
  // The group stopped its worker and completion threads before destroying this.
  if (comm_) {
    // Finalize (flushes what was issued), bounded; abort when it does not finish.
    const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(timeout(), std::chrono::seconds(30));
    ncclResult_t state = ncclCommFinalize(comm_);
    while (state == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
    }
    if (state == ncclSuccess) {
      (void)cudaStreamSynchronize(stream_);  // flushed: the tensors waiters still hold are free after this
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  // Aborted (here or by the watchdog): NCCL's kernels have stopped, but what was queued on
  // the stream after them (an allgather's copies out of its scratch) still runs. The group
  // releases the tensors of failed and unfinished operations after this returns, so the
  // stream must be idle first, or the compute stream could get a block it still writes.
  if (stream_) (void)cudaStreamSynchronize(stream_);
  barrier_ = Tensor();
  if (ready_) cudaEventDestroy(ready_);
  if (done_) cudaEventDestroy(done_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclBackend::check_tensor(const Tensor& t, const char* op) const {
  if (t.device().type != DeviceType::CUDA)
    throw TypeError(std::string(op) + ": the nccl backend takes CUDA tensors, got one on " + t.device().str() +
                    "; move it with .to(parallel::local_device()) or use the gloo backend for CPU tensors");
  if (t.device().index != device_)
    throw ValueError(detail::concat(op, ": the tensor is on ", t.device().str(), ", but rank ", rank(),
                                    "'s NCCL communicator is on cuda:", device_,
                                    "; move it with .to(parallel::local_device())"));
}

void NcclBackend::check_alive_locked(const char* op, std::uint64_t seq) const {
  if (aborted_) throw CommError(describe(op, seq) + ": the communicator was aborted after an earlier failure");
}

void NcclBackend::fail_locked(const std::string& message, bool timed_out) {
  aborted_ = true;
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
  if (timed_out) throw TimeoutError(message);
  throw CommError(message);
}

void NcclBackend::ran(std::uint64_t seq) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  ran_ = seq + 1;
  last_ran_at_ = Clock::now();
}

void NcclBackend::wait_enqueued_locked(const char* op, std::uint64_t seq, Clock::time_point deadline) {
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) state = q;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress)
      fail_locked(describe(op, seq) + " failed: NCCL reports " + ncclGetErrorString(state) + last_error(comm_) +
                      " (a peer may have died); the communicator was aborted",
                  false);
    if (abort_requested_)
      fail_locked(describe(op, seq) + " was aborted (the process group was aborted); the communicator was aborted",
                  false);
    if (Clock::now() > deadline)
      fail_locked(describe(op, seq) + " timed out after " + secs(timeout()) +
                      " while NCCL connected the ranks: a peer did not take part (it may have exited, hung, or "
                      "issued a different sequence of operations); the communicator was aborted",
                  true);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclBackend::watch(const char* op, std::uint64_t seq, cudaEvent_t done, Clock::time_point deadline) {
  for (;;) {
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess) return;
    // Not finished is no error: clear it, or this thread's next launch check (a kernel the
    // barrier or a caller launches here) would report cudaErrorNotReady as its failure.
    (void)cudaGetLastError();
    {
      std::lock_guard<std::mutex> lock(mu_);
      check_alive_locked(op, seq);
      if (q != cudaErrorNotReady)
        fail_locked(describe(op, seq) + " failed: CUDA reports " + cudaGetErrorString(q) +
                        "; the communicator was aborted",
                    false);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        fail_locked(describe(op, seq) + " failed: NCCL reports " + ncclGetErrorString(async) + last_error(comm_) +
                        " (a peer may have died); the communicator was aborted",
                    false);
      if (abort_requested_)
        fail_locked(describe(op, seq) + " was aborted (the process group was aborted); the communicator was aborted",
                    false);
      if (Clock::now() > deadline)
        fail_locked(describe(op, seq) + " timed out after " + secs(timeout()) +
                        ": a peer did not take part (it may have exited, hung, or issued a different sequence of "
                        "operations); the communicator was aborted",
                    true);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

template <typename Fn, typename After>
void NcclBackend::collective(const char* op, std::uint64_t seq, Fn&& enqueue, After&& after,
                             std::vector<Tensor> scratch) {
  const auto deadline = Clock::now() + timeout();
  // Issued by the process group (docs/gpu.md, "Stream ordering"): `ready` was recorded on the
  // compute stream when the caller issued the operation; `done` belongs to its Work.
  const auto ready = static_cast<cudaEvent_t>(ready_event());
  const auto done = static_cast<cudaEvent_t>(done_event());
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_alive_locked(op, seq);
    flush_p2p_locked(op, seq, deadline);  // sends/receives issued before this go first
    cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
    // The collective may only read what the compute stream had written when it was issued:
    // a device-side wait, so kernels issued after it (the rest of the backward) overlap it.
    if (ready) cuda_ok(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    // A barrier (no tensor of the caller's), or scratch this thread allocated just now: its
    // block may have been freed by compute-stream work still queued, so wait for all of it.
    if (!ready || !scratch.empty()) {
      cuda_ok(cudaEventRecord(ready_, 0), "cudaEventRecord");
      cuda_ok(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    }
    enqueue();
    // Non-blocking communicator: until NCCL reports ncclSuccess the kernel may not be on the
    // stream yet, and nothing else may be queued there (NCCL's rule), so `after` comes after.
    wait_enqueued_locked(op, seq, deadline);
    after();
    cuda_ok(cudaEventRecord(done ? done : done_, stream_), "cudaEventRecord");
  }
  if (!done) {  // a barrier: the host waits for it, as c10d's barrier does
    watch(op, seq, done_, deadline);
    return;
  }
  // The worker goes on to the next operation (bucket k+1 is queued while bucket k runs); the
  // group's completion thread is the watchdog: it polls `done` with this operation's
  // deadline, NCCL's asynchronous error and abort(), and completes the Work. The group holds
  // the caller's tensors until then; `scratch` is held here.
  complete_on_device([this, op, seq, done, deadline, scratch = std::move(scratch)] {
    (void)scratch;
    // The completion thread's CUDA calls: on this rank's GPU (else CUDA makes a context on cuda:0).
    cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
    watch(op, seq, done, deadline);
  });
}

template <typename Fn>
void NcclBackend::collective(const char* op, std::uint64_t seq, Fn&& enqueue) {
  collective(op, seq, std::forward<Fn>(enqueue), [] {});
}

void NcclBackend::queue_p2p(bool send, const Tensor& t, int peer, std::uint64_t seq) {
  const char* op = send ? "send" : "recv";
  check_tensor(t, op);
  auto p = std::make_shared<P2pOp>(P2pOp{send, t, peer, seq, nullptr});
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_alive_locked(op, seq);
    cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
    // The data as the compute stream had it when the operation was issued, however late the
    // group is posted.
    if (const auto ready = static_cast<cudaEvent_t>(ready_event())) {
      cuda_ok(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    } else {
      cuda_ok(cudaEventRecord(ready_, 0), "cudaEventRecord");
      cuda_ok(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    }
    p2p_queue_.push_back(p);
  }
  defer_completion([this, p] { complete_p2p(*p); });
}

void NcclBackend::complete_p2p(P2pOp& p) {
  const char* op = p.send ? "send" : "recv";
  const auto deadline = Clock::now() + timeout();
  // The completion thread's first CUDA call: on this rank's GPU (else CUDA makes a context on cuda:0).
  cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
  std::shared_ptr<P2pBatch> batch;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (p.batch) {
        batch = p.batch;
        break;
      }
      check_alive_locked(op, p.seq);
      if (abort_requested_)
        fail_locked(describe(op, p.seq) + " was aborted (the process group was aborted); the communicator was aborted",
                    false);
      // Post when the worker has run everything issued and nothing new came for a while
      // (or, whatever the count says, nothing at all for 50 times as long).
      const auto quiet = Clock::now() - last_ran_at_;
      if ((ran_ == sequence_number() && quiet >= kP2pCoalesce) || quiet >= 50 * kP2pCoalesce) {
        flush_p2p_locked(op, p.seq, deadline);
        if (!p.batch) throw CommError(describe(op, p.seq) + ": was not posted (an earlier operation failed)");
        batch = p.batch;
        break;
      }
      if (Clock::now() > deadline)
        fail_locked(describe(op, p.seq) + " timed out after " + secs(timeout()) +
                        " before it could be posted; the communicator was aborted",
                    true);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  watch(op, p.seq, batch->done, deadline);
}

void NcclBackend::flush_p2p_locked(const char* op, std::uint64_t seq, Clock::time_point deadline) {
  if (p2p_queue_.empty()) return;
  std::vector<std::shared_ptr<P2pOp>> ops;
  ops.swap(p2p_queue_);
  auto batch = std::make_shared<P2pBatch>();
  try {
    cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
    cuda_ok(cudaEventCreateWithFlags(&batch->done, cudaEventDisableTiming), "cudaEventCreate");
    NcclGroup group;  // every queued operation progresses independently of the others
    for (const auto& q : ops) {
      void* data = q->tensor.raw_data();
      const auto n = static_cast<std::size_t>(q->tensor.numel());
      const ncclDataType_t type = nccl_type(q->tensor.dtype());
      if (q->send)
        nccl_ok(ncclSend(data, n, type, q->peer, comm_, stream_), "ncclSend");
      else
        nccl_ok(ncclRecv(data, n, type, q->peer, comm_, stream_), "ncclRecv");
    }
    group.end();
  } catch (const std::exception& e) {
    fail_locked(detail::concat(describe(op, seq), ": posting ", ops.size(), " send/recv operation(s) failed: ",
                               e.what(), last_error(comm_), "; the communicator was aborted"),
                false);
  }
  wait_enqueued_locked(op, seq, deadline);
  cuda_ok(cudaEventRecord(batch->done, stream_), "cudaEventRecord");  // watched on the host (see collective)
  for (const auto& q : ops) q->batch = batch;
}

void NcclBackend::run_allreduce(Tensor& t, ReduceOp op, std::uint64_t seq) {
  Ran r{this, seq};
  check_tensor(t, "allreduce");
  collective("allreduce", seq, [&] {
    nccl_ok(ncclAllReduce(t.raw_data(), t.raw_data(), t.numel(), nccl_type(t.dtype()), nccl_op(op), comm_, stream_),
            "ncclAllReduce");
  });
}

void NcclBackend::run_broadcast(Tensor& t, int root, std::uint64_t seq) {
  Ran r{this, seq};
  check_tensor(t, "broadcast");
  collective("broadcast", seq, [&] {
    nccl_ok(ncclBroadcast(t.raw_data(), t.raw_data(), t.numel(), nccl_type(t.dtype()), root, comm_, stream_),
            "ncclBroadcast");
  });
}

void NcclBackend::run_allgather(std::vector<Tensor>& out, const Tensor& in, std::uint64_t seq) {
  Ran r{this, seq};
  check_tensor(in, "allgather");
  for (const auto& o : out) check_tensor(o, "allgather");
  Tensor flat = Tensor::empty({in.numel() * size()}, in.dtype(), in.device());
  collective(
      "allgather", seq,
      [&] {
        nccl_ok(ncclAllGather(in.raw_data(), flat.raw_data(), in.numel(), nccl_type(in.dtype()), comm_, stream_),
                "ncclAllGather");
      },
      [&] {  // once the gather is on the stream
        for (int k = 0; k < size(); ++k)
          cuda_ok(cudaMemcpyAsync(out[k].raw_data(), static_cast<char*>(flat.raw_data()) + k * in.nbytes(),
                                  in.nbytes(), cudaMemcpyDeviceToDevice, stream_),
                  "cudaMemcpyAsync");
      },
      {flat});
}

void NcclBackend::run_reduce_scatter(Tensor& out, std::vector<Tensor>& in, ReduceOp op, std::uint64_t seq) {
  Ran r{this, seq};
  check_tensor(out, "reduce_scatter");
  for (const auto& i : in) check_tensor(i, "reduce_scatter");
  Tensor flat = Tensor::empty({out.numel() * size()}, out.dtype(), out.device());
  collective(
      "reduce_scatter", seq,
      [&] {
        for (int k = 0; k < size(); ++k)
          cuda_ok(cudaMemcpyAsync(static_cast<char*>(flat.raw_data()) + k * out.nbytes(), in[k].raw_data(),
                                  out.nbytes(), cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
        nccl_ok(ncclReduceScatter(flat.raw_data(), out.raw_data(), out.numel(), nccl_type(out.dtype()), nccl_op(op),
                                  comm_, stream_), "ncclReduceScatter");
      },
      [] {}, {flat});
}

void NcclBackend::run_reduce(Tensor& t, int root, ReduceOp op, std::uint64_t seq) {
  Ran r{this, seq};
  check_tensor(t, "reduce");
  Tensor scratch = rank() == root ? t : Tensor::empty(t.shape(), t.dtype(), t.device());
  collective(
      "reduce", seq,
      [&] {
        nccl_ok(ncclReduce(t.raw_data(), scratch.raw_data(), t.numel(), nccl_type(t.dtype()), nccl_op(op), root, comm_,
                           stream_), "ncclReduce");
      },
      [] {}, rank() == root ? std::vector<Tensor>{} : std::vector<Tensor>{scratch});
}

void NcclBackend::run_gather(std::vector<Tensor>& out, const Tensor& in, int root, std::uint64_t seq) {
  Ran r{this, seq};
  check_tensor(in, "gather");
  if (rank() == root)
    for (const auto& o : out) check_tensor(o, "gather");
  collective("gather", seq, [&] {
    NcclGroup group;
    if (rank() == root)
      for (int k = 0; k < size(); ++k)
        nccl_ok(ncclRecv(out[k].raw_data(), in.numel(), nccl_type(in.dtype()), k, comm_, stream_), "ncclRecv");
    nccl_ok(ncclSend(in.raw_data(), in.numel(), nccl_type(in.dtype()), root, comm_, stream_), "ncclSend");
    group.end();
  });
}

void NcclBackend::run_scatter(Tensor& out, std::vector<Tensor>& in, int root, std::uint64_t seq) {
  Ran r{this, seq};
  check_tensor(out, "scatter");
  if (rank() == root)
    for (const auto& i : in) check_tensor(i, "scatter");
  collective("scatter", seq, [&] {
    NcclGroup group;
    if (rank() == root)
      for (int k = 0; k < size(); ++k)
        nccl_ok(ncclSend(in[k].raw_data(), out.numel(), nccl_type(out.dtype()), k, comm_, stream_), "ncclSend");
    nccl_ok(ncclRecv(out.raw_data(), out.numel(), nccl_type(out.dtype()), root, comm_, stream_), "ncclRecv");
    group.end();
  });
}

void NcclBackend::run_barrier(std::uint64_t seq) {
  Ran r{this, seq};
  // A one-float allreduce; its value does not matter, so no kernel fills it.
  if (!barrier_.defined()) barrier_ = Tensor::empty({1}, DType::Float32, Device::cuda(device_));
  collective("barrier", seq, [&] {
    nccl_ok(ncclAllReduce(barrier_.raw_data(), barrier_.raw_data(), 1, ncclFloat32, ncclSum, comm_, stream_),
            "ncclAllReduce");
  });
}

void NcclBackend::run_send(const Tensor& t, int dst, int, std::uint64_t seq) {
  Ran r{this, seq};
  queue_p2p(true, t, dst, seq);
}

void NcclBackend::run_recv(Tensor& t, int src, int, std::uint64_t seq) {
  Ran r{this, seq};
  queue_p2p(false, t, src, seq);
}

}  // namespace phalanx::nccl_backend
