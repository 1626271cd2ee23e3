#include "gloo_process_group.hpp"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <typeinfo>

#include "gloo_store_adapter.hpp"
#include "phalanx/backends/host_staging.hpp"
#include "phalanx/backends/prefix_store.hpp"
#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/half.hpp"
#include "phalanx/core/kernels.hpp"

namespace phalanx::gloo_backend {

namespace {

AllreduceAlgo algo_from_env() {
  const char* s = std::getenv("PHALANX_GLOO_ALLREDUCE");
  if (!s || !*s || std::string(s) == "auto") return AllreduceAlgo::Auto;
  const std::string v = s;
  if (v == "ring") return AllreduceAlgo::Ring;
  if (v == "bcube") return AllreduceAlgo::Bcube;
  if (v == "ring_chunked") return AllreduceAlgo::RingChunked;
  if (v == "halving_doubling") return AllreduceAlgo::HalvingDoubling;
  throw ConfigError("PHALANX_GLOO_ALLREDUCE='" + v +
                    "' is not one of auto, ring, bcube, ring_chunked, halving_doubling");
}

template <typename T>
::gloo::AllreduceOptions::Func reduce_fn(ReduceOp op) {
  using Raw = void (*)(void*, const void*, const void*, std::size_t);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return static_cast<Raw>(&::gloo::sum<T>);
    case ReduceOp::Product: return static_cast<Raw>(&::gloo::product<T>);
    case ReduceOp::Min: return static_cast<Raw>(&::gloo::min<T>);
    case ReduceOp::Max: return static_cast<Raw>(&::gloo::max<T>);
  }
  return static_cast<Raw>(&::gloo::sum<T>);
}

template <typename T>
const ::gloo::ReductionFunction<T>* reduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return ::gloo::ReductionFunction<T>::sum;
    case ReduceOp::Product: return ::gloo::ReductionFunction<T>::product;
    case ReduceOp::Min: return ::gloo::ReductionFunction<T>::min;
    case ReduceOp::Max: return ::gloo::ReductionFunction<T>::max;
  }
  return ::gloo::ReductionFunction<T>::sum;
}

std::size_t sync_max_bytes_from_env() {
  const char* s = std::getenv("PHALANX_GLOO_SYNC_MAX_BYTES");
  if (!s || !*s) return std::numeric_limits<std::size_t>::max();  // every size (in chunks)
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (end == s || *end || v < 0)
    throw ConfigError(std::string("PHALANX_GLOO_SYNC_MAX_BYTES='") + s + "' is not a byte count");
  return static_cast<std::size_t>(v);
}

std::uint32_t tag_of(std::uint64_t seq) { return static_cast<std::uint32_t>(seq & 0x7fffffff); }

/// Dispatches on the tensor's dtype (16-bit floats travel as raw 16-bit words).
template <typename Fn>
void by_dtype(const Tensor& t, Fn&& fn) {
  switch (t.dtype()) {
    case DType::Float32: fn(static_cast<float*>(nullptr)); break;
    case DType::Int64: fn(static_cast<std::int64_t*>(nullptr)); break;
    default: fn(static_cast<std::uint16_t*>(nullptr)); break;
  }
}

/// Sums of 16-bit floats: widen, add in float32, round back (to nearest even).
template <float (*Load)(std::uint16_t), std::uint16_t (*Store)(float)>
void sum16(void* c, const void* a, const void* b, std::size_t n) {
  auto* o = static_cast<std::uint16_t*>(c);
  const auto* x = static_cast<const std::uint16_t*>(a);
  const auto* y = static_cast<const std::uint16_t*>(b);
  for (std::size_t i = 0; i < n; ++i) o[i] = Store(Load(x[i]) + Load(y[i]));
}

// Gloo reads and writes host memory: non-CPU tensors are staged (host_staging.hpp).
using staging::copy_back;
using staging::host_of;
using staging::write_back;

}  // namespace

GlooBackend::GlooBackend(const BackendConfig& c) : Backend(c.rank, c.size, c.timeout) {
  algo_ = algo_from_env();
  ::gloo::transport::tcp::attr attr;
  attr.hostname = c.hostname;
  try {
    device_ = ::gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<::gloo::rendezvous::Context>(c.rank, c.size);
    ctx->setTimeout(c.timeout);
    StoreAdapter adapter(c.store);
    ctx->connectFullMesh(adapter, device_);
    context_ = ctx;
    sync_max_bytes_ = sync_max_bytes_from_env();
    if (const char* ch = std::getenv("PHALANX_GLOO_SYNC_CHUNK_BYTES")) sync_chunk_bytes_ = std::strtoull(ch, nullptr, 10);
    const char* bp = std::getenv("PHALANX_GLOO_BUSY_POLL");
    const bool busy_poll = !(bp && std::string(bp) == "0");
    if (sync_max_bytes_ > 0 && c.size > 1) {
      auto sync_ctx = std::make_shared<::gloo::rendezvous::Context>(c.rank, c.size);
      sync_ctx->setTimeout(c.timeout);
      StoreAdapter sync_adapter(std::make_shared<PrefixStore>("sync", c.store));
      sync_ctx->connectFullMesh(sync_adapter, device_);
      for (int r = 0; r < c.size; ++r)
        if (r != c.rank) sync_ctx->getPair(r)->setSync(true, busy_poll);
      sync_context_ = sync_ctx;
    }
  } catch (const ::gloo::Exception& e) {
    const std::string what = e.what();
    const std::string msg = detail::concat("gloo rendezvous on rank ", c.rank, " of ", c.size, " failed: ", what);
    // A peer that never connected is a timeout, and stays one (callers catch TimeoutError).
    if (what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos)
      throw TimeoutError(msg + " (a peer did not connect within " + std::to_string(c.timeout.count() / 1000.0) +
                         " s; raise PHALANX_TIMEOUT if ranks start far apart)");
    throw CommError(msg);
  }
}

// The group stopped its threads before destroying this: no operation uses the contexts.
GlooBackend::~GlooBackend() = default;

namespace {
// Debian's libgloo ships gloo/transport/tcp/pair.h without the header it includes
// (gloo/common/memory.h), so tcp::Pair cannot be named here. Its exported member
// signalExceptionExternal(msg) fails the pair and wakes every operation waiting on it
// (close() does not wake them). The declaration below names that one function; the call
// is made only on an object whose dynamic type is gloo's tcp::Pair, whose first base is
// transport::Pair (so the pointer needs no adjustment).
}  // namespace

}  // namespace phalanx::gloo_backend

namespace gloo::transport::tcp {
class Pair {
 public:
  std::exception_ptr signalExceptionExternal(const std::string& msg);
};
}  // namespace gloo::transport::tcp

namespace phalanx::gloo_backend {

namespace {
void fail_tcp_pair(::gloo::transport::Pair* pair, const std::string& msg) {
  if (pair == nullptr || std::string(typeid(*pair).name()) != "N4gloo9transport3tcp4PairE") return;
  reinterpret_cast<::gloo::transport::tcp::Pair*>(pair)->signalExceptionExternal(msg);
}
}  // namespace

void GlooBackend::on_abort() noexcept {
  // The event-driven mesh only: a busy-polling pair is locked while its operation runs, so
  // failing it would wait for that operation to end anyway (at its timeout). On a thread of
  // its own, which holds the context (it outlives a group destroyed meanwhile).
  for (const auto& ctx : {context_}) {
    if (!ctx) continue;
    try {
      std::thread([device = device_, ctx, size = size(), rank = rank()] {
        // Failing each pair wakes the operations waiting on it; closing alone does not.
        for (int r = 0; r < size; ++r) {
          if (r == rank) continue;
          try {
            fail_tcp_pair(ctx->getPair(r).get(), "the process group was aborted (another rank failed)");
          } catch (...) {
            // best effort: the operation then ends at its timeout
          }
        }
      }).detach();
    } catch (...) {
    }
  }
}

template <typename Fn>
void GlooBackend::guarded(const char* op, std::uint64_t seq, Fn&& fn) {
  try {
    fn();
  } catch (const ::gloo::IoException& e) {
    const std::string what = e.what();
    const std::string ctx = describe(op, seq);
    // Gloo says "Timed out waiting ..." (async pairs) or "Read timeout" (sync pairs).
    if (what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos)
      throw TimeoutError(ctx + " timed out after " + std::to_string(timeout().count() / 1000.0) +
                         " s: a peer did not take part (it may have exited, hung, or issued a "
                         "different sequence of collectives); gloo: " + what);
    throw CommError(ctx + " failed: a peer closed its connection (the process may have died); gloo: " + what);
  } catch (const ::gloo::Exception& e) {
    throw CommError(describe(op, seq) + " failed: " + e.what());
  }
}

void GlooBackend::allreduce_impl(Tensor& t, ReduceOp op, std::uint64_t seq) {
  const std::size_t n = static_cast<std::size_t>(t.numel());
  const std::size_t bytes = t.nbytes();
  AllreduceAlgo algo = algo_;
  if (t.dtype() == DType::Float16 || t.dtype() == DType::BFloat16) {
    // Generic allreduce with our own reduction (Gloo's class algorithms know no bfloat16).
    ::gloo::AllreduceOptions o(context_);
    o.setOutput(static_cast<std::uint16_t*>(t.raw_data()), n);
    if (t.dtype() == DType::Float16)
      o.setReduceFunction(&sum16<fp16_to_float, float_to_fp16>);
    else
      o.setReduceFunction(&sum16<bf16_to_float, float_to_bf16>);
    o.setTag(tag_of(seq));
    o.setTimeout(timeout());
    ::gloo::allreduce(o);
    return;
  }
  const bool use_sync = sync_context_ && bytes <= sync_max_bytes_ && algo == AllreduceAlgo::Auto;
  if (algo == AllreduceAlgo::Auto)
    // Measured on 2 ranks over loopback (docs/algorithms.md): small messages go to
    // halving-doubling on the busy-polling mesh, larger ones to gloo::allreduce's ring.
    algo = AllreduceAlgo::Ring;
  by_dtype(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* ptr = static_cast<T*>(t.raw_data());
    if (use_sync) {
      // Pieces of at most sync_chunk_elems: halving-doubling's bandwidth drops on messages
      // much larger than a few MiB (its temporary buffers, the page faults on them), so a
      // large message goes as a sequence of mid-sized ones (every rank cuts it alike).
      const std::size_t chunk = std::max<std::size_t>(1, sync_chunk_bytes_ / sizeof(T));
      for (std::size_t off = 0; off < n; off += chunk) {
        const std::size_t len = std::min(chunk, n - off);
        ::gloo::AllreduceHalvingDoubling<T> a(sync_context_, {ptr + off}, static_cast<int>(len), reduction<T>(op));
        a.run();
      }
      return;
    }
    switch (algo) {
      case AllreduceAlgo::RingChunked: {
        ::gloo::AllreduceRingChunked<T> a(context_, {ptr}, static_cast<int>(n), reduction<T>(op));
        a.run();
        break;
      }
      case AllreduceAlgo::HalvingDoubling: {
        ::gloo::AllreduceHalvingDoubling<T> a(context_, {ptr}, static_cast<int>(n), reduction<T>(op));
        a.run();
        break;
      }
      default: {
        ::gloo::AllreduceOptions o(context_);
        o.setOutput(ptr, n);
        o.setReduceFunction(reduce_fn<T>(op));
        o.setTag(tag_of(seq));
        o.setTimeout(timeout());
        o.setAlgorithm(algo == AllreduceAlgo::Bcube ? ::gloo::AllreduceOptions::Algorithm::BCUBE
                                                    : ::gloo::AllreduceOptions::Algorithm::RING);
        ::gloo::allreduce(o);
      }
    }
  });
  (void)bytes;
  if (op == ReduceOp::Avg) kernels_for(t.device()).divide(t, static_cast<float>(size()));
}

void GlooBackend::run_allreduce(Tensor& t, ReduceOp op, std::uint64_t seq) {
  Tensor h = host_of(t);
  guarded("allreduce", seq, [&] { allreduce_impl(h, op, seq); });
  copy_back(h, t);
}

void GlooBackend::run_broadcast(Tensor& t, int root, std::uint64_t seq) {
  Tensor h = host_of(t, rank() == root);
  guarded("broadcast", seq, [&] {
    ::gloo::BroadcastOptions o(context_);
    by_dtype(h, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      o.setOutput(static_cast<T*>(h.raw_data()), static_cast<std::size_t>(h.numel()));
    });
    o.setRoot(root);
    o.setTag(tag_of(seq));
    o.setTimeout(timeout());
    ::gloo::broadcast(o);
  });
  if (rank() != root) copy_back(h, t);
}

void GlooBackend::run_allgather(std::vector<Tensor>& out, const Tensor& in, std::uint64_t seq) {
  const Tensor h = host_of(in);
  guarded("allgather", seq, [&] {
    Tensor flat = Tensor::empty({in.numel() * size()}, in.dtype());
    ::gloo::AllgatherOptions o(context_);
    by_dtype(in, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      o.setInput(static_cast<T*>(h.raw_data()), static_cast<std::size_t>(in.numel()));
      o.setOutput(static_cast<T*>(flat.raw_data()), static_cast<std::size_t>(flat.numel()));
    });
    o.setTag(tag_of(seq));
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
  guarded("reduce_scatter", seq, [&] { allreduce_impl(flat, op, seq); });
  write_back(out, 0, static_cast<char*>(flat.raw_data()) + rank() * out.nbytes(), out.nbytes());
}

void GlooBackend::run_reduce(Tensor& t, int root, ReduceOp op, std::uint64_t seq) {
  Tensor h = host_of(t);
  guarded("reduce", seq, [&] {
    Tensor scratch = rank() == root ? h : Tensor::empty(h.shape(), h.dtype());
    ::gloo::ReduceOptions o(context_);
    by_dtype(h, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      o.setInput(static_cast<T*>(h.raw_data()), static_cast<std::size_t>(h.numel()));
      o.setOutput(static_cast<T*>(scratch.raw_data()), static_cast<std::size_t>(h.numel()));
      o.setReduceFunction(reduce_fn<T>(op));
    });
    // 16-bit floats (sum only): widen, add, round, as allreduce (not integer sums of the bits).
    if (h.dtype() == DType::Float16) o.setReduceFunction(&sum16<fp16_to_float, float_to_fp16>);
    if (h.dtype() == DType::BFloat16) o.setReduceFunction(&sum16<bf16_to_float, float_to_bf16>);
    o.setRoot(root);
    o.setTag(tag_of(seq));
    o.setTimeout(timeout());
    ::gloo::reduce(o);
  });
  if (rank() != root) return;
  if (op == ReduceOp::Avg) kernels_for(h.device()).divide(h, static_cast<float>(size()));
  copy_back(h, t);
}

void GlooBackend::run_gather(std::vector<Tensor>& out, const Tensor& in, int root, std::uint64_t seq) {
  const Tensor h = host_of(in);
  guarded("gather", seq, [&] {
    Tensor flat = rank() == root ? Tensor::empty({in.numel() * size()}, in.dtype()) : Tensor();
    ::gloo::GatherOptions o(context_);
    by_dtype(in, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      o.setInput(static_cast<T*>(h.raw_data()), static_cast<std::size_t>(in.numel()));
      if (rank() == root) o.setOutput(static_cast<T*>(flat.raw_data()), static_cast<std::size_t>(flat.numel()));
    });
    o.setRoot(root);
    o.setTag(tag_of(seq));
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
  guarded("scatter", seq, [&] {
    ::gloo::ScatterOptions o(context_);
    by_dtype(out, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      if (rank() == root) {
        std::vector<T*> ptrs;
        for (auto& t : hin) ptrs.push_back(static_cast<T*>(t.raw_data()));
        o.setInputs(ptrs, static_cast<std::size_t>(out.numel()));
      }
      o.setOutput(static_cast<T*>(h.raw_data()), static_cast<std::size_t>(out.numel()));
    });
    o.setRoot(root);
    o.setTag(tag_of(seq));
    o.setTimeout(timeout());
    ::gloo::scatter(o);
  });
  copy_back(h, out);
}

void GlooBackend::run_barrier(std::uint64_t seq) {
  guarded("barrier", seq, [&] {
    ::gloo::BarrierOptions o(context_);
    o.setTag(tag_of(seq));
    o.setTimeout(timeout());
    ::gloo::barrier(o);
  });
}

void GlooBackend::run_send(const Tensor& t, int dst, int tag, std::uint64_t seq) {
  const Tensor h = host_of(t);
  std::shared_ptr<::gloo::transport::UnboundBuffer> buf;
  guarded("send", seq, [&] {
    buf = context_->createUnboundBuffer(h.raw_data(), h.nbytes());
    buf->send(dst, static_cast<std::uint64_t>(tag));
  });
  // The (host) tensor is captured so its memory outlives the transfer.
  defer_completion([this, buf, h, seq] { guarded("send", seq, [&] { buf->waitSend(timeout()); }); });
}

void GlooBackend::run_recv(Tensor& t, int src, int tag, std::uint64_t seq) {
  const Tensor h = host_of(t, false);
  std::shared_ptr<::gloo::transport::UnboundBuffer> buf;
  guarded("recv", seq, [&] {
    buf = context_->createUnboundBuffer(h.raw_data(), h.nbytes());
    buf->recv(src, static_cast<std::uint64_t>(tag));
  });
  // A staged receive lands in `t` when it completes (before its Work does).
  defer_completion([this, buf, h, t, seq] {
    guarded("recv", seq, [&] { buf->waitRecv(timeout()); });
    copy_back(h, t);
  });
}

}  // namespace phalanx::gloo_backend
