// Stop on request: the signal handlers, the pipelined vote and the collective save.
#include "phalanx/parallel/stop.hpp"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <nlohmann/json.hpp>

#include "phalanx/core/creation.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/parallel/init.hpp"
#include "phalanx/parallel/internal/failure_records.hpp"

namespace phalanx::parallel {

namespace {
// Lock-free, so the handler may write it; read from any thread.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the stop flag is written by a signal handler");

extern "C" void note_stop_signal(int sig) {
  int none = 0;
  // The first signal names the stop. The same one again means "now": its default action
  // (a second Ctrl-C ends a run that is still finishing its step or writing its outputs).
  if (!g_stop_signal.compare_exchange_strong(none, sig) && none == sig) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}
}  // namespace

std::vector<int> default_stop_signals() { return {SIGTERM, SIGINT, SIGUSR1, SIGUSR2}; }

StopOnSignal::StopOnSignal(std::vector<int> signals) : signals_(std::move(signals)), old_(signals_.size()) {
  struct sigaction sa {};
  sa.sa_handler = note_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a step in progress is finished, not interrupted
  for (std::size_t i = 0; i < signals_.size(); ++i) ::sigaction(signals_[i], &sa, &old_[i]);
}

void StopOnSignal::restore(bool reraise) {
  if (restored_) return;
  restored_ = true;
  for (std::size_t i = 0; i < signals_.size(); ++i) ::sigaction(signals_[i], &old_[i], nullptr);
  if (const int sig = g_stop_signal.load(); reraise && sig) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

bool stop_requested() { return g_stop_signal.load() != 0; }
int stop_signal() { return g_stop_signal.load(); }
void request_stop(int sig) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, sig);
}
void clear_stop_request() { g_stop_signal.store(0); }

StopVote::StopVote(ProcessGroupPtr pg) : StopVote(pg, local_device()) {}

StopVote::StopVote(ProcessGroupPtr pg, Device device, std::chrono::milliseconds interval)
    : pg_(std::move(pg)), device_(device), interval_(interval) {
  if (!pg_) throw ValueError("StopVote: the process group is null");
  if (interval.count() < 0) throw ValueError("StopVote: the interval must be >= 0 ms");
  host_ = zeros({2}, DType::Int64);
  flag_ = device_.is_cpu() ? host_ : zeros({2}, DType::Int64, device_);
}

StopVote::~StopVote() {
  if (!pending_) return;
  try {
    pending_->wait();  // the flag must outlive the collective that reads it
  } catch (...) {
  }
}

bool StopVote::read_pending() {
  if (!pending_) return false;
  WorkPtr w = std::move(pending_);
  w->synchronize();  // read on the host: its failure too
  if (!device_.is_cpu()) host_.copy_(flag_);
  const std::int64_t* v = host_.data<std::int64_t>();
  agreed_ = static_cast<int>(v[0]);
  every_ = std::max<std::int64_t>(1, -v[1]);
  return agreed_ != 0;
}

bool StopVote::stop_now() {
  if (pg_->size() == 1) return (agreed_ = stop_signal()) != 0;
  if (--until_vote_ > 0) return false;  // the same count on every rank: no collective here
  const auto now = std::chrono::steady_clock::now();
  // This rank's proposal: the steps that fit in the interval at its step time since the last
  // vote (1 at the first vote, or with interval 0).
  std::int64_t propose = 1;
  if (pending_ && interval_.count() > 0) {
    const double per_step = std::chrono::duration<double>(now - last_vote_).count() / static_cast<double>(every_);
    const double fit = std::chrono::duration<double>(interval_).count() / std::max(per_step, 1e-9);
    propose = static_cast<std::int64_t>(std::clamp(fit, 1.0, 100000.0));
  }
  if (read_pending()) return true;
  std::int64_t* v = host_.data<std::int64_t>();
  v[0] = stop_signal();  // the largest signal number noted wins
  v[1] = -propose;       // the smallest proposal wins
  if (!device_.is_cpu()) flag_.copy_(host_);
  pending_ = pg_->allreduce(flag_, ReduceOp::Max);
  last_vote_ = now;
  until_vote_ = every_;
  return false;
}

bool StopVote::finish() {
  if (pg_->size() == 1) return (agreed_ = stop_signal()) != 0;
  return read_pending();
}

void post_stop_record(std::int64_t step, const std::string& path, int sig, const std::string& error) noexcept {
  try {
    const auto ctx = failure_context();
    if (!ctx || !ctx->root) return;
    nlohmann::json rec{{"step", step}, {"path", path}, {"signal", sig}, {"unix", static_cast<std::int64_t>(std::time(nullptr))}};
    if (!error.empty()) rec["error"] = error;
    const std::string v = rec.dump();
    ctx->root->set("phalanx/r" + std::to_string(ctx->restart) + "/stopped", Bytes(v.begin(), v.end()));
  } catch (...) {
  }
}

std::string save_on_stop(ProcessGroup& pg, CheckpointDir& dir, const CheckpointState& state, int sig) {
  std::string path;
  std::exception_ptr error;
  if (pg.rank() == 0) try {
      path = dir.save(state);
      CheckpointExpect any;
      any.world_size = kAnyWorld;  // the state's own world, which the caller set
      (void)load_checkpoint(path, any);  // reads it back: checksum and manifest
      post_stop_record(state.step, path, sig);
    } catch (const std::exception& e) {
      error = std::current_exception();
      post_stop_record(state.step, "", sig, e.what());  // phalanx-run: a stop, not a failure to restart
    }
  // Every rank learns whether the file is there (rank 0's [saved, step]): no rank reports a
  // save that failed, and none exits before the file is complete.
  Tensor outcome = zeros({2}, DType::Int64);
  if (pg.rank() == 0) {
    outcome.data<std::int64_t>()[0] = error ? 0 : 1;
    outcome.data<std::int64_t>()[1] = state.step;
  }
  Tensor travel = local_device().is_cpu() ? outcome : outcome.to(local_device());
  pg.broadcast(travel, 0)->synchronize();
  if (!travel.device().is_cpu()) outcome.copy_(travel);
  if (error) std::rethrow_exception(error);
  if (outcome.data<std::int64_t>()[0] != 1)
    throw IoError(detail::concat("rank 0 could not save the checkpoint of step ", outcome.data<std::int64_t>()[1],
                                 " when the job was asked to stop (its error says why); nothing was saved"));
  return path;
}

}  // namespace phalanx::parallel
