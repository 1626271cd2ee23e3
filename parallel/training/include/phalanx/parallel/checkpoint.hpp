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
#include <utility>
#include <vector>

#include "phalanx/core/generator.hpp"
#include "phalanx/core/tensor_map.hpp"

namespace phalanx::parallel {

/// The file format's version, stored in every manifest; a newer one is refused.
inline constexpr std::int64_t kCheckpointFormat = 1;

/// CheckpointExpect::world_size that skips the world-size check (a tool inspecting a file
/// written by a job of any size).
inline constexpr std::int64_t kAnyWorld = -1;

/// Everything a run needs to continue exactly where it stopped.
struct CheckpointState {
  TensorMap model;      ///< the model's state_dict
  TensorMap optimizer;  ///< the optimizer's state_dict (its rates included)
  TensorMap scheduler;  ///< an LR scheduler's state_dict (empty: none)
  /// An optim::GradScaler's state_dict (empty: none, as in every file written before the
  /// scaler existed). Like the scheduler's, not part of compare_trained_state's comparison.
  TensorMap scaler;
  /// Optimizer steps taken in all. Must be set (-1: unset, refused by every save): a folder
  /// names its files by it, and a second save at one step must hold the same trained state.
  std::int64_t step = -1;
  std::int64_t epoch = 0;          ///< the epoch in progress (0-based)
  std::int64_t step_in_epoch = 0;  ///< steps of that epoch already taken (the sampler position)
  std::map<std::string, Generator::State> generators;  ///< named RNG states
  TensorMap user;                        ///< the caller's own tensors
  std::map<std::string, double> scalars;  ///< the caller's own numbers (stored exactly)
  /// The settings a resume must keep ("lr" -> "0.1", ...), stored as config.<name> and
  /// compared with CheckpointExpect::config on load.
  std::map<std::string, std::string> config;
  // The run's shape, checked on load. world_size 0: the default world's size at save time
  // (phalanx/core/world.hpp, set by parallel::init_process_group).
  std::int64_t world_size = 0, global_batch = 0, micro_batch = 0;
  /// Written in exact mode (micro_batch is then exact mode's micro-batch, and the state does
  /// not depend on the world size: it resumes on any world size dividing global/micro).
  bool exact = false;
};

/// The manifest stored with a checkpoint (load_checkpoint returns it).
struct CheckpointManifest {
  std::int64_t format_version = kCheckpointFormat;
  std::int64_t world_size = 0, global_batch = 0, micro_batch = 0, step = 0, epoch = 0;
  bool exact = false;  ///< manifest.exact (absent in files written before exact mode: false)
  std::uint64_t model_fingerprint = 0, optimizer_fingerprint = 0, checksum = 0;
  std::int64_t written_unix = 0;  ///< wall clock, seconds since 1970
  /// "2026-11-30 01:40:12 UTC"
  std::string written_at() const;
};

/// What the current run expects; -1 or nullptr = not checked.
struct CheckpointExpect {
  /// 0: the default world's size when loading (phalanx/core/world.hpp); kAnyWorld: not
  /// checked; > 0: that size.
  std::int64_t world_size = 0;
  std::int64_t global_batch = -1, micro_batch = -1;
  /// 1: this run is in exact mode, 0: it is not, -1: not checked. The file's mode must be this
  /// run's. Only exact mode on both sides lets the world size differ: it must then divide the
  /// file's micro-batches per step (global_batch / micro_batch).
  int exact = -1;
  const TensorMap* model = nullptr;      ///< the current model's state_dict (names, shapes, dtypes)
  const TensorMap* optimizer = nullptr;  ///< the current optimizer's state_dict (its type and groups)
  /// The current run's settings: each one the file records must be equal (a file that
  /// records none, written before settings were stored, is not checked).
  const std::map<std::string, std::string>* config = nullptr;
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
/// Returns the manifest written. Throws ConfigError when state.step is unset (< 0).
CheckpointManifest save_checkpoint(const std::string& path, const CheckpointState& state);

/// Reads and verifies `path`: every member's CRC-32, the content checksum, the format
/// version, then the manifest against `expect`. Throws IoError (damaged) or ConfigError
/// (written by another kind of run), one line naming the file and the stored and current
/// values. Never modifies the file.
LoadedCheckpoint load_checkpoint(const std::string& path, const CheckpointExpect& expect = {});

/// How a checkpoint file compares with a state (CheckpointDir::save's same-step check).
enum class StepFileMatch {
  same,       ///< it verifies and holds the same model, optimizer and scheduler tensors
  different,  ///< it verifies and holds other trained tensors
  damaged,    ///< it does not load (load_checkpoint would throw IoError)
};
/// Reads and verifies `path` (as load_checkpoint, any world size), then compares its model,
/// optimizer and scheduler members with `state`'s by the manifest's content checksum: the
/// file's checksum recomputed with `state`'s tensors in place of its own must be the stored
/// one. Position, RNG states, scalars, settings and user tensors are not compared. Costs one
/// read and verification of the file and one hash of `state`'s tensors.
StepFileMatch compare_trained_state(const std::string& path, const CheckpointState& state);

/// A file load_newest() passed over, and why.
struct SkippedCheckpoint {
  std::string path, reason;
};

/// A folder of step-numbered checkpoints, checkpoint-<step>.npz, of which the newest
/// `keep_last` stay: older ones are removed only after a newer one is complete. A file this
/// object did not write is never overwritten (a same-step save gets a ".<n>" suffix), so a
/// damaged checkpoint stays as it was for inspection; damaged (skipped) files and the file
/// resumed from are never counted nor removed by the pruning. One step holds one trained
/// state: save() refuses other weights under a step that already has a valid checkpoint.
/// Only one process may save into a folder: lock() makes sure of it.
class CheckpointDir {
 public:
  /// Creates the folder (and its parents) when missing. keep_last >= 1.
  explicit CheckpointDir(std::string dir, int keep_last = 3);
  ~CheckpointDir();
  CheckpointDir(const CheckpointDir&) = delete;
  CheckpointDir& operator=(const CheckpointDir&) = delete;
  /// Takes an exclusive lock on <dir>/.lock (flock) for this object's lifetime, for the one
  /// process that saves; throws ConfigError naming the holder's pid when another run has it.
  /// Then removes temporary files a killed writer left (checkpoint-*.tmp.*).
  void lock();
  /// Saves, then prunes. Returns the path written. Throws ConfigError when state.step is
  /// unset, or when a valid checkpoint of that step (any suffix) holds a different trained
  /// state (compare_trained_state): two saves at one step with other weights mean the step
  /// is not advancing. The same trained state again is saved as before: it replaces this
  /// object's own file of the step (the newer position and RNG states win), else takes the
  /// next suffix. Damaged files of the step neither block nor are replaced.
  std::string save(const CheckpointState& state);
  /// The newest checkpoint file by its name (step, then suffix); nullopt when there is none.
  std::optional<std::string> latest() const;
  /// Every checkpoint file, oldest first (*.superseded files are not checkpoints).
  std::vector<std::string> list() const;
  /// From the newest file down, the first that loads and verifies (load_checkpoint with
  /// `expect`); damaged files (IoError) are passed over and reported in `skipped` (newest
  /// first) and never pruned; a ConfigError (another kind of run) is thrown. nullopt: none.
  std::optional<std::pair<std::string, LoadedCheckpoint>> load_newest(const CheckpointExpect& expect,
                                                                       std::vector<SkippedCheckpoint>* skipped);
  /// Renames every checkpoint of a step after `step` to <name>.superseded (.superseded.<k> when
  /// taken): kept, but no longer a checkpoint; a run resumed from an older file abandons them.
  /// Returns the new names.
  std::vector<std::string> supersede_after(std::int64_t step);
  /// A file the pruning must never remove (the one resumed from).
  void protect(const std::string& path) { protected_.push_back(path); }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int keep_last_;
  int lock_fd_ = -1;
  std::vector<std::string> written_;    // files this object wrote (may be replaced)
  std::vector<std::string> protected_;  // never pruned: the file resumed from
  std::vector<std::string> damaged_;    // neither counted nor pruned: files load_newest passed over
};

}  // namespace phalanx::parallel
