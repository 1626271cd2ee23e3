// Stop on request: the signal handlers, the pipelined vote and the collective save.
#include "phalanx/parallel/stop.hpp"

#include <ctime>
#include <nlohmann/json.hpp>

#include "phalanx/core/creation.hpp"
#include "phalanx/core/error.hpp"
#include "phalanx/parallel/init.hpp"
#include "failure_records.hpp"

namespace phalanx::parallel {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void note_stop_signal(int sig) {
  if (g_stop_signal == 0) g_stop_signal = sig;  // the first one names the stop
}
}  // namespace

std::vector<int> default_stop_signals() { return {SIGTERM, SIGINT, SIGUSR1}; }

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
  if (const int sig = g_stop_signal; reraise && sig) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

bool stop_requested() { return g_stop_signal != 0; }
int stop_signal() { return g_stop_signal; }
void request_stop(int sig) { note_stop_signal(sig); }
void clear_stop_request() { g_stop_signal = 0; }

StopVote::StopVote(ProcessGroupPtr pg) : StopVote(pg, local_device()) {}

StopVote::StopVote(ProcessGroupPtr pg, Device device) : pg_(std::move(pg)), device_(device) {
  if (!pg_) throw ValueError("StopVote: the process group is null");
  host_ = zeros({1}, DType::Int64);
  flag_ = device_.is_cpu() ? host_ : zeros({1}, DType::Int64, device_);
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
  w->wait();
  if (!device_.is_cpu()) host_.copy_(flag_);
  agreed_ = static_cast<int>(host_.data<std::int64_t>()[0]);
  return agreed_ != 0;
}

bool StopVote::stop_now() {
  if (pg_->size() == 1) return (agreed_ = stop_signal()) != 0;
  if (read_pending()) return true;
  host_.data<std::int64_t>()[0] = stop_signal();  // the largest signal number noted wins
  if (!device_.is_cpu()) flag_.copy_(host_);
  pending_ = pg_->allreduce(flag_, ReduceOp::Max);
  return false;
}

bool StopVote::finish() {
  if (pg_->size() == 1) return (agreed_ = stop_signal()) != 0;
  return read_pending();
}

void post_stop_record(std::int64_t step, const std::string& path, int sig) noexcept {
  try {
    const auto ctx = failure_context();
    if (!ctx || !ctx->root) return;
    const std::string v =
        nlohmann::json{{"step", step}, {"path", path}, {"signal", sig}, {"unix", static_cast<std::int64_t>(std::time(nullptr))}}
            .dump();
    ctx->root->set("phalanx/r" + std::to_string(ctx->restart) + "/stopped", Bytes(v.begin(), v.end()));
  } catch (...) {
  }
}

std::string save_on_stop(ProcessGroup& pg, CheckpointDir& dir, const CheckpointState& state, int sig) {
  std::string path;
  std::exception_ptr error;
  if (pg.rank() == 0) try {
      path = dir.save(state);
      (void)load_checkpoint(path, CheckpointExpect{});  // reads it back: checksum and manifest
      post_stop_record(state.step, path, sig);
    } catch (...) {
      error = std::current_exception();
    }
  // The others wait for rank 0's file; a rank 0 that failed still comes here, so the others
  // do not wait for the timeout (they exit with the stop status, rank 0 with its error).
  pg.barrier()->wait();
  if (error) std::rethrow_exception(error);
  return path;
}

}  // namespace phalanx::parallel
