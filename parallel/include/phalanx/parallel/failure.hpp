#pragma once
// Errors travel: a rank that fails tells the others through the rendezvous store, so
// their pending or next collective fails within seconds with "rank R failed: <message>"
// instead of waiting for the timeout.
#include <string>

namespace phalanx::parallel {

/// Posts this rank's failure to the default group's store (no-op without a group or a
/// store; never throws). Call it from the catch block that ends a worker.
void report_failure(const std::string& message) noexcept;

}  // namespace phalanx::parallel
