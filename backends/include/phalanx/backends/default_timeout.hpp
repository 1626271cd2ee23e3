#pragma once
// The one default timeout for stores, rendezvous and collectives.
#include <chrono>

namespace phalanx {

/// 300 s: what every store, rendezvous and collective waits when nothing else is said.
inline constexpr std::chrono::milliseconds kDefaultTimeout{300000};

/// The range of every operation timeout in seconds, whichever way it is given
/// (PHALANX_TIMEOUT, phalanx-run --timeout, InitOptions): 1 ms to about 11.6 days.
inline constexpr double kMinTimeoutSeconds = 0.001;
inline constexpr double kMaxTimeoutSeconds = 1e6;

/// The default operation timeout: PHALANX_TIMEOUT (seconds) when set, else kDefaultTimeout.
/// Throws ConfigError when PHALANX_TIMEOUT is not a number in [kMinTimeoutSeconds, kMaxTimeoutSeconds].
std::chrono::milliseconds default_timeout();

}  // namespace phalanx
