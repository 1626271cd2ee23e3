#pragma once
// Stopping a job that was asked to stop (preemption): SIGTERM from Slurm, Kubernetes or
// phalanx-run, SIGINT (Ctrl-C), SIGUSR1 (Slurm's --signal choice). A signal is only noted;
// the training loop asks at each step whether any rank noted one, every rank gets the same
// answer at the same step, and the job saves and exits with kExitStoppedAfterSave:
//
//   parallel::StopOnSignal stop_on_signal;          // installs the handlers
//   parallel::StopVote vote(pg);                    // one per loop
//   for (...each step...) {
//     if (vote.stop_now()) {                        // every rank, same step
//       parallel::save_on_stop(*pg, ckdir, state, vote.agreed_signal());
//       return parallel::kExitStoppedAfterSave;
//     }
//     ...forward, backward, step...
//   }
//   vote.finish();                                  // before the group goes away
//
// The vote is pipelined: the allreduce issued at one step is read at the next, so on a
// backend that runs collectives on its own thread (gloo, nccl) it costs no wait; on one that
// runs them inline (shm, mpi) it is one 8-byte allreduce a step (about 0.2 us alone). A stop
// lands at most two steps after the signal (one when it comes before the step's vote).
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

/// The collective answer to "did any rank note a stop request?", pipelined over steps.
class StopVote {
 public:
  /// `device`: where the flag travels (NCCL needs a CUDA tensor); default local_device().
  explicit StopVote(ProcessGroupPtr pg);
  StopVote(ProcessGroupPtr pg, Device device);
  ~StopVote();
  StopVote(const StopVote&) = delete;
  StopVote& operator=(const StopVote&) = delete;
  /// Collective, at the same point of every step on every rank: reads the vote issued at the
  /// previous call (true: some rank noted a stop by then; every rank gets true here), then
  /// issues the next one with this rank's flag.
  bool stop_now();
  /// Collective: waits for the vote in flight, if any; true when it says stop.
  bool finish();
  /// After stop_now() or finish() said stop: the signal that asked (the largest number
  /// noted on any rank; a rank that noted none gets the others'). 0 before.
  int agreed_signal() const { return agreed_; }

 private:
  bool read_pending();
  ProcessGroupPtr pg_;
  Device device_;
  Tensor host_, flag_;  // the flag on the host, and where it travels (the same tensor on the CPU)
  WorkPtr pending_;
  int agreed_ = 0;
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
