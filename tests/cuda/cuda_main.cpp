// The GPU suite's main: exits 77 (reported by ctest as skipped, with this line) when there is
// no CUDA device, so CPU-only CI shows the skip instead of a silent pass.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include <phalanx/phalanx.hpp>

int main(int argc, char** argv) {
  std::string reason;
  if (!phalanx::backend_available("nccl", &reason)) {
    std::printf("SKIPPED: no CUDA device: %s\n", reason.c_str());
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
