// phalanx-run: the launcher (torchrun for Phalanx). See `phalanx-run --help` and
// docs/launcher.md; the job itself is in launcher/launch_job.cpp.
#include <cstdio>
#include <exception>

#include "launcher/launch_job.hpp"
#include "launcher/launch_options.hpp"

int main(int argc, char** argv) {
  phalanx::launcher::LaunchOptions options;
  int code = 0;
  if (!phalanx::launcher::parse_options(argc, argv, options, code)) return code;
  try {
    return phalanx::launcher::launch_job(options);
  } catch (const phalanx::launcher::LaunchError& e) {  // it cannot start or go on: said in one line
    std::fprintf(stderr, "phalanx-run: %s\n", e.what());
    return e.exit_code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "phalanx-run: %s\n", e.what());
    return 1;
  }
}
