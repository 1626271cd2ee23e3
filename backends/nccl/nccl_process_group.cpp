#include "nccl_process_group.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/store.hpp"
#include "phalanx/core/kernels.hpp"

namespace phalanx::nccl_backend {

namespace {

void cuda_ok(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw CommError(std::string(call) + " failed: " + cudaGetErrorString(e));
}
void nccl_ok(ncclResult_t r, const char* call) {
  if (r != ncclSuccess && r != ncclInProgress) throw CommError(std::string(call) + " failed: " + ncclGetErrorString(r));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Float32: return ncclFloat32;
    case DType::Int64: return ncclInt64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
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

int local_device(int rank) {
  int count = 0;
  cuda_ok(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  const char* lr = std::getenv("LOCAL_RANK");
  const int local = lr ? std::atoi(lr) : rank;
  return local % count;
}

}  // namespace

NcclProcessGroup::NcclProcessGroup(const BackendConfig& c) : ProcessGroup(c.rank, c.size, c.timeout) {
  try {
    device_ = local_device(c.rank);
    cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id;
    if (c.rank == 0) {
      nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
      c.store->set("nccl/unique_id", Bytes(reinterpret_cast<std::uint8_t*>(&id), reinterpret_cast<std::uint8_t*>(&id) + sizeof id));
    } else {
      const Bytes b = c.store->get("nccl/unique_id");
      if (b.size() != sizeof id) throw CommError("nccl: the unique id in the store has the wrong size");
      std::memcpy(&id, b.data(), sizeof id);
    }
    nccl_ok(ncclCommInitRank(&comm_, c.size, id, c.rank), "ncclCommInitRank");
    cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cuda_ok(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    cuda_ok(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  } catch (...) {
    shutdown();
    throw;
  }
}

NcclProcessGroup::~NcclProcessGroup() {
  shutdown();
  if (comm_) aborted_ ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
  if (ready_) cudaEventDestroy(ready_);
  if (done_) cudaEventDestroy(done_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclProcessGroup::check_tensor(const Tensor& t, const char* op) const {
  if (t.device().type != DeviceType::CUDA)
    throw TypeError(std::string(op) + ": the nccl backend takes CUDA tensors, got one on " + t.device().str() +
                    "; move it with .to(Device::cuda(LOCAL_RANK)) or use the gloo backend for CPU tensors");
}

template <typename Fn>
void NcclProcessGroup::collective(const char* op, std::uint64_t seq, Fn&& enqueue) {
  if (aborted_) throw CommError(describe(op, seq) + ": the communicator was aborted after an earlier failure");
  cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
  // The collective may only read what the compute stream has finished writing.
  cuda_ok(cudaEventRecord(ready_, 0), "cudaEventRecord");
  cuda_ok(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
  enqueue();
  cuda_ok(cudaEventRecord(done_, stream_), "cudaEventRecord");
  // The compute stream continues after the collective without a host round trip.
  cuda_ok(cudaStreamWaitEvent(0, done_, 0), "cudaStreamWaitEvent");
  // Watchdog: this worker thread (not the caller) waits, with the group's timeout.
  const auto deadline = std::chrono::steady_clock::now() + timeout();
  for (;;) {
    const cudaError_t q = cudaEventQuery(done_);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) throw CommError(describe(op, seq) + " failed: " + cudaGetErrorString(q));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      aborted_ = true;
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw CommError(describe(op, seq) + " failed: NCCL reports " + ncclGetErrorString(async) +
                      " (a peer may have died); the communicator was aborted");
    }
    if (abort_requested_) {
      aborted_ = true;
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw CommError(describe(op, seq) + " was aborted (the process group was aborted); the communicator was aborted");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      aborted_ = true;
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw TimeoutError(describe(op, seq) + " timed out after " + std::to_string(timeout().count() / 1000.0) +
                         " s: a peer did not take part; the communicator was aborted");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclProcessGroup::run_allreduce(Tensor& t, ReduceOp op, std::uint64_t seq) {
  check_tensor(t, "allreduce");
  collective("allreduce", seq, [&] {
    nccl_ok(ncclAllReduce(t.raw_data(), t.raw_data(), t.numel(), nccl_type(t.dtype()), nccl_op(op), comm_, stream_),
            "ncclAllReduce");
  });
}

void NcclProcessGroup::run_broadcast(Tensor& t, int root, std::uint64_t seq) {
  check_tensor(t, "broadcast");
  collective("broadcast", seq, [&] {
    nccl_ok(ncclBroadcast(t.raw_data(), t.raw_data(), t.numel(), nccl_type(t.dtype()), root, comm_, stream_),
            "ncclBroadcast");
  });
}

void NcclProcessGroup::run_allgather(std::vector<Tensor>& out, const Tensor& in, std::uint64_t seq) {
  check_tensor(in, "allgather");
  Tensor flat = Tensor::empty({in.numel() * size()}, in.dtype(), in.device());
  collective("allgather", seq, [&] {
    nccl_ok(ncclAllGather(in.raw_data(), flat.raw_data(), in.numel(), nccl_type(in.dtype()), comm_, stream_),
            "ncclAllGather");
    for (int r = 0; r < size(); ++r)
      cuda_ok(cudaMemcpyAsync(out[r].raw_data(), static_cast<char*>(flat.raw_data()) + r * in.nbytes(), in.nbytes(),
                              cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
  });
}

void NcclProcessGroup::run_reduce_scatter(Tensor& out, std::vector<Tensor>& in, ReduceOp op, std::uint64_t seq) {
  check_tensor(out, "reduce_scatter");
  Tensor flat = Tensor::empty({out.numel() * size()}, out.dtype(), out.device());
  collective("reduce_scatter", seq, [&] {
    for (int r = 0; r < size(); ++r)
      cuda_ok(cudaMemcpyAsync(static_cast<char*>(flat.raw_data()) + r * out.nbytes(), in[r].raw_data(), out.nbytes(),
                              cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
    nccl_ok(ncclReduceScatter(flat.raw_data(), out.raw_data(), out.numel(), nccl_type(out.dtype()), nccl_op(op), comm_,
                              stream_), "ncclReduceScatter");
  });
}

void NcclProcessGroup::run_reduce(Tensor& t, int root, ReduceOp op, std::uint64_t seq) {
  check_tensor(t, "reduce");
  Tensor scratch = rank() == root ? t : Tensor::empty(t.shape(), t.dtype(), t.device());
  collective("reduce", seq, [&] {
    nccl_ok(ncclReduce(t.raw_data(), scratch.raw_data(), t.numel(), nccl_type(t.dtype()), nccl_op(op), root, comm_,
                       stream_), "ncclReduce");
  });
}

void NcclProcessGroup::run_gather(std::vector<Tensor>& out, const Tensor& in, int root, std::uint64_t seq) {
  check_tensor(in, "gather");
  collective("gather", seq, [&] {
    nccl_ok(ncclGroupStart(), "ncclGroupStart");
    if (rank() == root)
      for (int r = 0; r < size(); ++r)
        nccl_ok(ncclRecv(out[r].raw_data(), in.numel(), nccl_type(in.dtype()), r, comm_, stream_), "ncclRecv");
    nccl_ok(ncclSend(in.raw_data(), in.numel(), nccl_type(in.dtype()), root, comm_, stream_), "ncclSend");
    nccl_ok(ncclGroupEnd(), "ncclGroupEnd");
  });
}

void NcclProcessGroup::run_scatter(Tensor& out, std::vector<Tensor>& in, int root, std::uint64_t seq) {
  check_tensor(out, "scatter");
  collective("scatter", seq, [&] {
    nccl_ok(ncclGroupStart(), "ncclGroupStart");
    if (rank() == root)
      for (int r = 0; r < size(); ++r)
        nccl_ok(ncclSend(in[r].raw_data(), out.numel(), nccl_type(out.dtype()), r, comm_, stream_), "ncclSend");
    nccl_ok(ncclRecv(out.raw_data(), out.numel(), nccl_type(out.dtype()), root, comm_, stream_), "ncclRecv");
    nccl_ok(ncclGroupEnd(), "ncclGroupEnd");
  });
}

void NcclProcessGroup::run_barrier(std::uint64_t seq) {
  Tensor one = Tensor::empty({1}, DType::Float32, Device::cuda(device_));
  kernels_for(one.device()).fill(one, 1.0);
  collective("barrier", seq, [&] {
    nccl_ok(ncclAllReduce(one.raw_data(), one.raw_data(), 1, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
  });
}

void NcclProcessGroup::run_send(const Tensor& t, int dst, int, std::uint64_t seq) {
  check_tensor(t, "send");
  collective("send", seq, [&] {
    nccl_ok(ncclSend(t.raw_data(), t.numel(), nccl_type(t.dtype()), dst, comm_, stream_), "ncclSend");
  });
}

void NcclProcessGroup::run_recv(Tensor& t, int src, int, std::uint64_t seq) {
  check_tensor(t, "recv");
  collective("recv", seq, [&] {
    nccl_ok(ncclRecv(t.raw_data(), t.numel(), nccl_type(t.dtype()), src, comm_, stream_), "ncclRecv");
  });
}

}  // namespace phalanx::nccl_backend
