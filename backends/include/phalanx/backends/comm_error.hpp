#pragma once
// Errors of the communication layer. Messages name the op, its sequence number in the
// group, this rank, and the peer(s) when known, and say what to do. (ConfigError and the
// plugin errors are core's, phalanx/core/error.hpp, included here.)
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
/// PHALANX_DEBUG=detail found ranks issuing different collectives (op, dtype, shape, root)
/// at the same point; the message names both ranks and both calls.
class DesyncError : public CommError { using CommError::CommError; };
/// A plugin that loaded but reports it cannot run here (e.g. NCCL without a GPU).
class BackendUnavailableError : public Error { using Error::Error; };

}  // namespace phalanx
