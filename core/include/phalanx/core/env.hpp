#pragma once
// Strict readers for PHALANX_* environment variables: a value that is set but does not
// parse, or lies outside its range, is a one-line ConfigError that names the variable and
// what it accepts (never a silent fallback). An unset or empty variable gives the default.
#include <cstdint>
#include <optional>
#include <string>

namespace phalanx::env {

/// The variable's text when it is set and not empty.
std::optional<std::string> text(const char* name);

/// A real number in [lo, hi] (finite); `unit` names it in the message ("seconds").
double real(const char* name, double fallback, double lo, double hi, const char* unit = "");

/// An integer in [lo, hi].
std::int64_t integer(const char* name, std::int64_t fallback, std::int64_t lo, std::int64_t hi);

/// 0 or 1 (also false/true, off/on, no/yes).
bool flag(const char* name, bool fallback);

}  // namespace phalanx::env
