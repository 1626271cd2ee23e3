#pragma once
// Scalars for TensorBoard, written as torch.utils.tensorboard's SummaryWriter writes them
// (docs/tensorboard.md): one event file per writer in `log_dir`, named
// events.out.tfevents.<time>.<host>.<pid>.<n><suffix>, which `tensorboard --logdir` shows as
// one run per folder.
//
//   parallel::TensorBoardWriter tb("runs/mlp");              // on rank 0 only, as in PyTorch
//   tb.add_scalar("train/loss", loss.item(), step);
//
// Each event goes to the file as it is added (one write(2); no buffer that a crash can lose,
// so nothing waits for a flush interval), whole records only: a process killed in the middle
// leaves at most one torn record at the end, which TensorBoard's reader skips. flush()
// makes the file durable (fdatasync); close() and the destructor end it. A resumed run
// passes purge_step, its first step: TensorBoard then hides what the earlier run logged
// from that step on, so the steps lost to the crash are not shown twice.
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "phalanx/core/arg.hpp"

namespace phalanx::parallel {

struct TensorBoardWriterOptions {
  /// Appended to the event file's name (SummaryWriter's filename_suffix).
  PHALANX_ARG(std::string, filename_suffix) = "";
  /// The first step of a run resumed from a checkpoint (SummaryWriter's purge_step): events
  /// that earlier files in log_dir hold at this step and after are hidden. -1: none.
  PHALANX_ARG(std::int64_t, purge_step) = -1;
};

class TensorBoardWriter {
 public:
  /// Creates `log_dir` (and its parents) and a new event file in it; an empty `log_dir` is
  /// PyTorch's default, runs/<Mon>DD_HH-MM-SS_<host>. Throws IoError naming the folder when
  /// it cannot be created or written.
  explicit TensorBoardWriter(std::string log_dir = "", TensorBoardWriterOptions options = {});
  /// Closes the file; never throws (a failed write was reported by the call that made it).
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// One value of the curve `tag` (non-empty; "/" groups curves in TensorBoard's sections)
  /// at `global_step`, stored as float32 as SummaryWriter stores it. `walltime` in seconds
  /// since the epoch, < 0 for now. Thread-safe. Throws IoError when the write fails (a full
  /// disk; the part of the record that was written is cut off again, so the file stays
  /// readable and a later add_scalar may succeed), ValueError for an empty tag, IoError
  /// after close().
  void add_scalar(std::string_view tag, double value, std::int64_t global_step, double walltime = -1);
  /// Makes the events written so far durable (fdatasync). Throws IoError when that fails.
  void flush();
  /// Flushes and closes; later calls to add_scalar throw. Idempotent.
  void close();

  const std::string& log_dir() const { return log_dir_; }
  /// The event file's path.
  const std::string& file() const { return file_; }

 private:
  void write_record(const std::string& event);

  std::mutex mu_;
  std::string log_dir_;
  std::string file_;
  int fd_ = -1;
  std::string event_;   // the event being encoded (reused)
  std::string record_;  // its framed record (reused)
  std::int64_t good_size_ = 0;  // the file's size after its last whole record
};

}  // namespace phalanx::parallel
