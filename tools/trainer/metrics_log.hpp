#pragma once
// phalanx-train's metrics, written by rank 0: the --metrics file (JSON Lines, one record per
// step and one per epoch) and the --tensorboard folder (event files, docs/tensorboard.md).
// Epochs are numbered from 1, as on the console. On resume the records after the
// checkpoint's position are dropped first (TensorBoard: hidden by purge_step), so a resumed
// run never shows a step twice.
#include <cstdint>
#include <deque>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <phalanx/parallel/tensorboard_writer.hpp>

namespace phalanx::trainer {

class MetricsLog {
 public:
  MetricsLog() = default;
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  /// A run stopped by an error: the step records still held back are written (each epoch's
  /// record that never came is missing from the file, its steps are not), then the file closed.
  ~MetricsLog();
  /// Opens `path` for a fresh run (truncated). Throws IoError naming the file.
  void open_fresh(const std::string& path);
  /// Opens `path` to continue a run resumed at global step `step`, epoch `epoch` (0-based,
  /// the epoch in progress): keeps the step records up to `step` and the epoch records of
  /// the epochs before `epoch` (1-based numbers <= epoch), drops the rest (and any torn last
  /// line), then appends. A missing file is started fresh.
  void open_resumed(const std::string& path, std::int64_t step, std::int64_t epoch);
  /// Opens an event file in `dir` for steps from `first_step` on (earlier runs' events at
  /// and after it are hidden: a resumed run); `samples_per_step` is the global batch.
  /// Scalars: train/loss, train/lr, train/step_seconds, train/samples_per_second,
  /// train/grad_norm per step; epoch/train_loss, epoch/test_loss, epoch/test_accuracy per
  /// epoch, at its last step (epoch x `steps_per_epoch`). Throws IoError naming the folder.
  void open_tensorboard(const std::string& dir, std::int64_t first_step, std::int64_t samples_per_step,
                        std::int64_t steps_per_epoch);
  bool enabled() const { return out_.is_open() || tb_.has_value(); }
  /// Whether step() wants the gradients' norm (TensorBoard's train/grad_norm).
  bool wants_grad_norm() const { return tb_.has_value(); }
  /// One step: `epoch` 1-based; `lr` the rate this step used; `seconds` since the run began;
  /// `grad_norm` the 2-norm of all gradients (read when wants_grad_norm()).
  void step(std::int64_t step, std::int64_t epoch, double loss, double lr, double seconds, double grad_norm = 0);
  void record(const nlohmann::json& rec);
  /// The record of the epoch that just ended is written later (the trainer reports short
  /// epochs in groups): the step records from now on wait behind it, so the file keeps the
  /// order steps, epoch, steps, epoch.
  void hold();
  /// Writes the oldest epoch record held back, then the step records that waited behind it
  /// (with none held back, just the record).
  void record_epoch(const nlohmann::json& rec);
  /// Pushes the buffered records to the file (before a checkpoint, so the file is never
  /// behind a checkpoint that a restart resumes from).
  void flush();
  /// Writes the step records still held back, flushes and closes; throws IoError naming the file when any write failed (a full disk).
  void close();

 private:
  std::string path_;
  void open_through(int fd);
  std::ofstream out_;
  std::deque<std::string> held_;  // step records waiting behind each epoch record held back
  std::string line_;              // one step record, formatted (reused: no allocation per step)
  void tb_scalar(const char* tag, double value, std::int64_t step);
  std::optional<parallel::TensorBoardWriter> tb_;  // reset after a failed write
  std::string tb_error_;                           // that write's error, for close()
  std::int64_t samples_per_step_ = 0;
  std::int64_t steps_per_epoch_ = 0;
  double last_seconds_ = -1;  // the previous step's `seconds`, for its duration
};

}  // namespace phalanx::trainer
