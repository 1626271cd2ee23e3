#pragma once
// Errors of the communication layer. Messages name the op, its sequence number in the
// group, this rank, and the peer(s) when known, and say what to do. (ConfigError and the
// plugin errors are core's, phalanx/core/error.hpp, included here.)
#include <cstdint>
#include <string>

#include "phalanx/core/error.hpp"

namespace phalanx {

/// A collective or point-to-point operation failed (dead peer, broken connection, a group
/// already broken by an earlier failure).
class CommError : public Error { using Error::Error; };
/// An operation or a rendezvous did not finish within its timeout.
class TimeoutError : public CommError { using CommError::CommError; };
/// Another rank failed and posted its error ("rank R failed: <its message>"); this rank's
/// pending and later operations fail with it (docs/errors.md).
class PeerFailedError : public CommError { using CommError::CommError; };
/// A peer ended cleanly (destroyed its process group, or exited with status 0) while this
/// rank waited for it in a collective, or before it took part: the ranks ran different
/// numbers of steps. The message names the peer, how many collectives it completed, and
/// the fixes (equal batch counts, or parallel::Join for uneven inputs).
class PeerFinishedError : public CommError { using CommError::CommError; };
/// PHALANX_DEBUG=detail found ranks issuing different collectives (op, dtype, shape, root)
/// at the same point; the message names both ranks and both calls.
class DesyncError : public CommError { using CommError::CommError; };
/// A plugin that loaded but reports it cannot run here (e.g. NCCL without a GPU).
class BackendUnavailableError : public Error { using Error::Error; };

namespace detail {
/// The one line of a PeerFinishedError: `ctx` ("allreduce #12 on rank 1 of 2 (gloo)") then
/// "rank <peer> finished (...) after <collectives> collectives while this rank is in
/// <op>; ...". Shared by the backends (shm) and the failure records (every backend).
inline std::string peer_finished_message(const std::string& ctx, int peer, std::uint64_t collectives) {
  const auto cut = ctx.find(" on rank ");
  const std::string op = cut == std::string::npos ? ctx : ctx.substr(0, cut);
  return concat(ctx, ": rank ", peer, " finished (destroyed its process group or exited 0) after ", collectives,
                " collectives while this rank is in ", op,
                "; ranks ran different numbers of steps: give every rank the same number of batches "
                "(DistributedSampler pads to equal counts) or wrap the loop in parallel::Join for uneven inputs");
}
}  // namespace detail

}  // namespace phalanx
