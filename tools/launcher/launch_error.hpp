#pragma once
// The job cannot start or go on: what phalanx-run's main prints and the code it exits with.
#include <stdexcept>
#include <string>

namespace phalanx::launcher {

/// `what()` is one line (printed after "phalanx-run: "); `exit_code` is 2 for a usage or
/// setup error the user must fix, 1 otherwise.
struct LaunchError : std::runtime_error {
  LaunchError(int exit_code, const std::string& what) : std::runtime_error(what), exit_code(exit_code) {}
  int exit_code;
};

}  // namespace phalanx::launcher
