#pragma once
// DDP's context added to a communication error without changing its kind, for both
// reducers: callers catch TimeoutError apart from other CommErrors, and a PeerFinishedError
// must stay one (uneven inputs). A peer's failure (PeerFailedError) keeps its own message,
// which already says everything.
#include <exception>
#include <string>

namespace phalanx::parallel {

[[noreturn]] void rethrow_with_context(const std::exception_ptr& error, const std::string& context);

}  // namespace phalanx::parallel
