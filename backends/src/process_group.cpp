#include "phalanx/backends/process_group.hpp"

#include <cstdlib>

#include "phalanx/backends/comm_error.hpp"

namespace phalanx {

std::chrono::milliseconds default_timeout() {
  if (const char* s = std::getenv("PHALANX_TIMEOUT")) {
    char* end = nullptr;
    const double secs = std::strtod(s, &end);
    if (end == s || *end != '\0' || !(secs > 0))
      throw ConfigError(std::string("PHALANX_TIMEOUT='") + s +
                        "' is not a positive number of seconds");
    return std::chrono::milliseconds(static_cast<std::int64_t>(secs * 1000));
  }
  return kDefaultTimeout;
}

ProcessGroup::ProcessGroup(int rank, int size, std::chrono::milliseconds timeout, bool inline_ops)
    : rank_(rank), size_(size), timeout_(timeout), inline_ops_(inline_ops) {
  if (size < 1) throw ConfigError(detail::concat("world size must be >= 1, got ", size));
  if (rank < 0 || rank >= size)
    throw ConfigError(detail::concat("rank ", rank, " is outside [0, ", size, ")"));
  if (!inline_ops_) worker_ = std::thread([this] { worker_loop(); });
}

ProcessGroup::~ProcessGroup() { shutdown(); }

void ProcessGroup::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  completion_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (completer_.joinable()) completer_.join();
  for (auto& [work, waiter] : completions_)
    work->finish(std::make_exception_ptr(CommError(detail::concat(
        work->op(), " #", work->sequence_number(), " on rank ", rank_,
        ": the process group was destroyed before it completed"))));
  completions_.clear();
  // Anything still queued never ran: fail it rather than leave a waiter hanging.
  for (auto& [work, fn] : queue_)
    work->finish(std::make_exception_ptr(CommError(detail::concat(
        work->op(), " #", work->sequence_number(), " on rank ", rank_,
        ": the process group was destroyed before it ran"))));
  queue_.clear();
}

std::string ProcessGroup::describe(const std::string& op, std::uint64_t seq) const {
  return detail::concat(op, " #", seq, " on rank ", rank_, " of ", size_, " (", backend_name(), ")");
}

std::uint64_t ProcessGroup::sequence_number() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_seq_;
}

WorkPtr ProcessGroup::enqueue(const char* op, std::function<void(std::uint64_t)> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t seq = next_seq_++;
  auto work = std::make_shared<Work>(op, seq, rank_, timeout_ + std::chrono::seconds(5));
  if (stopping_) {
    work->finish(std::make_exception_ptr(CommError(describe(op, seq) + ": the process group is shut down")));
    return work;
  }
  if (!broken_.empty()) {
    work->finish(std::make_exception_ptr(
        CommError(describe(op, seq) + ": the process group is broken since an earlier failure (" +
                  broken_ + "); destroy it and re-initialise, or restart the job")));
    return work;
  }
  if (inline_ops_) {
    lock.unlock();
    try {
      fn(seq);
      work->finish();
    } catch (...) {
      work->finish(std::current_exception());
    }
    return work;
  }
  queue_.emplace_back(work, std::move(fn));
  lock.unlock();
  cv_.notify_one();
  return work;
}

void ProcessGroup::worker_loop() {
  for (;;) {
    std::pair<WorkPtr, std::function<void(std::uint64_t)>> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      if (stopping_) return;       // shutdown() fails what is left
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      item.second(item.first->sequence_number());
      if (pending_waiter_) {
        std::lock_guard<std::mutex> lock(mu_);
        completions_.emplace_back(item.first, std::move(pending_waiter_));
        pending_waiter_ = nullptr;
        if (!completer_.joinable()) completer_ = std::thread([this] { completion_loop(); });
        completion_cv_.notify_all();
      } else {
        item.first->finish();
      }
    } catch (const std::exception& e) {
      pending_waiter_ = nullptr;
      mark_broken(e.what());
      item.first->finish(std::current_exception());
    } catch (...) {
      pending_waiter_ = nullptr;
      mark_broken("unknown error");
      item.first->finish(std::current_exception());
    }
  }
}

void ProcessGroup::mark_broken(const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_.empty()) broken_ = what;
}

void ProcessGroup::defer_completion(std::function<void()> waiter) { pending_waiter_ = std::move(waiter); }

void ProcessGroup::completion_loop() {
  for (;;) {
    std::pair<WorkPtr, std::function<void()>> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      completion_cv_.wait(lock, [&] { return stopping_ || !completions_.empty(); });
      if (stopping_ || completions_.empty()) return;
      item = std::move(completions_.front());
      completions_.pop_front();
    }
    try {
      item.second();
      item.first->finish();
    } catch (const std::exception& e) {
      mark_broken(e.what());
      item.first->finish(std::current_exception());
    } catch (...) {
      mark_broken("unknown error");
      item.first->finish(std::current_exception());
    }
  }
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
void check_tensor(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) throw ValueError(detail::concat(op, ": ", what, " is undefined"));
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

WorkPtr ProcessGroup::allreduce(Tensor t, ReduceOp op) {
  check_tensor(t, "allreduce", "tensor");
  if ((t.dtype() == DType::Float16 || t.dtype() == DType::BFloat16) && op != ReduceOp::Sum)
    throw TypeError(std::string("allreduce: ") + dtype_name(t.dtype()) + " tensors support sum only");
  if (op == ReduceOp::Avg && t.dtype() != DType::Float32)
    throw TypeError("allreduce: avg needs a float32 tensor");
  return enqueue("allreduce", [this, t, op](std::uint64_t seq) mutable { run_allreduce(t, op, seq); });
}

WorkPtr ProcessGroup::broadcast(Tensor t, int root) {
  check_tensor(t, "broadcast", "tensor");
  check_root(root, "broadcast");
  return enqueue("broadcast", [this, t, root](std::uint64_t seq) mutable { run_broadcast(t, root, seq); });
}

WorkPtr ProcessGroup::allgather(std::vector<Tensor> outputs, Tensor input) {
  check_tensor(input, "allgather", "input");
  check_list(outputs, input, size_, "allgather", "output");
  return enqueue("allgather", [this, outputs, input](std::uint64_t seq) mutable {
    run_allgather(outputs, input, seq);
  });
}

WorkPtr ProcessGroup::reduce_scatter(Tensor output, std::vector<Tensor> inputs, ReduceOp op) {
  check_tensor(output, "reduce_scatter", "output");
  check_list(inputs, output, size_, "reduce_scatter", "input");
  if (op == ReduceOp::Avg && output.dtype() != DType::Float32)
    throw TypeError("reduce_scatter: avg needs float32 tensors");
  return enqueue("reduce_scatter", [this, output, inputs, op](std::uint64_t seq) mutable {
    run_reduce_scatter(output, inputs, op, seq);
  });
}

WorkPtr ProcessGroup::reduce(Tensor t, int root, ReduceOp op) {
  check_tensor(t, "reduce", "tensor");
  check_root(root, "reduce");
  if (op == ReduceOp::Avg && t.dtype() != DType::Float32) throw TypeError("reduce: avg needs a float32 tensor");
  return enqueue("reduce", [this, t, root, op](std::uint64_t seq) mutable { run_reduce(t, root, op, seq); });
}

WorkPtr ProcessGroup::gather(std::vector<Tensor> outputs, Tensor input, int root) {
  check_tensor(input, "gather", "input");
  check_root(root, "gather");
  if (rank_ == root) check_list(outputs, input, size_, "gather", "output");
  return enqueue("gather", [this, outputs, input, root](std::uint64_t seq) mutable {
    run_gather(outputs, input, root, seq);
  });
}

WorkPtr ProcessGroup::scatter(Tensor output, std::vector<Tensor> inputs, int root) {
  check_tensor(output, "scatter", "output");
  check_root(root, "scatter");
  if (rank_ == root) check_list(inputs, output, size_, "scatter", "input");
  return enqueue("scatter", [this, output, inputs, root](std::uint64_t seq) mutable {
    run_scatter(output, inputs, root, seq);
  });
}

WorkPtr ProcessGroup::barrier() {
  return enqueue("barrier", [this](std::uint64_t seq) { run_barrier(seq); });
}

WorkPtr ProcessGroup::send(Tensor t, int dst, int tag) {
  check_tensor(t, "send", "tensor");
  check_peer(dst, "send");
  return enqueue("send", [this, t, dst, tag](std::uint64_t seq) { run_send(t, dst, tag, seq); });
}

WorkPtr ProcessGroup::recv(Tensor t, int src, int tag) {
  check_tensor(t, "recv", "tensor");
  check_peer(src, "recv");
  return enqueue("recv", [this, t, src, tag](std::uint64_t seq) mutable { run_recv(t, src, tag, seq); });
}

}  // namespace phalanx
