#include "phalanx/core/env.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "phalanx/core/error.hpp"

namespace phalanx::env {

namespace {

// "%g" without trailing zeros: 0.001, 1e+06.
std::string number_text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

[[noreturn]] void bad(const char* name, const std::string& value, const std::string& accepts) {
  throw ConfigError(std::string(name) + "='" + value + "' is not " + accepts + "; set it to such a value or unset it");
}

}  // namespace

std::optional<std::string> text(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

double real(const char* name, double fallback, double lo, double hi, const char* unit) {
  const auto v = text(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (end == v->c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(x) || x < lo || x > hi)
    bad(name, *v, "a number " + std::string(*unit ? "of " : "") + unit + (*unit ? " " : "") + "in [" +
                      number_text(lo) + ", " + number_text(hi) + "]");
  return x;
}

std::int64_t integer(const char* name, std::int64_t fallback, std::int64_t lo, std::int64_t hi) {
  const auto v = text(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (end == v->c_str() || *end != '\0' || errno == ERANGE || x < lo || x > hi)
    bad(name, *v, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

bool flag(const char* name, bool fallback) {
  const auto v = text(name);
  if (!v) return fallback;
  for (const char* yes : {"1", "true", "on", "yes"})
    if (*v == yes) return true;
  for (const char* no : {"0", "false", "off", "no"})
    if (*v == no) return false;
  bad(name, *v, "0 or 1");
}

}  // namespace phalanx::env
