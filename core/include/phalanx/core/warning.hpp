#pragma once
// One-line warnings on stderr: "phalanx: warning: <line>". For traps that are not errors
// (the run is valid but probably not what was meant); each says what to do.
#include <string>

namespace phalanx {

/// Writes "phalanx: warning: <line>\n" to stderr in one write (lines of several threads
/// do not interleave).
void warn(const std::string& line);

/// warn(line) the first time `key` is seen in this process; later calls with that key do
/// nothing. Thread-safe; after the first call for a key it costs a lock and a lookup.
void warn_once(const std::string& key, const std::string& line);

}  // namespace phalanx
