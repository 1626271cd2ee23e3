#pragma once
// Errors travel: a rank that fails tells the others through the rendezvous store, so
// their pending or next collective fails within seconds with "rank R failed: <message>"
// instead of waiting for the timeout.
#include <cstdint>
#include <exception>
#include <string>

namespace phalanx::parallel {

/// Posts this rank's failure to the default group's store (no-op without a group or a
/// store; never throws). Call it from the catch block that ends a worker. The record is
/// secondary (this rank failed because of another) once a collective of this rank failed
/// for a lost peer, a closed connection, a timeout or a peer's posted failure; otherwise
/// it is this rank's own (primary) failure. On rank 0 hosting the store itself (no
/// launcher), waits until the other ranks have read it, at most 1.5 s.
void report_failure(const std::string& message) noexcept;
/// The same for an exception (call it with std::current_exception() in the catch block):
/// also secondary when `error` itself is a communication error other than a desync.
void report_failure(std::exception_ptr error) noexcept;

/// The training step this rank is working on (call it at the start of each step; a relaxed
/// atomic store, nothing more). A failure record carries it, and phalanx-run ends a job
/// whose failure recurs at the same step with the same message after a restart, instead of
/// spending the remaining --max-restarts on it (docs/launcher.md, "Restarts").
void note_step(std::int64_t step) noexcept;
/// The step last noted on this process, -1 before any.
std::int64_t noted_step() noexcept;

}  // namespace phalanx::parallel
