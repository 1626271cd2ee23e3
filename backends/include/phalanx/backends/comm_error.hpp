#pragma once
// Errors of the communication layer. Messages name the op, its sequence number in the
// group, this rank, and the peer(s) when known, and say what to do.
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
/// Bad launch configuration: RANK/WORLD_SIZE values, a missing MASTER_ADDR, a port in use,
/// mismatched world sizes or duplicate ranks across workers.
class ConfigError : public Error { using Error::Error; };
/// A backend plugin that could not be found on any search path.
class PluginNotFoundError : public Error { using Error::Error; };
/// A plugin built against another plugin ABI version.
class PluginAbiError : public Error { using Error::Error; };
/// A plugin that loaded but reports it cannot run here (e.g. NCCL without a GPU).
class BackendUnavailableError : public Error { using Error::Error; };

}  // namespace phalanx
