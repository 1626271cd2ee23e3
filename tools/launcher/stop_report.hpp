#pragma once
// The end of a round that was asked to stop (a signal to the launcher or to the workers):
// what the workers saved, from rank 0's stop record (parallel/stop.hpp), and the
// launcher's exit code.
#include <cstdint>
#include <optional>
#include <string>

#include <phalanx/backends/store.hpp>

#include "launch_options.hpp"
#include "worker_group.hpp"

namespace phalanx::launcher {

struct StopRecord {
  std::int64_t step = 0;
  std::string path;
  int signal = 0;
  std::string error;  ///< non-empty: rank 0 could not save (nothing was saved)
};

/// Rank 0's "phalanx/r<restart>/stopped" record; nullopt when absent or the store is gone.
std::optional<StopRecord> read_stop_record(Store* store, int restart_count);

/// Prints the launcher's line for a round that was asked to stop (`rec`: rank 0's record,
/// when it could be read) and returns its exit code: kExitStoppedAfterSave when every worker
/// of this node saved and exited so; 1 when rank 0 could not save; 0 when the workers had
/// finished anyway; else 128 + the signal (workers killed at --term-timeout are named).
int report_stop(const Outcome& r, const std::optional<StopRecord>& rec, const LaunchOptions& o);

}  // namespace phalanx::launcher
