#pragma once
// Failure records in the job's rendezvous store (the contract with phalanx-run, see
// docs/errors.md): `phalanx/r<k>/failure/<rank>` holds a rank's failure as JSON
// {"rank", "message", "secondary", "unix_ns"[, "kind"][, "step"]}; `phalanx/r<k>/failure/first` the first
// primary (not secondary) failure, set once. <k> is PHALANX_RESTART_COUNT.
//
// Clean ends travel the same way: a rank that destroys its default group (or exits 0 with
// it alive) first posts `phalanx/r<k>/finished/<rank>` {"rank", "collectives", "unix_ns"},
// sets `finished/first` once and counts itself in `finished/count`. A survivor whose
// collective then fails for a lost peer finds it and throws PeerFinishedError (uneven
// inputs: docs/ddp.md) instead of a bare "connection closed" or "died".
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "phalanx/backends/process_group.hpp"
#include "phalanx/backends/store.hpp"

namespace phalanx::parallel {

struct FailureRecord {
  int rank = -1;
  std::string message;     ///< one line
  bool secondary = false;  ///< this rank failed because another failed or vanished
  std::int64_t unix_ns = 0;
  /// "desync" for a PHALANX_DEBUG=detail desync, "finished" for a PeerFinishedError (a peer's
  /// copy stays of that type); else empty (not written). Readers ignore fields they do not know.
  std::string kind;
  /// The training step the rank was at (parallel::note_step), -1 when none was noted: with
  /// the message, how phalanx-run tells a failure that recurs after a restart.
  std::int64_t step = -1;
};

/// The one codec of the records, for the ranks and for phalanx-run alike: the JSON text of a
/// record (fields sorted, "kind" only when set; a message of any bytes is kept valid UTF-8) and
/// back. decode_failure: nullopt for text that is not an object with an integer "rank"; a
/// field missing or of another type keeps its default.
std::string encode_failure(const FailureRecord& r);
std::optional<FailureRecord> decode_failure(const std::string& json);

/// `phalanx/r<restart>/failure/<leaf>`: a rank's record, "first", or the "acks" counter.
std::string failure_key(int restart, const std::string& leaf);
/// The record at `key` when one is posted there (never waits); nullopt when none is, or
/// when its text is not a record. A store error propagates.
std::optional<FailureRecord> read_failure(Store& store, const std::string& key);

/// What this process needs to post and watch failure records: the root store, this rank
/// and the attempt. Installed by init_process_group as soon as the store is reachable.
struct FailureContext {
  /// The job's root store, for the records only: a TCP store is a client of its own with
  /// a short budget (kRecordTimeout), so a store whose host is gone costs a fraction of a
  /// second, not a reconnect loop.
  StorePtr root;
  int rank = 0;
  int restart = 0;
  int world = 0;             ///< 0 when unknown
  bool hosts_store = false;  ///< this process serves the store (rank 0 without a launcher)
  /// This rank failed because of another: a peer's record reached it, or one of its
  /// collectives failed for a lost peer, a closed connection or a timeout.
  std::atomic<bool> peer_failed{false};
  std::atomic<bool> store_gone{false};  ///< a record request failed: do not ask again
  std::atomic<bool> posted{false};      ///< this rank posted its own record
  std::atomic<bool> acked{false};       ///< this rank counted itself in failure/acks

  static constexpr std::chrono::milliseconds kRecordTimeout{250};

  std::string key(const std::string& leaf) const { return failure_key(restart, leaf); }
  std::string finished_key(const std::string& leaf) const {
    return "phalanx/r" + std::to_string(restart) + "/finished/" + leaf;
  }
  /// Posts finished/<rank>, finished/first (once) and counts finished/count: this rank
  /// ends cleanly after `collectives` operations. Never throws; nothing when this rank
  /// already posted a failure or the store is gone.
  void post_finished(std::uint64_t collectives) noexcept;
  /// Another rank's finished/first (rank, collectives) when it posted one (no waiting).
  std::optional<std::pair<int, std::uint64_t>> peer_finished() const;
  /// On the store-hosting process, after its own finished record: keeps the store up until
  /// every rank finished or one posted a failure (it read this rank's record first), at
  /// most `limit`, so a survivor still in a collective learns why.
  void linger_for_finish(std::chrono::milliseconds limit) noexcept;
  /// failure/first when another rank posted it (no waiting); nullopt otherwise.
  std::optional<FailureRecord> peer_first_failure() const;
  /// Posts failure/<rank> and, for a primary failure, failure/first. Never throws (a
  /// store that cannot be reached leaves the others to notice the exit instead).
  void post(std::string message, bool secondary, std::string kind = {}) noexcept;
  /// Counts this rank once in failure/acks: it has read another rank's failure/first.
  void acknowledge() noexcept;
  /// On the store-hosting process, after its own record: keeps the store up until every
  /// other rank has read failure/first (failure/acks), at most `limit`.
  void linger_for_readers(std::chrono::milliseconds limit) noexcept;
};

/// The error a peer's failure becomes on this rank: PeerFailedError (DesyncError for a
/// desync) "rank R failed: <message> (<where this rank noticed it>)".
std::exception_ptr peer_failed_error(const FailureRecord& r, const std::string& noticed);

/// The process's context (null before init_process_group reached a store).
std::shared_ptr<FailureContext> failure_context();
void set_failure_context(std::shared_ptr<FailureContext> ctx);

/// The hook ProcessGroup calls on the worker thread when an operation fails here: posts
/// this rank's record (secondary for communication errors) and, for a lost peer, returns
/// the peer's own failure when it posted one within `grace`.
ProcessGroup::FailureHook make_failure_hook(std::shared_ptr<FailureContext> ctx,
                                            std::chrono::milliseconds grace = std::chrono::milliseconds(500));

/// True when `error` means this rank failed because of another rank (CommError other than
/// a desync or a PeerFinishedError, or a PeerFailedError). A PeerFinishedError is a
/// primary failure: it names the cause (uneven inputs); the finished rank did not fail.
bool is_secondary_failure(const std::exception_ptr& error);
std::string one_line(std::string s);
/// "desync" for a DesyncError, "finished" for a PeerFinishedError, else empty: FailureRecord::kind.
std::string failure_kind(const std::exception_ptr& error);

}  // namespace phalanx::parallel
