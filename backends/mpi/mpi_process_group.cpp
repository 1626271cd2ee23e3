#include "mpi_process_group.hpp"

#include <chrono>
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "mpi_runtime.hpp"
#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/host_staging.hpp"
#include "phalanx/core/env.hpp"
#include "phalanx/core/half_sum.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/tensor_impl.hpp"

namespace phalanx::mpi_backend {

namespace {

/// MPI user operations for 16-bit floats (MPI has no float16 or bfloat16 type): inout = in +
/// inout, widened, added in float32, rounded back to nearest even, like the Gloo plugin;
/// libphalanx's AVX2 code (phalanx/core/half_sum.hpp). Commutative.
template <void (*Sum)(void*, void*, const void* const*, int, std::size_t)>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  const void* const src[2] = {in, inout};
  Sum(inout, nullptr, src, 2, static_cast<std::size_t>(*len));
}

/// PHALANX_MPI_THREADS: "single" or "serialized"; unset: single, unless async.
int wanted_level(bool async) {
  const std::string v = env::choice("PHALANX_MPI_THREADS", "", {"single", "serialized"});
  if (v.empty()) return async ? MPI_THREAD_SERIALIZED : MPI_THREAD_SINGLE;
  if (v == "serialized") return MPI_THREAD_SERIALIZED;
  if (async)  // single
    throw ConfigError("PHALANX_MPI_THREADS=single with PHALANX_MPI_ASYNC=1: the worker thread calls MPI, which "
                      "needs serialized; unset one of them");
  return MPI_THREAD_SINGLE;
}

bool async_from_env() {
  return env::flag("PHALANX_MPI_ASYNC", false);
}

[[noreturn]] __attribute__((noinline, cold)) void too_many_elements(std::int64_t n, const char* op) {
  throw ValueError(detail::concat(op, ": ", n, " elements are more than one MPI call takes (", INT_MAX,
                                  "); split the tensor"));
}

/// MPI counts are ints.
inline int count_of(std::int64_t n, const char* op) {
  if (n > INT_MAX) too_many_elements(n, op);
  return static_cast<int>(n);
}

/// The MPI type of a dtype: 16-bit floats travel as raw 16-bit words (sums through sum16).
inline MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Int64: return MPI_INT64_T;
    case DType::Float16:
    case DType::BFloat16: return MPI_UINT16_T;
    case DType::Bool: return MPI_UINT8_T;  // moved, never reduced (ProcessGroup refuses)
  }
  return MPI_BYTE;
}

/// MPI's own operation for a reduction of float32 or int64 (avg: the sum, divided once at the end).
inline MPI_Op mpi_builtin_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;
    case ReduceOp::Product: return MPI_PROD;
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Max: return MPI_MAX;
  }
  return MPI_SUM;
}

// MPI reads and writes host memory: non-CPU tensors are staged (host_staging.hpp).
using staging::copy_back;
using staging::host_of;
using staging::read_into;
using staging::write_back;

void divide_by(Tensor& host, int size) { kernels_for(Device::cpu()).divide(host, static_cast<float>(size)); }

}  // namespace

MpiProcessGroup::MpiProcessGroup(const BackendConfig& c) : Backend(c.rank, c.size, c.timeout, !async_from_env()) {
  try {
    if (c.size > 1 && !std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("PMIX_RANK") && !std::getenv("PMI_RANK") &&
        !std::getenv("SLURM_PROCID"))
      throw ConfigError(detail::concat("backend 'mpi' on rank ", c.rank, " of ", c.size,
                                       ": this process was not started by mpirun or srun (no OMPI_COMM_WORLD_SIZE, "
                                       "PMIX_RANK, PMI_RANK or SLURM_PROCID); start the job with `mpirun -np ", c.size,
                                       " ...`, or use backend gloo (PHALANX_BACKEND=gloo)"));
    const bool async = !inline_ops();
    const int level = ensure_initialized(wanted_level(async));
    single_ = level < MPI_THREAD_SERIALIZED;  // SINGLE or FUNNELED: only MPI's main thread calls it
    locked_ = !single_;
    if (single_) {
      int is_main = 0;
      MPI_Is_thread_main(&is_main);
      if (!is_main)
        throw ConfigError(detail::concat(
            "backend 'mpi' on rank ", c.rank, ": MPI runs at MPI_THREAD_SINGLE, and this group is created on a "
            "thread other than the one that initialised MPI; create every MPI group on that thread, or set "
            "PHALANX_MPI_THREADS=serialized (before the first group) to call MPI from any thread"));
      owner_ = std::this_thread::get_id();
    }
    MpiCall call(locked_);  // another group's completion thread may be testing a request
    int world = 0, me = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (world == 1 && c.size > 1)
      throw ConfigError(detail::concat(
          "backend 'mpi' on rank ", c.rank, " of ", c.size, ": MPI started this process on its own (a world of 1, "
          "MPI's singleton mode): its launcher did not connect it to MPI's runtime; under srun pass --mpi=pmix (or "
          "the PMI your MPI was built with, see `srun --mpi=list`), start the job with `mpirun -np ", c.size,
          " ...`, or use backend gloo (PHALANX_BACKEND=gloo)"));
    if (world != c.size || me != c.rank)
      throw ConfigError(detail::concat("backend 'mpi': MPI says this is rank ", me, " of ", world,
                                       ", but Phalanx was told rank ", c.rank, " of ", c.size,
                                       "; under mpirun leave RANK and WORLD_SIZE unset (Phalanx reads "
                                       "OMPI_COMM_WORLD_RANK/SIZE), and start every rank with the same -np"));
    // A private communicator: the application's own MPI traffic cannot match ours, and
    // errors come back as codes (MPI_ERRORS_ARE_FATAL would end the process mid-call).
    if (MPI_Comm_dup(MPI_COMM_WORLD, &comm_) != MPI_SUCCESS)
      throw CommError(detail::concat("backend 'mpi' on rank ", c.rank, ": MPI_Comm_dup of MPI_COMM_WORLD failed"));
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    int* ub = nullptr;
    int found = 0;
    if (MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &found) == MPI_SUCCESS && found && ub) tag_ub_ = *ub;
    // The sums read PHALANX_FP16_SIMD / PHALANX_BF16_SIMD at each call: a bad value is a
    // ConfigError here, not an exception inside MPI's callback (where none can be thrown).
    const void* const none[1] = {nullptr};
    fp16_sum(nullptr, nullptr, none, 1, 0);
    bf16_sum(nullptr, nullptr, none, 1, 0);
    MPI_Op_create(&sum16<fp16_sum>, 1, &sum_fp16_);
    MPI_Op_create(&sum16<bf16_sum>, 1, &sum_bf16_);
  } catch (...) {
    throw;  // no threads to stop: the group starts them once this backend exists
  }
}

MpiProcessGroup::~MpiProcessGroup() {
  // The group set closing_ (on_close) and stopped its threads before destroying this.
  closing_ = true;
  drop_polls();
  if (finalized()) return;  // the process is exiting and MPI ended first: nothing left to free
  if (single_ && std::this_thread::get_id() != owner_) {
    // At MPI_THREAD_SINGLE no other thread may call MPI, not even to free: MPI_Finalize frees
    // the communicator; buffers MPI may still use are kept.
    std::fprintf(stderr, "phalanx: mpi: rank %d: the process group was destroyed on another thread than the one "
                 "that created it; its MPI communicator is left to MPI_Finalize (destroy the group on its thread)\n",
                 rank());
    abandon_posted();
    return;
  }
  if (single_) end_posted();
  MpiCall call(locked_);  // another group's completion thread may be testing a request
  if (sum_fp16_ != MPI_OP_NULL) MPI_Op_free(&sum_fp16_);
  if (sum_bf16_ != MPI_OP_NULL) MPI_Op_free(&sum_bf16_);
  // Local, not collective: pending requests (of timed-out sends) keep it until they end.
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiProcessGroup::check(int rc, const char* op, std::uint64_t seq) const {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) std::snprintf(msg, sizeof msg, "error code %d", rc);
  throw CommError(describe(op, seq) + " failed: MPI: " + msg);
}

MPI_Datatype MpiProcessGroup::type_of(const Tensor& t) const { return mpi_type(t.dtype()); }

MPI_Op MpiProcessGroup::op_of(const Tensor& t, ReduceOp op) const {
  // The base class admits only sum for 16-bit floats, and avg only for float32.
  const DType dt = t.dtype();
  return dt == DType::Float16 ? sum_fp16_ : dt == DType::BFloat16 ? sum_bf16_ : mpi_builtin_op(op);
}

char* MpiProcessGroup::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void MpiProcessGroup::run_allreduce(Tensor& t, ReduceOp op, std::uint64_t seq) {
  // The tensor's fields read inline (the group checked it is defined): no call into core.
  const TensorImpl& ti = *t.impl();
  const int n = count_of(ti.numel(), "allreduce");
  if (ti.device().is_cpu()) {  // the hot path: one MPI call on the tensor itself
    const DType dt = ti.dtype();
    void* data = ti.data();
    const MPI_Op mop = dt == DType::Float16 ? sum_fp16_ : dt == DType::BFloat16 ? sum_bf16_ : mpi_builtin_op(op);
    {
      MpiCall call(locked_);
      const int rc = MPI_Allreduce(MPI_IN_PLACE, data, n, mpi_type(dt), mop, comm_);
      if (rc != MPI_SUCCESS) check(rc, "allreduce", seq);
    }
    if (op == ReduceOp::Avg) divide_by(t, size());
    return;
  }
  MpiCall call(locked_);
  Tensor h = host_of(t);
  check(MPI_Allreduce(MPI_IN_PLACE, h.raw_data(), n, type_of(h), op_of(h, op), comm_), "allreduce", seq);
  if (op == ReduceOp::Avg) divide_by(h, size());
  copy_back(h, t);
}

void MpiProcessGroup::run_broadcast(Tensor& t, int root, std::uint64_t seq) {
  const int n = count_of(t.numel(), "broadcast");
  MpiCall call(locked_);
  Tensor h = host_of(t, rank() == root);
  check(MPI_Bcast(h.raw_data(), n, type_of(h), root, comm_), "broadcast", seq);
  if (rank() != root) copy_back(h, t);
}

void MpiProcessGroup::run_allgather(std::vector<Tensor>& out, const Tensor& in, std::uint64_t seq) {
  const int n = count_of(in.numel(), "allgather");
  count_of(in.numel() * size(), "allgather");
  MpiCall call(locked_);  // also guards scratch_
  const Tensor h = host_of(in);
  const std::size_t bytes = in.nbytes();
  char* flat = scratch(bytes * size());
  check(MPI_Allgather(h.raw_data(), n, type_of(in), flat, n, type_of(in), comm_), "allgather", seq);
  for (int r = 0; r < size(); ++r) write_back(out[r], 0, flat + r * bytes, bytes);
}

void MpiProcessGroup::run_reduce_scatter(Tensor& out, std::vector<Tensor>& in, ReduceOp op, std::uint64_t seq) {
  const int n = count_of(out.numel(), "reduce_scatter");
  count_of(out.numel() * size(), "reduce_scatter");
  MpiCall call(locked_);  // also guards scratch_
  const std::size_t bytes = out.nbytes();
  char* flat = scratch(bytes * size());
  for (int r = 0; r < size(); ++r) read_into(flat + r * bytes, in[r], bytes);
  Tensor h = host_of(out, false);
  check(MPI_Reduce_scatter_block(flat, h.raw_data(), n, type_of(out), op_of(out, op), comm_), "reduce_scatter", seq);
  if (op == ReduceOp::Avg) divide_by(h, size());
  copy_back(h, out);
}

void MpiProcessGroup::run_reduce(Tensor& t, int root, ReduceOp op, std::uint64_t seq) {
  const int n = count_of(t.numel(), "reduce");
  MpiCall call(locked_);
  Tensor h = host_of(t);
  if (rank() != root) {  // only sends: its tensor stays as it was
    check(MPI_Reduce(h.raw_data(), nullptr, n, type_of(h), op_of(h, op), root, comm_), "reduce", seq);
    return;
  }
  check(MPI_Reduce(MPI_IN_PLACE, h.raw_data(), n, type_of(h), op_of(h, op), root, comm_), "reduce", seq);
  if (op == ReduceOp::Avg) divide_by(h, size());
  copy_back(h, t);
}

void MpiProcessGroup::run_gather(std::vector<Tensor>& out, const Tensor& in, int root, std::uint64_t seq) {
  const int n = count_of(in.numel(), "gather");
  count_of(in.numel() * size(), "gather");
  MpiCall call(locked_);  // also guards scratch_
  const Tensor h = host_of(in);
  const std::size_t bytes = in.nbytes();
  char* flat = rank() == root ? scratch(bytes * size()) : nullptr;
  check(MPI_Gather(h.raw_data(), n, type_of(in), flat, n, type_of(in), root, comm_), "gather", seq);
  if (rank() == root)
    for (int r = 0; r < size(); ++r) write_back(out[r], 0, flat + r * bytes, bytes);
}

void MpiProcessGroup::run_scatter(Tensor& out, std::vector<Tensor>& in, int root, std::uint64_t seq) {
  const int n = count_of(out.numel(), "scatter");
  count_of(out.numel() * size(), "scatter");
  MpiCall call(locked_);  // also guards scratch_
  const std::size_t bytes = out.nbytes();
  char* flat = nullptr;
  if (rank() == root) {
    flat = scratch(bytes * size());
    for (int r = 0; r < size(); ++r) read_into(flat + r * bytes, in[r], bytes);
  }
  Tensor h = host_of(out, false);
  check(MPI_Scatter(flat, n, type_of(out), h.raw_data(), n, type_of(out), root, comm_), "scatter", seq);
  copy_back(h, out);
}

void MpiProcessGroup::run_barrier(std::uint64_t seq) {
  MpiCall call(locked_);
  check(MPI_Barrier(comm_), "barrier", seq);
}

void MpiProcessGroup::run_send(const Tensor& t, int dst, int tag, std::uint64_t seq) {
  const int n = count_of(t.numel(), "send");
  if (tag < 0 || tag > tag_ub_)
    throw ValueError(detail::concat(describe("send", seq), ": tag ", tag, " is outside MPI's [0, ", tag_ub_, "]"));
  MPI_Request req = MPI_REQUEST_NULL;
  const Tensor h = host_of(t);
  {
    MpiCall call(locked_);
    check(MPI_Isend(h.raw_data(), n, type_of(h), dst, tag, comm_, &req), "send", seq);
  }
  if (single_) {  // completed by the thread that waits on the Work (MPI_Test there)
    auto p = std::make_shared<Posted>();
    *p = Posted{req, h, Tensor(), "send", seq, std::chrono::steady_clock::now() + timeout()};
    return defer_to_waiter(std::move(p));
  }
  // The (host) tensor is captured so its memory outlives the transfer.
  defer_completion([this, req, h, seq] { wait_request(req, h, "send", seq); });
}

void MpiProcessGroup::run_recv(Tensor& t, int src, int tag, std::uint64_t seq) {
  const int n = count_of(t.numel(), "recv");
  if (tag < 0 || tag > tag_ub_)
    throw ValueError(detail::concat(describe("recv", seq), ": tag ", tag, " is outside MPI's [0, ", tag_ub_, "]"));
  MPI_Request req = MPI_REQUEST_NULL;
  const Tensor h = host_of(t, false);
  {
    MpiCall call(locked_);
    check(MPI_Irecv(h.raw_data(), n, type_of(h), src, tag, comm_, &req), "recv", seq);
  }
  if (single_) {  // completed by the thread that waits on the Work (MPI_Test there)
    auto p = std::make_shared<Posted>();
    *p = Posted{req, h, t, "recv", seq,
                std::chrono::steady_clock::now() + timeout()};
    return defer_to_waiter(std::move(p));
  }
  // A staged receive lands in `t` when it completes (before its Work does).
  defer_completion([this, req, h, t, seq] {
    wait_request(req, h, "recv", seq);
    copy_back(h, t);
  });
}

void MpiProcessGroup::wait_request(MPI_Request req, const Tensor& keep_alive, const char* op, std::uint64_t seq) {
  // MPI_Wait would hold the MPI call lock (every other MPI call of the process) for as long as
  // the peer takes, and spin a core. Instead: MPI_Test (which also drives MPI's progress),
  // yielding between tests for the first millisecond, then sleeping 50 µs at a time.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + timeout();
  for (;;) {
    int done = 0;
    {
      MpiCall call(locked_);
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), op, seq);
    }
    if (done) return;
    const auto now = Clock::now();
    if (closing_ || is_aborted() || now > deadline) {
      std::lock_guard<std::mutex> lock(mpi_mu_);
      // MPI may still write into (or read from) the buffer: keep it for the group's life.
      orphans_.push_back(keep_alive);
      if (closing_ || is_aborted())
        throw CommError(describe(op, seq) + ": the process group was " + (closing_ ? "destroyed" : "aborted") +
                        " before the " + op + " completed");
      throw TimeoutError(detail::concat(describe(op, seq), " timed out after ", timeout().count() / 1000.0,
                                        " s: the peer never posted the matching ", op == std::string("send") ? "recv" : "send",
                                        " (same tag?), or it has exited"));
    }
    if (now - start < std::chrono::milliseconds(1))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace phalanx::mpi_backend
