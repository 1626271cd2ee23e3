// ProcessGroup owns its backend's lifetime: destroying a group while an operation runs and
// others are queued stops the threads first, fails what never ran, and only then destroys
// the backend, so no hook runs on a half-destroyed backend (no backend calls shutdown()).
// The backends below record every event in a log that outlives them, and poison their
// members in their destructors: a hook that ran after it would log "used after destroy"
// (and is a heap-use-after-free under -fsanitize=address).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "phalanx/backends/backend.hpp"
#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/process_group.hpp"
#include "phalanx/core/creation.hpp"
// The plugins' spare Work (plugin-private, included by path as the shm and MPI plugins do).
#include "../../backends/plugin_support/inline_work.hpp"

using namespace phalanx;
using namespace std::chrono_literals;

static_assert(std::is_final<ProcessGroup>::value, "backends derive from Backend, not from ProcessGroup");

namespace {

struct Log {
  std::mutex mu;
  std::vector<std::string> events;
  void add(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
  }
  std::vector<std::string> get() {
    std::lock_guard<std::mutex> lock(mu);
    return events;
  }
  bool has(const std::string& e) {
    const auto v = get();
    return std::find(v.begin(), v.end(), e) != v.end();
  }
  /// Waits (sleeping) until `e` was logged; false after 10 s.
  bool wait_for(const std::string& e) {
    for (int i = 0; i < 2000; ++i) {
      if (has(e)) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
};

constexpr std::uint32_t kAlive = 0xA11CEu, kDead = 0xDEADBEEFu;

/// A backend whose operations do nothing: the test backends below override what they test.
class QuietBackend : public Backend {
 protected:
  using Backend::Backend;
  void run_allreduce(Tensor&, ReduceOp, std::uint64_t) override {}
  void run_broadcast(Tensor&, int, std::uint64_t) override {}
  void run_allgather(std::vector<Tensor>&, const Tensor&, std::uint64_t) override {}
  void run_reduce_scatter(Tensor&, std::vector<Tensor>&, ReduceOp, std::uint64_t) override {}
  void run_reduce(Tensor&, int, ReduceOp, std::uint64_t) override {}
  void run_gather(std::vector<Tensor>&, const Tensor&, int, std::uint64_t) override {}
  void run_scatter(Tensor&, std::vector<Tensor>&, int, std::uint64_t) override {}
  void run_barrier(std::uint64_t) override {}
  void run_send(const Tensor&, int, int, std::uint64_t) override {}
  void run_recv(Tensor&, int, int, std::uint64_t) override {}
};

/// allreduce sleeps `delay`; send posts a waiter that sleeps `delay` (a deferred completion).
class SlowBackend final : public QuietBackend {
 public:
  SlowBackend(Log& log, std::chrono::milliseconds delay, bool inline_ops = false)
      : QuietBackend(0, 2, 10s, inline_ops), log_(&log), delay_(delay), buffer_(new int[16]) {}
  ~SlowBackend() override {
    log_->add("destroyed");
    alive_ = kDead;  // poison: a hook running after this point sees it
    delete[] buffer_;
    buffer_ = nullptr;
    delay_ = -1ms;
  }
  std::string name() const override { return "slow"; }

 protected:
  void on_abort() noexcept override { log_->add(is_aborted() ? "on_abort (aborted)" : "on_abort"); }
  void on_close() noexcept override { log_->add("on_close"); }
  void run_allreduce(Tensor& t, ReduceOp, std::uint64_t seq) override {
    touch("allreduce " + std::to_string(seq) + " begins");
    std::this_thread::sleep_for(delay_);
    touch("allreduce " + std::to_string(seq) + " ends");
    t.data<float>()[0] += 1;
  }
  void run_send(const Tensor&, int, int, std::uint64_t seq) override {
    touch("send " + std::to_string(seq) + " posted");
    defer_completion([this, seq] {
      touch("send " + std::to_string(seq) + " waits");
      std::this_thread::sleep_for(delay_);
      touch("send " + std::to_string(seq) + " completes");
    });
  }

 private:
  void touch(const std::string& what) {
    if (alive_ != kAlive || !buffer_) {
      log_->add("used after destroy: " + what);
      return;
    }
    buffer_[0] += 1;
    log_->add(what);
  }
  Log* log_;
  std::uint32_t alive_ = kAlive;
  std::chrono::milliseconds delay_;
  int* buffer_;
};

std::vector<std::string> used_after_destroy(Log& log) {
  std::vector<std::string> bad;
  bool destroyed = false;
  for (const auto& e : log.get()) {
    if (destroyed || e.rfind("used after destroy", 0) == 0) bad.push_back(e);
    destroyed = destroyed || e == "destroyed";
  }
  return bad;
}

bool failed_with(const WorkPtr& w, const std::string& text) {
  try {
    w->wait(5s);
  } catch (const CommError& e) {
    return std::string(e.what()).find(text) != std::string::npos;
  }
  return false;
}

}  // namespace

TEST_CASE("destroying a group while an operation runs and others are queued") {
  Log log;
  auto pg = std::make_unique<ProcessGroup>(std::make_unique<SlowBackend>(log, 300ms));
  Tensor t = zeros({1});
  const WorkPtr running = pg->allreduce(t), queued1 = pg->allreduce(zeros({1})), queued2 = pg->barrier();
  REQUIRE(log.wait_for("allreduce 0 begins"));
  pg.reset();  // blocks until the running allreduce returned

  CHECK(used_after_destroy(log).empty());
  const std::vector<std::string> want{"allreduce 0 begins", "on_close", "allreduce 0 ends", "destroyed"};
  CHECK(log.get() == want);
  CHECK(running->is_completed());
  CHECK_NOTHROW(running->wait(1s));
  CHECK(t.data<float>()[0] == 1.0f);
  CHECK(failed_with(queued1, "allreduce #1 on rank 0: the process group was destroyed before it ran"));
  CHECK(failed_with(queued2, "barrier #2 on rank 0: the process group was destroyed before it ran"));
}

TEST_CASE("destroying a group while a deferred completion runs and another waits") {
  Log log;
  auto pg = std::make_unique<ProcessGroup>(std::make_unique<SlowBackend>(log, 300ms));
  const WorkPtr first = pg->send(zeros({1}), 1), second = pg->send(zeros({1}), 1);
  REQUIRE(log.wait_for("send 0 waits"));
  REQUIRE(log.wait_for("send 1 posted"));  // its waiter is queued behind the first one's
  pg.reset();

  CHECK(used_after_destroy(log).empty());
  const auto events = log.get();
  CHECK(events.back() == "destroyed");
  CHECK(log.has("send 0 completes"));
  CHECK_FALSE(log.has("send 1 waits"));
  CHECK_NOTHROW(first->wait(1s));
  CHECK(failed_with(second, "send #1 on rank 0: the process group was destroyed before it completed"));
}

TEST_CASE("an aborted group destroys its backend after the stuck operation returned") {
  Log log;
  auto pg = std::make_unique<ProcessGroup>(std::make_unique<SlowBackend>(log, 300ms));
  const WorkPtr running = pg->allreduce(zeros({1}));
  REQUIRE(log.wait_for("allreduce 0 begins"));
  pg->abort(std::make_exception_ptr(CommError("peer 1 failed")));
  CHECK(log.has("on_abort (aborted)"));  // the backend sees is_aborted() in on_abort
  CHECK(failed_with(running, "peer 1 failed"));  // at once, while the backend still runs it
  CHECK(failed_with(pg->allreduce(zeros({1})), "peer 1 failed"));
  pg.reset();
  CHECK(used_after_destroy(log).empty());
  CHECK(log.get().back() == "destroyed");
  CHECK(log.has("allreduce 0 ends"));
}

TEST_CASE("inline backends run on the caller's thread; a plugin's destroy frees the backend") {
  Log log;
  static Log* plugin_log = nullptr;
  plugin_log = &log;
  // What the plugin registry does with a descriptor's destroy.
  void (*destroy)(void*) = [](void* b) {
    plugin_log->add("plugin destroy");
    delete static_cast<Backend*>(b);
  };
  {
    ProcessGroup pg(BackendPtr(new SlowBackend(log, 0ms, /*inline_ops=*/true), BackendDeleter(destroy)));
    CHECK(pg.backend_name() == "slow");
    CHECK(dynamic_cast<SlowBackend*>(&pg.backend()) != nullptr);
    CHECK(pg.size() == 2);
    Tensor t = zeros({1});
    const WorkPtr w = pg.allreduce(t);
    CHECK(w->is_completed());  // ran here, before allreduce() returned
    CHECK(t.data<float>()[0] == 1.0f);
  }
  const std::vector<std::string> want{"allreduce 0 begins", "allreduce 0 ends", "on_close", "plugin destroy",
                                      "destroyed"};
  CHECK(log.get() == want);
}

namespace {
/// What the MPI plugin does at MPI_THREAD_SINGLE: each operation on this thread's spare
/// Work (plugin_support::spare_work); a send is listed (weakly) before its end is handed to
/// its waiter (attach_poll: ends once `*ready`); on_abort fails the listed Works; the
/// destructor drops their polls. `between` runs after the listing, before attach_poll.
class PostingBackend final : public QuietBackend {
 public:
  PostingBackend(std::atomic<bool>* ready, std::function<void()> between)
      : QuietBackend(0, 2, 10s, /*inline_ops=*/true), ready_(ready), between_(std::move(between)) {}
  ~PostingBackend() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& weak : posted_)
      if (auto w = weak.lock()) w->detach_poll(std::make_exception_ptr(CommError("posting group destroyed")));
  }
  std::string name() const override { return "posting"; }

 protected:
  WorkPtr inline_work(const InlineOp& op) override {
    const auto& work = plugin_support::spare_work(op, op.take_seq(true), rank());
    current_ = &work;
    return work;
  }
  void on_abort() noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& weak : posted_)
      if (auto w = weak.lock()) w->finish(std::make_exception_ptr(CommError("posting group aborted")));
  }
  void run_send(const Tensor&, int, int, std::uint64_t) override {
    const std::shared_ptr<plugin_support::PluginWork>& work = *current_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      posted_.push_back(work);
    }
    if (between_) between_();
    work->attach_poll([ready = ready_](std::exception_ptr&) { return ready->load(); });
  }

 private:
  std::atomic<bool>* ready_;
  std::function<void()> between_;
  const std::shared_ptr<plugin_support::PluginWork>* current_ = nullptr;
  std::mutex mu_;
  std::vector<std::weak_ptr<plugin_support::PluginWork>> posted_;
};
}  // namespace

TEST_CASE("a send aborted before its poll is attached is not this thread's next spare Work") {
  // The abort fails the listed send before attach_poll: that Work must still count as
  // polled, or the thread reuses it for its next operation (here another group's send)
  // while the aborted group's list still names it, and that group's end fails it.
  std::atomic<bool> ready{false};
  Tensor t = zeros({1});
  ProcessGroup* first_group = nullptr;
  auto first = std::make_unique<ProcessGroup>(BackendPtr(new PostingBackend(&ready, [&] {
    std::thread([&] { first_group->abort(nullptr); }).join();  // another thread aborts, mid-send
  })));
  first_group = first.get();
  Work* aborted = nullptr;
  {
    const WorkPtr w = first->send(t, 1, 0);
    aborted = w.get();
    CHECK(failed_with(w, "posting group aborted"));
  }
  ProcessGroup second(BackendPtr(new PostingBackend(&ready, nullptr)));
  const WorkPtr w2 = second.send(t, 1, 0);
  CHECK(w2.get() != aborted);
  first.reset();  // drops the polls of the Works its backend listed
  CHECK_FALSE(w2->is_completed());  // still the second group's pending send
  ready = true;
  CHECK_NOTHROW(w2->wait(5s));
}

TEST_CASE("a group needs a backend") {
  CHECK_THROWS_WITH_AS(std::make_unique<ProcessGroup>(BackendPtr()), doctest::Contains("the backend is null"),
                       ValueError);
}
