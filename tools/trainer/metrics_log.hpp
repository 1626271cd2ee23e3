#pragma once
// phalanx-train's --metrics file: JSON Lines, one record per step and one per epoch, written
// by rank 0. Epochs are numbered from 1, as on the console. On resume the records after the
// checkpoint's position are dropped first, so a resumed run never duplicates a record.
#include <cstdint>
#include <deque>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

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
  bool enabled() const { return out_.is_open(); }
  /// One step: `epoch` 1-based; `lr` the rate this step used.
  void step(std::int64_t step, std::int64_t epoch, double loss, double lr, double seconds);
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
};

}  // namespace phalanx::trainer
