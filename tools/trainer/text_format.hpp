#pragma once
// Numbers and widths as phalanx-train writes them in messages, settings and checkpoints.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace phalanx::trainer {

/// %.17g: every bit of a double (the settings compared across ranks).
inline std::string fmt_g(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

/// "784-128-10".
inline std::string widths_str(const std::vector<std::int64_t>& w) {
  std::string s;
  for (auto x : w) s += (s.empty() ? "" : "-") + std::to_string(x);
  return s;
}

/// The shortest text that reads back as the same double (0.1, not 0.10000000000000001).
inline std::string fmt_exact(double v) {
  char b[40];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(b, sizeof b, "%.*g", digits, v);
    if (std::strtod(b, nullptr) == v) break;
  }
  return b;
}

}  // namespace phalanx::trainer
