#pragma once
// Two tiers of errors (docs/errors.md):
//  - typed exceptions for what a user can cause; the message says what was expected,
//    what was given and what to do;
//  - PHALANX_CHECK for programming errors inside the library: file:line and both values.
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>

#if defined(__GNUC__) || defined(__clang__)
#define PHALANX_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define PHALANX_COLD __attribute__((cold, noinline))
#else
#define PHALANX_UNLIKELY(x) (x)
#define PHALANX_COLD
#endif

namespace phalanx {

/// Base of every exception Phalanx throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
/// A tensor of the wrong shape for an op (message names the op and both shapes).
class ShapeError : public Error { using Error::Error; };
/// A tensor of the wrong dtype or device for an op.
class TypeError : public Error { using Error::Error; };
/// A bad argument value (out of range, inconsistent options).
class ValueError : public Error { using Error::Error; };
/// Misuse of autograd (backward twice through a freed graph, non-scalar root...).
class AutogradError : public Error { using Error::Error; };
/// A file that cannot be read or written, or is corrupt.
class IoError : public Error { using Error::Error; };
/// A violated internal invariant: a bug in Phalanx, please report it.
class InternalError : public Error { using Error::Error; };
/// Bad configuration: launch variables (RANK/WORLD_SIZE, a missing MASTER_ADDR, a port in
/// use, mismatched world sizes or duplicate ranks), a malformed config file, options that
/// contradict each other.
class ConfigError : public Error { using Error::Error; };
/// A plugin (device or communication) that could not be found on any search path, or found
/// but not loadable.
class PluginNotFoundError : public Error { using Error::Error; };
/// A plugin built against another plugin ABI version, or whose descriptor is inconsistent.
class PluginAbiError : public Error { using Error::Error; };

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_internal(const char* file, int line, const std::string& what);
/// PHALANX_CHECK's failure path: formats the message (only now) and throws InternalError.
template <typename... Args>
[[noreturn]] PHALANX_COLD void check_failed(const char* file, int line, const Args&... args) {
  throw_internal(file, line, concat(args...));
}
/// A name or value read from outside, for a one-line message: bytes outside printable
/// ASCII (and the backslash) as \xNN.
std::string printable(const std::string& s);
/// The message of an exception held in an exception_ptr ("unknown error" for non-std ones).
std::string message_of(const std::exception_ptr& e);
}  // namespace detail

}  // namespace phalanx

// Both macros cost one compare and a branch predicted not taken when the check holds: the
// message is formatted only when it fails, in detail::check_failed (out of line, cold), so
// their arguments (names, values, even calls like t.device().str()) are not evaluated
// on the success path and nothing is allocated there.
#define PHALANX_CHECK(cond, ...)                                                          \
  do {                                                                                    \
    if (PHALANX_UNLIKELY(!(cond)))                                                        \
      ::phalanx::detail::check_failed(__FILE__, __LINE__, "check failed: " #cond " ",     \
                                      ##__VA_ARGS__);                                     \
  } while (0)

#define PHALANX_CHECK_EQ(a, b)                                                            \
  do {                                                                                    \
    const auto& phx_a_ = (a);                                                             \
    const auto& phx_b_ = (b);                                                             \
    if (PHALANX_UNLIKELY(!(phx_a_ == phx_b_)))                                            \
      ::phalanx::detail::check_failed(__FILE__, __LINE__, "check failed: " #a " == " #b " (", \
                                      phx_a_, " vs ", phx_b_, ")");                       \
  } while (0)
