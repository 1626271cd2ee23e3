// The GPU suite's main: exits 77 (reported by ctest as skipped, with this line) when there is
// no CUDA device, so CPU-only CI shows the skip instead of a silent pass. Only a CUDA device is
// needed: the NCCL cases (test_cuda_nccl.cpp) check the nccl backend themselves.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include <phalanx/phalanx.hpp>

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)  // listing the cases needs no device
    if (std::string(argv[i]).rfind("--list-", 0) == 0 || std::string(argv[i]).rfind("-l", 0) == 0)
      return doctest::Context(argc, argv).run();
  try {
    (void)phalanx::zeros({1}, phalanx::DType::Float32, phalanx::Device::cuda(0));
  } catch (const phalanx::TypeError& e) {  // no plugin, or its probe found no device
    std::printf("SKIPPED: no CUDA device: %s\n", e.what());
    return 77;
  } catch (const std::exception& e) {  // a device, but it does not work: that is a failure
    std::printf("FAILED: a CUDA tensor cannot be created: %s\n", e.what());
    return 1;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
