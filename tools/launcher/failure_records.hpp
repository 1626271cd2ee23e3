#pragma once
// The failure records that ranks post in the job's store (phalanx/r<k>/failure/<rank> and
// failure/first; the contract is in docs/launcher.md), read and written by the launcher with
// the ranks' own codec (parallel/rendezvous: phalanx/parallel/internal/failure_records.hpp).
#include <string>

#include <phalanx/backends/store.hpp>

#include "blame.hpp"

namespace phalanx::launcher {

/// Fills f's record fields from the store, when its rank posted one (never waits, never
/// throws: returns false, leaving f as it is, when the store cannot be reached).
bool read_failure_record(Store& store, int restart_count, WorkerFailure& f);

/// Posts failure/first for a worker that a signal killed (the other ranks watch it to fail
/// fast); returns true when this post is the first.
bool post_first_failure(Store& store, int restart_count, const WorkerFailure& f);

/// A WorkerFailure as JSON text and back (the launchers' reports to each other).
std::string to_json(const WorkerFailure& f);
bool from_json(const std::string& text, WorkerFailure& f);

std::int64_t unix_now_ns();

}  // namespace phalanx::launcher
