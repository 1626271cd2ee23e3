// The Gloo backend's collectives: the run_* hooks other than send and recv. Which allreduce
// runs is gloo_algorithm_policy's choice; non-CPU tensors are staged (host_staging.hpp).
// Each collective's tag is next_collective_tag(): a count of the collectives alone (not the
// group's sequence number, which counts sends and receives too, and those may differ from
// rank to rank).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/scatter.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "gloo_algorithm_policy.hpp"
#include "gloo_support.hpp"
#include "phalanx/backends/host_staging.hpp"
#include "phalanx/core/kernels.hpp"

namespace phalanx::gloo_backend {

using staging::copy_back;
using staging::host_of;
using staging::write_back;

namespace {

// Gloo's halving-doubling and ring_chunked classes exchange their messages through bound
// buffers (tcp::Buffer). When a peer closes its connection (destroys its group, exits), this
// rank's event-loop thread reads the EOF and fails every buffer registered on that pair, and
// tcp::Buffer::waitRecv() checks that failure before its count of arrived messages: a message
// that already arrived but was not yet waited for is lost, and run() throws "Connection closed
// by peer". A peer that returns from run() has received everything it waits for, but not
// everyone has waited for its last message (the final notification of either class), so a
// peer that leaves at once can fail us. Waiting for our own sends to be written does not help
// (they were; the receiver had not consumed them yet): a peer may only close once every rank
// has come out of run(), which only a message can tell. So the class algorithms end with a
// barrier (gloo::barrier: a dissemination barrier over unbound buffers, whose messages a later
// EOF cannot undo; its tag is this operation's, unique). The generic algorithms
// (gloo::allreduce: ring, bcube) use unbound buffers and need none; on the busy-polling mesh
// the caller's thread reads its own socket and counts arrived messages first.
void leave_together(const std::shared_ptr<::gloo::Context>& ctx, std::uint32_t tag, std::chrono::milliseconds timeout) {
  ::gloo::BarrierOptions o(ctx);
  o.setTag(tag);
  o.setTimeout(timeout);
  ::gloo::barrier(o);
}

}  // namespace

void GlooBackend::allreduce_impl(Tensor& t, ReduceOp op, std::uint32_t tag) {
  const std::size_t n = static_cast<std::size_t>(t.numel());
  const std::size_t bytes = t.nbytes();
  const AllreducePath path = choose_allreduce(options_, sync_context_ != nullptr, t.dtype(), bytes);
  if (path == AllreducePath::Generic16) {
    ::gloo::AllreduceOptions o(context_);
    o.setOutput(static_cast<std::uint16_t*>(t.raw_data()), n);
    if (t.dtype() == DType::Float16)
      o.setReduceFunction(&sum16<fp16_sum>);
    else
      o.setReduceFunction(&sum16<bf16_sum>);
    o.setTag(tag);
    o.setTimeout(timeout());
    ::gloo::allreduce(o);
    return;
  }
  by_dtype(t, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    T* ptr = static_cast<T*>(t.raw_data());
    switch (path) {
      case AllreducePath::SyncHalvingDoubling: {
        const std::size_t chunk = sync_chunk_elems(options_, sizeof(T));
        for (std::size_t off = 0; off < n; off += chunk) {
          const std::size_t len = std::min(chunk, n - off);
          ::gloo::AllreduceHalvingDoubling<T> a(sync_context_, {ptr + off}, static_cast<int>(len), reduction<T>(op));
          a.run();
        }
        break;
      }
      case AllreducePath::RingChunked: {
        ::gloo::AllreduceRingChunked<T> a(context_, {ptr}, static_cast<int>(n), reduction<T>(op));
        a.run();
        leave_together(context_, tag, timeout());
        break;
      }
      case AllreducePath::HalvingDoubling: {
        ::gloo::AllreduceHalvingDoubling<T> a(context_, {ptr}, static_cast<int>(n), reduction<T>(op));
        a.run();
        leave_together(context_, tag, timeout());
        break;
      }
      default: {
        ::gloo::AllreduceOptions o(context_);
        o.setOutput(ptr, n);
        o.setReduceFunction(reduce_fn<T>(op));
        o.setTag(tag);
        o.setTimeout(timeout());
        o.setAlgorithm(path == AllreducePath::Bcube ? ::gloo::AllreduceOptions::Algorithm::BCUBE
                                                    : ::gloo::AllreduceOptions::Algorithm::RING);
        ::gloo::allreduce(o);
      }
    }
  });
  if (op == ReduceOp::Avg) kernels_for(t.device()).divide(t, static_cast<float>(size()));
}

void GlooBackend::run_allreduce(Tensor& t, ReduceOp op, std::uint64_t seq) {
  Tensor h = host_of(t);
  const std::uint32_t tag = next_collective_tag();
  guarded("allreduce", seq, [&] { allreduce_impl(h, op, tag); });
  copy_back(h, t);
}

void GlooBackend::run_broadcast(Tensor& t, int root, std::uint64_t seq) {
  Tensor h = host_of(t, rank() == root);
  const std::uint32_t tag = next_collective_tag();
  guarded("broadcast", seq, [&] {
    ::gloo::BroadcastOptions o(context_);
    by_dtype(h, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      o.setOutput(static_cast<T*>(h.raw_data()), static_cast<std::size_t>(h.numel()));
    });
    o.setRoot(root);
    o.setTag(tag);
    o.setTimeout(timeout());
    ::gloo::broadcast(o);
  });
  if (rank() != root) copy_back(h, t);
}

void GlooBackend::run_allgather(std::vector<Tensor>& out, const Tensor& in, std::uint64_t seq) {
  const Tensor h = host_of(in);
  const std::uint32_t tag = next_collective_tag();
  guarded("allgather", seq, [&] {
    Tensor flat = Tensor::empty({in.numel() * size()}, in.dtype());
    ::gloo::AllgatherOptions o(context_);
    by_dtype(in, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      o.setInput(static_cast<T*>(h.raw_data()), static_cast<std::size_t>(in.numel()));
      o.setOutput(static_cast<T*>(flat.raw_data()), static_cast<std::size_t>(flat.numel()));
    });
    o.setTag(tag);
    o.setTimeout(timeout());
    ::gloo::allgather(o);
    for (int r = 0; r < size(); ++r)
      write_back(out[r], 0, static_cast<char*>(flat.raw_data()) + r * in.nbytes(), in.nbytes());
  });
}

void GlooBackend::run_reduce_scatter(Tensor& out, std::vector<Tensor>& in, ReduceOp op,
                                          std::uint64_t seq) {
  // Allreduce of the concatenated inputs, then this rank's chunk: simple and exact; it moves
  // twice the bytes of a dedicated reduce-scatter. The concatenation is host memory (it
  // stages the inputs of any device).
  Tensor flat = Tensor::empty({out.numel() * size()}, out.dtype());
  for (int r = 0; r < size(); ++r) {
    char* dst = static_cast<char*>(flat.raw_data()) + r * out.nbytes();
    if (in[r].device().is_cpu())
      std::memcpy(dst, in[r].raw_data(), out.nbytes());
    else
      kernels_for(in[r].device()).copy_to_host(dst, in[r].raw_data(), out.nbytes());
  }
  const std::uint32_t tag = next_collective_tag();
  guarded("reduce_scatter", seq, [&] { allreduce_impl(flat, op, tag); });
  write_back(out, 0, static_cast<char*>(flat.raw_data()) + rank() * out.nbytes(), out.nbytes());
}

void GlooBackend::run_reduce(Tensor& t, int root, ReduceOp op, std::uint64_t seq) {
  Tensor h = host_of(t);
  const std::uint32_t tag = next_collective_tag();
  guarded("reduce", seq, [&] {
    Tensor scratch = rank() == root ? h : Tensor::empty(h.shape(), h.dtype());
    ::gloo::ReduceOptions o(context_);
    by_dtype(h, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      o.setInput(static_cast<T*>(h.raw_data()), static_cast<std::size_t>(h.numel()));
      o.setOutput(static_cast<T*>(scratch.raw_data()), static_cast<std::size_t>(h.numel()));
      o.setReduceFunction(reduce_fn<T>(op));
    });
    // 16-bit floats (sum only): widen, add, round, as allreduce (not integer sums of the bits).
    if (h.dtype() == DType::Float16) o.setReduceFunction(&sum16<fp16_sum>);
    if (h.dtype() == DType::BFloat16) o.setReduceFunction(&sum16<bf16_sum>);
    o.setRoot(root);
    o.setTag(tag);
    o.setTimeout(timeout());
    ::gloo::reduce(o);
  });
  if (rank() != root) return;
  if (op == ReduceOp::Avg) kernels_for(h.device()).divide(h, static_cast<float>(size()));
  copy_back(h, t);
}

void GlooBackend::run_gather(std::vector<Tensor>& out, const Tensor& in, int root, std::uint64_t seq) {
  const Tensor h = host_of(in);
  const std::uint32_t tag = next_collective_tag();
  guarded("gather", seq, [&] {
    Tensor flat = rank() == root ? Tensor::empty({in.numel() * size()}, in.dtype()) : Tensor();
    ::gloo::GatherOptions o(context_);
    by_dtype(in, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      o.setInput(static_cast<T*>(h.raw_data()), static_cast<std::size_t>(in.numel()));
      if (rank() == root) o.setOutput(static_cast<T*>(flat.raw_data()), static_cast<std::size_t>(flat.numel()));
    });
    o.setRoot(root);
    o.setTag(tag);
    o.setTimeout(timeout());
    ::gloo::gather(o);
    if (rank() == root)
      for (int r = 0; r < size(); ++r)
        write_back(out[r], 0, static_cast<char*>(flat.raw_data()) + r * in.nbytes(), in.nbytes());
  });
}

void GlooBackend::run_scatter(Tensor& out, std::vector<Tensor>& in, int root, std::uint64_t seq) {
  Tensor h = host_of(out, false);
  std::vector<Tensor> hin;
  if (rank() == root)
    for (auto& t : in) hin.push_back(host_of(t));
  const std::uint32_t tag = next_collective_tag();
  guarded("scatter", seq, [&] {
    ::gloo::ScatterOptions o(context_);
    by_dtype(out, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      if (rank() == root) {
        std::vector<T*> ptrs;
        for (auto& t : hin) ptrs.push_back(static_cast<T*>(t.raw_data()));
        o.setInputs(ptrs, static_cast<std::size_t>(out.numel()));
      }
      o.setOutput(static_cast<T*>(h.raw_data()), static_cast<std::size_t>(out.numel()));
    });
    o.setRoot(root);
    o.setTag(tag);
    o.setTimeout(timeout());
    ::gloo::scatter(o);
  });
  copy_back(h, out);
}

void GlooBackend::run_barrier(std::uint64_t seq) {
  const std::uint32_t tag = next_collective_tag();
  guarded("barrier", seq, [&] {
    ::gloo::BarrierOptions o(context_);
    o.setTag(tag);
    o.setTimeout(timeout());
    ::gloo::barrier(o);
  });
}

}  // namespace phalanx::gloo_backend
