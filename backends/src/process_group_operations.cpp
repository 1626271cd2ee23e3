// The ten operations of a ProcessGroup: argument checks, the collective's signature
// (PHALANX_DEBUG=detail), its timeline span, and the dispatch: run here on the caller's
// thread when the backend runs its operations inline (on a Work of the backend's
// inline_work), else to the queue.
#include "phalanx/backends/process_group.hpp"

#include <cstring>
#include <tuple>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/kernels.hpp"
#include "phalanx/core/tensor_impl.hpp"
#include "phalanx/core/timeline.hpp"
#include "run_operation.hpp"

namespace phalanx {

namespace {
// Stream ordering of operations on device tensors (docs/gpu.md, "Stream ordering").
Device device_of() { return Device::cpu(); }
Device device_of(const Tensor& t) { return t.defined() ? t.device() : Device::cpu(); }
Device device_of(const std::vector<Tensor>& ts) {
  for (const auto& t : ts)
    if (t.defined() && !t.device().is_cpu()) return t.device();
  return Device::cpu();
}
template <class A, class... Rest>
Device device_of(const A& a, const Rest&... rest) {
  const Device d = device_of(a);
  return d.is_cpu() ? device_of(rest...) : d;
}

/// The ready event of an operation on device tensors: recorded on the issuing thread's
/// stream when the operation is issued, so it covers exactly the work that produced the
/// operation's inputs, however late the worker runs it. Waited for on the host by the thread
/// that runs a host-staging backend (CommStream), on the device by a backend that orders
/// device streams (Backend::ready_event).
class ReadyEvent {
 public:
  ReadyEvent(DeviceKernels& k, int device) : k_(k), event_(k.event_create(device)) {
    if (event_) k_.event_record(event_);
  }
  ~ReadyEvent() {
    if (event_) k_.event_destroy(event_);
  }
  ReadyEvent(const ReadyEvent&) = delete;
  ReadyEvent& operator=(const ReadyEvent&) = delete;
  DeviceKernels& kernels() const { return k_; }
  void* event() const { return event_; }

 private:
  DeviceKernels& k_;
  void* event_;
};

// Nesting depth of CommStream scopes on this thread: a hierarchical group runs its inner
// groups' operations inside its own, and only the outermost scope switches streams.
thread_local int t_comm_depth = 0;

/// While the backend moves the bytes: this thread is on the device's communication stream,
/// after the operation's ready event completed (unless a test skips that wait).
class CommStream {
 public:
  CommStream(const ReadyEvent& ready, bool wait) : k_(ready.kernels()) {
    if (t_comm_depth++ == 0) k_.set_comm_stream(true);
    if (wait && ready.event()) k_.event_synchronize(ready.event());
  }
  ~CommStream() {
    if (--t_comm_depth == 0) k_.set_comm_stream(false);
  }
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

 private:
  DeviceKernels& k_;
};
}  // namespace

template <class Body, class... Args>
WorkPtr ProcessGroup::call(const char* op, const std::string& signature, Body body, const Args&... args) {
  const Device dev = device_of(args...);
  if (dev.is_cpu()) return dispatch(op, signature, body, args...);
  // Device tensors: the caller's stream may still be computing the inputs, so record the
  // ready event now, on the caller's thread (not when the worker runs the operation).
  auto ready = std::make_shared<ReadyEvent>(kernels_for(dev), dev.index);
  if (be_->orders_device_streams()) {
    // The backend waits for `ready` on its own stream (no host block), queues the operation
    // and records its done event there (complete_on_device): the Work's wait() is then a
    // device-side wait, and the tensors are held until the done event completed, so the
    // allocator cannot hand their memory to the compute stream while the device still uses
    // it (what c10d's recordStream, or its stashed tensors, ensure).
    const auto ordered = [this, body, ready, index = dev.index](std::uint64_t seq, Args&... a) {
      DeviceKernels& k = ready->kernels();
      DeviceOp d{&k, ready->event(), k.event_create(index), false};
      device_op_ = &d;
      try {
        body(seq, a...);
      } catch (...) {
        device_op_ = nullptr;
        k.event_destroy(d.done);
        throw;
      }
      device_op_ = nullptr;
      if (!d.enqueued) {  // completed on the host after all (p2p: defer_completion)
        k.event_destroy(d.done);
        return;
      }
      pending_device_ = d;  // run_op gives the done event to the Work
      if (skip_device_order_ == "hold") return;  // test switch: the tensors go with the closure
      pending_waiter_ = [waiter = std::move(pending_waiter_), held = std::tuple<Args...>(a...)] {
        (void)held;
        waiter();
      };
    };
    return dispatch(op, signature, ordered, args...);
  }
  const bool wait = skip_ready_wait_ == "0" || (skip_ready_wait_ == "allreduce" && std::strcmp(op, "allreduce") != 0);
  const auto ordered = [body, ready, wait](std::uint64_t seq, Args&... a) {
    const CommStream stream(*ready, wait);
    body(seq, a...);
  };
  return dispatch(op, signature, ordered, args...);
}

template <class Body, class... Args>
WorkPtr ProcessGroup::dispatch(const char* op, const std::string& signature, Body body, const Args&... args) {
  // Open inline group: what enqueue() does, without mu_ (an abort racing this check is an
  // abort during the operation, as with the lock: inline operations are never `running_`).
  // The backend gets the caller's own handles: it writes their data, never the handles
  // (backend.hpp), so the const_cast changes nothing the caller can see but the data.
  if (inline_ops_ && !closed_.load(std::memory_order_acquire)) {
    WorkPtr work = be_->inline_work(InlineOp(op, next_seq_, work_timeout()));  // may refuse (throws)
    auto fn = [&](std::uint64_t seq) { body(seq, const_cast<Args&>(args)...); };
    // Plain stores, no read-modify-write: a group's inline operations come from one thread at a time.
    inline_active_.store(true, std::memory_order_relaxed);
    run_op<true>(work, fn, signature);
    inline_active_.store(false, std::memory_order_release);
    return work;
  }
  // Queued: the closure holds copies of the handles until the worker runs it.
  return enqueue(op, [body, held = std::tuple<Args...>(args...)](std::uint64_t seq) mutable {
    std::apply([&](Args&... a) { body(seq, a...); }, held);
  }, signature);
}

void ProcessGroup::check_root(int root, const char* op) const {
  if (root < 0 || root >= size_)
    throw ValueError(detail::concat(op, ": root ", root, " is outside [0, ", size_, ")"));
}

void ProcessGroup::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= size_ || peer == rank_)
    throw ValueError(detail::concat(op, ": peer ", peer, " must be another rank in [0, ", size_,
                                    ") (this is rank ", rank_, ")"));
}

namespace {
/// "allreduce(sum, float32 [4, 3])": what PHALANX_DEBUG=detail compares across ranks.
std::string signature(const char* op, const Tensor& t, const std::string& extra = {}) {
  return detail::concat(op, "(", extra, extra.empty() ? "" : ", ", dtype_name(t.dtype()), " ",
                        shape_str(t.shape()), ")");
}
std::string root_of(int root) { return "root " + std::to_string(root); }
void check_tensor(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) throw ValueError(detail::concat(op, ": ", what, " is undefined"));
  // Backends read and write tensors as one block of memory (c10d refuses views the same way).
  if (!t.is_contiguous())
    throw ValueError(detail::concat(op, ": tensors must be contiguous; ", what, " ", t.str(),
                                    " is a view: pass t.contiguous() (and copy_ the result back)"));
}
void check_list(const std::vector<Tensor>& ts, const Tensor& like, int size, const char* op,
                const char* what) {
  if (static_cast<int>(ts.size()) != size)
    throw ValueError(detail::concat(op, ": expected ", size, " ", what, " tensors (one per rank), got ",
                                    ts.size()));
  for (const auto& t : ts) {
    check_tensor(t, op, what);
    if (t.numel() != like.numel() || t.dtype() != like.dtype())
      throw ShapeError(detail::concat(op, ": every ", what, " tensor must match ", like.str(), ", got ",
                                      t.str()));
  }
}
}  // namespace

namespace {
/// An operation's event in the timeline (docs/timeline.md) as the backend runs it: its
/// size in bytes (computed only while recording) and its sequence number.
template <class Bytes>
timeline::Span traced(const char* op, std::uint64_t seq, Bytes bytes) {
  return timeline::Span(op, "comm", "bytes", bytes, {"seq", static_cast<std::int64_t>(seq)});
}
}  // namespace

namespace {
const std::string kNoSignature;  // no collective check set: nothing to build, copy or move
}  // namespace

WorkPtr ProcessGroup::allreduce(const Tensor& t, ReduceOp op) {
  check_tensor(t, "allreduce", "tensor");
  const DType dt = t.impl()->dtype();  // inline (defined: checked)
  if (dt == DType::Bool) throw TypeError("allreduce: bool tensors cannot be reduced; convert them to int64 or float32");
  if ((dt == DType::Float16 || dt == DType::BFloat16) && op != ReduceOp::Sum)
    throw TypeError(std::string("allreduce: ") + dtype_name(dt) + " tensors support sum only");
  if (op == ReduceOp::Avg && dt != DType::Float32)
    throw TypeError("allreduce: avg needs a float32 tensor");
  const auto body = [this, op](std::uint64_t seq, Tensor& x) {
    const auto span = traced("allreduce", seq, [&] { return x.nbytes(); });
    be_->run_allreduce(x, op, seq);
  };
  if (!checking_.load(std::memory_order_relaxed)) return call("allreduce", kNoSignature, body, t);
  return call("allreduce", signature("allreduce", t, reduce_op_name(op)), body, t);
}

WorkPtr ProcessGroup::broadcast(const Tensor& t, int root) {
  check_tensor(t, "broadcast", "tensor");
  check_root(root, "broadcast");
  const auto body = [this, root](std::uint64_t seq, Tensor& x) {
    const auto span = traced("broadcast", seq, [&] { return x.nbytes(); });
    be_->run_broadcast(x, root, seq);
  };
  if (!checking_.load(std::memory_order_relaxed)) return call("broadcast", kNoSignature, body, t);
  return call("broadcast", signature("broadcast", t, root_of(root)), body, t);
}

WorkPtr ProcessGroup::allgather(const std::vector<Tensor>& outputs, const Tensor& input) {
  check_tensor(input, "allgather", "input");
  check_list(outputs, input, size_, "allgather", "output");
  const auto body = [this](std::uint64_t seq, std::vector<Tensor>& out, Tensor& in) {
    const auto span = traced("allgather", seq, [&] { return in.nbytes(); });
    be_->run_allgather(out, in, seq);
  };
  return call("allgather", checking_.load(std::memory_order_relaxed) ? signature("allgather", input) : kNoSignature,
              body, outputs, input);
}

WorkPtr ProcessGroup::reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) {
  check_tensor(output, "reduce_scatter", "output");
  check_list(inputs, output, size_, "reduce_scatter", "input");
  if (output.dtype() == DType::Bool)
    throw TypeError("reduce_scatter: bool tensors cannot be reduced; convert them to int64 or float32");
  if ((output.dtype() == DType::Float16 || output.dtype() == DType::BFloat16) && op != ReduceOp::Sum)
    throw TypeError(std::string("reduce_scatter: ") + dtype_name(output.dtype()) + " tensors support sum only");
  if (op == ReduceOp::Avg && output.dtype() != DType::Float32)
    throw TypeError("reduce_scatter: avg needs float32 tensors");
  const auto body = [this, op](std::uint64_t seq, Tensor& out, std::vector<Tensor>& in) {
    const auto span = traced("reduce_scatter", seq, [&] {
      std::size_t n = 0;
      for (const auto& x : in) n += x.nbytes();
      return n;
    });
    be_->run_reduce_scatter(out, in, op, seq);
  };
  return call("reduce_scatter",
              checking_.load(std::memory_order_relaxed) ? signature("reduce_scatter", output, reduce_op_name(op))
                                                        : kNoSignature,
              body, output, inputs);
}

WorkPtr ProcessGroup::reduce(const Tensor& t, int root, ReduceOp op) {
  check_tensor(t, "reduce", "tensor");
  check_root(root, "reduce");
  if (t.dtype() == DType::Bool) throw TypeError("reduce: bool tensors cannot be reduced; convert them to int64 or float32");
  if ((t.dtype() == DType::Float16 || t.dtype() == DType::BFloat16) && op != ReduceOp::Sum)
    throw TypeError(std::string("reduce: ") + dtype_name(t.dtype()) + " tensors support sum only");
  if (op == ReduceOp::Avg && t.dtype() != DType::Float32) throw TypeError("reduce: avg needs a float32 tensor");
  const auto body = [this, root, op](std::uint64_t seq, Tensor& x) {
    const auto span = traced("reduce", seq, [&] { return x.nbytes(); });
    be_->run_reduce(x, root, op, seq);
  };
  return call("reduce",
              checking_.load(std::memory_order_relaxed)
                  ? signature("reduce", t, std::string(reduce_op_name(op)) + ", " + root_of(root))
                  : kNoSignature,
              body, t);
}

WorkPtr ProcessGroup::gather(const std::vector<Tensor>& outputs, const Tensor& input, int root) {
  check_tensor(input, "gather", "input");
  check_root(root, "gather");
  if (rank_ == root) check_list(outputs, input, size_, "gather", "output");
  const auto body = [this, root](std::uint64_t seq, std::vector<Tensor>& out, Tensor& in) {
    const auto span = traced("gather", seq, [&] { return in.nbytes(); });
    be_->run_gather(out, in, root, seq);
  };
  return call("gather", checking_.load(std::memory_order_relaxed) ? signature("gather", input, root_of(root)) : kNoSignature,
              body, outputs, input);
}

WorkPtr ProcessGroup::scatter(const Tensor& output, const std::vector<Tensor>& inputs, int root) {
  check_tensor(output, "scatter", "output");
  check_root(root, "scatter");
  if (rank_ == root) check_list(inputs, output, size_, "scatter", "input");
  const auto body = [this, root](std::uint64_t seq, Tensor& out, std::vector<Tensor>& in) {
    const auto span = traced("scatter", seq, [&] { return out.nbytes(); });
    be_->run_scatter(out, in, root, seq);
  };
  return call("scatter",
              checking_.load(std::memory_order_relaxed) ? signature("scatter", output, root_of(root)) : kNoSignature,
              body, output, inputs);
}

WorkPtr ProcessGroup::barrier() {
  static const std::string kBarrier("barrier()");
  const auto body = [this](std::uint64_t seq) {
    const timeline::Span span("barrier", "comm", {"seq", static_cast<std::int64_t>(seq)});
    be_->run_barrier(seq);
  };
  return call("barrier", checking_.load(std::memory_order_relaxed) ? kBarrier : kNoSignature, body);
}

WorkPtr ProcessGroup::send(const Tensor& t, int dst, int tag) {
  check_tensor(t, "send", "tensor");
  check_peer(dst, "send");
  return call("send", kNoSignature, [this, dst, tag](std::uint64_t seq, Tensor& x) {
    const auto span = traced("send", seq, [&] { return x.nbytes(); });
    be_->run_send(x, dst, tag, seq);
  }, t);
}

WorkPtr ProcessGroup::recv(const Tensor& t, int src, int tag) {
  check_tensor(t, "recv", "tensor");
  check_peer(src, "recv");
  return call("recv", kNoSignature, [this, src, tag](std::uint64_t seq, Tensor& x) {
    const auto span = traced("recv", seq, [&] { return x.nbytes(); });
    be_->run_recv(x, src, tag, seq);
  }, t);
}

}  // namespace phalanx
