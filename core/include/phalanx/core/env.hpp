#pragma once
// Strict readers for PHALANX_* environment variables: a value that is set but does not
// parse, or lies outside its range, is a one-line ConfigError that names the variable, the
// value and what it accepts (never a silent fallback). An unset or empty variable gives the
// default. Every PHALANX_* variable the library reads goes through here; docs/environment.md
// lists them all (the docs.environment test keeps the two in step).
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace phalanx::env {

/// The variable's text when it is set and not empty.
std::optional<std::string> text(const char* name);

/// A path (or a list of them): any text without control characters (a newline or a tab in a
/// path is a quoting mistake); nullopt when unset or empty.
std::optional<std::string> path(const char* name);

/// A real number in [lo, hi] (finite, decimal); `unit` names it in the message ("seconds").
double real(const char* name, double fallback, double lo, double hi, const char* unit = "");

/// An integer in [lo, hi] (decimal digits, an optional leading '-'; no spaces, no '+').
/// `what` says what it counts in the message ("a number of microseconds").
std::int64_t integer(const char* name, std::int64_t fallback, std::int64_t lo, std::int64_t hi,
                     const char* what = "an integer");

/// A byte count in [lo, hi]: a whole number of bytes, or a number with a binary suffix K, M,
/// G or T (any case, optionally followed by B or iB: "64M", "1g", "1.5MiB" = 1.5 * 2^20); a
/// fraction must come to a whole number of bytes. `what` names it in the message.
std::uint64_t bytes(const char* name, std::uint64_t fallback, std::uint64_t lo, std::uint64_t hi,
                    const char* what = "a size");

/// One of `words`, exactly as written (case matters); `fallback` when unset or empty.
std::string choice(const char* name, const std::string& fallback, std::initializer_list<const char*> words);

/// 0 or 1 (also false/true, off/on, no/yes).
bool flag(const char* name, bool fallback);

/// "64K", "16G", "1536": `n` in the largest binary unit that divides it (what bytes() reads back).
std::string bytes_text(std::uint64_t n);

}  // namespace phalanx::env
