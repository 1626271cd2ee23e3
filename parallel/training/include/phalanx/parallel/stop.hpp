#pragma once
// Stopping a job that was asked to stop (preemption): SIGTERM from Slurm, Kubernetes or
// phalanx-run, SIGINT (Ctrl-C), SIGUSR1 (Slurm's --signal choice). A signal is only noted;
// the training loop asks at each step whether any rank noted one, every rank gets the same
// answer at the same step, and the job saves and exits with kExitStoppedAfterSave:
//
//   parallel::StopOnSignal stop_on_signal;          // installs the handlers
//   parallel::StopVote vote(pg);                    // one per loop (votes about every 50 ms)
//   for (...each step...) {
//     if (vote.stop_now()) {                        // every rank, same step
//       parallel::save_on_stop(*pg, ckdir, state, vote.agreed_signal());
//       return parallel::kExitStoppedAfterSave;
//     }
//     ...forward, backward, step...
//   }
//   vote.finish();                                  // before the group goes away
//
// The vote is pipelined (the allreduce issued at one vote is read at the next, so on a
// backend with a worker thread it costs no wait) and taken about every 50 ms of steps, not at
// every step (a 16-byte allreduce at each step of a 0.1 ms model would cost more than 1 %;
// inline backends such as shm and mpi wait for it). A stop lands within about two intervals.
#include <chrono>
#include <csignal>
#include <cstdint>
#include <string>
#include <vector>

#include "phalanx/backends/process_group.hpp"
#include "phalanx/parallel/checkpoint.hpp"

namespace phalanx::parallel {

/// The exit status of a worker that stopped on request after saving (sysexits' EX_TEMPFAIL:
/// "try again later"); phalanx-run reports it and exits with it too.
inline constexpr int kExitStoppedAfterSave = 75;

/// The signals noted by default: SIGTERM, SIGINT, SIGUSR1, SIGUSR2. The same signal a
/// second time takes its default action at once (a second Ctrl-C ends the process).
std::vector<int> default_stop_signals();

/// Installs handlers that note a stop request, for this object's lifetime; the previous
/// handlers come back on destruction (or restore()). Not nestable with itself.
class StopOnSignal {
 public:
  explicit StopOnSignal(std::vector<int> signals = default_stop_signals());
  ~StopOnSignal() { restore(); }
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;
  /// Puts the previous handlers back. With `reraise`, a signal noted meanwhile is then
  /// raised again with its default action (the process dies by it, as without handlers).
  void restore(bool reraise = false);

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> old_;
  bool restored_ = false;
};

/// This process noted a stop signal (async-signal-safe flag; no collective).
bool stop_requested();
/// The signal noted (0: none).
int stop_signal();
/// Notes a stop request as a signal would (for tests, or a loop's own reasons).
void request_stop(int sig = SIGTERM);
/// Forgets a noted request (a new job in the same process).
void clear_stop_request();

/// The collective answer to "did any rank note a stop request?", pipelined over steps and
/// taken about every `interval` of wall time, not at every step: each vote also carries every
/// rank's proposal of how many steps fit in `interval` (from its own step time), the smallest
/// wins, and every rank counts the same number of steps to the next vote. So a fast step
/// pays for a vote once in many steps, a slow one at every step, and a stop lands within
/// about two intervals (or two steps, when a step is longer).
class StopVote {
 public:
  /// About 50 ms between votes: a stop is taken within ~0.1 s, and the vote costs a small
  /// fraction of any step.
  static constexpr std::chrono::milliseconds kDefaultInterval{50};
  /// `device`: where the flag travels (NCCL needs a CUDA tensor); default local_device().
  /// `interval` 0: a vote at every step.
  explicit StopVote(ProcessGroupPtr pg);
  StopVote(ProcessGroupPtr pg, Device device, std::chrono::milliseconds interval = kDefaultInterval);
  ~StopVote();
  StopVote(const StopVote&) = delete;
  StopVote& operator=(const StopVote&) = delete;
  /// Collective, at the same point of every step on every rank (a collective only at the
  /// steps of a vote): reads the vote issued at the previous vote's step (true: some rank
  /// noted a stop by then; every rank gets true at the same step), then issues the next one
  /// with this rank's flag and step-count proposal.
  bool stop_now();
  /// Collective: waits for the vote in flight, if any; true when it says stop.
  bool finish();
  /// After stop_now() or finish() said stop: the signal that asked (the largest number
  /// noted on any rank; a rank that noted none gets the others'). 0 before.
  int agreed_signal() const { return agreed_; }
  /// Steps from one vote to the next, as last agreed (1 at first).
  std::int64_t steps_between_votes() const { return every_; }

 private:
  bool read_pending();
  ProcessGroupPtr pg_;
  Device device_;
  std::chrono::nanoseconds interval_;
  // [signal, -proposed steps] on the host, and where it travels (the same tensor on the CPU):
  // one MAX gives the largest signal and the smallest proposal.
  Tensor host_, flag_;
  WorkPtr pending_;
  int agreed_ = 0;
  std::int64_t every_ = 1, until_vote_ = 0;  // agreed steps between votes; steps left to the next
  std::chrono::steady_clock::time_point last_vote_{};
};

/// Collective save after an agreed stop: rank 0 writes `state` into `dir`, reads it back
/// and verifies it, and posts the step and path for phalanx-run; then rank 0 tells every
/// rank whether it saved, so no rank exits before the file is complete. Returns the path on
/// rank 0 (empty elsewhere); when rank 0 could not save, it throws its error and every other
/// rank an IoError saying nothing was saved (the record then carries the error, so
/// phalanx-run does not take the stop for a failure to restart). `state` is read on
/// rank 0 only; `sig` is the signal named in the record (StopVote::agreed_signal()).
std::string save_on_stop(ProcessGroup& pg, CheckpointDir& dir, const CheckpointState& state, int sig);

/// The record phalanx-run reads: rank 0 posts "phalanx/r<k>/stopped" = {"step", "path",
/// "signal"[, "error"]} to the job's store (nothing without one). Never throws.
void post_stop_record(std::int64_t step, const std::string& path, int sig, const std::string& error = {}) noexcept;

}  // namespace phalanx::parallel
