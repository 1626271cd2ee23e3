#pragma once
// Checkpoints that can't lie: a training run's whole state in one .npz (numpy reads it),
// written atomically and durably, with a manifest and a checksum over the content. Loading
// verifies both and refuses a damaged or mismatched file with a one-line message showing the
// stored and the current values; it never modifies the file. See docs/checkpoints.md.
//
//   parallel::CheckpointState s;
//   s.model = model->state_dict();  s.optimizer = opt->state_dict();
//   s.scheduler = sched->state_dict();  s.step = step;  s.epoch = epoch;  ...
//   if (rank == 0) dir.save(s);                          // CheckpointDir dir("ckpt", 3)
//   ...
//   auto path = dir.latest();                            // on restart
//   if (path) { auto s = parallel::load_checkpoint(*path, expect); model->load_state_dict(s.model); ... }
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "phalanx/core/generator.hpp"
#include "phalanx/core/tensor_map.hpp"

namespace phalanx::parallel {

/// The file format's version, stored in every manifest; a newer one is refused.
inline constexpr std::int64_t kCheckpointFormat = 1;

/// Everything a run needs to continue exactly where it stopped.
struct CheckpointState {
  TensorMap model;      ///< the model's state_dict
  TensorMap optimizer;  ///< the optimizer's state_dict (its rates included)
  TensorMap scheduler;  ///< an LR scheduler's state_dict (empty: none)
  std::int64_t step = 0;           ///< optimizer steps taken in all
  std::int64_t epoch = 0;          ///< the epoch in progress (0-based)
  std::int64_t step_in_epoch = 0;  ///< steps of that epoch already taken (the sampler position)
  std::map<std::string, Generator::State> generators;  ///< named RNG states
  TensorMap user;                        ///< the caller's own tensors
  std::map<std::string, double> scalars;  ///< the caller's own numbers (stored exactly)
  // The run's shape, checked on load:
  std::int64_t world_size = 1, global_batch = 0, micro_batch = 0;
};

/// The manifest stored with a checkpoint (load_checkpoint returns it).
struct CheckpointManifest {
  std::int64_t format_version = kCheckpointFormat;
  std::int64_t world_size = 0, global_batch = 0, micro_batch = 0, step = 0, epoch = 0;
  std::uint64_t model_fingerprint = 0, optimizer_fingerprint = 0, checksum = 0;
  std::int64_t written_unix = 0;  ///< wall clock, seconds since 1970
  /// "2026-11-30 01:40:12 UTC"
  std::string written_at() const;
};

/// What the current run expects; -1 or nullptr = not checked.
struct CheckpointExpect {
  std::int64_t world_size = -1, global_batch = -1, micro_batch = -1;
  const TensorMap* model = nullptr;      ///< the current model's state_dict (names, shapes, dtypes)
  const TensorMap* optimizer = nullptr;  ///< the current optimizer's state_dict (its type and groups)
};

struct LoadedCheckpoint {
  CheckpointState state;
  CheckpointManifest manifest;
};

/// Hash of a state dict's names, shapes and dtypes (not its values).
std::uint64_t fingerprint(const TensorMap& state);
/// Hash of an optimizer state_dict's type and groups: the names of its group options (which
/// name the optimizer's kind), not their values nor the per-parameter buffers.
std::uint64_t optimizer_fingerprint(const TensorMap& optimizer_state);
/// The 64-bit content checksum: every member's name, dtype, shape and bytes, in order.
std::uint64_t content_checksum(const TensorMap& members);

/// Writes `state` to `path` atomically (temporary file, fsync, rename, fsync of the folder).
/// Returns the manifest written.
CheckpointManifest save_checkpoint(const std::string& path, const CheckpointState& state);

/// Reads and verifies `path`: every member's CRC-32, the content checksum, the format
/// version, then the manifest against `expect`. Throws IoError (damaged) or ConfigError
/// (written by another kind of run), one line naming the file and the stored and current
/// values. Never modifies the file.
LoadedCheckpoint load_checkpoint(const std::string& path, const CheckpointExpect& expect = {});

/// A folder of step-numbered checkpoints, checkpoint-<step>.npz, of which the newest
/// `keep_last` stay: older ones are removed only after a newer one is complete. A file this
/// object did not write is never overwritten (a same-step save gets a ".<n>" suffix), so a
/// damaged checkpoint stays as it was for inspection. Only one process may save into a folder.
class CheckpointDir {
 public:
  /// Creates the folder (and its parents) when missing. keep_last >= 1.
  CheckpointDir(std::string dir, int keep_last = 3);
  /// Saves, then prunes. Returns the path written.
  std::string save(const CheckpointState& state);
  /// The newest checkpoint file by its name (step, then suffix); nullopt when there is none.
  std::optional<std::string> latest() const;
  /// Every checkpoint file, oldest first.
  std::vector<std::string> list() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int keep_last_;
  std::vector<std::string> written_;  // files this object wrote (may be replaced)
};

}  // namespace phalanx::parallel
