// Small helpers the kernel tests share: a float's bit pattern and back, and an environment
// variable set for a scope (unset again at its end).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace phalanx::test {

inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Sets an environment variable for a scope; unsets it at the end.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

}  // namespace phalanx::test
