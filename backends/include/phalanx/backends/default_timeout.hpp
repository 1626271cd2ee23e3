#pragma once
// The one default timeout for stores, rendezvous and collectives.
#include <chrono>

namespace phalanx {

/// 300 s: what every store, rendezvous and collective waits when nothing else is said.
inline constexpr std::chrono::milliseconds kDefaultTimeout{300000};

/// The default operation timeout: PHALANX_TIMEOUT (seconds) when set, else kDefaultTimeout.
/// Throws ConfigError when PHALANX_TIMEOUT is not a positive number.
std::chrono::milliseconds default_timeout();

}  // namespace phalanx
