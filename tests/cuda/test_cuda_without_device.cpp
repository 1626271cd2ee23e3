// What a machine without a GPU sees: the CUDA plugins are built, and every use of them is
// one clear error, never a crash. (Runs everywhere; on a GPU machine it checks the other side.)
#include <doctest/doctest.h>

#include <phalanx/phalanx.hpp>

using namespace phalanx;

TEST_CASE("CUDA tensors and the nccl backend: a clear error without a device") {
  std::string reason;
  const bool nccl = backend_available("nccl", &reason);
  if (nccl) {
    MESSAGE("a CUDA device is present: the GPU suite (cuda_tests) covers this machine");
    CHECK(zeros({2}, DType::Float32, Device::cuda(0)).device() == Device::cuda(0));
    return;
  }
#if PHALANX_TEST_HAVE_CUDA  // the plugins are built: their probes explain
  const char* why = "no CUDA device";
  CHECK_THROWS_WITH_AS(create_process_group("nccl", BackendConfig{}),
                       doctest::Contains("backend 'nccl' cannot run here: no CUDA device"), BackendUnavailableError);
#else  // built without the CUDA toolkit: the plugins are missing, and the error says so
  const char* why = "not found";
  CHECK_THROWS_AS(create_process_group("nccl", BackendConfig{}), PluginNotFoundError);
#endif
  CHECK(reason.find(why) != std::string::npos);
  CHECK_THROWS_WITH_AS(zeros({2}, DType::Float32, Device::cuda(0)), doctest::Contains(why), TypeError);
  CHECK_THROWS_WITH_AS(ones({3}).to(Device::cuda(0)), doctest::Contains(why), TypeError);
  // auto never picks nccl here, even for a CUDA device request
  parallel::InitOptions o;
  o.device = "cuda";
  CHECK(parallel::resolve_backend(o, 2) == "auto");
}
