#include "phalanx/core/env.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "phalanx/core/error.hpp"

namespace phalanx::env {

namespace {

// "%g" without trailing zeros: 0.001, 1e+06.
std::string number_text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// Control characters escaped (\n, \x01): the message stays one line.
std::string printable(const std::string& value) {
  std::string out;
  for (unsigned char c : value) {
    if (c >= 0x20 && c != 0x7f) out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    }
  }
  return out;
}

[[noreturn]] void bad(const char* name, const std::string& value, const std::string& accepts) {
  throw ConfigError(std::string(name) + "='" + printable(value) + "' is not " + accepts +
                    "; set it to such a value or unset it");
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// strtoll/strtod skip leading spaces and take a '+': " 7" and "+7" are shell or quoting
// mistakes here, not numbers.
bool starts_like_a_number(const std::string& s) {
  const char c = s[0];
  return is_digit(c) || ((c == '-' || c == '.') && s.size() > 1 && (is_digit(s[1]) || s[1] == '.'));
}

}  // namespace

std::optional<std::string> text(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

std::optional<std::string> path(const char* name) {
  auto v = text(name);
  if (!v) return v;
  for (unsigned char c : *v)
    if (c < 0x20 || c == 0x7f) bad(name, *v, "a path (it has a control character: a newline or a tab)");
  return v;
}

double real(const char* name, double fallback, double lo, double hi, const char* unit) {
  const auto v = text(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (!starts_like_a_number(*v) || v->find_first_of("xX") != std::string::npos || end == v->c_str() ||
      *end != '\0' || errno == ERANGE || !std::isfinite(x) || x < lo || x > hi)
    bad(name, *v, "a number " + std::string(*unit ? "of " : "") + unit + (*unit ? " " : "") + "in [" +
                      number_text(lo) + ", " + number_text(hi) + "]");
  return x;
}

std::int64_t integer(const char* name, std::int64_t fallback, std::int64_t lo, std::int64_t hi, const char* what) {
  const auto v = text(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (!starts_like_a_number(*v) || (*v)[0] == '.' || end == v->c_str() || *end != '\0' || errno == ERANGE || x < lo ||
      x > hi)
    bad(name, *v, std::string(what) + " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

std::string bytes_text(std::uint64_t n) {
  if (n != 0)
    for (const auto& [shift, unit] : {std::pair<int, char>{40, 'T'}, {30, 'G'}, {20, 'M'}, {10, 'K'}})
      if (n % (std::uint64_t(1) << shift) == 0) return std::to_string(n >> shift) + unit;
  return std::to_string(n);
}

std::uint64_t bytes(const char* name, std::uint64_t fallback, std::uint64_t lo, std::uint64_t hi, const char* what) {
  const auto v = text(name);
  if (!v) return fallback;
  const std::string& s = *v;
  const auto refuse = [&]() {
    constexpr auto kMax = std::numeric_limits<std::uint64_t>::max();
    const std::string range = lo == 0 && hi == kMax ? ""
                              : hi == kMax          ? " of at least " + bytes_text(lo)
                                                    : " in [" + bytes_text(lo) + ", " + bytes_text(hi) + "]";
    bad(name, s, std::string(what) + range + " (a byte count, or with a binary K, M, G or T suffix: 64K, 1.5M, 1g)");
  };
  // [digits][.digits][K|M|G|T][B|iB], any case; computed exactly (no rounding through a double).
  std::size_t i = 0;
  unsigned __int128 whole = 0;
  for (; i < s.size() && is_digit(s[i]); ++i) {
    whole = whole * 10 + static_cast<unsigned>(s[i] - '0');
    if (whole > std::numeric_limits<std::uint64_t>::max()) refuse();
  }
  const std::size_t whole_digits = i;
  unsigned __int128 frac = 0, frac_scale = 1;
  if (i < s.size() && s[i] == '.') {
    for (++i; i < s.size() && is_digit(s[i]); ++i) {
      if (frac_scale >= static_cast<unsigned __int128>(1000000000000000000ull)) refuse();  // 18 decimals at most
      frac = frac * 10 + static_cast<unsigned>(s[i] - '0');
      frac_scale *= 10;
    }
  }
  if (whole_digits == 0 && frac_scale == 1) refuse();  // no digits at all
  int shift = 0;
  if (i < s.size()) {
    switch (s[i] | 0x20) {  // lower case
      case 'k': shift = 10; ++i; break;
      case 'm': shift = 20; ++i; break;
      case 'g': shift = 30; ++i; break;
      case 't': shift = 40; ++i; break;
      default: break;
    }
    const std::string rest = s.substr(i);
    const auto lower = [](std::string t) {
      for (char& c : t) c = static_cast<char>(c | 0x20);
      return t;
    };
    if (!rest.empty() && lower(rest) != "b" && !(shift > 0 && lower(rest) == "ib")) refuse();
  }
  const unsigned __int128 frac_bytes = frac << shift;
  if (frac_bytes % frac_scale != 0) refuse();  // not a whole number of bytes ("0.3K")
  const unsigned __int128 n = (whole << shift) + frac_bytes / frac_scale;
  if (n > hi || n < lo) refuse();
  return static_cast<std::uint64_t>(n);
}

std::string choice(const char* name, const std::string& fallback, std::initializer_list<const char*> words) {
  const auto v = text(name);
  if (!v) return fallback;
  for (const char* w : words)
    if (*v == w) return *v;
  std::string list;
  for (const char* w : words) list += (list.empty() ? "" : ", ") + std::string(w);
  bad(name, *v, "one of " + list);
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
